package cuda

import (
	_ "embed"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"structs"
	"unsafe"

	"moxie/compute"
)

//go:embed kernels/gemv.cu
var gemvSrc string

// GemvSource returns the CUDA source of the one-token matrix-vector kernels
// (kernels/gemv.cu).
func GemvSource() string { return gemvSrc }

// GemvMax is the most matrices one Gemv launch takes.
const GemvMax = 8

// gemvR and gemvWarps are GEMV_R and GEMV_WARPS in kernels/gemv.cu.
const (
	gemvR     = 2
	gemvWarps = 8
)

// gemvMat and gemvArgs mirror struct GemvMat and GemvArgs in kernels/gemv.cu.
type gemvMat struct {
	_                                structs.HostLayout
	W, S, X, Y                       uint64
	Rows, Cols, Rpg, Bshift, Sstride int32
	Fmt, Wpr, Blk0                   int32
}

type gemvArgs struct {
	_   structs.HostLayout
	M   [GemvMax]gemvMat
	N   int32
	_   int32
	NW  [GemvMax]uint64 // GemvProj.Norm (gemvm kernels only)
	Eps [GemvMax]float32
}

// GemvProj is one product of a Gemv launch: Y [W.Rows] = W·X for X of
// Groups slices of W.Cols floats, row group g (W.Rows/Groups rows) reading
// slice g (Groups 0 or 1: plain). Buffers are float32 device memory owned by
// the caller; X 16-byte aligned; Y must not overlap another product's X or Y.
type GemvProj struct {
	W      *DeviceWeight
	Y, X   DevicePtr
	Groups int
	// Norm, when not 0, is an RMSNorm weight (float32 [W.Cols]): the
	// product is then W·(RMSNorm(X)·Norm) with ε Eps, the norm computed
	// inside the launch (the MMA kernels only, one group).
	Norm DevicePtr
	Eps  float32
}

// checkBuffers is PrepareGemv's check of product i's weight and buffers,
// common to both kernel families.
func (p GemvProj) checkBuffers(i int) error {
	if p.W == nil || p.Y == 0 || p.X == 0 || p.X%16 != 0 {
		return fmt.Errorf("cuda gemv: product %d: nil weight or buffers, or x %#x not 16-byte aligned", i, p.X)
	}
	return nil
}

// Gemv is a prepared launch of up to GemvMax one-token products (FP8 blocks
// or BF16 weights) as one kernel. Its arguments travel by value, so the
// launch can be captured in a CUDA graph.
type Gemv struct {
	args   gemvArgs
	kernel *Kernel
	kh     *Kernel // the same product with the boundary's epilogue (gemvmh_*), where it fits
	kc     *Kernel // the same products on a boundary's output formed in the launch (gemvmc_*), where they fit
	grid   Dim3
	block  int // threads a block
	smem   int // dynamic shared memory a block
	bytes  int
}

// Bytes returns the stored bytes of all the launch's weights.
func (g *Gemv) Bytes() int { return g.bytes }

// GemvVariant picks a Gemv launch's kernel: the CUDA-core kernels of
// kernels/gemv.cu with U loads in flight per lane and row (2, 4 or 8; 0
// means 2), or with MMA the tensor-core tile kernels gemvm_f<U> of
// kernels/moe.cu (U spans of 64 columns a chunk: 1, 2 or 4; 0 means 2; FP8
// blocks only, see PrepareGemv). gemvm_f4, a decode session's default, is
// in the default moe module; f1 and f2 compile the moe benchmark module on
// first use (MoEModuleSources).
//
// QAT (with MMA, U 2 or 4; plain x only) computes the qat numeric target's
// product instead (dsv4-flash.md §3.2; package qat): y = Σ over 64-column
// spans of s_w·s_x·Σ q_w·q_x, x quantized to E4M3 in blocks of 128 by
// act_quant (qat.ActQuant) inside the launch, the codes multiplied on the
// same f16 tensor-core tiles as gemvm's (gemvq_f<U>, moe benchmark
// module). Its sums agree with a float64 product of act_quant(x) and the
// weights to float32 rounding, not to the bit.
type GemvVariant struct {
	U   int
	MMA bool
	QAT bool
}

// gemvmWarps is GEMVM_WARPS in kernels/moe.cu.
const gemvmWarps = 8

// gemvmMaxPer is the most 64-column spans one gemvm warp takes (its x
// share in shared memory: 256 bytes a span).
const gemvmMaxPer = 16

