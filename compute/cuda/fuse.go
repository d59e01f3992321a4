package cuda

import (
	_ "embed"
	"fmt"
	"math"
	"os"
	"structs"
	"unsafe"

	"moxie/compute"
)

//go:embed kernels/fuse.cu
var fuseCu string

// fuseSrc is the fuse module's source: kernels/ops.cu (whose helpers and
// hc_split_dots the fused kernels use) followed by kernels/fuse.cu.
var fuseSrc = opsSrc + "\n" + fuseCu

// FuseSource returns the CUDA source of the fuse module (kernels/ops.cu
// followed by kernels/fuse.cu).
func FuseSource() string { return fuseSrc }

// fuseModuleName names the fuse module among the device's modules.
const fuseModuleName = "fuse"

// fuseModule returns the device's fuse module, compiling (or loading from
// the disk cache) it on first use.
func (c *Ctx) fuseModule() (*Module, error) { return c.namedModule(fuseModuleName, fuseSrc, nil) }

// LoadFuse compiles (or loads from the disk cache) the fuse module now, so
// that the first fused op does not: call it before capturing a CUDA graph
// that contains fused ops (loading a module is not a stream operation).
func (c *Ctx) LoadFuse() error {
	_, err := c.fuseModule()
	return err
}

// launchFuse enqueues the fuse kernel `name` on s.
func (c *Ctx) launchFuse(name string, grid, block Dim3, shared int, s Stream, args ...unsafe.Pointer) error {
	return c.launchNamed(c.fuseModule, name, grid, block, shared, s, args...)
}

// rmsThreads is the block size of the rmsnorm kernel (RMSNorm) for rows of
// dim; the fused kernels that end in an RMSNorm use the same, so that their
// sums of squares add in the same order.
func rmsThreads(dim int) int { return min(1024, max(32, (dim+3)/4/32*32)) }

// HCNorm is the input and output of one fused sublayer boundary (HCMixNorm,
// HCHeadNorm) for T tokens of HC streams of width D = Fn.Cols/HC. All
// buffers are float32 device memory owned by the caller.
//
//	x' = Post·O + Combᵀ·X       (HCExpand; skipped when O == 0: x' = X)
//	Pre, PostOut, CombOut = HCMix(x')  (HCHeadNorm: Pre = HCHeadPre(x'))
//	A = RMS(Σ_j Pre_j·x'_j; Norm)      (HCCollapse, then RMSNorm)
//
// From hcPrefillMinT (512) tokens, where the site fits (hc_fn of at most 24
// rows; V4's mix and head sites do) and $MOXIE_CUDA_HCPREFILL is not "old",
// the prefill kernels run it: the first reads X, O, Post and Comb and writes
// XOut and the partials, many tokens per block; the second writes Pre,
// PostOut, CombOut and A (Counters unused). Otherwise, with Counters set and
// $MOXIE_CUDA_HCFUSE=one, one kernel runs the boundary: its blocks form the
// dot-product partials (Scratch) and x' (XOut), and the last block to
// finish them writes Pre, PostOut, CombOut and A. By default two kernels
// run in stream order: the first reads X, O,
// Post and Comb and writes XOut and the partials; the second reads the
// partials and x' and writes Pre, PostOut, CombOut and A. Either way every
// read of X, O, Post and Comb comes before the first write of the new
// coefficients or A, so PostOut and CombOut may be the same buffers as Post
// and Comb; XOut must not overlap X, O, Post or Comb, and A must not
// overlap X, XOut, Pre, PostOut, CombOut or Scratch (it may be O). The
// two-kernel boundary's second kernel is fuse_hc_finish4 where it fits (hc
// 4; see HCFuseTwoFin4; fuse_hc_finish4s with $MOXIE_CUDA_HCFIN=short)
// unless $MOXIE_CUDA_HCFIN=old; its first, with the
// expand, is fuse_hc_dots4 where it fits (hc 4) for one token unless
// $MOXIE_CUDA_HCDOTS=old, and for any T when it is "new" (see ParseHCDots).
// All paths run the same float32
// operations in the same order, whatever T.
type HCNorm struct {
	// X [T, HC, D]: the streams entering the boundary (the previous
	// sublayer's input when O != 0). 16-byte aligned.
	X DevicePtr
	// O [T, D] (16-byte aligned), Post [T, HC], Comb [T, HC, HC]: the
	// previous sublayer's output and coefficients; O == 0 skips the expand
	// and leaves Post, Comb and XOut unread.
	O, Post, Comb DevicePtr
	// XOut [T, HC, D] receives x' when O != 0. 16-byte aligned.
	XOut DevicePtr
	// Pre [T, HC], PostOut [T, HC], CombOut [T, HC, HC]: the new
	// coefficients (HCHeadNorm writes Pre only).
	Pre, PostOut, CombOut DevicePtr
	// A [T, D] receives the normalised collapse.
	A DevicePtr
	// Norm [D] is the RMSNorm weight, or 0 for an unweighted norm.
	Norm DevicePtr
	// Eps is the RMSNorm's ε (the HC's own ε's are in HC).
	Eps float32
	// Scratch holds the dot-product partials: at least
	// HCNormScratchBytes(HC, D, T) bytes, owned by the caller; fused
	// boundaries on one stream may share it.
	Scratch DevicePtr
	// Counters (int32 [HCNormCounterBytes(T)/4], 4-byte aligned, owned by
	// the caller) lets $MOXIE_CUDA_HCFUSE=one select the one-kernel
	// boundary (and a bad value of it be an error): its blocks count their
	// arrivals there. It must be zero before the first boundary that uses
	// it (Ctx.Memset once after allocating); every boundary leaves it zero,
	// so boundaries on one stream (and replays of a captured graph) may
	// share it, but no two boundaries in flight at once. 0 selects the
	// two-kernel boundary.
	Counters DevicePtr
	// T is the number of tokens (at least 1).
	T int
}

