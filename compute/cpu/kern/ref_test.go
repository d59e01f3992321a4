package kern

import (
	"math"
	"math/rand/v2"
)

// Independent float64 reference, written from the format definitions
// (dsv4-flash.md §3.1) without using the package's tables.

func refE4M3(b byte) float64 {
	sign := 1.0
	if b&0x80 != 0 {
		sign = -1
	}
	e := int(b>>3) & 0xF
	m := float64(b & 7)
	switch {
	case e == 15 && b&7 == 7:
		return math.NaN()
	case e == 0: // subnormal: m/8 · 2^-6
		return sign * m * math.Pow(2, -9)
	default: // (8+m) · 2^(e-7-3)
		return sign * (8 + m) * math.Pow(2, float64(e-10))
	}
}

func refE8M0(b byte) float64 {
	if b == 0xFF {
		return math.NaN()
	}
	return math.Pow(2, float64(int(b)-127))
}

func refE2M1(c byte) float64 {
	sign := 1.0
	if c&8 != 0 {
		sign = -1
	}
	e := int(c>>1) & 3
	m := float64(c & 1)
	if e == 0 {
		return sign * m * 0.5
	}
	return sign * (1 + m/2) * math.Pow(2, float64(e-1))
}

func refBF16(lo, hi byte) float64 {
	return float64(math.Float32frombits(uint32(hi)<<24 | uint32(lo)<<16))
}

// refWeights returns W as float64, row-major.
type refMatrix struct {
	rows, cols int
	w          []float64
}

func refFP8(m FP8Block) refMatrix {
	nbc := (m.Cols + m.Block - 1) / m.Block
	w := make([]float64, m.Rows*m.Cols)
	for r := range m.Rows {
		for c := range m.Cols {
			w[r*m.Cols+c] = refE4M3(m.Q[r*m.Cols+c]) * refE8M0(m.Scale[(r/m.Block)*nbc+c/m.Block])
		}
	}
	return refMatrix{m.Rows, m.Cols, w}
}

func refMX(m MXFP4) refMatrix {
	w := make([]float64, m.Rows*m.Cols)
	for r := range m.Rows {
		for c := range m.Cols {
			b := m.Packed[(r*m.Cols+c)/2]
			code := b & 0xF
			if c%2 == 1 {
				code = b >> 4
			}
			w[r*m.Cols+c] = refE2M1(code) * refE8M0(m.Scale[r*(m.Cols/32)+c/32])
		}
	}
	return refMatrix{m.Rows, m.Cols, w}
}

func refBF(m BF16) refMatrix {
	w := make([]float64, m.Rows*m.Cols)
	for i := range w {
		w[i] = refBF16(m.W[2*i], m.W[2*i+1])
	}
	return refMatrix{m.Rows, m.Cols, w}
}

func refF(m F32) refMatrix {
	w := make([]float64, m.Rows*m.Cols)
	for i := range w {
		w[i] = float64(m.W[i])
	}
	return refMatrix{m.Rows, m.Cols, w}
}

// product returns, for rows [r0,r1) and every batch row, the float64 value
// Σ W·x, the magnitude Σ|W·x| (for the error bound), and whether a NaN
// weight or input takes part.
func (m refMatrix) product(x []float32, batch, r0, r1 int) (val, mag []float64, nan []bool) {
	n := r1 - r0
	val = make([]float64, batch*n)
	mag = make([]float64, batch*n)
	nan = make([]bool, batch*n)
	for b := range batch {
		for r := r0; r < r1; r++ {
			var s, a float64
			isNaN := false
			for c := range m.cols {
				w, xv := m.w[r*m.cols+c], float64(x[b*m.cols+c])
				if math.IsNaN(w) || math.IsNaN(xv) {
					isNaN = true
					continue
				}
				s += w * xv
				a += math.Abs(w * xv)
			}
			val[b*n+r-r0], mag[b*n+r-r0], nan[b*n+r-r0] = s, a, isNaN
		}
	}
	return val, mag, nan
}

// tolerance is the allowed |got-want| for a float32 sum of cols products
// whose absolute values add up to mag: each product and each addition rounds
// by at most u = 2^-24 relative; blocked partial sums keep the growth near
// sqrt(cols) in practice, and the bound below allows 4·(sqrt(cols)+4) units
// (still ~100x below the error of any wrong weight, scale or column).
func tolerance(cols int, mag float64) float64 {
	const u = 1.0 / (1 << 24)
	return 4*(math.Sqrt(float64(cols))+4)*u*mag + 1e-30
}

// Random stored weights.

func randFP8(rng *rand.Rand, rows, cols, block int) FP8Block {
	q := make([]byte, rows*cols)
	for i := range q {
		b := byte(rng.IntN(256))
		if b&0x7F == 0x7F { // NaN codes are tested separately
			b ^= 1
		}
		q[i] = b
	}
	s := make([]byte, ((rows+block-1)/block)*((cols+block-1)/block))
	for i := range s {
		s[i] = byte(112 + rng.IntN(24)) // 2^-15 .. 2^8
	}
	return FP8Block{Q: q, Scale: s, Rows: rows, Cols: cols, Block: block}
}

func randMX(rng *rand.Rand, rows, cols int) MXFP4 {
	p := make([]byte, rows*cols/2)
	for i := range p {
		p[i] = byte(rng.IntN(256))
	}
	s := make([]byte, rows*cols/32)
	for i := range s {
		s[i] = byte(112 + rng.IntN(24))
	}
	return MXFP4{Packed: p, Scale: s, Rows: rows, Cols: cols}
}

func randBF(rng *rand.Rand, rows, cols int) BF16 {
	w := make([]byte, 2*rows*cols)
	for i := 0; i < len(w); i += 2 {
		f := math.Float32bits(float32(rng.NormFloat64()))
		w[i], w[i+1] = byte(f>>16), byte(f>>24)
	}
	return BF16{W: w, Rows: rows, Cols: cols}
}

func randF32(rng *rand.Rand, rows, cols int) F32 {
	w := make([]float32, rows*cols)
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
	return F32{W: w, Rows: rows, Cols: cols}
}

func randX(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}
