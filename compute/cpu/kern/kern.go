// Package kern holds the CPU's matrix kernels for stored (quantized) weights:
// y = W·x for FP8 E4M3 weights with 128x128 E8M0 block scales, MXFP4 (E2M1 with
// one E8M0 scale per 32 inputs), BF16 and F32, all row-major [rows=out, cols=in].
//
// The kernels read the stored bytes directly; no dequantized copy of a weight
// is ever made. Batch 1 (decode) is a fused streaming matrix-vector product
// that decodes in registers and is bound by memory bandwidth. Larger batches
// decode one weight tile (up to 8x512) at a time into a stack buffer of
// float32 and reuse it for every batch row: on AVX-512, for batches of at
// least 6 and at least 32 rows, the input is transposed once per call and
// generated assembly micro-kernels broadcast each decoded weight against 16
// to 48 batch rows, one output per vector lane (no horizontal sums); the
// portable path and the other cases take dot products per (row, batch row).
// Accumulation is in float32; results match a float64 reference within
// float32 accumulation error (the order of additions is not specified).
//
// Numerics: products and sums are float32 (no fused multiply-add is promised).
// Block scales are exact powers of two, so the kernels may apply them to the
// input instead of the weight (FP8) or to a per-block partial sum (MXFP4); the
// result can therefore overflow to ±Inf where an intermediate x·scale or a
// 32-column partial sum Σ e2m1·x leaves float32's range even though W·x would
// not. Activations of a real model are many orders of magnitude away from
// that. NaN weights, NaN scales and NaN inputs propagate to every output they
// touch.
//
// On amd64 built with GOEXPERIMENT=simd the kernels use AVX-512 (FP8 also
// needs AVX512VBMI) when the CPU has it; otherwise, and in a plain build,
// portable scalar Go runs. The batch-1 inner loops of FP8, MXFP4 (scale
// bytes in [1,254]) and BF16 are generated Go assembly (gen_asm.go) that
// prefetches the weights ahead, which archsimd cannot express, and so are
// the batched micro-kernels (broadcast loads, 24 accumulators, gathers); the
// rest is archsimd. Both are tested against the same float64
// reference. Which one runs is decided per call from CPU features read once
// at start-up; there is no configuration.
//
// Parallelism: every kernel takes a *Pool and splits rows across its workers;
// a nil Pool, or a product under ~64K multiply-adds, runs on the caller.
package kern

import "fmt"

// Matrix is a weight matrix in some stored format that can multiply batches of
// input rows. See FP8Block.MatMul for the contract shared by every format.
type Matrix interface {
	// Dims returns the stored shape [rows=out, cols=in].
	Dims() (rows, cols int)
	// MatMul sets y[b*rows+r] = Σ_c W[r,c]·x[b*cols+c] for b < batch, r < rows.
	MatMul(p *Pool, y, x []float32, batch int)
	// MatMulRows is MatMul restricted to rows [r0,r1): y[b*(r1-r0)+r-r0].
	MatMulRows(p *Pool, y, x []float32, batch, r0, r1 int)
}

var (
	_ Matrix = FP8Block{}
	_ Matrix = MXFP4{}
	_ Matrix = BF16{}
	_ Matrix = F32{}
)

// FP8Block is an FP8 E4M3fn weight with E8M0 block scales:
// W[r,c] = e4m3(Q[r*Cols+c]) · 2^(Scale[(r/Block)*ceil(Cols/Block) + c/Block] - 127).
//
// Q has Rows*Cols bytes; Scale has ceil(Rows/Block)*ceil(Cols/Block) bytes.
// Block is the square block edge (128 in DeepSeek-V4 checkpoints; any value > 0
// works, 128 takes the fast path). E4M3fn codes 0x7F/0xFF are NaN and scale
// byte 0xFF is NaN; they propagate into every output they touch. The kernels
// only read Q and Scale; the caller keeps ownership and must not modify them
// during a call.
type FP8Block struct {
	Q, Scale   []byte
	Rows, Cols int
	Block      int
}