// HCNormCounterBytes is the Counters size of a boundary of T tokens: one
// int32 per group of 4 tokens (0 for T <= 0).
func HCNormCounterBytes(T int) int {
	if T <= 0 {
		return 0
	}
	return 4 * ((T + hcSplitTB - 1) / hcSplitTB)
}

// HCFuseVariant is the sublayer-boundary implementation HCMixNorm and
// HCHeadNorm run (ParseHCFuseVariant reads $MOXIE_CUDA_HCFUSE).
type HCFuseVariant int

const (
	// HCFuseOne is the one-kernel boundary (fuse_hc_one), used when the
	// call sets HCNorm.Counters and $MOXIE_CUDA_HCFUSE=one.
	HCFuseOne HCFuseVariant = iota
	// HCFuseTwo is the two-kernel boundary (fuse_hc_dots or hc_split_dots,
	// then fuse_hc_finish), the default: on the H200 (2026-11-30,
	// BenchmarkHCBoundary, V4, one token, in a graph) it took 9.4 us against
	// the one-kernel boundary's 13.5.
	HCFuseTwo
	// HCFusePrefill is the prefill boundary (fuse_hcp_dots, then
	// fuse_hcp_finish4 or fuse_hcp_finish), whatever Counters says, where
	// the site's shapes fit it (hcPrefillFits; else the two-kernel one):
	// HCMixNorm and HCHeadNorm take it for hcPrefillMinT tokens or more
	// unless $MOXIE_CUDA_HCPREFILL=old. It computes the same float32
	// operations in the same order as the other two.
	HCFusePrefill
	// HCFuseTwoFin4 is HCFuseTwo with the finish fuse_hc_finish4 where it
	// fits (hcFinish4Fits: hc 4, V4's shapes; else fuse_hc_finish): the same
	// float32 operations in the same order, on a shorter critical path.
	// HCMixNorm and HCHeadNorm take it for the two-kernel boundary unless
	// $MOXIE_CUDA_HCFIN=old.
	HCFuseTwoFin4
	// HCFuseTwoFin4S is HCFuseTwoFin4 with the finish fuse_hc_finish4s
	// where it fits (hcFinish4sFits; else as HCFuseTwoFin4): the same
	// float32 operations in the same order on a shorter Sinkhorn path (no
	// block barrier or shared round trip before the Sinkhorn, the row sums
	// two chains at once). HCMixNorm and HCHeadNorm take it for the
	// two-kernel boundary with $MOXIE_CUDA_HCFIN=short.
	HCFuseTwoFin4S
)

func (v HCFuseVariant) String() string {
	switch v {
	case HCFuseTwo:
		return "two"
	case HCFusePrefill:
		return "prefill"
	case HCFuseTwoFin4:
		return "two-fin4"
	case HCFuseTwoFin4S:
		return "two-fin4s"
	}
	return "one"
}

// ParseHCFuseVariant parses a $MOXIE_CUDA_HCFUSE value: "" or "two"
// (HCFuseTwo), "one" (HCFuseOne); anything else is an error naming the
// variable.
func ParseHCFuseVariant(v string) (HCFuseVariant, error) {
	switch v {
	case "one":
		return HCFuseOne, nil
	case "", "two":
		return HCFuseTwo, nil
	}
	return 0, fmt.Errorf("MOXIE_CUDA_HCFUSE=%q: want one or two (or unset for the default, two)", v)
}

// hcOneThreads is the number of dot-product threads per fuse_hc_one block
// the launch aims at (HCO_MAXDOTS at most): that many threads of
// hc_split_dots's virtual blocks, plus the Sinkhorn warp.
const hcOneThreads = 256

// hcOneMaxDots is HCO_MAXDOTS in kernels/fuse.cu.
const hcOneMaxDots = 256

// hcOneArgs mirrors struct HCOneArgs in kernels/fuse.cu.
type hcOneArgs struct {
	_                                                                           structs.HostLayout
	Part, Ctr, X, O, Post0, Comb0, XOut, Fn, Pre, Post, Comb, A, W, Base, Scale uint64
	Fmt, N, NM, CQ, RB, Batch, HC, Dim, S, Groups, V, VThreads, Iters, Head, VT int32
	Eps, NormEps, RMSEps                                                        float32
}

// HCNormScratchBytes is the Scratch size HCMixNorm and HCHeadNorm need for
// T tokens of hc streams of width dim.
func HCNormScratchBytes(hc, dim, T int) int {
	if hc <= 0 || dim <= 0 || T <= 0 {
		return 0
	}
	n := hc * dim
	_, _, s1, _, _ := hcSplitShape((2+hc)*hc, n)
	_, _, s2, _, _ := hcSplitShape(hc, n)
	return 4 * T * max(((2+hc)*hc+1)*s1, (hc+1)*s2)
}

// HCMixNorm enqueues the sublayer boundary of HCNorm with p a mix site (Fn
// [(2+HC)·HC, HC·D]): the optional expand of the previous sublayer, the
// split-K HCMix, the collapse and the RMSNorm in two kernels, or one
// (a.Counters set and $MOXIE_CUDA_HCFUSE=one) (see HCNorm for the aliasing
// rules; a bad $MOXIE_CUDA_HCFUSE is an error when Counters is set, a bad
// $MOXIE_CUDA_HCPREFILL one from hcPrefillMinT tokens). D must
// be a multiple of 4 and Fn 16-byte (F32) or 8-byte (BF16) aligned. The
// results are those of HCExpand, HCMix (split path, whatever
// $MOXIE_CUDA_HCMIX says), HCCollapse and RMSNorm run one after another:
// the same float32 operations in the same order for batches up to 16, where
// HCMix takes its split path. Positions are not involved; nothing is
// allocated or synchronised, so the call can be captured in a CUDA graph
// once the fuse module is loaded (LoadFuse).
func (c *Ctx) HCMixNorm(a *HCNorm, p *HC, s Stream) error {
	return c.hcNorm("HCMixNorm", a, p, 0, s)
}

