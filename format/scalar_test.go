package format

import (
	"math"
	"math/rand/v2"
	"testing"
)

// sameFloat reports whether got is exactly want (float64 reference): both NaN, or
// equal values with equal signs (so -0 != +0).
func sameFloat(got float32, want float64) bool {
	if math.IsNaN(want) {
		return got != got
	}
	return float64(got) == want && math.Signbit(float64(got)) == math.Signbit(want)
}

func TestDecodeAllCodes(t *testing.T) {
	cases := []struct {
		name string
		n    int
		dec  func(c int) float32
		ref  func(c int) (float64, bool)
		nnan int // expected number of NaN codes
	}{
		{"E4M3", 256, func(c int) float32 { return E4M3ToFloat32(byte(c)) }, func(c int) (float64, bool) { return refE4M3(byte(c)) }, 2},
		{"E8M0", 256, func(c int) float32 { return E8M0ToFloat32(byte(c)) }, func(c int) (float64, bool) { return refE8M0(byte(c)) }, 1},
		{"E2M1", 16, func(c int) float32 { return E2M1ToFloat32(uint8(c)) }, func(c int) (float64, bool) { return refE2M1(uint8(c)), false }, 0},
		{"BF16", 65536, func(c int) float32 { return BF16ToFloat32(uint16(c)) }, func(c int) (float64, bool) { return refBF16(uint16(c)) }, 2 * 127},
		{"F16", 65536, func(c int) float32 { return F16ToFloat32(uint16(c)) }, func(c int) (float64, bool) { return refF16(uint16(c)) }, 2 * 1023},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nan := 0
			for c := 0; c < tc.n; c++ {
				want, isNaN := tc.ref(c)
				got := tc.dec(c)
				if isNaN {
					nan++
				}
				if !sameFloat(got, want) {
					t.Fatalf("code %#x: got %v (bits %#08x), want %v", c, got, math.Float32bits(got), want)
				}
			}
			if nan != tc.nnan {
				t.Errorf("%d NaN codes, want %d", nan, tc.nnan)
			}
		})
	}
}

func TestDecodeSpotValues(t *testing.T) {
	// Hand-checked values from the format definitions.
	cases := []struct {
		name string
		got  float32
		want float64
	}{
		{"e4m3 0x7E=448", E4M3ToFloat32(0x7E), 448},
		{"e4m3 0xFE=-448", E4M3ToFloat32(0xFE), -448},
		{"e4m3 0x01=2^-9", E4M3ToFloat32(0x01), 1.0 / 512},
		{"e4m3 0x08=2^-6", E4M3ToFloat32(0x08), 1.0 / 64},
		{"e4m3 0x38=1", E4M3ToFloat32(0x38), 1},
		{"e4m3 0x80=-0", E4M3ToFloat32(0x80), math.Copysign(0, -1)},
		{"e4m3 0x7F=NaN", E4M3ToFloat32(0x7F), math.NaN()},
		{"e4m3 0xFF=NaN", E4M3ToFloat32(0xFF), math.NaN()},
		{"e8m0 127=1", E8M0ToFloat32(127), 1},
		{"e8m0 0=2^-127", E8M0ToFloat32(0), math.Ldexp(1, -127)},
		{"e8m0 254=2^127", E8M0ToFloat32(254), math.Ldexp(1, 127)},
		{"e8m0 255=NaN", E8M0ToFloat32(255), math.NaN()},
		{"e2m1 7=6", E2M1ToFloat32(7), 6},
		{"e2m1 8=-0", E2M1ToFloat32(8), math.Copysign(0, -1)},
		{"e2m1 0x1D=-3 (high bits ignored)", E2M1ToFloat32(0x1D), -3},
		{"bf16 0x3F80=1", BF16ToFloat32(0x3F80), 1},
		{"bf16 0x7F80=Inf", BF16ToFloat32(0x7F80), math.Inf(1)},
		{"f16 0x3C00=1", F16ToFloat32(0x3C00), 1},
		{"f16 0x7BFF=65504", F16ToFloat32(0x7BFF), 65504},
		{"f16 0x0001=2^-24", F16ToFloat32(0x0001), math.Ldexp(1, -24)},
		{"f16 0xFC00=-Inf", F16ToFloat32(0xFC00), math.Inf(-1)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !sameFloat(tc.got, tc.want) {
				t.Errorf("got %v, want %v", tc.got, tc.want)
			}
		})
	}
}

