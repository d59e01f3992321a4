package cuda

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestHandoff runs tasks from several callers on one goroutine, with and
// without polling on either side: each runs exactly once, on that
// goroutine, one at a time, each caller's in order, and its effects are
// visible to the caller when await returns (the race detector checks the
// last). After close the runner drains the queue and stops.
func TestHandoff(t *testing.T) {
	for _, tc := range []struct {
		name       string
		idle, wait time.Duration
	}{
		{"parking", 0, 0},
		{"polling", idleSpin, waitSpin},
		{"runner polls", time.Millisecond, 0},
		{"callers poll briefly", 0, 50 * time.Microsecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &handoff{work: make(chan *task, 1), idle: tc.idle, wait: tc.wait}
			const callers, calls = 4, 200
			var got [callers][]int // written by the runner, read by the caller after await
			running := 0           // tasks running at once (runner only)
			stopped := make(chan int)
			go func() {
				n := 0
				for {
					tk, ok := h.next()
					if !ok {
						stopped <- n
						return
					}
					running++
					if running != 1 {
						t.Errorf("%d tasks running at once", running)
					}
					tk.run()
					running--
					n++
				}
			}()
			var mu sync.Mutex // send's contract: no send after close (Device uses closeMu)
			var wg sync.WaitGroup
			for c := range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range calls {
						mu.Lock()
						tk := h.send(func() {
							if i%50 == 7 {
								time.Sleep(200 * time.Microsecond) // a longer task now and then
							}
							got[c] = append(got[c], i)
						})
						mu.Unlock()
						tk.await(h.wait)
						if len(got[c]) != i+1 || got[c][i] != i {
							t.Errorf("caller %d call %d: after await the caller sees %d results", c, i, len(got[c]))
							return
						}
					}
				}()
			}
			wg.Wait()
			mu.Lock()
			h.close()
			mu.Unlock()
			select {
			case n := <-stopped:
				if n != callers*calls {
					t.Errorf("the runner ran %d tasks, want %d", n, callers*calls)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the runner did not stop after close")
			}
		})
	}
}

// BenchmarkHandoff is a device call's hand-off and return with each side
// parking or polling: the runner is a locked OS thread, as the device's
// is, and its task is empty or busy for 1 ms (as cuStreamSynchronize
// spins while a step runs).
func BenchmarkHandoff(b *testing.B) {
	for _, bc := range []struct {
		name       string
		idle, wait time.Duration
		busy       time.Duration
	}{
		{"parking/empty", 0, 0, 0}, {"polling/empty", idleSpin, waitSpin, 0},
		{"parking/busy1ms", 0, 0, time.Millisecond}, {"polling/busy1ms", idleSpin, waitSpin, time.Millisecond},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := &handoff{work: make(chan *task, 1), idle: bc.idle, wait: bc.wait}
			go func() {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				for {
					tk, ok := h.next()
					if !ok {
						return
					}
					tk.run()
				}
			}()
			defer h.close()
			task := func() {
				for t0 := time.Now(); time.Since(t0) < bc.busy; {
				}
			}
			for b.Loop() {
				h.send(task).await(h.wait)
			}
			if bc.busy > 0 {
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)-float64(bc.busy.Nanoseconds()), "ns-overhead/op")
			}
		})
	}
}
