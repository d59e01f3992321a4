package kern

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestMatMulBatched covers the batched (batch > 1) products on odd shapes:
// row counts that are not a multiple of any row tile, columns that are not a
// multiple of 128 or of a decode panel, batches around every micro-kernel
// and chunk width, E8M0 scale bytes 0 (2^-127) and 255 (NaN), and NaN and
// ±Inf inputs. Each output is compared with the float64 reference: finite
// values within the float32 summation tolerance, NaN where a NaN weight,
// scale or input takes part, and the reference's own IEEE result (±Inf, or
// NaN from Inf-Inf or 0·Inf) where an infinite input does.
func TestMatMulBatched(t *testing.T) {
	pool := NewPool(2)
	defer pool.Close()
	rng := rand.New(rand.NewPCG(21, 22))
	type tc struct {
		name    string
		m       Matrix
		ref     refMatrix
		batches []int
	}
	small := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 64}
	var cases []tc
	fp8 := func(rows, cols, block int, batches []int) {
		m := randFP8(rng, rows, cols, block)
		m.Scale[0] = 0
		if rows > block { // a NaN scale in the last row block only
			m.Scale[len(m.Scale)-1] = 255
		}
		cases = append(cases, tc{fmt.Sprintf("FP8b%d/%dx%d", block, rows, cols), m, refFP8(m), batches})
	}
	mx := func(rows, cols int, batches []int) {
		m := randMX(rng, rows, cols)
		m.Scale[0] = 0
		m.Scale[len(m.Scale)/2] = 255
		cases = append(cases, tc{fmt.Sprintf("MXFP4/%dx%d", rows, cols), m, refMX(m), batches})
	}
	fp8(1, 1, 128, small)
	fp8(45, 200, 128, append(small, 250, 600))
	fp8(33, 600, 128, small)
	fp8(37, 2800, 128, []int{5, 17, 64, 100})
	fp8(8, 512, 128, small)
	fp8(130, 200, 128, []int{7, 64})
	fp8(43, 100, 32, small)
	mx(45, 96, append(small, 250))
	mx(41, 544, small)
	mx(35, 2880, []int{4, 64, 100})
	for _, s := range []shape{{45, 257}, {33, 384}, {1, 3}} {
		b := randBF(rng, s.rows, s.cols)
		cases = append(cases, tc{fmt.Sprintf("BF16/%dx%d", s.rows, s.cols), b, refBF(b), small})
		f := randF32(rng, s.rows, s.cols)
		cases = append(cases, tc{fmt.Sprintf("F32/%dx%d", s.rows, s.cols), f, refF(f), small})
	}
	for _, c := range cases {
		_, cols := c.m.Dims()
		for _, batch := range c.batches {
			x := randX(rng, batch*cols)
			// Special inputs in a few batch rows: NaN, +Inf and -Inf.
			for k, v := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
				if b := 2*k + 1; b < batch {
					x[b*cols+(k*7)%cols] = v
				}
			}
			for _, path := range paths {
				for _, pp := range []struct {
					name string
					p    *Pool
				}{{"nil", nil}, {"pool2", pool}} {
					t.Run(fmt.Sprintf("%s/b%d/%s/%s", c.name, batch, path.name, pp.name), func(t *testing.T) {
						checkBatched(t, path.mul, c.m, c.ref, pp.p, x, batch)
					})
				}
			}
		}
	}
}

// checkBatched checks mul's rows-[0,rows) product. Outputs whose float64
// reference is finite go through checkProductWant's tolerance; the rest
// must equal the reference's ±Inf or be NaN where it is NaN.
func checkBatched(t *testing.T, mul func(Matrix, *Pool, []float32, []float32, int, int, int), m Matrix, ref refMatrix, p *Pool, x []float32, batch int) {
	t.Helper()
	rows, cols := m.Dims()
	want, mag, nan := ref.product(x, batch, 0, rows)
	y := make([]float32, batch*rows)
	mul(m, p, y, x, batch, 0, rows)
	bad := 0
	for i := range y {
		got, w := float64(y[i]), want[i]
		var ok bool
		switch {
		case nan[i] || math.IsNaN(w):
			ok = math.IsNaN(got)
		case math.IsInf(w, 0):
			ok = got == w
		default:
			ok = math.Abs(got-w) <= tolerance(cols, mag[i])
		}
		if !ok {
			t.Errorf("y[%d] (batch %d row %d) = %.9g, want %.9g (tol %.3g)", i, i/rows, i%rows, got, w, tolerance(cols, mag[i]))
			if bad++; bad > 5 {
				t.FailNow()
			}
		}
	}
}