func TestE8M0FromExponent(t *testing.T) {
	for e := -127; e <= 127; e++ {
		b, err := E8M0FromExponent(e)
		if err != nil {
			t.Fatalf("e=%d: %v", e, err)
		}
		if want := math.Ldexp(1, e); float64(E8M0ToFloat32(b)) != want {
			t.Fatalf("e=%d: byte %d decodes to %v, want %v", e, b, E8M0ToFloat32(b), want)
		}
	}
	for _, e := range []int{-128, 128, 1000, -1000} {
		if _, err := E8M0FromExponent(e); err == nil {
			t.Errorf("e=%d: no error", e)
		}
	}
}

func TestE8M0Exact(t *testing.T) {
	for e := -127; e <= 127; e++ {
		f := float32(math.Ldexp(1, e))
		b, ok := E8M0Exact(f)
		if !ok || int(b) != e+127 {
			t.Fatalf("2^%d: got (%d, %v), want (%d, true)", e, b, ok, e+127)
		}
	}
	bad := []struct {
		name string
		f    float32
	}{
		{"zero", 0},
		{"neg zero", float32(math.Copysign(0, -1))},
		{"negative power", -2},
		{"three", 3},
		{"1.5", 1.5},
		{"2^-128", float32(math.Ldexp(1, -128))},
		{"2^-149", float32(math.Ldexp(1, -149))},
		{"max float", math.MaxFloat32},
		{"inf", float32(math.Inf(1))},
		{"nan", float32(math.NaN())},
		{"just above 1", math.Nextafter32(1, 2)},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			if b, ok := E8M0Exact(tc.f); ok {
				t.Errorf("E8M0Exact(%v) = (%d, true), want false", tc.f, b)
			}
		})
	}
}

// Candidate lists and value functions for brute-force nearest-value references.
type encRef struct {
	pos, neg []uint32 // finite (or extended) codes of each sign
	val      func(uint32) float64
}

func buildRef(n int, signBit uint32, ok func(uint32) bool, val func(uint32) float64) encRef {
	var r encRef
	r.val = val
	for c := uint32(0); c < uint32(n); c++ {
		if !ok(c) {
			continue
		}
		if c&signBit != 0 {
			r.neg = append(r.neg, c)
		} else {
			r.pos = append(r.pos, c)
		}
	}
	return r
}

func (r encRef) nearest(x float64) uint32 {
	if math.Signbit(x) {
		return nearestCode(x, r.neg, r.val)
	}
	return nearestCode(x, r.pos, r.val)
}

func e4m3Ref() encRef {
	return buildRef(256, 0x80, func(c uint32) bool { _, nan := refE4M3(byte(c)); return !nan },
		func(c uint32) float64 { v, _ := refE4M3(byte(c)); return v })
}

func e2m1Ref() encRef {
	return buildRef(16, 8, func(uint32) bool { return true }, func(c uint32) float64 { return refE2M1(uint8(c)) })
}

func bf16Ref() encRef {
	vals := make([]float64, 65536)
	for c := range vals {
		vals[c] = refExtended(uint32(c), 8, 7, 127)
	}
	return buildRef(65536, 0x8000, func(c uint32) bool { _, nan := refBF16(uint16(c)); return !nan },
		func(c uint32) float64 { return vals[c] })
}

func f16Ref() encRef {
	vals := make([]float64, 65536)
	for c := range vals {
		vals[c] = refExtended(uint32(c), 5, 10, 15)
	}
	return buildRef(65536, 0x8000, func(c uint32) bool { _, nan := refF16(uint16(c)); return !nan },
		func(c uint32) float64 { return vals[c] })
}

// The check* functions compare one encoder result with the brute-force reference.

func checkE4M3(t *testing.T, r encRef, f float32) {
	t.Helper()
	got := Float32ToE4M3(f)
	var want uint32
	switch {
	case f != f:
		want = 0x7f
		if math.Signbit(float64(f)) {
			want = 0xff
		}
	case math.IsInf(float64(f), 0):
		want = 0x7e
		if f < 0 {
			want = 0xfe
		}
	default:
		want = r.nearest(float64(f))
	}
	if uint32(got) != want {
		t.Fatalf("Float32ToE4M3(%v bits %#08x) = %#02x, want %#02x", f, math.Float32bits(f), got, want)
	}
}

func checkE2M1(t *testing.T, r encRef, f float32) {
	t.Helper()
	got := Float32ToE2M1(f)
	var want uint32
	switch {
	case f != f:
		want = 0
	case math.IsInf(float64(f), 0):
		want = 7
		if f < 0 {
			want = 15
		}
	default:
		want = r.nearest(float64(f))
	}
	if uint32(got) != want {
		t.Fatalf("Float32ToE2M1(%v bits %#08x) = %#x, want %#x", f, math.Float32bits(f), got, want)
	}
}

