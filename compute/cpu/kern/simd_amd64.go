//go:build amd64 && goexperiment.simd

package kern

import (
	"math"
	"simd/archsimd"
)

// AVX-512 kernels. Every one has a portable twin in scalar.go that is used
// on CPUs without the features and for column tails.
//
// Facts about go1.26's archsimd that shaped this file (measured on the
// development machine, a 2-vCPU Xeon with AVX-512):
//   - Scalar float code compiles to legacy SSE; run while the AVX-512 upper
//     state is dirty it is ~40x slower, so every SIMD function ends with
//     hsum or archsimd.ClearAVXUpperBits (VZEROUPPER) before scalar code.
//   - ShiftAllRight on unsigned vectors loads the count through a legacy SSE
//     MOVQ (no immediate form); the signed (arithmetic) shifts get immediates
//     and are used wherever the vacated bits are masked or ignored.
//   - And/Or/Xor trees are fused into VPTERNLOG only on the signed integer
//     types, and the fusion gets AndNot's operand order wrong: the logic is
//     written with Int types and without AndNot.
//   - The register allocator uses 15 vector registers (X15 is the zero
//     register), which sets the tile and unroll sizes below.
//   - Multiplying subnormal float32 inputs takes a microcode assist (~30x), so
//     weights are decoded to normal floats (a bfloat16 table for E4M3, a
//     float table for E2M1), never by shifting codes into subnormal floats.

var (
	hasAVX512 = archsimd.X86.AVX512()
	// FP8 decode looks codes up in 128-entry byte tables (VPERMI2B).
	hasVBMI = hasAVX512 && archsimd.X86.AVX512VBMI()
)

// accLanes: gemmRows keeps one Float32x16 of partial sums per (row, batch).
const accLanes = 16

// fp8Hi and fp8Lo hold, for each 7-bit E4M3 magnitude, the high and low byte of
// its bfloat16 (= float32 >> 16) bit pattern; every E4M3 value is exact in
// bfloat16. The sign bit is copied from the code.
var fp8Hi, fp8Lo = func() (hi, lo [128]uint8) {
	for m := range 128 {
		b := math.Float32bits(e4m3Value[m]) >> 16
		hi[m], lo[m] = uint8(b>>8), uint8(b)
	}
	return
}()

// Interleave indices for ConcatPermute: bytes (lo[i], hi[i]) for i in
// [0,32) and [32,64).
var fp8Zip0, fp8Zip1 = func() (a, b [64]uint8) {
	for i := range 32 {
		a[2*i], a[2*i+1] = uint8(i), uint8(64+i)
		b[2*i], b[2*i+1] = uint8(32+i), uint8(96+i)
	}
	return
}()

// mxZip interleaves two Float32x16 (even, odd columns) into natural order.
var mxZip0, mxZip1 = func() (a, b [16]uint32) {
	for i := range 8 {
		a[2*i], a[2*i+1] = uint32(i), uint32(16+i)
		b[2*i], b[2*i+1] = uint32(8+i), uint32(24+i)
	}
	return
}()

func (k fp8Kernel) matvec(y, x []float32, lo, hi int) {
	if hasVBMI && k.w.Block == 128 {
		fp8MatvecAVX512(k.w, y, x, lo, hi)
		return
	}
	fp8MatvecScalar(k.w, y, x, lo, hi)
}

func (k fp8Kernel) decode(dst []float32, ld, r0, nr, c0, c1 int) {
	if hasVBMI && k.w.Block == 128 {
		fp8DecodeAVX512(k.w, dst, ld, r0, nr, c0, c1)
		return
	}
	fp8DecodeScalar(k.w, dst, ld, r0, nr, c0, c1)
}

func (k mxfp4Kernel) matvec(y, x []float32, lo, hi int) {
	if hasAVX512 {
		mxfp4MatvecAVX512(k.w, y, x, lo, hi)
		return
	}
	mxfp4MatvecScalar(k.w, y, x, lo, hi)
}

func (k mxfp4Kernel) prepare(dst, x []float32) bool {
	if !hasAVX512 {
		return false
	}
	mxPrepare(dst, x)
	return true
}

func (k mxfp4Kernel) matvecPrepared(y, xp, x []float32, lo, hi int) {
	mxfp4MatvecPrepared(k.w, y, xp, x, lo, hi)
}

func (k mxfp4Kernel) decode(dst []float32, ld, r0, nr, c0, c1 int) {
	if hasAVX512 {
		mxfp4DecodeAVX512(k.w, dst, ld, r0, nr, c0, c1)
		return
	}
	mxfp4DecodeScalar(k.w, dst, ld, r0, nr, c0, c1)
}

