package kern

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// cover runs p.Run(n) and checks every index in [0,n) is visited exactly once
// through valid chunks.
func cover(t *testing.T, p *Pool, n int) {
	t.Helper()
	seen := make([]atomic.Int32, max(n, 0))
	var calls atomic.Int32
	p.Run(n, func(lo, hi int) {
		calls.Add(1)
		if lo < 0 || hi > n || lo >= hi {
			t.Errorf("bad chunk [%d,%d) for n=%d", lo, hi, n)
			return
		}
		for i := lo; i < hi; i++ {
			seen[i].Add(1)
		}
	})
	for i := range seen {
		if c := seen[i].Load(); c != 1 {
			t.Fatalf("n=%d: index %d visited %d times", n, i, c)
		}
	}
	if n <= 0 && calls.Load() != 0 {
		t.Fatalf("n=%d: fn called %d times", n, calls.Load())
	}
}

func TestPool(t *testing.T) {
	for _, workers := range []int{1, 2, 3, 8} {
		p := NewPool(workers)
		if p.Workers() != workers {
			t.Fatalf("Workers() = %d, want %d", p.Workers(), workers)
		}
		for _, n := range []int{-1, 0, 1, 2, workers - 1, workers, workers + 1, 1000} {
			cover(t, p, n)
		}
		p.Close()
		p.Close()       // idempotent
		cover(t, p, 17) // after Close: runs on the caller
	}
	var nilPool *Pool
	if nilPool.Workers() != 1 {
		t.Fatalf("nil pool Workers() = %d", nilPool.Workers())
	}
	cover(t, nilPool, 10)
	nilPool.Close()
	if p := NewPool(0); p.Workers() < 1 {
		t.Fatalf("NewPool(0).Workers() = %d", p.Workers())
	} else {
		p.Close()
	}
}

func TestPoolParallel(t *testing.T) {
	// With 2 workers and 2 chunks that each wait for the other to start,
	// Run must execute them at the same time (or this test deadlocks).
	p := NewPool(2)
	defer p.Close()
	var wg sync.WaitGroup
	wg.Add(2)
	p.Run(2, func(lo, hi int) {
		wg.Done()
		wg.Wait()
	})
}

// TestPoolParallelAfterIdle: every worker joins a Run whether it was polling
// (no gap), yielding (a gap of a few spinYields) or parked (a gap past
// spinWait). Each Run's chunks wait for all four to start, so a worker that
// missed the job shows as a timeout instead of a deadlock.
func TestPoolParallelAfterIdle(t *testing.T) {
	const workers = 4
	p := NewPool(workers)
	defer p.Close()
	gaps := []time.Duration{0, 3 * spinYield, 3 * spinWait, 0, 10 * time.Millisecond, 0}
	for round, gap := range gaps {
		time.Sleep(gap)
		var started atomic.Int32
		var late atomic.Bool
		p.Run(workers, func(lo, hi int) {
			started.Add(1)
			for deadline := time.Now().Add(5 * time.Second); started.Load() < workers; {
				if time.Now().After(deadline) {
					late.Store(true)
					return
				}
				time.Sleep(10 * time.Microsecond)
			}
		})
		if late.Load() {
			t.Fatalf("round %d (after %v idle): only %d of %d workers joined the Run", round, gap, started.Load(), workers)
		}
	}
}

func TestPoolConcurrentCallers(t *testing.T) {
	p := NewPool(4)
	defer p.Close()
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				cover(t, p, (g*50+i)%300)
			}
		}()
	}
	wg.Wait()
}

func TestPoolNested(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	var total atomic.Int64
	p.Run(8, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			p.Run(100, func(a, b int) { total.Add(int64(b - a)) })
		}
	})
	if total.Load() != 800 {
		t.Fatalf("nested Run covered %d, want 800", total.Load())
	}
}

// BenchmarkPoolRun measures the fan-out cost that decode pays per matrix
// product: 4 chunks a worker of ~25 µs each (an expert matvec's share) and
// then gap of work on the caller alone. The ideal is 100 µs + gap.
func BenchmarkPoolRun(b *testing.B) {
	spin := func(d time.Duration) {
		for t := time.Now(); time.Since(t) < d; {
		}
	}
	for _, w := range workerCounts() {
		if w == 1 {
			continue
		}
		for _, gap := range []time.Duration{0, 30 * time.Microsecond, 300 * time.Microsecond} {
			b.Run(fmt.Sprintf("workers=%d/gap=%v", w, gap), func(b *testing.B) {
				p := NewPool(w)
				defer p.Close()
				for b.Loop() {
					p.Run(4*w, func(lo, hi int) { spin(time.Duration(hi-lo) * 25 * time.Microsecond) })
					spin(gap)
				}
			})
		}
	}
}
