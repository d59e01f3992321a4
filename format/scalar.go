package format

import (
	"fmt"
	"math"
)

// BF16ToFloat32 returns the value of the bfloat16 bit pattern h (exact; NaN
// payloads are kept).
func BF16ToFloat32(h uint16) float32 {
	return math.Float32frombits(uint32(h) << 16)
}

// Float32ToBF16 rounds f to the nearest bfloat16, ties to even. Values beyond the
// largest finite bfloat16 (after rounding) become ±Inf. A NaN stays a NaN with
// its sign (the quiet bit is set so that truncating the payload cannot yield Inf).
func Float32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN
		return uint16(b>>16) | 0x0040
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// F16ToFloat32 returns the value of the IEEE 754 binary16 bit pattern h (exact,
// including subnormals, infinities and NaN payloads).
func F16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp != 0: // normal
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	default: // subnormal: mant * 2^-24, exact in float32
		v := float32(mant) * (1.0 / (1 << 24))
		return math.Float32frombits(sign | math.Float32bits(v))
	}
}

// Float32ToF16 rounds f to the nearest IEEE 754 binary16, ties to even, producing
// subnormals where needed and ±Inf on overflow. A NaN stays a NaN with its sign.
func Float32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00 | uint16(mant>>13)
		}
		return sign | 0x7c00
	}
	e := exp - 127
	if e > 15 {
		return sign | 0x7c00
	}
	if e >= -14 { // normal range; a rounding carry may step into the next binade or Inf
		h := uint32(e+15)<<10 | mant>>13
		rem := mant & 0x1fff
		if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
			h++
		}
		return sign | uint16(h)
	}
	if exp == 0 { // float32 zero or subnormal: far below half the smallest f16 subnormal
		return sign
	}
	// f16 subnormal: value = m·2^(e-23) with m the 24-bit significand; in units of
	// 2^-24 that is m·2^(e+1), i.e. m >> shift.
	m := mant | 0x800000
	shift := uint(-e - 1)
	if shift > 24 {
		return sign
	}
	h := m >> shift
	rem := m & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || (rem == half && h&1 == 1) {
		h++
	}
	return sign | uint16(h)
}

// e4m3Table holds the float32 value of every E4M3fn byte. Read-only after init.
var e4m3Table = func() (t [256]float32) {
	for i := range t {
		t[i] = e4m3Bits(byte(i))
	}
	return t
}()

// e4m3Bits decodes an E4M3fn byte from its bit fields.
func e4m3Bits(b byte) float32 {
	exp := int(b>>3) & 0xf
	mant := int(b & 7)
	var v float32
	switch {
	case exp == 0xf && mant == 7:
		v = float32(math.NaN())
	case exp == 0:
		v = float32(mant) / 8 / 64
	default:
		v = (1 + float32(mant)/8) * float32(math.Ldexp(1, exp-7))
	}
	if b&0x80 != 0 {
		v = -v
	}
	return v
}

// E4M3ToFloat32 returns the value of an FP8 E4M3fn byte: sign bit 7, exponent bits
// 6..3 with bias 7, mantissa bits 2..0; exponent 0 is subnormal (m/8·2^-6); 0x7F
// and 0xFF are NaN; there are no infinities (max finite ±448).
func E4M3ToFloat32(b byte) float32 { return e4m3Table[b] }

