package kern

import (
	"math"
	"testing"
)

func TestReadSum(t *testing.T) {
	for _, n := range []int{0, 1, 7, 63, 64, 65, 1000, 4096} {
		a := make([]float32, n)
		var want float64
		for i := range a {
			a[i] = float32(i%13) * 0.25 // exact in float32; partial sums stay exact
			want += float64(a[i])
		}
		if got := ReadSum(a); math.Abs(float64(got)-want) > 0 {
			t.Errorf("ReadSum of %d values = %g, want %g", n, got, want)
		}
	}
}
