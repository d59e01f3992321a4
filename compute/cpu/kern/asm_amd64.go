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

// gemmT8x16, gemmT8x32 and gemmT8x48 are the batched micro-kernels
// (gemm_amd64.s): for c < n they multiply-add the weights w[i*tileCols+c]
// (i < 8) with the 16, 32 or 48 transposed inputs at xt+c*xs (xs in bytes),
// one accumulator lane per (row, batch row), and then add row i's sums to
// the floats at acc+i*as (as in bytes). The caller checks every length; the
// CPU must have AVX-512.
//
//go:noescape
func gemmT8x16(w *float32, n int, xt *float32, xs int, acc *float32, as int)

//go:noescape
func gemmT8x32(w *float32, n int, xt *float32, xs int, acc *float32, as int)

//go:noescape
func gemmT8x48(w *float32, n int, xt *float32, xs int, acc *float32, as int)

// gatherT transposes n columns of up to 16 rows (gemm_amd64.s): for c < n
// and each lane l < 16 whose bit is set in mask, the float at dst+c*ds (ds
// in bytes) + 4l is set to src[c+idx[l]]; other lanes are not written. The
// caller checks every length; the CPU must have AVX-512.
//
//go:noescape
func gatherT(dst *float32, ds int, src *float32, idx *[16]int32, mask uint16, n int)