// HCHeadNorm is HCMixNorm for the output head's collapse (p: Fn [HC,
// HC·D], one scale): Pre = HCHeadPre(x'), A = RMS(Σ_j Pre_j·x'_j; Norm);
// PostOut and CombOut are unused.
func (c *Ctx) HCHeadNorm(a *HCNorm, p *HC, s Stream) error {
	return c.hcNorm("HCHeadNorm", a, p, 1, s)
}

func (c *Ctx) hcNorm(op string, a *HCNorm, p *HC, head int32, s Stream) error {
	v := HCFuseTwo
	if a != nil && a.Counters != 0 {
		var err error
		if v, err = ParseHCFuseVariant(os.Getenv("MOXIE_CUDA_HCFUSE")); err != nil {
			return opErr(op, "%v", err)
		}
	}
	if a != nil && a.T >= hcPrefillMinT && hcPrefillFits(p) {
		on, err := ParseHCPrefill(os.Getenv("MOXIE_CUDA_HCPREFILL"))
		if err != nil {
			return opErr(op, "%v", err)
		}
		if on {
			v = HCFusePrefill
		}
	}
	if v == HCFuseTwo {
		var err error
		if v, err = ParseHCFinishVariant(os.Getenv("MOXIE_CUDA_HCFIN")); err != nil {
			return opErr(op, "%v", err)
		}
	}
	dots4 := false
	if v == HCFuseTwo || v == HCFuseTwoFin4 || v == HCFuseTwoFin4S {
		var err error
		T := 0
		if a != nil {
			T = a.T
		}
		if dots4, err = ParseHCDots(os.Getenv("MOXIE_CUDA_HCDOTS"), T); err != nil {
			return opErr(op, "%v", err)
		}
	}
	return c.hcNormVariant(op, a, p, head, v, hcOneThreads, dots4, s)
}

// HCMixNormTiles finishes the sublayer boundary a of one token (T 1, mix
// site p: HC 4, Fn F32 [24, 4·D]) whose expand and split-K partials the
// producer of its O began (RunMoEDecodeHC or LaunchGemvHC with the
// HCEpilogue X = a.X, Post = a.Post, Comb = a.Comb, XOut = a.XOut, Part =
// a.Scratch, Fn = p): fuse_hc_finish4w sums the D/16 partials of each row
// (a warp a row) and writes Pre, PostOut, CombOut and A as HCMixNorm's
// finish does; O is not read. The gates' dot products add in another order
// than HCMixNorm's (its dots kernel's splits), so the results agree with
// HCMixNorm's to rounding, not bit for bit; x' is its bits. Scratch must
// hold HCEpiloguePartBytes(D); A must not overlap XOut, Pre, PostOut,
// CombOut or Scratch. It can be captured in a CUDA graph once the fuse
// module is loaded (LoadFuse).
func (c *Ctx) HCMixNormTiles(a *HCNorm, p *HC, s Stream) error {
	const op = "HCMixNormTiles"
	if a == nil || p == nil {
		return opErr(op, "nil arguments or HC parameters")
	}
	if _, err := p.check(op, 0); err != nil {
		return err
	}
	D := p.Fn.Cols / p.HC
	switch {
	case p.HC != 4 || p.Fn.Format != compute.F32:
		return opErr(op, "HC %d, Fn %v: want HC 4 and F32 (the MoE epilogue's site)", p.HC, p.Fn.Format)
	case a.T != 1:
		return opErr(op, "T %d: want one token", a.T)
	case D%16 != 0 || D > 4*rmsThreads(D):
		return opErr(op, "stream width D %d: want a multiple of 16 up to %d", D, 4*1024)
	case !nonNull(a.XOut, a.Pre, a.PostOut, a.CombOut, a.A, a.Scratch):
		return opErr(op, "null XOut %#x, Pre %#x, PostOut %#x, CombOut %#x, A %#x or Scratch %#x", a.XOut, a.Pre, a.PostOut, a.CombOut, a.A, a.Scratch)
	case a.A == a.XOut || a.A == a.Pre || a.A == a.PostOut || a.A == a.CombOut || a.A == a.Scratch:
		return opErr(op, "A %#x aliases XOut, Pre, PostOut, CombOut or Scratch", a.A)
	case math.IsNaN(float64(a.Eps)) || a.Eps < 0:
		return opErr(op, "Eps %g: want >= 0", a.Eps)
	}
	d32, nm, s32, iters := int32(D), int32(p.Fn.Rows), int32(D/16), int32(p.Iters)
	eps, neps, reps, head := p.Eps, p.NormEps, a.Eps, int32(0)
	pre, post, comb, out, xs, norm, part, base, scale := a.Pre, a.PostOut, a.CombOut, a.A, a.XOut, a.Norm, a.Scratch, p.Base, p.Scale
	return c.launchFuse("fuse_hc_finish4w", Dim3{X: 1, Y: 2}, Dim3{X: uint32(rmsThreads(D))}, 0, s,
		ptr(&pre), ptr(&post), ptr(&comb), ptr(&out), ptr(&xs), ptr(&norm), ptr(&part), ptr(&base), ptr(&scale),
		ptr(&d32), ptr(&nm), ptr(&s32), ptr(&iters), ptr(&eps), ptr(&neps), ptr(&head), ptr(&reps))
}

