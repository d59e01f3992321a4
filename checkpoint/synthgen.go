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

// fillMax is fill that also raises amax[j] to the largest absBits of
// dst[j*group : (j+1)*group] (the last group may be short).
func (g *uniformGen) fillMax(dst []float32, group int, amax []uint32) {
	hi, lo, k := g.hi, g.lo, g.k
	for j := 0; j*group < len(dst); j++ {
		m := amax[j]
		for i := range dst[j*group : min(j*group+group, len(dst))] {
			h, l := bits.Mul64(lo, pcgMulLo)
			h += hi*pcgMulLo + lo*pcgMulHi
			var c uint64
			lo, c = bits.Add64(l, pcgIncLo, 0)
			hi, _ = bits.Add64(h, pcgIncHi, c)
			x := hi ^ hi>>32
			x *= pcgCheapMul
			x ^= x >> 48
			x *= lo | 1
			v := float32(float64(int64(x&(1<<53-1))-1<<52) * k)
			dst[j*group+i] = v
			m = max(m, absBits(v))
		}
		amax[j] = m
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

// e2m1Table[a>>19] is format.Float32ToE2M1 of every non-negative float32 with
// bits a in (a>>19<<19, a>>19<<19 + 2^19) up to 6: E2M1's rounding thresholds
// (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5) have at most two mantissa bits, so they
// are bucket starts and a code is constant inside a bucket. Read-only.
var e2m1Table = func() (t [0x40c00000>>19 + 1]uint8) {
	for i := range t {
		t[i] = format.Float32ToE2M1(math.Float32frombits(uint32(i)<<19 | 1<<18))
	}
	return t
}()

// e2m1Pack sets dst[i] to format.Float32ToE2M1's codes of v[2i]*inv (low
// nibble) and v[2i+1]*inv (high nibble), for v without NaN and inv such that
// every |v[i]*inv| <= 6. A value at a bucket start (a possible tie) goes to
// format itself.
func e2m1Pack(dst []byte, v *[format.MXGroup]float32, inv float32) {
	dst = dst[:format.MXGroup/2]
	var c [format.MXGroup]uint8
	for i, x := range v {
		y := x * inv
		b := math.Float32bits(y)
		a := b & 0x7fffffff
		if a&(1<<19-1) == 0 || a > 0x40c00000 {
			c[i] = format.Float32ToE2M1(y)
			continue
		}
		c[i] = uint8(b>>28)&8 | e2m1Table[a>>19]
	}
	for i := range dst {
		dst[i] = c[2*i] | c[2*i+1]<<4
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
			g.fillMax(row, block, amax)
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
	var chunk [64 * format.MXGroup]float32 // drawn a chunk at a time, in order
	var amax [64]uint32
	for gi := range scale {
		if gi%64 == 0 {
			clear(amax[:])
			g.fillMax(chunk[:min(len(chunk), n-gi*format.MXGroup)], format.MXGroup, amax[:])
		}
		v := (*[format.MXGroup]float32)(chunk[gi%64*format.MXGroup:])
		m := amax[gi%64]
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
	var chunk [64 * format.MXGroup]float32 // drawn a chunk at a time, in order
	var amax [64]uint32
	for gi := range scale {
		if gi%64 == 0 {
			clear(amax[:])
			g.fillMax(chunk[:min(len(chunk), n-gi*format.MXGroup)], format.MXGroup, amax[:])
		}
		v := (*[format.MXGroup]float32)(chunk[gi%64*format.MXGroup:])
		m := amax[gi%64]
		e := e2m1Exp(m)
		scale[gi] = byte(e + 127)
		if scalesOnly {
			continue
		}
		inv := invPow2(e)
		e2m1Pack(packed[gi*format.MXGroup/2:], v, inv)
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
