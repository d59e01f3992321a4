//go:build !(amd64 && goexperiment.simd)

package kern

func sumF32(a []float32) float32 { return sumF32Scalar(a) }
