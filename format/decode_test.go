package format

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// sameBits compares two float32 slices bit for bit, except that any NaN matches
// any NaN (the scalar and bulk paths may differ only in NaN payload handling).
func checkSame(t *testing.T, what string, got []float32, want func(i int) float32) {
	t.Helper()
	for i, g := range got {
		w := want(i)
		if w != w && g != g {
			continue
		}
		if math.Float32bits(g) != math.Float32bits(w) {
			t.Fatalf("%s: element %d = %v (bits %#08x), want %v (bits %#08x)", what, i, g, math.Float32bits(g), w, math.Float32bits(w))
		}
	}
}

// refProduct is the exactly rounded float32 of the float64 product of two exact
// reference values (one rounding, as the float32 multiply does).
func refProduct(a, b float64) float32 { return float32(a * b) }

func TestRowDecodersMatchScalar(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 1, 7, 8, 9, 31, 32, 33, 64, 100, 256, 275, 528, 2048, 4096} {
		t.Run("BF16", func(t *testing.T) {
			src := randBytes(rng, 2*n)
			dst := make([]float32, n)
			DecodeBF16(dst, src)
			checkSame(t, "DecodeBF16", dst, func(i int) float32 { return BF16ToFloat32(binary.LittleEndian.Uint16(src[2*i:])) })
			checkSame(t, "DecodeBF16 vs ref", dst, func(i int) float32 { v, _ := refBF16(binary.LittleEndian.Uint16(src[2*i:])); return float32(v) })
		})
		t.Run("F16", func(t *testing.T) {
			src := randBytes(rng, 2*n)
			dst := make([]float32, n)
			DecodeF16(dst, src)
			checkSame(t, "DecodeF16", dst, func(i int) float32 { v, _ := refF16(binary.LittleEndian.Uint16(src[2*i:])); return float32(v) })
		})
		t.Run("F32", func(t *testing.T) {
			src := randBytes(rng, 4*n)
			dst := make([]float32, n)
			DecodeF32(dst, src)
			for i, g := range dst {
				if math.Float32bits(g) != binary.LittleEndian.Uint32(src[4*i:]) {
					t.Fatalf("element %d bits %#08x, want %#08x", i, math.Float32bits(g), binary.LittleEndian.Uint32(src[4*i:]))
				}
			}
		})
		t.Run("E4M3", func(t *testing.T) {
			src := randBytes(rng, n)
			dst := make([]float32, n)
			DecodeE4M3(dst, src)
			checkSame(t, "DecodeE4M3", dst, func(i int) float32 { return E4M3ToFloat32(src[i]) })
			checkSame(t, "DecodeE4M3 vs ref", dst, func(i int) float32 { v, _ := refE4M3(src[i]); return float32(v) })
		})
		for _, block := range []int{1, 5, 32, 128, 130} {
			t.Run("FP8BlockRow", func(t *testing.T) {
				q := randBytes(rng, n)
				sc := randBytes(rng, (n+block-1)/block)
				dst := make([]float32, n)
				DecodeFP8BlockRow(dst, q, sc, block)
				checkSame(t, "DecodeFP8BlockRow", dst, func(i int) float32 { return E4M3ToFloat32(q[i]) * E8M0ToFloat32(sc[i/block]) })
				checkSame(t, "DecodeFP8BlockRow vs ref", dst, func(i int) float32 {
					a, _ := refE4M3(q[i])
					s, _ := refE8M0(sc[i/block])
					return refProduct(a, s)
				})
			})
		}
		t.Run("MXFP8Row", func(t *testing.T) {
			q := randBytes(rng, n)
			sc := randBytes(rng, (n+31)/32)
			dst := make([]float32, n)
			DecodeMXFP8Row(dst, q, sc)
			checkSame(t, "DecodeMXFP8Row", dst, func(i int) float32 { return E4M3ToFloat32(q[i]) * E8M0ToFloat32(sc[i/32]) })
			checkSame(t, "DecodeMXFP8Row vs ref", dst, func(i int) float32 {
				a, _ := refE4M3(q[i])
				s, _ := refE8M0(sc[i/32])
				return refProduct(a, s)
			})
		})
		t.Run("MXFP4Row", func(t *testing.T) {
			m := 2 * n
			packed := randBytes(rng, n)
			sc := randBytes(rng, (m+31)/32)
			dst := make([]float32, m)
			DecodeMXFP4Row(dst, packed, sc)
			code := func(i int) uint8 {
				if i%2 == 0 {
					return packed[i/2] & 15
				}
				return packed[i/2] >> 4
			}
			checkSame(t, "DecodeMXFP4Row", dst, func(i int) float32 { return E2M1ToFloat32(code(i)) * E8M0ToFloat32(sc[i/32]) })
			checkSame(t, "DecodeMXFP4Row vs ref", dst, func(i int) float32 {
				s, _ := refE8M0(sc[i/32])
				return refProduct(refE2M1(code(i)), s)
			})
		})
	}
}