// MXFP4 is an MXFP4 weight: Packed holds two E2M1 codes per byte (low nibble =
// even column), Rows*Cols/2 bytes; Scale holds one E8M0 byte per 32 consecutive
// columns of a row, Rows*Cols/32 bytes:
// W[r,c] = e2m1(code[r,c]) · 2^(Scale[r*Cols/32 + c/32] - 127).
// Cols must be a multiple of 32. The E2M1 values by code are
// 0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, -1, -1.5, -2, -3, -4, -6.
type MXFP4 struct {
	Packed, Scale []byte
	Rows, Cols    int
}

// BF16 is a bfloat16 weight: W holds Rows*Cols little-endian uint16 values
// (2*Rows*Cols bytes), each the top half of a float32.
type BF16 struct {
	W          []byte
	Rows, Cols int
}

// F32 is a float32 weight of Rows*Cols values.
type F32 struct {
	W          []float32
	Rows, Cols int
}

// Dims returns [rows, cols].
func (w FP8Block) Dims() (rows, cols int) { return w.Rows, w.Cols }

// Dims returns [rows, cols].
func (w MXFP4) Dims() (rows, cols int) { return w.Rows, w.Cols }

// Dims returns [rows, cols].
func (w BF16) Dims() (rows, cols int) { return w.Rows, w.Cols }

// Dims returns [rows, cols].
func (w F32) Dims() (rows, cols int) { return w.Rows, w.Cols }

// MatMul computes y[b*Rows+r] = Σ_c W[r,c]·x[b*Cols+c] for every batch row
// b < batch and r < Rows, overwriting y[:batch*Rows]. x is read-only and is
// [batch, Cols] row-major (only x[:batch*Cols] is read). p may be nil
// (single-threaded). It panics (a programmer error) if the weight's byte
// lengths do not match its shape, batch < 0, len(x) < batch*Cols or
// len(y) < batch*Rows; y and x must not overlap.
func (w FP8Block) MatMul(p *Pool, y, x []float32, batch int) {
	w.MatMulRows(p, y, x, batch, 0, w.Rows)
}

// MatMulRows is MatMul restricted to the weight rows [r0,r1):
// y[b*(r1-r0)+(r-r0)] = Σ_c W[r,c]·x[b*Cols+c]. It panics unless
// 0 <= r0 <= r1 <= Rows and len(y) >= batch*(r1-r0), besides MatMul's checks.
func (w FP8Block) MatMulRows(p *Pool, y, x []float32, batch, r0, r1 int) {
	w.check()
	checkCall("FP8Block", w.Rows, w.Cols, y, x, batch, r0, r1)
	run(p, fp8Kernel{w}, y, x, batch, r0, r1)
}

// MatMul computes y = W·x per batch row; see FP8Block.MatMul for the contract.
// It also panics if Cols is not a multiple of 32.
func (w MXFP4) MatMul(p *Pool, y, x []float32, batch int) {
	w.MatMulRows(p, y, x, batch, 0, w.Rows)
}

// MatMulRows is MatMul restricted to rows [r0,r1); see FP8Block.MatMulRows.
func (w MXFP4) MatMulRows(p *Pool, y, x []float32, batch, r0, r1 int) {
	w.check()
	checkCall("MXFP4", w.Rows, w.Cols, y, x, batch, r0, r1)
	run(p, mxfp4Kernel{w}, y, x, batch, r0, r1)
}

// MatMul computes y = W·x per batch row; see FP8Block.MatMul for the contract.
func (w BF16) MatMul(p *Pool, y, x []float32, batch int) {
	w.MatMulRows(p, y, x, batch, 0, w.Rows)
}

// MatMulRows is MatMul restricted to rows [r0,r1); see FP8Block.MatMulRows.
func (w BF16) MatMulRows(p *Pool, y, x []float32, batch, r0, r1 int) {
	w.check()
	checkCall("BF16", w.Rows, w.Cols, y, x, batch, r0, r1)
	run(p, bf16Kernel{w}, y, x, batch, r0, r1)
}

