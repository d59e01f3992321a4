//go:build !(amd64 && goexperiment.simd)

package kern

func dotVec(a, b []float32) float32 { return dotF32(a, b) }

func addScaledVec(y []float32, s float32, x []float32) { addScaledScalar(y, s, x) }

func expVec(dst, src []float32) { expScalar(dst, src) }

func weightedSumVec(o, p, v []float32) { weightedSumScalar(o, p, v) }

func clearUpper() {}
