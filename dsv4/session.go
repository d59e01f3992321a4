package dsv4

import (
	"context"
	"fmt"
	"math"
	"slices"

	"moxie/compute"
	"moxie/dsv4/config"
	"moxie/format"
	"moxie/generate"
	"moxie/qat"
)

// Session is one sequence's state: position, and per layer the window ring,
// compressor buffers, compressed KV entries and indexer keys
// (dsv4-flash.md §4.10). Prefill (in any chunking) and token-by-token decode
// compute the same function. A Session is not safe for concurrent use.
type Session struct {
	m      *Model
	pos    int
	layers []*layerState
	failed error
	// layerHook, if set (tests only), sees the streams [T, hc, D] after each layer.
	layerHook func(layer int, X []float32)
	// selHook, if set (tests only), sees the indexer's selection for each CSA
	// layer and query position (the slice is reused after the call).
	selHook func(layer, pos int, sel []int)
}

type layerState struct {
	ring  []float32 // [Window, HeadDim], slot t mod Window
	comp  *compState
	icomp *compState
	ckv   []float32 // compressed KV entries [n, HeadDim]
	ikeys []float32 // indexer keys [n, IndexHeadDim]
}

// compState buffers the (κ, z) rows of the current window and, for the
// overlapping CSA compressor, the previous one.
type compState struct {
	c           *compressor
	cur, curZ   []float32 // [R, c·dw]
	prev, prevZ []float32 // CSA only
	hasPrev     bool
	// scratch for pooling
	slots, slotZ, out []float32
}

func newCompState(c *compressor) *compState {
	w := c.c * c.dw
	s := &compState{c: c, cur: make([]float32, c.ratio*w), curZ: make([]float32, c.ratio*w)}
	if c.c == 2 {
		s.prev, s.prevZ = make([]float32, c.ratio*w), make([]float32, c.ratio*w)
	}
	s.slots = make([]float32, c.c*c.ratio*c.dw)
	s.slotZ = make([]float32, c.c*c.ratio*c.dw)
	s.out = make([]float32, c.dw)
	return s
}

// NewSession starts an empty sequence at position 0.
func (m *Model) NewSession() *Session {
	s := &Session{m: m}
	c := m.Cfg
	for _, b := range m.layers {
		ls := &layerState{ring: make([]float32, c.Window*c.HeadDim)}
		if b.comp != nil {
			ls.comp = newCompState(b.comp)
		}
		if b.idx != nil {
			ls.icomp = newCompState(b.idx.comp)
		}
		s.layers = append(s.layers, ls)
	}
	return s
}

// Pos is the number of tokens processed so far (the next token's position).
func (s *Session) Pos() int { return s.pos }

// Prefill runs tokens at the next positions and returns the logits [VocabSize]
// that predict the token after the last one. The slice is owned by the caller.
func (s *Session) Prefill(tokens []int) ([]float32, error) {
	return s.forward(tokens, false)
}

// PrefillAll is Prefill returning the logits of every position, row-major
// [len(tokens), VocabSize]; row i predicts the token after tokens[i].
func (s *Session) PrefillAll(tokens []int) ([]float32, error) {
	return s.forward(tokens, true)
}

// Decode runs one token and returns its logits [VocabSize].
func (s *Session) Decode(tok int) ([]float32, error) {
	return s.forward([]int{tok}, false)
}

// Append implements generate.Sequence.
func (s *Session) Append(ctx context.Context, tokens []int) ([]float32, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s.Prefill(tokens)
}

// Len implements generate.Sequence.
func (s *Session) Len() int { return s.pos }