// ParseHCDots parses a $MOXIE_CUDA_HCDOTS value for a boundary of T
// tokens: whether the two-kernel boundary's first kernel (the expand and the
// split-K dots) is fuse_hc_dots4 (fuse_hc_dots4_t1 for one token; where it
// fits: hc 4) rather than fuse_hc_dots. "new" always, "old" never, "" (the
// default) for one token only: there it was measured on the H200 (session 5:
// the 8-layer decode step 1.67 → 1.60 ms), while the 254-register kernel of
// several tokens was not; anything else is an error naming the variable.
// fuse_hc_dots4 computes fuse_hc_dots's partials and x', bit for bit, with
// every load of a quad issued before the first product (fuse_hc_dots waits
// for memory three times per quad).
func ParseHCDots(v string, T int) (bool, error) {
	switch v {
	case "":
		return T == 1, nil
	case "old":
		return false, nil
	case "new":
		return true, nil
	}
	return false, fmt.Errorf("MOXIE_CUDA_HCDOTS=%q: want old or new (or unset for the default: new at one token, old otherwise)", v)
}

// hcDots4Fits reports whether fuse_hc_dots4 can replace fuse_hc_dots for hc
// streams.
func hcDots4Fits(hc int) bool { return hc == 4 }

// hcDots4Kernel names the fuse_hc_dots4 kernel for T tokens: the one that
// issues one token's loads at a time (168 registers a thread against 254)
// for a single token, else the one that issues a token group's at once.
func hcDots4Kernel(T int) string {
	if T == 1 {
		return "fuse_hc_dots4_t1"
	}
	return "fuse_hc_dots4"
}

// ParseHCFinishVariant parses a $MOXIE_CUDA_HCFIN value into the
// two-kernel boundary variant it selects: "old" HCFuseTwo (fuse_hc_finish),
// "" or "new" HCFuseTwoFin4 (fuse_hc_finish4 where hcFinish4Fits), "short"
// HCFuseTwoFin4S (fuse_hc_finish4s where hcFinish4Fits and
// hcFinish4sFits); anything else is an error naming the variable. All
// three finish with the same bits. On the H200 (2026-11-30,
// BenchmarkHCBoundary, V4, one token, in a graph) a boundary took 7.76 us
// with fuse_hc_finish4 against 9.43, and an 8-layer decode step 1.71 ms
// against 1.76; fuse_hc_finish4s 5.08 us against 5.20 alone but the step
// 1.62 ms against 1.61 (session 5), so it is not the default.
func ParseHCFinishVariant(v string) (HCFuseVariant, error) {
	switch v {
	case "old":
		return HCFuseTwo, nil
	case "", "new":
		return HCFuseTwoFin4, nil
	case "short":
		return HCFuseTwoFin4S, nil
	}
	return HCFuseTwo, fmt.Errorf("MOXIE_CUDA_HCFIN=%q: want old, new or short (or unset for the default, new)", v)
}

// hcFinish4sFits reports whether fuse_hc_finish4s can replace a
// fuse_hc_finish4 (hcFinish4Fits) at stream width dim: its Sinkhorn block
// needs two warps (rmsThreads(dim) >= 64).
func hcFinish4sFits(dim int) bool { return rmsThreads(dim) >= 64 }

// hcFinish4Fits reports whether fuse_hc_finish4 can finish a two-kernel
// boundary of hc streams of width dim whose dots ran with the given splits
// into scratch: hc 4, splits a multiple of 4 up to hcMaxSplits, scratch
// 16-byte aligned and dim at most 4 elements per rmsnorm thread.
func hcFinish4Fits(hc, dim, splits int, scratch DevicePtr) bool {
	return hc == 4 && splits%4 == 0 && splits <= hcMaxSplits && scratch%16 == 0 && dim <= 4*rmsThreads(dim)
}

// hcFinish4Kernel names the finish4 kernel of a two-kernel boundary variant
// (HCFuseTwoFin4 or HCFuseTwoFin4S) at stream width dim, where
// hcFinish4Fits: fuse_hc_finish4s for HCFuseTwoFin4S where hcFinish4sFits,
// else fuse_hc_finish4.
func hcFinish4Kernel(variant HCFuseVariant, dim int) string {
	if variant == HCFuseTwoFin4S && hcFinish4sFits(dim) {
		return "fuse_hc_finish4s"
	}
	return "fuse_hc_finish4"
}

// hcPrefillMinT is the smallest token count HCMixNorm and HCHeadNorm run on
// the prefill kernels (fuse_hcp_dots + fuse_hcp_finish4) by default.
// On the H200 (2026-11-30, BenchmarkHCPrefill, V4 mix with expand, in a
// graph) the prefill kernels took 58.9 us at 16 tokens against the decode
// kernels' 16.5, 260 against 313 at 512 and 834 against 1,219 at 2,048.
const hcPrefillMinT = 512

// ParseHCPrefill parses a $MOXIE_CUDA_HCPREFILL value: "" or "new" (chunks
// of hcPrefillMinT tokens or more take the prefill boundary kernels),
// "old" (they take the decode boundary's kernels, as before); anything
// else is an error naming the variable.
func ParseHCPrefill(v string) (bool, error) {
	switch v {
	case "", "new":
		return true, nil
	case "old":
		return false, nil
	}
	return false, fmt.Errorf("MOXIE_CUDA_HCPREFILL=%q: want new or old (or unset for the default, new)", v)
}

// The prefill boundary's launch constants (HCP_TM, HCP_RPW, HCP_MAXNM in
// kernels/fuse.cu) and its grid target.
const (
	hcpTM      = 64 // tokens per fuse_hcp_dots block
	hcpRPW     = 5  // rows (with the Σx² row) per warp at most
	hcpMaxRows = 24 // Fn rows at most
	// hcpTargetBlocks is the largest fuse_hcp_dots grid the splits per
	// block aim at: one wave of two blocks per SM of an H200 (the kernel's
	// 183 registers a thread and 45 KiB of shared memory allow two), so
	// that the finish's blocks, launched early under programmatic dependent
	// launch, take no dots block's place.
	hcpTargetBlocks = 264
	// hcpFinishDots is the collapse threads per fuse_hcp_finish block (plus
	// the Sinkhorn warp).
	hcpFinishDots = 256
)

