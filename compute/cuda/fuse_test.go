package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"moxie/compute"
	"moxie/compute/computetest"
	"moxie/compute/ref"
)

// The fused ops (fuse.go) are checked twice on the same inputs: against the
// chain of unfused GPU ops they replace (the same float32 operations in the
// same order, so the bound is tight: fuseTol, and the maximum error is
// logged), and against compute/ref float64 compositions (the unfused ops'
// own tolerances).

// fuseTol bounds the max-relative difference between a fused op and its
// unfused chain where both run the same float32 operations.
const fuseTol = 1e-6

// fuseCmp compares a fused result with the unfused chain's, logs the
// maximum relative difference (and whether the bits agree) and fails above tol.
func fuseCmp(t *testing.T, what string, fused, unfused []float32, tol float64) {
	t.Helper()
	r := computetest.MaxRel(fused, f64s(unfused))
	t.Logf("%s: fused vs unfused max rel. error %.3g (bit-identical %v)", what, r, bitsEqual(fused, unfused))
	if !(r <= tol) {
		t.Errorf("%s: fused vs unfused max relative error %.3g > %.3g", what, r, tol)
	}
}

// withSplitHCMix runs f with the device's HCMix on its split path (the one
// the fused boundary reproduces) and restores the previous choice.
func withSplitHCMix(t testing.TB, f func()) {
	defer splitHCMix(t)()
	f()
}

// splitHCMix puts the device's HCMix on its split path and returns the
// function that restores the previous choice.
func splitHCMix(t testing.TB) (restore func()) {
	dev := testDevice(t)
	var prev hcMixState
	if err := dev.Do(func(c *Ctx) error {
		if _, err := c.hcMixChoice(); err != nil {
			return err
		}
		prev = c.d.hcMix
		return c.setHCMixSplit(true)
	}); err != nil {
		t.Fatal(err)
	}
	return func() {
		_ = dev.Do(func(c *Ctx) error { c.d.hcMix.chosen, c.d.hcMix.split = prev.chosen, prev.split; return nil })
	}
}

// hcNormCase is one fused-boundary configuration.
type hcNormCase struct {
	f        compute.Format
	hc, D    int
	Ts       []int
	weighted bool // RMSNorm with a weight (else unweighted)
}

func TestFuseHCNorm(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 3))
	cases := []hcNormCase{
		{compute.F32, 4, 4096, []int{1, 3, 16, 37, 130}, true}, // V4 decode shapes; 37: past the split path of HCMix; 130: three prefill tiles
		{compute.BF16, 4, 4096, []int{1, 3, 16}, true},
		{compute.F32, 6, 100, []int{1, 3, 16}, false}, // hc 6: comb on one thread, generic stream count
		{compute.BF16, 2, 36, []int{1, 3, 16}, true},  // 72 columns: fewer quads than splits
		{compute.F32, 3, 1028, []int{1, 3, 16}, true}, // odd stream count, a short last chunk
	}
	withSplitHCMix(t, func() {
		for _, tc := range cases {
			for _, T := range tc.Ts {
				for _, head := range []bool{false, true} {
					for _, expand := range []bool{true, false} {
						name := fmt.Sprintf("%s_hc%d_D%d_T%d_head%v_expand%v", tc.f, tc.hc, tc.D, T, head, expand)
						t.Run(name, func(t *testing.T) { testHCNorm(t, rng, tc, T, head, expand) })
					}
				}
			}
		}
	})
}

// hcNormVariants are the boundary implementations TestFuseHCNorm checks:
// the two-kernel one and the one-kernel one at the default block shape and
// at one virtual block per block (two collapse warps: the generic collapse),
// the prefill kernels, and the two-kernel one with fuse_hc_finish4 (or
// fuse_hc_finish4s, $MOXIE_CUDA_HCFIN=short) and/or fuse_hc_dots4
// ($MOXIE_CUDA_HCDOTS=new).
var hcNormVariants = []struct {
	name    string
	variant HCFuseVariant
	threads int
	dots4   bool
}{
	{"two", HCFuseTwo, 0, false},
	{"one", HCFuseOne, hcOneThreads, false},
	{"one64", HCFuseOne, 64, false},
	{"prefill", HCFusePrefill, 0, false},
	{"two-fin4", HCFuseTwoFin4, 0, false},
	{"two-dots4", HCFuseTwo, 0, true},
	{"two-fin4-dots4", HCFuseTwoFin4, 0, true},
	{"two-fin4s", HCFuseTwoFin4S, 0, false},
	{"two-fin4s-dots4", HCFuseTwoFin4S, 0, true},
}

// TestFuseFinish4Compile checks that the fuse module (compiled for sm_90
// without a GPU; skipped without NVRTC) defines fuse_hc_finish4 and
// fuse_hc_finish4s, their register counts and stack frames logged.
func TestFuseFinish4Compile(t *testing.T) {
	img := compileModuleForTest(t, "fuse", FuseSource())
	requireKernels(t, img, "fuse_hc_finish4", "fuse_hc_finish4s")
	res := cubinResources(t, img)
	for _, n := range []string{"fuse_hc_finish", "fuse_hc_finish4", "fuse_hc_finish4s"} {
		r, ok := res[n]
		if !ok {
			t.Errorf("%s has no register count in the CUBIN's .nv.info", n)
			continue
		}
		t.Logf("%s: %d registers, %d-byte stack frame", n, r.regs, r.frame)
	}
}

// TestFuseDots4Compile checks that the fuse module (compiled for sm_90
// without a GPU; skipped without NVRTC) defines fuse_hc_dots4 and
// fuse_hc_dots4_t1 beside fuse_hc_dots.
func TestFuseDots4Compile(t *testing.T) {
	requireKernels(t, compileModuleForTest(t, "fuse", FuseSource()), "fuse_hc_dots4", "fuse_hc_dots4_t1", "fuse_hc_dots")
}

// TestHCDotsSwitch checks ParseHCDots ($MOXIE_CUDA_HCDOTS), hcDots4Fits,
// and that HCMixNorm reports a bad value before it launches anything.
func TestHCDotsSwitch(t *testing.T) {
	for _, tc := range []struct {
		in        string
		T         int
		dots4, ok bool
	}{{"", 1, true, true}, {"", 2, false, true}, {"", 512, false, true}, {"old", 1, false, true}, {"new", 1, true, true}, {"new", 64, true, true},
		{"New", 1, false, false}, {"4", 1, false, false}} {
		t.Run(fmt.Sprintf("%s/T%d", tc.in, tc.T), func(t *testing.T) {
			dots4, err := ParseHCDots(tc.in, tc.T)
			switch {
			case tc.ok && (err != nil || dots4 != tc.dots4):
				t.Errorf("ParseHCDots(%q, %d) = %v, %v; want %v, nil", tc.in, tc.T, dots4, err, tc.dots4)
			case !tc.ok && (err == nil || !strings.Contains(err.Error(), "MOXIE_CUDA_HCDOTS")):
				t.Errorf("ParseHCDots(%q, %d) = %v, %v; want an error naming MOXIE_CUDA_HCDOTS", tc.in, tc.T, dots4, err)
			}
		})
	}
	for hc, want := range map[int]bool{4: true, 2: false, 3: false, 6: false} {
		if got := hcDots4Fits(hc); got != want {
			t.Errorf("hcDots4Fits(%d) = %v, want %v", hc, got, want)
		}
	}
	for T, want := range map[int]string{1: "fuse_hc_dots4_t1", 2: "fuse_hc_dots4", 4: "fuse_hc_dots4", 130: "fuse_hc_dots4"} {
		if got := hcDots4Kernel(T); got != want {
			t.Errorf("hcDots4Kernel(%d) = %s, want %s", T, got, want)
		}
	}
	t.Setenv("MOXIE_CUDA_HCDOTS", "fast")
	var c *Ctx
	err := c.HCMixNorm(&HCNorm{T: 1}, &HC{}, Stream{})
	if err == nil || !strings.Contains(err.Error(), "MOXIE_CUDA_HCDOTS") {
		t.Errorf("HCMixNorm with MOXIE_CUDA_HCDOTS=fast: %v; want an error naming MOXIE_CUDA_HCDOTS", err)
	}
}

// TestHCFinishSwitch checks ParseHCFinishVariant ($MOXIE_CUDA_HCFIN) and
// that HCMixNorm reports a bad value before it launches anything.
func TestHCFinishSwitch(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want HCFuseVariant
		ok   bool
	}{{"", HCFuseTwoFin4, true}, {"new", HCFuseTwoFin4, true}, {"old", HCFuseTwo, true}, {"short", HCFuseTwoFin4S, true},
		{"Short", HCFuseTwo, false}, {"New", HCFuseTwo, false}, {"4", HCFuseTwo, false}, {"wide", HCFuseTwo, false}} {
		t.Run("variant/"+tc.in, func(t *testing.T) {
			got, err := ParseHCFinishVariant(tc.in)
			switch {
			case tc.ok && (err != nil || got != tc.want):
				t.Errorf("ParseHCFinishVariant(%q) = %v, %v; want %v, nil", tc.in, got, err, tc.want)
			case !tc.ok && (err == nil || !strings.Contains(err.Error(), "MOXIE_CUDA_HCFIN")):
				t.Errorf("ParseHCFinishVariant(%q) = %v, %v; want an error naming MOXIE_CUDA_HCFIN", tc.in, got, err)
			}
		})
	}
	// fuse_hc_finish4s needs two warps (rmsThreads >= 64: D >= 256).
	for _, tc := range []struct {
		variant HCFuseVariant
		dim     int
		want    string
	}{{HCFuseTwoFin4S, 4096, "fuse_hc_finish4s"}, {HCFuseTwoFin4S, 256, "fuse_hc_finish4s"}, {HCFuseTwoFin4S, 252, "fuse_hc_finish4"},
		{HCFuseTwoFin4S, 120, "fuse_hc_finish4"}, {HCFuseTwoFin4, 4096, "fuse_hc_finish4"}} {
		if got := hcFinish4Kernel(tc.variant, tc.dim); got != tc.want {
			t.Errorf("hcFinish4Kernel(%v, %d) = %s, want %s", tc.variant, tc.dim, got, tc.want)
		}
	}
	if got := HCFuseTwoFin4S.String(); got != "two-fin4s" {
		t.Errorf("HCFuseTwoFin4S.String() = %q, want two-fin4s", got)
	}
	t.Setenv("MOXIE_CUDA_HCFIN", "fast")
	var c *Ctx
	err := c.HCMixNorm(&HCNorm{T: 1}, &HC{}, Stream{})
	if err == nil || !strings.Contains(err.Error(), "MOXIE_CUDA_HCFIN") {
		t.Errorf("HCMixNorm with MOXIE_CUDA_HCFIN=fast: %v; want an error naming MOXIE_CUDA_HCFIN", err)
	}
}

// TestHCFinish4Fits checks where fuse_hc_finish4 may replace fuse_hc_finish.
func TestHCFinish4Fits(t *testing.T) {
	_, _, splits, _, _ := hcSplitShape(24, 4*4096)
	for _, tc := range []struct {
		name            string
		hc, dim, splits int
		scratch         DevicePtr
		want            bool
	}{
		{"v4", 4, 4096, splits, 0x1000, true},
		{"v4-head", 4, 4096, 64, 0x1000, true},
		{"hc3", 3, 4096, splits, 0x1000, false},
		{"odd-splits", 4, 4096, 6, 0x1000, false},
		{"many-splits", 4, 4096, 128, 0x1000, false},
		{"scratch-8", 4, 4096, splits, 0x1008, false},
		{"dim-8192", 4, 8192, splits, 0x1000, false},
		{"dim-1000", 4, 1000, splits, 0x1000, false},
		{"dim-1024", 4, 1024, splits, 0x1000, true},
		{"dim-100", 4, 100, splits, 0x1000, true},
		{"dim-4100", 4, 4100, splits, 0x1000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := hcFinish4Fits(tc.hc, tc.dim, tc.splits, tc.scratch); got != tc.want {
				t.Errorf("hcFinish4Fits(%d, %d, %d, %#x) = %v, want %v", tc.hc, tc.dim, tc.splits, tc.scratch, got, tc.want)
			}
		})
	}
}

