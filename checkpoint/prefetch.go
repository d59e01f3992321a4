package checkpoint

import "sync"

// Prefetcher is a Source that computes tensors of another source ahead of
// their use: a synthetic source generates each tensor on request, one core at
// a time, so loading several gigabytes of it in order is CPU-bound; a
// Prefetcher runs that work on several goroutines while its user consumes the
// results. It changes no bytes: every tensor is exactly src's.
type Prefetcher struct {
	Source
	mu     sync.Mutex
	cond   *sync.Cond
	order  []string
	items  map[string]*prefetchItem
	next   int   // next index of order a worker claims
	held   int64 // bytes of claimed or finished tensors not yet taken
	budget int64
	closed bool
	wg     sync.WaitGroup
}

type prefetchItem struct {
	state int // 0 waiting, 1 being computed, 2 ready, 3 handed out or taken over
	size  int64
	data  []byte
	err   error
}

// Prefetch starts workers goroutines that call src.TensorData for the names in
// order, one after another, keeping at most budget bytes of results that have
// not been asked for (a single tensor larger than budget is still fetched when
// nothing else is held). TensorData of a prefetched name returns its result
// once, waiting if it is being computed; a name not (or no longer) in the
// prefetch queue, or one no worker has started yet, is fetched from src by the
// caller. Unknown names in order are skipped. Close stops the workers and
// drops unclaimed results; it does not close src. The Prefetcher is safe for
// concurrent use.
func Prefetch(src Source, order []string, workers int, budget int64) *Prefetcher {
	p := &Prefetcher{Source: src, budget: budget, items: make(map[string]*prefetchItem, len(order))}
	p.cond = sync.NewCond(&p.mu)
	for _, n := range order {
		t, ok := src.Lookup(n)
		if _, dup := p.items[n]; !ok || dup {
			continue
		}
		p.order = append(p.order, n)
		p.items[n] = &prefetchItem{size: t.Size}
	}
	for range max(workers, 1) {
		p.wg.Add(1)
		go p.work()
	}
	return p
}

func (p *Prefetcher) work() {
	defer p.wg.Done()
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		for !p.closed && p.next < len(p.order) && p.held > 0 && p.held+p.items[p.order[p.next]].size > p.budget {
			p.cond.Wait()
		}
		if p.closed || p.next >= len(p.order) {
			return
		}
		name := p.order[p.next]
		it := p.items[name]
		p.next++
		if it.state != 0 {
			continue // the user fetched it already
		}
		it.state = 1
		p.held += it.size
		p.mu.Unlock()
		data, err := p.Source.TensorData(name)
		p.mu.Lock()
		it.data, it.err, it.state = data, err, 2
		if p.closed { // nobody will take it: waiters fetch from the source
			p.held -= it.size
			it.data, it.err, it.state = nil, nil, 3
		}
		p.cond.Broadcast()
	}
}

// TensorData implements Source (see Prefetch).
func (p *Prefetcher) TensorData(name string) ([]byte, error) {
	p.mu.Lock()
	it, ok := p.items[name]
	if !ok || it.state == 3 || p.closed {
		p.mu.Unlock()
		return p.Source.TensorData(name)
	}
	if it.state == 0 {
		it.state = 3
		p.mu.Unlock()
		return p.Source.TensorData(name)
	}
	for it.state == 1 {
		p.cond.Wait()
	}
	if it.state != 2 { // closed and dropped while we waited
		p.mu.Unlock()
		return p.Source.TensorData(name)
	}
	data, err := it.data, it.err
	it.data, it.err, it.state = nil, nil, 3
	p.held -= it.size
	p.cond.Broadcast()
	p.mu.Unlock()
	return data, err
}

// Close stops the workers (waiting for tensors being computed) and drops the
// results nobody took. It does not close the underlying source.
func (p *Prefetcher) Close() error {
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	p.mu.Unlock()
	p.wg.Wait()
	p.mu.Lock()
	for _, it := range p.items {
		if it.state == 2 {
			it.data, it.state = nil, 3
		}
	}
	p.held = 0
	p.mu.Unlock()
	return nil
}