// hcPrefillShape returns fuse_hcp_dots's block shape for Fn rows of n
// columns (hc_split_dots's cq and threads): nw warps of at most rpw rows
// each, the fewest idle row slots over 4..8 warps (ties: more warps); ok is
// false where the prefill kernels do not apply (more than hcpMaxRows rows,
// or splits of more than 256 quads).
func hcPrefillShape(rows, cq, threads int) (nw, rpw int, ok bool) {
	r1 := rows + 1
	if rows < 1 || rows > hcpMaxRows || cq < 1 || cq > threads || threads > 256 {
		return 0, 0, false
	}
	best := 0
	for w := 8; w >= 4; w-- {
		if k := w * ((r1 + w - 1) / w); best == 0 || k < best {
			best, nw = k, w
		}
	}
	rpw = (r1 + nw - 1) / nw
	return nw, rpw, rpw <= hcpRPW
}

// hcpSplitsPerBlock is the number of splits each fuse_hcp_dots block
// reduces for tiles token tiles: the smallest power of two that keeps the
// grid within hcpTargetBlocks blocks (or covers all splits).
func hcpSplitsPerBlock(splits, tiles int) int {
	spb := 1
	for spb < splits && (splits+spb-1)/spb*tiles > hcpTargetBlocks {
		spb *= 2
	}
	return spb
}

// hcPrefillFits reports whether HC site p's shapes fit the prefill kernels.
func hcPrefillFits(p *HC) bool {
	if p == nil || p.Fn == nil || p.HC <= 0 || p.Fn.Cols <= 0 || p.Fn.Cols%4 != 0 {
		return false
	}
	_, _, _, cq, threads := hcSplitShape(p.Fn.Rows, p.Fn.Cols)
	_, _, ok := hcPrefillShape(p.Fn.Rows, cq, threads)
	return ok
}

// hcNormVariant is hcNorm with the variant chosen (HCFuseOne runs only with
// Counters set), for HCFuseOne the dot-product threads per block the
// launch aims at (32..hcOneMaxDots), and for the two-kernel variants whether
// the expand's dots run on fuse_hc_dots4 where it fits (hcDots4Fits).
func (c *Ctx) hcNormVariant(op string, a *HCNorm, p *HC, head int32, variant HCFuseVariant, oneThreads int, dots4 bool, s Stream) error {
	if a == nil || p == nil {
		return opErr(op, "nil arguments or HC parameters")
	}
	code, err := p.check(op, head)
	if err != nil {
		return err
	}
	rows := p.Fn.Rows // check: (2+HC)·HC, or HC for a head
	n := p.Fn.Cols
	D := n / p.HC
	T := a.T
	expand := a.O != 0
	switch {
	case !pos32(T) || (T+hcSplitTB-1)/hcSplitTB > opsMaxGridY:
		return opErr(op, "T %d: want 1..%d tokens", T, hcSplitTB*opsMaxGridY)
	case D%4 != 0:
		return opErr(op, "stream width D %d (Fn columns %d / HC %d): want a multiple of 4", D, n, p.HC)
	case !nonNull(a.X, a.Pre, a.A, a.Scratch) || (head == 0 && !nonNull(a.PostOut, a.CombOut)):
		return opErr(op, "null X %#x, Pre %#x, PostOut %#x, CombOut %#x, A %#x or Scratch %#x", a.X, a.Pre, a.PostOut, a.CombOut, a.A, a.Scratch)
	case expand && !nonNull(a.Post, a.Comb, a.XOut):
		return opErr(op, "expand (O %#x) with null Post %#x, Comb %#x or XOut %#x", a.O, a.Post, a.Comb, a.XOut)
	case !hcSplitAligned(a.X, p.Fn.Data, n, code) || (expand && (a.O%16 != 0 || a.XOut%16 != 0)):
		return opErr(op, "X %#x, O %#x, XOut %#x must be 16-byte aligned and Fn %#x 16-byte (F32) or 8-byte (BF16) aligned", a.X, a.O, a.XOut, p.Fn.Data)
	case expand && (a.XOut == a.X || a.XOut == a.O || a.XOut == a.Post || a.XOut == a.Comb):
		return opErr(op, "XOut %#x aliases X, O, Post or Comb", a.XOut)
	case a.A == a.X || (expand && a.A == a.XOut) || a.A == a.Pre || a.A == a.Scratch || (head == 0 && (a.A == a.PostOut || a.A == a.CombOut)):
		return opErr(op, "A %#x aliases X, XOut, Pre, PostOut, CombOut or Scratch", a.A)
	case math.IsNaN(float64(a.Eps)) || a.Eps < 0:
		return opErr(op, "Eps %g: want >= 0", a.Eps)
	case a.Counters%4 != 0 || (a.Counters != 0 && (a.Counters == a.Scratch || a.Counters == a.A)):
		return opErr(op, "Counters %#x: want 4-byte aligned, not Scratch or A", a.Counters)
	}
	rb, groups, splits, cq, threads := hcSplitShape(rows, n)
	if variant == HCFusePrefill {
		if nw, rpw, ok := hcPrefillShape(rows, cq, threads); ok {
			return c.hcNormPrefill(a, p, head, code, splits, cq, threads, nw, rpw, s)
		}
	}
	if variant == HCFuseOne && a.Counters != 0 {
		return c.hcNormOne(a, p, head, code, rb, groups, splits, cq, threads, oneThreads, s)
	}
	fn, part := p.Fn.Data, a.Scratch
	hc, n32, d32, nm, b32 := int32(p.HC), int32(n), int32(D), int32(rows), int32(T)
	s32, cq32, rb32 := int32(splits), int32(cq), int32(rb)
	grid := Dim3{X: uint32(groups), Y: uint32(splits), Z: uint32((T + hcSplitTB - 1) / hcSplitTB)}
	x, o, post0, comb0, xout := a.X, a.O, a.Post, a.Comb, a.XOut
	xs := x
	if expand {
		xs = xout
		dots := "fuse_hc_dots"
		if dots4 && hcDots4Fits(p.HC) {
			dots = hcDots4Kernel(T)
		}
		if err := c.launchFuse(dots, grid, Dim3{X: uint32(threads)}, 0, s,
			ptr(&part), ptr(&x), ptr(&o), ptr(&post0), ptr(&comb0), ptr(&xout), ptr(&fn), ptr(&code),
			ptr(&n32), ptr(&nm), ptr(&cq32), ptr(&rb32), ptr(&b32), ptr(&hc), ptr(&d32)); err != nil {
			return err
		}
	} else if err := c.launchFuse("hc_split_dots", grid, Dim3{X: uint32(threads)}, 0, s,
		ptr(&part), ptr(&x), ptr(&fn), ptr(&code), ptr(&n32), ptr(&nm), ptr(&cq32), ptr(&rb32), ptr(&b32)); err != nil {
		return err
	}
	iters, eps, neps, reps := int32(p.Iters), p.Eps, p.NormEps, a.Eps
	base, scale := p.Base, p.Scale
	pre, post, comb, out, norm := a.Pre, a.PostOut, a.CombOut, a.A, a.Norm
	// A mix's finish runs two blocks per token (the Sinkhorn beside the
	// collapse and norm), the head's one.
	roles := uint32(2 - head)
	if (variant == HCFuseTwoFin4 || variant == HCFuseTwoFin4S) && hcFinish4Fits(p.HC, D, splits, part) {
		return c.launchFuse(hcFinish4Kernel(variant, D), Dim3{X: uint32(T), Y: roles}, Dim3{X: uint32(rmsThreads(D))}, 0, s,
			ptr(&pre), ptr(&post), ptr(&comb), ptr(&out), ptr(&xs), ptr(&norm), ptr(&part), ptr(&base), ptr(&scale),
			ptr(&d32), ptr(&nm), ptr(&s32), ptr(&iters), ptr(&eps), ptr(&neps), ptr(&head), ptr(&reps))
	}
	return c.launchFuse("fuse_hc_finish", Dim3{X: uint32(T), Y: roles}, Dim3{X: uint32(rmsThreads(D))}, 4*(rows+1)*splits, s,
		ptr(&pre), ptr(&post), ptr(&comb), ptr(&out), ptr(&xs), ptr(&norm), ptr(&part), ptr(&base), ptr(&scale),
		ptr(&hc), ptr(&d32), ptr(&nm), ptr(&s32), ptr(&iters), ptr(&eps), ptr(&neps), ptr(&head), ptr(&reps))
}