func (k bf16Kernel) matvec(y, x []float32, lo, hi int) {
	if hasAVX512 {
		bf16MatvecAVX512(k.w, y, x, lo, hi)
		return
	}
	bf16MatvecScalar(k.w, y, x, lo, hi)
}

func (k bf16Kernel) decode(dst []float32, ld, r0, nr, c0, c1 int) {
	if hasAVX512 {
		bf16DecodeAVX512(k.w, dst, ld, r0, nr, c0, c1)
		return
	}
	bf16DecodeScalar(k.w, dst, ld, r0, nr, c0, c1)
}

func (k f32Kernel) matvec(y, x []float32, lo, hi int) {
	if hasAVX512 {
		n := k.w.Cols
		for r := lo; r < hi; r++ {
			y[r-lo] = dotF32AVX512(k.w.W[r*n:(r+1)*n], x[:n])
		}
		return
	}
	f32MatvecScalar(k.w, y, x, lo, hi)
}

func (k f32Kernel) decode(dst []float32, ld, r0, nr, c0, c1 int) {
	f32DecodeScalar(k.w, dst, ld, r0, nr, c0, c1)
}

// hsum adds the lanes of v. It clears the upper halves of the vector
// registers first: Go compiles scalar float code to legacy SSE instructions,
// which are very slow while the AVX-512 upper state is dirty (measured: ~40x
// on the development machine). Every SIMD function here ends with either
// hsum or archsimd.ClearAVXUpperBits before scalar float code runs.
func hsum(v archsimd.Float32x16) float32 {
	var t [16]float32
	v.Store(&t)
	archsimd.ClearAVXUpperBits()
	return sum16(&t)
}

func sum16(t *[16]float32) float32 {
	return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7])) +
		((t[8] + t[9]) + (t[10] + t[11])) + ((t[12] + t[13]) + (t[14] + t[15]))
}

// ---- FP8 ----

// fp8ChunkCols is how many columns of permuted, scaled input the FP8 matvec
// keeps on the stack for rows of up to that many columns; longer rows use
// fp8ChunkColsLarge (multiples of 128). Whole rows stream better than chunks
// of them (wo_b 4096x8192: 9.5 GB/s per core in 4096-column chunks, 12.8
// whole), and the small buffers keep the stack clearing cheap for the rest.
const (
	fp8ChunkCols      = 4096
	fp8ChunkColsLarge = 16384
)

// fp8MatvecAVX512 streams rows [lo,hi) of an FP8 weight with Block 128. Each
// 64 codes are turned into four Float32x16 whose lane j holds column 4j+t
// (t = 0..3); the input is permuted to match and pre-multiplied by each
// block's scale (exact: a power of two), once per 128-row block. Rows are
// read four at a time, a quarter of the block apart, one accumulator each:
// four streams in different pages keep enough reads in flight to approach
// the memory bandwidth (one row at a time reached ~70% of the two-row and
// ~45% of the four-row rate from DRAM).
func fp8MatvecAVX512(w FP8Block, y, x []float32, lo, hi int) {
	// The buffers start on 64-byte boundaries, so that the kernel's 64-byte
	// loads each read one cache line (see mxfp4MatvecAVX512). Each array
	// stays under the compiler's limit for a stack variable (128 KB).
	if w.Cols <= fp8ChunkCols {
		var xp, xs [fp8ChunkCols + 15]float32
		fp8MatvecBuf(w, y, x, lo, hi, alignedTo64(xp[:], fp8ChunkCols), alignedTo64(xs[:], fp8ChunkCols))
		return
	}
	var xp, xs [fp8ChunkColsLarge + 15]float32
	fp8MatvecBuf(w, y, x, lo, hi, alignedTo64(xp[:], fp8ChunkColsLarge), alignedTo64(xs[:], fp8ChunkColsLarge))
}

