// Package computetest is the compliance suite of compute.Backend: RunAll runs
// every operation on random inputs (shapes that cross the FP8 128-block and
// MXFP4 32-column edges) and compares it with the float64 reference in
// compute/ref. Every backend's test calls RunAll.
//
// Tolerances (stated per op below) are on max|got−want| / max|want|: float32
// arithmetic against a float64 reference on the same stored weights.
package computetest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"moxie/compute"
	"moxie/compute/ref"
)

// Tolerances on the max-relative error, per op family.
const (
	TolLinear    = 2e-5 // float32 dot products of up to a few hundred terms
	TolElemwise  = 1e-5 // norms, collapses, RoPE, SwiGLU, pooling
	TolHCMix     = 2e-5 // projection + 20 Sinkhorn rounds in float32
	TolAttention = 2e-5
)

func f64(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

// MaxRel returns max|got−want| / max|want| (absolute error if want is all zero).
func MaxRel(got []float32, want []float64) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var e, m float64
	for i := range got {
		if math.IsNaN(float64(got[i])) != math.IsNaN(want[i]) {
			return math.Inf(1)
		}
		e = math.Max(e, math.Abs(float64(got[i])-want[i]))
		m = math.Max(m, math.Abs(want[i]))
	}
	if m == 0 {
		return e
	}
	return e / m
}

func expect(t *testing.T, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	if r := MaxRel(got, want); !(r <= tol) {
		t.Errorf("%s: max relative error %.3g > %.3g", what, r, tol)
	}
}

func bind(t *testing.T, b compute.Backend, d compute.WeightData) compute.Weight {
	t.Helper()
	w, err := b.Bind(d)
	if err != nil {
		t.Fatalf("Bind(%s [%d, %d]): %v", d.Format, d.Rows, d.Cols, err)
	}
	return w
}

// RunAll runs the whole suite against b.
func RunAll(t *testing.T, b compute.Backend) {
	t.Run("Bind", func(t *testing.T) { testBind(t, b) })
	t.Run("Linear", func(t *testing.T) { testLinear(t, b) })
	t.Run("LinearMany", func(t *testing.T) { testLinearMany(t, b) })
	t.Run("GroupedLinear", func(t *testing.T) { testGrouped(t, b) })
	t.Run("RMSNorm", func(t *testing.T) { testRMSNorm(t, b) })
	t.Run("HCMix", func(t *testing.T) { testHCMix(t, b) })
	t.Run("HCMixHand", func(t *testing.T) { testHCMixHand(t, b) })
	t.Run("HCHeadPre", func(t *testing.T) { testHCHead(t, b) })
	t.Run("HCCollapseExpand", func(t *testing.T) { testHCCollapseExpand(t, b) })
	t.Run("RoPE", func(t *testing.T) { testRoPE(t, b) })
	t.Run("Attention", func(t *testing.T) { testAttention(t, b) })
	t.Run("CompressPool", func(t *testing.T) { testCompressPool(t, b) })
	t.Run("IndexScores", func(t *testing.T) { testIndexScores(t, b) })
	t.Run("Route", func(t *testing.T) { testRoute(t, b) })
	t.Run("SwiGLU", func(t *testing.T) { testSwiGLU(t, b) })
}

func testBind(t *testing.T, b compute.Backend) {
	rng := rand.New(rand.NewPCG(1, 1))
	good := RandomWeight(rng, compute.FP8Block, 130, 200, 1)
	cases := []struct {
		name string
		mod  func(d *compute.WeightData)
	}{
		{"short data", func(d *compute.WeightData) { d.Data = d.Data[:len(d.Data)-1] }},
		{"short scale", func(d *compute.WeightData) { d.Scale = d.Scale[:len(d.Scale)-1] }},
		{"zero block", func(d *compute.WeightData) { d.Block = 0 }},
		{"bad rows", func(d *compute.WeightData) { d.Rows = 0 }},
		{"unknown format", func(d *compute.WeightData) { d.Format = 99 }},
	}
	if _, err := b.Bind(good); err != nil {
		t.Fatalf("valid weight rejected: %v", err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := good
			tc.mod(&d)
			if _, err := b.Bind(d); err == nil {
				t.Fatal("Bind accepted an inconsistent weight")
			}
		})
	}
}

