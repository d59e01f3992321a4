package cuda

import (
	"fmt"
	"testing"
)

// BenchmarkReadBandwidthFull: does the read probe depend on where its buffer
// lies and on how full device memory is? The probe (ReadBandwidth's
// read_bw4 over 1 GiB) on an empty device; then with device memory filled
// to within 4 GiB by 1 GiB blocks, a
// fresh 1 GiB buffer (what moxie bench's probe gets beside a resident
// model), and each of five filler blocks spread from the first allocated
// to the last. Reports GB/s for each as metrics (logged too).
func BenchmarkReadBandwidthFull(b *testing.B) {
	dev := testDevice(b)
	const size = 1 << 30
	const keep = 4 << 30
	type probe struct {
		name string
		gbps float64
	}
	var got []probe
	err := dev.Do(func(c *Ctx) error {
		measure := func(name string, p DevicePtr) error {
			r, err := readBandwidthAt(c, p, size, 11)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			got = append(got, probe{name, r / 1e9})
			return nil
		}
		fresh := func(name string) error {
			p, err := c.MemAlloc(size)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			defer c.MemFree(p)
			if err := c.Memset(p, 0, size, c.Stream()); err != nil {
				return err
			}
			return measure(name, p)
		}
		if err := fresh("empty device, fresh 1 GiB"); err != nil {
			return err
		}
		var fill []DevicePtr
		defer func() {
			for _, p := range fill {
				c.MemFree(p)
			}
		}()
		for {
			free, _, err := c.MemInfo()
			if err != nil {
				return err
			}
			if free < keep+size {
				break
			}
			p, err := c.MemAlloc(size)
			if err != nil {
				break
			}
			if err := c.Memset(p, 1, size, c.Stream()); err != nil {
				return err
			}
			fill = append(fill, p)
		}
		if err := c.Sync(c.Stream()); err != nil {
			return err
		}
		if err := fresh(fmt.Sprintf("%d GiB filled, fresh 1 GiB", len(fill))); err != nil {
			return err
		}
		for i := 0; i < 5 && len(fill) > 0; i++ {
			j := i * (len(fill) - 1) / 4
			if err := measure(fmt.Sprintf("filler block %d of %d", j, len(fill)), fill[j]); err != nil {
				return err
			}
		}
		return fresh("filled again, fresh 1 GiB")
	})
	if err != nil {
		b.Fatal(err)
	}
	for i, p := range got {
		b.Logf("%-40s %8.1f GB/s", p.name, p.gbps)
		b.ReportMetric(p.gbps, fmt.Sprintf("GB/s-%d", i))
	}
}