// hcOneShape returns fuse_hc_one's launch shape for hc_split_dots's shape
// (groups × splits blocks of threads) and a target of oneThreads
// dot-product threads per block: v virtual blocks per block, blocks per
// token group, and the block size (v·threads plus the Sinkhorn warp).
func hcOneShape(groups, splits, threads, oneThreads int) (v, blocks, blockDim int) {
	v = max(1, min(oneThreads, hcOneMaxDots)/threads)
	v = min(v, groups*splits)
	blocks = (groups*splits + v - 1) / v
	return v, blocks, v*threads + 32
}

// hcNormOne launches fuse_hc_one for a checked HCNorm (see hcNormVariant).
func (c *Ctx) hcNormOne(a *HCNorm, p *HC, head, code int32, rb, groups, splits, cq, threads, oneThreads int, s Stream) error {
	v, blocks, bd := hcOneShape(groups, splits, threads, oneThreads)
	D := p.Fn.Cols / p.HC
	args := hcOneArgs{
		Part: uint64(a.Scratch), Ctr: uint64(a.Counters), X: uint64(a.X), Fn: uint64(p.Fn.Data),
		Pre: uint64(a.Pre), A: uint64(a.A), W: uint64(a.Norm), Base: uint64(p.Base), Scale: uint64(p.Scale),
		Fmt: code, N: int32(p.Fn.Cols), NM: int32(p.Fn.Rows), CQ: int32(cq), RB: int32(rb), Batch: int32(a.T),
		HC: int32(p.HC), Dim: int32(D), S: int32(splits), Groups: int32(groups), V: int32(v), VThreads: int32(threads),
		Iters: int32(p.Iters), Head: head, VT: int32(rmsThreads(D)),
		Eps: p.Eps, NormEps: p.NormEps, RMSEps: a.Eps,
	}
	if a.O != 0 {
		args.O, args.Post0, args.Comb0, args.XOut = uint64(a.O), uint64(a.Post), uint64(a.Comb), uint64(a.XOut)
	}
	if head == 0 {
		args.Post, args.Comb = uint64(a.PostOut), uint64(a.CombOut)
	}
	grid := Dim3{X: uint32(blocks), Y: 1, Z: uint32((a.T + hcSplitTB - 1) / hcSplitTB)}
	kernel := "fuse_hc_one"
	if p.HC == 4 {
		kernel = "fuse_hc_one4"
	}
	return c.launchFuse(kernel, grid, Dim3{X: uint32(bd)}, 0, s, ptr(&args))
}

