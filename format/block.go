package format

import (
	"fmt"
	"math"
)

// Block-scaled weight layouts. All tensors are row-major [rows, cols] with
// rows = output features and cols = input features.
//
//   FP8-block: q [rows, cols] E4M3fn bytes, scale [ceil(rows/B), ceil(cols/B)] E8M0;
//              W[r,c] = e4m3(q[r,c]) · e8m0(scale[r/B, c/B]).
//   MXFP8:     q [rows, cols] E4M3fn bytes, scale [rows, cols/32] E8M0;
//              W[r,c] = e4m3(q[r,c]) · e8m0(scale[r, c/32]).
//   MXFP4:     packed [rows, cols/2] (low nibble = even column), scale [rows, cols/32]
//              E8M0; W[r,c] = e2m1(code[r,c]) · e8m0(scale[r, c/32]).
//
// The Quantize* functions take sizes that the caller guarantees: len(w) == rows*cols,
// rows, cols >= 0, block > 0, and cols%32 == 0 for the MX formats. A violation is a
// programmer error and panics with a message naming the function and the sizes.
// The Dequant* functions validate every size and return an error instead.

// MXGroup is the number of consecutive row elements sharing one E8M0 scale in the
// MX formats (OCP MX block size).
const MXGroup = 32

// scaleExponent returns the smallest e with amax / 2^e <= limit, where limit =
// limFrac·2^limExp with limFrac in [0.5, 1), clamped to E8M0's [-127, 127]. amax = 0
// (an all-zero group) gives exponent 0. NaN amax never occurs (callers skip NaN).
func scaleExponent(amax float32, limFrac float64, limExp int) int {
	if amax == 0 {
		return 0
	}
	if math.IsInf(float64(amax), 0) {
		return 127
	}
	fr, ex := math.Frexp(float64(amax)) // amax = fr·2^ex, fr in [0.5, 1)
	// amax <= limFrac·2^(limExp+e)  <=>  e >= ex - limExp when fr <= limFrac, else ex - limExp + 1.
	e := ex - limExp
	if fr > limFrac {
		e++
	}
	return max(-127, min(127, e))
}

// absMax returns the largest |x| over v, ignoring NaN.
func absMax(v []float32) float32 {
	var m float32
	for _, x := range v {
		a := float32(math.Abs(float64(x)))
		if a > m {
			m = a
		}
	}
	return m
}

// pow2 returns 2^e as a float32 for e in [-127, 127] (2^-127 is subnormal, exact).
func pow2(e int) float32 { return E8M0ToFloat32(byte(e + 127)) }

// e4m3Lim: 448 = 0.875·2^9. e2m1Lim: 6 = 0.75·2^3.
const (
	e4m3LimFrac, e4m3LimExp = 0.875, 9
	e2m1LimFrac, e2m1LimExp = 0.75, 3
)

// validShape reports whether rows, cols >= 0 and rows*cols does not overflow int.
func validShape(rows, cols int) bool {
	return rows >= 0 && cols >= 0 && (cols == 0 || rows <= math.MaxInt/cols)
}

func checkQuantArgs(fn string, n, rows, cols int) {
	if !validShape(rows, cols) || n != rows*cols {
		panic(fmt.Sprintf("format.%s: len(w)=%d rows=%d cols=%d, want len(w)=rows*cols with rows, cols >= 0", fn, n, rows, cols))
	}
}

// ScalesFP8Block returns only the E8M0 scales QuantizeFP8Block would give w
// (same rule, same layout), without encoding the elements. Same preconditions.
func ScalesFP8Block(w []float32, rows, cols, block int) []byte {
	checkQuantArgs("ScalesFP8Block", len(w), rows, cols)
	if block <= 0 {
		panic(fmt.Sprintf("format.ScalesFP8Block: block=%d, want > 0", block))
	}
	rb, cb := (rows+block-1)/block, (cols+block-1)/block
	scale := make([]byte, rb*cb)
	for bi := 0; bi < rb; bi++ {
		r0, r1 := bi*block, min(bi*block+block, rows)
		for bj := 0; bj < cb; bj++ {
			c0, c1 := bj*block, min(bj*block+block, cols)
			var amax float32
			for r := r0; r < r1; r++ {
				amax = max(amax, absMax(w[r*cols+c0:r*cols+c1]))
			}
			scale[bi*cb+bj] = byte(scaleExponent(amax, e4m3LimFrac, e4m3LimExp) + 127)
		}
	}
	return scale
}