// check16 checks a 16-bit IEEE-style encoder (BF16 or F16): nearest with ties to
// even, overflow to Inf, Inf to Inf, NaN to a NaN of the same sign.
func check16(t *testing.T, name string, r encRef, enc func(float32) uint16, dec func(uint16) float32, f float32) {
	t.Helper()
	got := enc(f)
	if f != f {
		g := dec(got)
		if g == g || math.Signbit(float64(g)) != math.Signbit(float64(f)) {
			t.Fatalf("%s(NaN bits %#08x) = %#04x, want a NaN with the same sign", name, math.Float32bits(f), got)
		}
		return
	}
	var want uint32
	if math.IsInf(float64(f), 0) {
		want = uint32(enc(f)) // checked below by value
		if !math.IsInf(float64(dec(got)), int(math.Copysign(1, float64(f)))) {
			t.Fatalf("%s(%v) = %#04x, want matching Inf", name, f, got)
		}
		return
	}
	want = r.nearest(float64(f))
	if uint32(got) != want {
		t.Fatalf("%s(%v bits %#08x) = %#04x, want %#04x", name, f, math.Float32bits(f), got, want)
	}
}

// encoderInputs returns float32 test inputs: random bit patterns, random values
// around the format's range and the midpoints (and neighbours) between adjacent
// representable values listed in vals.
func encoderInputs(rng *rand.Rand, n int, scale float64, vals []float64) []float32 {
	var in []float32
	for range n {
		in = append(in, math.Float32frombits(rng.Uint32()))
		x := float32((rng.Float64()*2 - 1) * scale * math.Pow(2, -rng.Float64()*12))
		in = append(in, x)
	}
	for i := 0; i+1 < len(vals); i++ {
		m := float32((vals[i] + vals[i+1]) / 2)
		in = append(in, m, -m, math.Nextafter32(m, float32(math.Inf(1))), math.Nextafter32(m, float32(math.Inf(-1))), float32(vals[i]))
	}
	in = append(in, 0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)),
		float32(math.NaN()), math.Float32frombits(0xffc00001), math.MaxFloat32, -math.MaxFloat32,
		math.SmallestNonzeroFloat32, math.Float32frombits(0x00400000))
	return in
}

func sortedPosVals(r encRef) []float64 {
	var v []float64
	for _, c := range r.pos {
		v = append(v, r.val(c)) // codes of one sign are monotone in value
	}
	return v
}

func TestEncodersNearest(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	// Brute-force references are slow (32768 candidates per BF16/F16 input), so
	// -short samples fewer inputs; every midpoint of E4M3 and E2M1 is always tested.
	n, n8, stride := 300, 20000, 1
	if testing.Short() {
		n, n8, stride = 50, 2000, 7
	}
	t.Run("E4M3", func(t *testing.T) {
		r := e4m3Ref()
		for _, f := range encoderInputs(rng, n8, 600, sortedPosVals(r)) {
			checkE4M3(t, r, f)
		}
	})
	t.Run("E2M1", func(t *testing.T) {
		r := e2m1Ref()
		for _, f := range encoderInputs(rng, n8, 8, sortedPosVals(r)) {
			checkE2M1(t, r, f)
		}
	})
	t.Run("BF16", func(t *testing.T) {
		r := bf16Ref()
		vals := sortedPosVals(r)
		// Midpoints for a sample of binades only (brute force is 32768 per input).
		var sample []float64
		for i := 0; i+1 < len(vals); i += 97 * stride {
			sample = append(sample, vals[i], vals[i+1], math.NaN())
		}
		for _, f := range encoderInputs(rng, n, 1e6, nil) {
			check16(t, "Float32ToBF16", r, Float32ToBF16, BF16ToFloat32, f)
		}
		for i := 0; i+1 < len(sample); i += 3 {
			m := float32((sample[i] + sample[i+1]) / 2)
			for _, f := range []float32{m, -m, math.Nextafter32(m, 0), math.Nextafter32(m, 1e38)} {
				check16(t, "Float32ToBF16", r, Float32ToBF16, BF16ToFloat32, f)
			}
		}
	})
	t.Run("F16", func(t *testing.T) {
		r := f16Ref()
		vals := sortedPosVals(r)
		for _, f := range encoderInputs(rng, n, 70000, nil) {
			check16(t, "Float32ToF16", r, Float32ToF16, F16ToFloat32, f)
		}
		for i := 0; i+1 < len(vals); i += 97 * stride {
			m := float32((vals[i] + vals[i+1]) / 2)
			for _, f := range []float32{m, -m, math.Nextafter32(m, 0), math.Nextafter32(m, 1e38)} {
				check16(t, "Float32ToF16", r, Float32ToF16, F16ToFloat32, f)
			}
		}
		// Overflow boundary: 65520 = 65504 + half ulp rounds to Inf (tie, 0x7C00 even).
		for _, tc := range []struct {
			f    float32
			want uint16
		}{{65519, 0x7bff}, {65520, 0x7c00}, {-65520, 0xfc00}, {65504, 0x7bff}, {float32(math.Ldexp(1, -25)), 0}, {float32(math.Ldexp(1.5, -25)), 1}} {
			if got := Float32ToF16(tc.f); got != tc.want {
				t.Errorf("Float32ToF16(%v) = %#04x, want %#04x", tc.f, got, tc.want)
			}
		}
	})
}

