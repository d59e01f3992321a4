package kern

import "math"

// Dot returns Σ a[i]·b[i] over len(a) in float32 (the order of additions
// is not specified). It panics if len(b) < len(a).
func Dot(a, b []float32) float32 {
	b = b[:len(a)]
	return dotVec(a, b)
}

// AddScaled sets y[i] += s·x[i] for i < len(y) (with or without a fused
// multiply-add). It panics if len(x) < len(y); y and x must not overlap.
func AddScaled(y []float32, s float32, x []float32) {
	x = x[:len(y)]
	addScaledVec(y, s, x)
}

func addScaledScalar(y []float32, s float32, x []float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] += s * x[i]
	}
}

// Exp sets dst[i] = e^src[i] for i < len(dst) in float32, within a few
// units in the last place of the exact value (IEEE special cases as
// math.Exp: NaN stays NaN, +Inf gives +Inf, -Inf gives 0; overflow gives
// +Inf). It panics if len(src) < len(dst); dst and src must not overlap.
func Exp(dst, src []float32) {
	src = src[:len(dst)]
	expVec(dst, src)
}

func expScalar(dst, src []float32) {
	src = src[:len(dst)]
	for i, v := range src {
		dst[i] = float32(math.Exp(float64(v)))
	}
}

// WeightedSum sets o[c] = Σ_i p[i]·v[i*len(o)+c] over i < len(p) (o is
// overwritten; for each c the terms are added in order of i, with or without
// fused multiply-adds). It panics if len(v) < len(p)*len(o); o must not
// overlap p or v.
func WeightedSum(o, p, v []float32) {
	v = v[:len(p)*len(o)]
	weightedSumVec(o, p, v)
}

func weightedSumScalar(o, p, v []float32) {
	clear(o)
	n := len(o)
	for i, pi := range p {
		addScaledScalar(o, pi, v[i*n:(i+1)*n])
	}
}

// ClearUpper marks the upper halves of the vector registers clean
// (VZEROUPPER) where the build uses AVX-512, and does nothing elsewhere.
// Go compiles scalar float code to legacy SSE instructions, which run many
// times slower while the upper state is dirty; on go1.26 with
// GOEXPERIMENT=simd the state was measured dirty after an asynchronous
// preemption, so long scalar float loops call this now and then (it costs
// about a cycle).
func ClearUpper() { clearUpper() }
