package dsv4

import (
	"fmt"
	"os"
	"strings"

	"moxie/compute"
	"moxie/compute/cuda"
)

// l2Prefetch pulls weights into the GPU's L2 cache on a third stream while a
// one-token step's latency-bound kernels run (sublayer boundaries,
// attention, indexer, router leave HBM idle), so that the bandwidth-bound
// projections after them read from L2. Prefetching is a hint: it never
// changes a result, only where bytes come from. Sets ($MOXIE_CUDA_PREFETCH,
// a comma list, optionally ":MODE" with a cuda.PrefetchMode name; "off" or
// unset: none):
//
//	q  at the layer's start: wq_a, wkv, wq_b and the indexer's wq_b
//	o  after the query projections: wo_a; after the attention: wo_b
//	a  after the query projections: wo_a alone (the attention's ~12 us
//	   leave HBM idle for about its 32 MB)
//	s  after wo_b: the router's gate and the shared expert
//	m  after wo_b: the router's gate and the shared expert's w1 and w3
//	   (what stage 1 reads beside the routed experts; w2 comes later)
//
// A fused step joins the prefetch stream back once, after its last layer,
// so that no kernel of the main chain waits for a prefetch launch (a join
// would cost the next kernel its programmatic early start).
type l2Prefetch struct {
	q, o, s, a, m bool
	opt           cuda.PrefetchOptions
	stream        cuda.Stream
	fork, join    cuda.Event
	pending, ok   bool
	streamExists  bool
}

// parsePrefetch reads $MOXIE_CUDA_PREFETCH's value.
func parsePrefetch(v string) (l2Prefetch, error) {
	var p l2Prefetch
	if v == "" || v == "off" {
		return p, nil
	}
	sets, mode, hasMode := strings.Cut(v, ":")
	if hasMode {
		m, err := cuda.ParsePrefetchMode(mode)
		if err != nil {
			return p, fmt.Errorf("MOXIE_CUDA_PREFETCH=%q: %w", v, err)
		}
		p.opt.Mode = m
	}
	for _, f := range strings.Split(sets, ",") {
		switch f {
		case "q":
			p.q = true
		case "o":
			p.o = true
		case "s":
			p.s = true
		case "a":
			p.a = true
		case "m":
			p.m = true
		case "all":
			p.q, p.o, p.s = true, true, true
		default:
			return p, fmt.Errorf("MOXIE_CUDA_PREFETCH=%q: unknown set %q (want a comma list of q, o, a, s, m or all, optionally :MODE, or off)", v, f)
		}
	}
	p.ok = p.q || p.o || p.s || p.a || p.m
	return p, nil
}

// open makes the prefetch stream and events (on the device thread); on
// failure prefetching stays off.
func (p *l2Prefetch) open(c *cuda.Ctx) {
	if !p.ok {
		return
	}
	var err error
	if p.stream, err = c.NewStream(); err != nil {
		p.ok = false
		return
	}
	p.streamExists = true
	if p.fork, err = c.NewEvent(false); err != nil {
		p.ok = false
		return
	}
	if p.join, err = c.NewEvent(false); err != nil {
		_ = c.DestroyEvent(p.fork)
		p.fork = cuda.Event{}
		p.ok = false
	}
}

// close frees what open made (on the device thread).
func (p *l2Prefetch) close(c *cuda.Ctx) {
	if !p.streamExists {
		return
	}
	_ = c.Sync(p.stream)
	if p.ok {
		_ = c.DestroyEvent(p.fork)
		_ = c.DestroyEvent(p.join)
	}
	_ = c.DestroyStream(p.stream)
	p.streamExists, p.ok = false, false
}

// weightRanges returns the device memory of ws (data, then scales where
// stored apart); nil weights are skipped.
func weightRanges(ws ...*cuda.DeviceWeight) []cuda.L2Range {
	var out []cuda.L2Range
	for _, w := range ws {
		if w == nil {
			continue
		}
		data, scale, err := compute.StoredSizes(w.Format, w.Rows, w.Cols, w.Block)
		if err != nil {
			continue // not an uploaded weight's shape: nothing to hint
		}
		out = append(out, cuda.L2Range{Ptr: w.Data, Bytes: data})
		if scale > 0 && w.Scale != w.Data {
			out = append(out, cuda.L2Range{Ptr: w.Scale, Bytes: scale})
		}
	}
	return out
}

// at forks the prefetch stream from st here and prefetches ws on it, when
// set is on and the step is one token.
func (p *l2Prefetch) at(c *cuda.Ctx, set bool, T int, st cuda.Stream, ws ...*cuda.DeviceWeight) error {
	if !p.ok || !set || T != 1 {
		return nil
	}
	r := weightRanges(ws...)
	if len(r) == 0 {
		return nil
	}
	if err := c.Record(p.fork, st); err != nil {
		return err
	}
	if err := c.StreamWait(p.stream, p.fork); err != nil {
		return err
	}
	p.pending = true
	return c.PrefetchL2Ranges(r, p.opt, p.stream)
}

// joinTo makes st wait for the prefetches enqueued since the last join (a
// captured graph must join every forked stream back).
func (p *l2Prefetch) joinTo(c *cuda.Ctx, st cuda.Stream) error {
	if !p.pending {
		return nil
	}
	p.pending = false
	if err := c.Record(p.join, p.stream); err != nil {
		return err
	}
	return c.StreamWait(st, p.join)
}

// prefetchFromEnv reads $MOXIE_CUDA_PREFETCH.
func prefetchFromEnv() (l2Prefetch, error) { return parsePrefetch(os.Getenv("MOXIE_CUDA_PREFETCH")) }