// fp8MatvecBuf is fp8MatvecAVX512 with buffers for chunks of len(xp)
// columns (len(xs) == len(xp), a multiple of 128).
func fp8MatvecBuf(w FP8Block, y, x []float32, lo, hi int, xp, xs []float32) {
	fp8ChunkCols := len(xp)
	cols := w.Cols
	nbc := ceilDiv(cols, 128)
	cmain := cols &^ 63
	archsimd.ClearAVXUpperBits()
	for i := range y[:hi-lo] {
		y[i] = 0
	}
	for c0 := 0; c0 < cmain; c0 += fp8ChunkCols {
		c1 := min(c0+fp8ChunkCols, cmain)
		n := c1 - c0
		archsimd.ClearAVXUpperBits()
		// Permute: xp[g*64 + t*16 + j] = x[c0 + g*64 + 4j + t].
		for g := 0; g < n; g += 64 {
			src := (*[64]float32)(x[c0+g : c0+g+64])
			dst := (*[64]float32)(xp[g : g+64])
			for j := range 16 {
				dst[j] = src[4*j]
				dst[16+j] = src[4*j+1]
				dst[32+j] = src[4*j+2]
				dst[48+j] = src[4*j+3]
			}
		}
		for r := lo; r < hi; {
			rb := r / 128
			rEnd := min(hi, (rb+1)*128)
			srow := w.Scale[rb*nbc : (rb+1)*nbc]
			for g := 0; g < n; g += 64 {
				s := archsimd.BroadcastUint32x16(e8m0Bits[srow[(c0+g)/128]]).AsFloat32x16()
				src := (*[64]float32)(xp[g : g+64])
				dst := (*[64]float32)(xs[g : g+64])
				archsimd.LoadFloat32x16((*[16]float32)(src[0:16])).Mul(s).Store((*[16]float32)(dst[0:16]))
				archsimd.LoadFloat32x16((*[16]float32)(src[16:32])).Mul(s).Store((*[16]float32)(dst[16:32]))
				archsimd.LoadFloat32x16((*[16]float32)(src[32:48])).Mul(s).Store((*[16]float32)(dst[32:48]))
				archsimd.LoadFloat32x16((*[16]float32)(src[48:64])).Mul(s).Store((*[16]float32)(dst[48:64]))
			}
			archsimd.ClearAVXUpperBits() // Go zeroes acc below with legacy SSE MOVUPS
			// Four rows at a time, a quarter of the block apart: four
			// interleaved streams in different pages keep more memory reads
			// in flight.
			if q := (rEnd - r) / 4; q > 0 {
				// Prefetching runs on into the next row of each stream
				// when rows are read whole; a chunk of a longer row stops
				// short of the next chunk, read only in a later pass.
				npf := n / 64
				if n < cols {
					npf = max(0, (n-fp8Ahead)/64)
				}
				for i := r; i < r+q; i++ {
					var acc [4][16]float32
					o, st := i*cols+c0, q*cols
					q0, q1 := w.Q[o:o+n], w.Q[o+st:o+st+n]
					q2, q3 := w.Q[o+2*st:o+2*st+n], w.Q[o+3*st:o+3*st+n]
					fp8Dot4AVX512(&q0[0], &q1[0], &q2[0], &q3[0], &xs[0], n/64, npf, &acc)
					for k := range 4 {
						y[i+k*q-lo] += sum16(&acc[k])
					}
				}
				r += 4 * q
			}
			half := (rEnd - r) / 2
			for i := r; i < r+half; i++ {
				var a0, a1 fp8Acc2
				j := i + half
				fp8Dot2(w.Q[i*cols+c0:i*cols+c1], w.Q[j*cols+c0:j*cols+c1], xs[:n], &a0, &a1)
				s0, s1 := a0.sum(), a1.sum()
				y[i-lo] += s0
				y[j-lo] += s1
			}
			for r += 2 * half; r < rEnd; r++ {
				var acc fp8Acc
				fp8Dot(w.Q[r*cols+c0:r*cols+c1], xs[:n], &acc)
				y[r-lo] += acc.sum()
			}
		}
	}
	archsimd.ClearAVXUpperBits()
	if cmain < cols {
		for r := lo; r < hi; r++ {
			y[r-lo] += fp8RowScalar(w, r, cmain, cols, x)
		}
	}
}

// fp8Acc carries fp8Dot's four partial-sum vectors between calls.
type fp8Acc struct{ a0, a1, a2, a3 archsimd.Float32x16 }

func (a *fp8Acc) sum() float32 { return hsum(a.a0.Add(a.a1).Add(a.a2.Add(a.a3))) }

