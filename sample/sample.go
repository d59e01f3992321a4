// Package sample picks the next token from a logits vector: greedy or
// random sampling with temperature, top-k, top-p (nucleus), min-p and a
// repetition penalty, driven by a seeded per-sampler random generator so that
// runs are reproducible.
package sample

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
)

// Params configures a Sampler. The zero value is greedy decoding.
type Params struct {
	// Temperature divides the logits; 0 selects greedy decoding (argmax,
	// lowest id on ties). Must be >= 0.
	Temperature float64
	// TopK keeps the K most likely tokens; 0 disables. Must be >= 0.
	TopK int
	// TopP keeps the smallest set of most likely tokens whose probability
	// sums to at least TopP; 0 or 1 disables. Must be in [0, 1].
	TopP float64
	// MinP keeps tokens whose probability is at least MinP times that of the
	// most likely token; 0 disables. Must be in [0, 1].
	MinP float64
	// RepetitionPenalty (HF/CTRL style) divides positive logits and
	// multiplies negative logits of tokens seen in the window; 0 or 1
	// disables. Must be >= 0.
	RepetitionPenalty float64
	// RepetitionWindow is how many of the most recent ids the penalty looks
	// at; 0 means the whole history passed to Sample.
	RepetitionWindow int
	// Seed seeds the sampler's PCG generator.
	Seed uint64
	// StopTokens are ids that end generation (see IsStop).
	StopTokens []int
}

// Sampler draws tokens. The pipeline, applied in this order, is: repetition
// penalty, temperature, top-k, softmax, top-p, min-p, then one draw from the
// renormalised distribution. A Sampler is not safe for concurrent use; give
// each sequence its own.
type Sampler struct {
	p     Params
	rng   *rand.Rand
	stop  map[int]bool
	work  []float32 // logits after the repetition penalty
	e     []float64 // unnormalised probabilities
	order []cand
	seen  map[int]bool
	parts []part // per-chunk state (Sample's passes)
}

// Errors returned by Sample.
var (
	ErrEmpty     = errors.New("sample: empty logits")
	ErrNaN       = errors.New("sample: logits contain NaN or +Inf")
	ErrAllMasked = errors.New("sample: every logit is -Inf")
)

// New validates p and returns a sampler seeded with p.Seed.
func New(p Params) (*Sampler, error) {
	switch {
	case !(p.Temperature >= 0) || math.IsInf(p.Temperature, 1):
		return nil, fmt.Errorf("sample: temperature %v: want a finite value >= 0", p.Temperature)
	case p.TopK < 0:
		return nil, fmt.Errorf("sample: top_k %d: want >= 0", p.TopK)
	case !(p.TopP >= 0 && p.TopP <= 1):
		return nil, fmt.Errorf("sample: top_p %v: want a value in [0, 1]", p.TopP)
	case !(p.MinP >= 0 && p.MinP <= 1):
		return nil, fmt.Errorf("sample: min_p %v: want a value in [0, 1]", p.MinP)
	case !(p.RepetitionPenalty >= 0) || math.IsInf(p.RepetitionPenalty, 1):
		return nil, fmt.Errorf("sample: repetition_penalty %v: want a finite value >= 0", p.RepetitionPenalty)
	case p.RepetitionWindow < 0:
		return nil, fmt.Errorf("sample: repetition window %d: want >= 0", p.RepetitionWindow)
	}
	s := &Sampler{p: p, rng: rand.New(rand.NewPCG(p.Seed, p.Seed^0x9e3779b97f4a7c15)), stop: map[int]bool{}, seen: map[int]bool{}}
	for _, id := range p.StopTokens {
		s.stop[id] = true
	}
	return s, nil
}

// IsStop reports whether id is one of the stop tokens.
func (s *Sampler) IsStop(id int) bool { return s.stop[id] }

type cand struct {
	id int
	p  float64 // unnormalised probability
}