// hcNormPrefill launches fuse_hcp_dots and fuse_hcp_finish4 (or
// fuse_hcp_finish) for a checked HCNorm (see hcNormVariant) whose shape
// hcPrefillShape accepts (nw warps of rpw rows).
func (c *Ctx) hcNormPrefill(a *HCNorm, p *HC, head, code int32, splits, cq, threads, nw, rpw int, s Stream) error {
	D := p.Fn.Cols / p.HC
	tiles := (a.T + hcpTM - 1) / hcpTM
	spb := hcpSplitsPerBlock(splits, tiles)
	args := hcOneArgs{
		Part: uint64(a.Scratch), X: uint64(a.X), Fn: uint64(p.Fn.Data),
		Pre: uint64(a.Pre), A: uint64(a.A), W: uint64(a.Norm), Base: uint64(p.Base), Scale: uint64(p.Scale),
		Fmt: code, N: int32(p.Fn.Cols), NM: int32(p.Fn.Rows), CQ: int32(cq), RB: int32(rpw), Batch: int32(a.T),
		HC: int32(p.HC), Dim: int32(D), S: int32(splits), Groups: int32(spb), V: 1, VThreads: int32(threads),
		Iters: int32(p.Iters), Head: head, VT: int32(rmsThreads(D)),
		Eps: p.Eps, NormEps: p.NormEps, RMSEps: a.Eps,
	}
	if a.O != 0 {
		args.O, args.Post0, args.Comb0, args.XOut = uint64(a.O), uint64(a.Post), uint64(a.Comb), uint64(a.XOut)
	}
	if head == 0 {
		args.Post, args.Comb = uint64(a.PostOut), uint64(a.CombOut)
	}
	grid := Dim3{X: uint32((splits + spb - 1) / spb), Y: uint32(tiles), Z: 1}
	if err := c.launchFuse("fuse_hcp_dots", grid, Dim3{X: uint32(32 * nw)}, 0, s, ptr(&args)); err != nil {
		return err
	}
	fin := args
	fin.V, fin.VThreads = 1, hcpFinishDots
	kernel := "fuse_hcp_finish"
	if p.HC == 4 {
		kernel = "fuse_hcp_finish4"
	}
	return c.launchFuse(kernel, Dim3{X: 1, Y: 1, Z: uint32((a.T + hcSplitTB - 1) / hcSplitTB)}, Dim3{X: hcpFinishDots + 32}, 0, s, ptr(&fin))
}

// RowOp is one operation of a RowOps launch: each of Rows rows of Dim
// floats of X is, in this order, RMS-normalised (Norm), rotated (NFreq > 0)
// and scaled (Scale), and written to Y (or into a ring). Pointers are
// float32 device memory owned by the caller, Pos int32.
type RowOp struct {
	// X [Rows, Dim] is read; Y [Rows, Dim] is written and may be X (in
	// place), or with RingRows > 0 is a ring [RingRows, Heads, Dim] that
	// must not overlap X.
	Y, X      DevicePtr
	Rows, Dim int
	// Heads is the number of rows per token (0 means 1): row r belongs to
	// token r / Heads, at position Pos[r / Heads].
	Heads int
	// Norm: RMSNorm over each row (W [Dim] its weight, 0 for unweighted;
	// Eps its ε), as RMSNorm computes it (the same float32 operations).
	Norm bool
	W    DevicePtr
	Eps  float32
	// NFreq > 0: RoPE on the last 2·NFreq dims of each row at its token's
	// position (Freq [NFreq]), as RoPE computes it (forward rotation).
	NFreq int
	Freq  DevicePtr
	// Pos (int32 [Rows/Heads]) is needed with NFreq > 0 or RingRows > 0.
	Pos DevicePtr
	// RingRows > 0: row r of token t goes to ring row (Pos[t] mod
	// RingRows)·Heads + r mod Heads (Fwd.RingStore's slot); RingRows must
	// be at least the token count.
	RingRows int
	// Scale: multiply by A last (as Scale does).
	Scale bool
	A     float32
}

// FuseMaxRowOps is the most operations one RowOps launch takes
// (FUSE_MAXROWOPS in kernels/fuse.cu).
const FuseMaxRowOps = 4

// fuseRow and fuseRows mirror struct FuseRow and FuseRows in kernels/fuse.cu.
type fuseRow struct {
	_                                               structs.HostLayout
	Y, X, W, Pos, Freq                              uint64
	Rows, Heads, Dim, NF, RingRows, Flags, VThreads int32
	Eps, A                                          float32
	_                                               int32
}

type fuseRows struct {
	_  structs.HostLayout
	Op [FuseMaxRowOps]fuseRow
	N  int32
	_  int32
}

// RowOps enqueues up to FuseMaxRowOps independent row operations in one
// kernel (one block per row): for instance a decode step's query-latent
// RMSNorm with the window KV's RMSNorm, RoPE and ring store, or the
// queries' per-head RMSNorm and RoPE with the indexer queries' RoPE and
// the indexer weights' scaling. Each op's results are those of the
// unfused ops (RMSNorm, RoPE, Fwd.RingStore, Scale) run one after another,
// float32 operation for operation. The ops run concurrently: none may
// write memory another reads or writes. Positions are read on the device,
// nothing is allocated: the call can be captured in a CUDA graph once the
// fuse module is loaded (LoadFuse).
func (c *Ctx) RowOps(ops []RowOp, s Stream) error {
	return c.rowOps("RowOps", ops, s)
}

