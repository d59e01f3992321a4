package qat

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// e4m3Grid is every finite non-negative E4M3fn value with its code, from the
// format's definition (bias 7, 3 mantissa bits, subnormals m/8·2^-6, 0x7F NaN),
// written here independently of package format.
func e4m3Grid() (vals []float64, codes []int) {
	for c := 0; c < 0x7f; c++ {
		e, m := c>>3, c&7
		v := math.Ldexp(float64(m)/8, -6)
		if e > 0 {
			v = math.Ldexp(1+float64(m)/8, e-7)
		}
		vals, codes = append(vals, v), append(codes, c)
	}
	return vals, codes
}

// nearestOnGrid rounds |v| to the nearest grid value (ties to the even
// code), saturating at the last, and gives it v's sign.
func nearestOnGrid(v float64, vals []float64, codes []int) float64 {
	a := math.Abs(v)
	best := 0
	for i := range vals {
		d, db := math.Abs(vals[i]-a), math.Abs(vals[best]-a)
		if d < db || d == db && codes[i]%2 == 0 && codes[best]%2 != 0 {
			best = i
		}
	}
	if a > vals[len(vals)-1] {
		best = len(vals) - 1
	}
	return math.Copysign(vals[best], v)
}

// simRef is the reference's block simulation in float64 on the grid: amax
// = max(|x|, floor) over each block, s = 2^ceil(log2(float32(amax)/qmax))
// (the quotient rounded to float32, as the kernel forms it), each value
// rounded on the grid after dividing by s and clamping to ±qmax.
func simRef(x []float32, block int, floor, qmax float64, vals []float64, codes []int) []float32 {
	out := make([]float32, len(x))
	for lo := 0; lo < len(x); lo += block {
		hi := min(lo+block, len(x))
		amax := floor
		for _, v := range x[lo:hi] {
			amax = math.Max(amax, math.Abs(float64(v)))
		}
		s := math.Ldexp(1, int(math.Ceil(math.Log2(float64(float32(amax)/float32(qmax))))))
		for i := lo; i < hi; i++ {
			q := math.Max(-qmax, math.Min(qmax, float64(x[i])/s))
			out[i] = float32(nearestOnGrid(q, vals, codes) * s)
		}
	}
	return out
}

// qatVector is test data with the shapes quantization meets: normal values
// over several decades, exact zeros, a block of tiny values (under act_quant's
// floor), values on the grid's midpoints and beyond its largest value.
func qatVector(n int, seed uint64) []float32 {
	rng := rand.New(rand.NewPCG(seed, 5))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(5)-2)))
	}
	for i := 0; i < n; i += 17 {
		x[i] = 0
	}
	for i := 64; i < min(n, 96); i++ {
		x[i] = float32(rng.NormFloat64() * 1e-6)
	}
	if n > 140 {
		x[130], x[131], x[132] = 448*3, 1.0625, -2.5 // a block whose amax makes s 4: 1.0625/4 and -2.5/4 sit on midpoints
	}
	return x
}

func TestFP8Sim(t *testing.T) {
	vals, codes := e4m3Grid()
	for _, tc := range []struct {
		name  string
		n     int
		block int
	}{{"act 128, partial last", 300, ActBlock}, {"kv 64", 448, KVBlock}, {"one short block", 40, KVBlock}} {
		t.Run(tc.name, func(t *testing.T) {
			x := qatVector(tc.n, uint64(tc.n))
			want := simRef(x, tc.block, ActMin, 448, vals, codes)
			got := slices.Clone(x)
			FP8Sim(got, tc.block)
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) && !(got[i] == 0 && want[i] == 0) {
					t.Fatalf("value %d (%g): got %g, want %g", i, x[i], got[i], want[i])
				}
			}
			again := slices.Clone(got)
			FP8Sim(again, tc.block)
			if !slices.Equal(again, got) {
				t.Error("a simulated vector is not a fixed point of the simulation")
			}
		})
	}
}

func TestFP4Sim(t *testing.T) {
	vals := []float64{0, 0.5, 1, 1.5, 2, 3, 4, 6}
	codes := []int{0, 1, 2, 3, 4, 5, 6, 7}
	x := qatVector(200, 9)
	want := simRef(x, FP4Block, 6*math.Ldexp(1, -126), 6, vals, codes)
	got := slices.Clone(x)
	FP4Sim(got)
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) && !(got[i] == 0 && want[i] == 0) {
			t.Fatalf("value %d (%g): got %g, want %g", i, x[i], got[i], want[i])
		}
	}
}

func TestPow2Ceil(t *testing.T) {
	for _, y := range []float32{1, 2, 0.5, 3, 1.0000001, 0.99999994, 448, 1e-30, 6e-38, 3e30, 0.75} {
		want := math.Ldexp(1, int(math.Ceil(math.Log2(float64(y)))))
		if got := Pow2Ceil(y); float64(got) != want {
			t.Errorf("Pow2Ceil(%g) = %g, want %g", y, got, want)
		}
	}
}

func TestHadamard(t *testing.T) {
	for _, n := range []int{1, 2, 32, 128} {
		x := qatVector(n, uint64(n))
		got := slices.Clone(x)
		Hadamard(got)
		// H[i][j] = (-1)^popcount(i&j) / sqrt(n), in float64.
		worst := 0.0
		for i := range n {
			s := 0.0
			for j := range n {
				sign := 1.0
				if bitsSet(i&j)%2 == 1 {
					sign = -1
				}
				s += sign * float64(x[j])
			}
			s /= math.Sqrt(float64(n))
			worst = math.Max(worst, math.Abs(float64(got[i])-s))
		}
		norm := 0.0
		for _, v := range x {
			norm = math.Max(norm, math.Abs(float64(v)))
		}
		if worst > 1e-6*norm*math.Sqrt(float64(n)) {
			t.Errorf("n %d: max error %.3g against the Sylvester matrix (max |x| %.3g)", n, worst, norm)
		}
	}
}

func bitsSet(v int) int {
	n := 0
	for ; v != 0; v &= v - 1 {
		n++
	}
	return n
}

// TestActScaleExp checks ActScaleExp against Pow2Ceil of the float32
// quotient: every mantissa within 2^14 of 1.75's (0x600000) at every
// exponent from ActMin's up, and every 4099th float32 from ActMin to the
// largest. (Every float32 from ActMin up agrees: 1,185,827,049 values,
// checked once in session 22; too slow for each run.)
func TestActScaleExp(t *testing.T) {
	check := func(b uint32) {
		v := math.Float32frombits(b)
		if v < ActMin {
			return
		}
		want := Pow2Ceil(v / 448)
		if got := float32(math.Ldexp(1, ActScaleExp(v))); got != want {
			t.Fatalf("ActScaleExp(%g) = 2^%d, want %g", v, ActScaleExp(v), want)
		}
	}
	lo, hi := math.Float32bits(ActMin), math.Float32bits(math.MaxFloat32)
	for exp := lo >> 23; exp <= hi>>23; exp++ {
		for m := uint32(0x600000 - 1<<14); m <= 0x600000+1<<14; m++ {
			check(exp<<23 | m)
		}
		check(exp << 23)
		check(exp<<23 | 0x7fffff)
	}
	for b := lo; b <= hi && b >= lo; b += 4099 {
		check(b)
	}
}
