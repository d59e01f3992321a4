package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"

	"moxie/compute"
	"moxie/compute/computetest"
	"moxie/compute/ref"
)

// TestGemvLayout checks the Go mirror of struct GemvArgs: 64-byte matrix
// records, the count after the GemvMax records.
func TestGemvLayout(t *testing.T) {
	if s := unsafe.Sizeof(gemvMat{}); s != 64 {
		t.Errorf("gemvMat is %d bytes, want 64", s)
	}
	var a gemvArgs
	if o := unsafe.Offsetof(a.N); o != 64*GemvMax {
		t.Errorf("GemvArgs.n at %d, want %d", o, 64*GemvMax)
	}
	if o, s := unsafe.Offsetof(a.NW), unsafe.Sizeof(a); o != 520 || s != 616 {
		t.Errorf("GemvArgs.nw at %d, size %d; want 520 and 616 (the static_asserts of gemv.cu and moe.cu)", o, s)
	}
}

// TestGemvWPR checks the column split on 132 SMs against values worked out
// by hand from its rule (double while row pairs x warps < 2,112, at most 8,
// and each warp keeps whole 32-lane steps of cpl columns).
func TestGemvWPR(t *testing.T) {
	for _, tc := range []struct{ rows, cols, cpl, want int }{
		{4096, 8192, 16, 2},  // 2,048 pairs: one doubling
		{1024, 4096, 16, 8},  // 512 pairs: up to the cap
		{512, 4096, 16, 8},   // 256 pairs; 4096 = 8 x 512
		{32768, 1024, 16, 1}, // 16,384 pairs already fill it
		{1024, 512, 16, 1},   // one step per row: no split
		{64, 4096, 8, 8},     // BF16: 8 x 256 divides 4096
		{256, 1024, 16, 2},   // 1024 = 2 x 512, not 4 x 512
	} {
		if got := gemvWPR(tc.rows, tc.cols, tc.cpl, 132); got != tc.want {
			t.Errorf("gemvWPR(%d, %d, %d) = %d, want %d", tc.rows, tc.cols, tc.cpl, got, tc.want)
		}
	}
}

