package format

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// refScaleExp is the reference scale rule, by search: the smallest integer e with
// amax / 2^e <= limit, clamped to [-127, 127]; 0 for amax == 0.
func refScaleExp(amax, limit float64) int {
	if amax == 0 {
		return 0
	}
	e := -127
	for e < 127 && amax > limit*math.Ldexp(1, e) {
		e++
	}
	return e
}

// randWeights returns n values drawn from a mix of distributions: Gaussian with a
// random per-call magnitude, with occasional outliers, exact zeros and tiny values.
func randWeights(rng *rand.Rand, n int) []float32 {
	w := make([]float32, n)
	mag := math.Ldexp(1, rng.IntN(40)-20)
	for i := range w {
		switch rng.IntN(50) {
		case 0:
			w[i] = 0
		case 1:
			w[i] = float32(rng.NormFloat64() * mag * 100)
		case 2:
			w[i] = float32(rng.NormFloat64() * mag * 1e-4)
		default:
			w[i] = float32(rng.NormFloat64() * mag)
		}
	}
	return w
}

// checkQuantError asserts |deq - w| <= max(|w|·rel, abs·2^e) element-wise: rel is
// half the format's relative step among normal values, abs half its spacing
// below the normal range (in units of the group scale 2^e).
func checkQuantError(t *testing.T, w, deq []float32, exp func(i int) int, rel, abs float64) {
	t.Helper()
	for i := range w {
		x, d := float64(w[i]), float64(deq[i])
		bound := math.Max(math.Abs(x)*rel, abs*math.Ldexp(1, exp(i)))
		if math.Abs(d-x) > bound {
			t.Fatalf("element %d: w=%g dequant=%g error %g > bound %g (scale 2^%d)", i, x, d, math.Abs(d-x), bound, exp(i))
		}
	}
}

type shape struct{ rows, cols, block int }

func TestQuantizeFP8Block(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	shapes := []shape{{1, 1, 128}, {1, 32, 128}, {3, 5, 2}, {128, 128, 128}, {130, 257, 128}, {256, 384, 128}, {7, 300, 64}, {0, 0, 128}, {0, 5, 128}}
	for _, s := range shapes {
		t.Run(fmt.Sprintf("%dx%d/b%d", s.rows, s.cols, s.block), func(t *testing.T) {
			w := randWeights(rng, s.rows*s.cols)
			q, sc := QuantizeFP8Block(w, s.rows, s.cols, s.block)
			rb, cb := (s.rows+s.block-1)/s.block, (s.cols+s.block-1)/s.block
			if len(q) != s.rows*s.cols || len(sc) != rb*cb {
				t.Fatalf("len(q)=%d len(scale)=%d, want %d, %d", len(q), len(sc), s.rows*s.cols, rb*cb)
			}
			for bi := 0; bi < rb; bi++ {
				for bj := 0; bj < cb; bj++ {
					amax := 0.0
					for r := bi * s.block; r < min(s.rows, (bi+1)*s.block); r++ {
						for c := bj * s.block; c < min(s.cols, (bj+1)*s.block); c++ {
							amax = math.Max(amax, math.Abs(float64(w[r*s.cols+c])))
						}
					}
					if want := refScaleExp(amax, 448) + 127; int(sc[bi*cb+bj]) != want {
						t.Fatalf("scale[%d,%d] = %d, want %d (amax %g)", bi, bj, sc[bi*cb+bj], want, amax)
					}
				}
			}
			deq, err := DequantFP8Block(q, sc, s.rows, s.cols, s.block)
			if err != nil {
				t.Fatal(err)
			}
			// E4M3: 3 mantissa bits -> relative half-step 2^-4; subnormal spacing 2^-9.
			checkQuantError(t, w, deq, func(i int) int {
				r, c := i/s.cols, i%s.cols
				return int(sc[(r/s.block)*cb+c/s.block]) - 127
			}, 1.0/16, 1.0/1024)
		})
	}
}