// fp8Dot adds Σ e4m3(q)·xs over len(q) (a multiple of 64) codes into acc, xs
// in the permuted order of fp8MatvecAVX512. Logical operations use the signed
// vector types so that the compiler fuses them into VPTERNLOG.
func fp8Dot(q []byte, xs []float32, acc *fp8Acc) {
	th0 := archsimd.LoadUint8x64((*[64]uint8)(fp8Hi[0:64])).AsInt8x64()
	th1 := archsimd.LoadUint8x64((*[64]uint8)(fp8Hi[64:128])).AsInt8x64()
	tl0 := archsimd.LoadUint8x64((*[64]uint8)(fp8Lo[0:64])).AsInt8x64()
	tl1 := archsimd.LoadUint8x64((*[64]uint8)(fp8Lo[64:128])).AsInt8x64()
	sign := archsimd.BroadcastInt8x64(-0x80)
	lo8 := archsimd.BroadcastInt16x32(0x00FF)
	hi8 := archsimd.BroadcastInt16x32(-0x100)
	hi16 := archsimd.BroadcastInt32x16(-0x10000)
	a0, a1, a2, a3 := acc.a0, acc.a1, acc.a2, acc.a3
	xs = xs[:len(q)]
	for i := 0; i+64 <= len(q); i += 64 {
		cu := archsimd.LoadUint8x64((*[64]uint8)(q[i : i+64]))
		c := cu.AsInt8x64()
		xx := (*[64]float32)(xs[i : i+64])
		// bf16 high bytes (with the code's sign) and low bytes, in place.
		h := th0.ConcatPermute(th1, cu).Or(c.And(sign)).AsInt16x32()
		l := tl0.ConcatPermute(tl1, cu).AsInt16x32()
		// Words: e[i] = bf16(code 2i), o[i] = bf16(code 2i+1).
		e := h.ShiftAllLeft(8).Or(l.And(lo8)).AsInt32x16()
		// o = bitselect(hi8: h, else l>>8), written with Xor: go1.26's
		// VPTERNLOG fusion gets AndNot's operand order wrong.
		lsr := l.ShiftAllRight(8)
		o := lsr.Xor(lsr.Xor(h).And(hi8)).AsInt32x16()
		a0 = e.ShiftAllLeft(16).AsFloat32x16().MulAdd(archsimd.LoadFloat32x16((*[16]float32)(xx[0:16])), a0)
		a1 = o.ShiftAllLeft(16).AsFloat32x16().MulAdd(archsimd.LoadFloat32x16((*[16]float32)(xx[16:32])), a1)
		a2 = e.And(hi16).AsFloat32x16().MulAdd(archsimd.LoadFloat32x16((*[16]float32)(xx[32:48])), a2)
		a3 = o.And(hi16).AsFloat32x16().MulAdd(archsimd.LoadFloat32x16((*[16]float32)(xx[48:64])), a3)
	}
	acc.a0, acc.a1, acc.a2, acc.a3 = a0, a1, a2, a3
}

// fp8Acc2 carries fp8Dot2's two partial-sum vectors for one row.
type fp8Acc2 struct{ a, b archsimd.Float32x16 }

func (a *fp8Acc2) sum() float32 { return hsum(a.a.Add(a.b)) }

// fp8Dot2 is fp8Dot for two rows of codes (equal lengths) against the same
// input, adding into acc0 and acc1. (The decode is written out twice: a
// helper function returning vectors is not inlined and costs spills; the
// input is reloaded per row for the same reason: only 15 vector registers.)
func fp8Dot2(q0, q1 []byte, xs []float32, acc0, acc1 *fp8Acc2) {
	th0 := archsimd.LoadUint8x64((*[64]uint8)(fp8Hi[0:64])).AsInt8x64()
	th1 := archsimd.LoadUint8x64((*[64]uint8)(fp8Hi[64:128])).AsInt8x64()
	tl0 := archsimd.LoadUint8x64((*[64]uint8)(fp8Lo[0:64])).AsInt8x64()
	tl1 := archsimd.LoadUint8x64((*[64]uint8)(fp8Lo[64:128])).AsInt8x64()
	sign := archsimd.BroadcastInt8x64(-0x80)
	lo8 := archsimd.BroadcastInt16x32(0x00FF)
	hi8 := archsimd.BroadcastInt16x32(-0x100)
	hi16 := archsimd.BroadcastInt32x16(-0x10000)
	a0, b0, a1, b1 := acc0.a, acc0.b, acc1.a, acc1.b
	q1 = q1[:len(q0)]
	xs = xs[:len(q0)]
	for i := 0; i+64 <= len(q0); i += 64 {
		xx := (*[64]float32)(xs[i : i+64])
		{
			cu := archsimd.LoadUint8x64((*[64]uint8)(q0[i : i+64]))
			c := cu.AsInt8x64()
			h := th0.ConcatPermute(th1, cu).Or(c.And(sign)).AsInt16x32()
			l := tl0.ConcatPermute(tl1, cu).AsInt16x32()
			e := h.ShiftAllLeft(8).Or(l.And(lo8)).AsInt32x16()
			lsr := l.ShiftAllRight(8)
			o := lsr.Xor(lsr.Xor(h).And(hi8)).AsInt32x16()
			a0 = e.ShiftAllLeft(16).AsFloat32x16().MulAdd(archsimd.LoadFloat32x16((*[16]float32)(xx[0:16])), a0)
			b0 = o.ShiftAllLeft(16).AsFloat32x16().MulAdd(archsimd.LoadFloat32x16((*[16]float32)(xx[16:32])), b0)
			a0 = e.And(hi16).AsFloat32x16().MulAdd(archsimd.LoadFloat32x16((*[16]float32)(xx[32:48])), a0)
			b0 = o.And(hi16).AsFloat32x16().MulAdd(archsimd.LoadFloat32x16((*[16]float32)(xx[48:64])), b0)
		}
		{
			cu := archsimd.LoadUint8x64((*[64]uint8)(q1[i : i+64]))
			c := cu.AsInt8x64()
			h := th0.ConcatPermute(th1, cu).Or(c.And(sign)).AsInt16x32()
			l := tl0.ConcatPermute(tl1, cu).AsInt16x32()
			e := h.ShiftAllLeft(8).Or(l.And(lo8)).AsInt32x16()
			lsr := l.ShiftAllRight(8)
			o := lsr.Xor(lsr.Xor(h).And(hi8)).AsInt32x16()
			a1 = e.ShiftAllLeft(16).AsFloat32x16().MulAdd(archsimd.LoadFloat32x16((*[16]float32)(xx[0:16])), a1)
			b1 = o.ShiftAllLeft(16).AsFloat32x16().MulAdd(archsimd.LoadFloat32x16((*[16]float32)(xx[16:32])), b1)
			a1 = e.And(hi16).AsFloat32x16().MulAdd(archsimd.LoadFloat32x16((*[16]float32)(xx[32:48])), a1)
			b1 = o.And(hi16).AsFloat32x16().MulAdd(archsimd.LoadFloat32x16((*[16]float32)(xx[48:64])), b1)
		}
	}
	acc0.a, acc0.b, acc1.a, acc1.b = a0, b0, a1, b1
}

