package kern

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// Kernels forced onto the portable path, so that the SIMD build tests both.
type (
	scalarFP8   struct{ fp8Kernel }
	scalarMXFP4 struct{ mxfp4Kernel }
	scalarBF16  struct{ bf16Kernel }
	scalarF32   struct{ f32Kernel }
)

func (k scalarFP8) matvec(y, x []float32, lo, hi int) { fp8MatvecScalar(k.w, y, x, lo, hi) }
func (k scalarFP8) decode(d []float32, ld, r0, nr, c0, c1 int) {
	fp8DecodeScalar(k.w, d, ld, r0, nr, c0, c1)
}
func (k scalarMXFP4) matvec(y, x []float32, lo, hi int) { mxfp4MatvecScalar(k.w, y, x, lo, hi) }

func (k scalarMXFP4) decode(d []float32, ld, r0, nr, c0, c1 int) {
	mxfp4DecodeScalar(k.w, d, ld, r0, nr, c0, c1)
}
func (k scalarBF16) matvec(y, x []float32, lo, hi int) { bf16MatvecScalar(k.w, y, x, lo, hi) }
func (k scalarBF16) decode(d []float32, ld, r0, nr, c0, c1 int) {
	bf16DecodeScalar(k.w, d, ld, r0, nr, c0, c1)
}
func (k scalarF32) matvec(y, x []float32, lo, hi int) { f32MatvecScalar(k.w, y, x, lo, hi) }
func (k scalarF32) decode(d []float32, ld, r0, nr, c0, c1 int) {
	f32DecodeScalar(k.w, d, ld, r0, nr, c0, c1)
}

func scalarOf(m Matrix) kernel {
	switch w := m.(type) {
	case FP8Block:
		return scalarFP8{fp8Kernel{w}}
	case MXFP4:
		return scalarMXFP4{mxfp4Kernel{w}}
	case BF16:
		return scalarBF16{bf16Kernel{w}}
	case F32:
		return scalarF32{f32Kernel{w}}
	}
	panic("unknown matrix")
}

// paths are the ways a product is computed: the public API (SIMD where the
// build and CPU have it) and the portable kernels through the same driver.
var paths = []struct {
	name string
	mul  func(m Matrix, p *Pool, y, x []float32, batch, r0, r1 int)
}{
	{"api", func(m Matrix, p *Pool, y, x []float32, batch, r0, r1 int) {
		rows, _ := m.Dims()
		if r0 == 0 && r1 == rows {
			m.MatMul(p, y, x, batch)
		} else {
			m.MatMulRows(p, y, x, batch, r0, r1)
		}
	}},
	{"scalar", func(m Matrix, p *Pool, y, x []float32, batch, r0, r1 int) {
		run(p, scalarOf(m), y, x, batch, r0, r1)
	}},
}

// checkProduct runs one product and compares it with the float64 reference.
// y carries sentinels past batch*(r1-r0) that must survive, and x must come
// back unchanged.
func checkProduct(t *testing.T, mul func(Matrix, *Pool, []float32, []float32, int, int, int), m Matrix, ref refMatrix, p *Pool, x []float32, batch, r0, r1 int) {
	t.Helper()
	want, mag, nan := ref.product(x, batch, r0, r1)
	checkProductWant(t, mul, m, ref.cols, p, x, batch, r0, r1, want, mag, nan)
}

// checkProductWant is checkProduct with the reference values for rows
// [r0,r1) given.
func checkProductWant(t *testing.T, mul func(Matrix, *Pool, []float32, []float32, int, int, int), m Matrix, cols int, p *Pool, x []float32, batch, r0, r1 int, want, mag []float64, nan []bool) {
	t.Helper()
	n := batch * (r1 - r0)
	y := make([]float32, n+3)
	for i := range y {
		y[i] = 12345
	}
	x0 := slices.Clone(x)
	mul(m, p, y, x, batch, r0, r1)
	if !slices.Equal(x, x0) {
		t.Fatalf("x was modified")
	}
	for i := n; i < len(y); i++ {
		if y[i] != 12345 {
			t.Fatalf("y[%d] past the output was written: %v", i, y[i])
		}
	}
	bad := 0
	for i := range n {
		got := float64(y[i])
		if nan[i] {
			if !math.IsNaN(got) {
				t.Errorf("y[%d] (batch %d row %d) = %v, want NaN", i, i/(r1-r0), r0+i%(r1-r0), got)
				bad++
			}
		} else if d := math.Abs(got - want[i]); !(d <= tolerance(cols, mag[i])) {
			t.Errorf("y[%d] (batch %d row %d) = %.9g, want %.9g (err %.3g > tol %.3g)", i, i/(r1-r0), r0+i%(r1-r0), got, want[i], d, tolerance(cols, mag[i]))
			bad++
		}
		if bad > 5 {
			t.FailNow()
		}
	}
}

