package format

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"
)

// The bulk decoders below are hot paths with no error result. Their length
// preconditions are checked once on entry; a violation is a programmer error and
// panics with a message naming the decoder and the lengths. They never read or
// write outside the slices and never truncate silently. dst is owned by the
// caller and fully overwritten; the sources are only read.

func lenPanic(fn string, format string, args ...any) {
	panic(fmt.Sprintf("format."+fn+": "+format, args...))
}

// DecodeBF16 decodes little-endian bfloat16 values: dst[i] = bf16(src[2i:2i+2]).
// len(src) must equal 2*len(dst).
func DecodeBF16(dst []float32, src []byte) {
	if len(src) != 2*len(dst) {
		lenPanic("DecodeBF16", "len(src)=%d, want 2*len(dst)=%d", len(src), 2*len(dst))
	}
	i := decodeBF16Vec(dst, src) // values done by SIMD, if any
	for ; i+8 <= len(dst); i += 8 {
		s := (*[16]byte)(src[2*i:])
		d := (*[8]float32)(dst[i:])
		lo := binary.LittleEndian.Uint64(s[0:8])
		hi := binary.LittleEndian.Uint64(s[8:16])
		d[0] = math.Float32frombits(uint32(lo) << 16)
		d[1] = math.Float32frombits(uint32(lo>>16) << 16)
		d[2] = math.Float32frombits(uint32(lo>>32) << 16)
		d[3] = math.Float32frombits(uint32(lo>>48) << 16)
		d[4] = math.Float32frombits(uint32(hi) << 16)
		d[5] = math.Float32frombits(uint32(hi>>16) << 16)
		d[6] = math.Float32frombits(uint32(hi>>32) << 16)
		d[7] = math.Float32frombits(uint32(hi>>48) << 16)
	}
	for ; i < len(dst); i++ {
		dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
	}
}

// DecodeF16 decodes little-endian IEEE binary16 values. len(src) must equal
// 2*len(dst).
func DecodeF16(dst []float32, src []byte) {
	if len(src) != 2*len(dst) {
		lenPanic("DecodeF16", "len(src)=%d, want 2*len(dst)=%d", len(src), 2*len(dst))
	}
	for i := range dst {
		dst[i] = F16ToFloat32(binary.LittleEndian.Uint16(src[2*i:]))
	}
}