// TestMXFP4AllScales runs every scale byte (including 0 = 2^-127 and 255 = NaN)
// and every packed byte through DecodeMXFP4Row, in the chunked (SIMD where
// built) and the scalar tail paths.
func TestMXFP4AllScales(t *testing.T) {
	for _, extra := range []int{0, 16 * 3, 16*5 + 7} {
		n := 256*16 + extra // packed bytes: 256 groups, then a tail
		packed := make([]byte, n)
		for i := range packed {
			packed[i] = byte(i * 7)
		}
		sc := make([]byte, (2*n+31)/32)
		for g := range sc {
			sc[g] = byte(g*37 + 11) // a permutation of 0..255 over the first 256 groups
		}
		// Offset 1 makes dst only 4-byte aligned (the word-store path must not run).
		for _, off := range []int{0, 1} {
			dst := make([]float32, 2*n+off)[off:]
			DecodeMXFP4Row(dst, packed, sc)
			checkSame(t, fmt.Sprintf("DecodeMXFP4Row n=%d offset=%d", n, off), dst, func(i int) float32 {
				c := packed[i/2] & 15
				if i%2 == 1 {
					c = packed[i/2] >> 4
				}
				s, _ := refE8M0(sc[i/32])
				return refProduct(refE2M1(c), s)
			})
		}
	}
}

// TestE4M3BlocksAllScales runs every E4M3 code under every scale byte (including
// 0 = 2^-127, whose products go subnormal, 254, whose products overflow, and 255 =
// NaN) through DecodeFP8BlockRow and DecodeMXFP8Row, with whole chunks (SIMD
// where built) and partial tails.
func TestE4M3BlocksAllScales(t *testing.T) {
	for _, block := range []int{32, 48, 128} {
		for _, extra := range []int{0, 5 * block, 3*block + 17} {
			n := 256*block + extra
			q := make([]byte, n)
			for i := range q {
				q[i] = byte(i*5 + i/256)
			}
			sc := make([]byte, (n+block-1)/block)
			for j := range sc {
				sc[j] = byte(j*37 + 11)
			}
			want := func(i int) float32 {
				v, _ := refE4M3(q[i])
				s, _ := refE8M0(sc[i/block])
				return refProduct(v, s)
			}
			dst := make([]float32, n)
			DecodeFP8BlockRow(dst, q, sc, block)
			checkSame(t, fmt.Sprintf("DecodeFP8BlockRow block=%d n=%d", block, n), dst, want)
			if block == 32 {
				clear(dst)
				DecodeMXFP8Row(dst, q, sc)
				checkSame(t, fmt.Sprintf("DecodeMXFP8Row n=%d", n), dst, want)
			}
		}
	}
}

func TestMXFP4NibbleOrder(t *testing.T) {
	// packed byte 0xD2: low nibble 2 (=1.0) is element 0, high nibble 13 (=-3) is
	// element 1; scale byte 128 = 2.
	packed := make([]byte, 16)
	packed[0] = 0xD2
	packed[15] = 0x7F // element 30: code 15 = -6, element 31: code 7 = 6
	dst := make([]float32, 32)
	DecodeMXFP4Row(dst, packed, []byte{128})
	want := make([]float32, 32)
	want[0], want[1], want[30], want[31] = 2, -6, -12, 12
	for i := range want {
		if dst[i] != want[i] {
			t.Fatalf("element %d = %v, want %v", i, dst[i], want[i])
		}
	}
}

func TestRowDecoderLengthPanics(t *testing.T) {
	cases := []struct {
		name string
		fn   func()
	}{
		{"DecodeBF16", func() { DecodeBF16(make([]float32, 4), make([]byte, 7)) }},
		{"DecodeF16", func() { DecodeF16(make([]float32, 4), make([]byte, 9)) }},
		{"DecodeF32", func() { DecodeF32(make([]float32, 4), make([]byte, 8)) }},
		{"DecodeE4M3", func() { DecodeE4M3(make([]float32, 4), make([]byte, 3)) }},
		{"DecodeFP8BlockRow", func() { DecodeFP8BlockRow(make([]float32, 256), make([]byte, 256), make([]byte, 1), 128) }},
		{"DecodeFP8BlockRow", func() { DecodeFP8BlockRow(make([]float32, 4), make([]byte, 4), make([]byte, 1), 0) }},
		{"DecodeFP8BlockRow", func() { DecodeFP8BlockRow(make([]float32, 4), make([]byte, 5), make([]byte, 1), 128) }},
		{"DecodeMXFP8Row", func() { DecodeMXFP8Row(make([]float32, 64), make([]byte, 64), make([]byte, 3)) }},
		{"DecodeMXFP4Row", func() { DecodeMXFP4Row(make([]float32, 64), make([]byte, 31), make([]byte, 2)) }},
		{"DecodeMXFP4Row", func() { DecodeMXFP4Row(make([]float32, 64), make([]byte, 32), make([]byte, 1)) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				r := recover()
				msg, _ := r.(string)
				if r == nil || !strings.Contains(msg, tc.name) {
					t.Errorf("recover() = %v, want a panic naming %s", r, tc.name)
				}
			}()
			tc.fn()
		})
	}
}
