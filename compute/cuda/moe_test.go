package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"moxie/compute"
	"moxie/compute/computetest"
	"moxie/compute/ref"
)

// The fused MoE decode is checked against compute/ref in float64: every
// routed expert's w1, w3 and w2 products, ref.SwiGLU with the route weight
// and clamp, the shared expert, the sum. GPU tests skip without a device.

// moeCase is one MoE layer's weights on the host and the device.
type moeCase struct {
	D, I, Is   int
	w1, w3, w2 []compute.WeightData // per expert
	s1, s3, s2 compute.WeightData   // shared expert (Is > 0)
	tab        *ExpertTable
	sh         *SharedExpert
	deq        map[*byte][]float64 // dequantized weights by their first data byte, made on first use
}

func newMoECase(t *testing.T, e *fwdEnv, rng *rand.Rand, E, D, I, Is int) *moeCase {
	t.Helper()
	mc := &moeCase{D: D, I: I, Is: Is}
	up := func(d compute.WeightData) *DeviceWeight {
		w, err := e.c.UploadWeight(e.a, d)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	s1, s2 := 1/math.Sqrt(float64(D)), 1/math.Sqrt(float64(I))
	var d1, d3, d2 []*DeviceWeight
	for range E {
		a := randomWeightPar(rng.Uint64(), compute.MXFP4, I, D, s1)
		b := randomWeightPar(rng.Uint64(), compute.MXFP4, I, D, s1)
		c := randomWeightPar(rng.Uint64(), compute.MXFP4, D, I, s2)
		mc.w1, mc.w3, mc.w2 = append(mc.w1, a), append(mc.w3, b), append(mc.w2, c)
		d1, d3, d2 = append(d1, up(a)), append(d3, up(b)), append(d2, up(c))
	}
	var err error
	if mc.tab, err = e.c.PrepareExpertTable(e.a, d1, d3, d2); err != nil {
		t.Fatal(err)
	}
	if Is > 0 {
		mc.s1 = randomWeightPar(rng.Uint64(), compute.FP8Block, Is, D, s1)
		mc.s3 = randomWeightPar(rng.Uint64(), compute.FP8Block, Is, D, s1)
		mc.s2 = randomWeightPar(rng.Uint64(), compute.FP8Block, D, Is, 1/math.Sqrt(float64(Is)))
		mc.sh = &SharedExpert{W1: up(mc.s1), W3: up(mc.s3), W2: up(mc.s2)}
	}
	return mc
}

// ref computes the expected h rows (K routed, then the shared one if any)
// and out in float64.
func (mc *moeCase) ref(x []float32, ids []int, rw []float32, limit float64, shared bool) (h [][]float64, out []float64) {
	lin := func(d compute.WeightData, rows, cols int, v []float64) []float64 {
		if mc.deq == nil {
			mc.deq = map[*byte][]float64{}
		}
		W, ok := mc.deq[&d.Data[0]]
		if !ok {
			W = ref.ParallelDequant(d)
			mc.deq[&d.Data[0]] = W
		}
		return ref.ParallelLinear(W, rows, cols, v, 1)
	}
	xf := f64s(x)
	out = make([]float64, mc.D)
	add := func(y []float64) {
		for i, v := range y {
			out[i] += v
		}
	}
	for k, id := range ids {
		g := lin(mc.w1[id], mc.I, mc.D, xf)
		u := lin(mc.w3[id], mc.I, mc.D, xf)
		r := 1.0
		if rw != nil {
			r = float64(rw[k])
		}
		hk := ref.SwiGLU(g, u, r, limit)
		h = append(h, hk)
		add(lin(mc.w2[id], mc.D, mc.I, hk))
	}
	if shared {
		hs := ref.SwiGLU(lin(mc.s1, mc.Is, mc.D, xf), lin(mc.s3, mc.Is, mc.D, xf), 1, 0)
		h = append(h, hs)
		add(lin(mc.s2, mc.D, mc.Is, hs))
	}
	return h, out
}

// halfToFloat decodes an IEEE binary16 value.
func halfToFloat(h uint16) float64 {
	s := 1.0
	if h&0x8000 != 0 {
		s = -1
	}
	e, m := int(h>>10)&31, float64(h&0x3ff)
	switch e {
	case 0:
		return s * m * math.Ldexp(1, -24)
	case 31:
		if m != 0 {
			return math.NaN()
		}
		return s * math.Inf(1)
	}
	return s * (1 + m/1024) * math.Ldexp(1, e-15)
}

// readH reads m's h scratch back: K routed rows of I (routed layout) and
// the shared row of Is (natural layout), each value hi + lo·2^-11.
func readH(t *testing.T, e *fwdEnv, m *MoEDecode, K, I, Is int) [][]float32 {
	t.Helper()
	b := make([]byte, m.hBytes)
	if err := e.c.CopyFromDevice(b, m.h); err != nil {
		t.Fatal(err)
	}
	half := func(i int) float64 { return halfToFloat(binary.LittleEndian.Uint16(b[2*i:])) }
	var rows [][]float32
	for k := range K {
		base := k * 2 * I
		row := make([]float32, I)
		for i := range row {
			at := i&^7 | (i&3)<<1 | (i&7)>>2
			row[i] = float32(half(base+at) + half(base+I+at)/2048)
		}
		rows = append(rows, row)
	}
	if Is > 0 {
		base := K * 2 * I
		row := make([]float32, Is)
		for i := range row {
			row[i] = float32(half(base+i) + half(base+Is+i)/2048)
		}
		rows = append(rows, row)
	}
	return rows
}

func TestMoEDecode(t *testing.T) {
	shapes := []struct {
		name       string
		E, D, I, S int
		ids        []int
		limit      float32
	}{
		{"small", 8, 256, 128, 256, []int{3, 0, 7, 3, 5, 1}, 1.25},
		{"odd_spans", 5, 384, 384, 384, []int{4, 4, 0, 2, 1, 3}, 1.25},
		// V4-Flash widths (in -short too: each weight is dequantized once
		// and the products run on every CPU, ~0.5 s of reference on 16 cores).
		{"v4", 4, 4096, 2048, 2048, []int{2, 0, 3, 2, 1, 0}, 1.5},
	}
	for _, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			withFwd(t, func(e *fwdEnv) {
				rng := rand.New(rand.NewPCG(11, uint64(sh.D)))
				mc := newMoECase(t, e, rng, sh.E, sh.D, sh.I, sh.S)
				K := len(sh.ids)
				x := computetest.Normal(rng, sh.D, 1)
				rw := []float32{0.9, -0.3, 1.7, 0.25, 1.1, 0.6}
				dx, dids, drw := e.up(x), e.upInts(sh.ids), e.up(rw)
				out := e.poisoned(sh.D)
				for _, shared := range []bool{false, true} {
					for _, limit := range []float32{0, sh.limit} {
						hWant, want := mc.ref(x, sh.ids, rw, float64(limit), shared)
						var sx *SharedExpert
						is := 0
						if shared {
							sx, is = mc.sh, sh.S
						}
						for v := range moeVariantCount {
							name := fmt.Sprintf("shared=%v/limit=%g/%v", shared, limit, v)
							// Not a subtest: t.Run would move the case off the
							// device's locked OS thread (CUDA_ERROR_INVALID_CONTEXT).
							t.Logf("case %s", name)
							func(t *testing.T) {
								m, err := e.c.PrepareMoEDecode(e.a, mc.tab, K, sx, dx, out, limit, v)
								if err != nil {
									t.Fatal(err)
								}
								defer m.Free(e.a)
								if err := e.c.Memset(out, 0xff, 4*sh.D, e.c.Stream()); err != nil {
									t.Fatal(err)
								}
								if err := e.c.RunMoEDecode(m, dids, drw, e.c.Stream()); err != nil {
									t.Fatal(err)
								}
								got := e.down(out, sh.D)
								for k, hk := range readH(t, e, m, K, sh.I, is) {
									if r := computetest.MaxRel(hk, hWant[k]); !(r <= computetest.TolLinear) {
										t.Errorf("h row %d: max relative error %.3g > %.3g", k, r, computetest.TolLinear)
									}
								}
								if r := computetest.MaxRel(got, want); !(r <= computetest.TolLinear) {
									t.Errorf("out: max relative error %.3g > %.3g", r, computetest.TolLinear)
								} else {
									t.Logf("out: max relative error %.3g", r)
								}
								// A second run gives the same bits.
								if err := e.c.RunMoEDecode(m, dids, drw, e.c.Stream()); err != nil {
									t.Fatal(err)
								}
								again := e.down(out, sh.D)
								for i := range got {
									if math.Float32bits(got[i]) != math.Float32bits(again[i]) {
										t.Fatalf("out[%d]: %v then %v on a second run", i, got[i], again[i])
									}
								}
							}(t)
						}
					}
				}
			})
		})
	}
}