// Sample returns the next token id for logits (one value per vocabulary id;
// not modified) given the ids generated so far (history, used only by the
// repetition penalty). It errors on empty logits, on NaN or +Inf, and when
// every logit is -Inf; -Inf masks a token. The result is always a valid
// index into logits. Random sampling consumes exactly one draw from the
// sampler's generator; greedy decoding consumes none. Long vectors are
// scanned in fixed chunks on several goroutines; the result does not
// depend on how many.
func (s *Sampler) Sample(logits []float32, history []int) (int, error) {
	if len(logits) == 0 {
		return 0, ErrEmpty
	}
	// Work on a copy with the repetition penalty applied to the few ids seen.
	work := logits
	if pen := s.p.RepetitionPenalty; pen > 0 && pen != 1 {
		s.work = append(s.work[:0], logits...)
		h := history
		if w := s.p.RepetitionWindow; w > 0 && len(h) > w {
			h = h[len(h)-w:]
		}
		clear(s.seen)
		for _, id := range h {
			if id < 0 || id >= len(logits) || s.seen[id] {
				continue
			}
			s.seen[id] = true
			if v := float64(s.work[id]); v > 0 {
				s.work[id] = float32(min(v/pen, math.MaxFloat32)) // a penalty < 1 raises
			} else {
				// Clamp: a finite logit must stay finite (not masked).
				s.work[id] = float32(max(v*pen, -math.MaxFloat32))
			}
		}
		work = s.work
	}

	// Pass 1: NaN and +Inf (in the caller's logits: the penalty clamps
	// +Inf) and the argmax, lowest id on ties.
	n := len(work)
	parts := s.chunks(n)
	s.forChunks(n, func(c, lo, hi int) {
		p := &parts[c]
		p.best, p.bestV, p.bad = -1, float32(math.Inf(-1)), false
		for id, v := range logits[lo:hi] {
			if v != v || v > math.MaxFloat32 {
				p.bad = true
			}
			if w := work[lo+id]; w > p.bestV {
				p.best, p.bestV = lo+id, w
			}
		}
	})
	best := -1
	bestV := float32(math.Inf(-1))
	for _, p := range parts {
		if p.bad {
			return 0, ErrNaN
		}
		if p.best >= 0 && p.bestV > bestV {
			best, bestV = p.best, p.bestV
		}
	}
	if best < 0 {
		return 0, ErrAllMasked
	}
	invT := 1 / s.p.Temperature
	if s.p.Temperature == 0 || math.IsInf(invT, 1) {
		return best, nil // greedy (a subnormal temperature is greedy too)
	}

	// Pass 2: e[id] = exp((l - lmax)/T), unnormalised probabilities (1 for
	// the best), their sum by chunk, and with truncation the ids above a
	// first threshold t that every kept id passes.
	maxL := float64(bestV)
	if cap(s.e) < n {
		s.e = make([]float64, n)
	}
	e := s.e[:n]
	k, topP, truncate := s.cuts(n)
	t := firstThreshold(s.p)
	s.forChunks(n, func(c, lo, hi int) {
		p := &parts[c]
		p.cands = p.cands[:0]
		var z float64
		last := -1
		for id, v := range work[lo:hi] {
			x := math.Exp((float64(v) - maxL) * invT)
			e[lo+id] = x
			z += x
			if x > 0 {
				last = lo + id
				if truncate && x >= t {
					p.cands = append(p.cands, cand{lo + id, x})
				}
			}
		}
		p.z, p.last = z, last
	})
	var z float64
	for _, p := range parts {
		z += p.z
	}
	if !truncate {
		// No truncation: one draw over all ids in id order, whole chunks
		// skipped by their sums.
		u := s.rng.Float64() * z
		last := best
		for c, p := range parts {
			if p.last < 0 {
				continue
			}
			last = p.last
			if u >= p.z {
				u -= p.z
				continue
			}
			lo := c * chunkIDs
			for id, x := range e[lo:min(lo+chunkIDs, n)] {
				if x == 0 {
					continue
				}
				if u -= x; u < 0 {
					return lo + id, nil
				}
			}
		}
		return last, nil // rounding left u >= 0: the last possible id
	}

	// Truncation keeps a prefix of the ids sorted by probability. Collect a
	// subset above a threshold that provably contains that prefix (all ids
	// outside are less likely than all inside), lowering the threshold until
	// it does, then sort only the subset. Pass 2 collected the first subset.
	for first := true; ; first = false {
		var mass float64
		s.order = s.order[:0]
		if first {
			for _, p := range parts {
				s.order = append(s.order, p.cands...)
			}
			for _, c := range s.order {
				mass += c.p
			}
		} else {
			for id, x := range e {
				if x >= t && x > 0 {
					s.order = append(s.order, cand{id, x})
					mass += x
				}
			}
		}
		if s.enough(k, n, len(s.order), topP, mass, z) || t == 0 {
			break
		}
		if t *= 1e-4; t < 1e-300 {
			t = 0
		}
	}
	return s.draw(s.order, k, n, topP, z, best), nil
}

