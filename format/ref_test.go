package format

// Independent float64 reference decoders, written from the bit definitions in
// dsv4-flash.md §3.1 and IEEE 754, sharing no code with the package.

import "math"

// refMinifloat decodes an IEEE-style binary format with ebits exponent bits,
// mbits mantissa bits and the given bias. It returns (value, isNaN). When
// ieeeInf is true the all-ones exponent encodes Inf (mantissa 0) and NaN;
// otherwise (E4M3fn) only the all-ones pattern is NaN and everything else is finite.
func refMinifloat(code uint32, ebits, mbits, bias int, ieeeInf bool) (float64, bool) {
	sign := 1.0
	if code>>(ebits+mbits)&1 == 1 {
		sign = -1
	}
	e := int(code>>mbits) & (1<<ebits - 1)
	m := int(code) & (1<<mbits - 1)
	emax := 1<<ebits - 1
	if ieeeInf && e == emax {
		if m == 0 {
			return sign * math.Inf(1), false
		}
		return math.NaN(), true
	}
	if !ieeeInf && e == emax && m == 1<<mbits-1 {
		return math.NaN(), true
	}
	if e == 0 {
		return sign * float64(m) / float64(int(1)<<mbits) * math.Pow(2, float64(1-bias)), false
	}
	return sign * (1 + float64(m)/float64(int(1)<<mbits)) * math.Pow(2, float64(e-bias)), false
}

func refE4M3(b byte) (float64, bool)   { return refMinifloat(uint32(b), 4, 3, 7, false) }
func refBF16(h uint16) (float64, bool) { return refMinifloat(uint32(h), 8, 7, 127, true) }
func refF16(h uint16) (float64, bool)  { return refMinifloat(uint32(h), 5, 10, 15, true) }
func refE2M1(c uint8) float64 {
	v, _ := refMinifloat(uint32(c&15), 2, 1, 1, false)
	// E2M1 has no NaN: the all-ones pattern (code 7/15) is ±6 = 1.5·2^2.
	if c&7 == 7 {
		v = 6
		if c&8 != 0 {
			v = -6
		}
	}
	return v
}

func refE8M0(b byte) (float64, bool) {
	if b == 255 {
		return math.NaN(), true
	}
	return math.Pow(2, float64(int(b)-127)), false
}

// refExtended returns the value used for nearest-value search: like ref but with
// +Inf / -Inf treated as the next power of two past the largest finite value
// (where unbounded-exponent rounding would land), which gives IEEE overflow.
func refExtended(code uint32, ebits, mbits, bias int) float64 {
	v, _ := refMinifloat(code, ebits, mbits, bias, true)
	if math.IsInf(v, 0) {
		return math.Copysign(math.Pow(2, float64(1<<ebits-1-bias)), v)
	}
	return v
}

// absDiff returns |v-x| as an exact unevaluated sum hi+lo (Knuth TwoSum), so
// that distances can be compared exactly: lexicographic order on (hi, lo) is the
// order of the true distances (float64 rounding is monotone).
func absDiff(v, x float64) (hi, lo float64) {
	a, b := v, -x
	s := a + b
	bb := s - a
	e := (a - (s - bb)) + (b - bb)
	if s < 0 || (s == 0 && e < 0) {
		return -s, -e
	}
	return s, e
}

// nearestCode returns the code among cands (value function val) nearest to x,
// ties to the code with an even low bit. It is a brute-force reference with exact
// distance comparison.
func nearestCode(x float64, cands []uint32, val func(uint32) float64) uint32 {
	best := cands[0]
	bh, bl := absDiff(val(best), x)
	for _, c := range cands[1:] {
		h, l := absDiff(val(c), x)
		less := h < bh || (h == bh && l < bl)
		tie := h == bh && l == bl
		if less || (tie && c&1 == 0 && best&1 == 1) {
			best, bh, bl = c, h, l
		}
	}
	return best
}