// TestGemv checks one-token products (FP8 blocks, BF16, grouped, several
// per launch) against the float64 reference, and that two runs give the
// same bits.
func TestGemv(t *testing.T) {
	sets := append(gemvV4Sets(),
		gemvSet{"fp8 small odd scale rows", []gemvShape{{compute.FP8Block, 130, 512, 1}, {compute.FP8Block, 6, 1024, 3}}},
		gemvSet{"mixed", []gemvShape{{compute.BF16, 256, 256, 1}, {compute.FP8Block, 64, 512, 2}}},
		gemvSet{"fp8 tiles past the grid", []gemvShape{{compute.FP8Block, 48, 1024, 1}, {compute.FP8Block, 16, 512, 1}, {compute.FP8Block, 96, 8192, 3}}})
	withFwd(t, func(e *fwdEnv) {
		for si, set := range sets {
			rng := rand.New(rand.NewPCG(uint64(si), 17))
			var ps []GemvProj
			var wants [][]float64
			for _, m := range set.ms {
				d := randomWeightPar(rng.Uint64(), m.f, m.rows, m.cols, 0.05)
				w, err := e.c.UploadWeight(e.a, d)
				if err != nil {
					t.Fatal(err)
				}
				x := computetest.Normal(rng, m.groups*m.cols, 1)
				// float64 reference: row group g against slice g.
				want := ref.ParallelGroupedLinear(ref.ParallelDequant(d), m.rows, m.cols, f64s(x), 1, m.groups)
				ps = append(ps, GemvProj{W: w, Y: e.poisoned(m.rows), X: e.up(x), Groups: m.groups})
				wants = append(wants, want)
			}
			for _, v := range gemvTestVariants {
				u := v.U
				g, err := e.c.PrepareGemv(ps, v)
				if err != nil && v.MMA && !gemvmTakes(set) {
					continue // BF16 or shapes the MMA kernels refuse (checked below)
				}
				if err != nil {
					t.Fatalf("%s, %+v: %v", set.name, v, err)
				}
				gemvTwice(e, g, ps, fmt.Sprintf("%s, %+v", set.name, v), func(i int, got []float32) {
					p := ps[i]
					if r := computetest.MaxRel(got, wants[i]); !(r <= computetest.TolLinear) {
						t.Errorf("%s, %+v, product %d [%d, %d]: max relative error %.3g > %.3g", set.name, v, i, p.W.Rows, p.W.Cols, r, computetest.TolLinear)
					} else if u == 4 {
						t.Logf("%s, %+v, product %d: max relative error %.3g", set.name, v, i, r)
					}
				})
			}
		}
		// x RMS-normalized inside the launch (GemvProj.Norm: the decode
		// step's wq_b and indexer wq_b on the raw qlat), MMA kernels only,
		// against RMSNorm(x)·w then the product in float64.
		{
			rng := rand.New(rand.NewPCG(9, 9))
			const cols, eps = 1024, 1e-6
			x := computetest.Normal(rng, cols, 3)
			nw := computetest.Normal(rng, cols, 1)
			ss := 0.0
			for _, v := range x {
				ss += float64(v) * float64(v)
			}
			inv := 1 / math.Sqrt(ss/cols+eps)
			xn := make([]float64, cols)
			for i, v := range x {
				xn[i] = float64(v) * inv * float64(nw[i])
			}
			var ps []GemvProj
			var wants [][]float64
			for _, rows := range []int{32768, 8192} {
				d := randomWeightPar(rng.Uint64(), compute.FP8Block, rows, cols, 0.05)
				w, err := e.c.UploadWeight(e.a, d)
				if err != nil {
					t.Fatal(err)
				}
				ps = append(ps, GemvProj{W: w, Y: e.poisoned(rows), X: e.up(x), Norm: e.up(nw), Eps: eps})
				wants = append(wants, ref.ParallelGroupedLinear(ref.ParallelDequant(d), rows, cols, xn, 1, 1))
			}
			for _, v := range gemvTestVariants {
				g, err := e.c.PrepareGemv(ps, v)
				if !v.MMA {
					if err == nil || !strings.Contains(err.Error(), "product 0") {
						t.Errorf("normalized x, %+v: error %v, want one naming product 0", v, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("normalized x, %+v: %v", v, err)
				}
				if err := e.c.LaunchGemv(g, e.c.Stream()); err != nil {
					t.Fatal(err)
				}
				for i, p := range ps {
					got := e.down(p.Y, p.W.Rows)
					if r := computetest.MaxRel(got, wants[i]); !(r <= computetest.TolLinear) {
						t.Errorf("normalized x, %+v, product %d: max relative error %.3g > %.3g", v, i, r, computetest.TolLinear)
					} else {
						t.Logf("normalized x, %+v, product %d: max relative error %.3g", v, i, r)
					}
				}
			}
		}
		// Refused shapes name the product.
		bad := computetest.RandomWeight(rand.New(rand.NewPCG(1, 1)), compute.FP8Block, 8, 100, 0.05)
		w, err := e.c.UploadWeight(e.a, bad)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.c.PrepareGemv([]GemvProj{{W: w, Y: e.poisoned(8), X: e.up(make([]float32, 100))}}, GemvVariant{}); err == nil {
			t.Error("FP8 weight of 100 columns accepted")
		}
		// The MMA kernels refuse what they cannot tile, naming the product.
		for _, c := range []struct {
			name string
			m    gemvShape
		}{
			{"BF16", gemvShape{compute.BF16, 256, 256, 1}},
			{"rows not a multiple of 16", gemvShape{compute.FP8Block, 130, 512, 1}},
			{"row groups of 8", gemvShape{compute.FP8Block, 64, 512, 8}},
			{"too many columns", gemvShape{compute.FP8Block, 16, 16384, 1}},
		} {
			d := computetest.RandomWeight(rand.New(rand.NewPCG(2, 2)), c.m.f, c.m.rows, c.m.cols, 0.05)
			w, err := e.c.UploadWeight(e.a, d)
			if err != nil {
				t.Fatal(err)
			}
			ok := GemvProj{W: w, Y: e.poisoned(c.m.rows), X: e.up(make([]float32, c.m.groups*c.m.cols)), Groups: c.m.groups}
			if _, err := e.c.PrepareGemv([]GemvProj{ok, ok}, GemvVariant{MMA: true}); err == nil || !strings.Contains(err.Error(), "product 0") {
				t.Errorf("MMA, %s: error %v, want one naming product 0", c.name, err)
			}
		}
	})
}

// gemvTestVariants is every Gemv variant TestGemv and BenchmarkGemv run.
var gemvTestVariants = []GemvVariant{{U: 2}, {U: 4}, {U: 8}, {MMA: true, U: 1}, {MMA: true, U: 2}, {MMA: true, U: 4}}

// gemvmTakes reports whether every product of set is one the MMA kernels
// take (prepareGemvM's conditions, for the test weights' 128 block edge).
func gemvmTakes(set gemvSet) bool {
	for _, m := range set.ms {
		if m.f != compute.FP8Block || m.rows%m.groups != 0 || (m.rows/m.groups)%16 != 0 || m.cols%64 != 0 {
			return false
		}
	}
	return true
}

// gemvTwice launches g twice, calls check with each product's output of
// the first run, and fails e's test (naming what) where the second run's
// bits differ from the first's.
func gemvTwice(e *fwdEnv, g *Gemv, ps []GemvProj, what string, check func(i int, got []float32)) {
	t := e.t
	t.Helper()
	var first [][]float32
	for run := range 2 {
		if err := e.c.LaunchGemv(g, e.c.Stream()); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		for i, p := range ps {
			got := e.down(p.Y, p.W.Rows)
			if run == 0 {
				first = append(first, got)
				check(i, got)
			} else if j := bitEqual32(got, first[i]); j >= 0 {
				t.Errorf("%s, product %d: a second run differs at %d", what, i, j)
			}
		}
	}
}

// TestGemvMWPR checks the MMA kernels' tile split on 132 SMs against values
// worked out by hand from its rule (double while tiles x warps < 1,584 or a
// warp would take more than 16 spans; at most 8; the spans divide evenly).
func TestGemvMWPR(t *testing.T) {
	for _, tc := range []struct{ tiles, spans, want int }{
		{2048, 16, 1}, // wq_b 32768x1024: 2,048 tiles fill it
		{512, 16, 4},  // indexer wq_b 8192x1024: 512 -> 1,024 -> 2,048
		{256, 128, 8}, // wo_b 4096x8192: 128 spans need 8 warps anyway
		{512, 64, 4},  // wo_a 8192x4096
		{64, 64, 8},   // wq_a 1024x4096: the cap
		{3, 1, 1},     // one span: no split
		{10, 6, 2},    // 6 spans: 2 divides, 4 does not
	} {
		if got := gemvmWPR(tc.tiles, tc.spans, 132); got != tc.want {
			t.Errorf("gemvmWPR(%d, %d) = %d, want %d", tc.tiles, tc.spans, got, tc.want)
		}
	}
}

// gemvShape is one product of a Gemv set: a [rows, cols] weight, groups
// row groups each against its own slice of x.
type gemvShape struct {
	f          compute.Format
	rows, cols int
	groups     int
}

// gemvSet is the products of one Gemv launch.
type gemvSet struct {
	name string
	ms   []gemvShape
}

// gemvV4Sets is the V4-Flash one-token products TestGemv checks and
// BenchmarkGemv times.
func gemvV4Sets() []gemvSet {
	return []gemvSet{
		{"wo_b_fp8_4096x8192", []gemvShape{{compute.FP8Block, 4096, 8192, 1}}},
		{"wo_a_fp8_8192x4096_g8", []gemvShape{{compute.FP8Block, 8192, 4096, 8}}},
		{"wq_a+wkv_fp8", []gemvShape{{compute.FP8Block, 1024, 4096, 1}, {compute.FP8Block, 512, 4096, 1}}},
		{"wq_b+idx_wq_b_fp8", []gemvShape{{compute.FP8Block, 32768, 1024, 1}, {compute.FP8Block, 8192, 1024, 1}}},
		{"compressors_bf16_x5", []gemvShape{{compute.BF16, 1024, 4096, 1}, {compute.BF16, 1024, 4096, 1}, {compute.BF16, 256, 4096, 1}, {compute.BF16, 256, 4096, 1}, {compute.BF16, 64, 4096, 1}}},
	}
}

func bitEqual32(a, b []float32) int {
	for i := range a {
		if *(*uint32)(unsafe.Pointer(&a[i])) != *(*uint32)(unsafe.Pointer(&b[i])) {
			return i
		}
	}
	return -1
}

// BenchmarkGemv times one-token products at V4-Flash shapes, each launch
// reading one of 8 copies of its weights in turn (past L2), 32 launches per
// captured graph (graphTime): the Gemv kernels (gemvTestVariants: the
// CUDA-core ones at U 2/4/8, the MMA ones at U 1/2/4 where they apply; the
// qat target's gemvq at U 2/4) against the
// linear kernels' automatic choice (Linear, GroupedLinear, or one
// multi-linear launch for sets). Reports µs and %HBM of the weight bytes.
func BenchmarkGemv(b *testing.B) {
	dev := testDevice(b)
	hbm, err := dev.ReadBandwidth(4<<30, 11)
	if err != nil {
		b.Fatal(err)
	}
	sets := append(gemvV4Sets(),
		gemvSet{"wq_b_fp8_32768x1024", []gemvShape{{compute.FP8Block, 32768, 1024, 1}}},
		gemvSet{"gate_bf16_256x4096", []gemvShape{{compute.BF16, 256, 4096, 1}}})
	const copies, calls = 8, 32
	type result struct {
		name  string
		us    float64
		bytes int
		err   error
	}
	var results []result
	err = dev.Do(func(c *Ctx) error {
		d := &devBufs{c: c}
		defer d.free()
		for si, set := range sets {
			rng := rand.New(rand.NewPCG(uint64(si), 23))
			ws := make([][]*DeviceWeight, copies)
			var ys, xs []DevicePtr
			var gs []int
			for _, m := range set.ms {
				data := computetest.RandomWeight(rng, m.f, m.rows, m.cols, 0.05)
				for k := range copies {
					ws[k] = append(ws[k], d.weight(data))
				}
				ys = append(ys, d.alloc(4*m.rows))
				xs = append(xs, d.floats(computetest.Normal(rng, m.groups*m.cols, 1)))
				gs = append(gs, m.groups)
			}
			d.synced()
			if d.err != nil {
				return d.err
			}
			bytes := 0
			for _, w := range ws[0] {
				bytes += w.Bytes
			}
			time := func(name string, launches []func() error) {
				i := 0
				us, err := graphTime(b, c, calls, func() error { i++; return launches[i%copies]() })
				results = append(results, result{set.name + "/" + name, us, bytes, err})
			}
			// The qat target's products too (x through act_quant in the
			// launch): not the same function.
			for _, v := range append(gemvTestVariants, GemvVariant{U: 2, MMA: true, QAT: true}, GemvVariant{U: 4, MMA: true, QAT: true}) {
				name := fmt.Sprintf("gemv_u%d", v.U)
				switch {
				case v.QAT:
					name = fmt.Sprintf("gemvq_f%d", v.U)
				case v.MMA:
					name = fmt.Sprintf("gemvm_f%d", v.U)
				}
				var ls []func() error
				for k := range copies {
					var ps []GemvProj
					for j, w := range ws[k] {
						ps = append(ps, GemvProj{W: w, Y: ys[j], X: xs[j], Groups: gs[j]})
					}
					g, err := c.PrepareGemv(ps, v)
					if err != nil && v.MMA && !gemvmTakes(set) {
						break // BF16: the MMA kernels take FP8 blocks only
					}
					if err != nil {
						return err
					}
					ls = append(ls, func() error { return c.LaunchGemv(g, c.Stream()) })
				}
				if len(ls) == copies {
					time(name, ls)
				}
			}
			// The linear kernels' automatic choice.
			a, err := c.NewArena(1 << 20)
			if err != nil {
				return err
			}
			var ls []func() error
			for k := range copies {
				switch {
				case len(ws[k]) == 1 && gs[0] > 1:
					w := ws[k][0]
					ls = append(ls, func() error { return c.GroupedLinear(w, ys[0], xs[0], 1, gs[0], c.Stream()) })
				case len(ws[k]) == 1:
					w := ws[k][0]
					ls = append(ls, func() error { return c.Linear(w, ys[0], xs[0], 1, c.Stream()) })
				default:
					m, err := c.PrepareMultiLinear(a, ws[k], ys, xs, 1, LinearVariant{})
					if err != nil {
						return err
					}
					ls = append(ls, func() error { return c.LaunchMultiLinear(m, c.Stream()) })
				}
			}
			time("linear", ls)
			if err := c.ReleaseArena(a); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	for _, r := range results {
		b.Run(r.name, func(b *testing.B) {
			if r.err != nil {
				b.Fatal(r.err)
			}
			b.ReportMetric(r.us, "device-us/op")
			b.ReportMetric(100*float64(r.bytes)/(r.us*1e-6)/hbm, "%HBM")
		})
	}
}

// TestGemvPairLayout checks the Go mirror of struct GemvPairArgs (the .cu
// file's static_assert checks the C side's size).
func TestGemvPairLayout(t *testing.T) {
	var a gemvPairArgs
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"b", unsafe.Offsetof(a.B), 64},
		{"bar", unsafe.Offsetof(a.Bar), 128},
		{"ns", unsafe.Offsetof(a.Ns), 136},
		{"l2pf", unsafe.Offsetof(a.L2PF), 148},
		{"size", unsafe.Sizeof(a), 152},
	} {
		if c.got != c.want {
			t.Errorf("gemvPairArgs %s at %d, want %d", c.what, c.got, c.want)
		}
	}
}

// TestGemvPairWPR checks the warps per row against the rule worked by hand:
// the largest power of two at most the 512-column segments and 16.
func TestGemvPairWPR(t *testing.T) {
	for _, tc := range []struct{ cols, want int }{
		{512, 1}, {1024, 2}, {1536, 2}, {2560, 4}, {4096, 8}, {8192, 16}, {9216, 16}, {16384, 16},
	} {
		if got := gemvPairWPR(tc.cols); got != tc.want {
			t.Errorf("gemvPairWPR(%d) = %d, want %d", tc.cols, got, tc.want)
		}
	}
}

// TestGemvPairShape checks the shared-memory plan against values worked out
// by hand (H200: 132 blocks, 232,448 bytes a block).
func TestGemvPairShape(t *testing.T) {
	const optin = 227 << 10
	for _, tc := range []struct {
		name                                           string
		g, rows1, wpr1, rows2, cols2, wpr2, budget, cp int
		ns, redOff, smem                               int
	}{
		// wo_a+wo_b: 63 and 32 rows a block, 4·max(63·8, 32·16) = 2,048 bytes
		// of sums, (232,448 - 2,048) / 8,192 = 28 rows of wo_b.
		{"wo_a+wo_b", 132, 8192, 8, 4096, 8192, 16, optin, 0, 28, 229376, 231424},
		{"wo_a+wo_b cap 5", 132, 8192, 8, 4096, 8192, 16, optin, 5, 5, 40960, 43008},
		{"wo_a+wo_b none", 132, 8192, 8, 4096, 8192, 16, optin, -1, 0, 0, 2048},
		{"cap above the block's rows", 132, 8192, 8, 4096, 8192, 16, optin, 40, 28, 229376, 231424},
		// 12 and 1 rows a block: 4·max(12·2, 1·1) = 96 bytes; one row of B.
		{"small", 132, 1536, 2, 129, 512, 1, optin, 0, 1, 512, 608},
		// 23 rows of 1,024 bytes, 4·max(8·4, 23·2) = 184 bytes of sums.
		{"all rows fit", 132, 1024, 4, 3001, 1024, 2, optin, 0, 23, 23552, 23736},
		// Only 3 rows of 8,192 fit in 30,000 - 2,048 bytes.
		{"small budget", 132, 8192, 8, 4096, 8192, 16, 30000, 0, 3, 24576, 26624},
	} {
		ns, redOff, smem, err := gemvPairShape(tc.g, tc.rows1, tc.wpr1, tc.rows2, tc.cols2, tc.wpr2, tc.budget, tc.cp)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if ns != tc.ns || redOff != tc.redOff || smem != tc.smem {
			t.Errorf("%s: ns %d, sums at %d, %d bytes; want %d, %d, %d", tc.name, ns, redOff, smem, tc.ns, tc.redOff, tc.smem)
		}
	}
	if _, _, _, err := gemvPairShape(1, 100000, 16, 10, 512, 1, optin, 0); err == nil || !strings.Contains(err.Error(), "partial sums") {
		t.Errorf("sums of 100,000 rows in one block: error %v, want one about the partial sums", err)
	}
}

// TestGemvPairRefuses checks that bad pairs get an error naming the
// problem (no GPU needed: the checks come before any device call), and
// that the well-formed pairs they are made from pass.
func TestGemvPairRefuses(t *testing.T) {
	fp8 := func(rows, cols, blk int) *DeviceWeight {
		return &DeviceWeight{Format: compute.FP8Block, Rows: rows, Cols: cols, Block: blk, Data: 1 << 30, Scale: 1 << 31, Bytes: rows * cols}
	}
	base := func() (GemvProj, GemvProj) {
		return GemvProj{W: fp8(1024, 512, 128), X: 0x1000, Y: 0x10000}, GemvProj{W: fp8(300, 1024, 128), Y: 0x20000}
	}
	for _, tc := range []struct {
		name string
		edit func(a, b *GemvProj, v *GemvPairVariant)
		want string // "" means accepted
	}{
		{"base", func(a, b *GemvProj, v *GemvPairVariant) {}, ""},
		{"explicit x2", func(a, b *GemvProj, v *GemvPairVariant) { b.X = a.Y }, ""},
		{"grouped second", func(a, b *GemvProj, v *GemvPairVariant) { b.W = fp8(300, 512, 128); b.Groups = 2 }, ""},
		{"u4", func(a, b *GemvProj, v *GemvPairVariant) { v.U = 4 }, ""},
		{"u3", func(a, b *GemvProj, v *GemvPairVariant) { v.U = 3 }, "U 3"},
		{"nil weight", func(a, b *GemvProj, v *GemvPairVariant) { a.W = nil }, "first product: nil weight"},
		{"bf16", func(a, b *GemvProj, v *GemvPairVariant) { b.W.Format = compute.BF16 }, "second product: bf16 weights"},
		{"columns", func(a, b *GemvProj, v *GemvPairVariant) { a.W.Cols = 1000 }, "columns a multiple of 512"},
		{"block", func(a, b *GemvProj, v *GemvPairVariant) { b.W.Block = 96 }, "power-of-two block"},
		{"unaligned data", func(a, b *GemvProj, v *GemvPairVariant) { a.W.Data += 8 }, "16-byte aligned"},
		{"groups", func(a, b *GemvProj, v *GemvPairVariant) { a.Groups = 3 }, "1024 rows in 3 groups"},
		{"x1 unaligned", func(a, b *GemvProj, v *GemvPairVariant) { a.X = 0x1004 }, "x 0x1004"},
		{"y2 null", func(a, b *GemvProj, v *GemvPairVariant) { b.Y = 0 }, "second product: y 0x0"},
		{"x2 not y1", func(a, b *GemvProj, v *GemvPairVariant) { b.X = 0x30000 }, "is not the first's y"},
		{"inner size", func(a, b *GemvProj, v *GemvPairVariant) { b.W = fp8(300, 512, 128) }, "reads 512 floats, the first [1024, 512] writes 1024"},
		{"y1 over x1", func(a, b *GemvProj, v *GemvPairVariant) { a.Y = a.X + 2032 }, "overlaps"},
		{"y1 over y2", func(a, b *GemvProj, v *GemvPairVariant) { b.Y = a.Y + 4080 }, "overlaps"},
		{"y1 next to y2", func(a, b *GemvProj, v *GemvPairVariant) { b.Y = a.Y + 4096 }, ""},
	} {
		a, b := base()
		var v GemvPairVariant
		tc.edit(&a, &b, &v)
		_, mb, _, err := gemvPairMats(a, b, v)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want == "" && mb.X != uint64(a.Y):
			t.Errorf("%s: second product reads %#x, want the first's y %#x", tc.name, mb.X, a.Y)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

// gemvPairCase is one pair of TestGemvPair: A [r1, c1] in g1 row groups
// (x of g1·c1 floats), then B [r2, c2] in g2 groups (c2·g2 = r1), FP8
// blocks of edge blk.
type gemvPairCase struct {
	name                   string
	r1, c1, g1, r2, c2, g2 int
	blk                    int
}

// TestGemvPair checks GemvPair launches against the float64 reference of
// both products (y1 = A·x, y2 = B·y1 with y1 the reference's own) at V4's
// wo_a+wo_b and odd shapes (a grouped second product, more segments than
// warps, rows that do not divide among the blocks, fewer rows than blocks,
// block edges 16 and 64), in every variant: twice as plain launches (the
// same bits), then poisoned outputs and a captured graph of two launches
// replayed three times (the same bits again: the barrier's counters carry
// over launches and replays without a reset). The counters must end at 0
// arrivals, one generation per launch and no timeouts.
func TestGemvPair(t *testing.T) {
	cases := []gemvPairCase{
		{"wo_a+wo_b", 8192, 4096, 8, 4096, 8192, 1, 128},
		{"grouped second, odd rows", 1536, 1024, 2, 129, 512, 3, 128},
		{"five segments, many rows a block", 1024, 2560, 1, 3001, 1024, 1, 128},
		{"eighteen segments, block 64", 9216, 512, 1, 300, 9216, 1, 64},
		{"fewer rows than blocks, block 16", 512, 512, 1, 7, 512, 1, 16},
	}
	variants := []struct {
		name string
		v    GemvPairVariant
	}{
		{"default", GemvPairVariant{}},
		{"u4", GemvPairVariant{U: 4}},
		{"no shared rows", GemvPairVariant{SmemRows: -1}},
		{"one shared row, late fill", GemvPairVariant{SmemRows: 1, LateFill: true}},
		{"late fill, no L2 hints", GemvPairVariant{LateFill: true, NoL2Prefetch: true}},
		{"eight shared rows, early L2 hints", GemvPairVariant{SmemRows: 8, EarlyL2Prefetch: true}},
		{"first product hinted, late fill", GemvPairVariant{HintFirst: true, LateFill: true}},
	}
	if testing.Short() {
		cases = cases[1:]
	}
	withFwd(t, func(e *fwdEnv) {
		for ci, pc := range cases {
			rng := rand.New(rand.NewPCG(uint64(ci), 31))
			weight := func(seed uint64, rows, cols int) compute.WeightData {
				if pc.blk == 128 {
					return randomWeightPar(seed, compute.FP8Block, rows, cols, 0.05)
				}
				return computetest.Quantize(compute.FP8Block, computetest.Normal(rng, rows*cols, 0.05), rows, cols, pc.blk)
			}
			da, db := weight(rng.Uint64(), pc.r1, pc.c1), weight(rng.Uint64(), pc.r2, pc.c2)
			x := computetest.Normal(rng, pc.g1*pc.c1, 1)
			// float64 reference: y1 = A·x by row group, y2 = B·y1 by row group.
			want1 := ref.ParallelGroupedLinear(ref.ParallelDequant(da), pc.r1, pc.c1, f64s(x), 1, pc.g1)
			want2 := ref.ParallelGroupedLinear(ref.ParallelDequant(db), pc.r2, pc.c2, want1, 1, pc.g2)
			wa, err := e.c.UploadWeight(e.a, da)
			if err != nil {
				t.Fatal(err)
			}
			wb, err := e.c.UploadWeight(e.a, db)
			if err != nil {
				t.Fatal(err)
			}
			xd, y1, y2 := e.up(x), e.poisoned(pc.r1), e.poisoned(pc.r2)
			for _, vr := range variants {
				what := pc.name + ", " + vr.name
				if err := e.c.Memset(y1, 0xff, 4*pc.r1, e.c.Stream()); err != nil {
					t.Fatal(err)
				}
				if err := e.c.Memset(y2, 0xff, 4*pc.r2, e.c.Stream()); err != nil {
					t.Fatal(err)
				}
				p, err := e.c.PrepareGemvPair(e.a, GemvProj{W: wa, X: xd, Y: y1, Groups: pc.g1}, GemvProj{W: wb, Y: y2, Groups: pc.g2}, vr.v)
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				t.Logf("%s: %d blocks, %d rows of B a block in %d bytes of shared memory", what, p.Blocks(), p.SharedRows(), p.SharedBytes())
				var first1, first2 []float32
				for run := range 2 {
					if err := e.c.LaunchGemvPair(p, e.c.Stream()); err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					got1, got2 := e.down(y1, pc.r1), e.down(y2, pc.r2)
					if run == 0 {
						first1, first2 = got1, got2
						r1, r2 := computetest.MaxRel(got1, want1), computetest.MaxRel(got2, want2)
						if !(r1 <= computetest.TolLinear) || !(r2 <= computetest.TolLinear) {
							t.Errorf("%s: max relative error y1 %.3g, y2 %.3g > %.3g", what, r1, r2, computetest.TolLinear)
						} else if vr.name == "default" {
							t.Logf("%s: max relative error y1 %.3g, y2 %.3g", what, r1, r2)
						}
						continue
					}
					if j := bitEqual32(got1, first1); j >= 0 {
						t.Errorf("%s: a second launch's y1 differs at %d", what, j)
					}
					if j := bitEqual32(got2, first2); j >= 0 {
						t.Errorf("%s: a second launch's y2 differs at %d", what, j)
					}
				}
				// Two launches in a graph, replayed three times on poisoned outputs.
				st := e.c.Stream()
				if err := e.c.Memset(y1, 0xff, 4*pc.r1, st); err != nil {
					t.Fatal(err)
				}
				if err := e.c.Memset(y2, 0xff, 4*pc.r2, st); err != nil {
					t.Fatal(err)
				}
				if err := e.c.BeginCapture(st); err != nil {
					t.Fatal(err)
				}
				for range 2 {
					if err := e.c.LaunchGemvPair(p, st); err != nil {
						_, _ = e.c.EndCapture(st)
						t.Fatalf("%s: %v", what, err)
					}
				}
				g, err := e.c.EndCapture(st)
				if err != nil {
					t.Fatal(err)
				}
				for replay := range 3 {
					if err := e.c.LaunchGraph(g, st); err != nil {
						t.Fatal(err)
					}
					if j := bitEqual32(e.down(y1, pc.r1), first1); j >= 0 {
						t.Errorf("%s: graph replay %d: y1 differs from the first launch at %d", what, replay, j)
					}
					if j := bitEqual32(e.down(y2, pc.r2), first2); j >= 0 {
						t.Errorf("%s: graph replay %d: y2 differs from the first launch at %d", what, replay, j)
					}
				}
				if err := e.c.DestroyGraph(g); err != nil {
					t.Fatal(err)
				}
				var bar [gemvPairBarBytes]byte
				if err := e.c.CopyFromDevice(bar[:], p.bar); err != nil {
					t.Fatal(err)
				}
				arrivals, gen, timeouts := binary.LittleEndian.Uint32(bar[0:]), binary.LittleEndian.Uint32(bar[4:]), binary.LittleEndian.Uint32(bar[8:])
				if arrivals != 0 || gen != 8 || timeouts != 0 {
					t.Errorf("%s: barrier counters after 8 launches: %d arrivals, generation %d, %d timeouts; want 0, 8, 0", what, arrivals, gen, timeouts)
				}
				if n, err := e.c.BarrierTimeouts(p); err != nil || n != 0 {
					t.Errorf("%s: BarrierTimeouts %d, %v; want 0", what, n, err)
				}
				if err := p.Free(e.a); err != nil {
					t.Fatal(err)
				}
				if err := e.c.LaunchGemvPair(p, st); err == nil {
					t.Errorf("%s: launch after Free accepted", what)
				}
			}
		}
	})
}