type shape struct{ rows, cols int }

func TestMatMul(t *testing.T) {
	pool := NewPool(3) // 3 does not divide the row counts evenly
	defer pool.Close()
	fp8Shapes := []shape{{1, 32}, {1, 1}, {3, 7}, {160, 96}, {96, 48}, {48, 160}, {128, 128}, {129, 257}, {256, 640}, {130, 1100}, {9, 16640}}
	mxShapes := []shape{{1, 32}, {160, 96}, {96, 64}, {48, 160}, {128, 128}, {129, 256}, {130, 1088}, {7, 4160}, {8, 512}, {12, 1536}}
	denseShapes := []shape{{1, 32}, {1, 1}, {160, 96}, {129, 257}, {33, 1030}}
	if !testing.Short() {
		fp8Shapes = append(fp8Shapes, shape{1024, 4096}, shape{300, 8192})
		mxShapes = append(mxShapes, shape{512, 4096}, shape{1030, 2048})
		denseShapes = append(denseShapes, shape{260, 4096})
	}
	rng := rand.New(rand.NewPCG(1, 2))
	type tc struct {
		name string
		m    Matrix
		ref  refMatrix
	}
	var cases []tc
	for _, s := range fp8Shapes {
		m := randFP8(rng, s.rows, s.cols, 128)
		cases = append(cases, tc{fmt.Sprintf("FP8/%dx%d", s.rows, s.cols), m, refFP8(m)})
	}
	for _, s := range []shape{{70, 100}, {33, 64}} { // other block sizes take the generic path
		m := randFP8(rng, s.rows, s.cols, 32)
		cases = append(cases, tc{fmt.Sprintf("FP8b32/%dx%d", s.rows, s.cols), m, refFP8(m)})
	}
	for _, s := range mxShapes {
		m := randMX(rng, s.rows, s.cols)
		cases = append(cases, tc{fmt.Sprintf("MXFP4/%dx%d", s.rows, s.cols), m, refMX(m)})
	}
	for _, s := range denseShapes {
		m := randBF(rng, s.rows, s.cols)
		cases = append(cases, tc{fmt.Sprintf("BF16/%dx%d", s.rows, s.cols), m, refBF(m)})
		f := randF32(rng, s.rows, s.cols)
		cases = append(cases, tc{fmt.Sprintf("F32/%dx%d", s.rows, s.cols), f, refF(f)})
	}
	for _, c := range cases {
		rows, cols := c.m.Dims()
		for _, batch := range []int{1, 3, 16} {
			if rows*cols*batch > 1<<24 && batch > 3 {
				continue // the large shapes run batch 1 and 3 only
			}
			x := randX(rng, batch*cols)
			want, mag, nan := c.ref.product(x, batch, 0, rows)
			ranges := [][2]int{{0, rows}}
			if rows > 8 {
				ranges = append(ranges, [2]int{5, rows - 2}, [2]int{rows - 1, rows}, [2]int{3, 3})
			}
			for _, rr := range ranges {
				for _, path := range paths {
					for _, pp := range []struct {
						name string
						p    *Pool
					}{{"nil", nil}, {"pool3", pool}} {
						name := fmt.Sprintf("%s/b%d/rows%d-%d/%s/%s", c.name, batch, rr[0], rr[1], path.name, pp.name)
						t.Run(name, func(t *testing.T) {
							// The reference rows [r0,r1) of every batch row.
							var w, g []float64
							var nn []bool
							for b := range batch {
								w = append(w, want[b*rows+rr[0]:b*rows+rr[1]]...)
								g = append(g, mag[b*rows+rr[0]:b*rows+rr[1]]...)
								nn = append(nn, nan[b*rows+rr[0]:b*rows+rr[1]]...)
							}
							checkProductWant(t, path.mul, c.m, cols, pp.p, x, batch, rr[0], rr[1], w, g, nn)
						})
					}
				}
			}
		}
	}
}

