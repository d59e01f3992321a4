package dsv4

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"moxie/checkpoint"
	"moxie/compute/cpu"
	"moxie/dsv4/npy"
)

// goldenDir holds the oracle's golden files for synth:tiny (reference/oracle.py:
// transformers' DeepseekV4ForCausalLM in float32 on the checkpoint written by
// `moxie synth tiny`, shared-expert clamp off).
const goldenDir = "testdata/golden/tiny"

// goldenCase is one entry of cases.json.
type goldenCase struct {
	Name    string `json:"name"`
	Tokens  []int  `json:"tokens"`
	Prefill int    `json:"prefill"`
	// Chunks, when present, are the prefill chunk sizes (sum = len(Tokens));
	// otherwise Prefill tokens are one prefill and each later token one decode step.
	Chunks         []int  `json:"chunks"`
	Logits         string `json:"logits"`
	UncachedLogits string `json:"uncached_logits"`
	LayerOutputs   string `json:"layer_outputs"`
}

// schedule returns the chunk sizes the case runs with.
func (c *goldenCase) schedule() []int {
	if len(c.Chunks) > 0 {
		return c.Chunks
	}
	s := []int{c.Prefill}
	for range len(c.Tokens) - c.Prefill {
		s = append(s, 1)
	}
	return s
}

// parseGoldenCases decodes and validates cases.json.
func parseGoldenCases(data []byte, vocab int) ([]goldenCase, error) {
	var cs []goldenCase
	if err := json.Unmarshal(data, &cs); err != nil {
		return nil, fmt.Errorf("cases.json: %w", err)
	}
	for i, c := range cs {
		where := fmt.Sprintf("cases.json: case %d (%q)", i, c.Name)
		switch {
		case c.Name == "":
			return nil, fmt.Errorf("%s: no name", where)
		case len(c.Tokens) == 0:
			return nil, fmt.Errorf("%s: no tokens", where)
		case c.Prefill < 1 || c.Prefill > len(c.Tokens):
			return nil, fmt.Errorf("%s: prefill %d, want 1..%d", where, c.Prefill, len(c.Tokens))
		case c.Logits == "" || filepath.Base(c.Logits) != c.Logits:
			return nil, fmt.Errorf("%s: logits file %q, want a plain file name", where, c.Logits)
		}
		for _, f := range []string{c.UncachedLogits, c.LayerOutputs} {
			if f != "" && filepath.Base(f) != f {
				return nil, fmt.Errorf("%s: file %q, want a plain file name", where, f)
			}
		}
		for j, t := range c.Tokens {
			if t < 0 || t >= vocab {
				return nil, fmt.Errorf("%s: token %d at index %d outside the vocabulary of %d", where, t, j, vocab)
			}
		}
		if len(c.Chunks) > 0 {
			sum := 0
			for _, n := range c.Chunks {
				if n < 1 {
					return nil, fmt.Errorf("%s: chunk size %d, want >= 1", where, n)
				}
				sum += n
			}
			if sum != len(c.Tokens) || c.Chunks[0] != c.Prefill {
				return nil, fmt.Errorf("%s: chunks %v must sum to %d and start with prefill %d", where, c.Chunks, len(c.Tokens), c.Prefill)
			}
		}
	}
	return cs, nil
}

func loadGolden(t *testing.T, name string, rows, cols int) []float32 {
	t.Helper()
	a, err := npy.ReadFile(filepath.Join(goldenDir, name))
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Shape) != 2 || a.Shape[0] != rows || a.Shape[1] != cols {
		t.Fatalf("%s: shape %v, want [%d %d]", name, a.Shape, rows, cols)
	}
	return a.Data
}

// TestGoldenTiny compares the engine's logits with the oracle's, per position:
// max|a−b| / max|b| ≤ 1e-4 and the same argmax.
func TestGoldenTiny(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(goldenDir, "cases.json"))
	if os.IsNotExist(err) {
		t.Skipf("no golden files yet: %s/cases.json is absent (made by reference/oracle.py on the GPU machine)", goldenDir)
	}
	if err != nil {
		t.Fatal(err)
	}
	src, err := checkpoint.Open("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	m, err := Load(src, Options{Backend: cpu.New(2)})
	if err != nil {
		t.Fatal(err)
	}
	V := m.Cfg.VocabSize
	cases, err := parseGoldenCases(raw, V)
	if err != nil {
		t.Fatal(err)
	}
	for _, gc := range cases {
		t.Run(gc.Name, func(t *testing.T) {
			T := len(gc.Tokens)
			want := loadGolden(t, gc.Logits, T, V)
			s := m.NewSession()
			var layers [][]float32
			if gc.LayerOutputs != "" {
				s.layerHook = func(l int, X []float32) { layers = append(layers, append([]float32(nil), X...)) }
			}
			sels := map[string]map[string][]int{}
			s.selHook = func(l, pos int, sel []int) {
				k := fmt.Sprint(l)
				if sels[k] == nil {
					sels[k] = map[string][]int{}
				}
				sels[k][fmt.Sprint(pos)] = slices.Sorted(slices.Values(sel))
			}
			var got []float32
			at := 0
			for _, n := range gc.schedule() {
				l, err := s.PrefillAll(gc.Tokens[at : at+n])
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, l...)
				at += n
			}
			compareLogits(t, "cached", got, want, V)
			if gc.UncachedLogits != "" {
				// The engine's cached result against the oracle's uncached pass.
				compareLogits(t, "vs uncached", got, loadGolden(t, gc.UncachedLogits, T, V), V)
			}
			compareSelections(t, gc.Name, sels)
			if gc.LayerOutputs != "" && t.Failed() {
				reportLayers(t, gc, layers, m)
			}
		})
	}
}

