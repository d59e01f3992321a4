// Package sim replays route traces through residency policies (package
// experts) and through Bélády's offline rule, counting per layer how many routed
// slots hit resident experts (algorithms.md §2).
//
// Model of a replay: each layer holds at most capacity experts. Records are
// processed in file order; each record is one step of its layer (the layer's
// clock t counts its records). For a record, every selected expert is first
// reported to the policy (Use), then each is a hit if resident, otherwise a miss:
// it is installed into a free slot, or in place of a victim the policy picks
// among resident experts not selected by this record, or bypasses the cache
// (served once, not kept). Misses are never dropped.
package sim

import (
	"fmt"
	"math"
	"slices"

	"moxie/experts"
	"moxie/experts/trace"
)

// Counts are the outcomes of routed slots.
type Counts struct {
	Hits, Misses int64
	Bypassed     int64 // misses served without being installed
}

// Slots is the number of routed slots counted.
func (c Counts) Slots() int64 { return c.Hits + c.Misses }

// HitRate is hits per routed slot (0 when there are none).
func (c Counts) HitRate() float64 {
	if c.Slots() == 0 {
		return 0
	}
	return float64(c.Hits) / float64(c.Slots())
}

func (c *Counts) add(o Counts) {
	c.Hits += o.Hits
	c.Misses += o.Misses
	c.Bypassed += o.Bypassed
}

// Result is one policy's replay of a trace.
type Result struct {
	Policy   string
	Capacity int
	Layers   []Counts // indexed by layer
	Total    Counts
	// Tokens is the number of steps of the busiest layer (tokens in the trace).
	Tokens int64
}

// Replay runs the trace through a policy made by pf for every layer, each with
// room for capacity experts (capacity >= 0).
func Replay(tr *trace.Trace, capacity int, pf experts.PolicyFunc, name string) (*Result, error) {
	if capacity < 0 {
		return nil, fmt.Errorf("capacity %d, want >= 0", capacity)
	}
	h := tr.Header
	pols := make([]experts.Policy, h.Layers)
	for l := range pols {
		pols[l] = pf(l, h.Experts, capacity)
	}
	return replay(tr, capacity, func(l int) experts.Policy { return pols[l] }, name)
}

// Belady replays the trace with the offline rule: on a miss with no free slot,
// the victim is the candidate whose next use is furthest in the future, and the
// missing expert bypasses the cache instead when its own next use is at least
// as far (never-used-again counts as infinitely far).
func Belady(tr *trace.Trace, capacity int) (*Result, error) {
	if capacity < 0 {
		return nil, fmt.Errorf("capacity %d, want >= 0", capacity)
	}
	h := tr.Header
	// uses[l][e] = the steps of layer l that select e, ascending.
	uses := make([][][]int64, h.Layers)
	steps := make([]int64, h.Layers)
	for l := range uses {
		uses[l] = make([][]int64, h.Experts)
	}
	for _, r := range tr.Records {
		for _, e := range r.Experts {
			uses[r.Layer][e] = append(uses[r.Layer][e], steps[r.Layer])
		}
		steps[r.Layer]++
	}
	pols := make([]experts.Policy, h.Layers)
	for l := range pols {
		pols[l] = &belady{uses: uses[l]}
	}
	return replay(tr, capacity, func(l int) experts.Policy { return pols[l] }, "belady")
}

type belady struct{ uses [][]int64 }

func (b *belady) Use(int, int64) {}

// next is the first step after t that uses e, or MaxInt64.
func (b *belady) next(e int, t int64) int64 {
	u := b.uses[e]
	i, found := slices.BinarySearch(u, t)
	if found {
		i++
	}
	if i < len(u) {
		return u[i]
	}
	return math.MaxInt64
}

func (b *belady) Admit(e int, t int64, free bool, candidates []int) (int, bool) {
	if free {
		return -1, true
	}
	v, vn := candidates[0], b.next(candidates[0], t)
	for _, c := range candidates[1:] {
		if n := b.next(c, t); n > vn || (n == vn && c < v) {
			v, vn = c, n
		}
	}
	return v, b.next(e, t) < vn
}

