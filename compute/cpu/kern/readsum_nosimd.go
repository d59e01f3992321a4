//go:build !(amd64 && goexperiment.simd)

package kern

// ReadSum returns the sum of a, reading it as fast as this build can: it is the
// memory-read probe behind moxie's bandwidth ceilings (the sum itself only
// keeps the reads from being optimised away; its rounding is unspecified).
func ReadSum(a []float32) float32 { return readSumScalar(a) }

// SIMD reports whether this build has the archsimd kernels (GOEXPERIMENT=simd).
const SIMD = false