func TestQuantizeMX(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, s := range []shape{{1, 32, 0}, {3, 64, 0}, {17, 96, 0}, {64, 2048, 0}, {0, 32, 0}} {
		w := randWeights(rng, s.rows*s.cols)
		ngroups := s.rows * s.cols / 32
		groupExp := func(sc []byte) func(i int) int { return func(i int) int { return int(sc[i/32]) - 127 } }
		checkScales := func(t *testing.T, sc []byte, limit float64) {
			t.Helper()
			if len(sc) != ngroups {
				t.Fatalf("len(scale)=%d, want %d", len(sc), ngroups)
			}
			for g := range sc {
				amax := 0.0
				for _, x := range w[32*g : 32*g+32] {
					amax = math.Max(amax, math.Abs(float64(x)))
				}
				if want := refScaleExp(amax, limit) + 127; int(sc[g]) != want {
					t.Fatalf("scale[%d] = %d, want %d (amax %g)", g, sc[g], want, amax)
				}
			}
		}
		t.Run(fmt.Sprintf("MXFP8/%dx%d", s.rows, s.cols), func(t *testing.T) {
			q, sc := QuantizeMXFP8(w, s.rows, s.cols)
			if len(q) != len(w) {
				t.Fatalf("len(q)=%d, want %d", len(q), len(w))
			}
			checkScales(t, sc, 448)
			deq, err := DequantMXFP8(q, sc, s.rows, s.cols)
			if err != nil {
				t.Fatal(err)
			}
			checkQuantError(t, w, deq, groupExp(sc), 1.0/16, 1.0/1024)
		})
		t.Run(fmt.Sprintf("MXFP4/%dx%d", s.rows, s.cols), func(t *testing.T) {
			p, sc := QuantizeMXFP4(w, s.rows, s.cols)
			if len(p) != len(w)/2 {
				t.Fatalf("len(packed)=%d, want %d", len(p), len(w)/2)
			}
			checkScales(t, sc, 6)
			deq, err := DequantMXFP4(p, sc, s.rows, s.cols)
			if err != nil {
				t.Fatal(err)
			}
			// E2M1: 1 mantissa bit -> relative half-step 2^-2; spacing 0.5 below 1.
			checkQuantError(t, w, deq, groupExp(sc), 1.0/4, 1.0/4)
		})
	}
}

func TestQuantizeHandExamples(t *testing.T) {
	// MXFP8: group amax 449 -> 2^1 (449/2 <= 448, 449 > 448); 449/2 = 224.5 rounds to
	// 224 = 1.75·2^7 = code (7+7)<<3 | 6 = 0x76. 1.0/2 = 0.5 = code 6<<3 = 0x30.
	// -448/2 = -224 = 0x80 | 0x76.
	w := make([]float32, 32)
	w[0], w[1], w[2] = 449, 1, -448
	q, sc := QuantizeMXFP8(w, 1, 32)
	if sc[0] != 128 || q[0] != 0x76 || q[1] != 0x30 || q[2] != 0xF6 || q[3] != 0 {
		t.Errorf("MXFP8: scale %d q[0:4] % x, want 128, 76 30 f6 00", sc[0], q[:4])
	}
	// Boundary: amax exactly 448 -> 2^0; the next float32 above 448 -> 2^1.
	w = make([]float32, 32)
	w[5] = 448
	if _, sc = QuantizeMXFP8(w, 1, 32); sc[0] != 127 {
		t.Errorf("amax 448: scale %d, want 127", sc[0])
	}
	w[5] = math.Nextafter32(448, 1000)
	if _, sc = QuantizeMXFP8(w, 1, 32); sc[0] != 128 {
		t.Errorf("amax just above 448: scale %d, want 128", sc[0])
	}
	// All-zero group -> exponent 0 (byte 127).
	q, sc = QuantizeMXFP8(make([]float32, 32), 1, 32)
	if sc[0] != 127 || q[0] != 0 {
		t.Errorf("MXFP8 zero group: scale %d q[0] %#x, want 127, 0", sc[0], q[0])
	}
	// MXFP4: amax 6 -> 2^0; 1 -> code 2, -3 -> code 13 packed as 0xD2; 2.5 ties to
	// 2 (code 4), 5 ties to 4 (code 6) -> 0x64.
	w = make([]float32, 32)
	w[0], w[1], w[2], w[3], w[31] = 1, -3, 2.5, 5, 6
	p, sc := QuantizeMXFP4(w, 1, 32)
	if sc[0] != 127 || p[0] != 0xD2 || p[1] != 0x64 || p[15] != 0x70 {
		t.Errorf("MXFP4: scale %d packed % x, want 127, d2 64 ... 70", sc[0], p)
	}
	// MXFP4: amax 6.5 -> 2^1 (6.5 > 6, 3.25 <= 6); 6.5/2 = 3.25 -> 3 (code 5).
	w[31] = 6.5
	p, sc = QuantizeMXFP4(w, 1, 32)
	if sc[0] != 128 || p[15]>>4 != 5 {
		t.Errorf("MXFP4 amax 6.5: scale %d high nibble %d, want 128, 5", sc[0], p[15]>>4)
	}
	// FP8 block 2x2 tiles on a 3x3 matrix: tile (0,0) amax 896 -> 2^1; tile (0,1)
	// amax 0 -> 127; tile (1,0) amax 1e-3 -> smallest e with 1e-3 <= 448·2^e is -18.
	w3 := []float32{896, 1, 0, 2, 3, 0, 1e-3, 0, 0}
	q, sc = QuantizeFP8Block(w3, 3, 3, 2)
	if want := []byte{128, 127, 127 - 18, 127}; string(sc) != string(want) {
		t.Errorf("FP8 block scales %v, want %v", sc, want)
	}
	if q[0] != 0x7E { // 896/2 = 448
		t.Errorf("FP8 block q[0] = %#x, want 0x7e", q[0])
	}
	// NaN elements are ignored by the scale and encode as NaN: amax 3 -> 2^-7
	// (3·2^7 = 384 <= 448 < 768), byte 120; 3·2^7 = 384 = 1.5·2^8 = code 0x7C.
	w = make([]float32, 32)
	w[0], w[1] = float32(math.NaN()), 3
	q, sc = QuantizeMXFP8(w, 1, 32)
	if sc[0] != 120 || q[0] != 0x7F || q[1] != 0x7C {
		t.Errorf("NaN element: scale %d q[0:2] % x, want 120, 7f 7c", sc[0], q[:2])
	}
}