func replay(tr *trace.Trace, capacity int, pol func(l int) experts.Policy, name string) (*Result, error) {
	h := tr.Header
	res := &Result{Policy: name, Capacity: capacity, Layers: make([]Counts, h.Layers)}
	resident := make([][]bool, h.Layers)
	count := make([]int, h.Layers)
	steps := make([]int64, h.Layers)
	for l := range resident {
		resident[l] = make([]bool, h.Experts)
	}
	var cands []int
	for i, r := range tr.Records {
		l := r.Layer
		if l < 0 || l >= h.Layers {
			return nil, fmt.Errorf("record %d: layer %d out of range 0..%d", i, l, h.Layers-1)
		}
		for _, e := range r.Experts {
			if e < 0 || e >= h.Experts {
				return nil, fmt.Errorf("record %d: expert %d out of range 0..%d", i, e, h.Experts-1)
			}
		}
		t := steps[l]
		steps[l]++
		p := pol(l)
		for _, e := range r.Experts {
			p.Use(e, t)
		}
		c := &res.Layers[l]
		for _, e := range r.Experts {
			if resident[l][e] {
				c.Hits++
				continue
			}
			c.Misses++
			free := count[l] < capacity
			cands = cands[:0]
			if !free {
				for x, in := range resident[l] {
					if in && !slices.Contains(r.Experts, x) {
						cands = append(cands, x)
					}
				}
			}
			if capacity == 0 || (!free && len(cands) == 0) {
				c.Bypassed++
				continue
			}
			victim, install := p.Admit(e, t, free, cands)
			if !install {
				c.Bypassed++
				continue
			}
			if !free {
				if !slices.Contains(cands, victim) {
					return nil, fmt.Errorf("policy %s evicted expert %d of layer %d, which is not a candidate %v", name, victim, l, cands)
				}
				resident[l][victim] = false
				count[l]--
			}
			resident[l][e] = true
			count[l]++
		}
	}
	for l := range res.Layers {
		res.Total.add(res.Layers[l])
		res.Tokens = max(res.Tokens, steps[l])
	}
	return res, nil
}

// Frequencies counts, per layer, how often each expert is selected in the
// trace: the input of a static hot set (experts.StaticFunc).
func Frequencies(tr *trace.Trace) *experts.Frequencies {
	f := experts.NewFrequencies()
	for _, r := range tr.Records {
		for _, e := range r.Experts {
			f.Add(r.Layer, e, 1)
		}
	}
	return f
}

// Estimate is a bandwidth-only decode speed estimate.
type Estimate struct {
	SecondsPerToken float64
	TokensPerSecond float64
	SlowBytesPerTok float64 // expert bytes read from the slow tier per token
}

// EstimateSpeed turns a replay into tokens per second assuming each token
// reads its dense bytes and hit experts at fast bytes/s and its missed experts
// at slow bytes/s, with no overlap and no compute time (an upper bound on a
// bandwidth-bound machine). It needs the header's byte counts.
func EstimateSpeed(h trace.Header, r *Result, fast, slow float64) (Estimate, error) {
	if h.ExpertBytes <= 0 {
		return Estimate{}, fmt.Errorf("trace header has no expert size (expert bytes 0)")
	}
	if fast <= 0 || slow <= 0 {
		return Estimate{}, fmt.Errorf("bandwidths must be positive (fast %g, slow %g bytes/s)", fast, slow)
	}
	if r.Tokens == 0 {
		return Estimate{}, fmt.Errorf("the trace has no records")
	}
	n := float64(r.Tokens)
	eb := float64(h.ExpertBytes)
	hit := float64(r.Total.Hits) * eb / n
	miss := float64(r.Total.Misses) * eb / n
	s := (float64(h.DenseBytesPerToken)+hit)/fast + miss/slow
	return Estimate{SecondsPerToken: s, TokensPerSecond: 1 / s, SlowBytesPerTok: miss}, nil
}