// Float32ToE4M3 rounds f to the nearest E4M3fn value, ties to even. Magnitudes
// above 448 (including ±Inf) saturate to ±448. NaN becomes 0x7F with f's sign
// bit (0x7F or 0xFF). Results too small for the smallest subnormal are ±0.
func Float32ToE4M3(f float32) byte {
	b := math.Float32bits(f)
	sign := byte(b>>24) & 0x80
	a := b & 0x7fffffff
	if a > 0x7f800000 {
		return sign | 0x7f
	}
	if a >= 0x43e00000 { // >= 448
		return sign | 0x7e
	}
	exp := int(a >> 23)
	mant := a & 0x7fffff
	e := exp - 127
	if e >= -6 { // E4M3 normal range
		h := uint32(e+7)<<3 | mant>>20
		rem := mant & 0xfffff
		if rem > 0x80000 || (rem == 0x80000 && h&1 == 1) {
			h++
		}
		return sign | byte(h) // a < 448 so h <= 0x7e
	}
	if exp == 0 {
		return sign
	}
	// E4M3 subnormal: units of 2^-9; value m·2^(e-23) = (m·2^(e+14)) units.
	m := mant | 0x800000
	shift := uint(14 - e)
	if shift > 24 {
		return sign
	}
	h := m >> shift
	rem := m & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || (rem == half && h&1 == 1) {
		h++
	}
	return sign | byte(h)
}

// E8M0ToFloat32 returns 2^(b-127) for b in [0, 254] (b = 0 gives the float32
// subnormal 2^-127, exact) and NaN for b = 255.
func E8M0ToFloat32(b byte) float32 {
	switch b {
	case 255:
		return float32(math.NaN())
	case 0:
		return math.Float32frombits(0x00400000)
	}
	return math.Float32frombits(uint32(b) << 23)
}

// E8M0FromExponent returns the E8M0 byte encoding 2^e. e must lie in [-127, 127];
// anything else is an error quoting e.
func E8M0FromExponent(e int) (byte, error) {
	if e < -127 || e > 127 {
		return 0, fmt.Errorf("E8M0 exponent %d out of range [-127, 127]", e)
	}
	return byte(e + 127), nil
}

// E8M0Exact reports whether f is exactly 2^e for some e in [-127, 127] and, if so,
// returns its E8M0 byte. Zero, negatives, non-powers of two, Inf and NaN give false.
func E8M0Exact(f float32) (byte, bool) {
	b := math.Float32bits(f)
	if b == 0x00400000 {
		return 0, true
	}
	exp := b >> 23 // sign must be 0, so this includes the sign bit
	if b&0x7fffff != 0 || exp == 0 || exp >= 255 {
		return 0, false
	}
	return byte(exp), true
}

// e2m1Table maps a 4-bit E2M1 code to its value. Code 8 is -0.
var e2m1Table = [16]float32{0, 0.5, 1, 1.5, 2, 3, 4, 6, float32(math.Copysign(0, -1)), -0.5, -1, -1.5, -2, -3, -4, -6}

// E2M1ToFloat32 returns the value of the FP4 E2M1 code in the low 4 bits of code
// (table 0, .5, 1, 1.5, 2, 3, 4, 6 and their negatives for codes 8..15; code 8 is
// -0). The high 4 bits are ignored.
func E2M1ToFloat32(code uint8) float32 { return e2m1Table[code&15] }

// Float32ToE2M1 rounds f to the nearest E2M1 value, ties to the even code
// (mantissa bit 0), saturating magnitudes above 6 (including ±Inf) to ±6. The
// result is a 4-bit code (bit 3 = sign). NaN maps to code 0 (+0): E2M1 has no NaN.
func Float32ToE2M1(f float32) uint8 {
	if f != f {
		return 0
	}
	bits := math.Float32bits(f)
	sign := uint8(bits>>31) << 3
	a := math.Float32frombits(bits &^ (1 << 31))
	// The code is the number of rounding thresholds a reaches: the midpoints of
	// the grid 0, .5, 1, 1.5, 2, 3, 4, 6. At a midpoint the even code wins, so
	// the thresholds next to an even code below are strict and the others not.
	// Branch-free: quantizing random weights makes every branch unpredictable.
	c := b2u(a > 0.25) + b2u(a >= 0.75) + b2u(a > 1.25) + b2u(a >= 1.75) +
		b2u(a > 2.5) + b2u(a >= 3.5) + b2u(a > 5)
	return sign | c
}

// b2u is 1 for true and 0 for false (compiled to a SETcc, without a branch).
func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}
