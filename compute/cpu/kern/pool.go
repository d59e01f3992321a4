package kern

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Pool is a fixed set of worker goroutines that run the parts of a split loop
// in parallel. The goroutine that calls Run takes part in the work, so a Pool
// of w workers starts w-1 background goroutines. A Pool holds no per-call
// state: any number of goroutines may call Run at once, and fn may itself call
// Run on the same Pool (the caller can always finish its own job alone, so
// nested or concurrent calls never deadlock; they only share the workers).
//
// The zero value is not usable; use NewPool. A nil *Pool is valid for every
// kernel in this package and means "single-threaded".
type Pool struct {
	workers int
	jobs    chan *job
	mu      sync.RWMutex // guards closed against sends on a closed channel
	closed  bool
	done    sync.WaitGroup
}

// job is one Run call: chunks of [0,n) claimed through next; left counts
// the chunks not yet finished, and done is closed when it reaches zero.
type job struct {
	fn     func(lo, hi int)
	n      int
	chunks int
	next   atomic.Int64
	left   atomic.Int64
	done   chan struct{}
}

// spinWait is how long an idle worker keeps polling for the next job, and
// the caller of Run for its last chunks, before blocking. A decode step runs
// hundreds of short products back to back; waking a parked thread took ~60 to
// 120 µs on the development machine (a 2-vCPU VM), against ~25 µs of work
// per chunk of an expert matvec. Spinning yields (runtime.Gosched) so other
// goroutines still run.
const spinWait = 100 * time.Microsecond

// NewPool starts a pool of workers goroutines (including the caller of Run);
// workers <= 0 means runtime.NumCPU(). Call Close to stop the goroutines.
func NewPool(workers int) *Pool {
	if workers <= 0 {
		workers = runtime.NumCPU()
	}
	p := &Pool{workers: workers, jobs: make(chan *job, workers)}
	for i := 1; i < workers; i++ {
		p.done.Add(1)
		go p.loop()
	}
	return p
}

func (p *Pool) loop() {
	defer p.done.Done()
	for {
		j, ok := p.wait()
		if !ok {
			return
		}
		j.work()
	}
}

// wait returns the next job, polling for spinWait before it blocks; ok is
// false once the pool is closed.
func (p *Pool) wait() (j *job, ok bool) {
	var start time.Time
	for i := 0; ; i++ {
		select {
		case j, ok = <-p.jobs:
			return j, ok
		default:
		}
		if i&63 == 63 {
			if start.IsZero() {
				start = time.Now()
			} else if time.Since(start) > spinWait {
				break
			}
			runtime.Gosched()
		}
	}
	j, ok = <-p.jobs
	return j, ok
}

// Workers returns the number of goroutines that can run parts of one Run call
// at the same time (1 for a nil Pool).
func (p *Pool) Workers() int {
	if p == nil {
		return 1
	}
	return p.workers
}

// chunksPerWorker over-splits each Run so that a worker that starts late (or
// is busy with another caller's job) does not leave the others waiting.
const chunksPerWorker = 4

// Run splits [0,n) into contiguous, non-overlapping chunks [lo,hi) that
// together cover [0,n) exactly once, calls fn on each chunk (in parallel on the
// pool's workers and the calling goroutine) and returns when all calls have
// returned. n <= 0 calls nothing. fn must be safe to call concurrently on
// disjoint chunks and must not panic (a panic on a worker goroutine ends the
// program). After Close, or on a nil Pool, Run calls fn(0, n) on the caller.
func (p *Pool) Run(n int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	if p == nil || p.workers == 1 || n == 1 {
		fn(0, n)
		return
	}
	chunks := min(n, p.workers*chunksPerWorker)
	j := &job{fn: fn, n: n, chunks: chunks, done: make(chan struct{})}
	j.left.Store(int64(chunks))
	p.mu.RLock()
	if p.closed {
		p.mu.RUnlock()
		fn(0, n)
		return
	}
	for i := 1; i < min(p.workers, chunks); i++ {
		select {
		case p.jobs <- j:
		default: // all workers already have work queued; the caller does more itself
		}
	}
	p.mu.RUnlock()
	j.work()
	j.waitDone()
}

// waitDone returns when every chunk has finished, polling for spinWait
// before it blocks.
func (j *job) waitDone() {
	var start time.Time
	for i := 0; j.left.Load() > 0; i++ {
		if i&63 == 63 {
			if start.IsZero() {
				start = time.Now()
			} else if time.Since(start) > spinWait {
				<-j.done
				return
			}
			runtime.Gosched()
		}
	}
}

// work claims chunks until none are left.
func (j *job) work() {
	for {
		i := int(j.next.Add(1) - 1)
		if i >= j.chunks {
			return
		}
		lo := i * j.n / j.chunks
		hi := (i + 1) * j.n / j.chunks
		j.fn(lo, hi)
		if j.left.Add(-1) == 0 {
			close(j.done)
		}
	}
}

// Close stops the background goroutines and waits for them to exit. Calls to
// Run that are in progress finish normally; later calls run single-threaded.
// Close is idempotent; a nil Pool's Close does nothing.
func (p *Pool) Close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.jobs)
	}
	p.mu.Unlock()
	p.done.Wait()
}