// fp8DecodeAVX512 writes exact weights in natural column order.
func fp8DecodeAVX512(w FP8Block, dst []float32, ld, r0, nr, c0, c1 int) {
	th0 := archsimd.LoadUint8x64((*[64]uint8)(fp8Hi[0:64]))
	th1 := archsimd.LoadUint8x64((*[64]uint8)(fp8Hi[64:128]))
	tl0 := archsimd.LoadUint8x64((*[64]uint8)(fp8Lo[0:64]))
	tl1 := archsimd.LoadUint8x64((*[64]uint8)(fp8Lo[64:128]))
	z0 := archsimd.LoadUint8x64(&fp8Zip0)
	z1 := archsimd.LoadUint8x64(&fp8Zip1)
	sign := archsimd.BroadcastUint8x64(0x80)
	nbc := ceilDiv(w.Cols, 128)
	n := c1 - c0
	nmain := n &^ 63
	for i := range nr {
		r := r0 + i
		q := w.Q[r*w.Cols+c0 : r*w.Cols+c1]
		d := dst[i*ld : i*ld+n]
		srow := w.Scale[(r/128)*nbc : (r/128+1)*nbc]
		for j := 0; j < nmain; j += 64 {
			s := archsimd.BroadcastUint32x16(e8m0Bits[srow[(c0+j)/128]]).AsFloat32x16()
			c := archsimd.LoadUint8x64((*[64]uint8)(q[j : j+64]))
			h := th0.ConcatPermute(th1, c).Or(c.And(sign))
			l := tl0.ConcatPermute(tl1, c)
			wa := l.ConcatPermute(h, z0).AsUint16x32() // bf16 of codes 0..31
			wb := l.ConcatPermute(h, z1).AsUint16x32() // codes 32..63
			dd := (*[64]float32)(d[j : j+64])
			wa.GetLo().ExtendToUint32().ShiftAllLeft(16).AsFloat32x16().Mul(s).Store((*[16]float32)(dd[0:16]))
			wa.GetHi().ExtendToUint32().ShiftAllLeft(16).AsFloat32x16().Mul(s).Store((*[16]float32)(dd[16:32]))
			wb.GetLo().ExtendToUint32().ShiftAllLeft(16).AsFloat32x16().Mul(s).Store((*[16]float32)(dd[32:48]))
			wb.GetHi().ExtendToUint32().ShiftAllLeft(16).AsFloat32x16().Mul(s).Store((*[16]float32)(dd[48:64]))
		}
		archsimd.ClearAVXUpperBits()
		for j := nmain; j < n; j++ {
			d[j] = e4m3Value[q[j]] * e8m0Value[srow[(c0+j)/128]]
		}
	}
}

