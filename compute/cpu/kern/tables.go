package kern

import "math"

// Decode tables. They are computed once at package initialisation from the
// format definitions and never written afterwards.
var (
	// e4m3Value[b] is the float32 value of the E4M3fn code b (0x7F, 0xFF: NaN).
	e4m3Value = func() (t [256]float32) {
		for b := range 256 {
			t[b] = e4m3ToFloat32(byte(b))
		}
		return t
	}()
	// e8m0Value[b] is 2^(b-127) as float32 (b = 0 is the subnormal 2^-127;
	// b = 255 is NaN).
	e8m0Value = func() (t [256]float32) {
		for b := range 256 {
			t[b] = e8m0ToFloat32(byte(b))
		}
		return t
	}()
	// e8m0Bits holds the float32 bit patterns of e8m0Value (SIMD code
	// broadcasts them as integers to stay clear of scalar float instructions).
	e8m0Bits = func() (t [256]uint32) {
		for b := range 256 {
			t[b] = math.Float32bits(e8m0ToFloat32(byte(b)))
		}
		return t
	}()
)

// e2m1Value is the MXFP4 (E2M1) value of each 4-bit code.
var e2m1Value = [16]float32{0, .5, 1, 1.5, 2, 3, 4, 6, 0, -.5, -1, -1.5, -2, -3, -4, -6}

// e2m1Pair[b] holds the values of the two codes packed in byte b: low
// nibble (even column) first.
var e2m1Pair = func() (t [256][2]float32) {
	for b := range 256 {
		t[b] = [2]float32{e2m1Value[b&15], e2m1Value[b>>4]}
	}
	return t
}()

func e4m3ToFloat32(b byte) float32 {
	e := int(b>>3) & 15
	m := float64(b & 7)
	var v float64
	switch {
	case b&0x7F == 0x7F:
		return float32(math.NaN())
	case e == 0:
		v = m / 8 * math.Ldexp(1, -6)
	default:
		v = (1 + m/8) * math.Ldexp(1, e-7)
	}
	if b&0x80 != 0 {
		v = -v
	}
	return float32(v)
}

func e8m0ToFloat32(b byte) float32 {
	if b == 255 {
		return float32(math.NaN())
	}
	return float32(math.Ldexp(1, int(b)-127))
}

// bf16ToFloat32 widens a bfloat16 bit pattern.
func bf16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }
