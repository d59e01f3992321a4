//go:build amd64 && goexperiment.simd

package kern

import "simd/archsimd"

// MXFP4 matvec (batch 1) with AVX-512.
//
// Layout: each 128 columns (64 code bytes, 4 scale blocks) form a group. The
// group's bytes are loaded as 16 uint32 lanes four times, at byte offsets 0,
// 1, 2 and 3: lane k of the load at offset j has byte 4k+j in its low byte,
// i.e. the codes of columns 8k+2j (low nibble) and 8k+2j+1 (high nibble).
// VPERMPS reads only the low 4 bits of each index, so the low nibble indexes
// the 16-entry E2M1 value table directly and an arithmetic shift by 4 brings
// the high nibble down: 4 loads, 4 shifts and 8 permutes decode 128 weights
// into float32 without any masking. The input is transposed once per call to
// match (xp[g*128 + t*16 + k] = x[g*128 + 8k + t]), so each decoded vector
// meets its inputs in one aligned load. Lane k of a group only ever sees
// columns of the scale block 4g + k/4, so the 8 products of a group are
// summed unscaled and multiplied by the per-lane scale once: one FMA per 128
// weights applies four block scales. Per group and row that is 8 permutes, 4
// shifts, 8 FMAs and 2 for the scale: about 22 vector operations per 64 code
// bytes, on the two 512-bit ports.

// mxScaleIdx[g] picks, for lane k of the g-th 128-column group of a 512-column
// super-group, the scale of its 32-column block: 4g + k/4.
var mxScaleIdx = func() (t [4][16]uint32) {
	for g := range 4 {
		for k := range 16 {
			t[g][k] = uint32(4*g + k/4)
		}
	}
	return
}()

// mxTrans holds the VPERMI2PS indices of the three stages that transpose 128
// floats viewed as 16 rows k of 8 columns t (x[8k+t]) into xp[16t+k].
// Position bits: input vector v = k>>1, lane = (k&1)<<3 | t; output vector t,
// lane k. Stage s exchanges vector bit s with lane bit s between the vector
// pair (v, v|1<<s); the last stage also puts the lanes in final order.
var mxTrans = func() (idx [3][8][16]uint32) {
	var cur [8][16]int // cur[v][l] = input position held there
	for v := range 8 {
		for l := range 16 {
			cur[v][l] = 16*v + l
		}
	}
	for s := range 3 {
		var next [8][16]int
		for v := range 8 {
			for l := range 16 {
				p := cur[v][l]
				var nv, nl int
				if s < 2 {
					nv = v&^(1<<s) | (l>>s&1)<<s
					nl = l&^(1<<s) | (v>>s&1)<<s
				} else {
					nv, nl = p%8, p/8
				}
				next[nv][nl] = p
			}
		}
		for v := range 8 {
			lo := v &^ (1 << s)
			for l := range 16 {
				p := next[v][l]
				found := false
				for j := range 32 {
					src := cur[lo][j%16]
					if j >= 16 {
						src = cur[lo|1<<s][j%16]
					}
					if src == p {
						idx[s][v][l] = uint32(j)
						found = true
						break
					}
				}
				if !found {
					panic("kern: mxTrans: bad transpose stage")
				}
			}
		}
		cur = next
	}
	return
}()