// gemvmWPR picks the warps sharing a 16-row tile of a gemvm launch: the
// fewest (a power of two, at most gemvmWarps, dividing the spans) that give
// at least 12 warps an SM over the tiles and at most gemvmMaxPer spans a warp.
func gemvmWPR(tiles, spans, sms int) int {
	w := 1
	for w < gemvmWarps && spans%(2*w) == 0 && (tiles*w < 12*sms || spans/w > gemvmMaxPer) {
		w *= 2
	}
	return w
}

// prepareGemvM plans PrepareGemv's MMA variant: every product FP8 blocks
// with a block edge of at least 64, rows and rows per group multiples of
// 16, columns a multiple of 64 that leave each warp at most gemvmMaxPer
// spans.
func (c *Ctx) prepareGemvM(ps []GemvProj, u int, qat bool) (*Gemv, error) {
	if u == 0 {
		u = 2
	}
	if u != 1 && u != 2 && u != 4 {
		return nil, fmt.Errorf("cuda gemv: MMA chunk of %d spans, want 1, 2 or 4", u)
	}
	name := fmt.Sprintf("gemvm_f%d", u)
	if qat {
		if u == 1 {
			return nil, fmt.Errorf("cuda gemv: qat chunk of 1 span, want 2 or 4")
		}
		if info := c.d.info; info.Major*10+info.Minor < 89 {
			return nil, fmt.Errorf("cuda gemv: the qat product needs the E4M3 conversions of sm_89 or later, device is sm_%d%d", info.Major, info.Minor)
		}
		name = fmt.Sprintf("gemvq_f%d", u)
	}
	g := &Gemv{block: 32 * gemvmWarps}
	blocks, maxPer := 0, 0
	for i, p := range ps {
		w := p.W
		if err := p.checkBuffers(i); err != nil {
			return nil, err
		}
		groups := max(p.Groups, 1)
		if w.Format != compute.FP8Block || w.Block < 64 || w.Block&(w.Block-1) != 0 {
			return nil, fmt.Errorf("cuda gemv: product %d: %v weights, block %d: the MMA kernels want FP8 blocks of a power-of-two edge of at least 64", i, w.Format, w.Block)
		}
		if w.Rows%groups != 0 || (w.Rows/groups)%16 != 0 || w.Cols%64 != 0 {
			return nil, fmt.Errorf("cuda gemv: product %d: [%d, %d] in %d groups: the MMA kernels want rows per group a multiple of 16 and columns a multiple of 64", i, w.Rows, w.Cols, groups)
		}
		if p.Norm != 0 && qat {
			return nil, fmt.Errorf("cuda gemv: product %d: the qat product takes a plain x (no Norm)", i)
		}
		if p.Norm != 0 && (groups != 1 || p.Norm%16 != 0 || !(p.Eps >= 0)) {
			return nil, fmt.Errorf("cuda gemv: product %d: normalized x with %d groups, weight %#x, eps %g: want one group, a 16-byte aligned weight and eps >= 0", i, groups, p.Norm, p.Eps)
		}
		g.args.NW[i], g.args.Eps[i] = uint64(p.Norm), p.Eps
		tiles, spans := w.Rows/16, w.Cols/64
		wpr := gemvmWPR(tiles, spans, c.d.info.SMs)
		per := spans / wpr
		if per > gemvmMaxPer {
			return nil, fmt.Errorf("cuda gemv: product %d: %d columns: the MMA kernels take at most %d", i, w.Cols, 64*gemvmMaxPer*gemvmWarps)
		}
		maxPer = max(maxPer, per)
		m := gemvMat{W: uint64(w.Data), S: uint64(w.Scale), X: uint64(p.X), Y: uint64(p.Y), Rows: int32(w.Rows), Cols: int32(w.Cols),
			Rpg: int32(w.Rows / groups), Bshift: int32(bits.TrailingZeros(uint(w.Block))), Sstride: int32((w.Cols + w.Block - 1) / w.Block),
			Fmt: 1, Wpr: int32(wpr), Blk0: int32(blocks)}
		tpb := gemvmWarps / wpr
		blocks += (tiles + tpb - 1) / tpb
		g.args.M[i] = m
		g.bytes += w.Bytes
	}
	g.args.N = int32(len(ps))
	g.grid = Dim3{X: uint32(blocks)}
	g.smem = gemvmWarps * 256 * maxPer
	refs := []kernelRef{{name, &g.kernel}}
	// One product of whole-block tiles, plain x, one row group: it can
	// begin the boundary after it (LaunchGemvHC; the default module holds
	// gemvmh_f4 only).
	if m := g.args.M[0]; !qat && len(ps) == 1 && u == gemvmHCU && m.Wpr == gemvmWarps && ps[0].Norm == 0 && m.Rpg == m.Rows {
		refs = append(refs, kernelRef{fmt.Sprintf("gemvmh_f%d", u), &g.kh})
	}
	// Every product of whole-block tiles, plain x, one row group, on one x:
	// it can form that x itself from a boundary's x' and partials
	// (LaunchGemvCollapse; gemvmc_f4 in the default module).
	col := u == gemvmHCU && !qat
	for i, p := range ps {
		m := g.args.M[i]
		col = col && m.Wpr == gemvmWarps && p.Norm == 0 && m.Rpg == m.Rows && p.X == ps[0].X && m.Cols == g.args.M[0].Cols
	}
	if col {
		refs = append(refs, kernelRef{fmt.Sprintf("gemvmc_f%d", u), &g.kc})
	}
	if err := c.moeKernels(refs...); err != nil {
		return nil, err
	}
	return g, nil
}

