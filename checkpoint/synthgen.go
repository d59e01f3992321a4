package checkpoint

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"

	"moxie/format"
)

// Fused generate-and-quantize loops for Synth. They draw the same PCG outputs in
// the same order as rand.Rand.Float64 on the same generator and map them to the
// same float32 values, then quantize with the same block maxima, scales and
// rounding as format's quantizers; TestSynthHashes holds them to the bytes the
// straightforward version (uniform values for the whole tensor, then format's
// Quantize*) produced.

// uniformGen draws values uniformly in [-a, a) exactly as
// float32((rand.New(p).Float64()*2 - 1) * a) does for the *rand.PCG p it starts
// from. It steps the same 128-bit PCG (LCG state·mul + inc, DXSM output) with its
// state in registers, where calls through *rand.PCG keep it in memory. Float64
// is m/2^53 with m the low 53 bits of a draw, so 2·m/2^53 - 1 = (m - 2^52)·2^-52
// exactly, and the one float64 rounding of the product with a is the same as of
// (m - 2^52)·(a·2^-52) (a power-of-two scaling is exact).
type uniformGen struct {
	hi, lo uint64  // PCG state
	k      float64 // a·2^-52
}

// PCG's 128-bit LCG multiplier and increment and its DXSM output multiplier, as
// math/rand/v2 uses them.
const (
	pcgMulHi, pcgMulLo = 2549297995355413924, 4865540595714422341
	pcgIncHi, pcgIncLo = 6364136223846793005, 1442695040888963407
	pcgCheapMul        = 0xda942042e4dd58b5
)

// newUniformGen starts from p's current state (p is not advanced).
func newUniformGen(p *rand.PCG, a float64) uniformGen {
	st, err := p.MarshalBinary() // "pcg:" hi lo, big-endian
	if err != nil || len(st) != 20 {
		panic(fmt.Sprintf("synth: unexpected PCG state %q (%v)", st, err))
	}
	return uniformGen{hi: binary.BigEndian.Uint64(st[4:]), lo: binary.BigEndian.Uint64(st[12:]), k: a * (1.0 / (1 << 52))}
}

// fill writes the next len(dst) values to dst, in order.
func (g *uniformGen) fill(dst []float32) {
	hi, lo, k := g.hi, g.lo, g.k
	for i := range dst {
		// state = state·mul + inc (mod 2^128)
		h, l := bits.Mul64(lo, pcgMulLo)
		h += hi*pcgMulLo + lo*pcgMulHi
		var c uint64
		lo, c = bits.Add64(l, pcgIncLo, 0)
		hi, _ = bits.Add64(h, pcgIncHi, c)
		// DXSM output
		x := hi ^ hi>>32
		x *= pcgCheapMul
		x ^= x >> 48
		x *= lo | 1
		m := int64(x & (1<<53 - 1))
		dst[i] = float32(float64(m-1<<52) * k)
	}
	g.hi, g.lo = hi, lo
}

// absBits is |x| as ordered bits: for non-NaN values a larger magnitude gives a
// larger result, so a maximum over absBits is format's absMax (no NaN is drawn).
func absBits(x float32) uint32 { return math.Float32bits(x) & 0x7fffffff }

// scaleExp is format's scaleExponent for amax given as absBits: the smallest e
// with amax/2^e <= limFrac·2^limExp, clamped to [-127, 127], 0 for amax = 0.
// fracBits is limFrac's mantissa threshold: a normal amax = 1.m·2^(E-127) has
// frexp fraction 1.m/2 > limFrac exactly when its mantissa bits exceed fracBits.
func scaleExp(amax uint32, limFrac float64, limExp int, fracBits uint32) int {
	if amax == 0 {
		return 0
	}
	exp := int(amax >> 23)
	if exp == 0 || exp == 255 { // subnormal or Inf: the general rule
		if exp == 255 {
			return 127
		}
		fr, ex := math.Frexp(float64(math.Float32frombits(amax)))
		e := ex - limExp
		if fr > limFrac {
			e++
		}
		return max(-127, min(127, e))
	}
	e := exp - 126 - limExp // frexp exponent of 1.m·2^(exp-127) is exp-126
	if amax&0x7fffff > fracBits {
		e++
	}
	return max(-127, min(127, e))
}

