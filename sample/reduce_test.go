package sample

import (
	"errors"
	"math"
	"testing"
)

// reduceRef reduces logits under spec the way a backend should, written
// independently of Sample in float64: the argmax (lowest id on ties), the
// NaN/+Inf flag, and with random sampling Z summed within chunkIDs-id
// chunks in id order, then over the chunks in order (Sample's own order,
// so that the draws below match Sample's exactly), and the candidates
// e >= Threshold, at most keep of them (Complete false beyond).
func reduceRef(logits []float32, spec ReduceSpec, keep int) *Reduction {
	r := &Reduction{N: len(logits), Best: -1}
	bestV := math.Inf(-1)
	for id, v := range logits {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 1) {
			r.Bad = true
		}
		if float64(v) > bestV {
			r.Best, bestV = id, float64(v)
		}
	}
	if spec.Greedy || r.Best < 0 || r.Bad {
		return r
	}
	r.Complete = true
	for lo := 0; lo < len(logits); lo += chunkIDs {
		var z float64
		for id := lo; id < min(lo+chunkIDs, len(logits)); id++ {
			x := math.Exp((float64(logits[id]) - bestV) * spec.InvT)
			z += x
			if x > 0 && x >= spec.Threshold {
				r.Count++
				r.CandMass += x
				if len(r.IDs) == keep {
					r.Complete = false
					continue
				}
				r.IDs = append(r.IDs, int32(id))
				r.E = append(r.E, x)
			}
		}
		r.Z += z
	}
	if !r.Complete {
		r.IDs, r.E = nil, nil
	}
	return r
}

