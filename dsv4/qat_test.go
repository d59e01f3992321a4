package dsv4

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"moxie/compute"
	"moxie/compute/cpu"
	"moxie/compute/cuda"
	"moxie/dsv4/config"
)

// e4m3Grid is every finite non-negative E4M3fn value with its code, from the
// format's definition (bias 7, 3 mantissa bits, subnormals m/8·2^-6, 0x7F NaN),
// written here independently of package format.
func e4m3Grid() (vals []float64, codes []int) {
	for c := 0; c < 0x7f; c++ {
		e, m := c>>3, c&7
		v := math.Ldexp(float64(m)/8, -6)
		if e > 0 {
			v = math.Ldexp(1+float64(m)/8, e-7)
		}
		vals, codes = append(vals, v), append(codes, c)
	}
	return vals, codes
}

// nearestOnGrid rounds |v| to the nearest grid value (ties to the even
// code), saturating at the last, and gives it v's sign.
func nearestOnGrid(v float64, vals []float64, codes []int) float64 {
	a := math.Abs(v)
	best := 0
	for i := range vals {
		d, db := math.Abs(vals[i]-a), math.Abs(vals[best]-a)
		if d < db || d == db && codes[i]%2 == 0 && codes[best]%2 != 0 {
			best = i
		}
	}
	if a > vals[len(vals)-1] {
		best = len(vals) - 1
	}
	return math.Copysign(vals[best], v)
}

// simRef is the reference's block simulation in float64 on the grid: amax
// = max(|x|, floor) over each block, s = 2^ceil(log2(float32(amax)/qmax))
// (the quotient rounded to float32, as the kernel forms it), each value
// rounded on the grid after dividing by s and clamping to ±qmax.
func simRef(x []float32, block int, floor, qmax float64, vals []float64, codes []int) []float32 {
	out := make([]float32, len(x))
	for lo := 0; lo < len(x); lo += block {
		hi := min(lo+block, len(x))
		amax := floor
		for _, v := range x[lo:hi] {
			amax = math.Max(amax, math.Abs(float64(v)))
		}
		s := math.Ldexp(1, int(math.Ceil(math.Log2(float64(float32(amax)/float32(qmax))))))
		for i := lo; i < hi; i++ {
			q := math.Max(-qmax, math.Min(qmax, float64(x[i])/s))
			out[i] = float32(nearestOnGrid(q, vals, codes) * s)
		}
	}
	return out
}

// qatVector is test data with the shapes quantization meets: normal values
// over several decades, exact zeros, a block of tiny values (under act_quant's
// floor), values on the grid's midpoints and beyond its largest value.
func qatVector(n int, seed uint64) []float32 {
	rng := rand.New(rand.NewPCG(seed, 5))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(5)-2)))
	}
	for i := 0; i < n; i += 17 {
		x[i] = 0
	}
	for i := 64; i < min(n, 96); i++ {
		x[i] = float32(rng.NormFloat64() * 1e-6)
	}
	if n > 140 {
		x[130], x[131], x[132] = 448*3, 1.0625, -2.5 // a block whose amax makes s 4: 1.0625/4 and -2.5/4 sit on midpoints
	}
	return x
}

func TestFP8Sim(t *testing.T) {
	vals, codes := e4m3Grid()
	for _, tc := range []struct {
		name  string
		n     int
		block int
	}{{"act 128, partial last", 300, qatActBlock}, {"kv 64", 448, qatKVBlock}, {"one short block", 40, qatKVBlock}} {
		t.Run(tc.name, func(t *testing.T) {
			x := qatVector(tc.n, uint64(tc.n))
			want := simRef(x, tc.block, qatActMin, 448, vals, codes)
			got := slices.Clone(x)
			fp8Sim(got, tc.block)
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) && !(got[i] == 0 && want[i] == 0) {
					t.Fatalf("value %d (%g): got %g, want %g", i, x[i], got[i], want[i])
				}
			}
			again := slices.Clone(got)
			fp8Sim(again, tc.block)
			if !slices.Equal(again, got) {
				t.Error("a simulated vector is not a fixed point of the simulation")
			}
		})
	}
}