func testHCNorm(t *testing.T, rng *rand.Rand, tc hcNormCase, T int, head, expand bool) {
	hc, D := tc.hc, tc.D
	n := hc * D
	nm := (2 + hc) * hc
	fd := computetest.RandomWeight(rng, tc.f, nm, n, 0.3/math.Sqrt(float64(n)))
	if head {
		fd.Rows = hc
		fd.Data = fd.Data[:len(fd.Data)*hc/nm]
	}
	base, scale := computetest.Normal(rng, nm, 1), computetest.Normal(rng, 3, 1)
	scale[2] = 4
	x, o := computetest.Normal(rng, T*n, 1), computetest.Normal(rng, T*D, 1)
	post0, comb0 := make([]float32, T*hc), make([]float32, T*hc*hc)
	for i := range post0 {
		post0[i] = 2 * rng.Float32()
	}
	for i := range comb0 {
		comb0[i] = rng.Float32() / float32(hc)
	}
	var w []float32
	if tc.weighted {
		w = computetest.Normal(rng, D, 1)
	}
	const eps = 1e-6
	type out struct{ xs, pre, post, comb, a []float32 }
	var un out
	fus := make([]out, len(hcNormVariants))
	warm := make([]out, len(hcNormVariants)) // the one-kernel variants' first launch on the same counters
	ctrs := make([][]int32, len(hcNormVariants))
	nctr := HCNormCounterBytes(T) / 4
	onDevice(t, func(c *Ctx, d *devBufs) {
		p := &HC{Fn: d.weight(fd), Base: d.floats(base), Scale: d.floats(scale), HC: hc, Iters: 20, Eps: 1e-6, NormEps: 1e-6}
		dx, do, dp0, dc0 := d.floats(x), d.floats(o), d.floats(post0), d.floats(comb0)
		var dw DevicePtr
		if w != nil {
			dw = d.floats(w)
		}
		scratch := d.alloc(HCNormScratchBytes(hc, D, T))
		d.synced()
		s := c.Stream()
		// The unfused chain.
		xsU, preU, postU, combU, aU := dx, d.poisoned(T*hc), d.poisoned(T*hc), d.poisoned(T*hc*hc), d.poisoned(T*D)
		if expand {
			xsU = d.poisoned(T * n)
			d.check(c.HCExpand(xsU, dx, do, dp0, dc0, hc, D, T, s))
		}
		if d.err == nil {
			if head {
				d.check(c.HCHeadPre(preU, xsU, p, T, s))
			} else {
				d.check(c.HCMix(preU, postU, combU, xsU, p, T, s))
			}
		}
		d.check(c.HCCollapse(aU, xsU, preU, hc, D, T, s))
		d.check(c.RMSNorm(aU, aU, dw, T, D, eps, s))
		un.a, un.pre = d.getFloats(aU, T*D), d.getFloats(preU, T*hc)
		if expand {
			un.xs = d.getFloats(xsU, T*n)
		}
		if !head {
			un.post, un.comb = d.getFloats(postU, T*hc), d.getFloats(combU, T*hc*hc)
		}
		// The fused op, Post/Comb and PostOut/CombOut the same buffers.
		run := func(v int, ctr DevicePtr) out {
			dp1, dc1 := d.floats(post0), d.floats(comb0) // the coefficients, updated in place
			d.synced()
			args := &HCNorm{X: dx, Pre: d.poisoned(T * hc), PostOut: dp1, CombOut: dc1, A: d.poisoned(T * D), Norm: dw, Eps: eps, Scratch: scratch, Counters: ctr, T: T}
			if expand {
				args.O, args.Post, args.Comb, args.XOut = do, dp1, dc1, d.poisoned(T*n)
			}
			if d.err == nil {
				op, h := "HCMixNorm", int32(0)
				if head {
					op, h = "HCHeadNorm", 1
				}
				vr := hcNormVariants[v]
				d.check(c.hcNormVariant(op, args, p, h, vr.variant, vr.threads, vr.dots4, s))
			}
			var f out
			f.a, f.pre = d.getFloats(args.A, T*D), d.getFloats(args.Pre, T*hc)
			if expand {
				f.xs = d.getFloats(args.XOut, T*n)
			}
			f.post, f.comb = d.getFloats(dp1, T*hc), d.getFloats(dc1, T*hc*hc)
			return f
		}
		for v, vr := range hcNormVariants {
			var ctr DevicePtr
			if vr.variant == HCFuseOne {
				ctr = d.alloc(4 * nctr)
				if d.err == nil {
					d.check(c.Memset(ctr, 0, 4*nctr, s))
				}
				warm[v] = run(v, ctr)
			}
			fus[v] = run(v, ctr)
			if ctr != 0 {
				ctrs[v] = d.getInt32s(ctr, nctr)
			}
		}
	})
	if t.Failed() {
		return
	}
	// Every variant runs the same float32 operations in the same order, at
	// any T (the split shape does not depend on T): each one's results are
	// within fuseTol of the two-kernel boundary's (bit-identity logged), and
	// the prefill kernels' are the one-kernel boundary's bits (the same
	// finish code, hco_finish, on bit-identical partials); fuse_hc_finish4's
	// and fuse_hc_finish4s's are fuse_hc_finish's bits (same partials, same
	// float32 operations),
	// and fuse_hc_dots4's partials and x' are fuse_hc_dots's bits, so every
	// variant with it gives the two-kernel boundary's bits.
	rows := (2 + hc) * hc
	if head {
		rows = hc
	}
	_, _, _, cq, threads := hcSplitShape(rows, n)
	_, _, fits := hcPrefillShape(rows, cq, threads)
	for v, vr := range hcNormVariants {
		if v == 0 { // "two", the reference
			continue
		}
		if vr.variant == HCFusePrefill {
			t.Logf("prefill kernels fit this site: %v", fits)
		}
		for ref, rv := range hcNormVariants[:2] { // "two", "one"
			if ref == v {
				continue
			}
			fu, w := fus[v], fus[ref]
			for _, c := range []struct {
				what string
				f, w []float32
			}{{"a", fu.a, w.a}, {"pre", fu.pre, w.pre}, {"post", fu.post, w.post}, {"comb", fu.comb, w.comb}, {"x'", fu.xs, w.xs}} {
				r, same := computetest.MaxRel(c.f, f64s(c.w)), bitsEqual(c.f, c.w)
				if rv.variant == HCFuseTwo {
					t.Logf("%s vs %s: %s max rel. %.3g (bit-identical %v)", vr.name, rv.name, c.what, r, same)
				}
				if !(r <= fuseTol) || (fits && vr.variant == HCFusePrefill && rv.variant == HCFuseOne && !same) ||
					((vr.variant == HCFuseTwoFin4 || vr.variant == HCFuseTwoFin4S) && rv.variant == HCFuseTwo && !same) ||
					(vr.dots4 && rv.variant == HCFuseTwo && !same) {
					t.Errorf("%s vs %s: %s max rel. %.3g, bit-identical %v", vr.name, rv.name, c.what, r, same)
				}
			}
		}
	}
	for v, vr := range hcNormVariants {
		t.Run(vr.name, func(t *testing.T) {
			fu := fus[v]
			if vr.variant == HCFuseOne {
				for i, k := range ctrs[v] {
					if k != 0 {
						t.Errorf("counter %d is %d after the boundary, want 0", i, k)
					}
				}
				// The second launch on the same counters repeats the first.
				wu := warm[v]
				for _, c := range []struct {
					what string
					f, w []float32
				}{{"a", fu.a, wu.a}, {"pre", fu.pre, wu.pre}, {"post", fu.post, wu.post}, {"comb", fu.comb, wu.comb}, {"x'", fu.xs, wu.xs}} {
					if !bitsEqual(c.f, c.w) {
						t.Errorf("%s: second launch on the same counters differs from the first", c.what)
					}
				}
			}
			checkHCNorm(t, tc, T, head, expand, fd, base, scale, x, o, post0, comb0, w, fu.xs, fu.pre, fu.post, fu.comb, fu.a, un.xs, un.pre, un.post, un.comb, un.a)
		})
	}
}

// checkHCNorm compares one fused boundary's results (fu*) with the unfused
// chain's (un*) and with the float64 composition.
func checkHCNorm(t *testing.T, tc hcNormCase, T int, head, expand bool, fd compute.WeightData, base, scale, x, o, post0, comb0, w []float32,
	fuXs, fuPre, fuPost, fuComb, fuA, unXs, unPre, unPost, unComb, unA []float32) {
	t.Helper()
	hc, D := tc.hc, tc.D
	n := hc * D
	const eps = 1e-6
	// Against the unfused chain: the same operations while HCMix takes its
	// split path (batches up to hcSmallBatch); beyond, HCMix sums its dots in
	// another order and the bound is HCMix's own.
	tol := fuseTol
	if T > hcSmallBatch {
		tol = computetest.TolHCMix
	}
	if expand {
		fuseCmp(t, "x'", fuXs, unXs, fuseTol)
	}
	fuseCmp(t, "pre", fuPre, unPre, tol)
	if head {
		if !bitsEqual(fuPost, post0) || !bitsEqual(fuComb, comb0) {
			t.Errorf("HCHeadNorm changed Post or Comb")
		}
	} else {
		fuseCmp(t, "post", fuPost, unPost, tol)
		fuseCmp(t, "comb", fuComb, unComb, tol)
	}
	fuseCmp(t, "a", fuA, unA, tol)
	// Against the float64 composition.
	fn := ref.Dequant(fd)
	var w64 []float64
	if w != nil {
		w64 = f64s(w)
	}
	for b := range T {
		xs := f64s(x[b*n : (b+1)*n])
		if expand {
			xs = ref.HCExpand(xs, f64s(o[b*D:(b+1)*D]), f64s(post0[b*hc:(b+1)*hc]), f64s(comb0[b*hc*hc:(b+1)*hc*hc]), hc, D)
			expectRel(t, fmt.Sprint("ref x' ", b), fuXs[b*n:(b+1)*n], xs, computetest.TolElemwise)
		}
		var pre []float64
		if head {
			pre = ref.HCHeadPre(xs, fn, f64s(base[:hc]), f64s(scale[:1]), hc, 1e-6, 1e-6)
		} else {
			var post, comb []float64
			pre, post, comb = ref.HCMix(xs, fn, f64s(base), f64s(scale), hc, 20, 1e-6, 1e-6)
			expectRel(t, fmt.Sprint("ref post ", b), fuPost[b*hc:(b+1)*hc], post, computetest.TolHCMix)
			expectRel(t, fmt.Sprint("ref comb ", b), fuComb[b*hc*hc:(b+1)*hc*hc], comb, computetest.TolHCMix)
		}
		expectRel(t, fmt.Sprint("ref pre ", b), fuPre[b*hc:(b+1)*hc], pre, computetest.TolHCMix)
		a := ref.RMSNorm(ref.HCCollapse(xs, pre, hc, D), w64, D, eps)
		expectRel(t, fmt.Sprint("ref a ", b), fuA[b*D:(b+1)*D], a, computetest.TolHCMix)
	}
}

// ropeFreqs returns nf rotation frequencies: V4's YaRN table for nf 32,
// plain base-10000 ones otherwise.
func ropeFreqs(nf int) []float32 {
	if nf == 32 {
		return compute.RopeFreqs(160000, 64, &compute.YaRN{Factor: 16, OriginalSeqLen: 65536, BetaFast: 32, BetaSlow: 1})
	}
	return compute.RopeFreqs(10000, 2*nf, nil)
}

func TestFuseQNormRoPE(t *testing.T) {
	rng := rand.New(rand.NewPCG(43, 5))
	for _, sh := range [][3]int{{64, 512, 32}, {5, 36, 7}, {3, 64, 32}, {2, 1500, 32}} { // heads, dim, nfreq
		heads, dim, nf := sh[0], sh[1], sh[2]
		for _, T := range []int{1, 3, 16} {
			t.Run(fmt.Sprintf("H%d_d%d_nf%d_T%d", heads, dim, nf, T), func(t *testing.T) {
				freq := ropeFreqs(nf)
				pos := make([]int32, T)
				for i := range pos {
					pos[i] = int32(rng.IntN(1 << 20))
				}
				q := computetest.Normal(rng, T*heads*dim, 3)
				const eps = 1e-6
				var fused, unfused []float32
				onDevice(t, func(c *Ctx, d *devBufs) {
					qu, qf, dp, df := d.floats(q), d.floats(q), d.int32s(pos), d.floats(freq)
					d.synced()
					s := c.Stream()
					d.check(c.RMSNorm(qu, qu, 0, T*heads, dim, eps, s))
					d.check(c.RoPE(qu, dp, df, T, heads*dim, dim, nf, false, s))
					d.check(c.QNormRoPE(qf, dp, df, T, heads, dim, nf, eps, s))
					unfused, fused = d.getFloats(qu, len(q)), d.getFloats(qf, len(q))
				})
				if t.Failed() {
					return
				}
				fuseCmp(t, "q", fused, unfused, fuseTol)
				for i := range T {
					row := q[i*heads*dim : (i+1)*heads*dim]
					want := ref.RoPE(ref.RMSNorm(f64s(row), nil, dim, eps), int(pos[i]), freq, dim, false)
					expectRel(t, fmt.Sprint("ref token ", i), fused[i*heads*dim:(i+1)*heads*dim], want, computetest.TolElemwise)
				}
			})
		}
	}
}

func TestFuseKVNormRoPEStore(t *testing.T) {
	rng := rand.New(rand.NewPCG(47, 7))
	for _, sh := range [][3]int{{512, 32, 128}, {36, 7, 5}, {64, 32, 8}} { // dim, nfreq, window
		dim, nf, window := sh[0], sh[1], sh[2]
		for _, T := range []int{1, 3, 16} {
			t.Run(fmt.Sprintf("d%d_nf%d_T%d", dim, nf, T), func(t *testing.T) {
				freq := ropeFreqs(nf)
				ringRows := window + T
				p0 := 1000 + rng.IntN(1000) // the chunk's positions wrap around the ring
				pos := make([]int32, T)
				for i := range pos {
					pos[i] = int32(p0 + i)
				}
				kv, w := computetest.Normal(rng, T*dim, 2), computetest.Normal(rng, dim, 1)
				ring0 := computetest.Normal(rng, ringRows*dim, 1)
				const eps = 1e-6
				var fused, unfused, kvAfter []float32
				onDevice(t, func(c *Ctx, d *devBufs) {
					f, err := c.Fwd()
					if err != nil {
						d.check(err)
						return
					}
					kvu, kvf, dw, dp, df := d.floats(kv), d.floats(kv), d.floats(w), d.int32s(pos), d.floats(freq)
					ru, rf := d.floats(ring0), d.floats(ring0)
					d.synced()
					s := c.Stream()
					d.check(c.RMSNorm(kvu, kvu, dw, T, dim, eps, s))
					d.check(c.RoPE(kvu, dp, df, T, dim, dim, nf, false, s))
					if d.err == nil {
						d.check(f.RingStore(c, ru, kvu, dp, T, ringRows, dim, s))
					}
					d.check(c.KVNormRoPEStore(rf, kvf, dw, dp, df, T, ringRows, dim, nf, eps, s))
					unfused, fused = d.getFloats(ru, ringRows*dim), d.getFloats(rf, ringRows*dim)
					kvAfter = d.getFloats(kvf, T*dim)
				})
				if t.Failed() {
					return
				}
				fuseCmp(t, "ring", fused, unfused, fuseTol)
				if !bitsEqual(kvAfter, kv) {
					t.Errorf("kv was modified")
				}
				for i := range T {
					r := (p0 + i) % ringRows
					row := ref.RoPE(ref.RMSNorm(f64s(kv[i*dim:(i+1)*dim]), f64s(w), dim, eps), p0+i, freq, dim, false)
					expectRel(t, fmt.Sprint("ref token ", i), fused[r*dim:(r+1)*dim], row, computetest.TolElemwise)
				}
				for r := range ringRows { // the rows no token owns are untouched
					if !ownsRow(r, p0, T, ringRows) && !bitsEqual(fused[r*dim:(r+1)*dim], ring0[r*dim:(r+1)*dim]) {
						t.Errorf("ring row %d (no token's) changed", r)
					}
				}
			})
		}
	}
}

// ownsRow reports whether one of the T positions p0.. lands in ring row r.
func ownsRow(r, p0, T, ringRows int) bool {
	for i := range T {
		if (p0+i)%ringRows == r {
			return true
		}
	}
	return false
}