func testLinear(t *testing.T, b compute.Backend) {
	cases := []struct {
		f          compute.Format
		rows, cols int
	}{
		{compute.FP8Block, 200, 300}, {compute.FP8Block, 5, 128}, {compute.MXFP4, 70, 96},
		{compute.MXFP4, 130, 160}, {compute.MXFP8, 40, 100}, {compute.BF16, 33, 50}, {compute.F32, 17, 260},
	}
	for i, tc := range cases {
		for _, batch := range []int{1, 3} {
			t.Run(fmt.Sprintf("%s_%dx%d_b%d", tc.f, tc.rows, tc.cols, batch), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(i), uint64(batch)))
				d := RandomWeight(rng, tc.f, tc.rows, tc.cols, 0.05)
				w := bind(t, b, d)
				if w.Rows() != tc.rows || w.Cols() != tc.cols {
					t.Fatalf("bound shape [%d, %d], want [%d, %d]", w.Rows(), w.Cols(), tc.rows, tc.cols)
				}
				x := Normal(rng, batch*tc.cols, 1)
				y := make([]float32, batch*tc.rows)
				b.Linear(w, y, x, batch)
				want := ref.Linear(ref.Dequant(d), tc.rows, tc.cols, f64(x), batch)
				expect(t, "Linear", y, want, TolLinear)
				// The same bytes at an odd address (a tensor inside a mapped file).
				u := d
				u.Data = append(make([]byte, 1, len(d.Data)+1), d.Data...)[1:]
				b.Linear(bind(t, b, u), y, x, batch)
				expect(t, "Linear unaligned", y, want, TolLinear)
			})
		}
	}
}

// testLinearMany: a backend's ManyLinear gives Linear's bits for every
// product, whatever the formats and shapes joined (skipped where the
// backend has none).
func testLinearMany(t *testing.T, b compute.Backend) {
	ml, ok := b.(compute.ManyLinear)
	if !ok {
		t.Skipf("%s does not implement compute.ManyLinear", b.Name())
	}
	shapes := []struct {
		f          compute.Format
		rows, cols int
	}{
		{compute.MXFP4, 130, 160}, {compute.FP8Block, 200, 300}, {compute.MXFP8, 40, 100},
		{compute.BF16, 33, 50}, {compute.F32, 17, 260}, {compute.MXFP4, 2048, 256},
	}
	for _, set := range [][]int{{0}, {0, 0}, {5, 1}, {0, 1, 2, 3, 4, 5}} {
		t.Run(fmt.Sprint(set), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(len(set)), 7))
			jobs := make([]compute.LinearJob, len(set))
			want := make([][]float32, len(set))
			for i, k := range set {
				sh := shapes[k]
				w := bind(t, b, RandomWeight(rng, sh.f, sh.rows, sh.cols, 0.05))
				x := Normal(rng, sh.cols, 1)
				want[i] = make([]float32, sh.rows)
				b.Linear(w, want[i], x, 1)
				jobs[i] = compute.LinearJob{W: w, Y: make([]float32, sh.rows), X: x}
			}
			ml.LinearMany(jobs)
			for i, j := range jobs {
				for r := range j.Y {
					if math.Float32bits(j.Y[r]) != math.Float32bits(want[i][r]) {
						t.Fatalf("product %d (%s), row %d: %v, want Linear's %v", i, shapes[set[i]].f, r, j.Y[r], want[i][r])
					}
				}
			}
		})
	}
}