// cuts returns Sample's top-k bound for n ids (n: no top-k), whether
// top-p is on, and whether the distribution is truncated at all.
func (s *Sampler) cuts(n int) (k int, topP, truncate bool) {
	k = n
	if s.p.TopK > 0 && s.p.TopK < n {
		k = s.p.TopK
	}
	topP = s.p.TopP > 0 && s.p.TopP < 1
	return k, topP, k < n || topP || s.p.MinP > 0
}

// enough reports whether count candidates of e mass (every id above a
// threshold, of n ids whose e sum to z) hold the whole kept set: neither
// the top-k set (k < n) nor the nucleus reaches below them. Min-p needs
// no check: no threshold is below MinP.
func (s *Sampler) enough(k, n, count int, topP bool, mass, z float64) bool {
	return !(k < n && count < k) && !(topP && k == n && mass < s.p.TopP*z)
}

// draw finishes a truncated Sample over c, the candidates above the last
// threshold (every id of the kept prefix among them), with k the top-k
// bound (n: none), z the sum of every id's e and best the argmax: it
// selects the kept ids and makes the one random draw. c is reordered.
func (s *Sampler) draw(c []cand, k, n int, topP bool, z float64, best int) int {
	// The kept ids are a prefix of the candidates ranked by probability
	// (ties: lower id first): the top k, then those with p >= MinP, then
	// the fewest whose mass reaches TopP of the top-k mass. Selection finds
	// each cut in linear time, so a flat distribution (a nucleus of 100k
	// ids) costs no sort.
	if len(c) > k {
		selectTop(c, k)
		c = c[:k]
	}
	zk := z // normaliser of the top-k distribution
	if k < n {
		zk = 0
		for _, x := range c {
			zk += x.p
		}
	}
	if s.p.MinP > 0 { // p/pmax = e since e(best) = 1
		m := 0
		for _, x := range c {
			if x.p >= s.p.MinP {
				c[m] = x
				m++
			}
		}
		c = c[:m]
	}
	if topP {
		c = c[:selectMass(c, s.p.TopP*zk)]
	}
	if len(c) == 0 { // cannot happen: the best id has e = 1 >= t and >= MinP
		return best
	}
	if len(c) <= sortedDraw {
		sortRanked(c)
	}
	var total float64
	for _, x := range c {
		total += x.p
	}
	u := s.rng.Float64() * total
	for _, x := range c {
		if u -= x.p; u < 0 {
			return x.id
		}
	}
	return c[len(c)-1].id
}

// sortedDraw: a kept set this small is drawn from in rank order (larger
// ones in the order selection left them; the distribution is the same).
const sortedDraw = 1024

// ranked reports whether a ranks before b: more probable, or as probable
// with a lower id.
func ranked(a, b cand) bool { return a.p > b.p || a.p == b.p && a.id < b.id }

func sortRanked(c []cand) {
	slices.SortFunc(c, func(a, b cand) int {
		if ranked(a, b) {
			return -1
		}
		return 1 // ids are distinct: never equal
	})
}