func (c *Ctx) rowOps(op string, ops []RowOp, s Stream) error {
	if len(ops) == 0 || len(ops) > FuseMaxRowOps {
		return opErr(op, "%d operations: want 1..%d", len(ops), FuseMaxRowOps)
	}
	var a fuseRows
	a.N = int32(len(ops))
	threads, blocks := 32, int64(0)
	for i, o := range ops {
		heads := max(o.Heads, 1)
		switch {
		case !pos32(o.Rows, o.Dim) || o.Heads < 0 || o.Rows%heads != 0 || o.NFreq < 0 || 2*o.NFreq > o.Dim || o.RingRows < 0 || o.RingRows > math.MaxInt32:
			return opErr(op, "op %d: rows %d, dim %d, heads %d, nfreq %d, ring rows %d: want positive sizes, rows a multiple of heads, 0 <= 2·nfreq <= dim", i, o.Rows, o.Dim, o.Heads, o.NFreq, o.RingRows)
		case !nonNull(o.Y, o.X) || (o.NFreq > 0 && !nonNull(o.Pos, o.Freq)) || (o.RingRows > 0 && o.Pos == 0):
			return opErr(op, "op %d: null Y %#x, X %#x, Pos %#x or Freq %#x", i, o.Y, o.X, o.Pos, o.Freq)
		case o.RingRows > 0 && (o.RingRows < o.Rows/heads || o.Y == o.X):
			return opErr(op, "op %d: ring of %d rows for %d tokens (ring %#x, x %#x): want at least one row per token, not x", i, o.RingRows, o.Rows/heads, o.Y, o.X)
		case o.Norm && (math.IsNaN(float64(o.Eps)) || o.Eps < 0):
			return opErr(op, "op %d: eps %g: want >= 0", i, o.Eps)
		}
		r := &a.Op[i]
		*r = fuseRow{Y: uint64(o.Y), X: uint64(o.X), W: uint64(o.W), Pos: uint64(o.Pos), Freq: uint64(o.Freq),
			Rows: int32(o.Rows), Heads: int32(heads), Dim: int32(o.Dim), NF: int32(o.NFreq), RingRows: int32(o.RingRows),
			Eps: o.Eps, A: o.A}
		if !o.Norm {
			r.W = 0
		}
		if o.NFreq == 0 {
			r.Freq = 0
		}
		if o.Norm {
			r.Flags |= 1
			r.VThreads = int32(rmsThreads(o.Dim))
			threads = max(threads, rmsThreads(o.Dim))
		} else {
			threads = max(threads, min(256, (max(o.Dim-2*o.NFreq, o.NFreq)+31)/32*32))
		}
		if o.Scale {
			r.Flags |= 2
		}
		blocks += int64(o.Rows)
	}
	if blocks > math.MaxInt32 {
		return opErr(op, "%d rows in all: want fewer than 2^31", blocks)
	}
	return c.launchFuse("fuse_rows", Dim3{X: uint32(blocks)}, Dim3{X: uint32(threads)}, 0, s, ptr(&a))
}

// QNormRoPE enqueues, in place on q [T, heads, dim], the per-head
// unweighted RMSNorm (ε eps) followed by RoPE at position pos[t] (int32
// [T]) on the last 2·nfreq dims of every head (freq float32 [nfreq]): the
// results of RMSNorm(q, q, 0, T·heads, dim, eps) then RoPE(q, pos, freq, T,
// heads·dim, dim, nfreq, false), in one kernel (RowOps with one op).
func (c *Ctx) QNormRoPE(q, pos, freq DevicePtr, T, heads, dim, nfreq int, eps float32, s Stream) error {
	if !pos32(T, heads, nfreq) || int64(T)*int64(heads) > math.MaxInt32 {
		return opErr("QNormRoPE", "T %d, heads %d, nfreq %d: want positive sizes, T·heads < 2^31", T, heads, nfreq)
	}
	return c.rowOps("QNormRoPE", []RowOp{{Y: q, X: q, Rows: T * heads, Dim: dim, Heads: heads, Norm: true, Eps: eps,
		NFreq: nfreq, Freq: freq, Pos: pos}}, s)
}

// KVNormRoPEStore enqueues the window-KV tail of attention for T tokens in
// one kernel: ring[pos[t] mod ringRows] = RoPE(RMS(kv[t]; w), pos[t]) for
// kv [T, dim] (read only), w [dim] (0: unweighted), pos int32 [T], freq
// [nfreq] (the last 2·nfreq dims rotate), ring [ringRows, dim] (ringRows ≥
// T; it must not overlap kv) — the results of RMSNorm(kv, kv, w, T, dim,
// eps), RoPE(kv, pos, freq, T, dim, dim, nfreq, false) and Fwd.RingStore,
// without writing kv (RowOps with one op).
func (c *Ctx) KVNormRoPEStore(ring, kv, w, pos, freq DevicePtr, T, ringRows, dim, nfreq int, eps float32, s Stream) error {
	if !pos32(T, ringRows, nfreq) {
		return opErr("KVNormRoPEStore", "T %d, ring rows %d, nfreq %d: want positive sizes", T, ringRows, nfreq)
	}
	return c.rowOps("KVNormRoPEStore", []RowOp{{Y: ring, X: kv, Rows: T, Dim: dim, Norm: true, W: w, Eps: eps,
		NFreq: nfreq, Freq: freq, Pos: pos, RingRows: ringRows}}, s)
}

// RoPEScale enqueues RoPE(x, pos, freq, rows, rowLen, dim, nfreq, false)
// and Scale(y, a, n) in one kernel (the indexer's query rotation and its
// head-weight scaling; RowOps with two ops); x and y must not overlap.
// n == 0 only rotates.
func (c *Ctx) RoPEScale(x, pos, freq DevicePtr, rows, rowLen, dim, nfreq int, y DevicePtr, a float32, n int, s Stream) error {
	if !pos32(rows, rowLen, dim, nfreq) || rowLen%dim != 0 || n < 0 || int64(rows)*int64(rowLen/dim) > math.MaxInt32 || n > math.MaxInt32 {
		return opErr("RoPEScale", "rows %d, rowLen %d, dim %d, nfreq %d, n %d: want positive sizes, rowLen a multiple of dim, n >= 0", rows, rowLen, dim, nfreq, n)
	}
	ops := []RowOp{{Y: x, X: x, Rows: rows * (rowLen / dim), Dim: dim, Heads: rowLen / dim, NFreq: nfreq, Freq: freq, Pos: pos}}
	if n > 0 {
		ops = append(ops, RowOp{Y: y, X: y, Rows: 1, Dim: n, Scale: true, A: a})
	}
	return c.rowOps("RoPEScale", ops, s)
}