func TestFuseRoPEScale(t *testing.T) {
	rng := rand.New(rand.NewPCG(53, 9))
	for _, sh := range [][4]int{{64, 128, 32, 1}, {64, 128, 32, 16}, {3, 20, 5, 3}} { // heads, dim, nfreq, T
		heads, dim, nf, T := sh[0], sh[1], sh[2], sh[3]
		for _, n := range []int{T * heads, 0} {
			t.Run(fmt.Sprintf("H%d_d%d_nf%d_T%d_n%d", heads, dim, nf, T, n), func(t *testing.T) {
				freq := ropeFreqs(nf)
				pos := make([]int32, T)
				for i := range pos {
					pos[i] = int32(rng.IntN(1 << 20))
				}
				x, y := computetest.Normal(rng, T*heads*dim, 1), computetest.Normal(rng, max(n, 1), 1)
				const a = 0.0110485
				var xf, xu, yf, yu []float32
				onDevice(t, func(c *Ctx, d *devBufs) {
					dxu, dxf, dyu, dyf, dp, df := d.floats(x), d.floats(x), d.floats(y), d.floats(y), d.int32s(pos), d.floats(freq)
					d.synced()
					s := c.Stream()
					d.check(c.RoPE(dxu, dp, df, T, heads*dim, dim, nf, false, s))
					d.check(c.Scale(dyu, a, n, s))
					d.check(c.RoPEScale(dxf, dp, df, T, heads*dim, dim, nf, dyf, a, n, s))
					xu, xf = d.getFloats(dxu, len(x)), d.getFloats(dxf, len(x))
					yu, yf = d.getFloats(dyu, len(y)), d.getFloats(dyf, len(y))
				})
				if t.Failed() {
					return
				}
				fuseCmp(t, "x", xf, xu, fuseTol)
				fuseCmp(t, "y", yf, yu, fuseTol)
				for i := range T {
					want := ref.RoPE(f64s(x[i*heads*dim:(i+1)*heads*dim]), int(pos[i]), freq, dim, false)
					expectRel(t, fmt.Sprint("ref x token ", i), xf[i*heads*dim:(i+1)*heads*dim], want, computetest.TolElemwise)
				}
				wy := f64s(y)
				for i := range n {
					wy[i] *= float64(float32(a))
				}
				expectRel(t, "ref y", yf, wy, computetest.TolElemwise)
			})
		}
	}
}

// TestFuseRowOps runs the two row-op launches a decode step's attention
// can use at V4-Flash shapes — the query latent's RMSNorm with the window
// KV's RMSNorm, RoPE and ring store; the queries' per-head RMSNorm and RoPE
// with the indexer queries' RoPE and the indexer weights' scaling — against
// the unfused ops and compute/ref.
func TestFuseRowOps(t *testing.T) {
	const qr, H, hd, nf, IH, ID, window = 1024, 64, 512, 32, 64, 128, 128
	const eps = 1e-6
	const sc = float32(0.011048543) // 128^-0.5 · 64^-0.5
	rng := rand.New(rand.NewPCG(59, 11))
	freq := ropeFreqs(nf)
	for _, T := range []int{1, 3, 16} {
		t.Run(fmt.Sprint("T", T), func(t *testing.T) {
			ringRows := window + T
			p0 := 3000 + rng.IntN(500)
			pos := make([]int32, T)
			for i := range pos {
				pos[i] = int32(p0 + i)
			}
			qlat, qnorm := computetest.Normal(rng, T*qr, 2), computetest.Normal(rng, qr, 1)
			kv, kvnorm := computetest.Normal(rng, T*hd, 2), computetest.Normal(rng, hd, 1)
			q, qi, wts := computetest.Normal(rng, T*H*hd, 1), computetest.Normal(rng, T*IH*ID, 1), computetest.Normal(rng, T*IH, 1)
			ring0 := computetest.Normal(rng, ringRows*hd, 1)
			type bufs struct{ qlat, ring, q, qi, wts []float32 }
			var fu, un bufs
			onDevice(t, func(c *Ctx, d *devBufs) {
				f, err := c.Fwd()
				d.check(err)
				dp, df, dqn, dkn := d.int32s(pos), d.floats(freq), d.floats(qnorm), d.floats(kvnorm)
				up := func() (DevicePtr, DevicePtr, DevicePtr, DevicePtr, DevicePtr, DevicePtr) {
					return d.floats(qlat), d.floats(kv), d.floats(ring0), d.floats(q), d.floats(qi), d.floats(wts)
				}
				uQlat, uKV, uRing, uQ, uQi, uW := up()
				fQlat, fKV, fRing, fQ, fQi, fW := up()
				d.synced()
				if d.err != nil {
					return
				}
				s := c.Stream()
				d.check(c.RMSNorm(uQlat, uQlat, dqn, T, qr, eps, s))
				d.check(c.RMSNorm(uKV, uKV, dkn, T, hd, eps, s))
				d.check(c.RoPE(uKV, dp, df, T, hd, hd, nf, false, s))
				d.check(f.RingStore(c, uRing, uKV, dp, T, ringRows, hd, s))
				d.check(c.RMSNorm(uQ, uQ, 0, T*H, hd, eps, s))
				d.check(c.RoPE(uQ, dp, df, T, H*hd, hd, nf, false, s))
				d.check(c.RoPE(uQi, dp, df, T, IH*ID, ID, nf, false, s))
				d.check(c.Scale(uW, sc, T*IH, s))
				d.check(c.RowOps([]RowOp{
					{Y: fQlat, X: fQlat, Rows: T, Dim: qr, Norm: true, W: dqn, Eps: eps},
					{Y: fRing, X: fKV, Rows: T, Dim: hd, Norm: true, W: dkn, Eps: eps, NFreq: nf, Freq: df, Pos: dp, RingRows: ringRows},
				}, s))
				d.check(c.RowOps([]RowOp{
					{Y: fQ, X: fQ, Rows: T * H, Heads: H, Dim: hd, Norm: true, Eps: eps, NFreq: nf, Freq: df, Pos: dp},
					{Y: fQi, X: fQi, Rows: T * IH, Heads: IH, Dim: ID, NFreq: nf, Freq: df, Pos: dp},
					{Y: fW, X: fW, Rows: T, Dim: IH, Scale: true, A: sc},
				}, s))
				get := func(qlat, ring, q, qi, w DevicePtr) bufs {
					return bufs{d.getFloats(qlat, T*qr), d.getFloats(ring, ringRows*hd), d.getFloats(q, T*H*hd), d.getFloats(qi, T*IH*ID), d.getFloats(w, T*IH)}
				}
				un, fu = get(uQlat, uRing, uQ, uQi, uW), get(fQlat, fRing, fQ, fQi, fW)
			})
			if t.Failed() {
				return
			}
			fuseCmp(t, "qlat", fu.qlat, un.qlat, fuseTol)
			fuseCmp(t, "ring", fu.ring, un.ring, fuseTol)
			fuseCmp(t, "q", fu.q, un.q, fuseTol)
			fuseCmp(t, "qi", fu.qi, un.qi, fuseTol)
			fuseCmp(t, "wts", fu.wts, un.wts, fuseTol)
			expectRel(t, "ref qlat", fu.qlat, ref.RMSNorm(f64s(qlat), f64s(qnorm), qr, eps), computetest.TolElemwise)
			for i := range T {
				r := (p0 + i) % ringRows
				want := ref.RoPE(ref.RMSNorm(f64s(kv[i*hd:(i+1)*hd]), f64s(kvnorm), hd, eps), p0+i, freq, hd, false)
				expectRel(t, fmt.Sprint("ref ring token ", i), fu.ring[r*hd:(r+1)*hd], want, computetest.TolElemwise)
				want = ref.RoPE(ref.RMSNorm(f64s(q[i*H*hd:(i+1)*H*hd]), nil, hd, eps), p0+i, freq, hd, false)
				expectRel(t, fmt.Sprint("ref q token ", i), fu.q[i*H*hd:(i+1)*H*hd], want, computetest.TolElemwise)
				want = ref.RoPE(f64s(qi[i*IH*ID:(i+1)*IH*ID]), p0+i, freq, ID, false)
				expectRel(t, fmt.Sprint("ref qi token ", i), fu.qi[i*IH*ID:(i+1)*IH*ID], want, computetest.TolElemwise)
			}
			ww := f64s(wts)
			for i := range ww {
				ww[i] *= float64(sc)
			}
			expectRel(t, "ref wts", fu.wts, ww, computetest.TolElemwise)
		})
	}
}

// TestFuseRowLayout checks the Go mirrors of the kernel's argument structs
// against the sizes kernels/fuse.cu asserts.
func TestFuseRowLayout(t *testing.T) {
	if a, b := unsafe.Sizeof(fuseRow{}), unsafe.Sizeof(fuseRows{}); a != 80 || b != 328 {
		t.Errorf("fuseRow %d bytes, fuseRows %d: want 80 and 328 (struct FuseRow, FuseRows)", a, b)
	}
	if o := unsafe.Offsetof(fuseRows{}.N); o != 320 {
		t.Errorf("fuseRows.N at %d, want 320", o)
	}
}

// TestFuseErrors checks that bad arguments give an error naming the op
// before anything touches the device (so it runs without a GPU).
func TestFuseErrors(t *testing.T) {
	c := &Ctx{} // no device: the argument checks must return first
	const p = DevicePtr(1 << 20)
	mixW := &DeviceWeight{Format: compute.F32, Rows: 24, Cols: 4 * 64, Data: p}
	headW := &DeviceWeight{Format: compute.F32, Rows: 4, Cols: 4 * 64, Data: p}
	mix := &HC{Fn: mixW, Base: p, Scale: p, HC: 4, Iters: 20, Eps: 1e-6, NormEps: 1e-6}
	hd := &HC{Fn: headW, Base: p, Scale: p, HC: 4, Eps: 1e-6, NormEps: 1e-6}
	odd := &HC{Fn: &DeviceWeight{Format: compute.F32, Rows: 24, Cols: 4 * 63, Data: p}, Base: p, Scale: p, HC: 4, Iters: 20}
	fp8 := &HC{Fn: &DeviceWeight{Format: compute.FP8Block, Rows: 24, Cols: 4 * 64, Data: p, Scale: p}, Base: p, Scale: p, HC: 4, Iters: 20}
	const (
		X, O, Post, Comb, XOut    = p, p + 1<<16, p + 2<<16, p + 3<<16, p + 4<<16
		Pre, PostOut, CombOut, A  = p + 5<<16, p + 6<<16, p + 7<<16, p + 8<<16
		Scratch, Norm             = p + 9<<16, p + 10<<16
		pos, freq, ring, kv, ydst = p + 11<<16, p + 12<<16, p + 13<<16, p + 14<<16, p + 15<<16
		misaligned                = p + 8
		okT                       = 3
	)
	good := func() *HCNorm {
		return &HCNorm{X: X, O: O, Post: Post, Comb: Comb, XOut: XOut, Pre: Pre, PostOut: PostOut, CombOut: CombOut, A: A, Norm: Norm, Eps: 1e-6, Scratch: Scratch, T: okT}
	}
	with := func(f func(a *HCNorm)) *HCNorm { a := good(); f(a); return a }
	s := Stream{}
	cases := []opCall{
		{"HCMixNorm", func() error { return c.HCMixNorm(nil, mix, s) }},
		{"HCMixNorm", func() error { return c.HCMixNorm(good(), nil, s) }},
		{"HCMixNorm", func() error { return c.HCMixNorm(good(), hd, s) }},    // head Fn for a mix
		{"HCHeadNorm", func() error { return c.HCHeadNorm(good(), mix, s) }}, // mix Fn for the head
		{"HCMixNorm", func() error { return c.HCMixNorm(good(), fp8, s) }},
		{"HCMixNorm", func() error { return c.HCMixNorm(good(), odd, s) }}, // D 63
		{"HCMixNorm", func() error { return c.HCMixNorm(with(func(a *HCNorm) { a.T = 0 }), mix, s) }},
		{"HCMixNorm", func() error { return c.HCMixNorm(with(func(a *HCNorm) { a.T = 4*opsMaxGridY + 1 }), mix, s) }},
		{"HCMixNorm", func() error { return c.HCMixNorm(with(func(a *HCNorm) { a.A = 0 }), mix, s) }},
		{"HCMixNorm", func() error { return c.HCMixNorm(with(func(a *HCNorm) { a.Scratch = 0 }), mix, s) }},
		{"HCMixNorm", func() error { return c.HCMixNorm(with(func(a *HCNorm) { a.CombOut = 0 }), mix, s) }},
		{"HCMixNorm", func() error { return c.HCMixNorm(with(func(a *HCNorm) { a.XOut = 0 }), mix, s) }},
		{"HCMixNorm", func() error { return c.HCMixNorm(with(func(a *HCNorm) { a.Post = 0 }), mix, s) }},
		{"HCMixNorm", func() error { return c.HCMixNorm(with(func(a *HCNorm) { a.X = misaligned }), mix, s) }},
		{"HCMixNorm", func() error { return c.HCMixNorm(with(func(a *HCNorm) { a.O = misaligned }), mix, s) }},
		{"HCMixNorm", func() error { return c.HCMixNorm(with(func(a *HCNorm) { a.XOut = X }), mix, s) }},
		{"HCMixNorm", func() error { return c.HCMixNorm(with(func(a *HCNorm) { a.XOut = Comb }), mix, s) }},
		{"HCMixNorm", func() error { return c.HCMixNorm(with(func(a *HCNorm) { a.A = XOut }), mix, s) }},
		{"HCMixNorm", func() error { return c.HCMixNorm(with(func(a *HCNorm) { a.A = PostOut }), mix, s) }},
		{"HCMixNorm", func() error { return c.HCMixNorm(with(func(a *HCNorm) { a.Eps = float32(math.NaN()) }), mix, s) }},
		{"HCHeadNorm", func() error { return c.HCHeadNorm(with(func(a *HCNorm) { a.Pre = 0 }), hd, s) }},
		{"HCMixNorm", func() error { return c.HCMixNorm(with(func(a *HCNorm) { a.Counters = misaligned + 2 }), mix, s) }},
		{"HCMixNorm", func() error { return c.HCMixNorm(with(func(a *HCNorm) { a.Counters = Scratch }), mix, s) }},
		{"HCHeadNorm", func() error { return c.HCHeadNorm(with(func(a *HCNorm) { a.Counters = A }), hd, s) }},
		{"QNormRoPE", func() error { return c.QNormRoPE(X, pos, freq, 1, 64, 16, 9, 1e-6, s) }}, // 2·9 > 16
		{"QNormRoPE", func() error { return c.QNormRoPE(X, pos, freq, 0, 64, 16, 4, 1e-6, s) }},
		{"QNormRoPE", func() error { return c.QNormRoPE(X, 0, freq, 1, 64, 16, 4, 1e-6, s) }},
		{"QNormRoPE", func() error { return c.QNormRoPE(X, pos, freq, 1<<20, 1<<12, 16, 4, 1e-6, s) }}, // T·heads ≥ 2^31
		{"KVNormRoPEStore", func() error { return c.KVNormRoPEStore(ring, kv, Norm, pos, freq, 4, 3, 16, 4, 1e-6, s) }},
		{"KVNormRoPEStore", func() error { return c.KVNormRoPEStore(kv, kv, Norm, pos, freq, 1, 3, 16, 4, 1e-6, s) }},
		{"KVNormRoPEStore", func() error { return c.KVNormRoPEStore(ring, kv, Norm, pos, 0, 1, 3, 16, 4, 1e-6, s) }},
		{"KVNormRoPEStore", func() error { return c.KVNormRoPEStore(ring, kv, Norm, pos, freq, 1, 3, 16, 4, -1, s) }},
		{"RowOps", func() error { return c.RowOps(nil, s) }},
		{"RowOps", func() error { return c.RowOps(make([]RowOp, FuseMaxRowOps+1), s) }},
		{"RowOps", func() error { return c.RowOps([]RowOp{{Y: X, X: X, Rows: 6, Heads: 4, Dim: 16}}, s) }},             // rows % heads
		{"RowOps", func() error { return c.RowOps([]RowOp{{Y: X, X: X, Rows: 4, Dim: 16, NFreq: 2, Freq: freq}}, s) }}, // no pos
		{"RowOps", func() error {
			return c.RowOps([]RowOp{{Y: X, X: X, Rows: 4, Dim: 16}, {Y: ring, X: kv, Rows: 4, Dim: 16, Pos: pos, RingRows: 3}}, s)
		}},
		{"RoPEScale", func() error { return c.RoPEScale(X, pos, freq, 2, 60, 16, 4, ydst, 1, 8, s) }}, // rowLen % dim
		{"RoPEScale", func() error { return c.RoPEScale(X, pos, freq, 2, 64, 16, 4, 0, 1, 8, s) }},
		{"RoPEScale", func() error { return c.RoPEScale(X, pos, freq, 2, 64, 16, 4, ydst, 1, -1, s) }},
	}
	expectOpErrors(t, cases)
}

