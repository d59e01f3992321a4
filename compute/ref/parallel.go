package ref

import (
	"runtime"
	"sync"

	"moxie/compute"
)

// The functions below compute the same float64 values as Dequant, Linear and
// GroupedLinear (each output by the same loop, in the same order, so the
// results are bit-identical), spread over runtime.GOMAXPROCS goroutines, or
// at chosen outputs only. They exist so that a large GPU test's reference
// costs wall time in proportion to the machine's cores, not one core.

// parallelRange calls f(lo, hi) on disjoint ranges that cover [0, n), on up
// to GOMAXPROCS goroutines, and returns when all calls have.
func parallelRange(n int, f func(lo, hi int)) {
	p := runtime.GOMAXPROCS(0)
	if p > n {
		p = n
	}
	if p <= 1 {
		if n > 0 {
			f(0, n)
		}
		return
	}
	var wg sync.WaitGroup
	for i := range p {
		lo, hi := i*n/p, (i+1)*n/p
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(lo, hi)
		}()
	}
	wg.Wait()
}

// ParallelDequant is Dequant with bands of rows (whole FP8 blocks) spread
// over the CPUs; each band is decoded by Dequant itself.
func ParallelDequant(w compute.WeightData) []float64 {
	align, dataRow, scaleBand := 1, 0, 0 // rows per band unit, data bytes per row, scale bytes per unit
	switch w.Format {
	case compute.FP8Block:
		if w.Block <= 0 {
			return Dequant(w)
		}
		align, dataRow, scaleBand = w.Block, w.Cols, (w.Cols+w.Block-1)/w.Block
	case compute.MXFP8:
		dataRow, scaleBand = w.Cols, (w.Cols+31)/32
	case compute.MXFP4:
		dataRow, scaleBand = w.Cols/2, (w.Cols+31)/32
	case compute.BF16:
		dataRow = 2 * w.Cols
	case compute.F32:
		dataRow = 4 * w.Cols
	default:
		return Dequant(w)
	}
	out := make([]float64, w.Rows*w.Cols)
	units := (w.Rows + align - 1) / align
	parallelRange(units, func(lo, hi int) {
		r0, r1 := lo*align, min(hi*align, w.Rows)
		band := w
		band.Rows = r1 - r0
		band.Data = w.Data[r0*dataRow : r1*dataRow]
		if scaleBand > 0 {
			band.Scale = w.Scale[lo*scaleBand : hi*scaleBand]
		}
		copy(out[r0*w.Cols:r1*w.Cols], Dequant(band))
	})
	return out
}

// ParallelLinear is Linear with the outputs spread over the CPUs.
func ParallelLinear(W []float64, rows, cols int, x []float64, batch int) []float64 {
	return ParallelGroupedLinear(W, rows, cols, x, batch, 1)
}

// ParallelGroupedLinear is GroupedLinear (groups = 1: Linear) with the
// outputs spread over the CPUs.
func ParallelGroupedLinear(W []float64, rows, cols int, x []float64, batch, groups int) []float64 {
	y := make([]float64, batch*rows)
	parallelRange(batch*rows, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			y[i] = groupedDot(W, rows, cols, x, groups, i)
		}
	})
	return y
}

// GroupedLinearAt returns GroupedLinear(W, rows, cols, x, batch, groups) at
// the flat output indices idx (b·rows + r), out[k] for idx[k]; groups = 1 is
// Linear. Indices outside [0, batch·rows) panic.
func GroupedLinearAt(W []float64, rows, cols int, x []float64, batch, groups int, idx []int) []float64 {
	out := make([]float64, len(idx))
	parallelRange(len(idx), func(lo, hi int) {
		for k := lo; k < hi; k++ {
			if idx[k] < 0 || idx[k] >= batch*rows {
				panic("ref.GroupedLinearAt: output index out of range")
			}
			out[k] = groupedDot(W, rows, cols, x, groups, idx[k])
		}
	})
	return out
}

// groupedDot is output i = b·rows + r of GroupedLinear, summed in column order.
func groupedDot(W []float64, rows, cols int, x []float64, groups, i int) float64 {
	b, r := i/rows, i%rows
	g := r / (rows / groups)
	w := W[r*cols : (r+1)*cols]
	xs := x[b*groups*cols+g*cols : b*groups*cols+(g+1)*cols]
	s := 0.0
	for c, v := range w {
		s += v * xs[c]
	}
	return s
}
