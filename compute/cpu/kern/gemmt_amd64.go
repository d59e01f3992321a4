//go:build amd64 && goexperiment.simd

package kern

// Batched products (prefill) on AVX-512. The input is transposed once per
// call into blocks of up to 48 batch rows, xt[c*w+b] for a block of width w
// (16, 32 or 48, padded with zeros). Each 8 x tileCols weight panel is
// decoded once into float32, and the assembly micro-kernels broadcast each
// weight against every block in turn, one output per vector lane: no lane
// reduction is needed. Each output is a chain of fused multiply-adds over
// a panel's columns, added to its running sum once per panel.

const (
	// gemmTRows is the number of weight rows per micro-kernel call;
	// gemmTTile (a multiple of it) the rows whose outputs are written to y
	// together: 16 rows are a 64-byte line of y per batch row.
	gemmTRows = 8
	gemmTTile = 16
	// gemmTMinBatch is the smallest batch that takes this path; below it
	// the 16 lanes of a block would be mostly padding.
	gemmTMinBatch = 6
	// gemmTMinRows is the fewest weight rows that take this path: the
	// transposed input costs about as much as the products of 32 rows
	// (brown-mini's 24-row HC projections ran 2x faster on gemmTiles).
	gemmTMinRows = 32
	// gemmTMaxBatch is the most batch rows per pass: a tileCols panel of
	// their transposed input (1 MiB) stays in the L2 cache while the
	// weight panels stream over it.
	gemmTMaxBatch = 512
)

func gemm(p *Pool, k kernel, y, x []float32, batch, r0, r1 int) {
	// The gathers index rows of x with int32 offsets.
	if !hasAVX512 || batch < gemmTMinBatch || r1-r0 < gemmTMinRows || 16*k.cols() >= 1<<31 {
		gemmTiles(p, k, y, x, batch, r0, r1)
		return
	}
	rows, cols := r1-r0, k.cols()
	for b0 := 0; b0 < batch; b0 += gemmTMaxBatch {
		nb := min(gemmTMaxBatch, batch-b0)
		gemmPass(p, k, y[b0*rows:], x[b0*cols:], nb, r0, r1)
	}
}

// gemmBlock is one block of the transposed input: batch rows [b0, b0+nb)
// at xt[off + c*w + (b-b0)], padded with zeros to the width w.
type gemmBlock struct{ b0, nb, w, off int }

// gemmPass is gemm for batch <= gemmTMaxBatch.
func gemmPass(p *Pool, k kernel, y, x []float32, batch, r0, r1 int) {
	rows, cols := r1-r0, k.cols()
	var blocks []gemmBlock
	off := 0
	for b0 := 0; b0 < batch; b0 += 48 {
		nb := min(48, batch-b0)
		w := (nb + 15) &^ 15
		blocks = append(blocks, gemmBlock{b0: b0, nb: nb, w: w, off: off})
		off += w * cols
	}
	xt := make([]float32, off)
	var idx [16]int32
	for l := range idx {
		idx[l] = int32(l * cols)
	}
	for _, bl := range blocks {
		for bb := 0; bb < bl.nb; bb += 16 {
			lanes := min(16, bl.nb-bb)
			gatherT(&xt[bl.off+bb], 4*bl.w, &x[(bl.b0+bb)*cols], &idx, uint16(1<<lanes-1), cols)
		}
	}
	tiles := (rows + gemmTTile - 1) / gemmTTile
	p.Run(tiles, func(lo, hi int) {
		a, b := r0+lo*gemmTTile, min(r0+hi*gemmTTile, r1)
		gemmRowsT(k, y[a-r0:], rows, xt, blocks, batch, a, b)
	})
}

// gemmRowsT sets y[b*ys+(r-lo)] = Σ_c W[r,c]·x[b,c] for r in [lo,hi) and
// b < batch (<= gemmTMaxBatch), x given as the transposed blocks.
func gemmRowsT(k kernel, y []float32, ys int, xt []float32, blocks []gemmBlock, batch, lo, hi int) {
	cols := k.cols()
	wa := (batch + 15) &^ 15 // acc's row stride: every block's lanes
	// 64-byte aligned (see mxfp4MatvecAVX512): the tile and the sums are
	// read and written in 64-byte vectors.
	var wraw [gemmTRows*tileCols + 15]float32
	var accRaw [gemmTTile*gemmTMaxBatch + 15]float32
	wbuf := (*[gemmTRows * tileCols]float32)(alignedTo64(wraw[:], gemmTRows*tileCols))
	acc := alignedTo64(accRaw[:], gemmTTile*gemmTMaxBatch)[:gemmTTile*wa]
	var aidx [16]int32
	for l := range aidx {
		aidx[l] = int32(l * wa)
	}
	for r := lo; r < hi; r += gemmTTile {
		nt := min(gemmTTile, hi-r)
		clear(acc)
		for c0 := 0; c0 < cols; c0 += tileCols {
			c1 := min(c0+tileCols, cols)
			n := c1 - c0
			for h := 0; h < nt; h += gemmTRows {
				nr := min(gemmTRows, nt-h)
				if nr < gemmTRows {
					clear(wbuf[:]) // rows past nr stay zero; their sums are discarded
				}
				k.decode(wbuf[:], tileCols, r+h, nr, c0, c1)
				for _, bl := range blocks {
					xp, ap := &xt[bl.off+c0*bl.w], &acc[h*wa+bl.b0]
					switch bl.w {
					case 48:
						gemmT8x48(&wbuf[0], n, xp, 4*bl.w, ap, 4*wa)
					case 32:
						gemmT8x32(&wbuf[0], n, xp, 4*bl.w, ap, 4*wa)
					default:
						gemmT8x16(&wbuf[0], n, xp, 4*bl.w, ap, 4*wa)
					}
				}
			}
		}
		// y[b*ys+r-lo+i] = acc[i*wa+b]: a gather from acc (in L1) and one
		// store of nt contiguous floats per batch row.
		_ = y[(batch-1)*ys+r-lo+nt-1]
		gatherT(&y[r-lo], 4*ys, &acc[0], &aidx, uint16(1<<nt-1), batch)
	}
}
