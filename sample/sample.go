// Package sample picks the next token from a logits vector: greedy or
// random sampling with temperature, top-k, top-p (nucleus), min-p and a
// repetition penalty, driven by a seeded per-sampler random generator so that
// runs are reproducible.
package sample

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
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
// sampler's generator; greedy decoding consumes none.
func (s *Sampler) Sample(logits []float32, history []int) (int, error) {
	if len(logits) == 0 {
		return 0, ErrEmpty
	}
	for _, v := range logits {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 1) {
			return 0, ErrNaN
		}
	}
	// Work on a copy with the repetition penalty applied to the few ids seen.
	s.work = append(s.work[:0], logits...)
	if pen := s.p.RepetitionPenalty; pen > 0 && pen != 1 {
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
	}
	work := s.work

	best := -1
	bestV := float32(math.Inf(-1))
	for id, v := range work {
		if v > bestV {
			best, bestV = id, v
		}
	}
	if best < 0 {
		return 0, ErrAllMasked
	}
	invT := 1 / s.p.Temperature
	if s.p.Temperature == 0 || math.IsInf(invT, 1) {
		return best, nil // greedy (a subnormal temperature is greedy too)
	}

	// e[id] = exp((l - lmax)/T): unnormalised probabilities, 1 for the best.
	n := len(work)
	maxL := float64(bestV)
	if cap(s.e) < n {
		s.e = make([]float64, n)
	}
	e := s.e[:n]
	var z float64
	for id, v := range work {
		x := math.Exp((float64(v) - maxL) * invT)
		e[id] = x
		z += x
	}
	k := n
	if s.p.TopK > 0 && s.p.TopK < n {
		k = s.p.TopK
	}
	topP := s.p.TopP > 0 && s.p.TopP < 1
	if k == n && !topP && s.p.MinP == 0 {
		// No truncation: one draw over all ids in id order.
		u := s.rng.Float64() * z
		last := best
		for id, x := range e {
			if x == 0 {
				continue
			}
			last = id
			if u -= x; u < 0 {
				return id, nil
			}
		}
		return last, nil
	}

	// Truncation keeps a prefix of the ids sorted by probability. Collect a
	// subset above a threshold that provably contains that prefix (all ids
	// outside are less likely than all inside), lowering the threshold until
	// it does, then sort only the subset.
	t := 1e-4
	if s.p.MinP > 0 {
		t = s.p.MinP // min-p never keeps an id with e < MinP
	}
	for {
		s.order = s.order[:0]
		var mass float64
		for id, x := range e {
			if x >= t && x > 0 {
				s.order = append(s.order, cand{id, x})
				mass += x
			}
		}
		enough := true
		if k < n && len(s.order) < k {
			enough = false // the top-k set (and its mass) reaches below t
		}
		if topP && k == n && mass < s.p.TopP*z {
			enough = false // the nucleus reaches below t
		}
		if enough || t == 0 {
			break
		}
		if t *= 1e-4; t < 1e-300 {
			t = 0
		}
	}
	slices.SortFunc(s.order, func(a, b cand) int {
		if a.p != b.p {
			if a.p > b.p {
				return -1
			}
			return 1
		}
		return a.id - b.id
	})
	if len(s.order) > k {
		s.order = s.order[:k]
	}
	zk := z // normaliser of the top-k distribution
	if k < n {
		zk = 0
		for _, c := range s.order {
			zk += c.p
		}
	}
	kept := 0
	var cum, total float64
	for _, c := range s.order {
		if s.p.MinP > 0 && c.p < s.p.MinP { // p/pmax = e since e(best) = 1
			break
		}
		kept++
		total += c.p
		cum += c.p / zk
		if topP && cum >= s.p.TopP {
			break
		}
	}
	if kept == 0 { // cannot happen: the best id has e = 1 >= t and >= MinP
		return best, nil
	}
	u := s.rng.Float64() * total
	for _, c := range s.order[:kept] {
		if u -= c.p; u < 0 {
			return c.id, nil
		}
	}
	return s.order[kept-1].id, nil
}