// TestSpecialValues checks the decoders on every code: each E4M3 code and
// each E2M1 code alone in a row, times 1, must give exactly its value, and
// NaN codes or NaN scales must give NaN.
func TestSpecialValues(t *testing.T) {
	for _, path := range paths {
		t.Run("FP8/"+path.name, func(t *testing.T) {
			// 256 rows x 64 cols: row b has code b at column b%64, zeros elsewhere.
			m := FP8Block{Q: make([]byte, 256*64), Scale: []byte{127, 127}, Rows: 256, Cols: 64, Block: 128}
			for b := range 256 {
				m.Q[b*64+b%64] = byte(b)
			}
			x := make([]float32, 64)
			for i := range x {
				x[i] = 1
			}
			y := make([]float32, 256)
			path.mul(m, nil, y, x, 1, 0, 256)
			for b := range 256 {
				want := refE4M3(byte(b))
				if math.IsNaN(want) != math.IsNaN(float64(y[b])) || (!math.IsNaN(want) && float64(y[b]) != want) {
					t.Errorf("code %#02x: got %v, want %v", b, y[b], want)
				}
			}
		})
		t.Run("FP8scale/"+path.name, func(t *testing.T) {
			// Two row blocks; the second has a NaN scale and a code with scale 2^-100.
			m := FP8Block{Q: make([]byte, 256*200), Scale: []byte{27, 127, 0xFF, 127}, Rows: 256, Cols: 200, Block: 128}
			for i := range m.Q {
				m.Q[i] = 0x38 // 1.0
			}
			x := make([]float32, 200)
			for i := range x {
				x[i] = 1
			}
			y := make([]float32, 256)
			path.mul(m, nil, y, x, 1, 0, 256)
			want0 := float32(128*math.Pow(2, -100) + 72)
			for r := range 128 {
				if y[r] != want0 {
					t.Fatalf("row %d: got %v, want %v", r, y[r], want0)
				}
			}
			for r := 128; r < 256; r++ {
				if !math.IsNaN(float64(y[r])) {
					t.Fatalf("row %d under a NaN scale: got %v, want NaN", r, y[r])
				}
			}
		})
		t.Run("MXFP4/"+path.name, func(t *testing.T) {
			// 16 rows x 32 cols: row c has code c at column c (even: low nibble, odd: high).
			m := MXFP4{Packed: make([]byte, 16*16), Scale: make([]byte, 16), Rows: 16, Cols: 32}
			for c := range 16 {
				m.Scale[c] = 128 // x2
				if c%2 == 0 {
					m.Packed[c*16+c/2] = byte(c)
				} else {
					m.Packed[c*16+c/2] = byte(c) << 4
				}
			}
			m.Scale[5] = 0xFF
			x := make([]float32, 32)
			for i := range x {
				x[i] = 1
			}
			y := make([]float32, 16)
			path.mul(m, nil, y, x, 1, 0, 16)
			for c := range 16 {
				want := 2 * refE2M1(byte(c))
				if c == 5 {
					if !math.IsNaN(float64(y[c])) {
						t.Errorf("row 5 (NaN scale): got %v, want NaN", y[c])
					}
					continue
				}
				if float64(y[c]) != want {
					t.Errorf("code %d: got %v, want %v", c, y[c], want)
				}
			}
		})
	}
}