// mxTranspose sets xp[g+16t+k] = x[g+8k+t] for every 128-column group g of
// len(x) (a multiple of 128; len(xp) >= len(x)).
func mxTranspose(xp, x []float32) {
	var tmp [8][16]float32
	for g := 0; g+128 <= len(x); g += 128 {
		src := (*[128]float32)(x[g : g+128])
		dst := (*[128]float32)(xp[g : g+128])
		for h := 0; h < 8; h += 4 {
			v0 := archsimd.LoadFloat32x16((*[16]float32)(src[16*h : 16*h+16]))
			v1 := archsimd.LoadFloat32x16((*[16]float32)(src[16*h+16 : 16*h+32]))
			v2 := archsimd.LoadFloat32x16((*[16]float32)(src[16*h+32 : 16*h+48]))
			v3 := archsimd.LoadFloat32x16((*[16]float32)(src[16*h+48 : 16*h+64]))
			// Stage 0: pairs (0,1), (2,3).
			a0 := v0.ConcatPermute(v1, archsimd.LoadUint32x16(&mxTrans[0][h]))
			a1 := v0.ConcatPermute(v1, archsimd.LoadUint32x16(&mxTrans[0][h+1]))
			a2 := v2.ConcatPermute(v3, archsimd.LoadUint32x16(&mxTrans[0][h+2]))
			a3 := v2.ConcatPermute(v3, archsimd.LoadUint32x16(&mxTrans[0][h+3]))
			// Stage 1: pairs (0,2), (1,3).
			a0.ConcatPermute(a2, archsimd.LoadUint32x16(&mxTrans[1][h])).Store(&tmp[h])
			a1.ConcatPermute(a3, archsimd.LoadUint32x16(&mxTrans[1][h+1])).Store(&tmp[h+1])
			a0.ConcatPermute(a2, archsimd.LoadUint32x16(&mxTrans[1][h+2])).Store(&tmp[h+2])
			a1.ConcatPermute(a3, archsimd.LoadUint32x16(&mxTrans[1][h+3])).Store(&tmp[h+3])
		}
		// Stage 2: pairs (v, v+4).
		for v := range 4 {
			a := archsimd.LoadFloat32x16(&tmp[v])
			b := archsimd.LoadFloat32x16(&tmp[v+4])
			a.ConcatPermute(b, archsimd.LoadUint32x16(&mxTrans[2][v])).Store((*[16]float32)(dst[16*v : 16*v+16]))
			a.ConcatPermute(b, archsimd.LoadUint32x16(&mxTrans[2][v+4])).Store((*[16]float32)(dst[16*v+64 : 16*v+80]))
		}
	}
	archsimd.ClearAVXUpperBits()
}

// mxChunk is the number of columns of transposed input the matvec keeps on
// the stack (a multiple of 512).
const mxChunk = 4096

// mxfp4MatvecAVX512 sets y[r-lo] = Σ_c W[r,c]·x[c] for rows [lo,hi).
// Columns in whole 512-column super-groups take the vector path, the rest
// (Cols%512, a multiple of 32) the portable one.
func mxfp4MatvecAVX512(w MXFP4, y, x []float32, lo, hi int) {
	// The transposed input starts on a 64-byte boundary, so that each of
	// the kernel's 64-byte loads of it reads one cache line (a stack array
	// is only 8-byte aligned; line-splitting loads made the product ~2x
	// slower on the AMD development machine). Growing the goroutine's stack
	// moves the array with its offset from the stack's page-aligned top,
	// so the alignment holds.
	var buf [mxChunk + 15]float32
	xp := alignedTo64(buf[:], mxChunk)
	archsimd.ClearAVXUpperBits()
	clear(y[:hi-lo])
	for c0 := 0; c0 < w.Cols; c0 += mxChunk {
		c1 := min(c0+mxChunk, w.Cols)
		nsup := (c1 - c0) &^ 511
		mxTranspose(xp[:nsup], x[c0:c0+nsup])
		mxfp4Cols(w, y, xp[:nsup], x, c0, c1, lo, hi)
	}
}

// mxPrepare writes to xp (len(xp) >= len(x)) the input layout
// mxfp4MatvecPrepared reads: in each mxChunk of columns, the whole
// super-groups transposed as mxTranspose does (the remaining columns are
// not written; the tail reads x itself). A parallel product computes it
// once and shares it between its chunks of rows instead of transposing x
// once a chunk.
func mxPrepare(xp, x []float32) {
	for c0 := 0; c0 < len(x); c0 += mxChunk {
		c1 := min(c0+mxChunk, len(x))
		nsup := (c1 - c0) &^ 511
		mxTranspose(xp[c0:c0+nsup], x[c0:c0+nsup])
	}
}