// gemvmHCU is the one chunk size with a boundary-epilogue kernel
// (gemvmh_f4 in the default moe module: the chunk dsv4 decodes with).
const gemvmHCU = 4

// HasHCEpilogue reports whether g can begin the sublayer boundary after
// its product (LaunchGemvHC): one MMA product whose 16-row tiles each take
// a whole block, on a plain x, in one row group, with the default chunk.
func (g *Gemv) HasHCEpilogue() bool { return g != nil && g.kh != nil }

// HCCollapse is the input of a Gemv that forms its x itself
// (LaunchGemvCollapse): a sublayer boundary's output a = RMS(Σ_j
// pre_j·x'_j; Norm) of one token, from the x' and partials a producer's
// epilogue left with the Gram rows (HCEpilogue with Gram; XS = its XOut,
// Part = its Part) and the boundary's mix site (HC 4, F32 Fn [24, 4·D]: its
// Base and Scale, Eps and NormEps); Eps is the RMSNorm's ε. pre and ρ are
// the bits HCMixNormTiles forms from the same partials; the RMS comes from
// the Gram rows, so a agrees with HCMixNormTiles's A to rounding.
type HCCollapse struct {
	XS, Part DevicePtr
	Site     *HC
	Norm     DevicePtr
	Eps      float32
}

// hcColArgs mirrors struct HcCol in kernels/moe.cu (72 bytes).
type hcColArgs struct {
	_                          structs.HostLayout
	XS, Part, Base, Scale, W   uint64
	S, NM, D, Pad              int32
	NormEps, Eps, RMSEps, Pad2 float32
}

// HasCollapse reports whether g can form its x from a boundary's x' and
// partials (LaunchGemvCollapse): MMA products on one x, each of whole-block
// tiles in one row group, no Norm, the default chunk.
func (g *Gemv) HasCollapse() bool { return g != nil && g.kc != nil }

// LaunchGemvCollapse is LaunchGemv whose x (the products' shared input of
// D = Cols values, which it does not read) is the boundary output in (see
// HCCollapse), formed by each block as it stages x. Its inputs must have
// been written two or more kernels before it on the stream (the boundary's
// finish, HCMixNormTiles on the same partials, may be the kernel just
// before): its blocks do not wait for the kernel before them until they
// end, so what runs after it still sees that kernel's results. It can be
// captured in a CUDA graph.
func (c *Ctx) LaunchGemvCollapse(g *Gemv, in *HCCollapse, s Stream) error {
	if !g.HasCollapse() {
		return fmt.Errorf("cuda gemv: collapse launch of a Gemv that cannot form its x")
	}
	D := int(g.args.M[0].Cols)
	if in == nil {
		return fmt.Errorf("cuda gemv: collapse: nil input or mix site")
	}
	if err := hcEpiSite("cuda gemv: collapse", in.Site, D); err != nil {
		return err
	}
	switch {
	case !nonNull(in.XS, in.Part, in.Site.Base, in.Site.Scale) || in.XS%16 != 0 || in.Part%4 != 0 || in.Norm%16 != 0:
		return fmt.Errorf("cuda gemv: collapse: XS %#x (16-byte aligned), Part %#x, Norm %#x (16-byte aligned or 0), Base %#x, Scale %#x", in.XS, in.Part, in.Norm, in.Site.Base, in.Site.Scale)
	case math.IsNaN(float64(in.Eps)) || in.Eps < 0:
		return fmt.Errorf("cuda gemv: collapse: Eps %g, want >= 0", in.Eps)
	}
	ca := hcColArgs{XS: uint64(in.XS), Part: uint64(in.Part), Base: uint64(in.Site.Base), Scale: uint64(in.Site.Scale), W: uint64(in.Norm),
		S: int32(D / 16), NM: hcEpiRows, D: int32(D), NormEps: in.Site.NormEps, Eps: in.Site.Eps, RMSEps: in.Eps}
	return c.Launch(g.kc, g.grid, Dim3{X: uint32(g.block)}, g.smem, s, unsafe.Pointer(&g.args), unsafe.Pointer(&ca))
}

