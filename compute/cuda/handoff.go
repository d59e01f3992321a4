package cuda

import (
	"os"
	"runtime"
	"sync/atomic"
	"time"
)

// handoff carries functions from callers to the one goroutine that runs
// them (the device's locked OS thread), and their completion back. Both
// hand-overs can poll for a while before parking: a parked thread's
// wake-up costs tens of microseconds on every decode step (measured with
// `moxie bench --timing` as hand-off and return), while a decode step
// leaves the device thread idle only for as long as the caller samples.
type handoff struct {
	work chan *task
	// idle is how long the running goroutine polls for the next task
	// after finishing one before it parks; wait is how long a caller
	// polls for its task's end before it parks. Zero: no polling.
	idle, wait time.Duration
}

// task is one function in flight; done is set after f has returned.
type task struct {
	f    func()
	done atomic.Bool
	ch   chan struct{} // closed after done is set
}

// Polling defaults: the device thread waits up to idleSpin for the next
// step (a greedy sample takes far less), a caller up to waitSpin for its
// call (a whole-model decode step is ~6 ms; longer calls park).
const (
	idleSpin = 2 * time.Millisecond
	waitSpin = 20 * time.Millisecond
)

// newHandoff returns a hand-off that polls with the defaults, or parks at
// once with $MOXIE_CUDA_SPIN=off.
func newHandoff() *handoff {
	h := &handoff{work: make(chan *task, 1), idle: idleSpin, wait: waitSpin}
	if os.Getenv("MOXIE_CUDA_SPIN") == "off" {
		h.idle, h.wait = 0, 0
	}
	return h
}

// send queues f (blocking while another task waits to be taken) and
// returns its task. The caller must not send after close.
func (h *handoff) send(f func()) *task {
	t := &task{f: f, ch: make(chan struct{})}
	h.work <- t
	return t
}

// close ends the hand-off: next reports false once the queue is empty.
func (h *handoff) close() { close(h.work) }

// next returns the next task, polling for up to idle before parking; ok
// is false after close.
func (h *handoff) next() (t *task, ok bool) {
	if h.idle > 0 {
		deadline := time.Now().Add(h.idle)
		for i := 1; ; i++ {
			if len(h.work) > 0 {
				break
			}
			if i%64 == 0 && time.Now().After(deadline) {
				break
			}
		}
	}
	t, ok = <-h.work
	return t, ok
}

// run runs the task's function and marks it done.
func (t *task) run() {
	defer func() {
		t.done.Store(true)
		close(t.ch)
	}()
	t.f()
}

// await returns once the task has run, polling for up to spin first.
func (t *task) await(spin time.Duration) {
	if spin > 0 {
		deadline := time.Now().Add(spin)
		for i := 1; !t.done.Load(); i++ {
			if i%64 == 0 {
				if time.Now().After(deadline) {
					break
				}
				if i%4096 == 0 {
					runtime.Gosched()
				}
			}
		}
	}
	<-t.ch
}