// Clone returns an independent session in the same state: the same
// position and caches (window rings, compressor buffers, compressed
// entries, indexer keys), copied; the test hooks are not. Appending to
// either leaves the other unchanged. It fails on a failed or closed
// session.
func (s *Session) Clone() (*Session, error) {
	if s.failed != nil {
		return nil, s.failed
	}
	c := &Session{m: s.m, pos: s.pos, layers: make([]*layerState, len(s.layers))}
	for i, ls := range s.layers {
		c.layers[i] = &layerState{ring: slices.Clone(ls.ring), comp: ls.comp.clone(), icomp: ls.icomp.clone(),
			ckv: slices.Clone(ls.ckv), ikeys: slices.Clone(ls.ikeys)}
	}
	return c, nil
}

// CloneSequence implements generate.Cloner.
func (s *Session) CloneSequence() (generate.Sequence, error) { return s.Clone() }

// clone copies a compressor's state (nil for nil); the pooling scratch is
// fresh.
func (cs *compState) clone() *compState {
	if cs == nil {
		return nil
	}
	n := newCompState(cs.c)
	copy(n.cur, cs.cur)
	copy(n.curZ, cs.curZ)
	copy(n.prev, cs.prev)
	copy(n.prevZ, cs.prevZ)
	n.hasPrev = cs.hasPrev
	return n
}

// Close implements generate.Sequence; it drops the caches.
func (s *Session) Close() error {
	s.layers = nil
	s.failed = fmt.Errorf("dsv4: session closed")
	return nil
}

// NewSequence implements generate.Model: a DeviceSession when the model was
// loaded with Options.Device, otherwise a Session.
func (m *Model) NewSequence() (generate.Sequence, error) {
	if m.dev != nil {
		return m.NewDeviceSession()
	}
	return m.NewSession(), nil
}

// VocabSize implements generate.Model.
func (m *Model) VocabSize() int { return m.Cfg.VocabSize }

// MaxContext implements generate.Model (the device context limit with
// Options.Device).
func (m *Model) MaxContext() int {
	if m.dev != nil {
		return m.dev.maxCtx
	}
	return m.Cfg.MaxPositions
}

var _ generate.Model = (*Model)(nil)

// Logits runs tokens through a fresh session: the first prefill tokens as one
// prefill, then each remaining token as one decode step, and returns the logits
// of every position, row-major [len(tokens), VocabSize] (row i predicts token
// i+1). prefill must be in [1, len(tokens)].
func Logits(m *Model, tokens []int, prefill int) ([]float32, error) {
	if prefill < 1 || prefill > len(tokens) {
		return nil, fmt.Errorf("dsv4: prefill length %d, want 1..%d (the number of tokens)", prefill, len(tokens))
	}
	s := m.NewSession()
	out, err := s.PrefillAll(tokens[:prefill])
	if err != nil {
		return nil, err
	}
	for _, t := range tokens[prefill:] {
		l, err := s.Decode(t)
		if err != nil {
			return nil, err
		}
		out = append(out, l...)
	}
	return out, nil
}

// forward validates tokens, then runs them in chunks of at most maxChunk and
// returns the logits of every position (all) or of the last one.
func (s *Session) forward(tokens []int, all bool) ([]float32, error) {
	if s.failed != nil {
		return nil, s.failed
	}
	if s.m.hostUnbound {
		return nil, fmt.Errorf("dsv4: this model was loaded onto the GPU (Options.Device) and its weights are not bound on the host: use NewSequence or NewDeviceSession")
	}
	s.m.pass.Lock()
	defer s.m.pass.Unlock()
	c := s.m.Cfg
	if err := checkTokens(c, tokens); err != nil {
		return nil, err
	}
	if s.pos+len(tokens) > c.MaxPositions {
		return nil, fmt.Errorf("dsv4: %d tokens at position %d exceed max_position_embeddings %d", len(tokens), s.pos, c.MaxPositions)
	}
	var out []float32
	for at := 0; at < len(tokens); at += s.m.maxChunk {
		end := min(at+s.m.maxChunk, len(tokens))
		rows := 0 // logits for the last `rows` positions of the chunk
		switch {
		case all:
			rows = end - at
		case end == len(tokens):
			rows = 1
		}
		l, err := s.chunk(tokens[at:end], rows)
		if err != nil {
			return nil, err
		}
		if all {
			out = append(out, l...)
		} else {
			out = l
		}
	}
	return out, nil
}

