// Package qat is the simulated quantization of DeepSeek's reference code
// (dsv4-flash.md §3.2): the steps its inference applies to activations, to
// the stored KV and to the indexer, which the qat numeric target
// reproduces. Every function works in place on float32 slices the caller
// owns. Scales are powers of two, so scaling is exact and the only rounding
// is to the FP8 or FP4 grid (ties to even, as package format's encoders
// round).
package qat

import (
	"math"

	"moxie/format"
)

const (
	// ActBlock is the block of a linear input's FP8 simulation (act_quant).
	ActBlock = 128
	// KVBlock is the block of the stored KV's FP8 simulation.
	KVBlock = 64
	// FP4Block is the block of the indexer's FP4 simulation.
	FP4Block = 32
	// ActMin is act_quant's floor on a block's largest magnitude.
	ActMin = 1e-4
)

// Pow2Ceil returns 2^ceil(log2(y)) for a positive normal float32 y, from its
// exponent and mantissa bits as the reference computes it (a power of two
// is itself; anything above it the next one up).
func Pow2Ceil(y float32) float32 {
	b := math.Float32bits(y)
	e := int(b>>23&0xff) - 127
	if b&0x7fffff != 0 {
		e++
	}
	return float32(math.Ldexp(1, e))
}

// ActScaleExp returns the exponent of act_quant's scale for a block whose
// largest magnitude is amax (a normal float32 of at least ActMin): e with
// 2^e = Pow2Ceil(amax/448), the float32 quotient's, formed from amax's own
// bits without the division. amax = M·2^E with M in [1, 2) gives amax/448
// = (M/1.75)·2^(E-8), and the rounded quotient lies above a power of two
// exactly when M > 1.75 (TestActScaleExp). The GPU's qat kernels form the
// scale this way.
func ActScaleExp(amax float32) int {
	b := math.Float32bits(amax)
	e := int(b>>23&0xff) - 127 - 8
	if b&0x7fffff > 0x600000 {
		e++
	}
	return e
}

// blockSim replaces each block of `block` values of x (the last may be
// shorter) by its simulation on a grid whose largest value is qmax: amax =
// max(|x|, floor) over the block, s = 2^ceil(log2(amax/qmax)), x =
// round(x/s)·s, round the grid's encoder and decoder (saturating beyond
// ±qmax). The FP8 and FP4 simulations differ only in these.
func blockSim(x []float32, block int, floor, qmax float32, round func(float32) float32) {
	for lo := 0; lo < len(x); lo += block {
		blk := x[lo:min(lo+block, len(x))]
		amax := floor
		for _, v := range blk {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		s := Pow2Ceil(amax / qmax)
		for i, v := range blk {
			blk[i] = round(v/s) * s
		}
	}
}

// e4m3Round and e2m1Round round to the FP8 E4M3 and FP4 E2M1 grids (ties
// to even, saturating).
func e4m3Round(v float32) float32 { return format.E4M3ToFloat32(format.Float32ToE4M3(v)) }
func e2m1Round(v float32) float32 { return format.E2M1ToFloat32(format.Float32ToE2M1(v)) }

// FP8Sim is the FP8 E4M3 simulation in blocks of `block`: blockSim with
// floor ActMin and qmax 448.
func FP8Sim(x []float32, block int) { blockSim(x, block, ActMin, 448, e4m3Round) }

// ActQuant is act_quant on every row of x [rows, cols]: each row's blocks of
// ActBlock along cols through FP8Sim. The FP8 and FP4 linears of the qat
// target read their input through it.
func ActQuant(x []float32, cols int) {
	for r := 0; r+cols <= len(x); r += cols {
		FP8Sim(x[r:r+cols], ActBlock)
	}
}

// ActQuantCopy returns ActQuant of a copy of x (x is left as it is).
func ActQuantCopy(x []float32, cols int) []float32 {
	y := append([]float32(nil), x...)
	ActQuant(y, cols)
	return y
}

// KVSim is the stored KV's simulation on each row of x [rows, dim]: the
// first nope values (those RoPE leaves alone) through FP8Sim in blocks of
// KVBlock; the rotated tail stays as it is.
func KVSim(x []float32, dim, nope int) {
	for r := 0; r+dim <= len(x); r += dim {
		FP8Sim(x[r:r+nope], KVBlock)
	}
}

// FP4Sim is the FP4 E2M1 simulation in blocks of FP4Block: blockSim
// with floor 6·2^-126 and qmax 6.
func FP4Sim(x []float32) { blockSim(x, FP4Block, float32(6*math.Ldexp(1, -126)), 6, e2m1Round) }

// Hadamard replaces x (a power-of-two length n: the config's validation
// holds index_head_dim to one) by H·x/sqrt(n), H the Sylvester-order
// Walsh–Hadamard matrix (entry (i, j) is -1 to the number of bits i and j
// share), by the iterative butterfly in float32.
func Hadamard(x []float32) {
	n := len(x)
	for h := 1; h < n; h *= 2 {
		for i := 0; i < n; i += 2 * h {
			for j := i; j < i+h; j++ {
				a, b := x[j], x[j+h]
				x[j], x[j+h] = a+b, a-b
			}
		}
	}
	s := float32(1 / math.Sqrt(float64(n)))
	for i := range x {
		x[i] *= s
	}
}

// IndexSim is the indexer's simulation on each row of x [rows, dim] (a
// query head or a compressed key): Hadamard, then FP4Sim.
func IndexSim(x []float32, dim int) {
	for r := 0; r+dim <= len(x); r += dim {
		Hadamard(x[r : r+dim])
		FP4Sim(x[r : r+dim])
	}
}

// BF16Round rounds every value of x to bfloat16 (ties to even): the
// reference's BF16 grouped wo_a takes and gives BF16.
func BF16Round(x []float32) {
	for i, v := range x {
		x[i] = format.BF16ToFloat32(format.Float32ToBF16(v))
	}
}