// compareSelections checks the indexer's choices against the oracle's record
// (indexer.json, "uncached" pass), for every CSA layer and position.
func compareSelections(t *testing.T, name string, got map[string]map[string][]int) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(goldenDir, "indexer.json"))
	if err != nil {
		t.Logf("indexer selections not compared: %v", err)
		return
	}
	var all map[string]map[string]map[string]map[string]struct {
		Selected []int `json:"selected"`
	}
	if err := json.Unmarshal(raw, &all); err != nil {
		t.Fatalf("indexer.json: %v", err)
	}
	want := all[name]["uncached"]
	n := 0
	for l, byPos := range want {
		for p, r := range byPos {
			g := got[l][p]
			if len(r.Selected) == 0 && len(g) == 0 {
				continue
			}
			n++
			if !slices.Equal(g, r.Selected) {
				t.Errorf("layer %s position %s: indexer selected %v, oracle %v", l, p, g, r.Selected)
			}
		}
	}
	t.Logf("indexer selections compared: %d", n)
}

func compareLogits(t *testing.T, what string, got, want []float32, V int) {
	t.Helper()
	worst := 0.0
	for i := 0; i < len(want)/V; i++ {
		a, b := got[i*V:(i+1)*V], want[i*V:(i+1)*V]
		r := maxRel(a, b)
		worst = math.Max(worst, r)
		if r > 1e-4 {
			t.Errorf("%s: position %d: max|a-b|/max|b| = %.3g > 1e-4", what, i, r)
		}
		if argmax(a) != argmax(b) {
			t.Errorf("%s: position %d: argmax %d, oracle %d", what, i, argmax(a), argmax(b))
		}
	}
	t.Logf("%s: worst per-position relative error %.3g", what, worst)
}

// reportLayers logs, per layer, how far the engine's streams are from the
// oracle's, to localise a mismatch (single-prefill cases only).
func reportLayers(t *testing.T, gc goldenCase, layers [][]float32, m *Model) {
	c := m.Cfg
	T := len(gc.Tokens)
	a, err := npy.ReadFile(filepath.Join(goldenDir, gc.LayerOutputs))
	if err != nil || len(gc.schedule()) != 1 {
		t.Logf("layer outputs not compared: %v", err)
		return
	}
	n := T * c.HCMult * c.Dim
	if len(a.Data) != c.NLayers*n || len(layers) != c.NLayers {
		t.Logf("layer outputs: shape %v, want [%d %d %d %d]", a.Shape, c.NLayers, T, c.HCMult, c.Dim)
		return
	}
	for l := range c.NLayers {
		t.Logf("layer %d (%v): streams max relative difference %.3g", l, c.Kind(l), maxRel(layers[l], a.Data[l*n:(l+1)*n]))
	}
}

func FuzzParseGoldenCases(f *testing.F) {
	f.Add([]byte(`[{"name":"a","tokens":[1,2,3],"prefill":2,"logits":"a.npy"}]`))
	f.Add([]byte(`[{"name":"b","tokens":[1,2,3,4],"prefill":2,"chunks":[2,2],"logits":"b.npy","uncached_logits":"b_u.npy"}]`))
	f.Add([]byte(`[{"name":"c","tokens":[],"prefill":0,"logits":"../x"}]`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		cs, err := parseGoldenCases(data, 288)
		if err != nil {
			return
		}
		for _, c := range cs {
			s := 0
			for _, n := range c.schedule() {
				if n < 1 {
					t.Fatalf("case %q: chunk %d", c.Name, n)
				}
				s += n
			}
			if s != len(c.Tokens) {
				t.Fatalf("case %q: schedule covers %d of %d tokens", c.Name, s, len(c.Tokens))
			}
		}
	})
}

func TestParseGoldenCasesRejects(t *testing.T) {
	cases := map[string]string{
		"not json":    `{`,
		"no name":     `[{"tokens":[1],"prefill":1,"logits":"a.npy"}]`,
		"no tokens":   `[{"name":"a","tokens":[],"prefill":1,"logits":"a.npy"}]`,
		"prefill 0":   `[{"name":"a","tokens":[1],"prefill":0,"logits":"a.npy"}]`,
		"path":        `[{"name":"a","tokens":[1],"prefill":1,"logits":"../a.npy"}]`,
		"token range": `[{"name":"a","tokens":[999],"prefill":1,"logits":"a.npy"}]`,
		"chunks sum":  `[{"name":"a","tokens":[1,2],"prefill":1,"chunks":[1],"logits":"a.npy"}]`,
		"chunk zero":  `[{"name":"a","tokens":[1,2],"prefill":1,"chunks":[1,0,1],"logits":"a.npy"}]`,
		"layers path": `[{"name":"a","tokens":[1],"prefill":1,"logits":"a.npy","layer_outputs":"/x"}]`,
	}
	for name, js := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := parseGoldenCases([]byte(js), 288); err == nil {
				t.Fatalf("accepted %s", js)
			}
		})
	}
}