// DecodeF32 decodes little-endian float32 values (bit-exact, NaN payloads kept).
// len(src) must equal 4*len(dst).
func DecodeF32(dst []float32, src []byte) {
	if len(src) != 4*len(dst) {
		lenPanic("DecodeF32", "len(src)=%d, want 4*len(dst)=%d", len(src), 4*len(dst))
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

// DecodeE4M3 decodes FP8 E4M3fn bytes (see E4M3ToFloat32). len(src) must equal
// len(dst).
func DecodeE4M3(dst []float32, src []byte) {
	if len(src) != len(dst) {
		lenPanic("DecodeE4M3", "len(src)=%d, want len(dst)=%d", len(src), len(dst))
	}
	t := &e4m3Table
	i := decodeE4M3Vec(dst, src) // values done by SIMD, if any
	for ; i+8 <= len(dst); i += 8 {
		s := (*[8]byte)(src[i:])
		d := (*[8]float32)(dst[i:])
		d[0] = t[s[0]]
		d[1] = t[s[1]]
		d[2] = t[s[2]]
		d[3] = t[s[3]]
		d[4] = t[s[4]]
		d[5] = t[s[5]]
		d[6] = t[s[6]]
		d[7] = t[s[7]]
	}
	for ; i < len(dst); i++ {
		dst[i] = t[src[i]]
	}
}

// DecodeFP8BlockRow decodes one row of an FP8-block tensor:
// dst[i] = e4m3(q[i]) · e8m0(scales[i/block]), computed as one float32 product
// (exact unless it leaves float32's range). scales holds this row's block scales.
// Preconditions: block > 0, len(q) == len(dst), len(scales) == ceil(len(dst)/block).
func DecodeFP8BlockRow(dst []float32, q []byte, scales []byte, block int) {
	if block <= 0 {
		lenPanic("DecodeFP8BlockRow", "block=%d, want > 0", block)
	}
	if len(q) != len(dst) || len(scales) != (len(dst)+block-1)/block {
		lenPanic("DecodeFP8BlockRow", "len(dst)=%d len(q)=%d len(scales)=%d block=%d, want len(q)=len(dst) and len(scales)=ceil(len(dst)/block)=%d",
			len(dst), len(q), len(scales), block, (len(dst)+block-1)/block)
	}
	t := &e4m3Table
	done := decodeE4M3Blocks(dst, q, scales, block) // whole blocks done by SIMD, if any
	for j := done / block; j < len(scales); j++ {
		s := E8M0ToFloat32(scales[j])
		i, end := j*block, min(j*block+block, len(dst))
		for ; i+32 <= end; i += 32 {
			b := (*[32]byte)(q[i:])
			d := (*[32]float32)(dst[i:])
			for k := 0; k < 32; k += 8 {
				d[k+0] = t[b[k+0]] * s
				d[k+1] = t[b[k+1]] * s
				d[k+2] = t[b[k+2]] * s
				d[k+3] = t[b[k+3]] * s
				d[k+4] = t[b[k+4]] * s
				d[k+5] = t[b[k+5]] * s
				d[k+6] = t[b[k+6]] * s
				d[k+7] = t[b[k+7]] * s
			}
		}
		for ; i < end; i++ {
			dst[i] = t[q[i]] * s
		}
	}
}

// DecodeMXFP8Row decodes one MXFP8 row: dst[i] = e4m3(q[i]) · e8m0(scales[i/32]).
// Preconditions: len(q) == len(dst), len(scales) == ceil(len(dst)/32).
func DecodeMXFP8Row(dst []float32, q []byte, scales []byte) {
	if len(q) != len(dst) || len(scales) != (len(dst)+31)/32 {
		lenPanic("DecodeMXFP8Row", "len(dst)=%d len(q)=%d len(scales)=%d, want len(q)=len(dst) and len(scales)=ceil(len(dst)/32)=%d",
			len(dst), len(q), len(scales), (len(dst)+31)/32)
	}
	t := &e4m3Table
	i := decodeE4M3Blocks(dst, q, scales, 32) // whole groups done by SIMD, if any
	for j := i / 32; i+32 <= len(dst); j, i = j+1, i+32 {
		s := E8M0ToFloat32(scales[j])
		b := (*[32]byte)(q[i:])
		d := (*[32]float32)(dst[i:])
		for k := 0; k < 32; k += 8 {
			d[k+0] = t[b[k+0]] * s
			d[k+1] = t[b[k+1]] * s
			d[k+2] = t[b[k+2]] * s
			d[k+3] = t[b[k+3]] * s
			d[k+4] = t[b[k+4]] * s
			d[k+5] = t[b[k+5]] * s
			d[k+6] = t[b[k+6]] * s
			d[k+7] = t[b[k+7]] * s
		}
	}
	if i < len(dst) {
		s := E8M0ToFloat32(scales[len(scales)-1])
		for ; i < len(dst); i++ {
			dst[i] = t[q[i]] * s
		}
	}
}

// fp4PairTable maps a packed MXFP4 byte to its (even, odd) element values: low
// nibble first. Read-only after init.
var fp4PairTable = func() (t [256][2]float32) {
	for i := range t {
		t[i] = [2]float32{e2m1Table[i&15], e2m1Table[i>>4]}
	}
	return t
}()

// fp4Pair holds, per packed MXFP4 byte, the memory image of its two decoded
// float32 values read as one uint64 (so it is right for either byte order), and a
// mask selecting the exponent-carrying half of each nonzero value. Read-only.
var fp4Pair = func() (t [256]fp4PairEntry) {
	for i := range t {
		pair := fp4PairTable[i]
		t[i].bits = *(*uint64)(unsafe.Pointer(&pair))
		var m [2]uint32
		for h, v := range pair {
			if v != 0 {
				m[h] = 0xffffffff
			}
		}
		t[i].mask = *(*uint64)(unsafe.Pointer(&m))
	}
	return t
}()

type fp4PairEntry struct{ bits, mask uint64 }

// DecodeMXFP4Row decodes one MXFP4 row: element 2j is the low nibble of
// packed[j], element 2j+1 the high nibble; dst[i] = e2m1(code_i) · e8m0(scales[i/32])
// (the float32 product). Preconditions: len(dst) == 2*len(packed),
// len(scales) == ceil(len(dst)/32).
func DecodeMXFP4Row(dst []float32, packed []byte, scales []byte) {
	if len(dst) != 2*len(packed) || len(scales) != (len(dst)+31)/32 {
		lenPanic("DecodeMXFP4Row", "len(dst)=%d len(packed)=%d len(scales)=%d, want len(dst)=2*len(packed) and len(scales)=ceil(len(dst)/32)=%d",
			len(dst), len(packed), len(scales), (len(dst)+31)/32)
	}
	t := &fp4PairTable
	pt := &fp4Pair
	i := decodeMXFP4Groups(dst, packed, scales) // packed bytes done by SIMD, if any
	// The exponent-add path stores uint64 words, so it needs 8-byte alignment.
	aligned := len(dst) > 0 && uintptr(unsafe.Pointer(&dst[0]))%8 == 0
	for j := i / 16; i+16 <= len(packed); j, i = j+1, i+16 {
		sb := scales[j]
		b := (*[16]byte)(packed[i:])
		d := (*[32]float32)(dst[2*i:])
		if aligned && sb >= 2 && sb <= 252 {
			// Scale 2^k with |k| <= 125: every product of an E2M1 value
			// (2^-1 .. 1.5·2^2) and 2^k is a normal float32, so the product is
			// exactly the value with k added to its exponent field. Zeros are
			// masked out. Both halves of a uint64 are adjusted at once; the
			// exponent never carries or borrows into the sign bit.
			w := (*[16]uint64)(unsafe.Pointer(d))
			if k := int(sb) - 127; k >= 0 {
				delta := uint64(k)<<23 | uint64(k)<<55
				for m := 0; m < 16; m += 4 {
					e0 := &pt[b[m]]
					w[m] = e0.bits + delta&e0.mask
					e1 := &pt[b[m+1]]
					w[m+1] = e1.bits + delta&e1.mask
					e2 := &pt[b[m+2]]
					w[m+2] = e2.bits + delta&e2.mask
					e3 := &pt[b[m+3]]
					w[m+3] = e3.bits + delta&e3.mask
				}
			} else {
				delta := uint64(-k)<<23 | uint64(-k)<<55
				for m := 0; m < 16; m += 4 {
					e0 := &pt[b[m]]
					w[m] = e0.bits - delta&e0.mask
					e1 := &pt[b[m+1]]
					w[m+1] = e1.bits - delta&e1.mask
					e2 := &pt[b[m+2]]
					w[m+2] = e2.bits - delta&e2.mask
					e3 := &pt[b[m+3]]
					w[m+3] = e3.bits - delta&e3.mask
				}
			}
			continue
		}
		s := E8M0ToFloat32(sb) // extreme or NaN scale: float32 products
		for m := 0; m < 16; m += 2 {
			p0, p1 := &t[b[m]], &t[b[m+1]]
			d[2*m+0] = p0[0] * s
			d[2*m+1] = p0[1] * s
			d[2*m+2] = p1[0] * s
			d[2*m+3] = p1[1] * s
		}
	}
	if i < len(packed) {
		s := E8M0ToFloat32(scales[len(scales)-1])
		for ; i < len(packed); i++ {
			p := &t[packed[i]]
			dst[2*i] = p[0] * s
			dst[2*i+1] = p[1] * s
		}
	}
}
