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