// chunk runs validated tokens at the next positions and returns the logits of
// its last `rows` positions ([rows, VocabSize]; nil for 0).
func (s *Session) chunk(tokens []int, rows int) ([]float32, error) {
	m := s.m
	c := m.Cfg
	T, D, hc := len(tokens), c.Dim, c.HCMult
	pos := make([]int, T)
	for i := range pos {
		pos[i] = s.pos + i
	}
	// §4.1: every stream starts as the embedding.
	X := make([]float32, T*hc*D)
	for i, t := range tokens {
		row := X[i*hc*D : i*hc*D+D]
		format.DecodeBF16(row, m.embed[2*t*D:2*(t+1)*D])
		for j := 1; j < hc; j++ {
			copy(X[(i*hc+j)*D:(i*hc+j+1)*D], row)
		}
	}
	s.prefetchHashLayers(tokens)
	for l, b := range m.layers {
		var err error
		if X, err = s.layer(b, s.layers[l], X, tokens, pos); err != nil {
			s.failed = err
			return nil, err
		}
		if s.layerHook != nil {
			s.layerHook(l, X)
		}
	}
	s.pos += T
	if rows == 0 {
		return nil, nil
	}
	// §4.8: head collapse, norm, LM head.
	first := T - rows
	n := rows
	Xs := X[first*hc*D:]
	be := m.be
	pre := make([]float32, n*hc)
	be.HCHeadPre(pre, Xs, &m.hcHead, n)
	y := make([]float32, n*D)
	be.HCCollapse(y, Xs, pre, hc, D, n)
	be.RMSNorm(y, y, m.norm, D, float32(c.NormEps))
	logits := make([]float32, n*c.VocabSize)
	be.Linear(m.head, logits, y, n)
	return logits, nil
}

// layer runs decoder block b on streams X [T, hc, D] and returns the new streams.
func (s *Session) layer(b *block, st *layerState, X []float32, tokens, pos []int) ([]float32, error) {
	m := s.m
	be := m.be
	c := m.Cfg
	T, D, hc := len(tokens), c.Dim, c.HCMult
	eps := float32(c.NormEps)
	pre, post, comb := make([]float32, T*hc), make([]float32, T*hc), make([]float32, T*hc*hc)

	be.HCMix(pre, post, comb, X, &b.hcAttn, T)
	a := make([]float32, T*D)
	be.HCCollapse(a, X, pre, hc, D, T)
	be.RMSNorm(a, a, b.attnNorm, D, eps)
	o := s.attention(b, st, a, pos)
	Xmid := make([]float32, len(X))
	be.HCExpand(Xmid, X, o, post, comb, hc, D, T)

	be.HCMix(pre, post, comb, Xmid, &b.hcFFN, T)
	f := a
	be.HCCollapse(f, Xmid, pre, hc, D, T)
	be.RMSNorm(f, f, b.ffnNorm, D, eps)
	mo, err := s.moe(b, f, tokens, pos)
	if err != nil {
		return nil, err
	}
	be.HCExpand(X, Xmid, mo, post, comb, hc, D, T)
	return X, nil
}

