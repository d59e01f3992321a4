package computetest

import (
	"encoding/binary"
	"math"
	"math/rand/v2"

	"moxie/compute"
	"moxie/format"
)

// pow2Scale returns the E8M0 byte of the smallest power of two s with
// amax/s <= fmax (1.0 for an all-zero block).
func pow2Scale(amax, fmax float64) byte {
	if amax == 0 {
		return 127
	}
	e := int(math.Ceil(math.Log2(amax / fmax)))
	e = max(min(e, 127), -127)
	b, _ := format.E8M0FromExponent(e)
	return b
}

// Quantize encodes a float32 matrix [rows, cols] in format f (FP8 blocks of edge
// block, MXFP4 with 32-column scales, BF16 round to nearest, F32 exact) with
// power-of-two scales chosen from each block's max magnitude. It is a test
// helper, not a production quantizer.
func Quantize(f compute.Format, w []float32, rows, cols, block int) compute.WeightData {
	d := compute.WeightData{Format: f, Rows: rows, Cols: cols, Block: block}
	switch f {
	case compute.FP8Block:
		nbr, nbc := (rows+block-1)/block, (cols+block-1)/block
		d.Data = make([]byte, rows*cols)
		d.Scale = make([]byte, nbr*nbc)
		for br := range nbr {
			for bc := range nbc {
				amax := 0.0
				for r := br * block; r < min(rows, (br+1)*block); r++ {
					for c := bc * block; c < min(cols, (bc+1)*block); c++ {
						amax = math.Max(amax, math.Abs(float64(w[r*cols+c])))
					}
				}
				sb := pow2Scale(amax, 448)
				d.Scale[br*nbc+bc] = sb
				s := format.E8M0ToFloat32(sb)
				for r := br * block; r < min(rows, (br+1)*block); r++ {
					for c := bc * block; c < min(cols, (bc+1)*block); c++ {
						d.Data[r*cols+c] = format.Float32ToE4M3(w[r*cols+c] / s)
					}
				}
			}
		}
	case compute.MXFP8:
		ns := (cols + 31) / 32
		d.Data = make([]byte, rows*cols)
		d.Scale = make([]byte, rows*ns)
		for r := range rows {
			for j := range ns {
				amax := 0.0
				for c := j * 32; c < min(cols, (j+1)*32); c++ {
					amax = math.Max(amax, math.Abs(float64(w[r*cols+c])))
				}
				sb := pow2Scale(amax, 448)
				d.Scale[r*ns+j] = sb
				s := format.E8M0ToFloat32(sb)
				for c := j * 32; c < min(cols, (j+1)*32); c++ {
					d.Data[r*cols+c] = format.Float32ToE4M3(w[r*cols+c] / s)
				}
			}
		}
	case compute.MXFP4:
		ns := (cols + 31) / 32
		d.Data = make([]byte, rows*cols/2)
		d.Scale = make([]byte, rows*ns)
		for r := range rows {
			for j := range ns {
				amax := 0.0
				for c := j * 32; c < min(cols, (j+1)*32); c++ {
					amax = math.Max(amax, math.Abs(float64(w[r*cols+c])))
				}
				sb := pow2Scale(amax, 6)
				d.Scale[r*ns+j] = sb
				s := format.E8M0ToFloat32(sb)
				for c := j * 32; c < min(cols, (j+1)*32); c++ {
					code := format.Float32ToE2M1(w[r*cols+c] / s)
					if c%2 == 0 {
						d.Data[r*cols/2+c/2] |= code
					} else {
						d.Data[r*cols/2+c/2] |= code << 4
					}
				}
			}
		}
	case compute.BF16:
		d.Data = make([]byte, 2*rows*cols)
		for i, v := range w {
			binary.LittleEndian.PutUint16(d.Data[2*i:], format.Float32ToBF16(v))
		}
	case compute.F32:
		d.Data = make([]byte, 4*rows*cols)
		for i, v := range w {
			binary.LittleEndian.PutUint32(d.Data[4*i:], math.Float32bits(v))
		}
	}
	return d
}

// Normal returns n values drawn from N(0, std²).
func Normal(rng *rand.Rand, n int, std float64) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(rng.NormFloat64() * std)
	}
	return out
}

// RandomWeight returns a random [rows, cols] weight in format f with entries
// of standard deviation std before quantization.
func RandomWeight(rng *rand.Rand, f compute.Format, rows, cols int, std float64) compute.WeightData {
	return Quantize(f, Normal(rng, rows*cols, std), rows, cols, 128)
}