// TestMoEDecodeDevice checks the device-side contracts on a small layer,
// for every variant:
// a run captured in a CUDA graph follows ids and rw changed in device
// memory after the capture; a SetTableExpert repointing is seen by the next
// run; an id outside the table makes out NaN; rw 0 means weight 1.
func TestMoEDecodeDevice(t *testing.T) {
	withFwd(t, func(e *fwdEnv) {
		// Not subtests: t.Run would move the cases off the device's locked OS
		// thread (CUDA_ERROR_INVALID_CONTEXT).
		for v := range moeVariantCount {
			t.Logf("variant %v", v)
			const E, D, I, S = 6, 256, 128, 128
			rng := rand.New(rand.NewPCG(12, uint64(v)))
			mc := newMoECase(t, e, rng, E, D, I, S)
			x := computetest.Normal(rng, D, 1)
			dx, out := e.up(x), e.poisoned(D)
			ids0, rw0 := []int{1, 2, 3, 4}, []float32{0.5, 0.25, 0.125, 2}
			dids, drw := e.upInts(ids0), e.up(rw0)
			m, err := e.c.PrepareMoEDecode(e.a, mc.tab, 4, mc.sh, dx, out, 0.75, v)
			if err != nil {
				t.Fatal(err)
			}
			check := func(what string, ids []int, rw []float32) {
				t.Helper()
				_, want := mc.ref(x, ids, rw, 0.75, true)
				if r := computetest.MaxRel(e.down(out, D), want); !(r <= computetest.TolLinear) {
					t.Errorf("%v: %s: max relative error %.3g > %.3g", v, what, r, computetest.TolLinear)
				}
			}
			s := e.c.Stream()
			if err := e.c.BeginCapture(s); err != nil {
				t.Fatal(err)
			}
			if err := e.c.RunMoEDecode(m, dids, drw, s); err != nil {
				t.Fatal(err)
			}
			g, err := e.c.EndCapture(s)
			if err != nil {
				t.Fatal(err)
			}
			defer e.c.DestroyGraph(g)
			for _, c := range []struct {
				ids []int
				rw  []float32
			}{{ids0, rw0}, {[]int{5, 0, 5, 2}, []float32{1, 2, 3, 4}}} {
				if err := e.c.CopyToDevice(dids, e.intsBytes(c.ids)); err != nil {
					t.Fatal(err)
				}
				if err := e.c.CopyFloatsToDevice(drw, c.rw); err != nil {
					t.Fatal(err)
				}
				if err := e.c.LaunchGraph(g, s); err != nil {
					t.Fatal(err)
				}
				check(fmt.Sprintf("graph replay with ids %v", c.ids), c.ids, c.rw)
			}

			// Repoint expert 5 at new weights: the next run uses them.
			a := computetest.RandomWeight(rng, compute.MXFP4, I, D, 1/math.Sqrt(D))
			b := computetest.RandomWeight(rng, compute.MXFP4, I, D, 1/math.Sqrt(D))
			c := computetest.RandomWeight(rng, compute.MXFP4, D, I, 1/math.Sqrt(I))
			var ws []*DeviceWeight
			for _, d := range []compute.WeightData{a, b, c} {
				w, err := e.c.UploadWeight(e.a, d)
				if err != nil {
					t.Fatal(err)
				}
				ws = append(ws, w)
			}
			if err := e.c.SetTableExpert(e.a, mc.tab, 5, ws[0], ws[1], ws[2]); err != nil {
				t.Fatal(err)
			}
			mc.w1[5], mc.w3[5], mc.w2[5] = a, b, c
			if err := e.c.LaunchGraph(g, s); err != nil {
				t.Fatal(err)
			}
			check("after SetTableExpert(5)", []int{5, 0, 5, 2}, []float32{1, 2, 3, 4})

			// rw 0: weight 1.
			if err := e.c.RunMoEDecode(m, dids, 0, s); err != nil {
				t.Fatal(err)
			}
			check("rw 0", []int{5, 0, 5, 2}, nil)

			// An id outside the table poisons out.
			if err := e.c.CopyToDevice(dids, e.intsBytes([]int{0, E, 1, 2})); err != nil {
				t.Fatal(err)
			}
			if err := e.c.RunMoEDecode(m, dids, drw, s); err != nil {
				t.Fatal(err)
			}
			for i, o := range e.down(out, D) {
				if !math.IsNaN(float64(o)) {
					t.Fatalf("%v: id %d out of range: out[%d] = %v, want NaN", v, E, i, o)
				}
			}
		}
	})
}

