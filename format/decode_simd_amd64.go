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

var (
	vec7F   = [16]uint32{0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f}
	vec80   = [16]uint32{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80}
	vec8    = [16]uint32{8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8}
	vec20   = [16]uint32{20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20}
	vec24   = [16]uint32{24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24}
	vecBias = [16]uint32{120 << 23, 120 << 23, 120 << 23, 120 << 23, 120 << 23, 120 << 23, 120 << 23, 120 << 23, 120 << 23, 120 << 23, 120 << 23, 120 << 23, 120 << 23, 120 << 23, 120 << 23, 120 << 23}
	// E4M3 magnitudes 0..7 (exponent field 0: m/8·2^-6); lanes 8..15 unused.
	e4m3Sub = [16]float32{0, 1.0 / 512, 2.0 / 512, 3.0 / 512, 4.0 / 512, 5.0 / 512, 6.0 / 512, 7.0 / 512}
	vecNaN  = [16]uint32{0x7fc00000, 0x7fc00000, 0x7fc00000, 0x7fc00000, 0x7fc00000, 0x7fc00000, 0x7fc00000, 0x7fc00000, 0x7fc00000, 0x7fc00000, 0x7fc00000, 0x7fc00000, 0x7fc00000, 0x7fc00000, 0x7fc00000, 0x7fc00000}
)

// e4m3Consts holds the loaded constant vectors of the E4M3 decoder.
type e4m3Consts struct {
	m7F, m80, c8, c20, c24, bias, nan archsimd.Uint32x16
	sub                               archsimd.Float32x16
}

func loadE4M3Consts() e4m3Consts {
	return e4m3Consts{
		m7F: archsimd.LoadUint32x16(&vec7F), m80: archsimd.LoadUint32x16(&vec80),
		c8: archsimd.LoadUint32x16(&vec8), c20: archsimd.LoadUint32x16(&vec20),
		c24: archsimd.LoadUint32x16(&vec24), bias: archsimd.LoadUint32x16(&vecBias),
		nan: archsimd.LoadUint32x16(&vecNaN), sub: archsimd.LoadFloat32x16(&e4m3Sub),
	}
}

// e4m3x16 decodes 16 E4M3fn bytes exactly (the values of e4m3Table): a normal
// magnitude m (exponent field >= 1) has float32 bits (m<<20) + (120<<23); the 8
// subnormal magnitudes come from a table; magnitude 0x7F is NaN; the sign is
// bit 7 moved to bit 31.
func e4m3x16(k *e4m3Consts, src *[16]byte) archsimd.Float32x16 {
	v := archsimd.LoadUint8x16(src).ExtendToUint32()
	m := v.And(k.m7F)
	normal := m.ShiftLeft(k.c20).Add(k.bias).AsFloat32x16()
	f := k.sub.Permute(m).Merge(normal, m.Less(k.c8)).AsUint32x16()
	f = k.nan.Merge(f, m.Equal(k.m7F))
	return f.Or(v.And(k.m80).ShiftLeft(k.c24)).AsFloat32x16()
}

// decodeE4M3Blocks decodes whole chunks of 16 scale blocks with AVX-512:
// dst[i] = e4m3(q[i]) * e8m0(scales[i/block]) as one float32 product (bit-identical
// to the scalar path). It returns the number of elements done (0 without AVX-512
// or when block is not a multiple of 32); the caller decodes the rest.
// Preconditions (checked by the caller): len(q) == len(dst),
// len(scales) == ceil(len(dst)/block).
func decodeE4M3Blocks(dst []float32, q []byte, scales []byte, block int) int {
	if !hasAVX512 || block%32 != 0 || block <= 0 {
		return 0
	}
	// Whole chunks of 16 blocks that lie entirely inside the row.
	n := min(len(scales), len(dst)/block) &^ 15
	if n == 0 {
		return 0
	}
	k := loadE4M3Consts()
	var sf [16]float32
	for c := 0; c < n; c += 16 {
		e8m0x16(&sf, (*[16]byte)(scales[c:]))
		for j := range 16 {
			s := archsimd.BroadcastFloat32x16(sf[j])
			for i := (c + j) * block; i < (c+j+1)*block; i += 32 {
				qq := (*[32]byte)(q[i:])
				dd := (*[32]float32)(dst[i:])
				a := e4m3x16(&k, (*[16]byte)(qq[:16]))
				b := e4m3x16(&k, (*[16]byte)(qq[16:]))
				a.Mul(s).Store((*[16]float32)(dd[:16]))
				b.Mul(s).Store((*[16]float32)(dd[16:]))
			}
		}
	}
	archsimd.ClearAVXUpperBits()
	return n * block
}

var vec16 = [16]uint32{16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16}

// decodeBF16Vec decodes whole runs of 32 little-endian bfloat16 values with
// AVX-512 (zero-extend to 32 bits, shift left 16) and returns the number of
// values done (0 without AVX-512). Precondition: len(src) == 2*len(dst).
func decodeBF16Vec(dst []float32, src []byte) int {
	n := len(dst) &^ 31
	if !hasAVX512 || n == 0 {
		return 0
	}
	sh := archsimd.LoadUint32x16(&vec16)
	for i := 0; i < n; i += 32 {
		v := archsimd.LoadUint8x64((*[64]byte)(src[2*i:])).AsUint16x32()
		d := (*[32]float32)(dst[i:])
		v.GetLo().ExtendToUint32().ShiftLeft(sh).AsFloat32x16().Store((*[16]float32)(d[:16]))
		v.GetHi().ExtendToUint32().ShiftLeft(sh).AsFloat32x16().Store((*[16]float32)(d[16:]))
	}
	archsimd.ClearAVXUpperBits()
	return n
}

// decodeE4M3Vec decodes whole runs of 32 E4M3fn bytes with AVX-512 and returns
// the number of values done (0 without AVX-512). Precondition: len(src) == len(dst).
func decodeE4M3Vec(dst []float32, src []byte) int {
	n := len(dst) &^ 31
	if !hasAVX512 || n == 0 {
		return 0
	}
	k := loadE4M3Consts()
	for i := 0; i < n; i += 32 {
		s := (*[32]byte)(src[i:])
		d := (*[32]float32)(dst[i:])
		e4m3x16(&k, (*[16]byte)(s[:16])).Store((*[16]float32)(d[:16]))
		e4m3x16(&k, (*[16]byte)(s[16:])).Store((*[16]float32)(d[16:]))
	}
	archsimd.ClearAVXUpperBits()
	return n
}
