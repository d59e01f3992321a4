package cuda

import (
	_ "embed"
	"fmt"
	"math/bits"
	"strings"
	"structs"
	"unsafe"

	"moxie/compute"
)

//go:embed kernels/linear.cu
var linearSrc string

// LinearSource returns the CUDA source of the linear kernels: the whole of
// kernels/linear.cu, both modules' sections (nvcc compiles it as one unit).
func LinearSource() string { return linearSrc }

// LinearModuleSources returns the sources of two of the linear modules: def,
// the default module (every kernel LinearVariant{} can launch, plus the
// utility kernels), compiled on first use of any linear function; bench, the
// other CUDA-core and mma variants, compiled only when one of them is first
// launched. LinearTCSource has the third.
func LinearModuleSources() (def, bench string, err error) {
	def, bench, _, err = splitLinearSource(linearSrc)
	return def, bench, err
}

// LinearTCSource returns the source of the third linear module: the
// tensor-core GEMM tiles (WidthTC) the automatic choice does not use,
// compiled only when one of them is first launched.
func LinearTCSource() (string, error) {
	_, _, tc, err := splitLinearSource(linearSrc)
	return tc, err
}

// splitLinearSource splits a linear.cu text at its "//@module NAME" lines
// into the default module's source (common + linear), the benchmark
// module's (common + bench) and the tensor-core tile module's (common + tc).
// Text before the first marker is dropped.
func splitLinearSource(src string) (def, bench, tc string, err error) {
	sec, err := splitSections("linear.cu", src, "common", "linear", "bench", "tc")
	if err != nil {
		return "", "", "", err
	}
	return sec["common"] + sec["linear"], sec["common"] + sec["bench"], sec["common"] + sec["tc"], nil
}

// linearModule returns the default linear module, compiling it on first use.
func (c *Ctx) linearModule() (*Module, error) {
	if c.d.linear == nil {
		def, _, err := LinearModuleSources()
		if err != nil {
			return nil, err
		}
		m, err := c.Module("linear", def)
		if err != nil {
			return nil, err
		}
		c.d.linear = m
	}
	return c.d.linear, nil
}

// linearBenchModule returns the benchmark-variant module, compiling it on
// first use (memoised by Module through its cache key).
func (c *Ctx) linearBenchModule() (*Module, error) {
	_, bench, err := LinearModuleSources()
	if err != nil {
		return nil, err
	}
	return c.Module("linear_bench", bench)
}

// linearTCModule returns the tensor-core tile module, compiling it on first
// use (memoised by Module through its cache key).
func (c *Ctx) linearTCModule() (*Module, error) {
	src, err := LinearTCSource()
	if err != nil {
		return nil, err
	}
	return c.Module("linear_tc", src)
}

// linKernel returns the named linear kernel from the default module, or,
// when the default one lacks it, from the tensor-core tile module (lint*
// kernels) or the benchmark module (the others).
func (c *Ctx) linKernel(name string) (*Kernel, error) {
	key := linKey{suffix: name}
	if k := c.d.linKernels[key]; k != nil {
		return k, nil
	}
	m, err := c.linearModule()
	if err != nil {
		return nil, err
	}
	k, err := m.Kernel(name)
	if err != nil {
		other := c.linearBenchModule
		if strings.HasPrefix(name, "lint") {
			other = c.linearTCModule
		}
		bm, berr := other()
		if berr != nil {
			return nil, berr
		}
		if k, berr = bm.Kernel(name); berr != nil {
			return nil, fmt.Errorf("cuda linear: no kernel %s in either linear module: %w", name, berr)
		}
	}
	if strings.HasPrefix(name, "linm_") || strings.HasPrefix(name, "linmmulti_") || strings.HasPrefix(name, "lint") {
		// Tensor-core kernels stage x in dynamic shared memory, beyond 48 KB
		// for long rows and batch tiles. The cap is the opt-in limit less
		// the kernel's static shared memory (asking for more is an error).
		if err := c.raiseDynamicShared(k, -1); err != nil {
			return nil, fmt.Errorf("cuda linear: %w", err)
		}
	}
	c.d.linKernels[key] = k
	return k, nil
}

// DeviceWeight is a weight matrix resident in device memory in its stored
// format (the bytes of compute.WeightData, uploaded unchanged).
type DeviceWeight struct {
	Format     compute.Format
	Rows, Cols int
	Block      int       // FP8Block tile edge
	Data       DevicePtr // stored bytes
	Scale      DevicePtr // E8M0 scales (FP8Block, MXFP8, MXFP4); Data otherwise
	Bytes      int       // data + scale bytes (what one matvec must read)
}