// QuantizeFP8Block quantizes w [rows, cols] to FP8 E4M3fn with one E8M0 scale per
// block×block tile (partial tiles at the right and bottom edges). Each tile's scale
// is the smallest power of two 2^e with amax/2^e <= 448 (amax over the tile, NaN
// ignored; an all-zero tile gets 2^0, byte 127; e is clamped to [-127, 127]), and
// q = Float32ToE4M3(w/2^e). Returns fresh slices q [rows*cols] and scale
// [ceil(rows/block) * ceil(cols/block)] (row-major). Panics if len(w) != rows*cols,
// rows or cols < 0, or block <= 0.
func QuantizeFP8Block(w []float32, rows, cols, block int) (q, scale []byte) {
	checkQuantArgs("QuantizeFP8Block", len(w), rows, cols)
	if block <= 0 {
		panic(fmt.Sprintf("format.QuantizeFP8Block: block=%d, want > 0", block))
	}
	rb, cb := (rows+block-1)/block, (cols+block-1)/block
	q = make([]byte, rows*cols)
	scale = ScalesFP8Block(w, rows, cols, block)
	for bi := 0; bi < rb; bi++ {
		r0, r1 := bi*block, min(bi*block+block, rows)
		for bj := 0; bj < cb; bj++ {
			c0, c1 := bj*block, min(bj*block+block, cols)
			inv := pow2(127 - int(scale[bi*cb+bj]))
			for r := r0; r < r1; r++ {
				for c := c0; c < c1; c++ {
					q[r*cols+c] = Float32ToE4M3(w[r*cols+c] * inv)
				}
			}
		}
	}
	return q, scale
}

// DequantFP8Block expands an FP8-block tensor to float32 [rows*cols] (fresh slice).
// It returns an error if rows, cols < 0, block <= 0, len(q) != rows*cols or
// len(scale) != ceil(rows/block)*ceil(cols/block).
func DequantFP8Block(q, scale []byte, rows, cols, block int) ([]float32, error) {
	if !validShape(rows, cols) || block <= 0 {
		return nil, fmt.Errorf("format.DequantFP8Block: bad shape rows=%d cols=%d block=%d", rows, cols, block)
	}
	if len(q) != rows*cols {
		return nil, fmt.Errorf("format.DequantFP8Block: len(q)=%d, want rows*cols=%d*%d=%d", len(q), rows, cols, rows*cols)
	}
	rb, cb := (rows+block-1)/block, (cols+block-1)/block
	if len(scale) != rb*cb {
		return nil, fmt.Errorf("format.DequantFP8Block: len(scale)=%d, want ceil(%d/%d)*ceil(%d/%d)=%d", len(scale), rows, block, cols, block, rb*cb)
	}
	out := make([]float32, rows*cols)
	for r := 0; r < rows; r++ {
		o := r * cols
		bi := r / block
		DecodeFP8BlockRow(out[o:o+cols], q[o:o+cols], scale[bi*cb:bi*cb+cb], block)
	}
	return out, nil
}

func checkMXQuantArgs(fn string, n, rows, cols int) {
	checkQuantArgs(fn, n, rows, cols)
	if cols%MXGroup != 0 {
		panic(fmt.Sprintf("format.%s: cols=%d, want a multiple of %d", fn, cols, MXGroup))
	}
}

// QuantizeMXFP8 quantizes w [rows, cols] to MXFP8: E4M3fn elements with one E8M0
// scale per 32 consecutive elements of a row, the smallest 2^e with amax/2^e <= 448
// (same rules as QuantizeFP8Block). Returns fresh q [rows*cols] and scale
// [rows*cols/32]. Panics unless len(w) == rows*cols, rows, cols >= 0 and cols%32 == 0.
func QuantizeMXFP8(w []float32, rows, cols int) (q, scale []byte) {
	checkMXQuantArgs("QuantizeMXFP8", len(w), rows, cols)
	q = make([]byte, rows*cols)
	scale = make([]byte, rows*cols/MXGroup)
	for g := range scale {
		src := w[g*MXGroup : g*MXGroup+MXGroup]
		e := scaleExponent(absMax(src), e4m3LimFrac, e4m3LimExp)
		scale[g] = byte(e + 127)
		inv := pow2(-e)
		dst := q[g*MXGroup : g*MXGroup+MXGroup]
		for i, x := range src {
			dst[i] = Float32ToE4M3(x * inv)
		}
	}
	return q, scale
}