// partition reorders c around a pivot (median of three by position) and
// returns its index m: c[:m] rank before the pivot, c[m+1:] after it.
func partition(c []cand) int {
	hi := len(c) - 1
	mid := hi / 2
	if ranked(c[mid], c[0]) {
		c[mid], c[0] = c[0], c[mid]
	}
	if ranked(c[hi], c[0]) {
		c[hi], c[0] = c[0], c[hi]
	}
	if ranked(c[hi], c[mid]) {
		c[hi], c[mid] = c[mid], c[hi]
	}
	c[mid], c[hi] = c[hi], c[mid] // the median as the pivot, at the end
	pv := c[hi]
	m := 0
	for i := range hi {
		if ranked(c[i], pv) {
			c[i], c[m] = c[m], c[i]
			m++
		}
	}
	c[m], c[hi] = c[hi], c[m]
	return m
}

// depthLimit bounds selection's partition rounds before it falls back to a
// sort (a pathological order cannot make it quadratic).
func depthLimit(n int) int { return 2*bits.Len(uint(n)) + 8 }

// selectTop reorders c so that c[:k] are its k highest-ranked entries
// (0 < k < len(c); in no particular order).
func selectTop(c []cand, k int) {
	lo, hi := 0, len(c)
	for depth := depthLimit(len(c)); hi-lo > 16 && depth > 0; depth-- {
		m := lo + partition(c[lo:hi])
		switch {
		case k <= m:
			hi = m
		case k == m+1:
			return
		default:
			lo = m + 1
		}
	}
	sortRanked(c[lo:hi])
}

// selectMass reorders c so that c[:m] are its m highest-ranked entries and
// returns m, the fewest whose p sum to at least target (len(c) if all of
// them fall short).
func selectMass(c []cand, target float64) int {
	lo, hi := 0, len(c)
	var before float64 // the mass of c[:lo], all ranked before c[lo:hi]
	for depth := depthLimit(len(c)); hi-lo > 16 && depth > 0; depth-- {
		m := lo + partition(c[lo:hi])
		var mass float64 // c[lo:m]
		for _, x := range c[lo:m] {
			mass += x.p
		}
		switch {
		case before+mass >= target:
			hi = m
		case before+mass+c[m].p >= target:
			return m + 1
		default:
			before += mass + c[m].p
			lo = m + 1
		}
	}
	sortRanked(c[lo:hi])
	for i, x := range c[lo:hi] {
		if before += x.p; before >= target {
			return lo + i + 1
		}
	}
	return hi
}

// chunkIDs is how many ids one goroutine scans at a time. It is fixed, not
// derived from the core count, so that the sums are associated, and the
// draws made, the same way on every machine.
const chunkIDs = 8192

// part is one chunk's share of a Sample call.
type part struct {
	best  int     // argmax in the chunk (-1: every id masked)
	bestV float32 // its (penalised) logit
	bad   bool    // a NaN or +Inf in the chunk
	z     float64 // sum of the chunk's e, in id order
	last  int     // last id with e > 0 (-1: none)
	cands []cand  // ids with e >= the first threshold, in id order
}

// chunks returns the sampler's per-chunk state for n ids.
func (s *Sampler) chunks(n int) []part {
	c := (n + chunkIDs - 1) / chunkIDs
	if cap(s.parts) < c {
		s.parts = append(s.parts[:cap(s.parts)], make([]part, c-cap(s.parts))...)
	}
	s.parts = s.parts[:c]
	return s.parts
}

// forChunks calls f for every chunk [lo, hi) of n ids, on up to GOMAXPROCS
// goroutines when there are several chunks. f must touch only its chunk's
// state.
func (s *Sampler) forChunks(n int, f func(c, lo, hi int)) {
	chunks := (n + chunkIDs - 1) / chunkIDs
	run := func(c int) { f(c, c*chunkIDs, min(n, (c+1)*chunkIDs)) }
	workers := min(runtime.GOMAXPROCS(0), chunks)
	if workers <= 1 {
		for c := range chunks {
			run(c)
		}
		return
	}
	var next atomic.Int32
	var wg sync.WaitGroup
	loop := func() {
		for c := int(next.Add(1)) - 1; c < chunks; c = int(next.Add(1)) - 1 {
			run(c)
		}
	}
	wg.Add(workers - 1)
	for range workers - 1 {
		go func() {
			defer wg.Done()
			loop()
		}()
	}
	loop()
	wg.Wait()
}
