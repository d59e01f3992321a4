//go:build amd64 && goexperiment.simd

package format

import "simd/archsimd"

// hasAVX512 is fixed at program start (CPU feature detection); read-only.
var hasAVX512 = archsimd.X86.AVX512()

// Constant vectors, loaded from memory. Measured on the development machine
// (go1.26.8, KVM Xeon): moving a value from a general register into a vector
// register inside a SIMD loop (BroadcastFloat32x16 of a computed float,
// ShiftAllRight(k)) costs hundreds of cycles each time, so these kernels take
// every constant and every scale from memory.
var (
	mxfp4InterleaveLo = [16]uint32{0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23}
	mxfp4InterleaveHi = [16]uint32{8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31}
	vec4              = [16]uint32{4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}
	vec23             = [16]uint32{23, 23, 23, 23, 23, 23, 23, 23, 23, 23, 23, 23, 23, 23, 23, 23}
	vec255            = [16]uint32{255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255}
	vecE8M0Special    = [16]uint32{0x400000, 0x400000, 0x400000, 0x400000, 0x400000, 0x400000, 0x400000, 0x400000, 0x400000, 0x400000, 0x400000, 0x400000, 0x400000, 0x400000, 0x400000, 0x400000}
)

// e8m0x16 decodes 16 E8M0 scale bytes into dst with the semantics of
// E8M0ToFloat32: bits = b<<23, except b = 0 -> 0x00400000 (2^-127) and
// b = 255 -> 0x7FC00000 (NaN), i.e. OR 0x00400000 into those two.
func e8m0x16(dst *[16]float32, src *[16]byte) {
	e := archsimd.LoadUint8x16(src).ExtendToUint32()
	var zero archsimd.Uint32x16
	special := e.Equal(zero).Or(e.Equal(archsimd.LoadUint32x16(&vec255)))
	fix := archsimd.LoadUint32x16(&vecE8M0Special).Masked(special)
	e.ShiftLeft(archsimd.LoadUint32x16(&vec23)).Or(fix).AsFloat32x16().Store(dst)
}

// decodeMXFP4Groups decodes whole chunks of 16 groups (512 elements) with
// AVX-512 and returns the number of packed bytes consumed (0 without AVX-512;
// the caller decodes the rest). Lengths are the caller's checked ones:
// len(dst) == 2*len(packed), len(scales) >= len(packed)/16. Results are
// bit-identical to the scalar path: each element is the float32 product
// e2m1(code) * e8m0(scale), the product formed once per code in the group's
// 16-entry table.
func decodeMXFP4Groups(dst []float32, packed []byte, scales []byte) int {
	n := (len(packed) / 16) &^ 15
	if !hasAVX512 || n == 0 {
		return 0
	}
	codes := archsimd.LoadFloat32x16(&e2m1Table)
	ilo := archsimd.LoadUint32x16(&mxfp4InterleaveLo)
	ihi := archsimd.LoadUint32x16(&mxfp4InterleaveHi)
	four := archsimd.LoadUint32x16(&vec4)
	var sf [16]float32
	for c := 0; c < n; c += 16 {
		e8m0x16(&sf, (*[16]byte)(scales[c:]))
		p := (*[256]byte)(packed[16*c:])
		d := (*[512]float32)(dst[32*c:])
		for k := range 16 {
			t := codes.Mul(archsimd.BroadcastFloat32x16(sf[k]))
			v := archsimd.LoadUint8x16((*[16]byte)(p[16*k:])).ExtendToUint32()
			even := t.Permute(v)                 // low 4 bits of each lane: low nibbles
			odd := t.Permute(v.ShiftRight(four)) // high nibbles
			even.ConcatPermute(odd, ilo).Store((*[16]float32)(d[32*k:]))
			even.ConcatPermute(odd, ihi).Store((*[16]float32)(d[32*k+16:]))
		}
	}
	archsimd.ClearAVXUpperBits()
	return 16 * n
}