// DequantMXFP8 expands an MXFP8 tensor to float32 [rows*cols] (fresh slice). It
// returns an error unless rows, cols >= 0 (product within int), cols%32 == 0,
// len(q) == rows*cols and
// len(scale) == rows*cols/32.
func DequantMXFP8(q, scale []byte, rows, cols int) ([]float32, error) {
	if !validShape(rows, cols) || cols%MXGroup != 0 {
		return nil, fmt.Errorf("format.DequantMXFP8: bad shape rows=%d cols=%d (rows, cols >= 0, rows*cols within int, cols a multiple of %d)", rows, cols, MXGroup)
	}
	if len(q) != rows*cols {
		return nil, fmt.Errorf("format.DequantMXFP8: len(q)=%d, want rows*cols=%d", len(q), rows*cols)
	}
	if len(scale) != rows*cols/MXGroup {
		return nil, fmt.Errorf("format.DequantMXFP8: len(scale)=%d, want rows*cols/32=%d", len(scale), rows*cols/MXGroup)
	}
	out := make([]float32, rows*cols)
	sc := cols / MXGroup
	for r := 0; r < rows; r++ {
		DecodeMXFP8Row(out[r*cols:r*cols+cols], q[r*cols:r*cols+cols], scale[r*sc:r*sc+sc])
	}
	return out, nil
}

// ScalesMXFP4 returns only the E8M0 scales QuantizeMXFP4 would give w (same
// rule, same layout), without encoding the elements. Same preconditions.
func ScalesMXFP4(w []float32, rows, cols int) []byte {
	checkMXQuantArgs("ScalesMXFP4", len(w), rows, cols)
	scale := make([]byte, rows*cols/MXGroup)
	for g := range scale {
		scale[g] = byte(scaleExponent(absMax(w[g*MXGroup:g*MXGroup+MXGroup]), e2m1LimFrac, e2m1LimExp) + 127)
	}
	return scale
}

// QuantizeMXFP4 quantizes w [rows, cols] to MXFP4: E2M1 codes packed two per byte
// (low nibble = even column), one E8M0 scale per 32 consecutive elements of a row,
// the smallest 2^e with amax/2^e <= 6 (amax over the group, NaN ignored; an all-zero
// group gets 2^0; e clamped to [-127, 127]); codes = Float32ToE2M1(w/2^e). Returns
// fresh packed [rows*cols/2] and scale [rows*cols/32]. Panics unless
// len(w) == rows*cols, rows, cols >= 0 and cols%32 == 0.
func QuantizeMXFP4(w []float32, rows, cols int) (packed, scale []byte) {
	checkMXQuantArgs("QuantizeMXFP4", len(w), rows, cols)
	packed = make([]byte, rows*cols/2)
	scale = ScalesMXFP4(w, rows, cols)
	for g := range scale {
		src := w[g*MXGroup : g*MXGroup+MXGroup]
		inv := pow2(127 - int(scale[g]))
		dst := packed[g*MXGroup/2 : g*MXGroup/2+MXGroup/2]
		for i := range dst {
			dst[i] = Float32ToE2M1(src[2*i]*inv) | Float32ToE2M1(src[2*i+1]*inv)<<4
		}
	}
	return packed, scale
}

// DequantMXFP4 expands an MXFP4 tensor to float32 [rows*cols] (fresh slice). It
// returns an error unless rows, cols >= 0 (product within int), cols%32 == 0,
// len(packed) == rows*cols/2
// and len(scale) == rows*cols/32.
func DequantMXFP4(packed, scale []byte, rows, cols int) ([]float32, error) {
	if !validShape(rows, cols) || cols%MXGroup != 0 {
		return nil, fmt.Errorf("format.DequantMXFP4: bad shape rows=%d cols=%d (rows, cols >= 0, rows*cols within int, cols a multiple of %d)", rows, cols, MXGroup)
	}
	if len(packed) != rows*cols/2 {
		return nil, fmt.Errorf("format.DequantMXFP4: len(packed)=%d, want rows*cols/2=%d", len(packed), rows*cols/2)
	}
	if len(scale) != rows*cols/MXGroup {
		return nil, fmt.Errorf("format.DequantMXFP4: len(scale)=%d, want rows*cols/32=%d", len(scale), rows*cols/MXGroup)
	}
	out := make([]float32, rows*cols)
	sc, pc := cols/MXGroup, cols/2
	for r := 0; r < rows; r++ {
		DecodeMXFP4Row(out[r*cols:r*cols+cols], packed[r*pc:r*pc+pc], scale[r*sc:r*sc+sc])
	}
	return out, nil
}
