package sim

import (
	"math"
	"strings"
	"testing"

	"moxie/experts"
	"moxie/experts/trace"
)

// build makes a trace with topk len(steps[0][i]) from per-step expert sets of
// the given layers: steps[i] = (layer, experts).
func build(t *testing.T, layers, nexp, k int, steps ...step) *trace.Trace {
	t.Helper()
	tr := &trace.Trace{Header: trace.Header{Name: "hand", Layers: layers, Experts: nexp, TopK: k, ExpertBytes: 1000, DenseBytesPerToken: 500}}
	for i, s := range steps {
		if len(s.e) != k {
			t.Fatalf("step %d has %d experts, want %d", i, len(s.e), k)
		}
		tr.Records = append(tr.Records, trace.Record{Pos: i, Layer: s.l, Experts: s.e, Weights: make([]float32, k)})
	}
	return tr
}

type step struct {
	l int
	e []int
}

func s0(e ...int) step { return step{0, e} }

func lru(t *testing.T) experts.PolicyFunc {
	f, _, err := experts.ParsePolicy("lru")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestHandBuiltTraces(t *testing.T) {
	const A, B, C = 0, 1, 2
	for _, tc := range []struct {
		name     string
		tr       func(t *testing.T) *trace.Trace
		capacity int
		policy   string // "" = belady
		want     Counts
	}{
		// Cyclic A B C A B C with room for 2. LRU always evicts exactly the expert
		// needed next: every access misses (the classic LRU thrash), 0/6.
		{"cycle3 lru", func(t *testing.T) *trace.Trace {
			return build(t, 1, 3, 1, s0(A), s0(B), s0(C), s0(A), s0(B), s0(C))
		}, 2, "lru", Counts{Hits: 0, Misses: 6}},
		// Bélády: A and B fill the slots (2 misses). At step 2 C's next use (5) is
		// later than A's (3) and B's (4), so C bypasses; A and B then hit; at
		// step 5 C misses again and, never used again, bypasses: 2 hits, 4 misses,
		// 2 of them bypassed.
		{"cycle3 belady", func(t *testing.T) *trace.Trace {
			return build(t, 1, 3, 1, s0(A), s0(B), s0(C), s0(A), s0(B), s0(C))
		}, 2, "", Counts{Hits: 2, Misses: 4, Bypassed: 2}},
		// Top-2 steps {0,1} {2,3} {0,1} {2,3}, room for 3. LRU: step 0 misses 0,1
		// (free). Step 1: 2 takes the last free slot; 3 must evict one of {0,1}
		// (2 is protected): 0 is older -> {1,2,3}. Step 2: 0 misses, evicts the
		// LRU of {2,3} = 2 -> {1,3,0}; 1 hits. Step 3: 2 misses, evicts the LRU
		// of {0,1}: both were used in step 2, 0 first -> {1,3,2}; 3 hits.
		// Hits 2, misses 6.
		{"pairs lru", func(t *testing.T) *trace.Trace {
			return build(t, 1, 4, 2, s0(0, 1), s0(2, 3), s0(0, 1), s0(2, 3))
		}, 3, "lru", Counts{Hits: 2, Misses: 6}},
		// Bélády on the same trace: step 1 installs 2 (free); for 3 the
		// candidates 0 and 1 are next used at step 2, 3 at step 3, so 3 bypasses.
		// Step 2: 0 and 1 hit. Step 3: 2 hits, 3 misses again (bypass: nothing is
		// used later). Hits 3, misses 5, 2 bypassed.
		{"pairs belady", func(t *testing.T) *trace.Trace {
			return build(t, 1, 4, 2, s0(0, 1), s0(2, 3), s0(0, 1), s0(2, 3))
		}, 3, "", Counts{Hits: 3, Misses: 5, Bypassed: 2}},
		// Decay with an effectively infinite half-life (plain counts), ratio 1,
		// margin 0.5, one slot: A A A B B B B. A is installed and hits twice
		// (count 3). B's count must exceed 3.5 to replace A: at B's 1st..3rd use
		// (counts 1..3) it bypasses; at the 4th (count 4) it is installed.
		// Misses: A once, B four times (3 bypassed); hits 2.
		{"decay hysteresis", func(t *testing.T) *trace.Trace {
			return build(t, 1, 2, 1, s0(A), s0(A), s0(A), s0(B), s0(B), s0(B), s0(B))
		}, 1, "decay:h=1e12,ratio=1,margin=0.5", Counts{Hits: 2, Misses: 5, Bypassed: 3}},
		// LRU on the same trace replaces A at B's first use: misses A, B; 5 hits.
		{"decay trace under lru", func(t *testing.T) *trace.Trace {
			return build(t, 1, 2, 1, s0(A), s0(A), s0(A), s0(B), s0(B), s0(B), s0(B))
		}, 1, "lru", Counts{Hits: 5, Misses: 2}},
		// No room: every slot misses and bypasses.
		{"capacity 0", func(t *testing.T) *trace.Trace {
			return build(t, 1, 2, 1, s0(A), s0(A), s0(B))
		}, 0, "lru", Counts{Hits: 0, Misses: 3, Bypassed: 3}},
		// Layers are independent: layer 1 alternates A/B with one slot (all
		// miss), layer 0 repeats A (one miss then hits). Interleaving must not
		// let layer 1's misses evict layer 0's A: hits 3, misses 1 + 4.
		{"layers independent", func(t *testing.T) *trace.Trace {
			return build(t, 2, 2, 1, s0(A), step{1, []int{A}}, s0(A), step{1, []int{B}}, s0(A), step{1, []int{A}}, s0(A), step{1, []int{B}})
		}, 1, "lru", Counts{Hits: 3, Misses: 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := tc.tr(t)
			var res *Result
			var err error
			if tc.policy == "" {
				res, err = Belady(tr, tc.capacity)
			} else {
				pf, name, perr := experts.ParsePolicy(tc.policy)
				if perr != nil {
					t.Fatal(perr)
				}
				res, err = Replay(tr, tc.capacity, pf, name)
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Total != tc.want {
				t.Fatalf("got %+v, want %+v", res.Total, tc.want)
			}
			var sum Counts
			for _, c := range res.Layers {
				sum.add(c)
			}
			if sum != res.Total {
				t.Fatalf("layers sum to %+v, total %+v", sum, res.Total)
			}
		})
	}
}

// TestStaticHotSet: layer 0's hot set is {B} (from frequencies), one slot.
// Trace B A B A B: B installs and stays; A can only evict B, which is hot, so
// A always bypasses. Hits: B at steps 2 and 4; misses B once, A twice.
func TestStaticHotSet(t *testing.T) {
	fr := experts.NewFrequencies()
	fr.Set(0, 1, 10)
	fr.Set(0, 0, 3)
	tr := build(t, 1, 2, 1, s0(1), s0(0), s0(1), s0(0), s0(1))
	res, err := Replay(tr, 1, experts.StaticFunc(fr), "static")
	if err != nil {
		t.Fatal(err)
	}
	if want := (Counts{Hits: 2, Misses: 3, Bypassed: 2}); res.Total != want {
		t.Fatalf("got %+v, want %+v", res.Total, want)
	}
}

// TestBeladyBoundsPolicies: on a pseudo-random skewed trace the offline rule
// never does worse than LRU or decay at any capacity, and more room never
// lowers LRU's hits (LRU is a stack algorithm: its hits are monotone in capacity).
func TestBeladyBoundsPolicies(t *testing.T) {
	var steps []step
	x := uint32(12345)
	for range 600 {
		var e []int
		for len(e) < 3 {
			x = x*1664525 + 1013904223
			v := int((x >> 8) % 1000)
			id := int(math.Sqrt(float64(v))) % 32 // skewed toward high ids; any skew will do
			dup := false
			for _, f := range e {
				dup = dup || f == id
			}
			if !dup {
				e = append(e, id)
			}
		}
		steps = append(steps, step{len(steps) % 2, e})
	}
	tr := build(t, 2, 32, 3, steps...)
	decay, name, _ := experts.ParsePolicy("decay:h=32,ratio=1.25,margin=1")
	prevLRU := int64(-1)
	for c := 0; c <= 32; c += 4 {
		b, _ := Belady(tr, c)
		l, _ := Replay(tr, c, lru(t), "lru")
		d, _ := Replay(tr, c, decay, name)
		if b.Total.Hits < l.Total.Hits || b.Total.Hits < d.Total.Hits {
			t.Fatalf("capacity %d: belady %d hits < lru %d or decay %d", c, b.Total.Hits, l.Total.Hits, d.Total.Hits)
		}
		if l.Total.Hits < prevLRU {
			t.Fatalf("capacity %d: LRU hits %d fell below %d at smaller capacity", c, l.Total.Hits, prevLRU)
		}
		prevLRU = l.Total.Hits
		if c == 32 && b.Total.Misses != l.Total.Misses {
			t.Fatalf("all resident: belady %d and lru %d misses differ (only cold misses remain)", b.Total.Misses, l.Total.Misses)
		}
	}
}

func TestEstimateSpeed(t *testing.T) {
	tr := build(t, 1, 3, 1, s0(0), s0(0), s0(1), s0(0))
	res, _ := Replay(tr, 1, lru(t), "lru") // misses: 0, 1, 0 -> 3 misses, 1 hit
	if res.Total != (Counts{Hits: 1, Misses: 3}) {
		t.Fatalf("counts %+v", res.Total)
	}
	// Per token: dense 500 B + 0.25·1000 B hit at 1000 B/s, 0.75·1000 B missed at 100 B/s:
	// 0.75 s + 7.5 s = 8.25 s/token.
	e, err := EstimateSpeed(tr.Header, res, 1000, 100)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(e.SecondsPerToken-8.25) > 1e-12 || math.Abs(e.SlowBytesPerTok-750) > 1e-9 {
		t.Fatalf("estimate %+v, want 8.25 s/token and 750 slow bytes/token", e)
	}
	h := tr.Header
	h.ExpertBytes = 0
	if _, err := EstimateSpeed(h, res, 1, 1); err == nil || !strings.Contains(err.Error(), "expert size") {
		t.Fatalf("no error for a header without sizes: %v", err)
	}
}

func TestFrequenciesFromTrace(t *testing.T) {
	tr := build(t, 2, 4, 2, s0(0, 1), s0(1, 2), step{1, []int{3, 1}})
	f := Frequencies(tr)
	if f.Get(0, 1) != 2 || f.Get(0, 0) != 1 || f.Get(0, 3) != 0 || f.Get(1, 3) != 1 {
		t.Fatalf("frequencies wrong")
	}
	if top := f.Top(0, 2, 4); len(top) != 2 || top[0] != 1 || top[1] != 0 {
		t.Fatalf("Top = %v, want [1 0] (1 used twice; 0 and 2 tie, lower index first)", top)
	}
}

// TestUniformRoutingHitRate: with independent uniform top-1 routing over E
// experts, the resident set (chosen from the past) is independent of the next
// request, so any online policy with C slots hits with probability C/E once
// warm. 40,000 steps put the standard error near 0.002.
func TestUniformRoutingHitRate(t *testing.T) {
	const E, C, N = 16, 4, 40000
	x := uint64(99)
	var steps []step
	for range N {
		x = x*6364136223846793005 + 1442695040888963407
		steps = append(steps, s0(int(x>>33)%E))
	}
	tr := build(t, 1, E, 1, steps...)
	for _, spec := range []string{"lru", "decay:h=16,ratio=1.25,margin=0"} {
		pf, name, _ := experts.ParsePolicy(spec)
		r, err := Replay(tr, C, pf, name)
		if err != nil {
			t.Fatal(err)
		}
		if hr := r.Total.HitRate(); math.Abs(hr-float64(C)/E) > 0.01 {
			t.Errorf("%s: hit rate %.4f, want %.4f ± 0.01", spec, hr, float64(C)/E)
		}
	}
}
