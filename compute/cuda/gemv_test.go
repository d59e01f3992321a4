package cuda

import (
	"fmt"
	"math/rand/v2"
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
		gemvSet{"mixed", []gemvShape{{compute.BF16, 256, 256, 1}, {compute.FP8Block, 64, 512, 2}}})
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
			for _, u := range []int{2, 4, 8} {
				g, err := e.c.PrepareGemv(ps, GemvVariant{U: u})
				if err != nil {
					t.Fatalf("%s: %v", set.name, err)
				}
				var first [][]float32
				for run := range 2 {
					if err := e.c.LaunchGemv(g, e.c.Stream()); err != nil {
						t.Fatalf("%s: %v", set.name, err)
					}
					for i, p := range ps {
						got := e.down(p.Y, p.W.Rows)
						if run == 0 {
							first = append(first, got)
							if r := computetest.MaxRel(got, wants[i]); !(r <= computetest.TolLinear) {
								t.Errorf("%s, U %d, product %d [%d, %d]: max relative error %.3g > %.3g", set.name, u, i, p.W.Rows, p.W.Cols, r, computetest.TolLinear)
							} else if u == 4 {
								t.Logf("%s, product %d: max relative error %.3g", set.name, i, r)
							}
						} else if j := bitEqual32(got, first[i]); j >= 0 {
							t.Errorf("%s, U %d, product %d: a second run differs at %d", set.name, u, i, j)
						}
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
	})
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
// captured graph (graphTime): the Gemv kernels at U 2/4/8 against the
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
			for _, u := range []int{2, 4, 8} {
				var ls []func() error
				for k := range copies {
					var ps []GemvProj
					for j, w := range ws[k] {
						ps = append(ps, GemvProj{W: w, Y: ys[j], X: xs[j], Groups: gs[j]})
					}
					g, err := c.PrepareGemv(ps, GemvVariant{U: u})
					if err != nil {
						return err
					}
					ls = append(ls, func() error { return c.LaunchGemv(g, c.Stream()) })
				}
				time(fmt.Sprintf("gemv_u%d", u), ls)
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