func TestReduceSpec(t *testing.T) {
	for _, c := range []struct {
		name string
		p    Params
		want ReduceSpec
	}{
		{"greedy", Params{}, ReduceSpec{OK: true, Greedy: true}},
		{"subnormal temperature is greedy", Params{Temperature: 1e-320}, ReduceSpec{OK: true, Greedy: true}},
		{"temperature alone needs every logit", Params{Temperature: 0.7}, ReduceSpec{}},
		{"top-p 1 is off", Params{Temperature: 0.7, TopP: 1}, ReduceSpec{}},
		{"repetition penalty", Params{Temperature: 0.7, TopP: 0.9, RepetitionPenalty: 1.1}, ReduceSpec{}},
		{"penalty 1 is off", Params{Temperature: 0.5, TopP: 0.9, RepetitionPenalty: 1}, ReduceSpec{OK: true, InvT: 2, Threshold: 1e-4}},
		{"top-k", Params{Temperature: 0.5, TopK: 40}, ReduceSpec{OK: true, InvT: 2, Threshold: 1e-4}},
		{"min-p sets the threshold", Params{Temperature: 0.5, MinP: 0.05}, ReduceSpec{OK: true, InvT: 2, Threshold: 0.05}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := New(c.p)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.Reduce(); got != c.want {
				t.Errorf("Reduce() = %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestSampleReducedMatchesSample(t *testing.T) {
	// Over a reduction computed in Sample's own order, SampleReduced must
	// draw exactly what Sample draws from the logits, seed for seed.
	const n = 5*chunkIDs + 321
	peaked := make([]float32, n)
	flat := make([]float32, n)
	var x uint64 = 7
	for i := range peaked {
		x = x*6364136223846793005 + 1442695040888963407
		u := float32(x>>40) / float32(1<<24)
		peaked[i] = u*8 - 4
		if i%997 == 0 {
			peaked[i] += 9
		}
		flat[i] = u * 0.5
	}
	small := f32(2.0, 1.5, 0.3, -0.5, 1.0, -2.0, math.Inf(-1))
	for _, c := range []struct {
		name   string
		logits []float32
		p      Params
	}{
		{"greedy", peaked, Params{}},
		{"top-p", peaked, Params{Temperature: 0.6, TopP: 0.95}},
		{"top-k", peaked, Params{Temperature: 0.8, TopK: 40}},
		{"min-p", peaked, Params{Temperature: 0.8, MinP: 0.05}},
		{"all three", peaked, Params{Temperature: 1.2, TopK: 20, TopP: 0.9, MinP: 0.01}},
		{"flat top-p", flat, Params{Temperature: 0.6, TopP: 0.95}},
		{"small top-p", small, Params{Temperature: 1, TopP: 0.75}},
		{"small top-k past the finite ids", small, Params{Temperature: 1, TopK: 6}},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.p.Seed = 99
			a, _ := New(c.p)
			b, _ := New(c.p)
			spec := b.Reduce()
			if !spec.OK {
				t.Fatalf("Reduce() = %+v: want a reducible spec", spec)
			}
			r := reduceRef(c.logits, spec, len(c.logits))
			for i := range 200 {
				want, err := a.Sample(c.logits, nil)
				if err != nil {
					t.Fatal(err)
				}
				got, full, err := b.SampleReduced(r)
				if err != nil || full {
					t.Fatalf("draw %d: SampleReduced = %d, full %v, %v", i, got, full, err)
				}
				if got != want {
					t.Fatalf("draw %d: SampleReduced drew %d, Sample %d", i, got, want)
				}
			}
		})
	}
}

func TestSampleReducedAsksForLogits(t *testing.T) {
	// The cases where the reduction does not suffice: SampleReduced says so
	// without drawing, and Sample over the logits then draws what a fresh
	// sampler with the same seed draws.
	const n = 3 * chunkIDs
	tail := make([]float32, n) // one id at 0, the rest at -10: e = 4.5e-5 each, below 1e-4, but 6x the hot id's mass
	for i := range tail {
		tail[i] = -10
	}
	tail[17] = 0
	peaked := bigVocab(n, -12, map[int]float32{5: 3, 9000: 2.5, 20000: 2}) // 3 candidates at T=1
	small := f32(2.0, 1.5, 0.3, -0.5, 1.0, -2.0)
	for _, c := range []struct {
		name   string
		logits []float32
		p      Params
		keep   int
	}{
		{"nucleus below the threshold", tail, Params{Temperature: 1, TopP: 0.9}, n},
		{"top-k beyond the candidates", peaked, Params{Temperature: 1, TopK: 50}, n},
		{"incomplete", peaked, Params{Temperature: 40, TopP: 0.9}, 10},
		{"top-k over the whole vocabulary is no truncation", small, Params{Temperature: 1, TopK: 6}, 6},
		{"top-k and min-p beyond the candidates", peaked, Params{Temperature: 1, TopK: 50, MinP: 0.01}, n},
		{"temperature alone", peaked, Params{Temperature: 1}, n},
		{"repetition penalty", peaked, Params{Temperature: 1, TopP: 0.9, RepetitionPenalty: 1.2}, n},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.p.Seed = 3
			s, _ := New(c.p)
			ref, _ := New(c.p)
			r := reduceRef(c.logits, ReduceSpec{InvT: 1 / c.p.Temperature, Threshold: firstThreshold(c.p)}, c.keep)
			if _, full, err := s.SampleReduced(r); err != nil || !full {
				t.Fatalf("SampleReduced: full %v, %v; want full", full, err)
			}
			got, err := s.Sample(c.logits, nil)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := ref.Sample(c.logits, nil)
			if got != want {
				t.Errorf("after full: Sample drew %d, a fresh sampler %d (SampleReduced consumed a draw)", got, want)
			}
		})
	}
}