// mxfp4MatvecPrepared is mxfp4MatvecAVX512 reading xp = mxPrepare(x) for
// the vector path (and x for the tail): the same sums in the same order.
func mxfp4MatvecPrepared(w MXFP4, y, xp, x []float32, lo, hi int) {
	archsimd.ClearAVXUpperBits()
	clear(y[:hi-lo])
	for c0 := 0; c0 < w.Cols; c0 += mxChunk {
		c1 := min(c0+mxChunk, w.Cols)
		nsup := (c1 - c0) &^ 511
		mxfp4Cols(w, y, xp[c0:c0+nsup], x, c0, c1, lo, hi)
	}
}

// mxfp4Cols adds Σ_c W[r,c]·x[c] over the columns [c0,c1) (at most
// mxChunk) to y[r-lo] for rows [lo,hi); xp holds the chunk's whole
// super-groups transposed (len(xp) = (c1-c0) &^ 511).
func mxfp4Cols(w MXFP4, y, xp, x []float32, c0, c1, lo, hi int) {
	var pad [256 + 3]byte // a row's last super-group when the matrix ends there
	cols := w.Cols
	n := c1 - c0
	nsup := len(xp) // columns in whole super-groups
	r := lo
	// Rows in pairs q <= mxPair apart (two streams in different pages
	// keep more memory reads in flight) up to pairEnd: every paired
	// row has the 3 lookahead bytes after its codes, so only the
	// matrix's last row (when this chunk ends it) is left to the
	// single-row loop below.
	pairEnd := hi
	if hi == w.Rows && c1 == cols {
		pairEnd = hi - 1
	}
	for nsup > 0 {
		q := min(mxPair, (pairEnd-r)/2)
		if q == 0 || ((r+2*q-1)*cols+c0)/2+nsup/2+3 > len(w.Packed) {
			break
		}
		nb := nsup / 2
		for i := r; i < r+q; i++ {
			o0, o1 := i*cols+c0, (i+q)*cols+c0
			s0, s1 := w.Scale[o0/32:(o0+nsup)/32], w.Scale[o1/32:(o1+nsup)/32]
			var a0, a1 float32
			c0b, c1b := w.Packed[o0/2:o0/2+nb+3], w.Packed[o1/2:o1/2+nb+3]
			if mxScalesPlain(s0) && mxScalesPlain(s1) {
				var acc [2][16]float32
				mxPairAVX512(&c0b[0], &c1b[0], &s0[0], &s1[0], &xp[0], nsup/512, &acc)
				a0, a1 = sum16(&acc[0]), sum16(&acc[1])
			} else {
				a0, a1 = mxfp4Row2(c0b, c1b, s0, s1, xp, nsup/512, false)
			}
			if nsup < n {
				a0 += mxfp4Tail(w, i, c0, nsup, n, x)
				a1 += mxfp4Tail(w, i+q, c0, nsup, n, x)
			}
			y[i-lo] += a0
			y[i+q-lo] += a1
		}
		r += 2 * q
	}
	for ; r < hi; r++ {
		o := r*cols + c0
		s := w.Scale[o/32 : (o+n)/32]
		var acc float32
		if nsup > 0 {
			nb := nsup / 2
			if o/2+nb+3 <= len(w.Packed) {
				acc = mxfp4Row(w.Packed[o/2:o/2+nb+3], s, xp, nsup/512)
			} else { // the matrix's last bytes: copy the final super-group
				k := nsup/512 - 1
				if k > 0 {
					acc = mxfp4Row(w.Packed[o/2:o/2+256*k+3], s, xp[:512*k], k)
				}
				copy(pad[:256], w.Packed[o/2+256*k:o/2+256*k+256])
				acc += mxfp4Row(pad[:], s[16*k:], xp[512*k:512*k+512], 1)
			}
		}
		if nsup < n {
			acc += mxfp4Tail(w, r, c0, nsup, n, x)
		}
		y[r-lo] += acc
	}
}

