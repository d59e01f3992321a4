package dsv4

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"

	"moxie/checkpoint"
	"moxie/compute/cpu"
	"moxie/dsv4/config"
	"moxie/format"
)

func loadTiny(t testing.TB, src checkpoint.Source) *Model {
	t.Helper()
	be := cpu.New(2)
	t.Cleanup(be.Close)
	m, err := Load(src, Options{Backend: be})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return m
}

// testTokens returns n deterministic tokens in [0, vocab).
func testTokens(n, vocab int, seed int) []int {
	out := make([]int, n)
	x := uint32(seed*2654435761 + 12345)
	for i := range out {
		x = x*1664525 + 1013904223
		out[i] = int(x>>8) % vocab
	}
	return out
}

func argmax(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}

func argmax64(v []float64) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}

// maxRel is max|a−b| / max|b| over one row.
func maxRel(a, b []float32) float64 {
	var e, m float64
	for i := range a {
		e = math.Max(e, math.Abs(float64(a[i])-float64(b[i])))
		m = math.Max(m, math.Abs(float64(b[i])))
	}
	return e / m
}

func TestLoadRejects(t *testing.T) {
	cfg := config.Tiny()
	cases := []struct {
		name string
		mod  func(s *memSource)
		want []string
	}{
		{"missing tensor", func(s *memSource) { s.remove("layers.1.attn.wq_b.weight") },
			[]string{"missing tensor layers.1.attn.wq_b.weight", "F8_E4M3"}},
		{"extra tensor", func(s *memSource) { s.put("layers.0.attn.bogus", format.F32, []int64{3}, make([]byte, 12)) },
			[]string{"unexpected tensor layers.0.attn.bogus"}},
		{"wrong shape", func(s *memSource) {
			s.put("layers.2.attn.compressor.ape", format.F32, []int64{4, 48}, make([]byte, 4*4*48))
		}, []string{"layers.2.attn.compressor.ape", "[4 48]", "[8 48]"}},
		{"wrong dtype", func(s *memSource) {
			s.put("norm.weight", format.F32, []int64{int64(cfg.Dim)}, make([]byte, 4*cfg.Dim))
		}, []string{"tensor norm.weight is F32", "want BF16"}},
		{"bad tid2eid", func(s *memSource) {
			d := append([]byte(nil), s.data["layers.0.ffn.gate.tid2eid"]...)
			d[8*5] = 200
			info, _ := s.Lookup("layers.0.ffn.gate.tid2eid")
			s.put(info.Name, info.DType, info.Shape, d)
		}, []string{"layers.0.ffn.gate.tid2eid", "expert 200"}},
		{"nan norm", func(s *memSource) {
			d := append([]byte(nil), s.data["layers.3.ffn_norm.weight"]...)
			d[0], d[1] = 0xc0, 0x7f
			info, _ := s.Lookup("layers.3.ffn_norm.weight")
			s.put(info.Name, info.DType, info.Shape, d)
		}, []string{"layers.3.ffn_norm.weight", "NaN"}},
		{"no config", func(s *memSource) { delete(s.files, "config.json") }, []string{"config.json"}},
		{"bad config", func(s *memSource) { s.files["config.json"] = []byte(`{"model_type":"llama"}`) }, []string{"config.json"}},
	}
	base := newMemSource(cfg, 1)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := base.clone()
			tc.mod(s)
			_, err := Load(s, Options{})
			if err == nil {
				t.Fatal("Load succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestSessionRejects(t *testing.T) {
	m := loadTiny(t, newMemSource(config.Tiny(), 1))
	cases := []struct {
		name string
		toks []int
		want string
	}{
		{"empty", nil, "no tokens"},
		{"negative", []int{1, -1}, "token -1 at index 1"},
		{"too large", []int{config.TinyVocab}, "outside the vocabulary"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := m.NewSession().Prefill(tc.toks)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := Logits(m, []int{1, 2}, 3); err == nil {
		t.Error("Logits accepted prefill > len(tokens)")
	}
	t.Run("max positions", func(t *testing.T) {
		cfg := config.Tiny()
		cfg.MaxPositions = 10
		m := loadTiny(t, newMemSource(cfg, 1))
		s := m.NewSession()
		if _, err := s.Prefill(testTokens(8, cfg.VocabSize, 1)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Prefill(testTokens(3, cfg.VocabSize, 2)); err == nil || !strings.Contains(err.Error(), "max_position_embeddings") {
			t.Fatalf("err = %v, want a max_position_embeddings error", err)
		}
		if _, err := s.Decode(5); err != nil { // position 8 is still allowed
			t.Fatalf("decode at position 8: %v", err)
		}
	})
}

// TestForwardMatchesFloat64Reference compares the engine with an independent,
// cache-free float64 forward pass over 40 tokens: past the window of 8, more
// compressed CSA entries (10) than the indexer's top-4, five closed HCA windows,
// two hash-routed layers; for the shipped formats and the repacked variants
// (MXFP8 dense weights, FP8 experts).
func TestForwardMatchesFloat64Reference(t *testing.T) {
	if testing.Short() {
		t.Skip("float64 reference forward is slow")
	}
	variants := []struct {
		name         string
		dense, exper string
	}{{"shipped", "fp8", "fp4"}, {"mxfp8 dense", "mxfp8", "fp4"}, {"fp8 experts", "fp8", "fp8"}}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			cfg := config.Tiny()
			cfg.DenseFormat, cfg.ExpertDType = v.dense, v.exper
			src := newMemSource(cfg, 7)
			var js map[string]any
			if err := json.Unmarshal(src.files["config.json"], &js); err != nil {
				t.Fatal(err)
			}
			js[config.DenseFormatKey] = v.dense
			src.files["config.json"], _ = json.Marshal(js)
			m := loadTiny(t, src)
			if m.Cfg.DenseFormat != v.dense || m.Cfg.ExpertDType != v.exper {
				t.Fatalf("loaded formats %s/%s, want %s/%s", m.Cfg.DenseFormat, m.Cfg.ExpertDType, v.dense, v.exper)
			}
			toks := testTokens(40, m.Cfg.VocabSize, 3)
			got, err := Logits(m, toks, 25)
			if err != nil {
				t.Fatal(err)
			}
			want := newRefModel(src).forward(toks)
			V := m.Cfg.VocabSize
			worst := 0.0
			for i := range toks {
				g := got[i*V : (i+1)*V]
				w := make([]float32, V)
				for j := range w {
					w[j] = float32(want[i][j])
				}
				r := maxRel(g, w)
				worst = math.Max(worst, r)
				if r > 1e-4 {
					t.Errorf("position %d: max relative logit error %.3g > 1e-4", i, r)
				}
				if argmax(g) != argmax64(want[i]) {
					t.Errorf("position %d: argmax %d, reference %d", i, argmax(g), argmax64(want[i]))
				}
			}
			t.Logf("worst relative error vs float64 reference: %.3g", worst)
		})
	}
}

// TestPrefillChunkDecodeAgree: one prefill, chunked prefills and token-by-token
// decode of 40 tokens give the same logits at every position.
func TestPrefillChunkDecodeAgree(t *testing.T) {
	m := loadTiny(t, newMemSource(config.Tiny(), 2))
	V := m.Cfg.VocabSize
	toks := testTokens(40, V, 5)
	full, err := m.NewSession().PrefillAll(toks)
	if err != nil {
		t.Fatal(err)
	}
	checkRows(t, "full prefill", full, V)
	schedules := map[string][]int{
		"decode":  nil,
		"chunks":  {5, 13, 1, 21},
		"aligned": {8, 8, 8, 16},
		"odd":     {3, 3, 7, 27},
	}
	for name, chunks := range schedules {
		t.Run(name, func(t *testing.T) {
			s := m.NewSession()
			var got []float32
			if chunks == nil {
				for _, tok := range toks {
					l, err := s.Decode(tok)
					if err != nil {
						t.Fatal(err)
					}
					got = append(got, l...)
				}
			} else {
				at := 0
				for _, n := range chunks {
					l, err := s.PrefillAll(toks[at : at+n])
					if err != nil {
						t.Fatal(err)
					}
					got = append(got, l...)
					at += n
				}
			}
			if s.Pos() != len(toks) {
				t.Fatalf("Pos = %d, want %d", s.Pos(), len(toks))
			}
			for i := range toks {
				a, b := got[i*V:(i+1)*V], full[i*V:(i+1)*V]
				if r := maxRel(a, b); r > 1e-5 {
					t.Errorf("position %d: max relative difference %.3g > 1e-5", i, r)
				}
				if argmax(a) != argmax(b) {
					t.Errorf("position %d: argmax %d vs %d", i, argmax(a), argmax(b))
				}
			}
		})
	}
	// Internal chunking (MaxChunk) computes the same function.
	for _, mc := range []int{1, 3, 16} {
		t.Run(fmt.Sprint("max chunk ", mc), func(t *testing.T) {
			be := cpu.New(2)
			defer be.Close()
			mm, err := Load(m.src, Options{Backend: be, MaxChunk: mc})
			if err != nil {
				t.Fatal(err)
			}
			got, err := mm.NewSession().PrefillAll(toks)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(full) {
				t.Fatalf("%d logits, want %d", len(got), len(full))
			}
			for i := range toks {
				if r := maxRel(got[i*V:(i+1)*V], full[i*V:(i+1)*V]); r > 1e-5 {
					t.Errorf("position %d: max relative difference %.3g > 1e-5", i, r)
				}
			}
			last, err := mm.NewSession().Prefill(toks)
			if err != nil {
				t.Fatal(err)
			}
			if len(last) != V || maxRel(last, full[(len(toks)-1)*V:]) > 1e-5 {
				t.Errorf("Prefill with max chunk %d: %d logits or wrong values", mc, len(last))
			}
		})
	}
	// Prefill returns the last row of PrefillAll.
	last, err := m.NewSession().Prefill(toks)
	if err != nil {
		t.Fatal(err)
	}
	if r := maxRel(last, full[(len(toks)-1)*V:]); r > 1e-6 {
		t.Errorf("Prefill last row differs from PrefillAll by %.3g", r)
	}
}

// checkRows asserts logits are finite and not degenerate: per-position std
// within [1e-3, 1e3], and not every position predicting the same thing.
func checkRows(t *testing.T, what string, l []float32, V int) {
	t.Helper()
	arg := map[int]bool{}
	for i := 0; i < len(l)/V; i++ {
		row := l[i*V : (i+1)*V]
		var s, ss float64
		for j, v := range row {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("%s: logit [%d, %d] = %g", what, i, j, v)
			}
			s += float64(v)
			ss += float64(v) * float64(v)
		}
		mean := s / float64(V)
		std := math.Sqrt(ss/float64(V) - mean*mean)
		if std < 1e-3 || std > 1e3 {
			t.Errorf("%s: position %d logit std %g outside [1e-3, 1e3]", what, i, std)
		}
		arg[argmax(row)] = true
	}
	if len(l)/V >= 8 && len(arg) < 2 {
		t.Errorf("%s: all %d positions have the same argmax", what, len(l)/V)
	}
}

// TestStateContents checks the caches against the schedule of §4.10 after 40 tokens.
func TestStateContents(t *testing.T) {
	m := loadTiny(t, newMemSource(config.Tiny(), 3))
	s := m.NewSession()
	if _, err := s.Prefill(testTokens(40, m.Cfg.VocabSize, 1)); err != nil {
		t.Fatal(err)
	}
	c := m.Cfg
	for l, st := range s.layers {
		var wantC, wantI int
		switch c.Kind(l) {
		case config.CSA:
			wantC, wantI = 40/c.Ratio(l), 40/c.Ratio(l)
		case config.HCA:
			wantC = 40 / c.Ratio(l)
		}
		if got := len(st.ckv) / c.HeadDim; got != wantC {
			t.Errorf("layer %d (%v): %d compressed entries, want %d", l, c.Kind(l), got, wantC)
		}
		if got := len(st.ikeys) / c.IndexHeadDim; got != wantI {
			t.Errorf("layer %d (%v): %d indexer keys, want %d", l, c.Kind(l), got, wantI)
		}
	}
}

func TestNewSequenceContract(t *testing.T) {
	m := loadTiny(t, newMemSource(config.Tiny(), 4))
	seq, err := m.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	l, err := seq.Append(t.Context(), []int{5, 6, 7})
	if err != nil || len(l) != m.VocabSize() || seq.Len() != 3 {
		t.Fatalf("Append: len %d err %v Len %d", len(l), err, seq.Len())
	}
	seq.Close()
	if _, err := seq.Append(t.Context(), []int{1}); err == nil {
		t.Fatal("Append after Close succeeded")
	}
}

func BenchmarkTinyDecode(b *testing.B) {
	m := loadTiny(b, newMemSource(config.Tiny(), 1))
	s := m.NewSession()
	for b.Loop() {
		if s.Pos() == 256 { // keep the context bounded
			s = m.NewSession()
		}
		if _, err := s.Decode(s.Pos() % m.Cfg.VocabSize); err != nil {
			b.Fatal(err)
		}
	}
	_ = fmt.Sprint()
}

// failingExperts serves experts from a model but fails for one layer.
type failingExperts struct {
	inner Experts
	layer int
}

func (f failingExperts) Expert(layer, e int) (ExpertWeights, error) {
	if layer == f.layer {
		return ExpertWeights{}, fmt.Errorf("tier read failed for expert %d", e)
	}
	return f.inner.Expert(layer, e)
}

func TestExpertErrorStopsSession(t *testing.T) {
	src := newMemSource(config.Tiny(), 1)
	base := loadTiny(t, src)
	be := cpu.New(1)
	t.Cleanup(be.Close)
	m, err := Load(src, Options{Backend: be, Experts: failingExperts{inner: base.experts, layer: 2}})
	if err != nil {
		t.Fatal(err)
	}
	s := m.NewSession()
	_, err = s.Prefill([]int{1, 2, 3})
	if err == nil || !strings.Contains(err.Error(), "layer 2") || !strings.Contains(err.Error(), "tier read failed") {
		t.Fatalf("err = %v, want the layer and the cause", err)
	}
	if _, err := s.Decode(4); err == nil {
		t.Fatal("session usable after a failed step")
	}
}

// oneAtATime hides an Experts' ExpertSet, so that the forward pass asks for
// the experts one by one.
type oneAtATime struct{ inner Experts }

func (o oneAtATime) Expert(layer, e int) (ExpertWeights, error) { return o.inner.Expert(layer, e) }

// setErr is Experts whose ExpertSet fails in one layer.
type setErr struct {
	oneAtATime
	layer int
}

func (s setErr) ExpertSet(layer int, es []int, dst []ExpertWeights) (bool, error) {
	if layer == s.layer {
		return false, fmt.Errorf("set read failed in layer %d", layer)
	}
	return s.inner.(ExpertSet).ExpertSet(layer, es, dst)
}

// setDeclines is Experts whose ExpertSet always declines.
type setDeclines struct{ oneAtATime }

func (setDeclines) ExpertSet(int, []int, []ExpertWeights) (bool, error) { return false, nil }

// countObserver counts ObserveExpert calls and sums their outputs.
type countObserver struct {
	calls int
	sum   float64
}

func (c *countObserver) ObserveExpert(layer, expert int, pos []int, weights, in, out []float32) {
	c.calls++
	for _, v := range out {
		c.sum += float64(v)
	}
}

// TestExpertSetDecodeBits: a decoded token's experts in two joint splits
// (ExpertSet) give the bits of the per-expert path, for both numeric
// targets, with the observer seeing the same work; an Experts that declines
// the set falls back, and one whose set fails stops the step with the
// layer and the cause.
func TestExpertSetDecodeBits(t *testing.T) {
	src := newMemSource(config.Tiny(), 3)
	be := cpu.New(3)
	t.Cleanup(be.Close)
	base, err := Load(src, Options{Backend: be})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := base.experts.(ExpertSet); !ok {
		t.Fatal("the source's experts do not implement ExpertSet")
	}
	toks := testTokens(14, base.Cfg.VocabSize, 9)
	run := func(t *testing.T, ex Experts, target Target) ([]float32, *countObserver) {
		t.Helper()
		obs := &countObserver{}
		m, err := Load(src, Options{Backend: be, Experts: ex, Target: target, Observer: obs})
		if err != nil {
			t.Fatal(err)
		}
		s := m.NewSession()
		var got []float32
		if _, err := s.Prefill(toks[:4]); err != nil {
			t.Fatal(err)
		}
		for _, tok := range toks[4:] {
			l, err := s.Decode(tok)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, l...)
		}
		return got, obs
	}
	for _, target := range []Target{Exact, QAT} {
		t.Run(target.String(), func(t *testing.T) {
			want, wobs := run(t, oneAtATime{base.experts}, target)
			for name, ex := range map[string]Experts{"set": base.experts, "declines": setDeclines{oneAtATime{base.experts}}} {
				got, gobs := run(t, ex, target)
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%s: logit %d = %v, want %v (the per-expert path's bits)", name, i, got[i], want[i])
					}
				}
				if gobs.calls != wobs.calls || gobs.sum != wobs.sum {
					t.Errorf("%s: observer saw %d calls (sum %g), want %d (%g)", name, gobs.calls, gobs.sum, wobs.calls, wobs.sum)
				}
			}
		})
	}
	m, err := Load(src, Options{Backend: be, Experts: setErr{oneAtATime{base.experts}, 2}})
	if err != nil {
		t.Fatal(err)
	}
	s := m.NewSession()
	if _, err := s.Prefill(toks[:4]); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Decode(toks[4]); err == nil || !strings.Contains(err.Error(), "layer 2") || !strings.Contains(err.Error(), "set read failed") {
		t.Fatalf("err = %v, want the layer and the cause", err)
	}
}
