package cuda

import (
	"fmt"
	"slices"
	"unsafe"
)

// membwSrc is the device read-bandwidth probe: every thread sums float4 loads
// over a grid-stride loop; one float per block is written so the loads are kept.
const membwSrc = `
extern "C" __global__ void membw_read(const float4 *__restrict__ p, long long n, float *out) {
  float acc = 0.f;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    float4 v = __ldg(p + i);
    acc += v.x + v.y + v.z + v.w;
  }
  if (acc == 12345.678f) out[blockIdx.x] = acc;
}
`

// ReadBandwidth measures the device memory read bandwidth in bytes per second:
// the median of reps timed passes (CUDA events) of a float4 read kernel over a
// buffer of size bytes (make it several times the L2 cache; it is allocated
// and freed here). It is the ceiling that moxie bench --backend cuda reports
// efficiency against.
func (d *Device) ReadBandwidth(size, reps int) (float64, error) {
	if size < 1<<20 || reps < 1 {
		return 0, fmt.Errorf("cuda: ReadBandwidth(%d bytes, %d reps): want at least 1 MiB and 1 rep", size, reps)
	}
	size &^= 15
	var out float64
	err := d.Do(func(c *Ctx) error {
		mod, err := c.Module("membw", membwSrc)
		if err != nil {
			return err
		}
		k, err := mod.Kernel("membw_read")
		if err != nil {
			return err
		}
		buf, err := c.MemAlloc(size)
		if err != nil {
			return fmt.Errorf("cuda: ReadBandwidth: allocating %d bytes: %w", size, err)
		}
		defer c.MemFree(buf)
		const blocks = 132 * 8
		sink, err := c.MemAlloc(4 * blocks)
		if err != nil {
			return err
		}
		defer c.MemFree(sink)
		s := c.Stream()
		if err := c.Memset(buf, 0, size, s); err != nil {
			return err
		}
		start, err := c.NewEvent(true)
		if err != nil {
			return err
		}
		defer c.DestroyEvent(start)
		end, err := c.NewEvent(true)
		if err != nil {
			return err
		}
		defer c.DestroyEvent(end)
		n := int64(size / 16)
		launch := func() error {
			return c.Launch(k, Dim3{blocks, 1, 1}, Dim3{256, 1, 1}, 0, s,
				unsafe.Pointer(&buf), unsafe.Pointer(&n), unsafe.Pointer(&sink))
		}
		if err := launch(); err != nil { // warm-up
			return err
		}
		var rates []float64
		for range reps {
			if err := c.Record(start, s); err != nil {
				return err
			}
			if err := launch(); err != nil {
				return err
			}
			if err := c.Record(end, s); err != nil {
				return err
			}
			if err := c.WaitEvent(end); err != nil {
				return err
			}
			ms, err := c.Elapsed(start, end)
			if err != nil {
				return err
			}
			rates = append(rates, float64(size)/(ms/1e3))
		}
		slices.Sort(rates)
		out = rates[len(rates)/2]
		return nil
	})
	return out, err
}
