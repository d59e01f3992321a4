//go:build amd64 && goexperiment.simd

package kern

//go:generate go run gen_asm.go

// mxPairAVX512 is the assembly inner loop of the MXFP4 row-pair matvec for
// scale bytes in [1,254] (mxfp4pair_amd64.s): p0, p1 hold 256*nsg code bytes
// plus 3 readable lookahead bytes, s0, s1 16*nsg scale bytes, xp 512*nsg
// transposed inputs; it sets acc[k] to row k's 16 lane sums. The caller
// checks every length; the CPU must have AVX-512.
//
//go:noescape
func mxPairAVX512(p0, p1, s0, s1 *byte, xp *float32, nsg int, acc *[2][16]float32)

// bf16Dot4AVX512 is the assembly inner loop of the BF16 matvec
// (bf16dot_amd64.s): for the four rows starting at w0..w3 (128*n64 bytes
// each) and the input x (64*n64 floats) it sets acc[k] to row k's 16 lane
// sums. The caller checks every length; the CPU must have AVX-512.
//
//go:noescape
func bf16Dot4AVX512(w0, w1, w2, w3 *byte, x *float32, n64 int, acc *[4][16]float32)

// fp8Dot4AVX512 is the assembly inner loop of the FP8 matvec
// (fp8dot_amd64.s): for the four rows of codes starting at q0..q3 (64*n64
// bytes each) and the permuted, scaled input xs (64*n64 floats) it adds row
// k's 16 lane sums into acc[k]. Its first npf (<= n64) iterations prefetch
// each row fp8Ahead bytes ahead. The caller checks every length; the CPU must
// have AVX512VBMI.
//
//go:noescape
func fp8Dot4AVX512(q0, q1, q2, q3 *byte, xs *float32, n64, npf int, acc *[4][16]float32)

// fp8Ahead is gen_asm.go's FP8 prefetch distance in bytes.
const fp8Ahead = 1024
