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