func TestQuantizePreconditionPanics(t *testing.T) {
	cases := []struct {
		name string
		fn   func()
	}{
		{"QuantizeFP8Block", func() { QuantizeFP8Block(make([]float32, 5), 2, 3, 128) }},
		{"QuantizeFP8Block", func() { QuantizeFP8Block(make([]float32, 6), 2, 3, 0) }},
		{"QuantizeMXFP8", func() { QuantizeMXFP8(make([]float32, 40), 1, 40) }},
		{"QuantizeMXFP4", func() { QuantizeMXFP4(make([]float32, 64), 1, 32) }},
		{"QuantizeMXFP4", func() { QuantizeMXFP4(nil, -1, 0) }},
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

func TestDequantErrors(t *testing.T) {
	cases := []struct {
		name string
		fn   func() ([]float32, error)
		want string
	}{
		{"fp8 q short", func() ([]float32, error) { return DequantFP8Block(make([]byte, 5), make([]byte, 1), 2, 3, 128) }, "len(q)=5"},
		{"fp8 scale short", func() ([]float32, error) { return DequantFP8Block(make([]byte, 130*2), make([]byte, 1), 130, 2, 128) }, "len(scale)=1"},
		{"fp8 block 0", func() ([]float32, error) { return DequantFP8Block(nil, nil, 0, 0, 0) }, "block=0"},
		{"fp8 overflow", func() ([]float32, error) { return DequantFP8Block(nil, nil, 1<<40, 1<<40, 128) }, "bad shape"},
		{"mxfp8 overflow", func() ([]float32, error) { return DequantMXFP8(nil, nil, 1<<40, 1<<40) }, "bad shape"},
		{"mxfp4 overflow", func() ([]float32, error) { return DequantMXFP4(nil, nil, 1<<40, 1<<40) }, "bad shape"},
		{"fp8 neg rows", func() ([]float32, error) { return DequantFP8Block(nil, nil, -1, 0, 128) }, "rows=-1"},
		{"mxfp8 cols", func() ([]float32, error) { return DequantMXFP8(make([]byte, 40), make([]byte, 1), 1, 40) }, "cols=40"},
		{"mxfp8 q", func() ([]float32, error) { return DequantMXFP8(make([]byte, 31), make([]byte, 1), 1, 32) }, "len(q)=31"},
		{"mxfp8 scale", func() ([]float32, error) { return DequantMXFP8(make([]byte, 64), make([]byte, 1), 1, 64) }, "len(scale)=1"},
		{"mxfp4 cols", func() ([]float32, error) { return DequantMXFP4(make([]byte, 20), make([]byte, 1), 1, 40) }, "cols=40"},
		{"mxfp4 packed", func() ([]float32, error) { return DequantMXFP4(make([]byte, 32), make([]byte, 1), 1, 32) }, "len(packed)=32"},
		{"mxfp4 scale", func() ([]float32, error) { return DequantMXFP4(make([]byte, 32), make([]byte, 3), 1, 64) }, "len(scale)=3"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := tc.fn()
			if err == nil || out != nil {
				t.Fatalf("got (%v, %v), want an error", out, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

// FuzzDequantShapes feeds arbitrary sizes and buffer lengths to the Dequant*
// functions: they must return an error or a slice of exactly rows*cols values,
// never panic.
func FuzzDequantShapes(f *testing.F) {
	f.Add(int16(2), int16(64), int16(32), uint16(128), uint16(4), uint8(2))
	f.Fuzz(func(t *testing.T, rows, cols, block int16, nq, ns uint16, which uint8) {
		r, c, b := int(rows), int(cols), int(block)
		q, sc := make([]byte, nq), make([]byte, ns)
		var out []float32
		var err error
		switch which % 3 {
		case 0:
			out, err = DequantFP8Block(q, sc, r, c, b)
		case 1:
			out, err = DequantMXFP8(q, sc, r, c)
		default:
			out, err = DequantMXFP4(q, sc, r, c)
		}
		if err == nil && len(out) != r*c {
			t.Fatalf("rows=%d cols=%d: %d values", r, c, len(out))
		}
		if err != nil && out != nil {
			t.Fatalf("error %v with non-nil result", err)
		}
	})
}
