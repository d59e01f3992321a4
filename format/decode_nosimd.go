//go:build !(amd64 && goexperiment.simd)

package format

// decodeMXFP4Groups is the portable build's stand-in for the AVX-512 kernel: it
// decodes nothing and leaves every group to the scalar loop.
func decodeMXFP4Groups(dst []float32, packed []byte, scales []byte) int { return 0 }

// decodeE4M3Blocks is the portable stand-in for the AVX-512 kernel: it decodes
// nothing and leaves every block to the scalar loop.
func decodeE4M3Blocks(dst []float32, q []byte, scales []byte, block int) int { return 0 }

// decodeBF16Vec is the portable stand-in for the AVX-512 kernel: it decodes
// nothing and leaves every value to the scalar loop.
func decodeBF16Vec(dst []float32, src []byte) int { return 0 }

// decodeE4M3Vec is the portable stand-in for the AVX-512 kernel: it decodes
// nothing and leaves every value to the scalar loop.
func decodeE4M3Vec(dst []float32, src []byte) int { return 0 }