func TestFP4Sim(t *testing.T) {
	vals := []float64{0, 0.5, 1, 1.5, 2, 3, 4, 6}
	codes := []int{0, 1, 2, 3, 4, 5, 6, 7}
	x := qatVector(200, 9)
	want := simRef(x, qatFP4Block, 6*math.Ldexp(1, -126), 6, vals, codes)
	got := slices.Clone(x)
	fp4Sim(got)
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) && !(got[i] == 0 && want[i] == 0) {
			t.Fatalf("value %d (%g): got %g, want %g", i, x[i], got[i], want[i])
		}
	}
}

func TestPow2Ceil(t *testing.T) {
	for _, y := range []float32{1, 2, 0.5, 3, 1.0000001, 0.99999994, 448, 1e-30, 6e-38, 3e30, 0.75} {
		want := math.Ldexp(1, int(math.Ceil(math.Log2(float64(y)))))
		if got := pow2Ceil(y); float64(got) != want {
			t.Errorf("pow2Ceil(%g) = %g, want %g", y, got, want)
		}
	}
}

func TestHadamard(t *testing.T) {
	for _, n := range []int{1, 2, 32, 128} {
		x := qatVector(n, uint64(n))
		got := slices.Clone(x)
		hadamard(got)
		// H[i][j] = (-1)^popcount(i&j) / sqrt(n), in float64.
		worst := 0.0
		for i := range n {
			s := 0.0
			for j := range n {
				sign := 1.0
				if bitsSet(i&j)%2 == 1 {
					sign = -1
				}
				s += sign * float64(x[j])
			}
			s /= math.Sqrt(float64(n))
			worst = math.Max(worst, math.Abs(float64(got[i])-s))
		}
		norm := 0.0
		for _, v := range x {
			norm = math.Max(norm, math.Abs(float64(v)))
		}
		if worst > 1e-6*norm*math.Sqrt(float64(n)) {
			t.Errorf("n %d: max error %.3g against the Sylvester matrix (max |x| %.3g)", n, worst, norm)
		}
	}
}

func bitsSet(v int) int {
	n := 0
	for ; v != 0; v &= v - 1 {
		n++
	}
	return n
}

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
		actQuant(q, w.Cols())
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
	bf16Round(q)
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
	qat, pq, sq := run(QAT)
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
			if !onGrid(row, func(q []float32) { fp8Sim(q, qatKVBlock) }) {
				t.Fatalf("layer %d: window ring row %d is not on the KV simulation's grid", l, r)
			}
			kinds["ring"]++
		}
		for e := 0; e+cfg.HeadDim <= len(ls.ckv); e += cfg.HeadDim {
			row := ls.ckv[e : e+nope]
			if !onGrid(row, func(q []float32) { fp8Sim(q, qatKVBlock) }) {
				t.Fatalf("layer %d: compressed entry %d is not on the KV simulation's grid", l, e/cfg.HeadDim)
			}
			kinds["entries"]++
		}
		for e := 0; e+cfg.IndexHeadDim <= len(ls.ikeys); e += cfg.IndexHeadDim {
			row := ls.ikeys[e : e+cfg.IndexHeadDim]
			if !onGrid(row, fp4Sim) {
				t.Fatalf("layer %d: indexer key %d is not on the FP4 grid", l, e/cfg.IndexHeadDim)
			}
			kinds["index keys"]++
		}
	}
	if kinds["entries"] == 0 || kinds["index keys"] == 0 {
		t.Fatalf("checked %v: want compressed entries and indexer keys", kinds)
	}
	var diff, scale float64
	for i := range qat {
		diff = math.Max(diff, math.Abs(float64(qat[i]-exact[i])))
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
	tail := qat[len(qat)-V:]
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
