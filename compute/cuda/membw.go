package cuda

import (
	"fmt"
	"slices"
	"unsafe"
)

// probeLaunches is the number of read_bw4 launches one timed pass of
// ReadBandwidth covers.
const probeLaunches = 4

// ReadBandwidth measures the device memory read bandwidth in bytes per second:
// the median of reps timed passes of read_bw4, the float4 read kernel of the
// default linear module that BenchmarkV4 also uses, over a buffer of size
// bytes (make it several times the L2 cache; it is allocated and freed
// here). Each pass is probeLaunches back-to-back launches timed by timed
// (CUDA events, queued behind a spin kernel so that the host's launch
// latency is not in the timed window). It is the ceiling that moxie bench --backend cuda
// reports efficiency against.
func (d *Device) ReadBandwidth(size, reps int) (float64, error) {
	if size < 1<<20 || reps < 1 {
		return 0, fmt.Errorf("cuda: ReadBandwidth(%d bytes, %d reps): want at least 1 MiB and 1 rep", size, reps)
	}
	size &^= 15
	var out float64
	err := d.Do(func(c *Ctx) error {
		buf, err := c.MemAlloc(size)
		if err != nil {
			return fmt.Errorf("cuda: ReadBandwidth: allocating %d bytes: %w", size, err)
		}
		defer c.MemFree(buf)
		if err := c.Memset(buf, 0, size, c.Stream()); err != nil {
			return err
		}
		out, err = readBandwidthAt(c, buf, size, reps)
		return err
	})
	return out, err
}

// ReadBandwidthAt is ReadBandwidth over size bytes of device memory the
// caller owns at p (16-byte aligned, for example resident weights): read,
// never written, so any live allocation may be measured in place.
func (d *Device) ReadBandwidthAt(p DevicePtr, size, reps int) (float64, error) {
	if size < 1<<20 || reps < 1 || p%16 != 0 {
		return 0, fmt.Errorf("cuda: ReadBandwidthAt(%#x, %d bytes, %d reps): want a 16-byte aligned address, at least 1 MiB and 1 rep", uint64(p), size, reps)
	}
	var out float64
	err := d.Do(func(c *Ctx) error {
		var err error
		out, err = readBandwidthAt(c, p, size, reps)
		return err
	})
	return out, err
}

// readBandwidthAt is ReadBandwidth's measurement over size bytes of device
// memory the caller owns at buf (16-byte aligned; read, never written).
func readBandwidthAt(c *Ctx, buf DevicePtr, size, reps int) (float64, error) {
	size &^= 15
	mod, err := c.linearModule()
	if err != nil {
		return 0, err
	}
	k, err := mod.Kernel("read_bw4")
	if err != nil {
		return 0, err
	}
	sink, err := c.MemAlloc(4)
	if err != nil {
		return 0, err
	}
	defer c.MemFree(sink)
	s := c.Stream()
	n := int64(size / 16)
	grid := uint32((n + 1023) / 1024) // 256 threads, 4 float4 each
	launch := func() error {
		return c.Launch(k, Dim3{grid, 1, 1}, Dim3{256, 1, 1}, 0, s,
			unsafe.Pointer(&buf), unsafe.Pointer(&n), unsafe.Pointer(&sink))
	}
	if err := launch(); err != nil { // warm-up
		return 0, err
	}
	spin, err := spinKernel(c)
	if err != nil {
		return 0, err
	}
	us, err := timed(c, spin, probeLaunches, reps, func(int) error { return launch() })
	if err != nil {
		return 0, err
	}
	rates := make([]float64, len(us))
	for i, t := range us {
		rates[i] = float64(size) / (t * 1e-6)
	}
	slices.Sort(rates)
	return rates[len(rates)/2], nil
}