// LaunchGemvHC is LaunchGemv whose blocks also begin the sublayer boundary
// h after the product, its output y [rows] the boundary's O (see
// HCEpilogue; D = rows); g must have the epilogue (HasHCEpilogue). It can
// be captured in a CUDA graph.
func (c *Ctx) LaunchGemvHC(g *Gemv, h *HCEpilogue, s Stream) error {
	if !g.HasHCEpilogue() {
		return fmt.Errorf("cuda gemv: launch with a boundary epilogue of a Gemv that has none")
	}
	m := g.args.M[0]
	ha, err := hcEpilogueArgs("cuda gemv", h, int(m.Rows), DevicePtr(m.X), DevicePtr(m.Y))
	if err != nil {
		return err
	}
	return c.Launch(g.kh, g.grid, Dim3{X: uint32(g.block)}, g.smem, s, unsafe.Pointer(&g.args), unsafe.Pointer(&ha))
}

// gemvWPR picks the warps splitting each row group's columns: enough warps
// over all rows to fill the device (about 16 per SM), at most 8, and only
// splits that leave every warp whole 32-lane steps.
func gemvWPR(rows, cols, cpl, sms int) int {
	w := 1
	for w < gemvWarps && (rows/gemvR)*w < 16*sms && cols%(2*w*32*cpl) == 0 {
		w *= 2
	}
	return w
}

// PrepareGemv validates the products and plans their launch: each weight
// FP8Block (a power-of-two block edge of at least 16, columns a multiple of
// 512) or BF16 (columns a multiple of 256), an even row count, rows per
// group a multiple of 2, no Norm, and at most GemvMax products. With
// v.MMA instead: FP8 blocks of an edge of at least 64, rows per group a
// multiple of 16, columns a multiple of 64 (at most 8,192), Norm only with
// one group (prepareGemvM). Errors name the product.
func (c *Ctx) PrepareGemv(ps []GemvProj, v GemvVariant) (*Gemv, error) {
	if len(ps) == 0 || len(ps) > GemvMax {
		return nil, fmt.Errorf("cuda gemv: %d products, want 1..%d", len(ps), GemvMax)
	}
	if v.MMA {
		return c.prepareGemvM(ps, v.U, v.QAT)
	}
	if v.QAT {
		return nil, fmt.Errorf("cuda gemv: the qat product runs on the MMA kernels only (GemvVariant.MMA)")
	}
	u := v.U
	if u == 0 {
		u = 2 // the H200's best on wo_a, wo_b and wq_a+wkv (BenchmarkGemv)
	}
	if u != 2 && u != 4 && u != 8 {
		return nil, fmt.Errorf("cuda gemv: U %d, want 2, 4 or 8", u)
	}
	g := &Gemv{block: 32 * gemvWarps}
	blocks := 0
	for i, p := range ps {
		w := p.W
		if err := p.checkBuffers(i); err != nil {
			return nil, err
		}
		if p.Norm != 0 {
			return nil, fmt.Errorf("cuda gemv: product %d: a normalized x needs the MMA kernels (GemvVariant.MMA)", i)
		}
		groups := max(p.Groups, 1)
		m := gemvMat{W: uint64(w.Data), S: uint64(w.Scale), X: uint64(p.X), Y: uint64(p.Y), Rows: int32(w.Rows), Cols: int32(w.Cols)}
		var cpl int
		switch w.Format {
		case compute.FP8Block:
			if w.Block < 16 || w.Block&(w.Block-1) != 0 || w.Cols%512 != 0 {
				return nil, fmt.Errorf("cuda gemv: product %d: FP8 [%d, %d] block %d: want a power-of-two block of at least 16 and columns a multiple of 512", i, w.Rows, w.Cols, w.Block)
			}
			m.Fmt, cpl = 1, 16
			m.Bshift = int32(bits.TrailingZeros(uint(w.Block)))
			m.Sstride = int32((w.Cols + w.Block - 1) / w.Block)
		case compute.BF16:
			if w.Cols%256 != 0 {
				return nil, fmt.Errorf("cuda gemv: product %d: BF16 [%d, %d]: want columns a multiple of 256", i, w.Rows, w.Cols)
			}
			m.Fmt, cpl = 3, 8
		default:
			return nil, fmt.Errorf("cuda gemv: product %d: %v weights: want FP8 blocks or BF16", i, w.Format)
		}
		if w.Rows%groups != 0 || (w.Rows/groups)%gemvR != 0 {
			return nil, fmt.Errorf("cuda gemv: product %d: %d rows in %d groups: want whole groups of an even row count", i, w.Rows, groups)
		}
		m.Rpg = int32(w.Rows / groups)
		m.Wpr = int32(gemvWPR(w.Rows, w.Cols, cpl, c.d.info.SMs))
		m.Blk0 = int32(blocks)
		perBlock := (gemvWarps / int(m.Wpr)) * gemvR
		blocks += (w.Rows + perBlock - 1) / perBlock
		g.args.M[i] = m
		g.bytes += w.Bytes
	}
	g.args.N = int32(len(ps))
	g.grid = Dim3{X: uint32(blocks)}
	if err := c.loadKernels("gemv", gemvSrc, kernelRef{fmt.Sprintf("gemv_u%d", u), &g.kernel}); err != nil {
		return nil, err
	}
	return g, nil
}