func TestEncoderRoundTrip(t *testing.T) {
	t.Run("E4M3", func(t *testing.T) {
		for c := 0; c < 256; c++ {
			if c&0x7f == 0x7f {
				if got := Float32ToE4M3(E4M3ToFloat32(byte(c))); got&0x7f != 0x7f {
					t.Errorf("NaN code %#x round-trips to %#x", c, got)
				}
				continue
			}
			if got := Float32ToE4M3(E4M3ToFloat32(byte(c))); got != byte(c) {
				t.Errorf("code %#x round-trips to %#x", c, got)
			}
		}
	})
	t.Run("E2M1", func(t *testing.T) {
		for c := uint8(0); c < 16; c++ {
			if got := Float32ToE2M1(E2M1ToFloat32(c)); got != c {
				t.Errorf("code %#x round-trips to %#x", c, got)
			}
		}
	})
	t.Run("E8M0", func(t *testing.T) {
		for c := 0; c < 255; c++ {
			if b, ok := E8M0Exact(E8M0ToFloat32(byte(c))); !ok || b != byte(c) {
				t.Errorf("code %d round-trips to (%d, %v)", c, b, ok)
			}
		}
		if _, ok := E8M0Exact(E8M0ToFloat32(255)); ok {
			t.Error("NaN code 255 accepted by E8M0Exact")
		}
	})
	for _, tc := range []struct {
		name string
		enc  func(float32) uint16
		dec  func(uint16) float32
	}{{"BF16", Float32ToBF16, BF16ToFloat32}, {"F16", Float32ToF16, F16ToFloat32}} {
		t.Run(tc.name, func(t *testing.T) {
			for c := 0; c < 65536; c++ {
				f := tc.dec(uint16(c))
				got := tc.enc(f)
				if f != f {
					if g := tc.dec(got); g == g {
						t.Fatalf("NaN code %#04x encodes to non-NaN %#04x", c, got)
					}
					continue
				}
				if got != uint16(c) {
					t.Fatalf("code %#04x round-trips to %#04x", c, got)
				}
			}
		})
	}
}

// Fuzz targets take raw float32 bit patterns so that NaN payloads, signed zeros
// and subnormals are reachable. Each checks the encoder against the brute-force
// nearest-value reference (ties to even, saturation / overflow rules).

func FuzzFloat32ToE4M3(f *testing.F) {
	r := e4m3Ref()
	f.Add(math.Float32bits(464))
	f.Fuzz(func(t *testing.T, bits uint32) { checkE4M3(t, r, math.Float32frombits(bits)) })
}

func FuzzFloat32ToE2M1(f *testing.F) {
	r := e2m1Ref()
	f.Add(math.Float32bits(2.5))
	f.Fuzz(func(t *testing.T, bits uint32) { checkE2M1(t, r, math.Float32frombits(bits)) })
}

func FuzzFloat32ToBF16(f *testing.F) {
	r := bf16Ref()
	f.Add(uint32(0x3f808000))
	f.Fuzz(func(t *testing.T, bits uint32) {
		check16(t, "Float32ToBF16", r, Float32ToBF16, BF16ToFloat32, math.Float32frombits(bits))
	})
}

func FuzzFloat32ToF16(f *testing.F) {
	r := f16Ref()
	f.Add(math.Float32bits(65520))
	f.Fuzz(func(t *testing.T, bits uint32) {
		check16(t, "Float32ToF16", r, Float32ToF16, F16ToFloat32, math.Float32frombits(bits))
	})
}