func TestPanics(t *testing.T) {
	mustPanic := func(t *testing.T, want string, f func()) {
		t.Helper()
		defer func() {
			r := recover()
			if r == nil {
				t.Fatalf("no panic, want one containing %q", want)
			}
			if s := fmt.Sprint(r); !strings.Contains(s, want) {
				t.Fatalf("panic %q does not contain %q", s, want)
			}
		}()
		f()
	}
	fp8 := FP8Block{Q: make([]byte, 4*8), Scale: make([]byte, 1), Rows: 4, Cols: 8, Block: 128}
	mx := MXFP4{Packed: make([]byte, 4*16), Scale: make([]byte, 4), Rows: 4, Cols: 32}
	y, x := make([]float32, 64), make([]float32, 64)
	tests := []struct {
		name, want string
		f          func()
	}{
		{"fp8 short Q", "len(Q) = 31, want 32", func() {
			w := fp8
			w.Q = w.Q[:31]
			w.MatMul(nil, y, x, 1)
		}},
		{"fp8 scale", "len(Scale) = 2, want 1", func() {
			w := fp8
			w.Scale = make([]byte, 2)
			w.MatMul(nil, y, x, 1)
		}},
		{"fp8 block 0", "block > 0", func() {
			w := fp8
			w.Block = 0
			w.MatMul(nil, y, x, 1)
		}},
		{"short x", "len(x) = 15 < batch 2 * cols 8", func() { fp8.MatMul(nil, y, x[:15], 2) }},
		{"short y", "len(y) = 7 < batch 2 * rows 4", func() { fp8.MatMul(nil, y[:7], x, 2) }},
		{"negative batch", "batch -1 < 0", func() { fp8.MatMul(nil, y, x, -1) }},
		{"row range", "row range [3,5) out of range", func() { fp8.MatMulRows(nil, y, x, 1, 3, 5) }},
		{"row range reversed", "row range [3,2) out of range", func() { fp8.MatMulRows(nil, y, x, 1, 3, 2) }},
		{"mx cols", "cols a multiple of 32", func() {
			MXFP4{Packed: make([]byte, 8), Scale: make([]byte, 1), Rows: 1, Cols: 16}.MatMul(nil, y, x, 1)
		}},
		{"mx packed", "len(Packed) = 63, want 64", func() {
			w := mx
			w.Packed = w.Packed[:63]
			w.MatMul(nil, y, x, 1)
		}},
		{"mx scale", "len(Scale) = 3, want 4", func() {
			w := mx
			w.Scale = w.Scale[:3]
			w.MatMul(nil, y, x, 1)
		}},
		{"bf16", "len(W) = 7 bytes, want 8", func() { BF16{W: make([]byte, 7), Rows: 2, Cols: 2}.MatMul(nil, y, x, 1) }},
		{"f32", "len(W) = 3, want 4", func() { F32{W: make([]float32, 3), Rows: 2, Cols: 2}.MatMul(nil, y, x, 1) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { mustPanic(t, tt.want, tt.f) })
	}
	t.Run("batch 0 and empty ranges are no-ops", func(t *testing.T) {
		y := []float32{7}
		fp8.MatMul(nil, y, nil, 0)
		fp8.MatMulRows(nil, y, x, 1, 2, 2)
		if y[0] != 7 {
			t.Fatalf("y written: %v", y)
		}
	})
	t.Run("zero cols gives zeros", func(t *testing.T) {
		y := []float32{7, 7, 7}
		F32{Rows: 3}.MatMul(nil, y, nil, 1)
		if !slices.Equal(y, []float32{0, 0, 0}) {
			t.Fatalf("y = %v, want zeros", y)
		}
	})
}

// TestMXFP4WideRows covers the vector MXFP4 path's edges on rows of whole
// 512-column super-groups: E8M0 byte 0 (2^-127, the subnormal scale) and 255
// (NaN) in any block, the last row of the matrix (whose offset loads would
// read past the codes), and rows wider than the kernel's input chunk.
func TestMXFP4WideRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, cols := range []int{512, 1536, 4096 + 512, 8704} {
		const rows = 9
		m := randMX(rng, rows, cols)
		nb := cols / 32
		for c := range cols / 2 { // rows 0 and 8: every code 1.0
			m.Packed[c] = 0x22
			m.Packed[8*cols/2+c] = 0x22
		}
		for b := range nb {
			m.Scale[b] = 0      // row 0: all 2^-127
			m.Scale[8*nb+b] = 0 // row 8 (the last): all 2^-127
		}
		m.Scale[1*nb+nb-1] = 0xFF          // row 1: NaN in the last block
		m.Scale[2*nb] = 0xFF               // row 2: NaN in the first block
		m.Scale[3*nb+nb/2] = 0             // row 3: one 2^-127 block mid-row
		m.Scale[4*nb+max(nb-17, 8)] = 0xFF // row 4: NaN in a middle super-group
		x := make([]float32, cols)
		for i := range x {
			x[i] = 1
		}
		ref := refMX(m)
		for _, path := range paths {
			t.Run(fmt.Sprintf("%d/%s", cols, path.name), func(t *testing.T) {
				checkProduct(t, path.mul, m, ref, nil, x, 1, 0, rows)
				// Rows of 1.0 · 2^-127 sum to cols · 2^-127 exactly.
				y := make([]float32, rows)
				path.mul(m, nil, y, x, 1, 0, rows)
				want := float32(math.Ldexp(float64(cols), -127))
				for _, r := range []int{0, 8} {
					if y[r] != want {
						t.Errorf("row %d (scale byte 0): got %g, want %g", r, y[r], want)
					}
				}
				for _, r := range []int{1, 2, 4} {
					if !math.IsNaN(float64(y[r])) {
						t.Errorf("row %d (a NaN scale byte): got %g, want NaN", r, y[r])
					}
				}
			})
		}
		// Random inputs against the reference, every row range.
		xr := randX(rng, cols)
		pool := NewPool(2)
		for _, path := range paths {
			for _, rr := range [][2]int{{0, rows}, {3, rows}, {rows - 1, rows}} {
				for _, p := range []*Pool{nil, pool} {
					t.Run(fmt.Sprintf("%d/%s/rows%d-%d/pool%d/random", cols, path.name, rr[0], rr[1], p.Workers()), func(t *testing.T) {
						checkProduct(t, path.mul, m, ref, p, xr, 1, rr[0], rr[1])
					})
				}
			}
		}
		pool.Close()
	}
}
