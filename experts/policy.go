package experts

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
)

// Policy decides which experts of one layer stay resident. Time t counts the
// layer's steps: one per token when a trace is replayed (experts/sim), one per
// forward pass through the layer in the Store. t never decreases. A Policy is
// used by one goroutine at a time.
type Policy interface {
	// Use records that expert e is used at step t, resident or not. It is
	// called once per expert and step, before Admit for that expert.
	Use(e int, t int64)
	// Admit is called when expert e missed at step t. If free is true a slot is
	// free and the policy only says whether to install e there. Otherwise
	// candidates (never empty) are the resident experts that may be evicted
	// (the current step's other experts are protected), and the policy returns
	// one of them as the victim and whether to install e in its place; install
	// false serves e from a transient buffer without keeping it (bypass).
	Admit(e int, t int64, free bool, candidates []int) (victim int, install bool)
}

// PolicyFunc makes the policy of one layer that has experts experts and room
// for capacity of them.
type PolicyFunc func(layer, experts, capacity int) Policy

// PolicyHelp documents the policy specs ParsePolicy accepts.
const PolicyHelp = `lru                         least recently used (default)
decay[:h=64,ratio=1.25,margin=4]
                            evict the smallest decayed use count (half-life h
                            steps); when full, install a miss only if its count
                            > ratio*count(victim) + margin, else bypass
static:FILE                 hot set: per layer the top experts by the values in
                            FILE (moxie expert frequencies v1) stay resident
                            forever; other experts use the free slots by LRU`

// ParsePolicy reads a policy spec (see PolicyHelp). The returned name is the
// canonical spec, for reports.
func ParsePolicy(spec string) (PolicyFunc, string, error) {
	kind, args, _ := strings.Cut(spec, ":")
	switch kind {
	case "", "lru":
		if args != "" {
			return nil, "", fmt.Errorf("policy %q: lru takes no parameters", spec)
		}
		return func(_, experts, _ int) Policy { return NewLRU(experts) }, "lru", nil
	case "decay":
		d := DecayParams{HalfLife: 64, Ratio: 1.25, Margin: 4}
		if args != "" {
			for kv := range strings.SplitSeq(args, ",") {
				k, v, ok := strings.Cut(kv, "=")
				f, err := strconv.ParseFloat(v, 64)
				if !ok || err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
					return nil, "", fmt.Errorf("policy %q: %q is not key=non-negative number", spec, kv)
				}
				switch k {
				case "h":
					if f <= 0 {
						return nil, "", fmt.Errorf("policy %q: half-life h must be > 0", spec)
					}
					d.HalfLife = f
				case "ratio":
					d.Ratio = f
				case "margin":
					d.Margin = f
				default:
					return nil, "", fmt.Errorf("policy %q: unknown parameter %q (want h, ratio, margin)", spec, k)
				}
			}
		}
		name := fmt.Sprintf("decay:h=%g,ratio=%g,margin=%g", d.HalfLife, d.Ratio, d.Margin)
		return func(_, experts, _ int) Policy { return NewDecay(experts, d) }, name, nil
	case "static":
		if args == "" {
			return nil, "", fmt.Errorf("policy %q: static needs a frequency file (static:FILE)", spec)
		}
		data, err := os.ReadFile(args)
		if err != nil {
			return nil, "", fmt.Errorf("policy %q: %w", spec, err)
		}
		fr, err := ParseFrequencies(data)
		if err != nil {
			return nil, "", fmt.Errorf("policy %q: %s: %w", spec, args, err)
		}
		return StaticFunc(fr), "static:" + args, nil
	}
	return nil, "", fmt.Errorf("unknown policy %q (want lru, decay[:h=..,ratio=..,margin=..] or static:FILE)", spec)
}

// LRU evicts the least recently used candidate and always installs.
type LRU struct {
	last []int64 // per expert: sequence number of its last use, -1 never
	seq  int64
}

// NewLRU makes an LRU policy for a layer of n experts.
func NewLRU(n int) *LRU {
	l := &LRU{last: make([]int64, n)}
	for i := range l.last {
		l.last[i] = -1
	}
	return l
}

// Use marks e most recently used (uses within a step are ordered by call order).
func (l *LRU) Use(e int, _ int64) { l.seq++; l.last[e] = l.seq }