func TestSampleReducedErrors(t *testing.T) {
	s, _ := New(Params{Temperature: 1, TopP: 0.9})
	g, _ := New(Params{})
	good := func() *Reduction {
		return &Reduction{N: 10, Best: 3, Z: 1.5, IDs: []int32{3, 7}, E: []float64{1, 0.5}, Complete: true}
	}
	if id, full, err := s.SampleReduced(good()); err != nil || full || (id != 3 && id != 7) {
		t.Fatalf("a good reduction: %d, %v, %v", id, full, err)
	}
	for _, c := range []struct {
		name    string
		s       *Sampler
		edit    func(r *Reduction)
		wantErr error
	}{
		{"nan", s, func(r *Reduction) { r.Bad = true }, ErrNaN},
		{"nan, greedy", g, func(r *Reduction) { r.Bad = true }, ErrNaN},
		{"all masked", s, func(r *Reduction) { r.Best = -1 }, ErrAllMasked},
		{"empty", g, func(r *Reduction) { r.N = 0 }, ErrEmpty},
		{"argmax out of range", g, func(r *Reduction) { r.Best = 10 }, nil},
		{"lengths differ", s, func(r *Reduction) { r.E = r.E[:1] }, nil},
		{"ids not ascending", s, func(r *Reduction) { r.IDs = []int32{7, 3} }, nil},
		{"id out of range", s, func(r *Reduction) { r.IDs[1] = 10 }, nil},
		{"e above 1", s, func(r *Reduction) { r.E[1] = 1.5 }, nil},
		{"e NaN", s, func(r *Reduction) { r.E[1] = math.NaN() }, nil},
		{"sum below 1", s, func(r *Reduction) { r.Z = 0.5 }, nil},
		{"sum infinite", s, func(r *Reduction) { r.Z = math.Inf(1) }, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := good()
			c.edit(r)
			_, full, err := c.s.SampleReduced(r)
			if err == nil || full {
				t.Fatalf("got full %v, err %v; want an error", full, err)
			}
			if c.wantErr != nil && !errors.Is(err, c.wantErr) {
				t.Errorf("err %v, want %v", err, c.wantErr)
			}
		})
	}
}

func TestPrepareDeviceDraw(t *testing.T) {
	const n = 3 * chunkIDs
	flat := make([]float32, n)
	for i := range flat {
		flat[i] = float32(i%7) * 0.01
	}
	tail := make([]float32, n) // a hot id, the rest below the threshold with 6x its mass
	for i := range tail {
		tail[i] = -10
	}
	tail[17] = 0
	incomplete := func(l []float32, p Params) *Reduction {
		s, _ := New(p)
		return reduceRef(l, s.Reduce(), 0) // keeps no candidate: incomplete
	}
	for _, c := range []struct {
		name   string
		logits []float32
		p      Params
		want   DeviceDraw // U aside
		ok     bool
	}{
		{"top-p", flat, Params{Temperature: 0.6, TopP: 0.95}, DeviceDraw{TopP: 0.95}, true},
		{"top-k and top-p", flat, Params{Temperature: 0.6, TopK: 500, TopP: 0.8}, DeviceDraw{TopK: 500, TopP: 0.8}, true},
		{"min-p alone", flat, Params{Temperature: 1, MinP: 0.5}, DeviceDraw{}, true},
		{"top-k past the candidates", tail, Params{Temperature: 1, TopK: 50}, DeviceDraw{}, false},
		{"nucleus below the threshold", tail, Params{Temperature: 1, TopP: 0.9}, DeviceDraw{}, false},
		{"greedy", flat, Params{}, DeviceDraw{}, false},
		{"temperature alone", flat, Params{Temperature: 1}, DeviceDraw{}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.p.Seed = 21
			r := incomplete(c.logits, c.p)
			if r.Complete {
				t.Fatalf("premise: the reduction is complete (%d candidates)", r.Count)
			}
			s, _ := New(c.p)
			d, ok := s.PrepareDeviceDraw(r)
			if ok != c.ok {
				t.Fatalf("ok %v, want %v (%+v)", ok, c.ok, d)
			}
			// One draw consumed exactly when ok: the next Sample draws what
			// a fresh sampler's draw after one (or none) does.
			ref, _ := New(c.p)
			if ok {
				if d.TopK != c.want.TopK || d.TopP != c.want.TopP || d.Z != r.Z || !(d.U >= 0 && d.U < 1) {
					t.Errorf("draw %+v, want %+v with Z %v and U in [0, 1)", d, c.want, r.Z)
				}
				ref.PrepareDeviceDraw(r)
			}
			if c.p.Temperature == 0 {
				return
			}
			for i := range 5 {
				a, err := s.Sample(c.logits, nil)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := ref.Sample(c.logits, nil)
				if a != b {
					t.Fatalf("draw %d after PrepareDeviceDraw: %d, a fresh sampler %d", i, a, b)
				}
			}
		})
	}
}