// UploadWeight validates d, allocates its bytes in a and copies them to the
// device. The arena keeps the memory until it is freed or reset.
func (c *Ctx) UploadWeight(a *Arena, d compute.WeightData) (*DeviceWeight, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	w := &DeviceWeight{Format: d.Format, Rows: d.Rows, Cols: d.Cols, Block: d.Block, Bytes: len(d.Data) + len(d.Scale)}
	var err error
	if w.Data, err = a.Alloc(len(d.Data)); err != nil {
		return nil, err
	}
	if err = c.CopyToDevice(w.Data, d.Data); err != nil {
		return nil, err
	}
	w.Scale = w.Data
	if len(d.Scale) > 0 {
		if w.Scale, err = a.Alloc(len(d.Scale)); err != nil {
			return nil, err
		}
		if err = c.CopyToDevice(w.Scale, d.Scale); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// FreeWeight returns a weight's memory to the arena it came from.
func FreeWeight(a *Arena, w *DeviceWeight) error {
	err := a.Free(w.Data)
	if w.Scale != w.Data {
		if err2 := a.Free(w.Scale); err == nil {
			err = err2
		}
	}
	return err
}

// linArgs mirrors struct LinArgs in kernels/linear.cu.
type linArgs struct {
	_                                          structs.HostLayout
	W, S, X, Y                                 uint64
	Rows, Cols, Sdivr, Sdivc, Srshift, Scshift int32
	Sstride, Rpg, Xstride, Ystride, Batch      int32
}

func fmtInfo(f compute.Format) (name string, code int32, cpw int) {
	switch f {
	case compute.FP8Block:
		return "fp8", 1, 4
	case compute.MXFP4:
		return "mxfp4", 2, 8
	case compute.BF16:
		return "bf16", 3, 4
	case compute.F32:
		return "f32", 4, 4
	case compute.MXFP8:
		return "mxfp8", 5, 4
	}
	return "", 0, 0
}

// LinearVariant picks a kernel shape; zero fields mean automatic.
type LinearVariant struct {
	// RB is the rows per block (narrow: 2, or 4 at batch tiles 1 and 4;
	// wide: 2 or 4) or per warp tile (vec: 1, 2 or 4, with U = 8/RB).
	RB int
	// U is the 32-word chunks each lane loads per row before use (narrow: 4;
	// wide: 2; vec: 2, 4 or 8, with RB = 8/U; automatic: the smallest that
	// covers a row, at least 2).
	U int
	// KW is the warps per block splitting a row's columns (narrow and wide,
	// 1..8).
	KW int
	// Decode picks the decoder of FP8Block, MXFP8 and MXFP4 weights:
	// DecodeAuto, DecodeCvt (hardware f16x2 conversion) or DecodeBits
	// (integer operations; maps the E4M3 NaN code to ±480 instead of NaN; in
	// the vec family MXFP4 codes are placed straight into f16 bits instead).
	Decode int
	// Width picks the fast kernel family for FP8Block, MXFP8 and MXFP4:
	// WidthAuto, WidthNarrow (4-byte words per lane), WidthWide (16-byte
	// words; needs columns a multiple of 16, or 32 for MXFP4, and FP8 blocks
	// of at least 16) or WidthVec (persistent warps over 16-byte words, same
	// shape rules as WidthWide, batch tiles up to 4: larger batches use the
	// narrow family) or WidthMMA (tensor cores; see WidthMMA). BF16 and F32
	// always use the narrow family.
	Width int
	// Blocks is the vec family's blocks of 256 threads per SM in its grid
	// (1..4; automatic: 2, the number the kernels are compiled to fit).
	Blocks int
	// Hint 1 loads the vec family's weights with ld.global.nc.L1::no_allocate
	// .L2::256B instead of __ldg (batch tile 1, FP8Block and MXFP4 only).
	Hint int
	// Generic forces the element-wise kernel.
	Generic bool
	// Tile picks the tensor-core GEMM family's tile shape (WidthTC): 1 ..
	// len(tcTileList()), 0 automatic (planTC). A Tile alone (Width
	// WidthAuto, no other field) means WidthTC.
	Tile int
	// SplitK > 1 splits the tensor-core GEMM's columns into that many
	// ranges (2..32), each block adding its partial sums into y with
	// atomics after y is zeroed (sums then vary in the last bits from run
	// to run); tiles 1 and 2 of single launches only (multi launches
	// ignore it). 0 or 1: no split.
	SplitK int
}

// Kernel families of the fast linear kernels.
const (
	WidthAuto = iota
	WidthNarrow
	WidthWide
	WidthVec
	// WidthMMA: tensor-core kernels (mma.sync, f16 weights, x split hi/lo
	// f16, f32 accumulation) for FP8Block (columns a multiple of 64, blocks
	// of at least 64) and MXFP4 (columns a multiple of 32), one x group,
	// batch tiles up to 4; other shapes use the narrow kernels.
	WidthMMA
	// WidthTC: tensor-core GEMM kernels for many batch rows (prefill):
	// FP8Block (columns a multiple of 64, blocks a power of two of at
	// least 64), MXFP4 (columns a multiple of 128) and BF16 (columns a
	// multiple of 64), tiles of weight rows x batch rows in one launch over
	// the whole batch (kernels/linear.cu, tc_gemm). WidthAuto selects it for
	// batches of at least tcMinBatch rows; other shapes use the other
	// families.
	WidthTC
)

// tcMinBatch is the smallest batch for which WidthAuto selects the
// tensor-core GEMM family (WidthTC).
const tcMinBatch = 16

// tcTile is a tile shape of the tensor-core GEMM family: BM weight rows x
// BN batch rows per block of WM x WN warps, ST pipeline stages of 64
// columns, registers capped for OB blocks per SM; XC 1 splits x into hi/lo
// once per block and stage instead of in every warp (FP8 and MXFP4 only).
type tcTile struct{ BM, BN, WM, WN, ST, OB, XC int }

// tcTileList is the tile shapes with kernels in kernels/linear.cu
// (LINTS/LINTC3 lines of the default module: tiles 1 and 2, the automatic
// choices; LINTC1/LINTX/LINTK lines of the linear_tc module: the others);
// LinearVariant.Tile i selects entry i-1.
func tcTileList() []tcTile {
	return []tcTile{
		{128, 64, 4, 2, 4, 1, 0}, // 1: automatic for batches of 64 and more
		{64, 32, 2, 2, 4, 1, 0},  // 2: automatic for small batches, short matrices and multi launches (expert tiles)
		{128, 128, 2, 4, 3, 1, 0},
		{128, 128, 4, 2, 3, 1, 0},
		{128, 64, 4, 2, 3, 1, 0},
		{64, 64, 2, 2, 4, 1, 0},
		{128, 32, 4, 2, 4, 1, 0},
		{256, 64, 4, 2, 3, 1, 0},
		{128, 64, 4, 2, 3, 2, 0}, // 9: at most 128 registers, two blocks per SM
		{64, 64, 2, 2, 4, 3, 0},  // 10: three blocks of 128 threads per SM
		{128, 64, 4, 2, 4, 1, 1}, // 11..13: x split once per block (FP8, MXFP4)
		{64, 32, 2, 2, 4, 1, 1},
		{128, 128, 2, 4, 4, 1, 1},
		{64, 16, 4, 1, 4, 1, 1}, // 14, 15: 16 batch rows (expert tiles of a dozen rows)
		{64, 16, 4, 1, 4, 1, 0},
		{256, 64, 8, 2, 4, 1, 0}, // 16, 17: tall tiles, warps of 32x32 as tile 1, fewer x bytes per product
		{256, 32, 8, 1, 4, 1, 0},
	}
}

// tcTileName is a tile's part of its kernels' names (kernels/linear.cu).
func tcTileName(tl tcTile) string {
	n := fmt.Sprintf("%dx%d_w%dx%d_s%d_o%d", tl.BM, tl.BN, tl.WM, tl.WN, tl.ST, tl.OB)
	if tl.XC != 0 {
		n += "_x"
	}
	return n
}

// tcOK reports whether the tensor-core GEMM family takes a weight of this
// format, shape, FP8 block edge and group count with row tile bm.
func tcOK(f compute.Format, rows, cols, block, groups, bm int) bool {
	if groups > 1 && (rows/groups)%bm != 0 {
		return false
	}
	switch f {
	case compute.FP8Block:
		return cols%64 == 0 && block >= 64 && block&(block-1) == 0
	case compute.MXFP4:
		return cols%128 == 0
	case compute.BF16:
		return cols%64 == 0
	}
	return false
}

// tcShared returns the dynamic shared memory of a tensor-core GEMM launch
// of tile tl over weights of format f with rows of cols columns (FP8 block
// edge block): the stages plus the tile's scale rows.
func tcShared(tl tcTile, f compute.Format, cols, block int) int {
	ab, scale := 128, 0
	switch f {
	case compute.FP8Block:
		ab, scale = 64, tl.BM/16*((cols+block-1)/block)
	case compute.MXFP4:
		ab, scale = 32, tl.BM*(cols/32)
	}
	n := tl.ST*(tl.BM*ab+256*tl.BN) + scale
	return (n + 15) &^ 15
}

// tcStaticShared bounds the tensor-core kernels' static shared memory (the
// row maxima of the scales, plus what the system reserves).
const tcStaticShared = 3 << 10

// tcAligned reports whether the tensor-core kernels' 16-byte loads of w
// and x (and MXFP4's 4-byte scale loads) are aligned. x 0 stands for an
// input set later (expert tiles: rows of an aligned buffer).
func tcAligned(w *DeviceWeight, x DevicePtr) bool {
	return w.Data%16 == 0 && w.Scale%4 == 0 && x%16 == 0
}

// tcWanted reports whether v asks for the tensor-core GEMM family at this
// batch: explicitly (WidthTC or a Tile alone) or automatically (the
// default variant at a batch of at least tcMinBatch).
func tcWanted(v LinearVariant, batch int) bool {
	switch {
	case v.Width == WidthTC:
		return true
	case v.Width != WidthAuto:
		return false
	case v == LinearVariant{Tile: v.Tile, SplitK: v.SplitK} && (v.Tile != 0 || v.SplitK != 0):
		return true
	}
	return v == LinearVariant{} && batch >= tcMinBatch
}

// tcAutoTile picks the tile of an automatic tensor-core launch of a
// [rows, cols] weight at this batch on sms multiprocessors: 128x64 when it
// gives at least one block per multiprocessor and the batch is at least
// 64, else 64x32.
func tcAutoTile(rows, batch, sms int) int {
	// On the H200 (2026-11-30, BenchmarkPrefillGEMM) the 128x64 tile won
	// with 128 blocks on 132 SMs (4096x4096 at batch 256: 84.2 against
	// 67.7 TFLOP/s) and lost badly with 32 (batch 64: 20.1 against 41.7).
	t := tcTileList()[0]
	if batch >= 64 && 4*((rows+t.BM-1)/t.BM)*((batch+t.BN-1)/t.BN) >= 3*sms {
		return 1
	}
	return 2
}

// planTC plans one tensor-core GEMM launch over the whole batch, or returns
// ok false when the family does not take the shape (the caller then uses
// the other families). It needs no device.
func planTC(f compute.Format, rows, cols, block, groups, batch int, v LinearVariant, sms, optin int) (p linPlan, ok bool, err error) {
	name, _, _ := fmtInfo(f)
	tiles := tcTileList()
	ti := v.Tile
	if ti < 0 || ti > len(tiles) {
		return linPlan{}, false, fmt.Errorf("cuda linear: tensor-core tile %d, want 1..%d (0 automatic)", ti, len(tiles))
	}
	if ti == 0 {
		ti = tcAutoTile(rows, batch, sms)
	}
	tl := tiles[ti-1]
	split := max(v.SplitK, 1)
	if split > 32 || split > 1 && ti > 2 {
		return linPlan{}, false, fmt.Errorf("cuda linear: split-K %d with tensor-core tile %d (want 1..32, tiles 1 and 2)", v.SplitK, ti)
	}
	if !tcOK(f, rows, cols, block, groups, tl.BM) || tl.XC != 0 && f == compute.BF16 {
		return linPlan{}, false, nil
	}
	shared := tcShared(tl, f, cols, block)
	if optin > 0 && shared > optin-tcStaticShared {
		return linPlan{}, false, nil
	}
	suffix := ""
	if split > 1 {
		suffix = "_k"
	}
	return linPlan{name: fmt.Sprintf("lint_%s_%s%s", name, tcTileName(tl), suffix),
		grid:  Dim3{X: uint32((rows + tl.BM - 1) / tl.BM), Y: uint32((batch + tl.BN - 1) / tl.BN), Z: uint32(split)},
		block: Dim3{X: uint32(32 * tl.WM * tl.WN)}, shared: shared, split: split > 1}, true, nil
}

// defaultWidth is the family WidthAuto selects where the shape allows it,
// except for batch tile 1 with rows of at most vecAutoCols columns, where it
// selects WidthVec.
const defaultWidth = WidthNarrow

// vecAutoCols: on the H200 (2026-11-30, BenchmarkV4, batch 1) the vec family
// beat the narrow one on short rows (wq_b FP8 32768x1024: 13.1 vs 20.1 us;
// expert w2 MXFP4 4096x2048: 6.1 vs 6.9 us; six experts' w2 in one launch:
// 21.7 vs 33.7 us) and lost on long ones (wo_b FP8 4096x8192: 22.1 vs
// 20.5 us; expert w1 MXFP4 2048x4096: 8.0 vs 6.9 us; six experts' w1+w3:
// 62.2 vs 58.5 us); with vec everywhere a decode step of
// synth:flash?layers=8&experts=16 took 4.43 ms against 4.92 ms.
const vecAutoCols = 2048

// autoWidth is the family WidthAuto means for a launch of batch tile NB over
// rows of cols columns.
func autoWidth(NB, cols int) int {
	if NB == 1 && cols <= vecAutoCols {
		return WidthVec
	}
	return defaultWidth
}

// wideOK reports whether a weight of this format, width and FP8 block edge
// can use the 16-byte-word kernels (wide and vec families).
func wideOK(f compute.Format, cols, block int) bool {
	switch f {
	case compute.FP8Block:
		return cols%16 == 0 && block >= 16 && block&(block-1) == 0
	case compute.MXFP8:
		return cols%16 == 0
	case compute.MXFP4:
		return cols%32 == 0
	}
	return false
}

// mmaOK reports whether the tensor-core kernels take a weight of this
// format, width, FP8 block edge and group count.
func mmaOK(f compute.Format, cols, block, groups int) bool {
	switch {
	case groups != 1:
		return false
	case f == compute.FP8Block:
		return cols%64 == 0 && block >= 64 && block&(block-1) == 0
	case f == compute.MXFP4:
		return cols%32 == 0
	}
	return false
}

// mmaShared returns the dynamic shared memory of a tensor-core launch
// (2·NB rows of cols+8 f16) and the blocks of 256 threads that fit on an SM
// beside it (the SM holds at most twice the per-block opt-in size; each
// block also has 4 KB of static shared memory).
func mmaShared(NB, cols, optin int) (bytes, perSM int) {
	bytes = 2 * NB * (cols + 8) * 2
	perSM = 2
	if optin > 0 && 2*(bytes+5<<10) > optin {
		perSM = 1
	}
	return bytes, perSM
}

// mmaKS returns the warps of a tensor-core block that share one 16-row tile
// (1, 2, 4 or 8): more while the tiles cannot occupy warpsWanted warps and
// every warp still gets a chunk of each row.
func mmaKS(tiles, chunks, warpsWanted int) int {
	ks := 1
	for ks < 8 && tiles*ks*2 <= warpsWanted && chunks >= 2*ks {
		ks *= 2
	}
	return ks
}

// mmaU returns the spans (FP8: 64 columns; MXFP4: one scale group) a
// tensor-core kernel loads ahead per chunk.
func mmaU(f compute.Format) int {
	if f == compute.FP8Block {
		return 4
	}
	return 8
}

// E4M3 decoders of the fast linear kernels.
const (
	DecodeAuto = iota
	DecodeCvt
	DecodeBits
)

// defaultDecode is the decoder DecodeAuto selects.
const defaultDecode = DecodeCvt

// vecBlocks is the vec family's default blocks per SM (its kernels are
// compiled with __launch_bounds__(256, 2)).
const vecBlocks = 2

// linKey names one loaded linear kernel.
type linKey struct {
	format    int32
	nb, rb, u int
	suffix    string
}

// maxNB is the largest batch one launch of the fast kernels takes.
const maxNB = 16

// maxVecNB is the largest batch tile of the vec family.
const maxVecNB = 4

// linPlan is one launch of a linear kernel.
type linPlan struct {
	name    string
	grid    Dim3
	block   Dim3
	generic bool  // linear_generic: takes the format code as a second argument
	shared  int   // dynamic shared memory bytes
	ks      int32 // tensor-core kernels: warps per tile (a second argument); 0 otherwise
	split   bool  // split-K tensor-core GEMM: y must be zeroed first
}

func pow2ceil(n int) int {
	p := 1
	for p < n {
		p *= 2
	}
	return p
}

// vecShape returns the vec family's U and RB for rows of nw 16-byte words.
func vecShape(v LinearVariant, nw int) (u, rb int, err error) {
	u, rb = v.U, v.RB
	switch {
	case u == 0 && rb == 0:
		u = min(max(pow2ceil((nw+31)/32), 2), 8)
		rb = 8 / u
	case u == 0:
		u = 8 / max(rb, 1)
	case rb == 0:
		rb = 8 / max(u, 1)
	}
	if !(u == 2 && rb == 4 || u == 4 && rb == 2 || u == 8 && rb == 1) {
		return 0, 0, fmt.Errorf("cuda linear: the vec family takes U, RB = 2, 4 or 4, 2 or 8, 1, not %d, %d", u, rb)
	}
	return u, rb, nil
}

// planLinear picks the kernel and launch shape of one launch of up to maxNB
// batch rows (nb) of a [rows, cols] weight of format f (FP8 block edge
// block) with groups input groups, on a device of sms multiprocessors with
// optin bytes of shared memory per block (opt-in maximum). It
// needs no device, so the kernels every variant can launch can be listed
// (linear_compile_test.go checks they exist).
func planLinear(f compute.Format, rows, cols, block, groups, nb int, v LinearVariant, sms, optin int) (linPlan, error) {
	name, _, cpw := fmtInfo(f)
	if name == "" {
		return linPlan{}, fmt.Errorf("cuda linear: unknown weight format %v", f)
	}
	rpg := rows / groups
	pow2 := f != compute.FP8Block || block&(block-1) == 0
	generic := v.Generic || cols%cpw != 0 || !pow2
	width := v.Width
	if width == WidthAuto {
		width = defaultWidth
		if v == (LinearVariant{}) { // a variant's own tuning fields mean the narrow family
			width = autoWidth(pow2ceil(nb), cols)
		}
	}
	genericPlan := linPlan{name: "linear_generic", grid: Dim3{X: uint32((rows + 7) / 8)}, block: Dim3{X: 256}, generic: true}
	if generic {
		return genericPlan, nil
	}
	dec := v.Decode
	if dec == DecodeAuto {
		dec = defaultDecode
	}
	d := 0
	if dec == DecodeBits && f != compute.BF16 && f != compute.F32 {
		d = 1
	}
	NB := pow2ceil(nb)
	if width == WidthMMA && NB <= maxVecNB && mmaOK(f, cols, block, groups) {
		shared, perSM := mmaShared(NB, cols, optin)
		tiles := (rows + 15) / 16
		u, span := mmaU(f), 64
		if f == compute.MXFP4 {
			span = 32
		}
		ks := mmaKS(tiles, (cols/span+u-1)/u, sms*perSM*8)
		return linPlan{name: fmt.Sprintf("linm_%s_b%d_u%d", name, NB, u),
			grid: Dim3{X: uint32(min(sms*perSM, (tiles*ks+7)/8))}, block: Dim3{X: 256}, shared: shared, ks: int32(ks)}, nil
	}
	wide := wideOK(f, cols, block)
	if width == WidthVec && wide && NB <= maxVecNB {
		nw := cols / (4 * cpw)
		u, rb, err := vecShape(v, nw)
		if err != nil {
			return linPlan{}, err
		}
		if groups == 1 || rpg%rb == 0 {
			bps := v.Blocks
			if bps == 0 {
				bps = vecBlocks
			}
			tiles := (rows + rb - 1) / rb
			blocks := min(sms*bps, (tiles+7)/8)
			return linPlan{name: fmt.Sprintf("linv_%s_b%d_r%d_u%d_d%d_h%d", name, NB, rb, u, d, v.Hint),
				grid: Dim3{X: uint32(blocks)}, block: Dim3{X: 256}}, nil
		}
	}
	rb := v.RB
	if rb == 0 || width == WidthVec || width == WidthMMA {
		rb = 2
	}
	if rpg%rb != 0 && groups > 1 {
		if v.RB == 0 || width == WidthVec || width == WidthMMA {
			return genericPlan, nil // a block's rows would span two x groups
		}
		return linPlan{}, fmt.Errorf("cuda linear: %d rows per group is not a multiple of RB %d", rpg, rb)
	}
	prefix, u, suffix := "linear", 4, fmt.Sprintf("_d%d", d)
	if width == WidthWide && wide {
		prefix, u, cpw = "linw", 2, 4*cpw
	}
	if v.U != 0 && width != WidthVec && width != WidthMMA {
		u = v.U
	}
	kw := v.KW
	if kw == 0 {
		blocks := (rows + rb - 1) / rb
		target := sms * 48 // warps wanted in flight
		kw = min(max((target+blocks-1)/blocks, 1), 8)
		kw = min(kw, max((cols/cpw+32*u-1)/(32*u), 1))
	}
	return linPlan{name: fmt.Sprintf("%s_%s_b%d_r%d_u%d%s", prefix, name, NB, rb, u, suffix),
		grid: Dim3{X: uint32((rows + rb - 1) / rb)}, block: Dim3{X: uint32(32 * kw)}}, nil
}

// Linear enqueues y[b, r] = Σ_c W[r, c]·x[b, c] on s for device buffers
// x [batch, Cols] and y [batch, Rows] (float32).
func (c *Ctx) Linear(w *DeviceWeight, y, x DevicePtr, batch int, s Stream) error {
	return c.LinearWith(w, y, x, batch, 1, LinearVariant{}, s)
}

// GroupedLinear enqueues the grouped projection of compute.Backend
// (x [batch, groups·Cols], y [batch, Rows]).
func (c *Ctx) GroupedLinear(w *DeviceWeight, y, x DevicePtr, batch, groups int, s Stream) error {
	return c.LinearWith(w, y, x, batch, groups, LinearVariant{}, s)
}

// linArgsFor returns the kernel arguments of w with x and y unset.
func linArgsFor(w *DeviceWeight, groups int) linArgs {
	a := linArgs{W: uint64(w.Data), S: uint64(w.Scale), Rows: int32(w.Rows), Cols: int32(w.Cols), Sdivr: 1, Sdivc: 1,
		Rpg: int32(w.Rows / groups), Xstride: int32(groups * w.Cols), Ystride: int32(w.Rows)}
	switch w.Format {
	case compute.FP8Block:
		a.Sdivr, a.Sdivc, a.Sstride = int32(w.Block), int32(w.Block), int32((w.Cols+w.Block-1)/w.Block)
		if w.Block&(w.Block-1) == 0 {
			a.Srshift = int32(bits.TrailingZeros(uint(w.Block)))
			a.Scshift = a.Srshift
		}
	case compute.MXFP4, compute.MXFP8:
		a.Sdivc, a.Sstride, a.Scshift = 32, int32((w.Cols+31)/32), 5
	}
	return a
}

// LinearWith is Linear/GroupedLinear with an explicit kernel variant.
// Variants outside the default module compile the benchmark module on first
// use; a variant with no kernel for the shape is an error naming the kernel.
func (c *Ctx) LinearWith(w *DeviceWeight, y, x DevicePtr, batch, groups int, v LinearVariant, s Stream) error {
	_, code, _ := fmtInfo(w.Format)
	if code == 0 {
		return fmt.Errorf("cuda linear: unknown weight format %v", w.Format)
	}
	if batch <= 0 || groups <= 0 || w.Rows%groups != 0 {
		return fmt.Errorf("cuda linear: batch %d, groups %d for a [%d, %d] weight", batch, groups, w.Rows, w.Cols)
	}
	if v.Width == WidthAuto {
		v.Width = c.d.linWidth
	}
	a := linArgsFor(w, groups)
	if tcWanted(v, batch) && tcAligned(w, x) {
		p, ok, err := planTC(w.Format, w.Rows, w.Cols, w.Block, groups, batch, v, c.d.info.SMs, c.d.info.SharedOptin)
		if err != nil {
			return err
		}
		if ok {
			k, err := c.linKernel(p.name)
			if err != nil {
				return err
			}
			a.Batch, a.X, a.Y = int32(batch), uint64(x), uint64(y)
			if p.split {
				if err := c.Memset(y, 0, 4*batch*w.Rows, s); err != nil {
					return err
				}
			}
			return c.Launch(k, p.grid, p.block, p.shared, s, unsafe.Pointer(&a))
		}
		if v.Width == WidthTC || v.Tile != 0 || v.SplitK != 0 {
			v = LinearVariant{Width: WidthNarrow} // the shape is not the family's: the narrow kernels
		}
	}
	for b0 := 0; b0 < batch; {
		nb := min(batch-b0, maxNB)
		p, err := planLinear(w.Format, w.Rows, w.Cols, w.Block, groups, nb, v, c.d.info.SMs, c.d.info.SharedOptin)
		if err != nil {
			return err
		}
		k, err := c.linKernel(p.name)
		if err != nil {
			return err
		}
		a.Batch = int32(nb)
		a.X = uint64(x) + uint64(4*b0*groups*w.Cols)
		a.Y = uint64(y) + uint64(4*b0*w.Rows)
		if p.generic {
			err = c.Launch(k, p.grid, p.block, 0, s, unsafe.Pointer(&a), unsafe.Pointer(&code))
		} else if p.ks > 0 {
			err = c.Launch(k, p.grid, p.block, p.shared, s, unsafe.Pointer(&a), unsafe.Pointer(&p.ks))
		} else {
			err = c.Launch(k, p.grid, p.block, p.shared, s, unsafe.Pointer(&a))
		}
		if err != nil {
			return err
		}
		b0 += nb
	}
	return nil
}

// MultiLinear is a prepared launch of several projections of one format, each
// with its own weight, input and output (y_i = W_i·x_i, batch rows each), as
// one kernel: e.g. the w1 and w3 of a token's active experts. Its argument
// table lives in device memory, so the launch can be captured in a graph.
type MultiLinear struct {
	args    DevicePtr
	n       int32
	vec     bool  // vec kernel: takes the matrix count as a second argument
	ks      int32 // tensor-core kernel: warps per tile, its second argument
	shared  int   // dynamic shared memory bytes
	kernel  *Kernel
	grid    Dim3
	block   Dim3
	weights int // bytes of all weights (for bandwidth figures)
}

// Bytes returns the stored bytes of all the launch's weights.
func (m *MultiLinear) Bytes() int { return m.weights }

// Kernel returns the name of the kernel the launch runs.
func (m *MultiLinear) Kernel() string { return m.kernel.Name() }

// planMulti picks the kernel and launch shape of a multi-projection launch
// of weights of format f with the given shapes ([rows, cols] each, FP8 block
// edge block) at batch (1..maxNB). Like planLinear it needs no device.
func planMulti(f compute.Format, shapes [][2]int, block, batch int, v LinearVariant, sms, optin int) (linPlan, bool, error) {
	name, _, cpw := fmtInfo(f)
	if name == "" || f == compute.F32 || f == compute.MXFP8 {
		return linPlan{}, false, fmt.Errorf("cuda multi-linear: no multi kernel for %v weights", f)
	}
	maxRows, totalRows, maxCols := 0, 0, 0
	wide := f != compute.BF16
	for i, sh := range shapes {
		if sh[0]%2 != 0 || sh[1]%cpw != 0 || (f == compute.FP8Block && block&(block-1) != 0) {
			return linPlan{}, false, fmt.Errorf("cuda multi-linear: weight %d (%v [%d, %d]) does not fit a %v set (even rows, columns a multiple of %d)", i, f, sh[0], sh[1], f, cpw)
		}
		maxRows, totalRows, maxCols = max(maxRows, sh[0]), totalRows+sh[0], max(maxCols, sh[1])
		wide = wide && wideOK(f, sh[1], block)
	}
	NB := pow2ceil(batch)
	d := 0
	if v.Decode == DecodeBits && f != compute.BF16 {
		d = 1
	}
	width := v.Width
	if width == WidthAuto {
		width = defaultWidth
		if v == (LinearVariant{}) {
			width = autoWidth(NB, maxCols)
		}
	}
	mma := width == WidthMMA && NB <= maxVecNB
	maxTiles := 0
	for _, sh := range shapes {
		mma = mma && mmaOK(f, sh[1], block, 1)
		maxTiles = max(maxTiles, (sh[0]+15)/16)
	}
	if mma {
		shared, perSM := mmaShared(NB, maxCols, optin)
		u, span, minCols := mmaU(f), 64, maxCols
		if f == compute.MXFP4 {
			span = 32
		}
		for _, sh := range shapes {
			minCols = min(minCols, sh[1])
		}
		ks := mmaKS(maxTiles, (minCols/span+u-1)/u, max(sms*perSM*8/len(shapes), 1))
		per := max(1, min((maxTiles*ks+7)/8, sms*perSM/len(shapes)))
		return linPlan{name: fmt.Sprintf("linmmulti_%s_b%d_u%d", name, NB, u),
			grid: Dim3{X: uint32(per), Y: uint32(len(shapes))}, block: Dim3{X: 256}, shared: shared, ks: int32(ks)}, false, nil
	}
	if width == WidthVec && wide && NB <= maxVecNB {
		u, rb, err := vecShape(v, maxCols/(4*cpw))
		if err != nil {
			return linPlan{}, false, err
		}
		tiles := 0
		for _, sh := range shapes {
			tiles += (sh[0] + rb - 1) / rb
		}
		bps := v.Blocks
		if bps == 0 {
			bps = vecBlocks
		}
		return linPlan{name: fmt.Sprintf("linvmulti_%s_b%d_r%d_u%d_d%d_h%d", name, NB, rb, u, d, v.Hint),
			grid: Dim3{X: uint32(min(sms*bps, (tiles+7)/8))}, block: Dim3{X: 256}}, true, nil
	}
	kw := v.KW
	if kw == 0 {
		blocks := totalRows / 2
		kw = min(max((sms*48+blocks-1)/blocks, 1), 8)
		kw = min(kw, max((shapes[0][1]/cpw+32*4-1)/(32*4), 1))
	}
	return linPlan{name: fmt.Sprintf("linmulti_%s_b%d_r2_u4_d%d", name, NB, d),
		grid: Dim3{X: uint32(maxRows / 2), Y: uint32(len(shapes))}, block: Dim3{X: uint32(32 * kw)}}, false, nil
}

// multiTCTile is the tile (LinearVariant.Tile) of automatic tensor-core
// multi launches of few rows per record (multiAutoTile): 64x32, e.g. expert
// tiles of a dozen to a few dozen routed rows. Tiles 14 and 15 (64x16)
// waste less on experts of a dozen rows; BenchmarkPrefillGEMM's tiles_*
// rows compare them. Its kernels must be in the default module for every
// format.
const multiTCTile = 2

// multiBigTile is the tile of automatic multi launches of many rows per
// record (multiAutoTile): 128x64, the dense GEMM's tile at large batches.
// Its FP8 and MXFP4 multi kernels are in the default module.
const multiBigTile = 1

// multiTiles reports whether format f has multi kernels of tile ti
// (LinearVariant.Tile): MXFP4 every tile, FP8 tiles 1 and 2, BF16 tile 2.
func multiTiles(f compute.Format, ti int) bool {
	switch f {
	case compute.MXFP4:
		return true
	case compute.FP8Block:
		return ti == multiTCTile || ti == multiBigTile
	}
	return ti == multiTCTile
}

// multiAutoTile picks the tile of an automatic tensor-core multi launch of
// n records of format f, each of up to maxRows weight rows and `rows`
// routed (batch) rows expected per record: multiBigTile when the records
// carry at least multiBigRows rows and its blocks fill the chip (as
// tcAutoTile), else multiTCTile.
func multiAutoTile(f compute.Format, maxRows, rows, n, sms int) int {
	t := tcTileList()[multiBigTile-1]
	if multiTiles(f, multiBigTile) && rows >= multiBigRows &&
		4*n*((maxRows+t.BM-1)/t.BM)*((rows+t.BN-1)/t.BN) >= 3*sms {
		return multiBigTile
	}
	return multiTCTile
}

// multiBigRows is the fewest batch rows per record for which multiAutoTile
// picks the 128x64 tile: at 40 routed rows a record fills 62% of a 64-row
// tile and ~63% of two 32-row ones, and the 128x64 tile ran 1.25x the 64x32
// one on dense shapes (H200, 2026-11-30: 84.2 against 67.7 TFLOP/s).
const multiBigRows = 40

// planMultiTC plans a tensor-core GEMM launch over several projections of
// format f ([rows, cols] each, FP8 block edge block) at batch, or returns
// ok false when the family does not take every shape. v.Tile picks the
// tile where f has its multi kernels (multiTiles; others mean
// multiTCTile); 0 is multiAutoTile with batch as the rows per record.
// Blocks past a projection's rows or batch exit at once, so the grid
// covers the largest.
func planMultiTC(f compute.Format, shapes [][2]int, block, batch int, v LinearVariant, sms, optin int) (p linPlan, ok bool, err error) {
	name, _, _ := fmtInfo(f)
	tiles := tcTileList()
	ti := v.Tile
	if ti < 0 || ti > len(tiles) {
		return linPlan{}, false, fmt.Errorf("cuda multi-linear: tensor-core tile %d, want 1..%d (0 automatic)", ti, len(tiles))
	}
	maxRows := 0
	for _, sh := range shapes {
		maxRows = max(maxRows, sh[0])
	}
	if ti == 0 {
		ti = multiAutoTile(f, maxRows, batch, len(shapes), sms)
	} else if !multiTiles(f, ti) {
		ti = multiTCTile // the format has no multi kernel of this tile
	}
	tl := tiles[ti-1]
	shared := 0
	for _, sh := range shapes {
		if !tcOK(f, sh[0], sh[1], block, 1, tl.BM) {
			return linPlan{}, false, nil
		}
		shared = max(shared, tcShared(tl, f, sh[1], block))
	}
	if optin > 0 && shared > optin-tcStaticShared || len(shapes) > 65535 {
		return linPlan{}, false, nil
	}
	return linPlan{name: fmt.Sprintf("lintmulti_%s_%s", name, tcTileName(tl)),
		grid:  Dim3{X: uint32((maxRows + tl.BM - 1) / tl.BM), Y: uint32((batch + tl.BN - 1) / tl.BN), Z: uint32(len(shapes))},
		block: Dim3{X: uint32(32 * tl.WM * tl.WN)}, shared: shared}, true, nil
}

// PrepareMultiLinear validates the set (same format, even row counts, columns
// a multiple of the decode width, batch <= 16, or any batch the tensor-core
// kernels take: see WidthTC) and uploads the argument table
// into a. ys[i] and xs[i] are device buffers [batch, Rows_i] and [batch, Cols_i].
// Widths WidthVec and WidthMMA take batch <= 4 (larger batches use the
// narrow kernels).
func (c *Ctx) PrepareMultiLinear(a *Arena, ws []*DeviceWeight, ys, xs []DevicePtr, batch int, v LinearVariant) (*MultiLinear, error) {
	if len(ws) == 0 || len(ys) != len(ws) || len(xs) != len(ws) {
		return nil, fmt.Errorf("cuda multi-linear: %d weights, %d outputs, %d inputs", len(ws), len(ys), len(xs))
	}
	if v.Width == WidthAuto {
		v.Width = c.d.linWidth
	}
	f := ws[0].Format
	tc := false
	var tcp linPlan
	if batch > 0 && tcWanted(v, batch) {
		shapes := make([][2]int, len(ws))
		same := true
		for i, w := range ws {
			shapes[i] = [2]int{w.Rows, w.Cols}
			same = same && w.Format == f && (f != compute.FP8Block || w.Block == ws[0].Block) && tcAligned(w, xs[i])
		}
		if same {
			p, ok, err := planMultiTC(f, shapes, ws[0].Block, batch, v, c.d.info.SMs, c.d.info.SharedOptin)
			if err != nil {
				return nil, err
			}
			tc, tcp = ok, p
		}
		if !tc && (v.Width == WidthTC || v.Tile != 0 || v.SplitK != 0) {
			v = LinearVariant{Width: WidthNarrow}
		}
	}
	if !tc && (batch <= 0 || batch > maxNB) {
		return nil, fmt.Errorf("cuda multi-linear: batch %d, want 1..%d (or at least %d for the tensor-core kernels, which this set's shapes do not fit)", batch, maxNB, tcMinBatch)
	}
	shapes := make([][2]int, len(ws))
	args := make([]linArgs, len(ws))
	bytes := 0
	for i, w := range ws {
		if w.Format != f || f == compute.FP8Block && w.Block != ws[0].Block {
			return nil, fmt.Errorf("cuda multi-linear: weight %d is %v (block %d), the set is %v (block %d)", i, w.Format, w.Block, f, ws[0].Block)
		}
		shapes[i] = [2]int{w.Rows, w.Cols}
		la := linArgsFor(w, 1)
		la.X, la.Y, la.Batch = uint64(xs[i]), uint64(ys[i]), int32(batch)
		args[i] = la
		bytes += w.Bytes
	}
	p, vec := tcp, false
	if !tc {
		var err error
		if p, vec, err = planMulti(f, shapes, ws[0].Block, batch, v, c.d.info.SMs, c.d.info.SharedOptin); err != nil {
			return nil, err
		}
	}
	k, err := c.linKernel(p.name)
	if err != nil {
		return nil, err
	}
	m := &MultiLinear{n: int32(len(ws)), vec: vec, ks: p.ks, shared: p.shared, kernel: k, grid: p.grid, block: p.block, weights: bytes}
	size := len(args) * int(unsafe.Sizeof(linArgs{}))
	if m.args, err = a.Alloc(size); err != nil {
		return nil, err
	}
	if err := c.CopyToDevice(m.args, unsafe.Slice((*byte)(unsafe.Pointer(&args[0])), size)); err != nil {
		return nil, err
	}
	return m, nil
}

// LaunchMultiLinear enqueues a prepared set on s.
func (c *Ctx) LaunchMultiLinear(m *MultiLinear, s Stream) error {
	if m.vec {
		return c.Launch(m.kernel, m.grid, m.block, 0, s, unsafe.Pointer(&m.args), unsafe.Pointer(&m.n))
	}
	if m.ks > 0 {
		return c.Launch(m.kernel, m.grid, m.block, m.shared, s, unsafe.Pointer(&m.args), unsafe.Pointer(&m.ks))
	}
	return c.Launch(m.kernel, m.grid, m.block, m.shared, s, unsafe.Pointer(&m.args))
}