// attention is §4.4 for T consecutive tokens at positions pos; a is [T, D].
func (s *Session) attention(b *block, st *layerState, a []float32, pos []int) []float32 {
	m := s.m
	be := m.be
	c := m.Cfg
	T, D, H, hd := len(pos), c.Dim, c.NHeads, c.HeadDim
	eps := float32(c.NormEps)
	freq := m.freqPlain
	if b.ratio > 0 {
		freq = m.freqCompress
	}
	// sim (the qat target): the FP8 linears read their inputs through act_quant (aq, qlq);
	// the BF16 ones (compressors, indexer weights) read them as they are.
	sim := m.target == QAT
	aq := a
	if sim {
		aq = qat.ActQuantCopy(a, D)
	}
	// Query path.
	qlat := make([]float32, T*c.QLoraRank)
	be.Linear(b.wqA, qlat, aq, T)
	be.RMSNorm(qlat, qlat, b.qNorm, c.QLoraRank, eps)
	qlq := qlat
	if sim {
		qlq = qat.ActQuantCopy(qlat, c.QLoraRank)
	}
	q := make([]float32, T*H*hd)
	be.Linear(b.wqB, q, qlq, T)
	be.RMSNorm(q, q, nil, hd, eps)
	be.RoPE(q, pos, freq, H*hd, hd, false)
	// Window KV.
	kv := make([]float32, T*hd)
	be.Linear(b.wkv, kv, aq, T)
	be.RMSNorm(kv, kv, b.kvNorm, hd, eps)
	be.RoPE(kv, pos, freq, hd, hd, false)
	if sim {
		qat.KVSim(kv, hd, hd-2*len(freq))
	}
	// Compressor inputs.
	var ckv, cz []float32
	if b.comp != nil {
		ckv, cz = compInputs(be, b.comp, a, T)
	}
	var qi, wts, ikv, iz []float32
	IH, ID := c.IndexNHeads, c.IndexHeadDim
	if b.idx != nil {
		qi = make([]float32, T*IH*ID)
		be.Linear(b.idx.wqB, qi, qlq, T)
		be.RoPE(qi, pos, freq, IH*ID, ID, false)
		if sim {
			qat.IndexSim(qi, ID)
		}
		wts = make([]float32, T*IH)
		be.Linear(b.idx.wproj, wts, a, T)
		sc := float32(1 / math.Sqrt(float64(ID)) / math.Sqrt(float64(IH)))
		for i := range wts {
			wts[i] *= sc
		}
		ikv, iz = compInputs(be, b.idx.comp, a, T)
	}
	W := c.Window
	o := make([]float32, T*H*hd)
	keys := make([]float32, 0, (W+c.IndexTopK)*hd)
	var scores []float32
	var sel []int
	scale := float32(1 / math.Sqrt(float64(hd)))
	for i, t := range pos {
		copy(st.ring[(t%W)*hd:], kv[i*hd:(i+1)*hd])
		if b.idx != nil {
			w := b.idx.comp.c * b.idx.comp.dw
			if e := s.compStep(st.icomp, freq, t, ikv[i*w:(i+1)*w], iz[i*w:(i+1)*w], true); e != nil {
				st.ikeys = append(st.ikeys, e...)
			}
		}
		if b.comp != nil {
			w := b.comp.c * b.comp.dw
			if e := s.compStep(st.comp, freq, t, ckv[i*w:(i+1)*w], cz[i*w:(i+1)*w], false); e != nil {
				st.ckv = append(st.ckv, e...)
			}
		}
		keys = keys[:0]
		for p := max(0, t-W+1); p <= t; p++ {
			keys = append(keys, st.ring[(p%W)*hd:(p%W+1)*hd]...)
		}
		switch b.kind {
		case config.HCA:
			n := (t + 1) / b.ratio
			keys = append(keys, st.ckv[:n*hd]...)
		case config.CSA:
			n := (t + 1) / b.ratio
			if n > 0 {
				if cap(scores) < n {
					scores = make([]float32, n)
				}
				scores = scores[:n]
				be.IndexScores(scores, qi[i*IH*ID:(i+1)*IH*ID], wts[i*IH:(i+1)*IH], st.ikeys[:n*ID], n, IH, ID)
				sel = compute.TopK(sel, scores, min(c.IndexTopK, n))
				if s.selHook != nil {
					s.selHook(b.layer, t, sel)
				}
				for _, e := range sel {
					keys = append(keys, st.ckv[e*hd:(e+1)*hd]...)
				}
			}
		}
		be.Attention(o[i*H*hd:(i+1)*H*hd], q[i*H*hd:(i+1)*H*hd], keys, b.sink, len(keys)/hd, H, hd, scale)
	}
	be.RoPE(o, pos, freq, H*hd, hd, true)
	if sim { // wo_a is a BF16 grouped product in the reference (its FP8 weights are BF16 values exactly)
		qat.BF16Round(o)
	}
	u := make([]float32, T*c.OGroups*c.OLoraRank)
	be.GroupedLinear(b.woA, u, o, T, c.OGroups)
	if sim {
		qat.BF16Round(u)
		qat.ActQuant(u, c.OGroups*c.OLoraRank)
	}
	out := make([]float32, T*D)
	be.Linear(b.woB, out, u, T)
	return out
}