// ---- MXFP4 ----

// e8m0x16 converts 16 E8M0 bytes to float32 2^(b-127), exactly as
// e8m0Value (b = 0 gives 2^-127, b = 255 NaN). Integer-only: a masked
// broadcast here made the compiler spill a 128-bit temporary and reload it
// with a legacy SSE MOVUPS inside the kernels' loops (see the file comment).
func e8m0x16(s *[16]uint8) archsimd.Float32x16 {
	b := archsimd.LoadUint8x16(s).ExtendToUint32().AsInt32x16()
	// b = 0 and b = 255 need mantissa bit 22 (2^-127 is subnormal; 255 is
	// NaN): t = ((b+1)&0xFE) - 1 is negative exactly for those.
	t := b.Add(archsimd.BroadcastInt32x16(1)).And(archsimd.BroadcastInt32x16(0xFE)).Sub(archsimd.BroadcastInt32x16(1))
	edge := t.ShiftAllRight(31).And(archsimd.BroadcastInt32x16(1 << 22))
	return b.ShiftAllLeft(23).Or(edge).AsFloat32x16()
}

// mxfp4DecodeAVX512 writes exact weights in natural column order (c0, c1
// multiples of 32).
func mxfp4DecodeAVX512(w MXFP4, dst []float32, ld, r0, nr, c0, c1 int) {
	tab := archsimd.LoadFloat32x16(&e2m1Value)
	z0 := archsimd.LoadUint32x16(&mxZip0)
	z1 := archsimd.LoadUint32x16(&mxZip1)
	n := c1 - c0
	for i := range nr {
		r := r0 + i
		p := w.Packed[(r*w.Cols+c0)/2 : (r*w.Cols+c1)/2]
		s := w.Scale[(r*w.Cols+c0)/32 : (r*w.Cols+c1)/32]
		d := dst[i*ld : i*ld+n]
		for j := 0; j+32 <= n; j += 32 {
			ts := tab.Mul(archsimd.BroadcastUint32x16(e8m0Bits[s[j/32]]).AsFloat32x16())
			v := archsimd.LoadUint8x16((*[16]uint8)(p[j/2 : j/2+16])).ExtendToUint32()
			ev := ts.Permute(v)
			od := ts.Permute(v.AsInt32x16().ShiftAllRight(4).AsUint32x16())
			dd := (*[32]float32)(d[j : j+32])
			ev.ConcatPermute(od, z0).Store((*[16]float32)(dd[0:16]))
			ev.ConcatPermute(od, z1).Store((*[16]float32)(dd[16:32]))
		}
	}
	archsimd.ClearAVXUpperBits()
}

// ---- BF16 and F32 ----

func bf16MatvecAVX512(w BF16, y, x []float32, lo, hi int) {
	n := w.Cols
	nmain := n &^ 63
	r := lo
	// Four rows at a time, a quarter of the range (at most bf16Quad rows)
	// apart: four streams in different pages keep more reads in flight.
	for nmain > 0 {
		q := min(bf16Quad, (hi-r)/4)
		if q == 0 {
			break
		}
		for i := r; i < r+q; i++ {
			var acc [4]float32
			bf16Dot4(w.W, 2*i*n, 2*q*n, nmain, x[:nmain], &acc)
			for k := range 4 {
				rr := i + k*q
				a := acc[k]
				if nmain < n {
					a += dotBF16(w.W[2*(rr*n+nmain):2*(rr+1)*n], x[nmain:n])
				}
				y[rr-lo] = a
			}
		}
		r += 4 * q
	}
	for ; r < hi; r++ {
		row := w.W[2*r*n : 2*(r+1)*n]
		var a0, a1, a2, a3 archsimd.Float32x16
		for c := 0; c < nmain; c += 64 {
			b := (*[128]byte)(row[2*c : 2*c+128])
			xx := (*[64]float32)(x[c : c+64])
			a0 = bf16x16((*[32]byte)(b[0:32])).MulAdd(archsimd.LoadFloat32x16((*[16]float32)(xx[0:16])), a0)
			a1 = bf16x16((*[32]byte)(b[32:64])).MulAdd(archsimd.LoadFloat32x16((*[16]float32)(xx[16:32])), a1)
			a2 = bf16x16((*[32]byte)(b[64:96])).MulAdd(archsimd.LoadFloat32x16((*[16]float32)(xx[32:48])), a2)
			a3 = bf16x16((*[32]byte)(b[96:128])).MulAdd(archsimd.LoadFloat32x16((*[16]float32)(xx[48:64])), a3)
		}
		acc := hsum(a0.Add(a1).Add(a2.Add(a3)))
		if nmain < n {
			acc += dotBF16(row[2*nmain:], x[nmain:n])
		}
		y[r-lo] = acc
	}
}

