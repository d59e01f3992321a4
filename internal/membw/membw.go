// Package membw measures the machine's memory read bandwidth: the ceiling that
// batch-1 decode, which streams every weight once per token, is judged against.
package membw

import (
	"runtime"
	"sync"
	"time"
)

// Result is one measurement.
type Result struct {
	Bytes   int64         // bytes read per pass
	Workers int           // goroutines reading
	Best    time.Duration // fastest pass
}

// GBps is the read bandwidth of the fastest pass in GB/s (1e9 bytes per second).
func (r Result) GBps() float64 { return float64(r.Bytes) / r.Best.Seconds() / 1e9 }

// Measure reads a buffer of size bytes (rounded down to a multiple of 64 per
// worker) with workers goroutines (0 = all CPUs), passes times, and returns the
// fastest pass. The buffer should be several times the last-level cache (256 MiB
// or more) for the result to be DRAM bandwidth. It allocates and touches the
// buffer first, so that page faults are not timed.
func Measure(size int64, workers, passes int) Result {
	if workers <= 0 {
		workers = runtime.NumCPU()
	}
	n := int(size/8) / (workers * 8) * workers * 8
	buf := make([]uint64, n)
	for i := range buf {
		buf[i] = uint64(i)
	}
	chunk := n / workers
	var sink uint64
	var mu sync.Mutex
	best := time.Duration(1<<63 - 1)
	for range max(passes, 1) {
		var wg sync.WaitGroup
		start := time.Now()
		for w := range workers {
			wg.Add(1)
			go func(part []uint64) {
				defer wg.Done()
				s := sum(part)
				mu.Lock()
				sink += s
				mu.Unlock()
			}(buf[w*chunk : (w+1)*chunk])
		}
		wg.Wait()
		best = min(best, time.Since(start))
	}
	runtime.KeepAlive(sink)
	return Result{Bytes: int64(n) * 8, Workers: workers, Best: best}
}

// sum adds a slice with eight independent accumulators so the loop is bound by
// loads, not by the add latency chain.
func sum(a []uint64) uint64 {
	var s0, s1, s2, s3, s4, s5, s6, s7 uint64
	for len(a) >= 8 {
		b := (*[8]uint64)(a)
		s0 += b[0]
		s1 += b[1]
		s2 += b[2]
		s3 += b[3]
		s4 += b[4]
		s5 += b[5]
		s6 += b[6]
		s7 += b[7]
		a = a[8:]
	}
	for _, v := range a {
		s0 += v
	}
	return s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7
}