// LaunchGemv enqueues a prepared launch on s.
func (c *Ctx) LaunchGemv(g *Gemv, s Stream) error {
	if g == nil || g.kernel == nil {
		return fmt.Errorf("cuda gemv: launch of an unprepared Gemv")
	}
	return c.Launch(g.kernel, g.grid, Dim3{X: uint32(g.block)}, g.smem, s, unsafe.Pointer(&g.args))
}

// gemvPairWarps is GP_WARPS in kernels/gemv.cu: a GemvPair block has
// 32·gemvPairWarps threads.
const gemvPairWarps = 16

// gemvPairBarBytes is the barrier's counters (uint32 arrivals, generation,
// timeouts and one unused).
const gemvPairBarBytes = 16

// gemvPairArgs mirrors struct GemvPairArgs in kernels/gemv.cu.
type gemvPairArgs struct {
	_                      structs.HostLayout
	A, B                   gemvMat
	Bar                    uint64
	Ns, RedOff, Fill, L2PF int32
}

// GemvPairVariant tunes a GemvPair launch; the zero value is the default.
type GemvPairVariant struct {
	// U is the rows a warp loads at once: 4 or 8 (0 means 8).
	U int
	// SmemRows caps the rows of the second product a block copies into
	// shared memory before the barrier: 0 as many as fit, negative none
	// (every row then comes from global memory after the barrier).
	SmemRows int
	// LateFill starts the shared-memory copies after the block's first
	// product instead of before it.
	LateFill bool
	// NoL2Prefetch leaves out the L2 hints for the second product's rows
	// that do not fit in shared memory; EarlyL2Prefetch gives them before
	// the block's first product instead of after it.
	NoL2Prefetch, EarlyL2Prefetch bool
	// HintFirst asks L2 for all of a block's rows of the first product
	// before anything else (their loads in registers are U·16 bytes a lane
	// in flight at most; the hints put the whole first product in flight).
	HintFirst bool
}

// GemvPair is a prepared launch of two dependent one-token FP8-block
// products, y1 = A·x1 and then y2 = B·y1, as one persistent kernel with a
// grid-wide barrier between them (see PrepareGemvPair). Its arguments
// travel by value, so the launch can be captured in a CUDA graph; the
// barrier's two counters in device memory belong to it.
type GemvPair struct {
	args   gemvPairArgs
	kernel *Kernel
	grid   Dim3
	smem   int
	bar    DevicePtr
	bytes  int
}

// Bytes returns the stored bytes of both products' weights.
func (p *GemvPair) Bytes() int { return p.bytes }