func testGrouped(t *testing.T, b compute.Backend) {
	const rows, cols = 80, 144
	for _, f := range []compute.Format{compute.FP8Block, compute.MXFP8} {
		for _, groups := range []int{1, 2, 4} {
			for _, batch := range []int{1, 3} {
				t.Run(fmt.Sprintf("%s_g%d_b%d", f, groups, batch), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(2, uint64(groups*10+batch)))
					d := RandomWeight(rng, f, rows, cols, 0.05)
					w := bind(t, b, d)
					x := Normal(rng, batch*groups*cols, 1)
					y := make([]float32, batch*rows)
					b.GroupedLinear(w, y, x, batch, groups)
					expect(t, "GroupedLinear", y, ref.GroupedLinear(ref.Dequant(d), rows, cols, f64(x), batch, groups), TolLinear)
				})
			}
		}
	}
}

func testRMSNorm(t *testing.T, b compute.Backend) {
	rng := rand.New(rand.NewPCG(3, 3))
	const dim = 96
	x := Normal(rng, 4*dim, 3)
	w := Normal(rng, dim, 1)
	for _, weighted := range []bool{true, false} {
		t.Run(fmt.Sprint("weighted=", weighted), func(t *testing.T) {
			var wf []float32
			var w64 []float64
			if weighted {
				wf, w64 = w, f64(w)
			}
			y := make([]float32, len(x))
			b.RMSNorm(y, x, wf, dim, 1e-6)
			expect(t, "RMSNorm", y, ref.RMSNorm(f64(x), w64, dim, 1e-6), TolElemwise)
			// In place.
			z := append([]float32(nil), x...)
			b.RMSNorm(z, z, wf, dim, 1e-6)
			expect(t, "RMSNorm in place", z, ref.RMSNorm(f64(x), w64, dim, 1e-6), TolElemwise)
		})
	}
}

func hcParams(t *testing.T, b compute.Backend, rng *rand.Rand, hc, dim, rows, nscale int) (*compute.HCParams, compute.WeightData) {
	fd := RandomWeight(rng, compute.F32, rows, hc*dim, 0.3)
	return &compute.HCParams{
		Fn: bind(t, b, fd), Base: Normal(rng, rows, 1), Scale: Normal(rng, nscale, 1),
		HC: hc, Iters: 20, Eps: 1e-6, NormEps: 1e-6,
	}, fd
}

func testHCMix(t *testing.T, b compute.Backend) {
	rng := rand.New(rand.NewPCG(4, 4))
	const hc, dim, batch = 4, 40, 3
	p, fd := hcParams(t, b, rng, hc, dim, (2+hc)*hc, 3)
	p.Scale[2] = 4 // sharpen the comb logits so Sinkhorn has work to do
	x := Normal(rng, batch*hc*dim, 2)
	pre, post, comb := make([]float32, batch*hc), make([]float32, batch*hc), make([]float32, batch*hc*hc)
	b.HCMix(pre, post, comb, x, p, batch)
	fn := ref.Dequant(fd)
	for bi := range batch {
		wp, wq, wc := ref.HCMix(f64(x[bi*hc*dim:(bi+1)*hc*dim]), fn, f64(p.Base), f64(p.Scale), hc, 20, 1e-6, 1e-6)
		expect(t, fmt.Sprint("pre token ", bi), pre[bi*hc:(bi+1)*hc], wp, TolHCMix)
		expect(t, fmt.Sprint("post token ", bi), post[bi*hc:(bi+1)*hc], wq, TolHCMix)
		expect(t, fmt.Sprint("comb token ", bi), comb[bi*hc*hc:(bi+1)*hc*hc], wc, TolHCMix)
	}
}

