//go:build !(amd64 && goexperiment.simd)

package format

// decodeMXFP4Groups is the portable build's stand-in for the AVX-512 kernel: it
// decodes nothing and leaves every group to the scalar loop.
func decodeMXFP4Groups(dst []float32, packed []byte, scales []byte) int { return 0 }
