//go:build !(amd64 && goexperiment.simd)

package kern

// Without GOEXPERIMENT=simd (or off amd64) every kernel is the portable one.

const accLanes = 1

func gemm(p *Pool, k kernel, y, x []float32, batch, r0, r1 int) {
	gemmTiles(p, k, y, x, batch, r0, r1)
}

func gemmTile(w *[tileRows * tileCols]float32, n int, x []float32, ldx, batch int, acc []float32) {
	gemmTileScalar(w, n, x, ldx, batch, acc)
}

func (k fp8Kernel) matvec(y, x []float32, lo, hi int) { fp8MatvecScalar(k.w, y, x, lo, hi) }
func (k fp8Kernel) decode(dst []float32, ld, r0, nr, c0, c1 int) {
	fp8DecodeScalar(k.w, dst, ld, r0, nr, c0, c1)
}
func (k mxfp4Kernel) matvec(y, x []float32, lo, hi int) { mxfp4MatvecScalar(k.w, y, x, lo, hi) }
func (k mxfp4Kernel) decode(dst []float32, ld, r0, nr, c0, c1 int) {
	mxfp4DecodeScalar(k.w, dst, ld, r0, nr, c0, c1)
}
func (k bf16Kernel) matvec(y, x []float32, lo, hi int) { bf16MatvecScalar(k.w, y, x, lo, hi) }
func (k bf16Kernel) decode(dst []float32, ld, r0, nr, c0, c1 int) {
	bf16DecodeScalar(k.w, dst, ld, r0, nr, c0, c1)
}
func (k f32Kernel) matvec(y, x []float32, lo, hi int) { f32MatvecScalar(k.w, y, x, lo, hi) }
func (k f32Kernel) decode(dst []float32, ld, r0, nr, c0, c1 int) {
	f32DecodeScalar(k.w, dst, ld, r0, nr, c0, c1)
}