func testHCHead(t *testing.T, b compute.Backend) {
	rng := rand.New(rand.NewPCG(5, 5))
	const hc, dim, batch = 4, 40, 2
	p, fd := hcParams(t, b, rng, hc, dim, hc, 1)
	x := Normal(rng, batch*hc*dim, 2)
	pre := make([]float32, batch*hc)
	b.HCHeadPre(pre, x, p, batch)
	fn := ref.Dequant(fd)
	for bi := range batch {
		want := ref.HCHeadPre(f64(x[bi*hc*dim:(bi+1)*hc*dim]), fn, f64(p.Base), f64(p.Scale), hc, 1e-6, 1e-6)
		expect(t, fmt.Sprint("head pre token ", bi), pre[bi*hc:(bi+1)*hc], want, TolHCMix)
	}
}

func testHCCollapseExpand(t *testing.T, b compute.Backend) {
	rng := rand.New(rand.NewPCG(6, 6))
	const hc, dim, batch = 4, 33, 2
	x := Normal(rng, batch*hc*dim, 1)
	o := Normal(rng, batch*dim, 1)
	pre, post, comb := Normal(rng, batch*hc, 1), Normal(rng, batch*hc, 1), Normal(rng, batch*hc*hc, 1)
	y := make([]float32, batch*dim)
	b.HCCollapse(y, x, pre, hc, dim, batch)
	out := make([]float32, batch*hc*dim)
	b.HCExpand(out, x, o, post, comb, hc, dim, batch)
	for bi := range batch {
		xs := f64(x[bi*hc*dim : (bi+1)*hc*dim])
		expect(t, "collapse", y[bi*dim:(bi+1)*dim], ref.HCCollapse(xs, f64(pre[bi*hc:(bi+1)*hc]), hc, dim), TolElemwise)
		expect(t, "expand", out[bi*hc*dim:(bi+1)*hc*dim],
			ref.HCExpand(xs, f64(o[bi*dim:(bi+1)*dim]), f64(post[bi*hc:(bi+1)*hc]), f64(comb[bi*hc*hc:(bi+1)*hc*hc]), hc, dim), TolElemwise)
	}
}

func testRoPE(t *testing.T, b compute.Backend) {
	rng := rand.New(rand.NewPCG(7, 7))
	const dim, heads = 24, 3
	pos := []int{0, 1, 7, 1000, 65535}
	tables := map[string][]float32{
		"plain": compute.RopeFreqs(10000, 16, nil),
		"yarn":  compute.RopeFreqs(160000, 16, &compute.YaRN{Factor: 16, OriginalSeqLen: 64, BetaFast: 32, BetaSlow: 1}),
	}
	for name, freq := range tables {
		for _, inv := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s_inverse=%v", name, inv), func(t *testing.T) {
				x := Normal(rng, len(pos)*heads*dim, 1)
				got := append([]float32(nil), x...)
				b.RoPE(got, pos, freq, heads*dim, dim, inv)
				for i, p := range pos {
					want := ref.RoPE(f64(x[i*heads*dim:(i+1)*heads*dim]), p, freq, dim, inv)
					expect(t, fmt.Sprint("pos ", p), got[i*heads*dim:(i+1)*heads*dim], want, TolElemwise)
				}
				// Forward then inverse is the identity.
				b.RoPE(got, pos, freq, heads*dim, dim, !inv)
				expect(t, "round trip", got, f64(x), TolElemwise)
			})
		}
	}
}

func testAttention(t *testing.T, b compute.Backend) {
	const heads, dim = 4, 48
	for _, nKeys := range []int{0, 1, 9, 40} {
		t.Run(fmt.Sprint("keys=", nKeys), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(8, uint64(nKeys)))
			q := Normal(rng, heads*dim, 1)
			kv := Normal(rng, nKeys*dim, 1)
			sinks := Normal(rng, heads, 2)
			sinks[0] = 30 // a sink that dominates the denominator
			o := make([]float32, heads*dim)
			for i := range o {
				o[i] = 123 // must be overwritten
			}
			scale := float32(1 / math.Sqrt(dim))
			b.Attention(o, q, kv, sinks, nKeys, heads, dim, scale)
			want := ref.Attention(f64(q), f64(kv), f64(sinks), nKeys, heads, dim, float64(scale))
			if nKeys == 0 {
				for i, v := range o {
					if v != 0 {
						t.Fatalf("o[%d] = %g with no keys, want 0", i, v)
					}
				}
				return
			}
			// Per head: head 0 is tiny (sink-dominated), so compare per head.
			for h := range heads {
				expect(t, fmt.Sprint("head ", h), o[h*dim:(h+1)*dim], want[h*dim:(h+1)*dim], TolAttention)
			}
		})
	}
}

