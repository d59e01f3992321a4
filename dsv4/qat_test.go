package dsv4

import (
	"math"
	"slices"
	"strings"
	"testing"

	"moxie/compute"
	"moxie/compute/cpu"
	"moxie/compute/cuda"
	"moxie/dsv4/config"
	"moxie/qat"
)

// qatProbe wraps a backend and checks the inputs of the products as the qat
// target feeds them: every FP8/FP4 linear's input a fixed point of
// act_quant (so it went through it), wo_a's grouped input a fixed point of
// the BF16 rounding; BF16 and F32 weights take their inputs as they are.
type qatProbe struct {
	compute.Backend
	format     map[compute.Weight]compute.Format
	quantized  int // FP8/FP4 linear calls whose input is act_quant's fixed point
	raw        int // FP8/FP4 linear calls whose input is not
	groupedBF  int // grouped calls whose input is BF16-valued
	groupedRaw int
}

func (p *qatProbe) Bind(w compute.WeightData) (compute.Weight, error) {
	b, err := p.Backend.Bind(w)
	if err == nil {
		p.format[b] = w.Format
	}
	return b, err
}

func (p *qatProbe) Linear(w compute.Weight, y, x []float32, batch int) {
	switch p.format[w] {
	case compute.FP8Block, compute.MXFP4, compute.MXFP8:
		q := slices.Clone(x[:batch*w.Cols()])
		qat.ActQuant(q, w.Cols())
		if slices.Equal(q, x[:batch*w.Cols()]) {
			p.quantized++
		} else {
			p.raw++
		}
	}
	p.Backend.Linear(w, y, x, batch)
}

func (p *qatProbe) GroupedLinear(w compute.Weight, y, x []float32, batch, groups int) {
	q := slices.Clone(x[:batch*groups*w.Cols()])
	qat.BF16Round(q)
	if slices.Equal(q, x[:batch*groups*w.Cols()]) {
		p.groupedBF++
	} else {
		p.groupedRaw++
	}
	p.Backend.GroupedLinear(w, y, x, batch, groups)
}