// e4m3Exp and e2m1Exp are scaleExp for E4M3 (limit 448 = 0.875·2^9) and E2M1
// (limit 6 = 0.75·2^3): 1.m/2 > 0.875 iff m > 0.75·2^23, > 0.75 iff m > 0.5·2^23.
func e4m3Exp(amax uint32) int { return scaleExp(amax, 0.875, 9, 0x600000) }
func e2m1Exp(amax uint32) int { return scaleExp(amax, 0.75, 3, 0x400000) }

// invPow2 is 2^-e as format's quantizers compute it.
func invPow2(e int) float32 { return format.E8M0ToFloat32(byte(127 - e)) }

// toE4M3Slow is format.Float32ToE4M3, for the values e4m3Codes does not round
// itself.
//
//go:noinline
func toE4M3Slow(f float32) byte { return format.Float32ToE4M3(f) }

// e4m3Codes sets dst[i] = format.Float32ToE4M3(src[i]*inv). The common case
// (E4M3 normal range, below 448) is rounded without branches: adding 0x7ffff
// plus the kept lowest bit carries into bit 20 exactly when the dropped 20 bits
// exceed half, or equal it with the kept bit odd (ties to even), and a carry
// into the exponent gives the right code.
func e4m3Codes(dst []byte, src []float32, inv float32) {
	dst = dst[:len(src)]
	for i, x := range src {
		b := math.Float32bits(x * inv)
		a := b & 0x7fffffff
		if a-0x3c800000 < 0x43e00000-0x3c800000 { // 2^-6 <= |f| < 448
			dst[i] = byte(b>>24)&0x80 | byte((a+0x7ffff+(a>>20)&1)>>20-(120<<3))
		} else {
			dst[i] = toE4M3Slow(x * inv)
		}
	}
}

// e2m1Pack sets dst[i] to the E2M1 codes of v[2i]*inv (low nibble) and
// v[2i+1]*inv (high nibble), as format.Float32ToE2M1 rounds them, for v without
// NaN and inv such that every |v[i]*inv| <= 6. From 1 up the E2M1 grid is a
// float with one mantissa bit and the code is the float's bits above bit 22
// (exponent and that mantissa bit, less 127-1 twice), rounded to nearest even
// by adding 0x1fffff plus the kept lowest bit; below 1 the code counts the
// thresholds 0.25 (strict: ties go to code 0) and 0.75 (ties go to code 2).
func e2m1Pack(dst []byte, v *[format.MXGroup]float32, inv float32) {
	dst = dst[:format.MXGroup/2]
	var c [format.MXGroup]uint32
	for i, x := range v {
		b := math.Float32bits(x * inv)
		a := b & 0x7fffffff
		code := (a+0x1fffff+(a>>22)&1)>>22 - 252
		// Below 1 (branch-free: the sign bit of a difference is a comparison,
		// a in [0, 2^31)): 1 if a > 0.25, plus 1 if a >= 0.75.
		small := (0x3e800000-a)>>31 + (0x3f3fffff-a)>>31
		m := uint32(int32(a-0x3f800000) >> 31) // all ones if a < 1
		code = code&^m | small&m
		c[i] = b>>28&8 | code
	}
	for i := range dst {
		dst[i] = byte(c[2*i] | c[2*i+1]<<4)
	}
}