func testCompressPool(t *testing.T, b compute.Backend) {
	rng := rand.New(rand.NewPCG(9, 9))
	for _, slots := range []int{1, 4, 8} {
		const width = 50
		kv := Normal(rng, slots*width, 1)
		z := Normal(rng, slots*width, 3)
		out := make([]float32, width)
		b.CompressPool(out, kv, z, slots, width)
		expect(t, fmt.Sprint("slots ", slots), out, ref.CompressPool(f64(kv), f64(z), slots, width), TolElemwise)
	}
}

func testIndexScores(t *testing.T, b compute.Backend) {
	rng := rand.New(rand.NewPCG(10, 10))
	const heads, dim, nKeys = 16, 32, 37
	q := Normal(rng, heads*dim, 1)
	w := Normal(rng, heads, 1)
	keys := Normal(rng, nKeys*dim, 1)
	s := make([]float32, nKeys)
	b.IndexScores(s, q, w, keys, nKeys, heads, dim)
	expect(t, "IndexScores", s, ref.IndexScores(f64(q), f64(w), f64(keys), nKeys, heads, dim), TolLinear)
}

func testRoute(t *testing.T, b compute.Backend) {
	rng := rand.New(rand.NewPCG(11, 11))
	const E, k = 16, 3
	logits := Normal(rng, E, 2)
	logits[5] = 25 // exercise the softplus threshold
	bias := Normal(rng, E, 0.3)
	cases := []struct {
		name string
		bias []float32
		hash []int
	}{{"scores", nil, nil}, {"bias", bias, nil}, {"hash", nil, []int{9, 2, 14}}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ids := make([]int, k)
			w := make([]float32, k)
			b.Route(ids, w, logits, tc.bias, tc.hash, 1.5)
			var b64 []float64
			if tc.bias != nil {
				b64 = f64(tc.bias)
			}
			wantIDs, wantW := ref.Route(f64(logits), b64, tc.hash, k, 1.5)
			for i := range ids {
				if ids[i] != wantIDs[i] {
					t.Fatalf("ids = %v, want %v", ids, wantIDs)
				}
			}
			expect(t, "weights", w, wantW, TolElemwise)
		})
	}
	t.Run("ties", func(t *testing.T) {
		l := make([]float32, 8) // all equal: lowest indices win, in order
		ids := make([]int, 3)
		w := make([]float32, 3)
		b.Route(ids, w, l, nil, nil, 1)
		if ids[0] != 0 || ids[1] != 1 || ids[2] != 2 {
			t.Fatalf("tied ids = %v, want [0 1 2]", ids)
		}
		for _, v := range w {
			if math.Abs(float64(v)-1.0/3) > 1e-6 {
				t.Fatalf("tied weights = %v, want 1/3 each", w)
			}
		}
	})
}

