package cuda

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"moxie/compute"
	"moxie/compute/computetest"
)

// hcBenchSites is how many distinct mix sites BenchmarkHCBoundary's cold
// case cycles through: a V4-Flash decode step's two per layer of 43, so
// that every boundary reads its hc_fn (1.5 MiB each, 129 MiB in all) from
// HBM as in a real step, not from L2.
const hcBenchSites = 86

// BenchmarkHCBoundary times one decode sublayer boundary (HCMixNorm with the
// expand, V4-Flash shapes: hc 4, D 4096, F32 hc_fn) captured in a CUDA
// graph, for each implementation: "two" (fuse_hc_dots + fuse_hc_finish),
// "one" (fuse_hc_one at the default block shape), "one128" and "one64"
// (two and one virtual blocks per block), "two-fin4" (fuse_hc_dots +
// fuse_hc_finish4, $MOXIE_CUDA_HCFIN=new), "two-dots4" and "two-fin4-dots4"
// (the same with fuse_hc_dots4, $MOXIE_CUDA_HCDOTS=new), "two-fin4s" and
// "two-fin4s-dots4" (fuse_hc_finish4s, $MOXIE_CUDA_HCFIN=short; see
// hcBenchVariants). "hot" replays fuseGraphCalls boundaries of one site (its
// hc_fn stays in L2); "cold" replays one boundary on each of hcBenchSites
// sites in turn. It reports device microseconds per boundary.
func BenchmarkHCBoundary(b *testing.B) {
	dev := testDevice(b)
	for _, cold := range []bool{false, true} {
		for _, T := range []int{1, 4} {
			for _, vr := range hcBenchVariants {
				kind := "hot"
				if cold {
					kind = "cold"
				}
				b.Run(fmt.Sprintf("%s/b%d/%s", kind, T, vr.name), func(b *testing.B) {
					var us float64
					err := dev.Do(func(c *Ctx) error {
						d := &devBufs{c: c}
						defer d.free()
						sites := 1
						if cold {
							sites = hcBenchSites
						}
						one := hcBenchBoundaries(c, d, T, sites, vr.variant, vr.threads, vr.dots4)
						d.synced()
						if d.err != nil {
							return d.err
						}
						calls := fuseGraphCalls
						if cold {
							calls = 1
						}
						var err error
						us, err = graphTime(b, c, calls, one)
						us /= float64(sites)
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(us, "device-us/op")
				})
			}
		}
	}
}

// hcBenchVariants are BenchmarkHCBoundary's implementations: the two-kernel
// boundary, the one-kernel one at 256 (the default), 128 and 64
// dot-product threads per block (80, 160 and 320 blocks at V4's shapes),
// and the two-kernel one with fuse_hc_finish4 (or fuse_hc_finish4s,
// "fin4s") and/or fuse_hc_dots4.
var hcBenchVariants = []struct {
	name    string
	variant HCFuseVariant
	threads int
	dots4   bool
}{
	{"two", HCFuseTwo, 0, false},
	{"one", HCFuseOne, hcOneThreads, false},
	{"one128", HCFuseOne, 128, false},
	{"one64", HCFuseOne, 64, false},
	{"two-fin4", HCFuseTwoFin4, 0, false},
	{"two-dots4", HCFuseTwo, 0, true},
	{"two-fin4-dots4", HCFuseTwoFin4, 0, true},
	{"two-fin4s", HCFuseTwoFin4S, 0, false},
	{"two-fin4s-dots4", HCFuseTwoFin4S, 0, true},
}

// BenchmarkHCBoundaryParts times each kernel of the two-kernel decode
// boundary alone (V4-Flash shapes as BenchmarkHCBoundary's, hc_fn hot in
// L2), fuseGraphCalls launches of it captured in a CUDA graph: "dots"
// (fuse_hc_dots), "dots4" (fuse_hc_dots4, fuse_hc_dots4_t1 at b1;
// $MOXIE_CUDA_HCDOTS=new), "fin"
// (fuse_hc_finish, $MOXIE_CUDA_HCFIN=old), "fin4" (fuse_hc_finish4,
// $MOXIE_CUDA_HCFIN=new) and "fin4s" (fuse_hc_finish4s,
// $MOXIE_CUDA_HCFIN=short) over the partials and x' one fuse_hc_dots left. It
// reports device microseconds per launch.
func BenchmarkHCBoundaryParts(b *testing.B) {
	dev := testDevice(b)
	for _, T := range []int{1, 4} {
		for _, part := range []string{"dots", "dots4", "fin", "fin4", "fin4s"} {
			b.Run(fmt.Sprintf("b%d/%s", T, part), func(b *testing.B) {
				var us float64
				err := dev.Do(func(c *Ctx) error {
					d := &devBufs{c: c}
					defer d.free()
					one, err := hcBenchPart(c, d, T, part)
					if err != nil {
						return err
					}
					us, err = graphTime(b, c, fuseGraphCalls, one)
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(us, "device-us/op")
			})
		}
	}
}

// hcBenchPart returns the function that launches one kernel of the
// two-kernel boundary (part: "dots", "dots4", "fin", "fin4" or "fin4s") on the buffers of
// hcBenchBoundaries (one site), after one whole boundary has filled the
// partials and x'.
func hcBenchPart(c *Ctx, d *devBufs, T int, part string) (func() error, error) {
	const hc, D = 4, 4096
	args, ps := hcBenchSetup(c, d, T, 1, HCFuseTwo)
	d.synced()
	if d.err != nil {
		return nil, d.err
	}
	p := ps[0]
	if err := c.hcNormVariant("HCMixNorm", args, p, 0, HCFuseTwo, 0, false, c.Stream()); err != nil {
		return nil, err
	}
	n := hc * D
	rows := p.Fn.Rows
	rb, groups, splits, cq, threads := hcSplitShape(rows, n)
	s := c.Stream()
	fn, scratch := p.Fn.Data, args.Scratch
	code := int32(4) // F32 hc_fn
	hc32, n32, d32, nm, b32 := int32(hc), int32(n), int32(D), int32(rows), int32(T)
	s32, cq32, rb32 := int32(splits), int32(cq), int32(rb)
	x, o, post0, comb0, xout := args.X, args.O, args.Post, args.Comb, args.XOut
	iters, eps, neps, reps := int32(p.Iters), p.Eps, p.NormEps, args.Eps
	base, scale := p.Base, p.Scale
	pre, post, comb, out, norm := args.Pre, args.PostOut, args.CombOut, args.A, args.Norm
	head := int32(0)
	fin := Dim3{X: uint32(T), Y: 2}
	bd := Dim3{X: uint32(rmsThreads(D))}
	switch part {
	case "dots", "dots4":
		grid := Dim3{X: uint32(groups), Y: uint32(splits), Z: uint32((T + hcSplitTB - 1) / hcSplitTB)}
		// x' goes to a buffer of its own, so the finish's inputs stay put.
		xo := d.alloc(4 * T * n)
		kernel := "fuse_hc_dots"
		if part == "dots4" {
			kernel = hcDots4Kernel(T)
		}
		return func() error {
			return c.launchFuse(kernel, grid, Dim3{X: uint32(threads)}, 0, s,
				ptr(&scratch), ptr(&x), ptr(&o), ptr(&post0), ptr(&comb0), ptr(&xo), ptr(&fn), ptr(&code),
				ptr(&n32), ptr(&nm), ptr(&cq32), ptr(&rb32), ptr(&b32), ptr(&hc32), ptr(&d32))
		}, d.err
	case "fin":
		return func() error {
			return c.launchFuse("fuse_hc_finish", fin, bd, 4*(rows+1)*splits, s,
				ptr(&pre), ptr(&post), ptr(&comb), ptr(&out), ptr(&xout), ptr(&norm), ptr(&scratch), ptr(&base), ptr(&scale),
				ptr(&hc32), ptr(&d32), ptr(&nm), ptr(&s32), ptr(&iters), ptr(&eps), ptr(&neps), ptr(&head), ptr(&reps))
		}, nil
	case "fin4", "fin4s":
		if !hcFinish4Fits(hc, D, splits, scratch) || (part == "fin4s" && !hcFinish4sFits(D)) {
			return nil, fmt.Errorf("fuse_hc_finish4 does not fit the V4 boundary (splits %d, scratch %#x)", splits, scratch)
		}
		kernel := "fuse_hc_finish4"
		if part == "fin4s" {
			kernel = "fuse_hc_finish4s"
		}
		return func() error {
			return c.launchFuse(kernel, fin, bd, 0, s,
				ptr(&pre), ptr(&post), ptr(&comb), ptr(&out), ptr(&xout), ptr(&norm), ptr(&scratch), ptr(&base), ptr(&scale),
				ptr(&d32), ptr(&nm), ptr(&s32), ptr(&iters), ptr(&eps), ptr(&neps), ptr(&head), ptr(&reps))
		}, nil
	}
	return nil, fmt.Errorf("unknown boundary part %q", part)
}

// hcBenchBoundaries allocates the buffers of sites V4-Flash mix boundaries
// of T tokens (each its own copy of one random hc_fn; the streams, outputs
// and scratch shared as in a decode step) and returns the function that
// enqueues one boundary per site, in order, with the given implementation
// (errors stick in d).
func hcBenchBoundaries(c *Ctx, d *devBufs, T, sites int, variant HCFuseVariant, threads int, dots4 bool) func() error {
	args, ps := hcBenchSetup(c, d, T, sites, variant)
	s := c.Stream()
	return func() error {
		for _, p := range ps {
			if err := c.hcNormVariant("HCMixNorm", args, p, 0, variant, threads, dots4, s); err != nil {
				return err
			}
		}
		return nil
	}
}

// hcBenchSetup allocates hcBenchBoundaries's buffers and returns the
// boundary's arguments and the sites' parameters.
func hcBenchSetup(c *Ctx, d *devBufs, T, sites int, variant HCFuseVariant) (*HCNorm, []*HC) {
	const hc, D = 4, 4096
	const eps = 1e-6
	nm := (2 + hc) * hc
	rng := rand.New(rand.NewPCG(11, uint64(T)))
	fn := computetest.RandomWeight(rng, compute.F32, nm, hc*D, 0.02)
	ps := make([]*HC, sites)
	base, scale := d.floats(computetest.Normal(rng, nm, 1)), d.floats(computetest.Normal(rng, 3, 1))
	for i := range ps {
		ps[i] = &HC{Fn: d.weight(fn), Base: base, Scale: scale, HC: hc, Iters: 20, Eps: 1e-6, NormEps: 1e-6}
	}
	post0, comb0 := make([]float32, T*hc), make([]float32, T*hc*hc)
	for i := range post0 {
		post0[i] = 1
	}
	for i := range comb0 {
		comb0[i] = 1 / float32(hc)
	}
	x, o := d.floats(computetest.Normal(rng, T*hc*D, 1)), d.floats(computetest.Normal(rng, T*D, 1))
	post, comb := d.floats(post0), d.floats(comb0)
	args := &HCNorm{X: x, O: o, Post: post, Comb: comb, XOut: d.alloc(4 * T * hc * D), Pre: d.alloc(4 * T * hc),
		PostOut: post, CombOut: comb, A: d.alloc(4 * T * D), Norm: d.floats(computetest.Normal(rng, D, 1)), Eps: eps,
		Scratch: d.alloc(HCNormScratchBytes(hc, D, T)), T: T}
	if variant == HCFuseOne {
		args.Counters = d.alloc(HCNormCounterBytes(T))
		if d.err == nil {
			d.check(c.Memset(args.Counters, 0, HCNormCounterBytes(T), c.Stream()))
		}
	}
	return args, ps
}

// BenchmarkHCPrefill times one sublayer boundary (HCMixNorm with the
// expand, V4-Flash shapes: hc 4, D 4096, F32 hc_fn) of T tokens, a prefill
// chunk's, captured in a CUDA graph and timed with CUDA events, for each
// implementation: "two" (fuse_hc_dots + fuse_hc_finish: what a prefill
// chunk ran before, and with MOXIE_CUDA_HCPREFILL=old), "one" (fuse_hc_one)
// and "prefill" (fuse_hcp_dots + fuse_hcp_finish4, the default from
// hcPrefillMinT tokens). It reports device microseconds per boundary.
func BenchmarkHCPrefill(b *testing.B) {
	dev := testDevice(b)
	for _, T := range []int{16, 512, 2048} {
		for _, vr := range []struct {
			name    string
			variant HCFuseVariant
			threads int
		}{{"two", HCFuseTwo, 0}, {"one", HCFuseOne, hcOneThreads}, {"prefill", HCFusePrefill, 0}} {
			b.Run(fmt.Sprintf("b%d/%s", T, vr.name), func(b *testing.B) {
				var us float64
				err := dev.Do(func(c *Ctx) error {
					d := &devBufs{c: c}
					defer d.free()
					one := hcBenchBoundaries(c, d, T, 1, vr.variant, vr.threads, false)
					d.synced()
					if d.err != nil {
						return d.err
					}
					var err error
					us, err = graphTime(b, c, max(1, fuseGraphCalls*16/T), one)
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(us, "device-us/op")
				b.ReportMetric(us*1000/float64(T), "device-ns/token")
			})
		}
	}
}