// compInputs returns κ = wkv·a and z = wgate·a (ape is added per position).
func compInputs(be compute.Backend, cp *compressor, a []float32, T int) (kv, z []float32) {
	w := cp.c * cp.dw
	kv, z = make([]float32, T*w), make([]float32, T*w)
	be.Linear(cp.wkv, kv, a, T)
	be.Linear(cp.wgate, z, a, T)
	return kv, z
}

// compStep feeds token t's (κ, z) rows into a compressor and returns the new
// entry (normalised and rotated; a fresh slice) when t closes a window.
// index: the indexer's compressor (its keys take the qat target's indexer
// simulation; the main compressor's entries the KV one).
func (s *Session) compStep(cs *compState, freq []float32, t int, kv, z []float32, index bool) []float32 {
	cp := cs.c
	R, w, dw := cp.ratio, cp.c*cp.dw, cp.dw
	slot := t % R
	copy(cs.cur[slot*w:(slot+1)*w], kv)
	zr := cs.curZ[slot*w : (slot+1)*w]
	ape := cp.ape[slot*w : (slot+1)*w]
	for i := range zr {
		zr[i] = z[i] + ape[i]
	}
	if (t+1)%R != 0 {
		return nil
	}
	be := s.m.be
	n := 0
	if cp.c == 2 {
		// CSA: previous window's A halves, then this window's B halves.
		if cs.hasPrev {
			for r := range R {
				copy(cs.slots[n*dw:], cs.prev[r*w:r*w+dw])
				copy(cs.slotZ[n*dw:], cs.prevZ[r*w:r*w+dw])
				n++
			}
		}
		for r := range R {
			copy(cs.slots[n*dw:], cs.cur[r*w+dw:(r+1)*w])
			copy(cs.slotZ[n*dw:], cs.curZ[r*w+dw:(r+1)*w])
			n++
		}
		cs.prev, cs.cur = cs.cur, cs.prev
		cs.prevZ, cs.curZ = cs.curZ, cs.prevZ
		cs.hasPrev = true
	} else {
		copy(cs.slots, cs.cur)
		copy(cs.slotZ, cs.curZ)
		n = R
	}
	e := make([]float32, dw)
	be.CompressPool(e, cs.slots[:n*dw], cs.slotZ[:n*dw], n, dw)
	be.RMSNorm(e, e, cp.norm, dw, float32(s.m.Cfg.NormEps))
	wpos := (t / R) * R
	be.RoPE(e, []int{wpos}, freq, dw, dw, false)
	if s.m.target == QAT {
		if index {
			qat.IndexSim(e, dw)
		} else {
			qat.KVSim(e, dw, dw-2*len(freq))
		}
	}
	return e
}