// TestQATTarget runs synth:tiny (every layer kind, the indexer, partial
// quantization blocks) under both targets through a probing backend: with
// qat every FP8/FP4 product reads an act_quant fixed point and wo_a a BF16
// one, the stored window KV's unrotated dims and the compressed entries are
// fixed points of the KV simulation, the indexer keys of the FP4 one; with
// exact, inputs are not quantized (so the probe can tell). The logits differ
// between the targets, and a qat prefill equals the same tokens decoded one
// by one.
func TestQATTarget(t *testing.T) {
	src := newMemSource(config.Tiny(), 3)
	cfg := config.Tiny()
	tokens := testTokens(24, cfg.VocabSize, 5)
	run := func(target Target) ([]float32, *qatProbe, *Session) {
		be := cpu.New(2)
		t.Cleanup(be.Close)
		p := &qatProbe{Backend: be, format: map[compute.Weight]compute.Format{}}
		m, err := Load(src.clone(), Options{Backend: p, Target: target})
		if err != nil {
			t.Fatalf("Load %v: %v", target, err)
		}
		s := m.NewSession()
		logits, err := s.PrefillAll(tokens)
		if err != nil {
			t.Fatal(err)
		}
		return logits, p, s
	}
	exact, pe, _ := run(Exact)
	qlog, pq, sq := run(QAT)
	t.Logf("qat: %d FP8/FP4 products on quantized inputs, %d not; wo_a %d BF16, %d not", pq.quantized, pq.raw, pq.groupedBF, pq.groupedRaw)
	t.Logf("exact: %d FP8/FP4 products on quantized inputs, %d not", pe.quantized, pe.raw)
	if pq.raw != 0 || pq.quantized == 0 || pq.groupedRaw != 0 || pq.groupedBF == 0 {
		t.Errorf("qat: want every FP8/FP4 product's input quantized and wo_a's BF16")
	}
	if pe.raw == 0 {
		t.Errorf("exact: no FP8/FP4 product read an unquantized input; the probe cannot tell the targets apart")
	}
	nope := cfg.HeadDim - cfg.RopeHeadDim
	kinds := map[string]int{}
	for l, ls := range sq.layers {
		for r := 0; r < cfg.Window; r++ {
			row := ls.ring[r*cfg.HeadDim : r*cfg.HeadDim+nope]
			if !onGrid(row, func(q []float32) { qat.FP8Sim(q, qat.KVBlock) }) {
				t.Fatalf("layer %d: window ring row %d is not on the KV simulation's grid", l, r)
			}
			kinds["ring"]++
		}
		for e := 0; e+cfg.HeadDim <= len(ls.ckv); e += cfg.HeadDim {
			row := ls.ckv[e : e+nope]
			if !onGrid(row, func(q []float32) { qat.FP8Sim(q, qat.KVBlock) }) {
				t.Fatalf("layer %d: compressed entry %d is not on the KV simulation's grid", l, e/cfg.HeadDim)
			}
			kinds["entries"]++
		}
		for e := 0; e+cfg.IndexHeadDim <= len(ls.ikeys); e += cfg.IndexHeadDim {
			row := ls.ikeys[e : e+cfg.IndexHeadDim]
			if !onGrid(row, qat.FP4Sim) {
				t.Fatalf("layer %d: indexer key %d is not on the FP4 grid", l, e/cfg.IndexHeadDim)
			}
			kinds["index keys"]++
		}
	}
	if kinds["entries"] == 0 || kinds["index keys"] == 0 {
		t.Fatalf("checked %v: want compressed entries and indexer keys", kinds)
	}
	var diff, scale float64
	for i := range qlog {
		diff = math.Max(diff, math.Abs(float64(qlog[i]-exact[i])))
		scale = math.Max(scale, math.Abs(float64(exact[i])))
	}
	t.Logf("logits: max |qat - exact| %.3g (max |exact| %.3g)", diff, scale)
	// A random miniature has no scale of "small" for quantization noise
	// (TestQATBrownMini measures it on the trained model): here only that
	// the targets differ and stay finite.
	if diff == 0 || math.IsNaN(diff) || math.IsInf(diff, 0) {
		t.Errorf("logits: max |qat - exact| %.3g: want a finite difference", diff)
	}
	// Token by token gives the same function under qat.
	m, err := Load(src.clone(), Options{Target: QAT})
	if err != nil {
		t.Fatal(err)
	}
	s := m.NewSession()
	var last []float32
	for _, tok := range tokens {
		if last, err = s.Decode(tok); err != nil {
			t.Fatal(err)
		}
	}
	V := cfg.VocabSize
	tail := qlog[len(qlog)-V:]
	for i := range last {
		if d := math.Abs(float64(last[i] - tail[i])); d > 1e-4*math.Max(1, math.Abs(float64(tail[i]))) {
			t.Fatalf("logit %d: decode %g, prefill %g", i, last[i], tail[i])
		}
	}
}

// onGrid reports whether sim leaves a copy of x as it is.
func onGrid(x []float32, sim func([]float32)) bool {
	q := slices.Clone(x)
	sim(q)
	return slices.Equal(q, x)
}

// TestQATRejects: the qat target with a device, and an unknown target, are
// errors that say what to do; qat and exact states are different sequences
// to the prompt cache.
func TestQATRejects(t *testing.T) {
	src := newMemSource(config.Tiny(), 1)
	if _, err := Load(src.clone(), Options{Target: QAT, Device: &cuda.Device{}}); err == nil || !strings.Contains(err.Error(), "--backend cpu") {
		t.Errorf("qat with a device: err = %v, want one naming --backend cpu", err)
	}
	if _, err := Load(src.clone(), Options{Target: Target(7)}); err == nil || !strings.Contains(err.Error(), "exact or qat") {
		t.Errorf("Target(7): err = %v, want one naming the targets", err)
	}
	me, err := Load(src.clone(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	mq, err := Load(src.clone(), Options{Target: QAT})
	if err != nil {
		t.Fatal(err)
	}
	if me.SequenceID() == mq.SequenceID() {
		t.Error("exact and qat models share a SequenceID: a saved state would cross targets")
	}
}
