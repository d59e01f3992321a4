// Package membw measures the machine's memory read bandwidth: the ceiling that
// batch-1 decode, which streams every weight once per token, is judged against.
package membw

import (
	"runtime"
	"time"

	"moxie/compute/cpu/kern"
)

// Result is one measurement.
type Result struct {
	Bytes   int64         // bytes read per pass
	Workers int           // goroutines reading
	Best    time.Duration // fastest pass
}

// GBps is the read bandwidth of the fastest pass in GB/s (1e9 bytes per second).
func (r Result) GBps() float64 { return float64(r.Bytes) / r.Best.Seconds() / 1e9 }

// Measure reads a buffer of size bytes with workers goroutines (0 = all CPUs)
// through kern.ReadSum (the widest loads the build has: AVX-512 under
// GOEXPERIMENT=simd, scalar Go otherwise, which may fall short of the true
// ceiling), passes times, and returns the fastest pass. The buffer should be
// several times the last-level cache (256 MiB or more) for the result to be DRAM
// bandwidth. It allocates and touches the buffer first, so that page faults are
// not timed.
func Measure(size int64, workers, passes int) Result {
	if workers <= 0 {
		workers = runtime.NumCPU()
	}
	const unit = 1 << 16 // floats per work item (256 KiB)
	n := max(int(size/4)/unit, 1) * unit
	buf := make([]float32, n)
	for i := range buf {
		buf[i] = float32(i & 1023)
	}
	p := kern.NewPool(workers)
	defer p.Close()
	sums := make([]float32, n/unit)
	best := time.Duration(1<<63 - 1)
	for range max(passes, 1) {
		start := time.Now()
		p.Run(n/unit, func(lo, hi int) {
			for u := lo; u < hi; u++ {
				sums[u] = kern.ReadSum(buf[u*unit : (u+1)*unit])
			}
		})
		best = min(best, time.Since(start))
	}
	runtime.KeepAlive(sums)
	return Result{Bytes: int64(n) * 4, Workers: workers, Best: best}
}