func testSwiGLU(t *testing.T, b compute.Backend) {
	rng := rand.New(rand.NewPCG(12, 12))
	const width, rows = 40, 3
	g := Normal(rng, rows*width, 8) // many values beyond the clamp
	u := Normal(rng, rows*width, 8)
	scale := []float32{0.5, 1.25, 2}
	for _, limit := range []float32{0, 10} {
		for _, rs := range [][]float32{nil, scale} {
			t.Run(fmt.Sprintf("limit=%g_scaled=%v", limit, rs != nil), func(t *testing.T) {
				h := make([]float32, rows*width)
				b.SwiGLU(h, g, u, rs, width, limit)
				for r := range rows {
					s := 1.0
					if rs != nil {
						s = float64(rs[r])
					}
					want := ref.SwiGLU(f64(g[r*width:(r+1)*width]), f64(u[r*width:(r+1)*width]), s, float64(limit))
					expect(t, fmt.Sprint("row ", r), h[r*width:(r+1)*width], want, TolElemwise)
				}
			})
		}
	}
}

// testHCMixHand checks HCMix against values computed by hand, independently of
// compute/ref: with fn = 0 the mix logits are the bases, so
// pre = sigmoid(base[0:4]) + eps and post = 2·sigmoid(base[4:8]); equal comb
// logits give a uniform softmax (1/4 + eps per entry) that every Sinkhorn
// pass keeps uniform: c ← c/(4c + eps) per pass, 20 column and 19 row passes.
// A comb base that is a permutation-like 4×4 (one large logit per row and
// column) must come out (nearly) doubly stochastic: column sums s/(s+eps)
// after the final column pass.
func testHCMixHand(t *testing.T, b compute.Backend) {
	const hc, dim = 4, 8
	fd := Quantize(compute.F32, make([]float32, (2+hc)*hc*hc*dim), (2+hc)*hc, hc*dim, 128)
	base := make([]float32, (2+hc)*hc)
	for j := range 8 {
		base[j] = float32(j)*0.5 - 2
	}
	for i := 8; i < len(base); i++ {
		base[i] = 0.75
	}
	p := &compute.HCParams{Fn: bind(t, b, fd), Base: base, Scale: []float32{1, 1, 1}, HC: hc, Iters: 20, Eps: 1e-6, NormEps: 1e-6}
	x := make([]float32, hc*dim)
	for i := range x {
		x[i] = float32(i%7) - 3
	}
	pre, post, comb := make([]float32, hc), make([]float32, hc), make([]float32, hc*hc)
	b.HCMix(pre, post, comb, x, p, 1)
	sig := func(v float64) float64 { return 1 / (1 + math.Exp(-v)) }
	c := 0.25 + 1e-6 // softmax of equal logits, plus eps
	for pass := 0; pass < 39; pass++ {
		c /= 4*c + 1e-6
	}
	for j := range hc {
		if want := sig(float64(base[j])) + 1e-6; math.Abs(float64(pre[j])-want) > 1e-6 {
			t.Errorf("pre[%d] = %.9g, want %.9g", j, pre[j], want)
		}
		if want := 2 * sig(float64(base[4+j])); math.Abs(float64(post[j])-want) > 2e-6 {
			t.Errorf("post[%d] = %.9g, want %.9g", j, post[j], want)
		}
	}
	for i, v := range comb {
		if math.Abs(float64(v)-c) > 1e-6 {
			t.Errorf("uniform comb[%d] = %.9g, want %.9g", i, v, c)
		}
	}
	// Strongly peaked logits: Sinkhorn output is doubly stochastic.
	for j := range hc {
		for k := range hc {
			base[8+j*hc+k] = 0
			if k == (j+1)%hc {
				base[8+j*hc+k] = 2
			}
		}
	}
	base[8+5] = 1 // break the symmetry
	b.HCMix(pre, post, comb, x, p, 1)
	for k := range hc {
		var col, row float64
		for j := range hc {
			col += float64(comb[j*hc+k])
			row += float64(comb[k*hc+j])
		}
		if math.Abs(col-1) > 1e-5 {
			t.Errorf("column %d sums to %.9g, want 1", k, col)
		}
		if math.Abs(row-1) > 1e-3 {
			t.Errorf("row %d sums to %.9g, want ~1 after 20 Sinkhorn rounds", k, row)
		}
	}
}
