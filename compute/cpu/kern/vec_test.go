package kern

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestVec checks Dot and AddScaled against float64 sums on lengths around
// the vector widths.
func TestVec(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	for _, n := range []int{0, 1, 7, 15, 16, 17, 31, 48, 63, 64, 65, 130, 1000} {
		t.Run(fmt.Sprintf("n%d", n), func(t *testing.T) {
			a, b := randX(rng, n), randX(rng, n+3)
			var want, mag float64
			for i := range n {
				want += float64(a[i]) * float64(b[i])
				mag += math.Abs(float64(a[i]) * float64(b[i]))
			}
			if got := Dot(a, b); math.Abs(float64(got)-want) > tolerance(n, mag) {
				t.Errorf("Dot = %v, want %v", got, want)
			}
			y := randX(rng, n)
			y0 := append([]float32(nil), y...)
			s := float32(rng.NormFloat64())
			AddScaled(y, s, b)
			for i := range n {
				w := float64(y0[i]) + float64(s)*float64(b[i])
				tol := 2.0 / (1 << 24) * (math.Abs(float64(y0[i])) + math.Abs(float64(s)*float64(b[i])))
				if math.Abs(float64(y[i])-w) > tol {
					t.Fatalf("AddScaled: y[%d] = %v, want %v", i, y[i], w)
				}
			}
		})
	}
}

// TestExp compares Exp with math.Exp in float64: within 4 units in the last
// place of float32 on normal results, exactly on the special cases.
func TestExp(t *testing.T) {
	rng := rand.New(rand.NewPCG(33, 34))
	src := []float32{0, -0, 1, -1, 0.5, 88, -87, 88.5, 88.8, -87.5, -103, -200, 200,
		float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), 1e-8, -1e-8}
	for range 3000 {
		src = append(src, float32(rng.Float64()*190-100))
	}
	for _, n := range []int{len(src), 17, 16, 5, 0} {
		dst := make([]float32, n)
		Exp(dst, src)
		for i := range n {
			want := math.Exp(float64(src[i]))
			got := float64(dst[i])
			switch {
			case math.IsNaN(want):
				if !math.IsNaN(got) {
					t.Errorf("Exp(%v) = %v, want NaN", src[i], got)
				}
			case want > math.MaxFloat32:
				if !math.IsInf(got, 1) {
					t.Errorf("Exp(%v) = %v, want +Inf", src[i], got)
				}
			case want < 0x1p-126: // subnormal results: absolute error
				if math.Abs(got-want) > 0x1p-149 {
					t.Errorf("Exp(%v) = %v, want %v", src[i], got, want)
				}
			default:
				if math.Abs(got-want) > 4*0x1p-24*want {
					t.Errorf("Exp(%v) = %v, want %v (rel err %.3g)", src[i], got, want, math.Abs(got-want)/want)
				}
			}
		}
	}
}

// TestWeightedSum compares WeightedSum with float64 sums for row lengths
// on and off the vector widths.
func TestWeightedSum(t *testing.T) {
	rng := rand.New(rand.NewPCG(35, 36))
	for _, sh := range [][2]int{{0, 64}, {1, 64}, {7, 64}, {33, 128}, {5, 80}, {9, 16}, {4, 13}, {3, 0}, {200, 192}} {
		keys, n := sh[0], sh[1]
		t.Run(fmt.Sprintf("%dx%d", keys, n), func(t *testing.T) {
			p, v := randX(rng, keys), randX(rng, keys*n)
			o := randX(rng, n) // overwritten
			WeightedSum(o, p, v)
			for c := range n {
				var want, mag float64
				for i := range keys {
					want += float64(p[i]) * float64(v[i*n+c])
					mag += math.Abs(float64(p[i]) * float64(v[i*n+c]))
				}
				if d := math.Abs(float64(o[c]) - want); d > tolerance(keys, mag) {
					t.Fatalf("o[%d] = %v, want %v", c, o[c], want)
				}
			}
		})
	}
}