// Blocks returns the launch's grid size (every block resident at once).
func (p *GemvPair) Blocks() int { return int(p.grid.X) }

// SharedRows returns the most rows of the second product a block copies
// into shared memory before the barrier.
func (p *GemvPair) SharedRows() int { return int(p.args.Ns) }

// SharedBytes returns the launch's dynamic shared memory per block.
func (p *GemvPair) SharedBytes() int { return p.smem }

// gemvPairWPR is the warps splitting a row's 512-column segments: the
// largest power of two that is at most the segment count and the block's
// warps (a warp with several segments takes every wpr-th).
func gemvPairWPR(cols int) int {
	segs, w := cols/512, 1
	for 2*w <= min(segs, gemvPairWarps) {
		w *= 2
	}
	return w
}

// gemvPairShape plans the dynamic shared memory of a GemvPair launch of g
// blocks (block i owns rows [i·rows/g, (i+1)·rows/g) of each product): the
// partial sums (4·wpr bytes per row of the larger of a block's two row
// ranges) after ns rows of the second product's cols2 bytes, ns as many
// of a block's rows as fit in budget bytes, at most capRows (0: no cap,
// negative: none).
func gemvPairShape(g, rows1, wpr1, rows2, cols2, wpr2, budget, capRows int) (ns, redOff, smem int, err error) {
	rpb1, rpb2 := (rows1+g-1)/g, (rows2+g-1)/g
	red := 4 * max(rpb1*wpr1, rpb2*wpr2)
	if red > budget {
		return 0, 0, 0, fmt.Errorf("cuda gemv pair: %d blocks: the partial sums of up to %d and %d rows a block need %d bytes of shared memory, the device allows %d", g, rpb1, rpb2, red, budget)
	}
	ns = min(rpb2, (budget-red)/cols2)
	switch {
	case capRows < 0:
		ns = 0
	case capRows > 0:
		ns = min(ns, capRows)
	}
	return ns, ns * cols2, ns*cols2 + red, nil
}

// gemvPairMat validates one product of a pair (FP8 blocks of a
// power-of-two edge of at least 16, columns a multiple of 512, 16-byte
// aligned data, whole row groups) and returns its kernel record.
func gemvPairMat(which string, p GemvProj) (gemvMat, error) {
	w := p.W
	if w == nil {
		return gemvMat{}, fmt.Errorf("cuda gemv pair: %s product: nil weight", which)
	}
	if w.Format != compute.FP8Block {
		return gemvMat{}, fmt.Errorf("cuda gemv pair: %s product: %v weights, want FP8 blocks", which, w.Format)
	}
	if w.Block < 16 || w.Block&(w.Block-1) != 0 || w.Cols <= 0 || w.Cols%512 != 0 || w.Rows <= 0 {
		return gemvMat{}, fmt.Errorf("cuda gemv pair: %s product: FP8 [%d, %d] block %d: want a power-of-two block of at least 16, rows, and columns a multiple of 512", which, w.Rows, w.Cols, w.Block)
	}
	if w.Data == 0 || w.Data%16 != 0 || w.Scale == 0 {
		return gemvMat{}, fmt.Errorf("cuda gemv pair: %s product: data %#x, scales %#x: want non-null, the data 16-byte aligned", which, w.Data, w.Scale)
	}
	groups := max(p.Groups, 1)
	if w.Rows%groups != 0 {
		return gemvMat{}, fmt.Errorf("cuda gemv pair: %s product: %d rows in %d groups: want whole groups", which, w.Rows, groups)
	}
	if p.Y == 0 || p.Y%16 != 0 {
		return gemvMat{}, fmt.Errorf("cuda gemv pair: %s product: y %#x: want a non-null, 16-byte aligned buffer", which, p.Y)
	}
	return gemvMat{W: uint64(w.Data), S: uint64(w.Scale), X: uint64(p.X), Y: uint64(p.Y), Rows: int32(w.Rows), Cols: int32(w.Cols),
		Rpg: int32(w.Rows / groups), Bshift: int32(bits.TrailingZeros(uint(w.Block))), Sstride: int32((w.Cols + w.Block - 1) / w.Block),
		Fmt: 1, Wpr: int32(gemvPairWPR(w.Cols))}, nil
}

// overlaps reports whether [a, a+an) and [b, b+bn) share a byte.
func overlaps(a DevicePtr, an int, b DevicePtr, bn int) bool {
	return a < b+DevicePtr(bn) && b < a+DevicePtr(an)
}