func (e *fwdEnv) intsBytes(x []int) []byte {
	b := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(int32(v)))
	}
	return b
}

// TestMoEShapes checks PrepareMoEDecode's validation and the variant names
// (no device needed).
func TestMoEShapes(t *testing.T) {
	mx := func(r, c int) *DeviceWeight { return &DeviceWeight{Format: compute.MXFP4, Rows: r, Cols: c} }
	f8 := func(r, c, b int) *DeviceWeight {
		return &DeviceWeight{Format: compute.FP8Block, Rows: r, Cols: c, Block: b}
	}
	table := func(D, I int) *ExpertTable {
		return &ExpertTable{E: 8, Dim: D, Inter: I, w1: mx(I, D), w3: mx(I, D), w2: mx(D, I)}
	}
	good := table(4096, 2048)
	shared := &SharedExpert{W1: f8(2048, 4096, 128), W3: f8(2048, 4096, 128), W2: f8(4096, 2048, 128)}
	fp8tab := table(4096, 2048)
	fp8tab.w1 = f8(2048, 4096, 128)
	cases := []struct {
		name  string
		t     *ExpertTable
		K     int
		sh    *SharedExpert
		limit float32
		v     MoEVariant
		want  string // "" = valid
	}{
		{"v4", good, 6, shared, 10, MoEDefault, ""},
		{"v4 no shared", good, 6, nil, 0, MoECvt, ""},
		{"nil table", nil, 6, nil, 0, 0, "no expert table"},
		{"fp8 experts", fp8tab, 6, nil, 0, 0, "want mxfp4"},
		{"K 0", good, 0, nil, 0, 0, "K 0"},
		{"K 65", good, 65, nil, 0, 0, "K 65"},
		{"dim 4000", table(4000, 2048), 6, nil, 0, 0, "model dim 4000"},
		{"dim too big", table(16384, 2048), 6, nil, 0, 0, "model dim 16384"},
		{"inter 2000", table(4096, 2000), 6, nil, 0, 0, "expert width 2000"},
		{"limit NaN", good, 6, nil, float32(math.NaN()), 0, "limit NaN"},
		{"limit -1", good, 6, nil, -1, 0, "limit -1"},
		{"variant 99", good, 6, nil, 0, 99, "unknown variant 99"},
		{"persist dim 8192 shared", table(8192, 2048), 6, &SharedExpert{W1: f8(2048, 8192, 128), W3: f8(2048, 8192, 128), W2: f8(8192, 2048, 128)}, 0, MoEPersist, "variant persist with a shared expert takes a model dim up to 5632, not 8192"},
		{"persist dim 8192", table(8192, 2048), 6, nil, 0, MoEPersist, ""},
		{"default dim 8192 shared", table(8192, 2048), 6, &SharedExpert{W1: f8(2048, 8192, 128), W3: f8(2048, 8192, 128), W2: f8(8192, 2048, 128)}, 0, MoEDefault, ""},
		{"wide v4", good, 6, shared, 10, MoEWide, ""},
		{"wide K 20 no shared", good, 20, nil, 0, MoEWide1, ""},
		{"wide K 20 shared", good, 20, shared, 0, MoEWide, "variant wide keeps h in shared memory, 172032 bytes for K 20 x width 2048 + shared 2048, over 163840"},
		{"wide K 64", good, 64, nil, 0, MoEWide1, "variant wide1 keeps h in shared memory, 524288 bytes"},
		{"default K 64 shared", good, 64, shared, 0, MoEDefault, ""},
		{"wide1s v4", good, 6, shared, 10, MoEWide1S, ""},
		{"wide1s dim 8960", table(8960, 2048), 6, nil, 0, MoEWide1S, ""},
		{"wide1s dim 9088", table(9088, 2048), 6, nil, 0, MoEWide1S, "variant wide1s stages x and the scales (5·D bytes): model dim up to 8960, not 9088"},
		{"wide1 dim 9088", table(9088, 2048), 6, nil, 0, MoEWide1, ""},
		{"wide1ss v4", good, 6, shared, 10, MoEWide1SS, ""},
		{"wide1a v4", good, 6, shared, 10, MoEWide1A, ""},
		{"wide1p v4", good, 6, shared, 10, MoEWide1P, ""},
		{"wide1p K 18 no shared", good, 18, nil, 0, MoEWide1P, "variant wide1p keeps h in shared memory, 165888 bytes"},
		{"wide1a dim 9088", table(9088, 2048), 6, nil, 0, MoEWide1A, "variant wide1a stages x and the scales (5·D bytes): model dim up to 8960, not 9088"},
		{"wide1ss K 17 no shared", good, 17, nil, 0, MoEWide1SS, ""},
		{"wide1ss K 18 no shared", good, 18, nil, 0, MoEWide1SS, "variant wide1ss keeps h in shared memory, 165888 bytes for K 18 x width 2048 + shared 0, over 163840"},
		{"wide1ss dim 9088", table(9088, 2048), 6, nil, 0, MoEWide1SS, "model dim up to 8960, not 9088"},
		{"lean v4", good, 6, shared, 10, MoELean, ""},
		{"lean K 64 shared", good, 64, shared, 0, MoELean, ""},
		{"lean dim 11264", table(11264, 2048), 6, nil, 0, MoELean, ""},
		{"leanpf v4", good, 6, shared, 10, MoELeanPF, ""},
		{"leanx v4", good, 6, shared, 10, MoELeanX, ""},
		{"leanx2 v4", good, 6, shared, 10, MoELeanX2, ""},
		{"leanx2p v4", good, 6, shared, 10, MoELeanX2P, ""},
		{"leanx2 K 64 shared", good, 64, shared, 0, MoELeanX2, ""},
		{"leanx2 dim 11264", table(11264, 2048), 6, nil, 0, MoELeanX2, ""},
		{"shared missing w2", good, 6, &SharedExpert{W1: shared.W1, W3: shared.W3}, 0, 0, "lacks a weight"},
		{"shared mxfp4", good, 6, &SharedExpert{W1: mx(2048, 4096), W3: shared.W3, W2: shared.W2}, 0, 0, "shared expert w1 is mxfp4, want fp8"},
		{"shared w3 shape", good, 6, &SharedExpert{W1: shared.W1, W3: f8(2048, 2048, 128), W2: shared.W2}, 0, 0, "w3 is [2048, 2048], want [2048, 4096]"},
		{"shared w2 shape", good, 6, &SharedExpert{W1: shared.W1, W3: shared.W3, W2: f8(2048, 4096, 128)}, 0, 0, "w2 is [2048, 4096], want [4096, 2048]"},
		{"shared block mix", good, 6, &SharedExpert{W1: shared.W1, W3: f8(2048, 4096, 64), W2: shared.W2}, 0, 0, "blocks of 64, w1 of 128"},
		{"shared block 32", good, 6, &SharedExpert{W1: f8(2048, 4096, 32), W3: f8(2048, 4096, 32), W2: f8(4096, 2048, 32)}, 0, 0, "FP8 block 32"},
		{"shared width 2112", good, 6, &SharedExpert{W1: f8(2112, 4096, 64), W3: f8(2112, 4096, 64), W2: f8(4096, 2112, 64)}, 0, 0, "shared expert width 2112"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := moeShapes(c.t, c.K, c.sh, c.limit, c.v)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("want no error, got %v", err)
			case c.want != "" && err == nil:
				t.Fatalf("want an error containing %q, got none", c.want)
			case c.want != "" && !strings.Contains(err.Error(), c.want):
				t.Fatalf("error %q does not contain %q", err, c.want)
			}
		})
	}
	if is, bs, err := moeShapes(good, 6, shared, 10, MoEDefault); err != nil || is != 2048 || bs != 7 {
		t.Errorf("v4 with shared expert: Is %d, block shift %d, err %v; want 2048, 7, nil", is, bs, err)
	}
	if v, err := ParseMoEVariant(""); err != nil || v != MoEPreferred {
		t.Errorf(`ParseMoEVariant("") = %v, %v; want MoEPreferred (%v)`, v, err, MoEPreferred)
	}
	if _, err := ParseMoEVariant("u9"); err == nil || !strings.Contains(err.Error(), `"u9"`) {
		t.Errorf(`ParseMoEVariant("u9"): error %v, want one naming "u9"`, err)
	}
	// h (hi/lo f16 of 6 routed rows of 2048 and the shared row), then the
	// split stage 2's room: 3 blocks' float32 partials of 4096 rows and
	// 256 row groups' uint32 tickets.
	if n, want := MoEDecodeScratch(good, 6, shared), 4*(6*2048+2048)+4*3*4096+4*256; n != want {
		t.Errorf("MoEDecodeScratch = %d, want %d", n, want)
	}
	// Every variant's allocation fits MoEDecodeScratch (dsv4 sizes its
	// arena by it), and a split stage 2 runs split·D/16 blocks of nw warps.
	for v := range moeVariantCount {
		p := moeVariants[v]
		need := 4 * (6*2048 + 2048)
		if p.split > 0 {
			need += 4*p.split*4096 + 4*(4096/16)
			if p.split > moeSplitMax || p.nw <= 0 || !p.lean {
				t.Errorf("variant %v: split %d over %d warps (lean %v): want a lean variant, split up to moeSplitMax %d", v, p.split, p.nw, p.lean, moeSplitMax)
			}
			if _, t2 := v.threads(); int(t2) != 32*p.nw {
				t.Errorf("variant %v: stage 2 threads %d, want %d", v, t2, 32*p.nw)
			}
		}
		if p.sh2 {
			need += 4*64*(2048/16) + 4*(2048/16) // the shared halves' sums and tickets
			if p.split > 0 {
				t.Errorf("variant %v: shared halves and a split stage 2 would share the partials' room", v)
			}
		}
		if n := MoEDecodeScratch(good, 6, shared); n < need {
			t.Errorf("variant %v needs %d bytes of scratch, MoEDecodeScratch gives %d", v, need, n)
		}
	}
	// The lean stage 1's shared memory: 4 warps x (x hi/lo over 1024
	// columns, 4 bytes each, + 8 groups of 128 bytes of scales) at D 4096;
	// at D 384 a shared warp's 2 spans (128 columns) and a routed warp's
	// one group.
	for _, c := range []struct{ D, want int }{{4096, 4 * (4*1024 + 8*128)}, {384, 4 * (4*128 + 128)}, {640, 4 * (4*256 + 2*128)}} {
		if n := moeLean1Smem(c.D); n != c.want {
			t.Errorf("moeLean1Smem(%d) = %d, want %d", c.D, n, c.want)
		}
	}
	names := map[string]bool{}
	for v := range moeVariantCount {
		if p, err := ParseMoEVariant(v.String()); err != nil || p != v {
			t.Errorf("ParseMoEVariant(%q) = %v, %v; want %d", v.String(), p, err, int(v))
		}
		n1, n2 := moeKernelNames(v)
		if names[n1+n2] {
			t.Errorf("variant %v repeats kernels %s, %s", v, n1, n2)
		}
		names[n1+n2] = true
	}
}

