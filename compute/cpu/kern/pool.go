package kern

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
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
	// cur is the job every idle worker joins: set by a Run that finds it
	// empty and cleared once that job's chunks are all claimed. Workers
	// poll it, so handing a job over takes one store and no lock.
	cur atomic.Pointer[job]
	// jobs carries the jobs of Runs that found cur taken (concurrent or
	// nested calls) and wakes parked workers; queued counts its entries so
	// that polling workers touch the channel only when it holds one.
	jobs     chan *job
	queued   atomic.Int32
	sleepers atomic.Int32 // workers blocked on jobs
	stopping atomic.Bool  // set by Close before jobs is closed
	mu       sync.RWMutex // guards closed against sends on a closed channel
	closed   bool
	done     sync.WaitGroup
	scratch  sync.Pool // *floatBuf: buffers for inputs prepared once a product
}

// floatBuf is a buffer of Pool.floats: raw as allocated, and its window
// that starts on a 64-byte boundary.
type floatBuf struct{ raw, aligned []float32 }

// floats returns a buffer of n float32 that starts on a 64-byte boundary
// (contents undefined), from the pool's free list when one is large
// enough. Give it back with putFloats once no goroutine reads it.
func (p *Pool) floats(n int) *floatBuf {
	b, _ := p.scratch.Get().(*floatBuf)
	if b == nil || len(b.raw) < n+15 {
		b = &floatBuf{raw: make([]float32, n+15)}
	}
	b.aligned = alignedTo64(b.raw, n)
	return b
}

// putFloats gives b back to the free list.
func (p *Pool) putFloats(b *floatBuf) { p.scratch.Put(b) }

// alignedTo64 returns the n floats of buf (len(buf) >= n+15) that start at
// its first 64-byte boundary.
func alignedTo64(buf []float32, n int) []float32 {
	off := int((64-uintptr(unsafe.Pointer(unsafe.SliceData(buf)))&63)&63) / 4
	return buf[off : off+n : off+n]
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
// per chunk of an expert matvec.
const spinWait = 100 * time.Microsecond

// spinYield is how often a polling goroutine calls runtime.Gosched, so that
// other goroutines still get a processor while the workers poll. Each call
// takes the scheduler's lock: yielding every few polls put a third of a
// 16-core decode's CPU time into Gosched and lock contention (session 20's
// profile).
const spinYield = 20 * time.Microsecond

// spinner paces a polling loop: a PAUSE a poll, Gosched every spinYield,
// and done after spinWait.
type spinner struct {
	i              int
	start, yielded time.Time
}

// spin pauses once and reports whether the caller should keep polling.
func (s *spinner) spin() bool {
	cpuPause()
	s.i++
	if s.i&15 != 0 {
		return true
	}
	now := time.Now()
	switch {
	case s.start.IsZero():
		s.start, s.yielded = now, now
	case now.Sub(s.start) > spinWait:
		return false
	case now.Sub(s.yielded) > spinYield:
		runtime.Gosched()
		s.yielded = time.Now()
	}
	return true
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
	var last *job
	for {
		j, ok := p.wait(last)
		if !ok {
			return
		}
		j.work()
		last = j
	}
}

// wait returns the next job to join other than last (which the worker has
// finished its part of), polling for spinWait before it blocks; ok is false
// once the pool is closed.
func (p *Pool) wait(last *job) (j *job, ok bool) {
	var s spinner
	for {
		if j = p.cur.Load(); j != nil && j != last {
			return j, true
		}
		if p.queued.Load() > 0 || p.stopping.Load() {
			select {
			case j, ok = <-p.jobs:
				if ok {
					p.queued.Add(-1)
				}
				return j, ok
			default:
			}
		}
		if !s.spin() {
			break
		}
	}
	// Park. A Run that publishes cur after this worker counts itself a
	// sleeper sends it the job too; one that published it before is seen
	// by the check below (both sides use sequentially consistent atomics).
	p.sleepers.Add(1)
	if j = p.cur.Load(); j != nil && j != last {
		p.sleepers.Add(-1)
		return j, true
	}
	j, ok = <-p.jobs
	p.sleepers.Add(-1)
	if ok {
		p.queued.Add(-1)
	}
	return j, ok
}

// send offers j to a worker through the channel without blocking (a full
// channel means every worker has a job waiting already). The caller holds
// p.mu for reading and has checked that the pool is open.
func (p *Pool) send(j *job) {
	p.queued.Add(1)
	select {
	case p.jobs <- j:
	default:
		p.queued.Add(-1)
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
	j := &job{fn: fn, n: n, chunks: chunks, done: make(chan struct{})}
	j.left.Store(int64(chunks))
	helpers := min(p.workers, chunks) - 1
	p.mu.RLock()
	if p.closed {
		p.mu.RUnlock()
		fn(0, n)
		return
	}
	if p.cur.CompareAndSwap(nil, j) {
		// Polling workers join through cur; parked ones need the channel.
		for k := min(int(p.sleepers.Load()), helpers); k > 0; k-- {
			p.send(j)
		}
		p.mu.RUnlock()
		j.work()
		p.cur.Store(nil) // every chunk is claimed
	} else {
		for range helpers {
			p.send(j)
		}
		p.mu.RUnlock()
		j.work()
	}
	j.waitDone()
}

// waitDone returns when every chunk has finished, polling for spinWait
// before it blocks.
func (j *job) waitDone() {
	var s spinner
	for j.left.Load() > 0 {
		if !s.spin() {
			<-j.done
			return
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
		p.stopping.Store(true)
		close(p.jobs)
	}
	p.mu.Unlock()
	p.done.Wait()
}