// genFP8Block draws rows×cols values and returns format.QuantizeFP8Block's codes
// (nil if scalesOnly) and scales for them.
func genFP8Block(g *uniformGen, rows, cols, block int, scalesOnly bool) (q, scale []byte) {
	rb, cb := (rows+block-1)/block, (cols+block-1)/block
	scale = make([]byte, rb*cb)
	if !scalesOnly {
		q = make([]byte, rows*cols)
	}
	band := make([]float32, min(block, rows)*cols)
	amax := make([]uint32, cb)
	for bi := range rb {
		r0, r1 := bi*block, min(bi*block+block, rows)
		w := band[:(r1-r0)*cols]
		clear(amax)
		for r := range r1 - r0 {
			row := w[r*cols : r*cols+cols]
			g.fill(row)
			for bj := range cb {
				m := amax[bj]
				for _, x := range row[bj*block : min(bj*block+block, cols)] {
					m = max(m, absBits(x))
				}
				amax[bj] = m
			}
		}
		sc := scale[bi*cb : bi*cb+cb]
		for bj, m := range amax {
			sc[bj] = byte(e4m3Exp(m) + 127)
		}
		if scalesOnly {
			continue
		}
		for bj := range cb {
			inv := invPow2(int(sc[bj]) - 127)
			c0, c1 := bj*block, min(bj*block+block, cols)
			for r := range r1 - r0 {
				e4m3Codes(q[(r0+r)*cols+c0:(r0+r)*cols+c1], w[r*cols+c0:r*cols+c1], inv)
			}
		}
	}
	return q, scale
}

// genMXFP8 draws rows×cols values (cols a multiple of 32) and returns
// format.QuantizeMXFP8's codes (nil if scalesOnly) and scales for them.
func genMXFP8(g *uniformGen, rows, cols int, scalesOnly bool) (q, scale []byte) {
	n := rows * cols
	scale = make([]byte, n/format.MXGroup)
	if !scalesOnly {
		q = make([]byte, n)
	}
	var v [format.MXGroup]float32
	for gi := range scale {
		g.fill(v[:])
		var m uint32
		for _, x := range v {
			m = max(m, absBits(x))
		}
		e := e4m3Exp(m)
		scale[gi] = byte(e + 127)
		if scalesOnly {
			continue
		}
		inv := invPow2(e)
		e4m3Codes(q[gi*format.MXGroup:gi*format.MXGroup+format.MXGroup], v[:], inv)
	}
	return q, scale
}

// genMXFP4 draws rows×cols values (cols a multiple of 32) and returns
// format.QuantizeMXFP4's packed codes (nil if scalesOnly) and scales for them.
func genMXFP4(g *uniformGen, rows, cols int, scalesOnly bool) (packed, scale []byte) {
	n := rows * cols
	scale = make([]byte, n/format.MXGroup)
	if !scalesOnly {
		packed = make([]byte, n/2)
	}
	var v [format.MXGroup]float32
	for gi := range scale {
		g.fill(v[:])
		var m uint32
		for _, x := range v {
			m = max(m, absBits(x))
		}
		e := e2m1Exp(m)
		scale[gi] = byte(e + 127)
		if scalesOnly {
			continue
		}
		inv := invPow2(e)
		e2m1Pack(packed[gi*format.MXGroup/2:], &v, inv)
	}
	return packed, scale
}

// genPlain draws n values, adds off to each (in float32, as v[i] += off did; off
// = 0 adds nothing) and stores them as BF16 or F32 little-endian.
func genPlain(g *uniformGen, n int, off float32, dt format.DType) []byte {
	out := make([]byte, n*dt.Size())
	var v [256]float32
	for i0 := 0; i0 < n; i0 += len(v) {
		c := v[:min(len(v), n-i0)]
		g.fill(c)
		if off != 0 {
			for i := range c {
				c[i] += off
			}
		}
		switch dt {
		case format.BF16:
			o := out[2*i0 : 2*i0+2*len(c)]
			for i, x := range c {
				binary.LittleEndian.PutUint16(o[2*i:], format.Float32ToBF16(x))
			}
		default:
			o := out[4*i0 : 4*i0+4*len(c)]
			for i, x := range c {
				binary.LittleEndian.PutUint32(o[4*i:], math.Float32bits(x))
			}
		}
	}
	return out
}
