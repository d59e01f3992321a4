package kern

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
