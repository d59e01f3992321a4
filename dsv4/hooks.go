package dsv4

// ExpertPrefetcher is an optional capability of an Experts implementation. The
// forward pass calls Prefetch with every expert a layer is about to use before it
// asks for any of them, so that a tiered store can start all its misses at once;
// for hash-routed layers, whose experts follow from the token ids alone, it calls
// Prefetch for those layers before the first layer runs. Prefetch must not block
// on I/O and must not fail: a fetch error is reported by the later Expert call.
type ExpertPrefetcher interface {
	Prefetch(layer int, experts []int)
}

// RouteRecorder receives every routing decision of the forward pass: for the
// token at absolute position pos, in layer (main layers, then MTP blocks), the
// selected experts and their final weights (after renormalisation and the route
// scale), in selection order. The slices are only valid during the call.
type RouteRecorder interface {
	RecordRoute(pos, layer int, experts []int, weights []float32)
}

// ExpertObserver receives every routed expert's work in a host forward pass
// (device sessions do not call it): in layer (main layers, then MTP
// blocks), expert's rows for the n tokens of a chunk routed to it, in token
// order: pos [n] their absolute positions, weights [n] the gate weights
// applied (after renormalisation and the route scale), in [n·Dim] the
// expert's input rows (the FFN's normalised input), out [n·Dim] its output
// rows as added into the layer's output, W2·(SwiGLU(W1·x, W3·x)·weight)
// with the routed clamp. The slices are only valid during the call; the
// forward pass's results do not depend on the observer.
type ExpertObserver interface {
	ObserveExpert(layer, expert int, pos []int, weights, in, out []float32)
}

// prefetchHashLayers announces the experts of every hash-routed layer for tokens.
func (s *Session) prefetchHashLayers(tokens []int) {
	p, ok := s.m.experts.(ExpertPrefetcher)
	if !ok {
		return
	}
	K := s.m.Cfg.NActivatedExperts
	for _, b := range s.m.layers {
		if b.hash {
			p.Prefetch(b.layer, uniqueExperts(tokens, func(i int) []int { return b.tid2eid[tokens[i]*K : (tokens[i]+1)*K] }))
		}
	}
}

// uniqueExperts lists, in first-use order, the distinct experts that ids(i)
// returns for i in [0, len(tokens)).
func uniqueExperts(tokens []int, ids func(i int) []int) []int {
	var out []int
	seen := map[int]bool{}
	for i := range tokens {
		for _, e := range ids(i) {
			if !seen[e] {
				seen[e] = true
				out = append(out, e)
			}
		}
	}
	return out
}
