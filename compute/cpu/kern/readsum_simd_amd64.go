//go:build amd64 && goexperiment.simd

package kern

import "simd/archsimd"

// ReadSum returns the sum of a, reading it as fast as this build can: it is the
// memory-read probe behind moxie's bandwidth ceilings (the sum itself only
// keeps the reads from being optimised away; its rounding is unspecified).
func ReadSum(a []float32) float32 {
	if !hasAVX512 {
		return readSumScalar(a)
	}
	var s0, s1, s2, s3 archsimd.Float32x16
	i := 0
	for ; i+64 <= len(a); i += 64 {
		aa := (*[64]float32)(a[i : i+64])
		s0 = s0.Add(archsimd.LoadFloat32x16((*[16]float32)(aa[0:16])))
		s1 = s1.Add(archsimd.LoadFloat32x16((*[16]float32)(aa[16:32])))
		s2 = s2.Add(archsimd.LoadFloat32x16((*[16]float32)(aa[32:48])))
		s3 = s3.Add(archsimd.LoadFloat32x16((*[16]float32)(aa[48:64])))
	}
	return hsum(s0.Add(s1).Add(s2.Add(s3))) + readSumScalar(a[i:])
}

// SIMD reports whether this build has the archsimd kernels (GOEXPERIMENT=simd).
const SIMD = true