// TestMoERunChecks checks RunMoEDecode's argument checks (no device needed:
// they come before any launch).
func TestMoERunChecks(t *testing.T) {
	var c *Ctx
	for _, tc := range []struct {
		name string
		m    *MoEDecode
		ids  DevicePtr
	}{
		{"nil decode", nil, 256},
		{"freed decode", &MoEDecode{}, 256},
		{"nil ids", &MoEDecode{h: 256}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := c.RunMoEDecode(tc.m, tc.ids, 0, Stream{}); err == nil || !strings.Contains(err.Error(), "cuda moe decode") {
				t.Fatalf("RunMoEDecode: error %v, want a cuda moe decode error", err)
			}
		})
	}
}

// TestHCEpilogueChecks checks which variants have the boundary's epilogue and
// what RunMoEDecodeHC refuses before it touches the device.
func TestHCEpilogueChecks(t *testing.T) {
	for v, want := range map[MoEVariant]string{MoELeanX: "moe2lh_g1_f1_d0_b2", MoELean: "moe2lh_g1_f1_d0_b2", MoELeanXW: "moe2lhw_g1_f1_d0_b2",
		MoELeanPF: "", MoELeanX2: "", MoELeanXG2: "", MoELeanXE: "", MoEWide1: "", MoEDefault: ""} {
		if got := moeHCKernelName(v); got != want {
			t.Errorf("moeHCKernelName(%v) = %q, want %q", v, got, want)
		}
	}
	const D = 256
	fn := &DeviceWeight{Format: compute.F32, Rows: 24, Cols: 4 * D, Data: 0x10000}
	site := &HC{Fn: fn, HC: 4}
	ok := func() *HCEpilogue {
		return &HCEpilogue{X: 0x1000, Post: 0x2000, Comb: 0x3000, XOut: 0x4000, Part: 0x5000, Fn: site}
	}
	if _, err := hcEpilogueArgs("test", ok(), D, 0x9000, 0xa000); err != nil {
		t.Fatalf("a valid boundary: %v", err)
	}
	for _, c := range []struct {
		name string
		mod  func(h *HCEpilogue)
		want string
	}{
		{"nil site", func(h *HCEpilogue) { h.Fn = nil }, "nil boundary"},
		{"hc 2", func(h *HCEpilogue) { h.Fn = &HC{Fn: fn, HC: 2} }, "want HC 4"},
		{"head rows", func(h *HCEpilogue) {
			h.Fn = &HC{Fn: &DeviceWeight{Format: compute.F32, Rows: 4, Cols: 4 * D, Data: 0x10000}, HC: 4}
		}, "Fn [24, 1024]"},
		{"bf16", func(h *HCEpilogue) {
			h.Fn = &HC{Fn: &DeviceWeight{Format: compute.BF16, Rows: 24, Cols: 4 * D, Data: 0x10000}, HC: 4}
		}, "want f32"},
		{"null part", func(h *HCEpilogue) { h.Part = 0 }, "null"},
		{"misaligned x", func(h *HCEpilogue) { h.X += 4 }, "16-byte aligned"},
		{"xout aliases x", func(h *HCEpilogue) { h.XOut = h.X }, "aliases"},
		{"xout aliases the output", func(h *HCEpilogue) { h.XOut = 0xa000 }, "aliases"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := ok()
			c.mod(h)
			_, err := hcEpilogueArgs("test", h, D, 0x9000, 0xa000)
			if err == nil || !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(c.want)) {
				t.Errorf("hcEpilogueArgs: %v, want an error with %q", err, c.want)
			}
		})
	}
	var c Ctx
	if err := c.RunMoEDecodeHC(&MoEDecode{variant: MoELeanX2}, 0x100, 0x200, ok(), Stream{}); err == nil || !strings.Contains(err.Error(), "no boundary epilogue") {
		t.Errorf("RunMoEDecodeHC on %v: %v, want a refusal", MoELeanX2, err)
	}
	if err := c.LaunchGemvHC(&Gemv{}, ok(), Stream{}); err == nil || !strings.Contains(err.Error(), "has none") {
		t.Errorf("LaunchGemvHC without the epilogue kernel: %v, want a refusal", err)
	}
	if err := c.LaunchGemvCollapse(&Gemv{}, &HCCollapse{XS: 0x1000, Part: 0x2000, Site: site}, Stream{}); err == nil || !strings.Contains(err.Error(), "cannot form its x") {
		t.Errorf("LaunchGemvCollapse without the collapse kernel: %v, want a refusal", err)
	}
}