// moe is §4.7 for T tokens; f is [T, D]. Experts run in index order, each on
// the batch of tokens routed to it.
func (s *Session) moe(b *block, f []float32, tokens, pos []int) ([]float32, error) {
	m := s.m
	be := m.be
	c := m.Cfg
	T, D, E, K, I := len(tokens), c.Dim, c.NRoutedExperts, c.NActivatedExperts, c.MoEInterDim
	logits := make([]float32, T*E)
	be.Linear(b.gate, logits, f, T)
	ids := make([]int, T*K)
	wts := make([]float32, T*K)
	for i, tok := range tokens {
		var hash []int
		if b.hash {
			hash = b.tid2eid[tok*K : (tok+1)*K]
		}
		be.Route(ids[i*K:(i+1)*K], wts[i*K:(i+1)*K], logits[i*E:(i+1)*E], b.bias, hash, float32(c.RouteScale))
		if m.routes != nil {
			m.routes.RecordRoute(pos[i], b.layer, ids[i*K:(i+1)*K], wts[i*K:(i+1)*K])
		}
	}
	if p, ok := m.experts.(ExpertPrefetcher); ok && !b.hash {
		p.Prefetch(b.layer, uniqueExperts(tokens, func(i int) []int { return ids[i*K : (i+1)*K] }))
	}
	if T == 1 {
		if out, ok, err := s.moeOne(b, f, ids, wts, pos[0]); ok || err != nil {
			return out, err
		}
	}
	// Group (token, weight) pairs by expert.
	type use struct {
		tok int
		w   float32
	}
	byExpert := make([][]use, E)
	for i := range tokens {
		for k := range K {
			e := ids[i*K+k]
			byExpert[e] = append(byExpert[e], use{i, wts[i*K+k]})
		}
	}
	out := make([]float32, T*D)
	limit := float32(c.SwigluLimit)
	for e, us := range byExpert {
		if len(us) == 0 {
			continue
		}
		ew, err := m.experts.Expert(b.layer, e)
		if err != nil {
			return nil, fmt.Errorf("dsv4: layer %d: %w", b.layer, err)
		}
		n := len(us)
		x := make([]float32, n*D)
		rs := make([]float32, n)
		for j, u := range us {
			copy(x[j*D:(j+1)*D], f[u.tok*D:(u.tok+1)*D])
			rs[j] = u.w
		}
		y := ffn(be, ew, x, rs, n, D, I, limit, m.target == QAT)
		if m.observe != nil {
			ps := make([]int, n)
			for j, u := range us {
				ps[j] = pos[u.tok]
			}
			m.observe.ObserveExpert(b.layer, e, ps, rs, x, y)
		}
		for j, u := range us {
			dst := out[u.tok*D : (u.tok+1)*D]
			for d, v := range y[j*D : (j+1)*D] {
				dst[d] += v
			}
		}
	}
	if b.shared != nil {
		y := ffn(be, *b.shared, f, nil, T, D, I*c.NSharedExperts, 0, m.target == QAT)
		for i, v := range y {
			out[i] += v
		}
	}
	return out, nil
}