// mxPair is the largest row distance between the two rows of mxfp4Row2.
const mxPair = 64

// mxfp4Tail returns Σ W[r,c]·x[c] over the columns [c0+g0, c0+n) of row r
// (whole 32-column blocks) with the portable code.
func mxfp4Tail(w MXFP4, r, c0, g0, n int, x []float32) float32 {
	o := r*w.Cols + c0
	p := w.Packed[o/2 : (o+n)/2]
	s := w.Scale[o/32 : (o+n)/32]
	var acc float32
	for g := g0; g < n; g += 32 {
		acc += dotMXFP4(p[g/2:g/2+16], x[c0+g:c0+g+32]) * e8m0Value[s[g/32]]
	}
	return acc
}

// e8m0x16Plain is e8m0x16 for bytes known to lie in [1,254] (normal
// powers of two): a shift into the exponent field.
func e8m0x16Plain(s *[16]uint8) archsimd.Float32x16 {
	return archsimd.LoadUint8x16(s).ExtendToUint32().AsInt32x16().ShiftAllLeft(23).AsFloat32x16()
}

// mxScalesPlain reports whether every E8M0 byte of s (a multiple of 16
// bytes) is in [1,254], so that e8m0x16Plain converts it exactly.
func mxScalesPlain(s []byte) bool {
	one := archsimd.BroadcastUint8x64(1)
	hi := archsimd.BroadcastUint8x64(0xFE)
	m := hi
	i := 0
	for ; i+64 <= len(s); i += 64 {
		// (b+1) & 0xFE is 0 exactly for b = 0 and b = 255.
		m = m.Min(archsimd.LoadUint8x64((*[64]uint8)(s[i : i+64])).Add(one).And(hi))
	}
	plain := m.Equal(archsimd.BroadcastUint8x64(0)).ToBits() == 0
	archsimd.ClearAVXUpperBits()
	for _, b := range s[i:] {
		plain = plain && b != 0 && b != 0xFF
	}
	return plain
}

// mxfp4Row returns Σ W·x over nsg super-groups of 512 columns: p holds their
// 256*nsg code bytes plus 3 readable lookahead bytes, s their 16*nsg scales
// and xp the transposed input.
func mxfp4Row(p, s []byte, xp []float32, nsg int) float32 {
	tab := archsimd.LoadFloat32x16(&e2m1Value)
	var acc archsimd.Float32x16
	for ; nsg > 0; nsg-- {
		sv := e8m0x16((*[16]uint8)(s[:16]))
		xx := (*[512]float32)(xp[:512])
		pp := (*[259]byte)(p[:259])
		acc = mxGroup(tab, (*[67]byte)(pp[0:67]), (*[128]float32)(xx[0:128])).MulAdd(sv.Permute(archsimd.LoadUint32x16(&mxScaleIdx[0])), acc)
		acc = mxGroup(tab, (*[67]byte)(pp[64:131]), (*[128]float32)(xx[128:256])).MulAdd(sv.Permute(archsimd.LoadUint32x16(&mxScaleIdx[1])), acc)
		acc = mxGroup(tab, (*[67]byte)(pp[128:195]), (*[128]float32)(xx[256:384])).MulAdd(sv.Permute(archsimd.LoadUint32x16(&mxScaleIdx[2])), acc)
		acc = mxGroup(tab, (*[67]byte)(pp[192:259]), (*[128]float32)(xx[384:512])).MulAdd(sv.Permute(archsimd.LoadUint32x16(&mxScaleIdx[3])), acc)
		p, s, xp = p[256:], s[16:], xp[512:]
	}
	return hsum(acc)
}