// MatMul computes y = W·x per batch row; see FP8Block.MatMul for the contract.
func (w F32) MatMul(p *Pool, y, x []float32, batch int) {
	w.MatMulRows(p, y, x, batch, 0, w.Rows)
}

// MatMulRows is MatMul restricted to rows [r0,r1); see FP8Block.MatMulRows.
func (w F32) MatMulRows(p *Pool, y, x []float32, batch, r0, r1 int) {
	w.check()
	checkCall("F32", w.Rows, w.Cols, y, x, batch, r0, r1)
	run(p, f32Kernel{w}, y, x, batch, r0, r1)
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

func (w FP8Block) check() {
	if w.Rows < 0 || w.Cols < 0 || w.Block <= 0 {
		panic(fmt.Sprintf("kern: FP8Block shape %dx%d block %d: need rows, cols >= 0 and block > 0", w.Rows, w.Cols, w.Block))
	}
	if len(w.Q) != w.Rows*w.Cols {
		panic(fmt.Sprintf("kern: FP8Block %dx%d: len(Q) = %d, want %d", w.Rows, w.Cols, len(w.Q), w.Rows*w.Cols))
	}
	if want := ceilDiv(w.Rows, w.Block) * ceilDiv(w.Cols, w.Block); len(w.Scale) != want {
		panic(fmt.Sprintf("kern: FP8Block %dx%d block %d: len(Scale) = %d, want %d", w.Rows, w.Cols, w.Block, len(w.Scale), want))
	}
}

func (w MXFP4) check() {
	if w.Rows < 0 || w.Cols < 0 || w.Cols%32 != 0 {
		panic(fmt.Sprintf("kern: MXFP4 shape %dx%d: need rows, cols >= 0 and cols a multiple of 32", w.Rows, w.Cols))
	}
	if len(w.Packed) != w.Rows*w.Cols/2 {
		panic(fmt.Sprintf("kern: MXFP4 %dx%d: len(Packed) = %d, want %d", w.Rows, w.Cols, len(w.Packed), w.Rows*w.Cols/2))
	}
	if len(w.Scale) != w.Rows*w.Cols/32 {
		panic(fmt.Sprintf("kern: MXFP4 %dx%d: len(Scale) = %d, want %d", w.Rows, w.Cols, len(w.Scale), w.Rows*w.Cols/32))
	}
}

func (w BF16) check() {
	if w.Rows < 0 || w.Cols < 0 {
		panic(fmt.Sprintf("kern: BF16 shape %dx%d: need rows, cols >= 0", w.Rows, w.Cols))
	}
	if len(w.W) != 2*w.Rows*w.Cols {
		panic(fmt.Sprintf("kern: BF16 %dx%d: len(W) = %d bytes, want %d", w.Rows, w.Cols, len(w.W), 2*w.Rows*w.Cols))
	}
}

func (w F32) check() {
	if w.Rows < 0 || w.Cols < 0 {
		panic(fmt.Sprintf("kern: F32 shape %dx%d: need rows, cols >= 0", w.Rows, w.Cols))
	}
	if len(w.W) != w.Rows*w.Cols {
		panic(fmt.Sprintf("kern: F32 %dx%d: len(W) = %d, want %d", w.Rows, w.Cols, len(w.W), w.Rows*w.Cols))
	}
}

func checkCall(name string, rows, cols int, y, x []float32, batch, r0, r1 int) {
	if batch < 0 {
		panic(fmt.Sprintf("kern: %s: batch %d < 0", name, batch))
	}
	if r0 < 0 || r1 < r0 || r1 > rows {
		panic(fmt.Sprintf("kern: %s %dx%d: row range [%d,%d) out of range", name, rows, cols, r0, r1))
	}
	if len(x) < batch*cols {
		panic(fmt.Sprintf("kern: %s %dx%d: len(x) = %d < batch %d * cols %d", name, rows, cols, len(x), batch, cols))
	}
	if len(y) < batch*(r1-r0) {
		panic(fmt.Sprintf("kern: %s %dx%d: len(y) = %d < batch %d * rows %d", name, rows, cols, len(y), batch, r1-r0))
	}
}