// bf16Quad is the largest row distance between the BF16 matvec's streams.
const bf16Quad = 64

// bf16Dot4 sets acc[k] = Σ_{j<n} bf16(w[off+k*stride+2j:])·x[j] for k < 4
// (n a multiple of 64; off, stride in bytes), one accumulator per row, with
// the assembly loop (which prefetches each row ahead).
func bf16Dot4(w []byte, off, stride, n int, x []float32, acc *[4]float32) {
	if n < 64 {
		*acc = [4]float32{}
		return
	}
	w0 := w[off : off+2*n]
	w1 := w[off+stride : off+stride+2*n]
	w2 := w[off+2*stride : off+2*stride+2*n]
	w3 := w[off+3*stride : off+3*stride+2*n]
	var t [4][16]float32
	bf16Dot4AVX512(&w0[0], &w1[0], &w2[0], &w3[0], &x[:n][0], n/64, &t)
	for k := range 4 {
		acc[k] = sum16(&t[k])
	}
}

// bf16x16 widens 16 little-endian bfloat16 values.
func bf16x16(b *[32]byte) archsimd.Float32x16 {
	return archsimd.LoadUint8x32(b).AsUint16x16().ExtendToUint32().ShiftAllLeft(16).AsFloat32x16()
}

func bf16DecodeAVX512(w BF16, dst []float32, ld, r0, nr, c0, c1 int) {
	n := c1 - c0
	nmain := n &^ 15
	for i := range nr {
		r := r0 + i
		src := w.W[2*(r*w.Cols+c0) : 2*(r*w.Cols+c1)]
		d := dst[i*ld : i*ld+n]
		for j := 0; j < nmain; j += 16 {
			bf16x16((*[32]byte)(src[2*j : 2*j+32])).Store((*[16]float32)(d[j : j+16]))
		}
		archsimd.ClearAVXUpperBits()
		for j := nmain; j < n; j++ {
			d[j] = bf16ToFloat32(uint16(src[2*j]) | uint16(src[2*j+1])<<8)
		}
	}
}

func dotF32AVX512(a, b []float32) float32 {
	b = b[:len(a)]
	n := len(a) &^ 63
	var a0, a1, a2, a3 archsimd.Float32x16
	for i := 0; i < n; i += 64 {
		aa := (*[64]float32)(a[i : i+64])
		bb := (*[64]float32)(b[i : i+64])
		a0 = archsimd.LoadFloat32x16((*[16]float32)(aa[0:16])).MulAdd(archsimd.LoadFloat32x16((*[16]float32)(bb[0:16])), a0)
		a1 = archsimd.LoadFloat32x16((*[16]float32)(aa[16:32])).MulAdd(archsimd.LoadFloat32x16((*[16]float32)(bb[16:32])), a1)
		a2 = archsimd.LoadFloat32x16((*[16]float32)(aa[32:48])).MulAdd(archsimd.LoadFloat32x16((*[16]float32)(bb[32:48])), a2)
		a3 = archsimd.LoadFloat32x16((*[16]float32)(aa[48:64])).MulAdd(archsimd.LoadFloat32x16((*[16]float32)(bb[48:64])), a3)
	}
	return hsum(a0.Add(a1).Add(a2.Add(a3))) + dotF32(a[n:], b[n:])
}

// ---- batch > 1 ----

// gemmTile adds, for i < tileRows and b < batch, Σ_{j<n} w[i*tileCols+j]·
// x[b*ldx+j] into the 16 lanes of acc[(i*batch+b)*16:].
func gemmTile(w *[tileRows * tileCols]float32, n int, x []float32, ldx, batch int, acc []float32) {
	if !hasAVX512 {
		gemmTileScalar(w, n, x, ldx, batch, acc)
		return
	}
	n16 := n &^ 15
	b := 0
	for ; b+2 <= batch; b += 2 {
		gemm4x2(w, n16, x[b*ldx:], ldx, acc, batch, b)
	}
	for ; b < batch; b++ {
		gemm4x1(w, n16, x[b*ldx:], acc, batch, b)
	}
	archsimd.ClearAVXUpperBits()
	if n16 < n {
		for i := range tileRows {
			wr := w[i*tileCols+n16 : i*tileCols+n]
			for b := range batch {
				acc[(i*batch+b)*16] += dotF32(wr, x[b*ldx+n16:b*ldx+n])
			}
		}
	}
}