// TestHCFuseSwitch checks $MOXIE_CUDA_HCFUSE's values and that a bad one
// is an error naming the variable when a boundary would read it (with
// Counters set), before anything touches the device.
func TestHCFuseSwitch(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want HCFuseVariant
		ok   bool
	}{{"", HCFuseTwo, true}, {"one", HCFuseOne, true}, {"two", HCFuseTwo, true}, {"One", 0, false}, {"2", 0, false}} {
		t.Run(fmt.Sprintf("%q", tc.in), func(t *testing.T) {
			v, err := ParseHCFuseVariant(tc.in)
			switch {
			case tc.ok && (err != nil || v != tc.want):
				t.Errorf("got %v, %v; want %v", v, err, tc.want)
			case !tc.ok && (err == nil || !strings.Contains(err.Error(), "MOXIE_CUDA_HCFUSE")):
				t.Errorf("got %v, %v; want an error naming MOXIE_CUDA_HCFUSE", v, err)
			case tc.ok && v.String() != map[HCFuseVariant]string{HCFuseOne: "one", HCFuseTwo: "two"}[v]:
				t.Errorf("String() = %q", v.String())
			}
		})
	}
	t.Setenv("MOXIE_CUDA_HCFUSE", "three")
	const p = DevicePtr(1 << 20)
	mix := &HC{Fn: &DeviceWeight{Format: compute.F32, Rows: 24, Cols: 4 * 64, Data: p}, Base: p, Scale: p, HC: 4, Iters: 20}
	a := &HCNorm{X: p, Pre: p + 1<<16, PostOut: p + 2<<16, CombOut: p + 3<<16, A: p + 4<<16, Scratch: p + 5<<16, Counters: p + 6<<16, T: 1}
	c := &Ctx{}
	if err := c.HCMixNorm(a, mix, Stream{}); err == nil || !strings.Contains(err.Error(), "MOXIE_CUDA_HCFUSE") {
		t.Errorf("HCMixNorm with MOXIE_CUDA_HCFUSE=three: %v, want an error naming the variable", err)
	}
}

// TestHCPrefillShape checks the prefill boundary's block shape: every row
// (with the Σx² row) has a warp slot, at most hcpRPW rows per warp, 4..8
// warps, V4's mix site on 5 warps of 5 rows and its head on 5 of 1; sites
// past hcpMaxRows rows or with splits of more than 256 quads do not fit.
func TestHCPrefillShape(t *testing.T) {
	for _, tc := range []struct {
		rows, n int
		fits    bool
		nw, rpw int // 0: only the invariants
	}{
		{24, 16384, true, 5, 5}, {4, 16384, true, 5, 1}, {24, 4096, true, 5, 5}, {15, 300, true, 8, 2}, {2, 72, true, 4, 1},
		{8, 72, true, 5, 2}, {35, 20000, false, 0, 0}, {24, 4 * 64 * 300, false, 0, 0},
	} {
		_, _, _, cq, threads := hcSplitShape(tc.rows, tc.n)
		nw, rpw, ok := hcPrefillShape(tc.rows, cq, threads)
		t.Logf("rows %d, n %d (cq %d): %d warps of %d rows, fits %v", tc.rows, tc.n, cq, nw, rpw, ok)
		switch {
		case ok != tc.fits:
			t.Errorf("rows %d, n %d: fits %v, want %v", tc.rows, tc.n, ok, tc.fits)
		case ok && (nw < 4 || nw > 8 || rpw < 1 || rpw > hcpRPW || nw*rpw < tc.rows+1):
			t.Errorf("rows %d, n %d: %d warps of %d rows do not cover %d rows", tc.rows, tc.n, nw, rpw, tc.rows+1)
		case tc.nw != 0 && (nw != tc.nw || rpw != tc.rpw):
			t.Errorf("rows %d, n %d: %d warps of %d rows, want %d of %d", tc.rows, tc.n, nw, rpw, tc.nw, tc.rpw)
		}
	}
	for _, tc := range []struct {
		in     string
		on, ok bool
	}{{"", true, true}, {"new", true, true}, {"old", false, true}, {"Old", false, false}, {"1", false, false}} {
		on, err := ParseHCPrefill(tc.in)
		switch {
		case tc.ok && (err != nil || on != tc.on):
			t.Errorf("ParseHCPrefill(%q) = %v, %v; want %v", tc.in, on, err, tc.on)
		case !tc.ok && (err == nil || !strings.Contains(err.Error(), "MOXIE_CUDA_HCPREFILL")):
			t.Errorf("ParseHCPrefill(%q) = %v, %v; want an error naming MOXIE_CUDA_HCPREFILL", tc.in, on, err)
		}
	}
	for _, tc := range [][3]int{{64, 1, 1}, {64, 4, 1}, {64, 8, 2}, {64, 32, 8}, {64, 64, 16}, {64, 4096, 64}, {18, 100, 16}} {
		splits, tiles, want := tc[0], tc[1], tc[2]
		if got := hcpSplitsPerBlock(splits, tiles); got != want {
			t.Errorf("hcpSplitsPerBlock(%d splits, %d tiles) = %d, want %d", splits, tiles, got, want)
		}
	}
	if HCFusePrefill.String() != "prefill" {
		t.Errorf("HCFusePrefill.String() = %q", HCFusePrefill.String())
	}
}

// TestHCOneShape checks fuse_hc_one's launch shape against hc_split_dots's
// for V4's mix and head sites and small odd ones: every virtual block is
// covered once, blocks stay within HCO_MAXTHREADS and leave room for the
// Sinkhorn warp.
func TestHCOneShape(t *testing.T) {
	for _, sh := range [][3]int{{24, 16384, 256}, {4, 16384, 256}, {24, 16384, 64}, {48, 600, 256}, {8, 72, 256}, {15, 3084, 128}} {
		rows, n, target := sh[0], sh[1], sh[2]
		_, groups, splits, _, threads := hcSplitShape(rows, n)
		v, blocks, bd := hcOneShape(groups, splits, threads, target)
		t.Logf("rows %d, n %d, target %d: %d x %d virtual blocks of %d threads -> %d blocks of %d (%d virtual each)", rows, n, target, groups, splits, threads, blocks, bd, v)
		switch {
		case v < 1 || v*threads > hcOneMaxDots || bd != v*threads+32:
			t.Errorf("rows %d, n %d: v %d, block %d for %d-thread virtual blocks", rows, n, v, bd, threads)
		case blocks*v < groups*splits || (blocks-1)*v >= groups*splits:
			t.Errorf("rows %d, n %d: %d blocks of %d do not cover %d virtual blocks exactly", rows, n, blocks, v, groups*splits)
		}
	}
	if HCNormCounterBytes(1) != 4 || HCNormCounterBytes(4) != 4 || HCNormCounterBytes(5) != 8 || HCNormCounterBytes(0) != 0 {
		t.Errorf("HCNormCounterBytes: 1 -> %d, 4 -> %d, 5 -> %d, 0 -> %d; want 4, 4, 8, 0",
			HCNormCounterBytes(1), HCNormCounterBytes(4), HCNormCounterBytes(5), HCNormCounterBytes(0))
	}
}

func TestHCNormScratchBytes(t *testing.T) {
	for _, sh := range [][3]int{{4, 4096, 1}, {4, 4096, 16}, {6, 100, 3}, {2, 36, 5}} {
		hc, D, T := sh[0], sh[1], sh[2]
		got := HCNormScratchBytes(hc, D, T)
		for _, rows := range []int{(2 + hc) * hc, hc} {
			_, _, splits, _, _ := hcSplitShape(rows, hc*D)
			if need := 4 * T * (rows + 1) * splits; got < need {
				t.Errorf("hc %d D %d T %d: %d bytes, the %d-row site needs %d", hc, D, T, got, rows, need)
			}
		}
	}
	if HCNormScratchBytes(0, 4096, 1) != 0 || HCNormScratchBytes(4, 4096, 0) != 0 {
		t.Error("want 0 for empty shapes")
	}
}

// BenchmarkFuse times each fused chain against the unfused ops it replaces,
// at V4-Flash decode shapes (hc 4, D 4096, 64 heads of 512, rope 64; the
// indexer's 64 heads of 128) and batches 1 and 16, as a decode step runs
// them: fuseGraphCalls chains captured into one CUDA graph (HCMix on its
// split path). It reports device microseconds per chain.
func BenchmarkFuse(b *testing.B) {
	dev := testDevice(b)
	for _, chain := range []string{"boundary", "boundary0", "head", "q", "kv", "idx", "qlat+kv", "q+qi+wts"} {
		for _, T := range []int{1, 16} {
			for _, fused := range []bool{false, true} {
				kind := "unfused"
				if fused {
					kind = "fused"
				}
				b.Run(fmt.Sprintf("%s/b%d/%s", chain, T, kind), func(b *testing.B) {
					var us float64
					withSplitHCMix(b, func() {
						err := dev.Do(func(c *Ctx) error {
							d := &devBufs{c: c}
							defer d.free()
							one := fuseBenchChain(c, d, chain, T, fused)
							d.synced()
							if d.err != nil {
								return d.err
							}
							var err error
							us, err = graphTime(b, c, fuseGraphCalls, one)
							return err
						})
						if err != nil {
							b.Fatal(err)
						}
					})
					b.ReportMetric(us, "device-us/op")
				})
			}
		}
	}
}

// fuseGraphCalls is how many chains BenchmarkFuse captures into one graph.
const fuseGraphCalls = 32

// fuseBenchChain allocates the buffers of one BenchmarkFuse chain and
// returns the function that enqueues it once (errors stick in d).
func fuseBenchChain(c *Ctx, d *devBufs, chain string, T int, fused bool) func() error {
	const hc, D, H, hd, nf, IH, ID = 4, 4096, 64, 512, 32, 64, 128
	const eps = 1e-6
	rng := rand.New(rand.NewPCG(7, uint64(T)))
	s := c.Stream()
	freq := d.floats(ropeFreqs(nf))
	pos := make([]int32, T)
	for i := range pos {
		pos[i] = int32(5000 + i)
	}
	dpos := d.int32s(pos)
	switch chain {
	case "boundary", "boundary0", "head":
		head := chain == "head"
		nm := (2 + hc) * hc
		rows := nm
		if head {
			rows = hc
		}
		p := &HC{Fn: d.weight(computetest.RandomWeight(rng, compute.F32, rows, hc*D, 0.02)),
			Base: d.floats(computetest.Normal(rng, nm, 1)), Scale: d.floats(computetest.Normal(rng, 3, 1)),
			HC: hc, Iters: 20, Eps: 1e-6, NormEps: 1e-6}
		post0, comb0 := make([]float32, T*hc), make([]float32, T*hc*hc)
		for i := range post0 {
			post0[i] = 1
		}
		for i := range comb0 {
			comb0[i] = 1 / float32(hc)
		}
		x, o := d.floats(computetest.Normal(rng, T*hc*D, 1)), d.floats(computetest.Normal(rng, T*D, 1))
		post, comb, xmid := d.floats(post0), d.floats(comb0), d.alloc(4*T*hc*D)
		pre, a, w := d.alloc(4*T*hc), d.alloc(4*T*D), d.floats(computetest.Normal(rng, D, 1))
		expand := chain != "boundary0"
		if fused {
			args := &HCNorm{X: x, Pre: pre, PostOut: post, CombOut: comb, A: a, Norm: w, Eps: eps, Scratch: d.alloc(HCNormScratchBytes(hc, D, T)),
				Counters: d.alloc(HCNormCounterBytes(T)), T: T} // the default boundary ($MOXIE_CUDA_HCFUSE)
			if d.err == nil {
				d.check(c.Memset(args.Counters, 0, HCNormCounterBytes(T), s))
			}
			if expand {
				args.O, args.Post, args.Comb, args.XOut = o, post, comb, xmid
			}
			if head {
				return func() error { return c.HCHeadNorm(args, p, s) }
			}
			return func() error { return c.HCMixNorm(args, p, s) }
		}
		return func() error {
			xs := x
			if expand {
				if err := c.HCExpand(xmid, x, o, post, comb, hc, D, T, s); err != nil {
					return err
				}
				xs = xmid
			}
			var err error
			if head {
				err = c.HCHeadPre(pre, xs, p, T, s)
			} else {
				err = c.HCMix(pre, post, comb, xs, p, T, s)
			}
			if err != nil {
				return err
			}
			if err := c.HCCollapse(a, xs, pre, hc, D, T, s); err != nil {
				return err
			}
			return c.RMSNorm(a, a, w, T, D, eps, s)
		}
	case "q":
		q := d.floats(computetest.Normal(rng, T*H*hd, 1))
		if fused {
			return func() error { return c.QNormRoPE(q, dpos, freq, T, H, hd, nf, eps, s) }
		}
		return func() error {
			if err := c.RMSNorm(q, q, 0, T*H, hd, eps, s); err != nil {
				return err
			}
			return c.RoPE(q, dpos, freq, T, H*hd, hd, nf, false, s)
		}
	case "kv":
		ringRows := 128 + T
		kv, w, ring := d.floats(computetest.Normal(rng, T*hd, 1)), d.floats(computetest.Normal(rng, hd, 1)), d.alloc(4*ringRows*hd)
		if fused {
			return func() error { return c.KVNormRoPEStore(ring, kv, w, dpos, freq, T, ringRows, hd, nf, eps, s) }
		}
		f, err := c.Fwd()
		d.check(err)
		return func() error {
			if err := c.RMSNorm(kv, kv, w, T, hd, eps, s); err != nil {
				return err
			}
			if err := c.RoPE(kv, dpos, freq, T, hd, hd, nf, false, s); err != nil {
				return err
			}
			return f.RingStore(c, ring, kv, dpos, T, ringRows, hd, s)
		}
	case "idx":
		qi, wts := d.floats(computetest.Normal(rng, T*IH*ID, 1)), d.floats(computetest.Normal(rng, T*IH, 1))
		const sc = 1.0001
		if fused {
			return func() error { return c.RoPEScale(qi, dpos, freq, T, IH*ID, ID, nf, wts, sc, T*IH, s) }
		}
		return func() error {
			if err := c.RoPE(qi, dpos, freq, T, IH*ID, ID, nf, false, s); err != nil {
				return err
			}
			return c.Scale(wts, sc, T*IH, s)
		}
	case "qlat+kv":
		const qr = 1024
		ringRows := 128 + T
		qlat, qn := d.floats(computetest.Normal(rng, T*qr, 1)), d.floats(computetest.Normal(rng, qr, 1))
		kv, w, ring := d.floats(computetest.Normal(rng, T*hd, 1)), d.floats(computetest.Normal(rng, hd, 1)), d.alloc(4*ringRows*hd)
		if fused {
			ops := []RowOp{
				{Y: qlat, X: qlat, Rows: T, Dim: qr, Norm: true, W: qn, Eps: eps},
				{Y: ring, X: kv, Rows: T, Dim: hd, Norm: true, W: w, Eps: eps, NFreq: nf, Freq: freq, Pos: dpos, RingRows: ringRows},
			}
			return func() error { return c.RowOps(ops, s) }
		}
		f, err := c.Fwd()
		d.check(err)
		return func() error {
			return errsOf(
				func() error { return c.RMSNorm(qlat, qlat, qn, T, qr, eps, s) },
				func() error { return c.RMSNorm(kv, kv, w, T, hd, eps, s) },
				func() error { return c.RoPE(kv, dpos, freq, T, hd, hd, nf, false, s) },
				func() error { return f.RingStore(c, ring, kv, dpos, T, ringRows, hd, s) })
		}
	case "q+qi+wts":
		q := d.floats(computetest.Normal(rng, T*H*hd, 1))
		qi, wts := d.floats(computetest.Normal(rng, T*IH*ID, 1)), d.floats(computetest.Normal(rng, T*IH, 1))
		const sc = 1.0001
		if fused {
			ops := []RowOp{
				{Y: q, X: q, Rows: T * H, Heads: H, Dim: hd, Norm: true, Eps: eps, NFreq: nf, Freq: freq, Pos: dpos},
				{Y: qi, X: qi, Rows: T * IH, Heads: IH, Dim: ID, NFreq: nf, Freq: freq, Pos: dpos},
				{Y: wts, X: wts, Rows: T, Dim: IH, Scale: true, A: sc},
			}
			return func() error { return c.RowOps(ops, s) }
		}
		return func() error {
			return errsOf(
				func() error { return c.RMSNorm(q, q, 0, T*H, hd, eps, s) },
				func() error { return c.RoPE(q, dpos, freq, T, H*hd, hd, nf, false, s) },
				func() error { return c.RoPE(qi, dpos, freq, T, IH*ID, ID, nf, false, s) },
				func() error { return c.Scale(wts, sc, T*IH, s) })
		}
	}
	d.check(fmt.Errorf("unknown chain %q", chain))
	return func() error { return nil }
}

