//go:build amd64 && goexperiment.simd

package kern

import (
	"math"
	"simd/archsimd"
	"unsafe"
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

// Range of inputs whose e^x the vector path computes: n = round(x·log2 e)
// then stays in [-126, 127], so 2^n is a normal float32.
const (
	expLo = -87
	expHi = 88
)

// expVec evaluates e^x = 2^n · e^r, r = x - n·ln2 in [-ln2/2, ln2/2], with
// the degree-6 polynomial of Cephes' expf (about 1 ulp). Inputs outside
// [expLo, expHi] (and NaN) are recomputed by the scalar path afterwards.
func expVec(dst, src []float32) {
	if !hasAVX512 || len(dst) < 16 {
		expScalar(dst, src)
		return
	}
	f := func(v float32) archsimd.Float32x16 {
		return archsimd.BroadcastUint32x16(math.Float32bits(v)).AsFloat32x16()
	}
	log2e, c1, c2 := f(1.44269504088896341), f(0.693359375), f(-2.12194440e-4)
	p0, p1, p2 := f(1.9875691500e-4), f(1.3981999507e-3), f(8.3334519073e-3)
	p3, p4, p5 := f(4.1665795894e-2), f(1.6666665459e-1), f(5.0000001201e-1)
	one := f(1)
	bias := archsimd.BroadcastInt32x16(127)
	n16 := len(dst) &^ 15
	for i := 0; i < n16; i += 16 {
		x := archsimd.LoadFloat32x16((*[16]float32)(src[i : i+16]))
		n := x.Mul(log2e).RoundToEvenScaled(0)
		r := x.Sub(n.Mul(c1)).Sub(n.Mul(c2))
		z := r.Mul(r)
		p := p0.MulAdd(r, p1).MulAdd(r, p2).MulAdd(r, p3).MulAdd(r, p4).MulAdd(r, p5)
		e := p.MulAdd(z, r).Add(one)
		s := n.ConvertToInt32().Add(bias).ShiftAllLeft(23).AsFloat32x16()
		e.Mul(s).Store((*[16]float32)(dst[i : i+16]))
	}
	archsimd.ClearAVXUpperBits()
	for i, v := range src[:n16] {
		if !(v >= expLo && v <= expHi) {
			dst[i] = float32(math.Exp(float64(v)))
		}
	}
	expScalar(dst[n16:], src[n16:])
}

// weightedSumVec keeps 64 columns of o in four registers while it runs over
// the rows of v (rows whose length is a multiple of 16; others go scalar).
func weightedSumVec(o, p, v []float32) {
	n := len(o)
	if !hasAVX512 || n%16 != 0 || n == 0 || len(p) == 0 {
		weightedSumScalar(o, p, v)
		return
	}
	// The weights are read as integers: a float32 load would compile to a
	// legacy SSE MOVSS, very slow with the AVX-512 state dirty.
	pb := unsafe.Slice((*uint32)(unsafe.Pointer(&p[0])), len(p))
	for c0 := 0; c0 < n; c0 += 64 {
		if n-c0 >= 64 {
			var a0, a1, a2, a3 archsimd.Float32x16
			for i, pi := range pb {
				s := archsimd.BroadcastUint32x16(pi).AsFloat32x16()
				vv := (*[64]float32)(v[i*n+c0 : i*n+c0+64])
				a0 = archsimd.LoadFloat32x16((*[16]float32)(vv[0:16])).MulAdd(s, a0)
				a1 = archsimd.LoadFloat32x16((*[16]float32)(vv[16:32])).MulAdd(s, a1)
				a2 = archsimd.LoadFloat32x16((*[16]float32)(vv[32:48])).MulAdd(s, a2)
				a3 = archsimd.LoadFloat32x16((*[16]float32)(vv[48:64])).MulAdd(s, a3)
			}
			oo := (*[64]float32)(o[c0 : c0+64])
			a0.Store((*[16]float32)(oo[0:16]))
			a1.Store((*[16]float32)(oo[16:32]))
			a2.Store((*[16]float32)(oo[32:48]))
			a3.Store((*[16]float32)(oo[48:64]))
			continue
		}
		for c := c0; c < n; c += 16 {
			var a archsimd.Float32x16
			for i, pi := range pb {
				s := archsimd.BroadcastUint32x16(pi).AsFloat32x16()
				a = archsimd.LoadFloat32x16((*[16]float32)(v[i*n+c:i*n+c+16])).MulAdd(s, a)
			}
			a.Store((*[16]float32)(o[c : c+16]))
		}
	}
	archsimd.ClearAVXUpperBits()
}

func clearUpper() {
	if hasAVX512 {
		archsimd.ClearAVXUpperBits()
	}
}