// gemvPairMats validates a pair's products and variant (PrepareGemvPair's
// contract) and returns their kernel records (the second's x is the
// first's y) and the variant's U.
func gemvPairMats(a, b GemvProj, v GemvPairVariant) (ma, mb gemvMat, u int, err error) {
	u = v.U
	if u == 0 {
		u = 8
	}
	if u != 4 && u != 8 {
		return ma, mb, 0, fmt.Errorf("cuda gemv pair: U %d, want 4 or 8", u)
	}
	if ma, err = gemvPairMat("first", a); err != nil {
		return ma, mb, 0, err
	}
	if a.X == 0 || a.X%16 != 0 {
		return ma, mb, 0, fmt.Errorf("cuda gemv pair: first product: x %#x: want a non-null, 16-byte aligned buffer", a.X)
	}
	if b.X == 0 {
		b.X = a.Y
	}
	if b.X != a.Y {
		return ma, mb, 0, fmt.Errorf("cuda gemv pair: second product's x %#x is not the first's y %#x", b.X, a.Y)
	}
	if mb, err = gemvPairMat("second", b); err != nil {
		return ma, mb, 0, err
	}
	ga, gb := max(a.Groups, 1), max(b.Groups, 1)
	if b.W.Cols*gb != a.W.Rows {
		return ma, mb, 0, fmt.Errorf("cuda gemv pair: second product [%d, %d] in %d groups reads %d floats, the first [%d, %d] writes %d", b.W.Rows, b.W.Cols, gb, b.W.Cols*gb, a.W.Rows, a.W.Cols, a.W.Rows)
	}
	if overlaps(a.Y, 4*a.W.Rows, a.X, 4*ga*a.W.Cols) || overlaps(a.Y, 4*a.W.Rows, b.Y, 4*b.W.Rows) {
		return ma, mb, 0, fmt.Errorf("cuda gemv pair: y1 %#x (%d floats) overlaps x1 %#x (%d) or y2 %#x (%d)", a.Y, a.W.Rows, a.X, ga*a.W.Cols, b.Y, b.W.Rows)
	}
	return ma, mb, u, nil
}