// Admit installs e, evicting the candidate used longest ago.
func (l *LRU) Admit(_ int, _ int64, free bool, candidates []int) (int, bool) {
	if free {
		return -1, true
	}
	return l.oldest(candidates), true
}

func (l *LRU) oldest(candidates []int) int {
	v := candidates[0]
	for _, c := range candidates[1:] {
		if l.last[c] < l.last[v] {
			v = c
		}
	}
	return v
}

// DecayParams configure the decayed-count policy (algorithms.md §2.2).
type DecayParams struct {
	HalfLife float64 // steps for a use to lose half its weight (> 0)
	Ratio    float64 // hysteresis: install only if count > Ratio·count(victim) + Margin
	Margin   float64
}

// Decay keeps per expert the decayed use count c(t) = Σ 2^(−(t−tᵢ)/H) over its
// uses tᵢ, stored as log2 c + t/H so that comparisons need no rescaling. It
// evicts the candidate with the smallest count (ties: least recently used) and,
// when no slot is free, installs a miss only if its count exceeds
// Ratio·count(victim) + Margin; otherwise the miss bypasses the cache.
type Decay struct {
	p   DecayParams
	lg  []float64 // log2 c + t/H; -Inf before the first use
	lru *LRU
}

// NewDecay makes a decayed-count policy for a layer of n experts.
func NewDecay(n int, p DecayParams) *Decay {
	d := &Decay{p: p, lg: make([]float64, n), lru: NewLRU(n)}
	for i := range d.lg {
		d.lg[i] = math.Inf(-1)
	}
	return d
}

// Use adds one to e's decayed count at step t.
func (d *Decay) Use(e int, t int64) {
	tau := float64(t) / d.p.HalfLife
	// log2(2^(lg−τ) + 1) + τ, the log of (old count decayed to t) + 1.
	d.lg[e] = math.Log2(math.Exp2(d.lg[e]-tau)+1) + tau
	d.lru.Use(e, t)
}

// Count is e's decayed use count at step t.
func (d *Decay) Count(e int, t int64) float64 {
	return math.Exp2(d.lg[e] - float64(t)/d.p.HalfLife)
}

// Admit picks the smallest-count candidate and applies the hysteresis rule.
func (d *Decay) Admit(e int, t int64, free bool, candidates []int) (int, bool) {
	if free {
		return -1, true
	}
	v := candidates[0]
	for _, c := range candidates[1:] {
		if d.lg[c] < d.lg[v] || (d.lg[c] == d.lg[v] && d.lru.last[c] < d.lru.last[v]) {
			v = c
		}
	}
	return v, d.Count(e, t) > d.p.Ratio*d.Count(v, t)+d.p.Margin
}

// Static keeps a fixed hot set resident: hot experts are installed when they
// first miss and never evicted. Other experts may use slots the hot set leaves
// free, evicted by LRU, and bypass when only hot experts could be evicted.
type Static struct {
	hot []bool
	lru *LRU
}

// NewStatic makes a static policy for n experts with the given hot set.
func NewStatic(n int, hot []int) *Static {
	s := &Static{hot: make([]bool, n), lru: NewLRU(n)}
	for _, e := range hot {
		if e >= 0 && e < n {
			s.hot[e] = true
		}
	}
	return s
}

// StaticFunc makes static policies whose hot set per layer is the top
// capacity experts of that layer by fr (ties: lower expert index).
func StaticFunc(fr *Frequencies) PolicyFunc {
	return func(layer, experts, capacity int) Policy {
		return NewStatic(experts, fr.Top(layer, capacity, experts))
	}
}

// Use records e for the LRU order of the non-hot experts.
func (s *Static) Use(e int, t int64) { s.lru.Use(e, t) }

// Admit installs into a free slot, and otherwise evicts the least recently
// used non-hot candidate; with only hot candidates it bypasses.
func (s *Static) Admit(e int, t int64, free bool, candidates []int) (int, bool) {
	if free {
		return -1, true
	}
	var cold []int
	for _, c := range candidates {
		if !s.hot[c] {
			cold = append(cold, c)
		}
	}
	if len(cold) == 0 {
		return candidates[0], false
	}
	return s.lru.oldest(cold), true
}