// graphTime captures calls runs of one into a CUDA graph (after one plain
// run, which loads the modules), replays it b.N times between CUDA events
// and returns device microseconds per run of one.
func graphTime(b *testing.B, c *Ctx, calls int, one func() error) (float64, error) {
	s := c.Stream()
	if err := one(); err != nil {
		return 0, err
	}
	if err := c.BeginCapture(s); err != nil {
		return 0, err
	}
	for range calls {
		if err := one(); err != nil {
			_, _ = c.EndCapture(s)
			return 0, err
		}
	}
	g, err := c.EndCapture(s)
	if err != nil {
		return 0, err
	}
	defer c.DestroyGraph(g)
	if err := c.LaunchGraph(g, s); err != nil { // warm-up
		return 0, err
	}
	if err := c.Sync(s); err != nil {
		return 0, err
	}
	b.ResetTimer()
	ms, err := deviceMS(c, s, repeat(b.N, func() error { return c.LaunchGraph(g, s) }))
	b.StopTimer()
	return ms * 1000 / float64(b.N*calls), err
}

// errsOf runs steps in order and returns the first error.
func errsOf(steps ...func() error) error {
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// TestHCOneEmulated runs kernels/fuse.cu's one-kernel boundary (fuse_hc_one4
// and fuse_hc_one) on the CPU (no GPU needed): hcOneEmuHarness turns
// every CUDA thread into a std::thread with barriers for __syncthreads, the
// collapse warps' named barrier and the shuffles, runs each case twice on
// the same counters at the launch shapes fuse.go computes (V4's mix and head
// sites at the default and the one-virtual-block shape, BF16 and F32, T up
// to 6 over token groups, hc 2, 3 and 6 on the generic kernel) and compares
// x', pre, post, comb and a with its own float64 evaluation; it also fails
// when the two launches differ or a counter is left non-zero. Skipped with
// -short or without g++ (C++20).
func TestHCOneEmulated(t *testing.T) {
	inc, err := hcOneEmuSource()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		hcEmuCase
		target int // fuse_hc_one's threads (hcOneShape)
	}{
		{hcEmuCase{"v4 mix T1", 4, 4096, 1, false, true, false, true}, hcOneThreads},
		{hcEmuCase{"v4 mix T1 one64", 4, 4096, 1, false, true, false, true}, 64},
		{hcEmuCase{"v4 head T1", 4, 4096, 1, true, true, false, true}, hcOneThreads},
		{hcEmuCase{"hc4 D1024 mix T5 bf16", 4, 1024, 5, false, true, true, true}, hcOneThreads},
		{hcEmuCase{"hc4 D1024 mix T3 no expand", 4, 1024, 3, false, false, false, false}, 128},
		{hcEmuCase{"hc3 D100 mix T3 no expand", 3, 100, 3, false, false, false, true}, hcOneThreads},
		{hcEmuCase{"hc6 D64 mix T2", 6, 64, 2, false, true, false, false}, hcOneThreads},
		{hcEmuCase{"hc2 D36 head T6 bf16", 2, 36, 6, true, true, true, true}, hcOneThreads},
	}
	var gen strings.Builder
	gen.WriteString("static std::vector<Case> cases = {\n")
	for _, c := range cases {
		fmt.Fprintf(&gen, "  {%s},\n", c.cxx(c.target))
	}
	gen.WriteString("};\n")
	lines := runHostEmulation(t, map[string]string{"kern.inc": inc, "gen.inc": gen.String(), "emu.cpp": hcOneEmuHarness})
	if len(lines) != len(cases)+1 {
		t.Fatalf("emulation printed %d lines, want one per case and a last one:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for _, l := range lines {
		t.Log(l)
	}
	last := lines[len(lines)-1]
	worst, err := strconv.ParseFloat(strings.TrimPrefix(last, "worst "), 64)
	if err != nil || !(worst <= 1e-4) {
		t.Errorf("emulation's last line %q: want worst <= 1e-4", last)
	}
}

// hcEmuCase is a boundary of TestHCOneEmulated and TestHCPrefillEmulated:
// hc streams of D over T tokens, the head's rows (pre only) or a mix's,
// x' expanded from post, comb and o or given, fn in BF16 or F32, the norm
// weighted or not.
type hcEmuCase struct {
	name                         string
	hc, D, T                     int
	head, expand, bf16, weighted bool
}

// rows returns the number of fn rows: hc for the head, (2 + hc)·hc for a
// mix.
func (c hcEmuCase) rows() int {
	if c.head {
		return c.hc
	}
	return (2 + c.hc) * c.hc
}

// cxx returns the leading fields of the harnesses' C++ Case initializer:
// name, hc, D, T, head, expand, bf16, weighted (0 or 1), then fuse.go's
// launch shape (hcSplitShape's rb, groups, S, cq, vthreads; hcOneShape's V
// and blocks at target threads; rmsThreads(D)).
func (c hcEmuCase) cxx(target int) string {
	b2i := func(b bool) int {
		if b {
			return 1
		}
		return 0
	}
	rb, groups, splits, cq, threads := hcSplitShape(c.rows(), c.hc*c.D)
	v, blocks, _ := hcOneShape(groups, splits, threads, target)
	return fmt.Sprintf("%q, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d", c.name, c.hc, c.D, c.T,
		b2i(c.head), b2i(c.expand), b2i(c.bf16), b2i(c.weighted), rb, groups, splits, cq, threads, v, blocks, rmsThreads(c.D))
}

// hcOneEmuSource returns what the emulation compiles of the fuse module:
// ops.cu's definitions that fuse_hc_one uses, then fuse.cu's fuse_hc_one
// section with its named barrier turned into a call the harness defines.
func hcOneEmuSource() (string, error) {
	ops, fuse := OpsSource(), fuseCu
	var b strings.Builder
	defs, err := cuMacros(ops, "HC_MAXNM", "HCS_RB", "HCS_TB", "HCS_MAXS")
	if err != nil {
		return "", err
	}
	b.WriteString(defs)
	for _, f := range []string{"float warp_sum(", "float sigmoidf_(", "float hc_pre_gate(", "float dot4("} {
		def, err := cuDefinition(ops, "__device__ __forceinline__ "+f)
		if err != nil {
			return "", fmt.Errorf("ops.cu: %v; update the emulation", err)
		}
		b.WriteString(def + "\n")
	}
	i, j := strings.Index(fuse, "#define HCO_MAXDOTS"), strings.Index(fuse, "// fuse_rows:")
	if i < 0 || j < i {
		return "", fmt.Errorf("fuse.cu: fuse_hc_one's section not found; update the emulation")
	}
	sec := fuse[i:j]
	const bar = `asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory");`
	if !strings.Contains(sec, bar) {
		return "", fmt.Errorf("fuse.cu: hco_bar no longer reads %s; update the emulation", bar)
	}
	b.WriteString(strings.Replace(sec, bar, "hco_emu_bar(threads);", 1))
	return b.String(), nil
}

// hcOneEmuHarness is TestHCOneEmulated's C++ program (it includes kern.inc,
// hcOneEmuSource's output, and gen.inc, the cases).
const hcOneEmuHarness = `// CPU emulation harness for fuse_hc_one / fuse_hc_one4 of kernels/fuse.cu
// (TestHCOneEmulated): every CUDA thread of a block is a std::thread,
// __syncthreads a block barrier, the collapse warps' named barrier another,
// each shuffle an exchange between two warp barriers, __shared__ variables
// statics (one block runs at a time, in launch order, so the last block of
// a token group finishes it). gen.inc (written by the test from fuse.go's
// launch shapes) lists the cases. Each case runs the kernel twice on the
// same counters and prints the max relative error of x', pre, post, comb
// and a against a float64 evaluation of dsv4-flash.md section 4.3 written
// here (FAIL above 1e-4, or when the two launches differ or a counter is
// not zero afterwards), then "worst <max>".
#include <atomic>
#include <barrier>
#include <thread>
#include <vector>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <cstdint>
#include <random>
#include <algorithm>
using std::min; using std::max;
typedef uint16_t u16;
struct float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
#include "cuda_emu.h"  // threadIdx, blockIdx, the barriers, __syncthreads, the CUDA keywords
float g_shfl[32][32];
#define FULL 0xffffffffu
inline void hco_emu_bar(int) { g_named_bar->arrive_and_wait(); }
inline float __shfl_sync(unsigned, float v, int src) {
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  g_warp_bar[w]->arrive_and_wait();
  g_shfl[w][l] = v;
  g_warp_bar[w]->arrive_and_wait();
  return g_shfl[w][src & 31];
}
inline float __shfl_xor_sync(unsigned m, float v, int o) { return __shfl_sync(m, v, (threadIdx.x % 32) ^ o); }
inline float __int_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
template <class T> inline T __ldg(const T *p) { return *p; }
template <class T> inline T __ldcg(const T *p) { return *p; }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline int atomicExch(int *p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
#include "kern.inc"  // ops.cu's helpers and fuse.cu's fuse_hc_one section

void launch(void (*k)(const HCOneArgs), U3 grid, unsigned threads, HCOneArgs a, unsigned named) {
  gridDim = grid; blockDim = {threads, 1, 1};
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        std::barrier<> bb(threads), nb(named);
        g_block_bar = &bb; g_named_bar = &nb;
        for (unsigned w = 0; w < threads / 32; w++) g_warp_bar[w] = new std::barrier<>(32);
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < threads; t++)
          ts.emplace_back([=] { threadIdx = {t, 0, 0}; blockIdx = {x, y, z}; k(a); });
        for (auto &t : ts) t.join();
        for (unsigned w = 0; w < threads / 32; w++) delete g_warp_bar[w];
      }
}

static double maxrel(const std::vector<float> &got, const std::vector<double> &want) {
  double e = 0, m = 0;
  for (size_t i = 0; i < got.size(); i++) {
    if (!std::isfinite(got[i])) return INFINITY;
    e = max(e, std::fabs(got[i] - want[i])); m = max(m, std::fabs(want[i]));
  }
  return m > 0 ? e / m : e;
}

// HCIn holds a boundary's random inputs: fn (nm rows of n = hc·D, BF16
// values with their bits in fnb when bf16), base, scale, x, o, post0, comb0
// and w; hc_inputs draws them from seed in that order.
struct HCIn { std::vector<float> fn, base, scale, x, o, post0, comb0, w; std::vector<u16> fnb; };
static HCIn hc_inputs(unsigned seed, int hc, int D, int T, int nm, int nbase, bool bf16) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  const int n = hc * D;
  HCIn in{std::vector<float>(nm * n), std::vector<float>(nbase), std::vector<float>(3), std::vector<float>(T * n), std::vector<float>(T * D),
          std::vector<float>(T * hc), std::vector<float>(T * hc * hc), std::vector<float>(D), std::vector<u16>(nm * n)};
  for (size_t i = 0; i < in.fn.size(); i++) {
    float v = nd(rng) * 0.3f / std::sqrt((float)n);
    if (bf16) { unsigned u; memcpy(&u, &v, 4); in.fnb[i] = (u16)(u >> 16); u &= 0xffff0000u; memcpy(&v, &u, 4); }
    in.fn[i] = v;
  }
  for (auto &v : in.base) v = nd(rng);
  for (auto &v : in.scale) v = nd(rng);
  in.scale[2] = 4;
  for (auto &v : in.x) v = nd(rng);
  for (auto &v : in.o) v = nd(rng);
  for (auto &v : in.post0) v = 2 * ud(rng);
  for (auto &v : in.comb0) v = ud(rng) / hc;
  for (auto &v : in.w) v = nd(rng);
  return in;
}

// HCRef is hc_reference's float64 evaluation of dsv4-flash.md section 4.3
// on a case's inputs: x' (the inputs' x when !expand), pre, post, comb
// (left zero for a head) and a.
struct HCRef { std::vector<double> x, pre, post, comb, a; };
static HCRef hc_reference(const HCIn &in, int hc, int D, int T, int nm, bool head, bool expand, bool weighted) {
  const int n = hc * D;
  const std::vector<float> &fn = in.fn, &base = in.base, &scale = in.scale, &x = in.x, &o = in.o, &post0 = in.post0, &comb0 = in.comb0, &w = in.w;
  HCRef r{std::vector<double>(T * n), std::vector<double>(T * hc), std::vector<double>(T * hc), std::vector<double>(T * hc * hc), std::vector<double>(T * D)};
  for (int b = 0; b < T; b++) {
    double *xs = &r.x[b * n];
    for (int k = 0; k < hc; k++)
      for (int i = 0; i < D; i++) {
        double s = x[(b * hc + k) * D + i];
        if (expand) {  // x'[k] = post[k]·o + Σ_j comb[j, k]·x[j]
          s = (double)post0[b * hc + k] * o[b * D + i];
          for (int j = 0; j < hc; j++) s += (double)comb0[(b * hc + j) * hc + k] * x[(b * hc + j) * D + i];
        }
        xs[k * D + i] = s;
      }
    double ss = 0; for (int i = 0; i < n; i++) ss += xs[i] * xs[i];
    const double rho = 1 / std::sqrt(ss / n + 1e-6);
    std::vector<double> m(nm);
    for (int q = 0; q < nm; q++) { double d = 0; for (int i = 0; i < n; i++) d += (double)fn[q * n + i] * xs[i]; m[q] = d * rho; }
    auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
    for (int j = 0; j < hc; j++) r.pre[b * hc + j] = sig(m[j] * scale[0] + base[j]) + 1e-6;
    if (!head) {
      for (int j = 0; j < hc; j++) r.post[b * hc + j] = 2 * sig(m[hc + j] * scale[1] + base[hc + j]);
      std::vector<double> C(hc * hc);
      for (int j = 0; j < hc; j++) {
        double mx = -INFINITY; for (int k = 0; k < hc; k++) mx = max(mx, m[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k]);
        double s = 0; for (int k = 0; k < hc; k++) { C[j * hc + k] = std::exp(m[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k] - mx); s += C[j * hc + k]; }
        for (int k = 0; k < hc; k++) C[j * hc + k] = C[j * hc + k] / s + 1e-6;
      }
      for (int it = 0; it < 20; it++) {
        if (it > 0) for (int j = 0; j < hc; j++) { double s = 0; for (int k = 0; k < hc; k++) s += C[j * hc + k]; for (int k = 0; k < hc; k++) C[j * hc + k] /= s + 1e-6; }
        for (int k = 0; k < hc; k++) { double s = 0; for (int j = 0; j < hc; j++) s += C[j * hc + k]; for (int j = 0; j < hc; j++) C[j * hc + k] /= s + 1e-6; }
      }
      for (int i = 0; i < hc * hc; i++) r.comb[b * hc * hc + i] = C[i];
    }
    std::vector<double> a(D); double sa = 0;
    for (int i = 0; i < D; i++) { double v = 0; for (int j = 0; j < hc; j++) v += r.pre[b * hc + j] * xs[j * D + i]; a[i] = v; sa += v * v; }
    const double inv = 1 / std::sqrt(sa / D + 1e-6);
    for (int i = 0; i < D; i++) r.a[b * D + i] = a[i] * inv * (weighted ? w[i] : 1.0);
  }
  return r;
}

// hc_args returns the HCOneArgs of a boundary case c (a Case of either
// harness) on in's inputs, writing pre, post, comb, a and x' (xout) and
// using part and ctr; the caller sets rb, groups, V and vthreads.
template <class C>
static HCOneArgs hc_args(const C &c, HCIn &in, std::vector<float> &part, std::vector<int> &ctr, std::vector<float> &post,
                         std::vector<float> &comb, std::vector<float> &xout, std::vector<float> &pre, std::vector<float> &a) {
  HCOneArgs p{};
  p.part = part.data(); p.ctr = ctr.data(); p.x = in.x.data();
  if (c.expand) { p.o = in.o.data(); p.post0 = post.data(); p.comb0 = comb.data(); p.xout = xout.data(); }
  p.fn = c.bf16 ? (const void *)in.fnb.data() : (const void *)in.fn.data();
  p.pre = pre.data(); p.post = c.head ? nullptr : post.data(); p.comb = c.head ? nullptr : comb.data(); p.a = a.data();
  p.w = c.weighted ? in.w.data() : nullptr; p.base = in.base.data(); p.scale = in.scale.data();
  p.fmt = c.bf16 ? 3 : 4; p.n = c.hc * c.D; p.nm = c.head ? c.hc : (2 + c.hc) * c.hc; p.cq = c.cq; p.batch = c.T; p.hc = c.hc; p.dim = c.D; p.S = c.S;
  p.iters = 20; p.head = c.head; p.vt = c.vt; p.eps = 1e-6f; p.normEps = 1e-6f; p.rmsEps = 1e-6f;
  return p;
}

struct Case { const char *name; int hc, D, T, head, expand, bf16, weighted, rb, groups, S, cq, vthreads, V, blocks, vt; };
// gen.inc defines std::vector<Case> cases.
#include "gen.inc"

int main() {
  double worst = 0;
  for (size_t ci = 0; ci < cases.size(); ci++) {
    const Case c = cases[ci];
    const int hc = c.hc, D = c.D, T = c.T, n = hc * D, nm = c.head ? hc : (2 + hc) * hc;
    HCIn in = hc_inputs(ci + 7, hc, D, T, nm, nm, c.bf16);
    const std::vector<float> &post0 = in.post0, &comb0 = in.comb0;
    const HCRef ref = hc_reference(in, hc, D, T, nm, c.head, c.expand, c.weighted);
    const std::vector<double> &wx = ref.x, &wpre = ref.pre, &wpost = ref.post, &wcomb = ref.comb, &wa = ref.a;
    const int groupsT = (T + 3) / 4;
    std::vector<int> ctr(groupsT, 0);
    std::vector<float> part(T * (nm + 1) * c.S, NAN);
    std::vector<float> res[2][5];
    bool same = true;
    for (int run = 0; run < 2; run++) {
      std::vector<float> post(post0), comb(comb0), xout(T * n, NAN), pre(T * hc, NAN), a(T * D, NAN);
      HCOneArgs p = hc_args(c, in, part, ctr, post, comb, xout, pre, a);
      p.rb = c.rb; p.groups = c.groups; p.V = c.V; p.vthreads = c.vthreads;
      launch(hc == 4 ? fuse_hc_one4 : fuse_hc_one, {(unsigned)c.blocks, 1, (unsigned)groupsT}, c.V * c.vthreads + 32, p, c.V * c.vthreads);
      res[run][0] = xout; res[run][1] = pre; res[run][2] = post; res[run][3] = comb; res[run][4] = a;
      if (run == 1) for (int k = 0; k < 5; k++) same = same && !memcmp(res[0][k].data(), res[1][k].data(), 4 * res[0][k].size());
    }
    bool zero = true; for (int v : ctr) zero = zero && v == 0;
    double e[5] = {c.expand ? maxrel(res[1][0], wx) : 0, maxrel(res[1][1], wpre), c.head ? 0 : maxrel(res[1][2], wpost),
                   c.head ? 0 : maxrel(res[1][3], wcomb), maxrel(res[1][4], wa)};
    if (c.head && (memcmp(res[1][2].data(), post0.data(), 4 * post0.size()) || memcmp(res[1][3].data(), comb0.data(), 4 * comb0.size()))) same = false;
    double r = 0; for (double v : e) r = max(r, v);
    worst = max(worst, r);
    printf("%-28s x' %.3g pre %.3g post %.3g comb %.3g a %.3g%s%s%s\n", c.name, e[0], e[1], e[2], e[3], e[4],
           r > 1e-4 ? "  FAIL" : "", same ? "" : "  FAIL (launches differ or head changed post/comb)", zero ? "" : "  FAIL (counter not zero)");
  }
  printf("worst %.3g\n", worst);
}
`

// TestHCPrefillEmulated runs the prefill boundary (fuse_hcp_dots, then
// fuse_hcp_finish4 / fuse_hcp_finish) of kernels/fuse.cu on the CPU with
// hcOneEmuHarness's machinery (a std::thread per CUDA thread) at the launch
// shapes fuse.go computes. hcpEmuHarness checks fuse_hcp_dots's partials
// bit for bit against its own serial evaluation of hc_split_dots's
// documented summation tree (per quad a dot4 from 0, warp_sum's xor
// butterfly over each warp's 32 quads, the warps in order), and x' bit for
// bit against hc_x_expand's operations; on the small cases it also runs the
// finish, compares x', pre, post, comb and a with a float64 evaluation
// (FAIL above 1e-4) and with fuse_hc_one's results on the same inputs (bit
// for bit: the decode boundary's kernel). Skipped with -short or without
// g++ (C++20).
func TestHCPrefillEmulated(t *testing.T) {
	inc, err := hcOneEmuSource()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		hcEmuCase
		full bool // run the finish and fuse_hc_one too
	}{
		{hcEmuCase{"v4 mix T70", 4, 4096, 70, false, true, false, true}, false},
		{hcEmuCase{"v4 head T33 bf16", 4, 4096, 33, true, true, true, true}, false},
		{hcEmuCase{"v4 mix T5", 4, 4096, 5, false, true, false, true}, true},
		{hcEmuCase{"hc4 D1024 mix T66 no expand", 4, 1024, 66, false, false, false, false}, false},
		{hcEmuCase{"hc4 D1024 mix T5 bf16", 4, 1024, 5, false, true, true, true}, true},
		{hcEmuCase{"hc3 D100 mix T6 no expand", 3, 100, 6, false, false, false, true}, true},
		{hcEmuCase{"hc2 D36 head T6 bf16", 2, 36, 6, true, true, true, true}, true},
		{hcEmuCase{"hc2 D36 mix T130", 2, 36, 130, false, true, false, false}, false},
	}
	var gen strings.Builder
	gen.WriteString("static std::vector<Case> cases = {\n")
	for _, c := range cases {
		rows := c.rows()
		_, _, splits, cq, threads := hcSplitShape(rows, c.hc*c.D)
		nw, rpw, ok := hcPrefillShape(rows, cq, threads)
		if !ok {
			t.Fatalf("%s: the prefill kernels do not fit rows %d, cq %d", c.name, rows, cq)
		}
		tiles := (c.T + hcpTM - 1) / hcpTM
		spb := hcpSplitsPerBlock(splits, tiles)
		if c.T > 64 {
			spb = 3 // several splits per block, the last block's short
		}
		full := 0
		if c.full {
			full = 1
		}
		fmt.Fprintf(&gen, "  {%s, %d, %d, %d, %d},\n", c.cxx(hcOneThreads), nw, rpw, spb, full)
	}
	gen.WriteString("};\n")
	lines := runHostEmulation(t, map[string]string{"kern.inc": inc, "gen.inc": gen.String(), "emu.cpp": hcpEmuHarness()})
	if len(lines) != len(cases)+1 {
		t.Fatalf("emulation printed %d lines, want one per case and a last one:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for _, l := range lines {
		t.Log(l)
	}
	last := lines[len(lines)-1]
	worst, err := strconv.ParseFloat(strings.TrimPrefix(last, "worst "), 64)
	if err != nil || !(worst <= 1e-4) {
		t.Errorf("emulation's last line %q: want worst <= 1e-4", last)
	}
}

// hcpEmuHarness returns TestHCPrefillEmulated's C++ program: hcOneEmuHarness's
// emulation machinery (everything before its case list) and its own cases
// and checks.
func hcpEmuHarness() string {
	i := strings.Index(hcOneEmuHarness, "struct Case {")
	return hcOneEmuHarness[:i] + hcpEmuMain
}

const hcpEmuMain = `struct Case { const char *name; int hc, D, T, head, expand, bf16, weighted, rb, groups, S, cq, vthreads, V, blocks, vt, nw, rpw, spb, full; };
#include "gen.inc"

static bool same(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && !memcmp(a.data(), b.data(), 4 * a.size());
}

int main() {
  double worst = 0;
  for (size_t ci = 0; ci < cases.size(); ci++) {
    const Case c = cases[ci];
    const int hc = c.hc, D = c.D, T = c.T, n = hc * D, nq = n / 4, nm = c.head ? hc : (2 + hc) * hc;
    HCIn in = hc_inputs(ci + 11, hc, D, T, nm, (2 + hc) * hc, c.bf16);
    const std::vector<float> &fn = in.fn, &x = in.x, &o = in.o, &post0 = in.post0, &comb0 = in.comb0;
    // x' in hc_x_expand's float32 operations, and hc_split_dots's partials
    // in its documented order (serially).
    std::vector<float> xs(T * n), wpart(T * (nm + 1) * c.S);
    for (int b = 0; b < T; b++)
      for (int k = 0; k < hc; k++)
        for (int i = 0; i < D; i++) {
          float s = x[(b * hc + k) * D + i];
          if (c.expand) {
            s = post0[b * hc + k] * o[b * D + i];
            for (int j = 0; j < hc; j++) s = std::fma(comb0[(b * hc + j) * hc + k], x[(b * hc + j) * D + i], s);
          }
          xs[b * n + k * D + i] = s;
        }
    for (int b = 0; b < T; b++)
      for (int r = 0; r <= nm; r++)
        for (int s = 0; s < c.S; s++) {
          const int q0 = s * c.cq, q1 = min(q0 + c.cq, nq);
          float P = 0.f;
          for (int wi = 0; wi < c.vthreads / 32; wi++) {
            float v[32];
            for (int l = 0; l < 32; l++) {
              float acc = 0.f;
              for (int q = q0 + wi * 32 + l; q < q1; q += c.vthreads)
                for (int e = 0; e < 4; e++) {
                  const float xv = xs[b * n + 4 * q + e];
                  acc = std::fma(r == nm ? xv : fn[r * n + 4 * q + e], xv, acc);
                }
              v[l] = acc;
            }
            for (int of = 16; of > 0; of >>= 1) {
              float u[32];
              for (int l = 0; l < 32; l++) u[l] = v[l] + v[l ^ of];
              memcpy(v, u, sizeof v);
            }
            P += v[0];
          }
          wpart[(b * (nm + 1) + r) * c.S + s] = P;
        }
    const HCRef ref = hc_reference(in, hc, D, T, nm, c.head, c.expand, c.weighted);
    const std::vector<double> &wx = ref.x, &wpre = ref.pre, &wpost = ref.post, &wcomb = ref.comb, &wa = ref.a;
    const int groupsT = (T + 3) / 4, tiles = (T + HCP_TM - 1) / HCP_TM;
    // res[0]: the prefill kernels, res[1]: fuse_hc_one (full cases).
    std::vector<float> res[2][5], part(T * (nm + 1) * c.S, NAN);
    bool ok = true;
    for (int run = 0; run < (c.full ? 2 : 1); run++) {
      std::vector<float> post(post0), comb(comb0), xout(T * n, NAN), pre(T * hc, NAN), a(T * D, NAN);
      std::vector<int> ctr(groupsT, 0);
      HCOneArgs p = hc_args(c, in, part, ctr, post, comb, xout, pre, a);
      if (run == 0) {
        HCOneArgs d = p;
        d.rb = c.rpw; d.groups = c.spb; d.V = 1; d.vthreads = c.vthreads;
        launch(fuse_hcp_dots, {(unsigned)((c.S + c.spb - 1) / c.spb), (unsigned)tiles, 1}, c.nw * 32, d, 32);
        if (!same(part, wpart)) {
          size_t bad = 0; while (bad < part.size() && !memcmp(&part[bad], &wpart[bad], 4)) bad++;
          printf("%-28s FAIL partials differ from hc_split_dots's order (first at %zu: %.9g, want %.9g)\n", c.name, bad, part[bad], wpart[bad]);
          ok = false;
          break;
        }
        if (c.expand && !same(xout, xs)) { printf("%-28s FAIL x' differs from hc_x_expand's bits\n", c.name); ok = false; break; }
        if (!c.full) { res[0][0] = xout; break; }
        HCOneArgs f = p;
        f.V = 1; f.vthreads = 256;
        launch(hc == 4 ? fuse_hcp_finish4 : fuse_hcp_finish, {1, 1, (unsigned)groupsT}, 256 + 32, f, 256);
      } else {
        p.rb = c.rb; p.groups = c.groups; p.V = c.V; p.vthreads = c.vthreads;
        launch(hc == 4 ? fuse_hc_one4 : fuse_hc_one, {(unsigned)c.blocks, 1, (unsigned)groupsT}, c.V * c.vthreads + 32, p, c.V * c.vthreads);
      }
      res[run][0] = xout; res[run][1] = pre; res[run][2] = post; res[run][3] = comb; res[run][4] = a;
    }
    if (!ok) continue;
    if (!c.full) {
      printf("%-28s partials and x' bit-identical (T %d, %d x %d blocks of %d, %d splits each)\n", c.name, T,
             (c.S + c.spb - 1) / c.spb, tiles, c.nw * 32, c.spb);
      continue;
    }
    bool bits = true;
    for (int k = 0; k < 5; k++) bits = bits && same(res[0][k], res[1][k]);
    double e[5] = {c.expand ? maxrel(res[0][0], wx) : 0, maxrel(res[0][1], wpre), c.head ? 0 : maxrel(res[0][2], wpost),
                   c.head ? 0 : maxrel(res[0][3], wcomb), maxrel(res[0][4], wa)};
    double r = 0; for (double v : e) r = max(r, v);
    worst = max(worst, r);
    printf("%-28s x' %.3g pre %.3g post %.3g comb %.3g a %.3g%s%s\n", c.name, e[0], e[1], e[2], e[3], e[4],
           r > 1e-4 ? "  FAIL" : "", bits ? " (fuse_hc_one's bits)" : "  FAIL (differs from fuse_hc_one)");
  }
  printf("worst %.3g\n", worst);
}
`

// TestHCFinish4Emulated runs fuse_hc_finish (the reference: its bits are
// checked against the unfused chain on the GPU by TestFuseHCNorm),
// fuse_hc_finish4, fuse_hc_finish4s (where the block has two warps) and
// fuse_hc_finish4w on the CPU (no GPU needed; hcFin4EmuHarness: every CUDA
// thread a std::thread, barriers for __syncthreads and the shuffles, both
// compiled with -ffp-contract=off) on the same random partials and x' at the
// launch shapes fuse.go computes (V4's mix and head sites, weighted and
// unweighted norms, T up to 3, smaller D with idle threads), and on a
// producer's partials (one per 16-row tile, fuse_hc_finish4w alone), and
// fails unless fuse_hc_finish4's and fuse_hc_finish4s's pre, post, comb and
// a are fuse_hc_finish's bits and fuse_hc_finish4's and fuse_hc_finish4w's
// are within 1e-5 of the harness's own float64 evaluation of dsv4-flash.md
// section 4.3. Skipped with -short or without g++ (C++20).
func TestHCFinish4Emulated(t *testing.T) {
	inc, err := hcFin4EmuSource()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name           string
		D, T           int
		head, weighted bool
	}{
		{"v4 mix T1", 4096, 1, false, true},
		{"v4 head T1", 4096, 1, true, true},
		{"v4 mix T2 unweighted", 4096, 2, false, false},
		{"D1024 mix T3", 1024, 3, false, true},
		{"D120 mix T1", 120, 1, false, true},
		{"D120 head T2 unweighted", 120, 2, true, false},
		{"D256 mix T2", 256, 2, false, true},
		{"D256 head T1 unweighted", 256, 1, true, false},
		// A producer's partials (moe2lh: one per 16-row tile): only
		// fuse_hc_finish4w reads so many.
		{"v4 mix T1 tiles", 4096, 1, false, true},
		{"D1024 mix T2 tiles", 1024, 2, false, true},
		{"D256 head T1 tiles", 256, 1, true, true},
	}
	var gen strings.Builder
	gen.WriteString("static std::vector<Case> cases = {\n")
	for _, c := range cases {
		rows := 24
		if c.head {
			rows = 4
		}
		_, _, splits, _, _ := hcSplitShape(rows, 4*c.D)
		if strings.HasSuffix(c.name, " tiles") {
			splits = c.D / 16
		} else if !hcFinish4Fits(4, c.D, splits, 0x1000) {
			t.Fatalf("%s: fuse_hc_finish4 does not fit (splits %d)", c.name, splits)
		}
		b2i := map[bool]int{false: 0, true: 1}
		fmt.Fprintf(&gen, "  {%q, %d, %d, %d, %d, %d, %d},\n", c.name, c.D, c.T, b2i[c.head], b2i[c.weighted], splits, rmsThreads(c.D))
	}
	gen.WriteString("};\n")
	lines := runHostEmulation(t, map[string]string{"kern.inc": inc, "gen.inc": gen.String(), "emu.cpp": hcFin4EmuHarness}, "-ffp-contract=off")
	if len(lines) != len(cases) {
		t.Fatalf("emulation printed %d lines, want one per case:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for _, l := range lines {
		t.Log(l)
		if !strings.Contains(l, " ok") {
			t.Error(l)
		}
	}
}

// cuMacros returns the #define lines of names in src (ops.cu), in that order,
// each ending in a newline.
func cuMacros(src string, names ...string) (string, error) {
	var b strings.Builder
	for _, d := range names {
		m := regexp.MustCompile(`(?m)^#define ` + d + ` .*$`).FindString(src)
		if m == "" {
			return "", fmt.Errorf("ops.cu no longer defines %s; update the emulation", d)
		}
		b.WriteString(m + "\n")
	}
	return b.String(), nil
}

// hcFin4EmuSource returns what TestHCFinish4Emulated compiles: ops.cu's
// definitions that the finish kernels use, then fuse.cu from FUSE_KEEP's
// definition to the end of fuse_hc_finish4 (fuse_hc_finish's dynamic shared
// memory made a pointer to the harness's buffer).
func hcFin4EmuSource() (string, error) {
	ops, fuse := OpsSource(), fuseCu
	var b strings.Builder
	defs, err := cuMacros(ops, "HC_MAXNM", "HCS_MAXS")
	if err != nil {
		return "", err
	}
	b.WriteString(defs)
	for _, h := range []string{"__device__ __forceinline__ float warp_sum(", "__device__ __forceinline__ float block_sum(",
		"__device__ __forceinline__ float sigmoidf_(", "__device__ __forceinline__ float hc_pre_gate(",
		"template <int HC>\n__device__ __forceinline__ void hc_sinkhorn_warp(", "__device__ __forceinline__ void hc_gates_sinkhorn("} {
		def, err := cuDefinition(ops, h)
		if err != nil {
			return "", fmt.Errorf("ops.cu: %v; update the emulation", err)
		}
		b.WriteString(def + "\n")
	}
	i, j := strings.Index(fuse, "#define FUSE_KEEP"), strings.Index(fuse, "// fuse_hc_one: the whole")
	if i < 0 || j < i {
		return "", fmt.Errorf("fuse.cu: the finish kernels' section not found; update the emulation")
	}
	sec := fuse[i:j]
	const dyn = "extern __shared__ float4 ps4[];"
	if !strings.Contains(sec, dyn) || !strings.Contains(sec, "fuse_hc_finish4(") || !strings.Contains(sec, "fuse_hc_finish4s(") {
		return "", fmt.Errorf("fuse.cu: fuse_hc_finish no longer declares %s or fuse_hc_finish4 or fuse_hc_finish4s is gone; update the emulation", dyn)
	}
	b.WriteString(strings.Replace(sec, dyn, "float4 *ps4 = emu_dyn;", 1))
	return b.String(), nil
}

// hcFin4EmuHarness is TestHCFinish4Emulated's C++ program (it includes
// kern.inc, hcFin4EmuSource's output, and gen.inc, the cases).
const hcFin4EmuHarness = `// CPU emulation of the finish kernels (kernels/fuse.cu):
// every CUDA thread of a block is a std::thread, __syncthreads a block
// barrier, each shuffle an exchange between two warp barriers, __shared__
// variables statics (one block runs at a time). Each case runs the kernels
// on the same inputs and prints "<name> ok" when pre, post, comb and a are
// bit-identical and within 1e-5 of a float64 evaluation written here, else
// "<name> FAIL <what>"; fuse_hc_finish4w, whose partial sums add in
// another order, is held to the float64 evaluation only.
#include <barrier>
#include <thread>
#include <vector>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <cstdint>
#include <random>
#include <algorithm>
#include <string>
using std::min; using std::max;
struct float4 { float x, y, z, w; };
#include "cuda_emu.h"  // threadIdx, blockIdx, the barriers, __syncthreads, the CUDA keywords
float g_shfl[32][32];
float4 emu_dyn[4096];
#define __restrict__
#define FULL 0xffffffffu
inline float __shfl_sync(unsigned, float v, int src) {
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  g_warp_bar[w]->arrive_and_wait();
  g_shfl[w][l] = v;
  g_warp_bar[w]->arrive_and_wait();
  return g_shfl[w][src & 31];
}
inline float __shfl_xor_sync(unsigned m, float v, int o) { return __shfl_sync(m, v, (threadIdx.x % 32) ^ o); }
inline void __syncwarp() { g_warp_bar[threadIdx.x / 32]->arrive_and_wait(); }
inline float __int_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
template <class T> inline T __ldg(const T *p) { return *p; }
template <class T> inline T __ldcg(const T *p) { return *p; }
#include "kern.inc"

struct Case { const char *name; int D, T, head, weighted, S, bd; };
#include "gen.inc"

template <class K>
void launch(K k, U3 grid, unsigned threads) {
  gridDim = grid; blockDim = {threads, 1, 1};
  for (unsigned y = 0; y < grid.y; y++)
    for (unsigned x = 0; x < grid.x; x++) {
      std::barrier<> bb(threads);
      g_block_bar = &bb;
      for (unsigned w = 0; w < threads / 32; w++) g_warp_bar[w] = new std::barrier<>(32);
      std::vector<std::thread> ts;
      for (unsigned t = 0; t < threads; t++)
        ts.emplace_back([=] { threadIdx = {t, 0, 0}; blockIdx = {x, y, 0}; k(); });
      for (auto &t : ts) t.join();
      for (unsigned w = 0; w < threads / 32; w++) delete g_warp_bar[w];
    }
}

static double sig(double x) { return 1 / (1 + std::exp(-x)); }

int main() {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.5f, 1.5f);
  for (const Case &c : cases) {
    const int hc = 4, D = c.D, T = c.T, S = c.S, nm = c.head ? hc : (2 + hc) * hc, iters = 20;
    const float eps = 1e-6f, normEps = 1e-6f, rmsEps = 1e-6f;
    std::vector<float> part((size_t)T * (nm + 1) * S), xs((size_t)T * hc * D), w(D), base(nm), scale(3);
    for (int b = 0; b < T; b++)
      for (int r = 0; r <= nm; r++)
        for (int s = 0; s < S; s++)
          part[((size_t)b * (nm + 1) + r) * S + s] = r < nm ? 0.3f * nd(rng) / std::sqrt((float)S) : ud(rng) * hc * D / S;
    for (auto &v : xs) v = nd(rng);
    for (auto &v : w) v = nd(rng);
    for (auto &v : base) v = nd(rng);
    for (auto &v : scale) v = nd(rng);
    scale[2] = 4;
    const float *wp = c.weighted ? w.data() : nullptr;
    std::vector<float> out[4][4];  // [kernel][pre, post, comb, a]
    const bool tiles = S > HCS_MAXS;   // a producer's partials: fuse_hc_finish4w alone
    const int nk = c.bd >= 64 ? 3 : 2;  // fuse_hc_finish4s needs two warps
    for (int k = 0; k < 4; k++) {
      if ((tiles && k < 3) || (k == 2 && nk < 3)) continue;
      out[k][0].assign(T * hc, NAN); out[k][1].assign(T * hc, NAN); out[k][2].assign(T * hc * hc, NAN); out[k][3].assign((size_t)T * D, NAN);
      float *pre = out[k][0].data(), *post = out[k][1].data(), *comb = out[k][2].data(), *a = out[k][3].data();
      const U3 grid = {(unsigned)T, c.head ? 1u : 2u, 1};
      if (k == 0)
        launch([&] { fuse_hc_finish(pre, post, comb, a, xs.data(), wp, part.data(), base.data(), scale.data(), hc, D, nm, S, iters, eps, normEps, c.head, rmsEps); }, grid, c.bd);
      else if (k == 1)
        launch([&] { fuse_hc_finish4(pre, post, comb, a, xs.data(), wp, part.data(), base.data(), scale.data(), D, nm, S, iters, eps, normEps, c.head, rmsEps); }, grid, c.bd);
      else if (k == 2)
        launch([&] { fuse_hc_finish4s(pre, post, comb, a, xs.data(), wp, part.data(), base.data(), scale.data(), D, nm, S, iters, eps, normEps, c.head, rmsEps); }, grid, c.bd);
      else
        launch([&] { fuse_hc_finish4w(pre, post, comb, a, xs.data(), wp, part.data(), base.data(), scale.data(), D, nm, S, iters, eps, normEps, c.head, rmsEps); }, grid, c.bd);
    }
    std::string bad;
    const char *what[4] = {"pre", "post", "comb", "a"};
    for (int k = 1; k < nk && !tiles; k++)
      for (int i = 0; i < 4; i++) {
        if (c.head && (i == 1 || i == 2)) continue;
        if (memcmp(out[0][i].data(), out[k][i].data(), out[0][i].size() * 4) != 0)
          bad += std::string(k == 1 ? " fin4-" : " fin4s-") + what[i] + "-bits";
      }
    // float64 evaluation
    double worst = 0;
    for (int b = 0; b < T; b++) {
      std::vector<double> d(nm + 1, 0.0);
      for (int r = 0; r <= nm; r++)
        for (int s = 0; s < S; s++) d[r] += part[((size_t)b * (nm + 1) + r) * S + s];
      const double rho = 1 / std::sqrt(d[nm] / (hc * D) + normEps);
      double pre[4], post[4], cm[16];
      for (int j = 0; j < hc; j++) pre[j] = sig(d[j] * rho * scale[0] + base[j]) + eps;
      // fuse_hc_finish4's results (the others' bits are checked against
      // fuse_hc_finish's above), and fuse_hc_finish4w's, whose partial sums
      // add in another order.
      const int ks[2] = {tiles ? 3 : 1, 3};
      auto chk = [&](int f, size_t i, double want) {
        for (int k : ks) worst = max(worst, std::fabs(out[k][f][i] - want) / max(1.0, std::fabs(want)));
      };
      for (int j = 0; j < hc; j++) chk(0, b * hc + j, pre[j]);
      if (!c.head) {
        for (int j = 0; j < hc; j++) post[j] = 2 * sig(d[hc + j] * rho * scale[1] + base[hc + j]);
        for (int jk = 0; jk < 16; jk++) cm[jk] = d[2 * hc + jk] * rho * scale[2] + base[2 * hc + jk];
        for (int j = 0; j < 4; j++) {
          double mx = -INFINITY, s = 0;
          for (int k = 0; k < 4; k++) mx = max(mx, cm[j * 4 + k]);
          for (int k = 0; k < 4; k++) s += cm[j * 4 + k] = std::exp(cm[j * 4 + k] - mx);
          for (int k = 0; k < 4; k++) cm[j * 4 + k] = cm[j * 4 + k] / s + eps;
        }
        for (int it = 0; it < iters; it++) {
          if (it > 0)
            for (int j = 0; j < 4; j++) {
              double s = 0;
              for (int k = 0; k < 4; k++) s += cm[j * 4 + k];
              for (int k = 0; k < 4; k++) cm[j * 4 + k] /= s + eps;
            }
          for (int k = 0; k < 4; k++) {
            double s = 0;
            for (int j = 0; j < 4; j++) s += cm[j * 4 + k];
            for (int j = 0; j < 4; j++) cm[j * 4 + k] /= s + eps;
          }
        }
        for (int j = 0; j < hc; j++) chk(1, b * hc + j, post[j]);
        for (int jk = 0; jk < 16; jk++) chk(2, b * 16 + jk, cm[jk]);
      }
      std::vector<double> v(D);
      double ss = 0;
      for (int i = 0; i < D; i++) {
        v[i] = 0;
        for (int j = 0; j < hc; j++) v[i] += pre[j] * xs[((size_t)b * hc + j) * D + i];
        ss += v[i] * v[i];
      }
      const double inv = 1 / std::sqrt(ss / D + rmsEps);
      for (int i = 0; i < D; i++) chk(3, (size_t)b * D + i, (wp ? w[i] : 1.0) * v[i] * inv);
    }
    if (!(worst <= 1e-5)) bad += " float64-error-" + std::to_string(worst);
    if (bad.empty()) printf("%s ok (worst %.2g)\n", c.name, worst);
    else printf("%s FAIL%s\n", c.name, bad.c_str());
  }
  return 0;
}
`

// TestHCDots4Emulated runs kernels/fuse.cu's fuse_hc_dots, fuse_hc_dots4 and
// fuse_hc_dots4_t1 on the CPU (no GPU needed; hcDots4EmuHarness) at the launch shapes
// fuse.go computes (hcSplitShape: V4's mix and head sites, F32 and BF16
// hc_fn, T up to 6 over two token groups, short streams whose splits cross
// stream boundaries) and fails unless fuse_hc_dots4's partials and x' are
// fuse_hc_dots's bits and within 1e-5 of the harness's float64 expand and
// dots (both fuse_hc_dots4 kernels at every T). Skipped with -short or
// without g++ (C++20).
func TestHCDots4Emulated(t *testing.T) {
	inc, err := hcDots4EmuSource()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name       string
		D, T       int
		head, bf16 bool
	}{
		{"v4 mix T1", 4096, 1, false, false},
		{"v4 mix T1 bf16", 4096, 1, false, true},
		{"v4 head T2", 4096, 2, true, false},
		{"D1024 mix T6", 1024, 6, false, false},
		{"D100 mix T3 bf16", 100, 3, false, true},
		{"D36 head T4", 36, 4, true, false},
	}
	var gen strings.Builder
	gen.WriteString("static std::vector<Case> cases = {\n")
	b2i := map[bool]int{false: 0, true: 1}
	for _, c := range cases {
		rows := 24
		if c.head {
			rows = 4
		}
		rb, groups, splits, cq, threads := hcSplitShape(rows, 4*c.D)
		fmt.Fprintf(&gen, "  {%q, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d},\n", c.name, c.D, c.T, rows, b2i[c.bf16], rb, groups, splits, cq, threads, b2i[c.head])
	}
	gen.WriteString("};\n")
	lines := runHostEmulation(t, map[string]string{"kern.inc": inc, "gen.inc": gen.String(), "emu.cpp": hcDots4EmuHarness}, "-ffp-contract=off")
	if len(lines) != len(cases) {
		t.Fatalf("emulation printed %d lines, want one per case:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for _, l := range lines {
		t.Log(l)
		if !strings.Contains(l, " ok") {
			t.Error(l)
		}
	}
}

// hcDots4EmuSource returns what TestHCDots4Emulated compiles: ops.cu's
// definitions that the dots kernels use, then fuse.cu from hc_x_expand to
// the end of fuse_hc_dots4.
func hcDots4EmuSource() (string, error) {
	ops, fuse := OpsSource(), fuseCu
	var b strings.Builder
	defs, err := cuMacros(ops, "HCS_RB", "HCS_TB", "HCS_MAXS")
	if err != nil {
		return "", err
	}
	b.WriteString(defs)
	for _, h := range []string{"__device__ __forceinline__ float warp_sum(", "__device__ __forceinline__ float dot4(",
		"template <bool BF, class XL>\n__device__ __forceinline__ void hc_split_dots_body("} {
		def, err := cuDefinition(ops, h)
		if err != nil {
			return "", fmt.Errorf("ops.cu: %v; update the emulation", err)
		}
		b.WriteString(def + "\n")
	}
	i, j := strings.Index(fuse, "// hc_x_expand is"), strings.Index(fuse, "// FUSE_KEEP:")
	if i < 0 || j < i || !strings.Contains(fuse[i:j], "HCD4_KERNEL(fuse_hc_dots4_t1,") {
		return "", fmt.Errorf("fuse.cu: the dots kernels' section (hc_x_expand .. fuse_hc_dots4) not found; update the emulation")
	}
	b.WriteString(fuse[i:j])
	return b.String(), nil
}

// hcDots4EmuHarness is TestHCDots4Emulated's C++ program (it includes
// kern.inc, hcDots4EmuSource's output, and gen.inc, the cases).
const hcDots4EmuHarness = `// CPU emulation of fuse_hc_dots and fuse_hc_dots4 (kernels/fuse.cu): every
// CUDA thread of a block is a std::thread, __syncthreads a block barrier,
// each shuffle an exchange between two warp barriers, __shared__ variables
// statics (one block runs at a time). Each case runs the three kernels on
// the same inputs (outputs poisoned with NaN) and prints "<name> ok ..."
// when the partials and x' are bit-identical and within 1e-5 of a float64
// evaluation written here, else "<name> FAIL <what>".
#include <barrier>
#include <thread>
#include <vector>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <cstdint>
#include <random>
#include <algorithm>
#include <string>
using std::min; using std::max;
struct float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
#include "cuda_emu.h"  // threadIdx, blockIdx, the barriers, __syncthreads, the CUDA keywords
typedef unsigned short u16;
struct MoxiePF { const void *p, *q; long long bytes, stride; int count; };
float g_shfl[32][32];
#define __restrict__
#define FULL 0xffffffffu
inline float __shfl_xor_sync(unsigned, float v, int o) {
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  g_warp_bar[w]->arrive_and_wait();
  g_shfl[w][l] = v;
  g_warp_bar[w]->arrive_and_wait();
  return g_shfl[w][l ^ o];
}
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
template <class T> inline T __ldg(const T *p) { return *p; }
#include "kern.inc"

struct Case { const char *name; int D, T, nm, bf16, rb, groups, S, cq, threads, head; };
#include "gen.inc"

template <class K>
void launch(K k, U3 grid, unsigned threads) {
  gridDim = grid; blockDim = {threads, 1, 1};
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        std::barrier<> bb(threads);
        g_block_bar = &bb;
        for (unsigned w = 0; w < threads / 32; w++) g_warp_bar[w] = new std::barrier<>(32);
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < threads; t++)
          ts.emplace_back([=] { threadIdx = {t, 0, 0}; blockIdx = {x, y, z}; k(); });
        for (auto &t : ts) t.join();
        for (unsigned w = 0; w < threads / 32; w++) delete g_warp_bar[w];
      }
}

int main() {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  for (const Case &c : cases) {
    const int hc = 4, D = c.D, T = c.T, nm = c.nm, S = c.S, n = hc * D;
    std::vector<float> x((size_t)T * n), o((size_t)T * D), post(T * hc), comb(T * hc * hc), fnf((size_t)nm * n);
    std::vector<u16> fnb((size_t)nm * n);
    for (auto &v : x) v = nd(rng);
    for (auto &v : o) v = nd(rng);
    for (auto &v : post) v = 2 * ud(rng);
    for (auto &v : comb) v = ud(rng) / hc;
    for (size_t e = 0; e < fnf.size(); e++) {
      float v = 0.3f * nd(rng) / std::sqrt((float)n);
      unsigned u; memcpy(&u, &v, 4);
      fnb[e] = (u16)(u >> 16);
      u &= 0xffff0000u;
      if (c.bf16) memcpy(&v, &u, 4);  // the weight as BF16 holds it
      fnf[e] = v;
    }
    const void *fn = c.bf16 ? (const void *)fnb.data() : (const void *)fnf.data();
    const int fmt = c.bf16 ? 3 : 4;
    std::vector<float> part[3], xout[3];
    for (int k = 0; k < 3; k++) {
      part[k].assign((size_t)T * (nm + 1) * S, NAN);
      xout[k].assign((size_t)T * n, NAN);
      float *pp = part[k].data(), *xo = xout[k].data();
      const U3 grid = {(unsigned)c.groups, (unsigned)S, (unsigned)((T + HCS_TB - 1) / HCS_TB)};
      if (k == 0)
        launch([&] { fuse_hc_dots(pp, x.data(), o.data(), post.data(), comb.data(), xo, fn, fmt, n, nm, c.cq, c.rb, T, hc, D); }, grid, c.threads);
      else if (k == 1)
        launch([&] { fuse_hc_dots4(pp, x.data(), o.data(), post.data(), comb.data(), xo, fn, fmt, n, nm, c.cq, c.rb, T, hc, D); }, grid, c.threads);
      else
        launch([&] { fuse_hc_dots4_t1(pp, x.data(), o.data(), post.data(), comb.data(), xo, fn, fmt, n, nm, c.cq, c.rb, T, hc, D); }, grid, c.threads);
    }
    std::string bad;
    for (int k = 1; k < 3; k++) {
      if (memcmp(part[0].data(), part[k].data(), 4 * part[0].size()) != 0) bad += k == 1 ? " partial-bits" : " t1-partial-bits";
      if (memcmp(xout[0].data(), xout[k].data(), 4 * xout[0].size()) != 0) bad += k == 1 ? " x'-bits" : " t1-x'-bits";
    }
    // float64: x' = post_k o + sum_j comb[j, k] x_j; dots over the partials' sum.
    double ex = 0, mx = 0, ed = 0, md = 0;
    for (int b = 0; b < T; b++) {
      std::vector<double> xs(n);
      for (int k = 0; k < hc; k++)
        for (int i = 0; i < D; i++) {
          double v = (double)post[b * hc + k] * o[(size_t)b * D + i];
          for (int j = 0; j < hc; j++) v += (double)comb[b * 16 + j * 4 + k] * x[((size_t)b * hc + j) * D + i];
          xs[k * D + i] = v;
          const float g = xout[1][(size_t)b * n + k * D + i];
          ex = std::isnan(g) ? INFINITY : max(ex, std::fabs(g - v));
          mx = max(mx, std::fabs(v));
        }
      for (int r = 0; r <= nm; r++) {
        double want = 0, got = 0;
        for (int e = 0; e < n; e++) want += (r < nm ? (double)fnf[(size_t)r * n + e] : xs[e]) * xs[e];
        for (int s = 0; s < S; s++) got += part[1][((size_t)b * (nm + 1) + r) * S + s];
        ed = std::isnan(got) ? INFINITY : max(ed, std::fabs(got - want) / (r < nm ? 1.0 : max(1.0, std::fabs(want))));
        md = max(md, std::fabs(want));
      }
    }
    if (!(ex / mx <= 1e-5)) bad += " x'-float64-error";
    if (!(ed <= 1e-5)) bad += " dots-float64-error";
    if (bad.empty()) printf("%s ok (x' rel %.3g, dots %.3g)\n", c.name, ex / mx, ed);
    else printf("%s FAIL%s (x' rel %.3g, dots %.3g)\n", c.name, bad.c_str(), ex / mx, ed);
  }
  return 0;
}
`