// PrepareGemvPair validates and plans one launch of two dependent
// one-token FP8-block products: y1 = A·x1 (a.Y [A.Rows] = a.W·a.X, a.X of
// a.Groups slices of A.Cols floats, row group g reading slice g), then
// y2 = B·y1 (b.Y [B.Rows] = b.W·a.Y, grouped the same way by b.Groups, so
// B.Cols·b.Groups must equal A.Rows). b.X must be a.Y or 0 (meaning a.Y).
// Both weights FP8 blocks (a power-of-two block edge of at least 16,
// columns a multiple of 512, data 16-byte aligned); x1 and both outputs
// float32 device buffers the caller owns, 16-byte aligned; y1 must not
// overlap x1 or y2. Both outputs are written (y1 is a real result too).
//
// The launch has at most as many blocks as the device holds at once (from
// the kernel's occupancy at its shared memory), which its grid-wide
// barrier needs; other work on the device while it runs can only delay
// it, provided that work's blocks finish on their own. The barrier's 16
// bytes of counters are allocated in ar and freed by Free; they need no
// reset between launches or graph replays. A block that waits at the
// barrier for more than a second (blocks not all resident: the device
// shared with other work that does not finish) goes on and counts a
// timeout (BarrierTimeouts) instead of hanging; the results of such a
// launch are wrong. Launches of one GemvPair must not overlap (one
// stream, or ordered by events); prepare one per concurrent use.
func (c *Ctx) PrepareGemvPair(ar *Arena, a, b GemvProj, v GemvPairVariant) (*GemvPair, error) {
	if ar == nil {
		return nil, fmt.Errorf("cuda gemv pair: nil arena (the barrier's counters live there)")
	}
	ma, mb, u, err := gemvPairMats(a, b, v)
	if err != nil {
		return nil, err
	}
	p := &GemvPair{bytes: a.W.Bytes + b.W.Bytes}
	if err := c.loadKernels("gemv", gemvSrc, kernelRef{fmt.Sprintf("gemv_pair_u%d", u), &p.kernel}); err != nil {
		return nil, err
	}
	static, err := c.lib.FuncGetAttribute(p.kernel.fn, funcAttrSharedSize)
	if err != nil {
		return nil, fmt.Errorf("cuda gemv pair: %s: %w", p.kernel.name, err)
	}
	// Every launch of the kernel may use all the opt-in shared memory, so
	// pairs prepared later with more launch too.
	if err := c.raiseDynamicShared(p.kernel, -1); err != nil {
		return nil, fmt.Errorf("cuda gemv pair: %w", err)
	}
	budget, sms := c.d.info.SharedOptin-static, c.d.info.SMs
	rows1, rows2 := a.W.Rows, b.W.Rows
	wpr1, wpr2 := int(ma.Wpr), int(mb.Wpr)
	// One block per multiprocessor first, then as many as the occupancy at
	// that shared memory allows; more blocks own fewer rows each, so the
	// replanned shared memory (ns capped at the first plan's) is no larger
	// and the occupancy no smaller.
	g := min(sms, max(rows1, rows2))
	ns, redOff, smem, err := gemvPairShape(g, rows1, wpr1, rows2, b.W.Cols, wpr2, budget, v.SmemRows)
	if err != nil {
		return nil, err
	}
	threads := 32 * gemvPairWarps
	occ, err := c.lib.OccupancyMaxActiveBlocks(p.kernel.fn, threads, smem)
	if err != nil {
		return nil, fmt.Errorf("cuda gemv pair: %s occupancy: %w", p.kernel.name, err)
	}
	if occ < 1 {
		return nil, fmt.Errorf("cuda gemv pair: %s with %d threads and %d bytes of shared memory does not fit on a multiprocessor", p.kernel.name, threads, smem)
	}
	if g2 := min(occ*sms, max(rows1, rows2)); g2 > g {
		capRows := ns
		if ns == 0 {
			capRows = -1
		}
		if ns, redOff, smem, err = gemvPairShape(g2, rows1, wpr1, rows2, b.W.Cols, wpr2, budget, capRows); err != nil {
			return nil, err
		}
		g = g2
	}
	fill, l2pf := int32(0), int32(1)
	if v.LateFill {
		fill = 1
	}
	switch {
	case v.NoL2Prefetch:
		l2pf = 0
	case v.EarlyL2Prefetch:
		l2pf = 2
	}
	if v.HintFirst {
		l2pf |= 4
	}
	mb.X = uint64(a.Y)
	p.grid, p.smem = Dim3{X: uint32(g)}, smem
	if p.bar, err = ar.Alloc(gemvPairBarBytes); err != nil {
		return nil, fmt.Errorf("cuda gemv pair: barrier counters: %w", err)
	}
	if err := c.CopyToDevice(p.bar, make([]byte, gemvPairBarBytes)); err != nil {
		_ = ar.Free(p.bar)
		return nil, fmt.Errorf("cuda gemv pair: zeroing the barrier counters: %w", err)
	}
	p.args = gemvPairArgs{A: ma, B: mb, Bar: uint64(p.bar), Ns: int32(ns), RedOff: int32(redOff), Fill: fill, L2PF: l2pf}
	return p, nil
}

// Free returns p's barrier counters to the arena it was prepared with; p
// must not be launched afterwards.
func (p *GemvPair) Free(ar *Arena) error {
	if p == nil || p.bar == 0 {
		return nil
	}
	err := ar.Free(p.bar)
	p.bar, p.kernel = 0, nil
	return err
}

// BarrierTimeouts returns how many times a block of p's launches so far
// gave up waiting at the barrier (0 when every launch was correct), after
// the work queued on the compute stream.
func (c *Ctx) BarrierTimeouts(p *GemvPair) (int, error) {
	if p == nil || p.bar == 0 {
		return 0, fmt.Errorf("cuda gemv pair: timeouts of an unprepared or freed GemvPair")
	}
	var w [gemvPairBarBytes]byte
	if err := c.CopyFromDevice(w[:], p.bar); err != nil {
		return 0, err
	}
	return int(binary.LittleEndian.Uint32(w[8:])), nil
}

// LaunchGemvPair enqueues a prepared pair on s.
func (c *Ctx) LaunchGemvPair(p *GemvPair, s Stream) error {
	if p == nil || p.kernel == nil || p.bar == 0 {
		return fmt.Errorf("cuda gemv pair: launch of an unprepared or freed GemvPair")
	}
	return c.Launch(p.kernel, p.grid, Dim3{X: 32 * gemvPairWarps}, p.smem, s, unsafe.Pointer(&p.args))
}
