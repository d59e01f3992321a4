//go:build amd64 && goexperiment.simd

package kern

import (
	"math"
	"simd/archsimd"
)

func dotVec(a, b []float32) float32 {
	if !hasAVX512 || len(a) < 16 {
		return dotF32(a, b)
	}
	n := len(a) &^ 15
	var acc archsimd.Float32x16
	if n >= 64 {
		return dotF32AVX512(a, b)
	}
	for i := 0; i < n; i += 16 {
		acc = archsimd.LoadFloat32x16((*[16]float32)(a[i:i+16])).MulAdd(archsimd.LoadFloat32x16((*[16]float32)(b[i:i+16])), acc)
	}
	return hsum(acc) + dotF32(a[n:], b[n:])
}

func addScaledVec(y []float32, s float32, x []float32) {
	if !hasAVX512 || len(y) < 16 {
		addScaledScalar(y, s, x)
		return
	}
	n := len(y) &^ 15
	v := archsimd.BroadcastUint32x16(math.Float32bits(s)).AsFloat32x16()
	for i := 0; i < n; i += 16 {
		yy := (*[16]float32)(y[i : i+16])
		archsimd.LoadFloat32x16((*[16]float32)(x[i:i+16])).MulAdd(v, archsimd.LoadFloat32x16(yy)).Store(yy)
	}
	archsimd.ClearAVXUpperBits()
	addScaledScalar(y[n:], s, x[n:])
}