func accAt(acc []float32, batch, i, b int) *[16]float32 {
	k := (i*batch + b) * 16
	return (*[16]float32)(acc[k : k+16])
}

// gemm4x2 is the register tile: 4 weight rows x 2 batch rows = 8
// accumulators, 4 weight vectors and 1 input vector (Go allocates only 15
// vector registers, so a 4x4 tile would spill).
func gemm4x2(w *[tileRows * tileCols]float32, n int, x []float32, ldx int, acc []float32, batch, b0 int) {
	x0, x1 := x[:n], x[ldx:ldx+n]
	w0, w1, w2, w3 := w[0:n], w[tileCols:tileCols+n], w[2*tileCols:2*tileCols+n], w[3*tileCols:3*tileCols+n]
	c00, c01 := archsimd.LoadFloat32x16(accAt(acc, batch, 0, b0)), archsimd.LoadFloat32x16(accAt(acc, batch, 0, b0+1))
	c10, c11 := archsimd.LoadFloat32x16(accAt(acc, batch, 1, b0)), archsimd.LoadFloat32x16(accAt(acc, batch, 1, b0+1))
	c20, c21 := archsimd.LoadFloat32x16(accAt(acc, batch, 2, b0)), archsimd.LoadFloat32x16(accAt(acc, batch, 2, b0+1))
	c30, c31 := archsimd.LoadFloat32x16(accAt(acc, batch, 3, b0)), archsimd.LoadFloat32x16(accAt(acc, batch, 3, b0+1))
	for j := 0; j < n; j += 16 {
		v0 := archsimd.LoadFloat32x16((*[16]float32)(w0[j : j+16]))
		v1 := archsimd.LoadFloat32x16((*[16]float32)(w1[j : j+16]))
		v2 := archsimd.LoadFloat32x16((*[16]float32)(w2[j : j+16]))
		v3 := archsimd.LoadFloat32x16((*[16]float32)(w3[j : j+16]))
		u := archsimd.LoadFloat32x16((*[16]float32)(x0[j : j+16]))
		c00, c10, c20, c30 = v0.MulAdd(u, c00), v1.MulAdd(u, c10), v2.MulAdd(u, c20), v3.MulAdd(u, c30)
		u = archsimd.LoadFloat32x16((*[16]float32)(x1[j : j+16]))
		c01, c11, c21, c31 = v0.MulAdd(u, c01), v1.MulAdd(u, c11), v2.MulAdd(u, c21), v3.MulAdd(u, c31)
	}
	c00.Store(accAt(acc, batch, 0, b0))
	c01.Store(accAt(acc, batch, 0, b0+1))
	c10.Store(accAt(acc, batch, 1, b0))
	c11.Store(accAt(acc, batch, 1, b0+1))
	c20.Store(accAt(acc, batch, 2, b0))
	c21.Store(accAt(acc, batch, 2, b0+1))
	c30.Store(accAt(acc, batch, 3, b0))
	c31.Store(accAt(acc, batch, 3, b0+1))
}

func gemm4x1(w *[tileRows * tileCols]float32, n int, x []float32, acc []float32, batch, b int) {
	x0 := x[:n]
	w0, w1, w2, w3 := w[0:n], w[tileCols:tileCols+n], w[2*tileCols:2*tileCols+n], w[3*tileCols:3*tileCols+n]
	c0 := archsimd.LoadFloat32x16(accAt(acc, batch, 0, b))
	c1 := archsimd.LoadFloat32x16(accAt(acc, batch, 1, b))
	c2 := archsimd.LoadFloat32x16(accAt(acc, batch, 2, b))
	c3 := archsimd.LoadFloat32x16(accAt(acc, batch, 3, b))
	for j := 0; j < n; j += 16 {
		u := archsimd.LoadFloat32x16((*[16]float32)(x0[j : j+16]))
		c0 = archsimd.LoadFloat32x16((*[16]float32)(w0[j:j+16])).MulAdd(u, c0)
		c1 = archsimd.LoadFloat32x16((*[16]float32)(w1[j:j+16])).MulAdd(u, c1)
		c2 = archsimd.LoadFloat32x16((*[16]float32)(w2[j:j+16])).MulAdd(u, c2)
		c3 = archsimd.LoadFloat32x16((*[16]float32)(w3[j:j+16])).MulAdd(u, c3)
	}
	c0.Store(accAt(acc, batch, 0, b))
	c1.Store(accAt(acc, batch, 1, b))
	c2.Store(accAt(acc, batch, 2, b))
	c3.Store(accAt(acc, batch, 3, b))
}
