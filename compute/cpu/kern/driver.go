package kern

// kernel is one weight format's implementation, used by run.
type kernel interface {
	// cols is the number of inputs per row.
	cols() int
	// matvec sets y[r-lo] = Σ_c W[r,c]·x[c] for r in [lo,hi) (batch 1).
	matvec(y, x []float32, lo, hi int)
	// decode writes the exact values W[r0+i, c0+j] to dst[i*ld+j] for
	// i < nr, j < c1-c0.
	decode(dst []float32, ld, r0, nr, c0, c1 int)
}

// preparer is implemented by kernels whose batch-1 product reads its input
// in another layout on this machine. prepare writes that layout of x to
// dst (len(dst) = len(x), 64-byte aligned) and reports whether it did
// (false: the kernel reads x as it is), and matvecPrepared is matvec
// reading it, with matvec's bits. A parallel product prepares x once and
// shares it between its chunks of rows.
type preparer interface {
	prepare(dst, x []float32) bool
	matvecPrepared(y, xp, x []float32, lo, hi int)
}

// Work below this many multiply-adds runs on the calling goroutine: waking
// workers would cost more than it saves.
const parallelMinMACs = 1 << 16

// Row granularity of the parallel split: batch 1 splits into units of
// matvecUnit rows, larger batches into row tiles of tileRows.
const (
	matvecUnit = 16
	tileRows   = 4
	// tileCols is the number of columns decoded per tile for batch > 1.
	tileCols = 512
)

func run(p *Pool, k kernel, y, x []float32, batch, r0, r1 int) {
	rows := r1 - r0
	if rows == 0 || batch == 0 {
		return
	}
	cols := k.cols()
	if cols == 0 {
		clear(y[:batch*rows])
		return
	}
	if p.Workers() == 1 || rows*cols*batch < parallelMinMACs {
		p = nil
	}
	if batch == 1 {
		units := (rows + matvecUnit - 1) / matvecUnit
		if pk, ok := k.(preparer); ok && p != nil {
			buf := p.floats(cols)
			defer p.putFloats(buf)
			if xp := buf.aligned; pk.prepare(xp, x[:cols]) {
				p.Run(units, func(lo, hi int) {
					a, b := r0+lo*matvecUnit, min(r0+hi*matvecUnit, r1)
					pk.matvecPrepared(y[a-r0:b-r0], xp, x[:cols], a, b)
				})
				return
			}
		}
		p.Run(units, func(lo, hi int) {
			a, b := r0+lo*matvecUnit, min(r0+hi*matvecUnit, r1)
			k.matvec(y[a-r0:b-r0], x[:cols], a, b)
		})
		return
	}
	gemm(p, k, y, x, batch, r0, r1)
}

// gemmTiles is the batch > 1 product of the portable build (and of the
// SIMD build's fallback): row tiles of tileRows, each tileRows x tileCols
// weight tile decoded once per call and reused for every batch row.
func gemmTiles(p *Pool, k kernel, y, x []float32, batch, r0, r1 int) {
	rows, cols := r1-r0, k.cols()
	tiles := (rows + tileRows - 1) / tileRows
	p.Run(tiles, func(lo, hi int) {
		a, b := r0+lo*tileRows, min(r0+hi*tileRows, r1)
		gemmRows(k, y[a-r0:], rows, x[:batch*cols], batch, a, b)
	})
}

// gemmRows sets y[b*ys+(r-lo)] = Σ_c W[r,c]·x[b*cols+c] for r in [lo,hi) and
// b < batch, decoding each tile of tileRows x tileCols weights once.
func gemmRows(k kernel, y []float32, ys int, x []float32, batch, lo, hi int) {
	cols := k.cols()
	var wraw [tileRows*tileCols + 15]float32 // 64-byte aligned: see mxfp4MatvecAVX512
	wbuf := (*[tileRows * tileCols]float32)(alignedTo64(wraw[:], tileRows*tileCols))
	acc := make([]float32, tileRows*batch*accLanes)
	for r := lo; r < hi; r += tileRows {
		nr := min(tileRows, hi-r)
		if nr < tileRows {
			clear(wbuf[:]) // rows past nr stay zero; their sums are discarded
		}
		clear(acc)
		for c0 := 0; c0 < cols; c0 += tileCols {
			c1 := min(c0+tileCols, cols)
			k.decode(wbuf[:], tileCols, r, nr, c0, c1)
			gemmTile(wbuf, c1-c0, x[c0:], cols, batch, acc)
		}
		for i := range nr {
			for b := range batch {
				y[b*ys+r-lo+i] = sumLanes(acc[(i*batch+b)*accLanes : (i*batch+b+1)*accLanes])
			}
		}
	}
}

func sumLanes(a []float32) float32 {
	var s float32
	for _, v := range a {
		s += v
	}
	return s
}

// gemmTileScalar adds Σ_{j<n} w[i*tileCols+j]·x[b*ldx+j] to acc[i*batch+b]
// (lane 0 of its accLanes) for i < tileRows, b < batch.
func gemmTileScalar(w *[tileRows * tileCols]float32, n int, x []float32, ldx, batch int, acc []float32) {
	for i := range tileRows {
		wr := w[i*tileCols : i*tileCols+n]
		for b := range batch {
			acc[(i*batch+b)*accLanes] += dotF32(wr, x[b*ldx:b*ldx+n])
		}
	}
}

// dotF32 returns Σ a[i]·b[i] over len(a) with four partial sums.
func dotF32(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		aa := (*[4]float32)(a[i : i+4])
		bb := (*[4]float32)(b[i : i+4])
		s0 += aa[0] * bb[0]
		s1 += aa[1] * bb[1]
		s2 += aa[2] * bb[2]
		s3 += aa[3] * bb[3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}
