package kern

import "encoding/binary"

// Portable kernels: the whole implementation without SIMD, and the fallback
// of the SIMD build for CPUs without AVX-512 and for odd shapes and tails.

type (
	fp8Kernel   struct{ w FP8Block }
	mxfp4Kernel struct{ w MXFP4 }
	bf16Kernel  struct{ w BF16 }
	f32Kernel   struct{ w F32 }
)

func (k fp8Kernel) cols() int   { return k.w.Cols }
func (k mxfp4Kernel) cols() int { return k.w.Cols }
func (k bf16Kernel) cols() int  { return k.w.Cols }
func (k f32Kernel) cols() int   { return k.w.Cols }

// dotFP8 returns Σ e4m3(q[i])·x[i] over len(q).
func dotFP8(q []byte, x []float32) float32 {
	x = x[:len(q)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(q); i += 4 {
		qq := (*[4]byte)(q[i : i+4])
		xx := (*[4]float32)(x[i : i+4])
		s0 += e4m3Value[qq[0]] * xx[0]
		s1 += e4m3Value[qq[1]] * xx[1]
		s2 += e4m3Value[qq[2]] * xx[2]
		s3 += e4m3Value[qq[3]] * xx[3]
	}
	for ; i < len(q); i++ {
		s0 += e4m3Value[q[i]] * x[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// fp8RowScalar returns Σ_c W[r,c]·x[c] for columns [c0,c1) of row r.
func fp8RowScalar(w FP8Block, r, c0, c1 int, x []float32) float32 {
	nbc := ceilDiv(w.Cols, w.Block)
	srow := w.Scale[(r/w.Block)*nbc : (r/w.Block+1)*nbc]
	q := w.Q[r*w.Cols : (r+1)*w.Cols]
	var acc float32
	for c := c0; c < c1; {
		e := min((c/w.Block+1)*w.Block, c1)
		acc += dotFP8(q[c:e], x[c:e]) * e8m0Value[srow[c/w.Block]]
		c = e
	}
	return acc
}

func fp8MatvecScalar(w FP8Block, y, x []float32, lo, hi int) {
	for r := lo; r < hi; r++ {
		y[r-lo] = fp8RowScalar(w, r, 0, w.Cols, x)
	}
}

func fp8DecodeScalar(w FP8Block, dst []float32, ld, r0, nr, c0, c1 int) {
	nbc := ceilDiv(w.Cols, w.Block)
	for i := range nr {
		r := r0 + i
		q := w.Q[r*w.Cols+c0 : r*w.Cols+c1]
		d := dst[i*ld : i*ld+c1-c0]
		srow := w.Scale[(r/w.Block)*nbc:]
		for j, b := range q {
			d[j] = e4m3Value[b] * e8m0Value[srow[(c0+j)/w.Block]]
		}
	}
}

// dotMXFP4 returns Σ e2m1(code)·x over the len(p)*2 codes packed in p (one
// scale block, before scaling). One table lookup per byte gives both codes'
// values.
func dotMXFP4(p []byte, x []float32) float32 {
	x = x[:2*len(p)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(p); i += 4 {
		pp := (*[4]byte)(p[i : i+4])
		xx := (*[8]float32)(x[2*i : 2*i+8])
		a, b, c, d := &e2m1Pair[pp[0]], &e2m1Pair[pp[1]], &e2m1Pair[pp[2]], &e2m1Pair[pp[3]]
		s0 += a[0]*xx[0] + a[1]*xx[1]
		s1 += b[0]*xx[2] + b[1]*xx[3]
		s2 += c[0]*xx[4] + c[1]*xx[5]
		s3 += d[0]*xx[6] + d[1]*xx[7]
	}
	for ; i < len(p); i++ {
		t := &e2m1Pair[p[i]]
		s0 += t[0]*x[2*i] + t[1]*x[2*i+1]
	}
	return (s0 + s1) + (s2 + s3)
}

func mxfp4RowScalar(w MXFP4, r, c0, c1 int, x []float32) float32 {
	p := w.Packed[r*w.Cols/2 : (r+1)*w.Cols/2]
	s := w.Scale[r*w.Cols/32 : (r+1)*w.Cols/32]
	var acc float32
	for c := c0; c < c1; c += 32 {
		acc += dotMXFP4(p[c/2:c/2+16], x[c:c+32]) * e8m0Value[s[c/32]]
	}
	return acc
}

func mxfp4MatvecScalar(w MXFP4, y, x []float32, lo, hi int) {
	for r := lo; r < hi; r++ {
		y[r-lo] = mxfp4RowScalar(w, r, 0, w.Cols, x)
	}
}

// mxfp4DecodeScalar needs c0 and c1 even.
func mxfp4DecodeScalar(w MXFP4, dst []float32, ld, r0, nr, c0, c1 int) {
	for i := range nr {
		r := r0 + i
		p := w.Packed[r*w.Cols/2 : (r+1)*w.Cols/2]
		s := w.Scale[r*w.Cols/32 : (r+1)*w.Cols/32]
		d := dst[i*ld : i*ld+c1-c0]
		for c := c0; c < c1; c += 2 {
			sc := e8m0Value[s[c/32]]
			b := p[c/2]
			d[c-c0] = e2m1Value[b&15] * sc
			d[c-c0+1] = e2m1Value[b>>4] * sc
		}
	}
}

// dotBF16 returns Σ bf16(w[2i:2i+2])·x[i] over len(x) values.
func dotBF16(w []byte, x []float32) float32 {
	w = w[:2*len(x)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(x); i += 4 {
		ww := (*[8]byte)(w[2*i : 2*i+8])
		xx := (*[4]float32)(x[i : i+4])
		s0 += bf16ToFloat32(binary.LittleEndian.Uint16(ww[0:])) * xx[0]
		s1 += bf16ToFloat32(binary.LittleEndian.Uint16(ww[2:])) * xx[1]
		s2 += bf16ToFloat32(binary.LittleEndian.Uint16(ww[4:])) * xx[2]
		s3 += bf16ToFloat32(binary.LittleEndian.Uint16(ww[6:])) * xx[3]
	}
	for ; i < len(x); i++ {
		s0 += bf16ToFloat32(binary.LittleEndian.Uint16(w[2*i:])) * x[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func bf16MatvecScalar(w BF16, y, x []float32, lo, hi int) {
	n := w.Cols
	for r := lo; r < hi; r++ {
		y[r-lo] = dotBF16(w.W[2*r*n:2*(r+1)*n], x[:n])
	}
}

func bf16DecodeScalar(w BF16, dst []float32, ld, r0, nr, c0, c1 int) {
	for i := range nr {
		r := r0 + i
		src := w.W[2*(r*w.Cols+c0) : 2*(r*w.Cols+c1)]
		d := dst[i*ld : i*ld+c1-c0]
		for j := range d {
			d[j] = bf16ToFloat32(binary.LittleEndian.Uint16(src[2*j:]))
		}
	}
}

func f32MatvecScalar(w F32, y, x []float32, lo, hi int) {
	n := w.Cols
	for r := lo; r < hi; r++ {
		y[r-lo] = dotF32(w.W[r*n:(r+1)*n], x[:n])
	}
}

func f32DecodeScalar(w F32, dst []float32, ld, r0, nr, c0, c1 int) {
	for i := range nr {
		r := r0 + i
		copy(dst[i*ld:i*ld+c1-c0], w.W[r*w.Cols+c0:r*w.Cols+c1])
	}
}
