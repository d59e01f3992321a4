package dsv4

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"moxie/compute/cpu"
	"moxie/compute/cuda"
	"moxie/compute/ref"
	"moxie/dsv4/config"
)

// obsRecord keeps every ExpertObserver call and every routing decision.
type obsRecord struct {
	calls  []obsCall
	routes map[[2]int]map[int]float32 // (layer, pos) → expert → weight
}

type obsCall struct {
	layer, expert int
	pos           []int
	weights       []float32
	in, out       []float32
}

func (o *obsRecord) ObserveExpert(layer, expert int, pos []int, weights, in, out []float32) {
	o.calls = append(o.calls, obsCall{layer, expert, append([]int(nil), pos...), append([]float32(nil), weights...),
		append([]float32(nil), in...), append([]float32(nil), out...)})
}

func (o *obsRecord) RecordRoute(pos, layer int, experts []int, weights []float32) {
	k := [2]int{layer, pos}
	if o.routes[k] == nil {
		o.routes[k] = map[int]float32{}
	}
	for i, e := range experts {
		o.routes[k][e] = weights[i]
	}
}

// TestExpertObserver checks the observer's contract on the tiny model in
// two prefill chunks and decode steps: every routed (position, expert) slot is
// observed once, with the router's weight; each observed output row is
// W2·(SwiGLU(W1·x, W3·x)·weight) of its input row x, recomputed in float64
// from the checkpoint's dequantized weights; and the logits are those of a
// model without an observer (bit for bit).
func TestExpertObserver(t *testing.T) {
	cfg := config.Tiny()
	src := newMemSource(cfg, 11)
	be := cpu.New(2)
	t.Cleanup(be.Close)
	rec := &obsRecord{routes: map[[2]int]map[int]float32{}}
	m, err := Load(src, Options{Backend: be, Observer: rec, Routes: rec, MaxChunk: 16})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := Load(src, Options{Backend: be, MaxChunk: 16})
	if err != nil {
		t.Fatal(err)
	}
	toks := testTokens(30, cfg.VocabSize, 5)
	got, err := Logits(m, toks, 24)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Logits(plain, toks, 24)
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("logit %d: %v with the observer, %v without", i, got[i], want[i])
		}
	}
	r := newRefModel(src)
	D := cfg.Dim
	seen := map[[3]int]bool{}
	worst := 0.0
	for _, c := range rec.calls {
		n := len(c.pos)
		if n == 0 || len(c.weights) != n || len(c.in) != n*D || len(c.out) != n*D {
			t.Fatalf("layer %d expert %d: %d positions, %d weights, %d inputs, %d outputs (width %d)", c.layer, c.expert, n, len(c.weights), len(c.in), len(c.out), D)
		}
		ep := fmt.Sprintf("layers.%d.ffn.experts.%d.", c.layer, c.expert)
		for j, p := range c.pos {
			k := [3]int{c.layer, p, c.expert}
			if seen[k] {
				t.Fatalf("layer %d position %d expert %d observed twice", c.layer, p, c.expert)
			}
			seen[k] = true
			w, ok := rec.routes[[2]int{c.layer, p}][c.expert]
			if !ok || w != c.weights[j] {
				t.Fatalf("layer %d position %d expert %d: observed weight %v, routed %v (%v)", c.layer, p, c.expert, c.weights[j], w, ok)
			}
			x := make([]float64, D)
			for i, v := range c.in[j*D : (j+1)*D] {
				x[i] = float64(v)
			}
			g, u := r.linear(ep+"w1.weight", x), r.linear(ep+"w3.weight", x)
			y := r.linear(ep+"w2.weight", ref.SwiGLU(g, u, float64(c.weights[j]), cfg.SwigluLimit))
			yw := make([]float32, D)
			for i, v := range y {
				yw[i] = float32(v)
			}
			rel := maxRel(c.out[j*D:(j+1)*D], yw)
			worst = math.Max(worst, rel)
			if rel > 1e-4 {
				t.Errorf("layer %d position %d expert %d: output max relative error %.3g against float64 > 1e-4", c.layer, p, c.expert, rel)
			}
		}
	}
	slots := 0
	for k, es := range rec.routes {
		for e := range es {
			slots++
			if !seen[[3]int{k[0], k[1], e}] {
				t.Errorf("layer %d position %d expert %d routed but not observed", k[0], k[1], e)
			}
		}
	}
	if slots != len(seen) || slots != cfg.NLayers*len(toks)*cfg.NActivatedExperts {
		t.Errorf("%d routed slots, %d observed; want %d", slots, len(seen), cfg.NLayers*len(toks)*cfg.NActivatedExperts)
	}
	t.Logf("%d observer calls, %d slots; worst output error against float64 %.3g", len(rec.calls), slots, worst)
}

func TestExpertObserverNeedsHost(t *testing.T) {
	// The refusal comes before the device is touched, so a zero Device
	// stands for one.
	_, err := Load(newMemSource(config.Tiny(), 1), Options{Observer: &obsRecord{}, Device: new(cuda.Device)})
	if err == nil || !strings.Contains(err.Error(), "host sessions") {
		t.Fatalf("Load with an observer and a device: error %v, want one saying observers need host sessions", err)
	}
}
