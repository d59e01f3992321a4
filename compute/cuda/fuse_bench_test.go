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
// (two and one virtual blocks per block; see hcBenchVariants). "hot" replays fuseGraphCalls boundaries of one site (its
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
						one := hcBenchBoundaries(c, d, T, sites, vr.variant, vr.threads)
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
// boundary and the one-kernel one at 256 (the default), 128 and 64
// dot-product threads per block (80, 160 and 320 blocks at V4's shapes).
var hcBenchVariants = []struct {
	name    string
	variant HCFuseVariant
	threads int
}{
	{"two", HCFuseTwo, 0},
	{"one", HCFuseOne, hcOneThreads},
	{"one128", HCFuseOne, 128},
	{"one64", HCFuseOne, 64},
}

// hcBenchBoundaries allocates the buffers of sites V4-Flash mix boundaries
// of T tokens (each its own copy of one random hc_fn; the streams, outputs
// and scratch shared as in a decode step) and returns the function that
// enqueues one boundary per site, in order, with the given implementation
// (errors stick in d).
func hcBenchBoundaries(c *Ctx, d *devBufs, T, sites int, variant HCFuseVariant, threads int) func() error {
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
	s := c.Stream()
	return func() error {
		for _, p := range ps {
			if err := c.hcNormVariant("HCMixNorm", args, p, 0, variant, threads, s); err != nil {
				return err
			}
		}
		return nil
	}
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
					one := hcBenchBoundaries(c, d, T, 1, vr.variant, vr.threads)
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