// mxfp4Row2 is mxfp4Row for two rows at once (codes p0, p1, scales s0,
// s1): two streams in flight, and each input vector is loaded once for both.
// The four groups of a super-group are written out: go1.26 inlines neither a
// helper returning two vectors nor this loop, and a call spills every vector.
func mxfp4Row2(p0, p1, s0, s1 []byte, xp []float32, nsg int, plain bool) (float32, float32) {
	tab := archsimd.LoadFloat32x16(&e2m1Value)
	var acc0, acc1 archsimd.Float32x16
	for ; nsg > 0; nsg-- {
		var sv0, sv1 archsimd.Float32x16
		if plain {
			sv0 = e8m0x16Plain((*[16]uint8)(s0[:16]))
			sv1 = e8m0x16Plain((*[16]uint8)(s1[:16]))
		} else {
			sv0 = e8m0x16((*[16]uint8)(s0[:16]))
			sv1 = e8m0x16((*[16]uint8)(s1[:16]))
		}
		xx := (*[512]float32)(xp[:512])
		pp0 := (*[259]byte)(p0[:259])
		pp1 := (*[259]byte)(p1[:259])
		var u, v archsimd.Int32x16
		var a, b, xv archsimd.Float32x16
		var si archsimd.Uint32x16
		// Group 0: columns 0..127 of the super-group.
		u = archsimd.LoadUint8x64((*[64]uint8)(pp0[0:64])).AsInt32x16()
		v = archsimd.LoadUint8x64((*[64]uint8)(pp1[0:64])).AsInt32x16()
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[0:16]))
		a = tab.Permute(u.AsUint32x16()).Mul(xv)
		b = tab.Permute(v.AsUint32x16()).Mul(xv)
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[16:32]))
		a = tab.Permute(u.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, b)
		u = archsimd.LoadUint8x64((*[64]uint8)(pp0[1:65])).AsInt32x16()
		v = archsimd.LoadUint8x64((*[64]uint8)(pp1[1:65])).AsInt32x16()
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[32:48]))
		a = tab.Permute(u.AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.AsUint32x16()).MulAdd(xv, b)
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[48:64]))
		a = tab.Permute(u.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, b)
		u = archsimd.LoadUint8x64((*[64]uint8)(pp0[2:66])).AsInt32x16()
		v = archsimd.LoadUint8x64((*[64]uint8)(pp1[2:66])).AsInt32x16()
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[64:80]))
		a = tab.Permute(u.AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.AsUint32x16()).MulAdd(xv, b)
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[80:96]))
		a = tab.Permute(u.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, b)
		u = archsimd.LoadUint8x64((*[64]uint8)(pp0[3:67])).AsInt32x16()
		v = archsimd.LoadUint8x64((*[64]uint8)(pp1[3:67])).AsInt32x16()
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[96:112]))
		a = tab.Permute(u.AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.AsUint32x16()).MulAdd(xv, b)
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[112:128]))
		a = tab.Permute(u.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, b)
		si = archsimd.LoadUint32x16(&mxScaleIdx[0])
		acc0 = a.MulAdd(sv0.Permute(si), acc0)
		acc1 = b.MulAdd(sv1.Permute(si), acc1)
		// Group 1: columns 128..255 of the super-group.
		u = archsimd.LoadUint8x64((*[64]uint8)(pp0[64:128])).AsInt32x16()
		v = archsimd.LoadUint8x64((*[64]uint8)(pp1[64:128])).AsInt32x16()
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[128:144]))
		a = tab.Permute(u.AsUint32x16()).Mul(xv)
		b = tab.Permute(v.AsUint32x16()).Mul(xv)
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[144:160]))
		a = tab.Permute(u.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, b)
		u = archsimd.LoadUint8x64((*[64]uint8)(pp0[65:129])).AsInt32x16()
		v = archsimd.LoadUint8x64((*[64]uint8)(pp1[65:129])).AsInt32x16()
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[160:176]))
		a = tab.Permute(u.AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.AsUint32x16()).MulAdd(xv, b)
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[176:192]))
		a = tab.Permute(u.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, b)
		u = archsimd.LoadUint8x64((*[64]uint8)(pp0[66:130])).AsInt32x16()
		v = archsimd.LoadUint8x64((*[64]uint8)(pp1[66:130])).AsInt32x16()
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[192:208]))
		a = tab.Permute(u.AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.AsUint32x16()).MulAdd(xv, b)
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[208:224]))
		a = tab.Permute(u.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, b)
		u = archsimd.LoadUint8x64((*[64]uint8)(pp0[67:131])).AsInt32x16()
		v = archsimd.LoadUint8x64((*[64]uint8)(pp1[67:131])).AsInt32x16()
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[224:240]))
		a = tab.Permute(u.AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.AsUint32x16()).MulAdd(xv, b)
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[240:256]))
		a = tab.Permute(u.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, b)
		si = archsimd.LoadUint32x16(&mxScaleIdx[1])
		acc0 = a.MulAdd(sv0.Permute(si), acc0)
		acc1 = b.MulAdd(sv1.Permute(si), acc1)
		// Group 2: columns 256..383 of the super-group.
		u = archsimd.LoadUint8x64((*[64]uint8)(pp0[128:192])).AsInt32x16()
		v = archsimd.LoadUint8x64((*[64]uint8)(pp1[128:192])).AsInt32x16()
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[256:272]))
		a = tab.Permute(u.AsUint32x16()).Mul(xv)
		b = tab.Permute(v.AsUint32x16()).Mul(xv)
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[272:288]))
		a = tab.Permute(u.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, b)
		u = archsimd.LoadUint8x64((*[64]uint8)(pp0[129:193])).AsInt32x16()
		v = archsimd.LoadUint8x64((*[64]uint8)(pp1[129:193])).AsInt32x16()
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[288:304]))
		a = tab.Permute(u.AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.AsUint32x16()).MulAdd(xv, b)
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[304:320]))
		a = tab.Permute(u.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, b)
		u = archsimd.LoadUint8x64((*[64]uint8)(pp0[130:194])).AsInt32x16()
		v = archsimd.LoadUint8x64((*[64]uint8)(pp1[130:194])).AsInt32x16()
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[320:336]))
		a = tab.Permute(u.AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.AsUint32x16()).MulAdd(xv, b)
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[336:352]))
		a = tab.Permute(u.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, b)
		u = archsimd.LoadUint8x64((*[64]uint8)(pp0[131:195])).AsInt32x16()
		v = archsimd.LoadUint8x64((*[64]uint8)(pp1[131:195])).AsInt32x16()
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[352:368]))
		a = tab.Permute(u.AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.AsUint32x16()).MulAdd(xv, b)
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[368:384]))
		a = tab.Permute(u.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, b)
		si = archsimd.LoadUint32x16(&mxScaleIdx[2])
		acc0 = a.MulAdd(sv0.Permute(si), acc0)
		acc1 = b.MulAdd(sv1.Permute(si), acc1)
		// Group 3: columns 384..511 of the super-group.
		u = archsimd.LoadUint8x64((*[64]uint8)(pp0[192:256])).AsInt32x16()
		v = archsimd.LoadUint8x64((*[64]uint8)(pp1[192:256])).AsInt32x16()
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[384:400]))
		a = tab.Permute(u.AsUint32x16()).Mul(xv)
		b = tab.Permute(v.AsUint32x16()).Mul(xv)
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[400:416]))
		a = tab.Permute(u.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, b)
		u = archsimd.LoadUint8x64((*[64]uint8)(pp0[193:257])).AsInt32x16()
		v = archsimd.LoadUint8x64((*[64]uint8)(pp1[193:257])).AsInt32x16()
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[416:432]))
		a = tab.Permute(u.AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.AsUint32x16()).MulAdd(xv, b)
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[432:448]))
		a = tab.Permute(u.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, b)
		u = archsimd.LoadUint8x64((*[64]uint8)(pp0[194:258])).AsInt32x16()
		v = archsimd.LoadUint8x64((*[64]uint8)(pp1[194:258])).AsInt32x16()
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[448:464]))
		a = tab.Permute(u.AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.AsUint32x16()).MulAdd(xv, b)
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[464:480]))
		a = tab.Permute(u.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, b)
		u = archsimd.LoadUint8x64((*[64]uint8)(pp0[195:259])).AsInt32x16()
		v = archsimd.LoadUint8x64((*[64]uint8)(pp1[195:259])).AsInt32x16()
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[480:496]))
		a = tab.Permute(u.AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.AsUint32x16()).MulAdd(xv, b)
		xv = archsimd.LoadFloat32x16((*[16]float32)(xx[496:512]))
		a = tab.Permute(u.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, a)
		b = tab.Permute(v.ShiftAllRight(4).AsUint32x16()).MulAdd(xv, b)
		si = archsimd.LoadUint32x16(&mxScaleIdx[3])
		acc0 = a.MulAdd(sv0.Permute(si), acc0)
		acc1 = b.MulAdd(sv1.Permute(si), acc1)
		p0, p1, s0, s1, xp = p0[256:], p1[256:], s0[16:], s1[16:], xp[512:]
	}
	var t [2][16]float32
	acc0.Store(&t[0])
	acc1.Store(&t[1])
	archsimd.ClearAVXUpperBits()
	return sum16(&t[0]), sum16(&t[1])
}

