package kern

import (
	"runtime"
	"sync"
	"sync/atomic"
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

// job is one Run call: chunks of [0,n) claimed through next.
type job struct {
	fn     func(lo, hi int)
	n      int
	chunks int
	next   atomic.Int64
	wg     sync.WaitGroup
}

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
	for j := range p.jobs {
		j.work()
	}
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
	j := &job{fn: fn, n: n, chunks: chunks}
	j.wg.Add(chunks)
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
	j.wg.Wait()
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
		j.wg.Done()
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