// TestHCEpilogueDevice runs the boundary that a producer begins in its
// epilogue (RunMoEDecodeHC or LaunchGemvHC, then HCMixNormTiles) beside the
// plain path (RunMoEDecode or LaunchGemv, then HCMixNorm: the two-kernel
// boundary, checked against the unfused ops by TestFuseHCNorm) on the same
// inputs, for a fused MoE decode (MoELeanX's stage 2, and MoELeanXW's,
// which waits inside: "moew") and a one-token FP8 product, at V4's width
// and a small one: the output and x' must be the same bits, pre, post, comb
// and a within 2e-6 (the gates' dot products add in another order), and a
// captured graph of the new path must replay to the bits of its direct run;
// MoELeanXW's output must also be MoELeanX's bits.
func TestHCEpilogueDevice(t *testing.T) {
	withFwd(t, func(e *fwdEnv) {
		for _, producer := range []string{"moe", "moew", "gemv"} {
			for _, D := range []int{4096, 256} {
				testHCEpilogue(t, e, producer, D)
			}
		}
	})
}

// replayCaptured captures enqueue's launches on s as a CUDA graph, replays
// it n times, waits for s and destroys the graph.
func (e *fwdEnv) replayCaptured(t *testing.T, s Stream, enqueue func() error, n int) {
	t.Helper()
	if err := e.c.BeginCapture(s); err != nil {
		t.Fatal(err)
	}
	err := enqueue()
	g, err2 := e.c.EndCapture(s)
	if err != nil || err2 != nil {
		t.Fatal(err, err2)
	}
	defer e.c.DestroyGraph(g)
	for range n {
		if err := e.c.LaunchGraph(g, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.c.Sync(s); err != nil {
		t.Fatal(err)
	}
}

// newHCBoundary makes a random V4 mix site (HC 4, F32 Fn [24, 4·D]) and a
// boundary's inputs on the device: the streams X [4, D], the previous
// boundary's post [4] and comb [4, 4], and an RMSNorm weight w [D].
func newHCBoundary(t *testing.T, e *fwdEnv, rng *rand.Rand, D int) (p *HC, X, post, comb, w DevicePtr) {
	t.Helper()
	const hc, nm = 4, 24
	fnw, err := e.c.UploadWeight(e.a, computetest.RandomWeight(rng, compute.F32, nm, hc*D, 0.3/math.Sqrt(float64(hc*D))))
	if err != nil {
		t.Fatal(err)
	}
	scale := computetest.Normal(rng, 3, 1)
	scale[2] = 4
	p = &HC{Fn: fnw, Base: e.up(computetest.Normal(rng, nm, 1)), Scale: e.up(scale), HC: hc, Iters: 20, Eps: 1e-6, NormEps: 1e-6}
	post0, comb0 := make([]float32, hc), make([]float32, hc*hc)
	for i := range post0 {
		post0[i] = 2 * rng.Float32()
	}
	for i := range comb0 {
		comb0[i] = rng.Float32() / hc
	}
	return p, e.up(computetest.Normal(rng, hc*D, 1)), e.up(post0), e.up(comb0), e.up(computetest.Normal(rng, D, 1))
}

func testHCEpilogue(t *testing.T, e *fwdEnv, producer string, D int) {
	const E, K, I, Is, hc, cols = 8, 6, 256, 256, 4, 2048
	rng := rand.New(rand.NewPCG(77, uint64(D)))
	p, dX, dpost, dcomb, dw := newHCBoundary(t, e, rng, D)
	// The producer: plain and epilogue launches writing out.
	var plain func(out DevicePtr) (func(Stream) error, error)
	var epi func(out DevicePtr, h *HCEpilogue) (func(Stream) error, error)
	var ref func() []float32 // another path's output that must be the same bits ("moew": MoELeanX's)
	switch producer {
	case "moe", "moew":
		mc := newMoECase(t, e, rng, E, D, I, Is)
		dx := e.up(computetest.Normal(rng, D, 1))
		dids, drw := e.upInts([]int{1, 3, 5, 7, 0, 2}), e.up([]float32{0.5, 0.25, 0.125, 2, 1, 0.75})
		v := MoELeanX
		if producer == "moew" {
			v = MoELeanXW
		}
		prepV := func(out DevicePtr, v MoEVariant) (*MoEDecode, error) {
			m, err := e.c.PrepareMoEDecode(e.a, mc.tab, K, mc.sh, dx, out, 0.75, v)
			if err == nil && !m.HasHCEpilogue() {
				err = fmt.Errorf("%v has no boundary epilogue", v)
			}
			return m, err
		}
		prep := func(out DevicePtr) (*MoEDecode, error) { return prepV(out, v) }
		if v != MoELeanX {
			ref = func() []float32 {
				out := e.poisoned(D)
				m, err := prepV(out, MoELeanX)
				if err == nil {
					err = e.c.RunMoEDecode(m, dids, drw, e.c.Stream())
				}
				if err != nil {
					t.Fatal(err)
				}
				return e.down(out, D)
			}
		}
		plain = func(out DevicePtr) (func(Stream) error, error) {
			m, err := prep(out)
			return func(s Stream) error { return e.c.RunMoEDecode(m, dids, drw, s) }, err
		}
		epi = func(out DevicePtr, h *HCEpilogue) (func(Stream) error, error) {
			m, err := prep(out)
			return func(s Stream) error { return e.c.RunMoEDecodeHC(m, dids, drw, h, s) }, err
		}
	case "gemv":
		w, err := e.c.UploadWeight(e.a, computetest.RandomWeight(rng, compute.FP8Block, D, cols, 1/math.Sqrt(cols)))
		if err != nil {
			t.Fatal(err)
		}
		dx := e.up(computetest.Normal(rng, cols, 1))
		prep := func(out DevicePtr) (*Gemv, error) {
			g, err := e.c.PrepareGemv([]GemvProj{{W: w, Y: out, X: dx, Groups: 1}}, GemvVariant{MMA: true, U: gemvmHCU})
			if err == nil && !g.HasHCEpilogue() {
				err = fmt.Errorf("the [%d, %d] product has no boundary epilogue", D, cols)
			}
			return g, err
		}
		plain = func(out DevicePtr) (func(Stream) error, error) {
			g, err := prep(out)
			return func(s Stream) error { return e.c.LaunchGemv(g, s) }, err
		}
		epi = func(out DevicePtr, h *HCEpilogue) (func(Stream) error, error) {
			g, err := prep(out)
			return func(s Stream) error { return e.c.LaunchGemvHC(g, h, s) }, err
		}
	}
	type res struct{ out, xs, pre, post, comb, a []float32 }
	s := e.c.Stream()
	run := func(withEpi, graph bool) res {
		out, xs := e.poisoned(D), e.poisoned(hc*D)
		pre, post, comb, a := e.poisoned(hc), e.poisoned(hc), e.poisoned(hc*hc), e.poisoned(D)
		scratch, err := e.a.Alloc(max(HCNormScratchBytes(hc, D, 1), HCEpiloguePartBytes(D)))
		if err != nil {
			t.Fatal(err)
		}
		nb := &HCNorm{X: dX, O: out, Post: dpost, Comb: dcomb, XOut: xs, Pre: pre, PostOut: post, CombOut: comb, A: a, Norm: dw, Eps: 1e-6, Scratch: scratch, T: 1}
		var launch func(Stream) error
		if withEpi {
			launch, err = epi(out, &HCEpilogue{X: dX, Post: dpost, Comb: dcomb, XOut: xs, Part: scratch, Fn: p})
		} else {
			launch, err = plain(out)
		}
		if err != nil {
			t.Fatal(err)
		}
		enqueue := func() error {
			if err := launch(s); err != nil {
				return err
			}
			if withEpi {
				return e.c.HCMixNormTiles(nb, p, s)
			}
			return e.c.HCMixNorm(nb, p, s)
		}
		if graph {
			e.replayCaptured(t, s, enqueue, 2)
		} else if err := enqueue(); err != nil {
			t.Fatal(err)
		}
		return res{e.down(out, D), e.down(xs, hc*D), e.down(pre, hc), e.down(post, hc), e.down(comb, hc*hc), e.down(a, D)}
	}
	old, got, gotG := run(false, false), run(true, false), run(true, true)
	if !slices.Equal(old.out, got.out) || !slices.Equal(old.xs, got.xs) {
		t.Errorf("%s D %d: out or x' differ from the plain path's bits", producer, D)
	}
	if ref != nil && !slices.Equal(ref(), old.out) {
		t.Errorf("%s D %d: out differs from MoELeanX's bits", producer, D)
	}
	for _, c := range []struct {
		what      string
		got, want []float32
	}{{"pre", got.pre, old.pre}, {"post", got.post, old.post}, {"comb", got.comb, old.comb}, {"a", got.a, old.a}} {
		want := make([]float64, len(c.want))
		for j, v := range c.want {
			want[j] = float64(v)
		}
		r := computetest.MaxRel(c.got, want)
		if !(r <= 2e-6) {
			t.Errorf("%s D %d: %s: max relative difference %.3g from the plain path (limit 2e-6)", producer, D, c.what, r)
		}
		t.Logf("%s D %d: %s within %.3g of the plain path's", producer, D, c.what, r)
	}
	for _, c := range [][2][]float32{{got.out, gotG.out}, {got.xs, gotG.xs}, {got.pre, gotG.pre}, {got.comb, gotG.comb}, {got.a, gotG.a}} {
		if !slices.Equal(c[0], c[1]) {
			t.Errorf("%s D %d: a graph replay differs from the direct run", producer, D)
			break
		}
	}
}

// TestHCCollapseDevice checks LaunchGemvCollapse on the device: after a
// fused MoE decode began the next boundary with the Gram rows
// (RunMoEDecodeHC, HCEpilogue.Gram) and HCMixNormTiles finished it, two
// one-token FP8 products on the boundary's output formed in the launch
// (gemvmc) against the same products on the finish's A (LaunchGemv): within
// 5e-6 (a's RMS comes from the Gram rows), and a captured graph of the
// whole chain replays to its direct run's bits.
func TestHCCollapseDevice(t *testing.T) {
	withFwd(t, func(e *fwdEnv) {
		const E, K, I, Is, hc, D = 8, 6, 256, 256, 4, 4096
		rng := rand.New(rand.NewPCG(91, 5))
		mc := newMoECase(t, e, rng, E, D, I, Is)
		p, dX, dpost, dcomb, dw := newHCBoundary(t, e, rng, D)
		up := func(d compute.WeightData) *DeviceWeight {
			w, err := e.c.UploadWeight(e.a, d)
			if err != nil {
				t.Fatal(err)
			}
			return w
		}
		wa := up(computetest.RandomWeight(rng, compute.FP8Block, 1024, D, 1/math.Sqrt(D)))
		wb := up(computetest.RandomWeight(rng, compute.FP8Block, 512, D, 1/math.Sqrt(D)))
		dx := e.up(computetest.Normal(rng, D, 1))
		dids, drw := e.upInts([]int{1, 3, 5, 7, 0, 2}), e.up([]float32{0.5, 0.25, 0.125, 2, 1, 0.75})
		out, xs := e.poisoned(D), e.poisoned(hc*D)
		pre, post, comb, a := e.poisoned(hc), e.poisoned(hc), e.poisoned(hc*hc), e.poisoned(D)
		scratch, err := e.a.Alloc(max(HCNormScratchBytes(hc, D, 1), HCEpiloguePartBytes(D)))
		if err != nil {
			t.Fatal(err)
		}
		m, err := e.c.PrepareMoEDecode(e.a, mc.tab, K, mc.sh, dx, out, 0.75, MoELeanX)
		if err != nil {
			t.Fatal(err)
		}
		ya, yb, ca, cb := e.poisoned(1024), e.poisoned(512), e.poisoned(1024), e.poisoned(512)
		mma := GemvVariant{MMA: true, U: gemvmHCU}
		gp, err := e.c.PrepareGemv([]GemvProj{{W: wa, Y: ya, X: a, Groups: 1}, {W: wb, Y: yb, X: a, Groups: 1}}, mma)
		if err != nil {
			t.Fatal(err)
		}
		gc, err := e.c.PrepareGemv([]GemvProj{{W: wa, Y: ca, X: a, Groups: 1}, {W: wb, Y: cb, X: a, Groups: 1}}, mma)
		if err != nil {
			t.Fatal(err)
		}
		if !gc.HasCollapse() {
			t.Fatalf("the [1024, %d] + [512, %d] products cannot form their x", D, D)
		}
		s := e.c.Stream()
		enqueue := func() error {
			h := &HCEpilogue{X: dX, Post: dpost, Comb: dcomb, XOut: xs, Part: scratch, Fn: p, Gram: true}
			if err := e.c.RunMoEDecodeHC(m, dids, drw, h, s); err != nil {
				return err
			}
			nb := &HCNorm{X: dX, O: out, Post: dpost, Comb: dcomb, XOut: xs, Pre: pre, PostOut: post, CombOut: comb, A: a, Norm: dw, Eps: 1e-6, Scratch: scratch, T: 1}
			if err := e.c.HCMixNormTiles(nb, p, s); err != nil {
				return err
			}
			if err := e.c.LaunchGemvCollapse(gc, &HCCollapse{XS: xs, Part: scratch, Site: p, Norm: dw, Eps: 1e-6}, s); err != nil {
				return err
			}
			return e.c.LaunchGemv(gp, s)
		}
		if err := enqueue(); err != nil {
			t.Fatal(err)
		}
		direct := [][]float32{e.down(ca, 1024), e.down(cb, 512)}
		for i, c := range []struct {
			what      string
			got, want []float32
		}{{"[1024] product", direct[0], e.down(ya, 1024)}, {"[512] product", direct[1], e.down(yb, 512)}} {
			want := make([]float64, len(c.want))
			for j, v := range c.want {
				want[j] = float64(v)
			}
			r := computetest.MaxRel(c.got, want)
			if !(r <= 5e-6) {
				t.Errorf("%s on the collapse formed in the launch: max relative difference %.3g from the product on the finish's a (limit 5e-6)", c.what, r)
			}
			t.Logf("product %d: within %.3g of the product on the finish's a", i, r)
		}
		e.replayCaptured(t, s, enqueue, 2)
		if !slices.Equal(direct[0], e.down(ca, 1024)) || !slices.Equal(direct[1], e.down(cb, 512)) {
			t.Errorf("a graph replay of the collapse chain differs from the direct run")
		}
	})
}