// mxGroup returns the unscaled partial sums of one 128-column group whose 64
// code bytes start p (3 bytes of lookahead): lane k sums columns 8k..8k+7.
// One dependency chain: successive groups overlap in the out-of-order core.
func mxGroup(tab archsimd.Float32x16, p *[67]byte, x *[128]float32) archsimd.Float32x16 {
	v0 := archsimd.LoadUint8x64((*[64]uint8)(p[0:64])).AsInt32x16()
	v1 := archsimd.LoadUint8x64((*[64]uint8)(p[1:65])).AsInt32x16()
	v2 := archsimd.LoadUint8x64((*[64]uint8)(p[2:66])).AsInt32x16()
	v3 := archsimd.LoadUint8x64((*[64]uint8)(p[3:67])).AsInt32x16()
	a := tab.Permute(v0.AsUint32x16()).Mul(archsimd.LoadFloat32x16((*[16]float32)(x[0:16])))
	b := tab.Permute(v0.ShiftAllRight(4).AsUint32x16()).Mul(archsimd.LoadFloat32x16((*[16]float32)(x[16:32])))
	a = tab.Permute(v1.AsUint32x16()).MulAdd(archsimd.LoadFloat32x16((*[16]float32)(x[32:48])), a)
	b = tab.Permute(v1.ShiftAllRight(4).AsUint32x16()).MulAdd(archsimd.LoadFloat32x16((*[16]float32)(x[48:64])), b)
	a = tab.Permute(v2.AsUint32x16()).MulAdd(archsimd.LoadFloat32x16((*[16]float32)(x[64:80])), a)
	b = tab.Permute(v2.ShiftAllRight(4).AsUint32x16()).MulAdd(archsimd.LoadFloat32x16((*[16]float32)(x[80:96])), b)
	a = tab.Permute(v3.AsUint32x16()).MulAdd(archsimd.LoadFloat32x16((*[16]float32)(x[96:112])), a)
	b = tab.Permute(v3.ShiftAllRight(4).AsUint32x16()).MulAdd(archsimd.LoadFloat32x16((*[16]float32)(x[112:128])), b)
	return a.Add(b)
}