// moeOne is moe's expert part for one token (f is [D]) with every expert
// product in two joint splits: each routed expert's and the shared expert's
// W1 and W3, then each W2. The products, their order of accumulation and
// the qat steps are the per-expert path's, so are the bits. It reports
// false (and does nothing) when the backend or the experts cannot batch,
// or when a routed expert repeats.
func (s *Session) moeOne(b *block, f []float32, ids []int, wts []float32, pos int) ([]float32, bool, error) {
	m := s.m
	c := m.Cfg
	D, K, I := c.Dim, c.NActivatedExperts, c.MoEInterDim
	ml, ok := m.be.(compute.ManyLinear)
	set, ok2 := m.experts.(ExpertSet)
	if !ok || !ok2 {
		return nil, false, nil
	}
	type routed struct {
		e int
		w float32
	}
	rs := make([]routed, K)
	for k := range K {
		rs[k] = routed{ids[k], wts[k]}
	}
	slices.SortFunc(rs, func(a, b routed) int { return a.e - b.e })
	es := make([]int, K)
	for k, r := range rs {
		if k > 0 && r.e == rs[k-1].e {
			return nil, false, nil
		}
		es[k] = r.e
	}
	ws := make([]ExpertWeights, K, K+1) // the routed experts, then the shared one
	if ok, err := set.ExpertSet(b.layer, es, ws); err != nil {
		return nil, false, fmt.Errorf("dsv4: layer %d: %w", b.layer, err)
	} else if !ok {
		return nil, false, nil
	}
	if b.shared != nil {
		ws = append(ws, *b.shared)
	}
	n := len(ws)
	sim := m.target == QAT
	x := f[:D]
	if sim {
		x = qat.ActQuantCopy(x, D)
	}
	g, u, y := make([][]float32, n), make([][]float32, n), make([][]float32, n)
	jobs := make([]compute.LinearJob, 0, 2*n)
	for k := range n {
		w := I // the inner width: the shared expert's is NSharedExperts times a routed one's
		if k == K {
			w *= c.NSharedExperts
		}
		g[k], u[k] = make([]float32, w), make([]float32, w)
		jobs = append(jobs, compute.LinearJob{W: ws[k].W1, Y: g[k], X: x}, compute.LinearJob{W: ws[k].W3, Y: u[k], X: x})
	}
	ml.LinearMany(jobs)
	jobs = jobs[:0]
	limit := float32(c.SwigluLimit)
	for k := range n {
		if k < K {
			m.be.SwiGLU(g[k], g[k], u[k], []float32{rs[k].w}, I, limit)
		} else {
			m.be.SwiGLU(g[k], g[k], u[k], nil, len(g[k]), 0)
		}
		if sim {
			qat.ActQuant(g[k], len(g[k]))
		}
		y[k] = make([]float32, D)
		jobs = append(jobs, compute.LinearJob{W: ws[k].W2, Y: y[k], X: g[k]})
	}
	ml.LinearMany(jobs)
	out := make([]float32, D)
	for k := range n {
		if k < K && m.observe != nil {
			m.observe.ObserveExpert(b.layer, rs[k].e, []int{pos}, []float32{rs[k].w}, append([]float32(nil), f[:D]...), y[k])
		}
		for d, v := range y[k] {
			out[d] += v
		}
	}
	return out, true, nil
}

// ffn is a SwiGLU expert on n rows: W2·(silu(W1 x)·(W3 x)·rowScale), with the
// clamp when limit > 0; with sim (the qat target), W1 and W3 read act_quant(x) and W2
// act_quant of its input (the routed weight multiplied in before, as the
// reference does). x is not modified.
func ffn(be compute.Backend, w ExpertWeights, x, rowScale []float32, n, D, I int, limit float32, sim bool) []float32 {
	if sim {
		x = qat.ActQuantCopy(x, D)
	}
	g, u := make([]float32, n*I), make([]float32, n*I)
	if ml, ok := be.(compute.ManyLinear); ok && n == 1 {
		ml.LinearMany([]compute.LinearJob{{W: w.W1, Y: g, X: x}, {W: w.W3, Y: u, X: x}}) // one split, Linear's bits
	} else {
		be.Linear(w.W1, g, x, n)
		be.Linear(w.W3, u, x, n)
	}
	be.SwiGLU(g, g, u, rowScale, I, limit)
	if sim {
		qat.ActQuant(g, I)
	}
	y := make([]float32, n*D)
	be.Linear(w.W2, y, g, n)
	return y
}

// checkTokens rejects an empty chunk and ids outside the vocabulary, naming
// the first bad index.
func checkTokens(c *config.Config, tokens []int) error {
	if len(tokens) == 0 {
		return fmt.Errorf("dsv4: no tokens")
	}
	for i, t := range tokens {
		if t < 0 || t >= c.VocabSize {
			return fmt.Errorf("dsv4: token %d at index %d is outside the vocabulary of %d", t, i, c.VocabSize)
		}
	}
	return nil
}
