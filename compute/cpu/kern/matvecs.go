package kern

import "reflect"

// MatVec is one batch-1 product of MatVecs: Y[r] = Σ_c W[r,c]·X[c] for r <
// Rows (only Y[:Rows] is written, only X[:Cols] read).
type MatVec struct {
	W    Matrix
	Y, X []float32
}

// MatVecs computes every product of ms, as W.MatMul(p, Y, X, 1) would, in
// one split over p: the products' rows, in units of matvecUnit, are spread
// over the workers together, so that a set of small products (a token's
// expert matrices: 4.5 MB each, ~70 µs on 16 cores) pays for one fan-out
// instead of one each. Every product's bits are those of its own MatMul
// (each row's sum is formed by the same kernel, whatever the split). A W
// of a type other than this package's four is multiplied by its own
// MatMul, one at a time. Ys must not overlap each other or any X. It
// panics as MatMul does.
func MatVecs(p *Pool, ms []MatVec) {
	type part struct {
		k    kernel
		y, x []float32
		pk   preparer  // k, when xp is set
		xp   []float32 // x prepared by pk, or nil
		u0   int       // the product's first unit in the joint split
		rows int
	}
	parts := make([]part, 0, len(ms))
	units, macs := 0, 0
	for _, m := range ms {
		var k kernel
		var name string // constant strings: no formatting on the decode path
		switch w := m.W.(type) {
		case FP8Block:
			w.check()
			k, name = fp8Kernel{w}, "MatVecs FP8Block"
		case MXFP4:
			w.check()
			k, name = mxfp4Kernel{w}, "MatVecs MXFP4"
		case BF16:
			w.check()
			k, name = bf16Kernel{w}, "MatVecs BF16"
		case F32:
			w.check()
			k, name = f32Kernel{w}, "MatVecs F32"
		default:
			m.W.MatMul(p, m.Y, m.X, 1)
			continue
		}
		rows, cols := m.W.Dims()
		checkCall(name, rows, cols, m.Y, m.X, 1, 0, rows)
		if rows == 0 {
			continue
		}
		if cols == 0 {
			clear(m.Y[:rows])
			continue
		}
		parts = append(parts, part{k: k, y: m.Y, x: m.X[:cols], u0: units, rows: rows})
		units += (rows + matvecUnit - 1) / matvecUnit
		macs += rows * cols
	}
	if len(parts) == 0 {
		return
	}
	if p.Workers() == 1 || macs < parallelMinMACs {
		p = nil
	}
	var bufs []*floatBuf
	if p != nil { // prepare each distinct x once (an expert's w1 and w3 share it)
		for i := range parts {
			pt := &parts[i]
			pk, ok := pt.k.(preparer)
			if !ok {
				continue
			}
			for j := range i {
				q := &parts[j]
				if q.xp != nil && len(q.x) == len(pt.x) && &q.x[0] == &pt.x[0] && reflect.TypeOf(q.k) == reflect.TypeOf(pt.k) {
					pt.xp = q.xp
					break
				}
			}
			if pt.xp == nil {
				buf := p.floats(len(pt.x))
				bufs = append(bufs, buf)
				if pk.prepare(buf.aligned, pt.x) {
					pt.xp = buf.aligned
				}
			}
			pt.pk = pk
		}
	}
	p.Run(units, func(lo, hi int) {
		// The first part holding unit lo, then each part's share of [lo, hi).
		i := 0
		for i+1 < len(parts) && parts[i+1].u0 <= lo {
			i++
		}
		for u := lo; u < hi && i < len(parts); i++ {
			pt := &parts[i]
			end := pt.u0 + (pt.rows+matvecUnit-1)/matvecUnit
			ue := min(hi, end)
			a, b := (u-pt.u0)*matvecUnit, min((ue-pt.u0)*matvecUnit, pt.rows)
			if pt.xp != nil {
				pt.pk.matvecPrepared(pt.y[a:b], pt.xp, pt.x, a, b)
			} else {
				pt.k.matvec(pt.y[a:b], pt.x, a, b)
			}
			u = ue
		}
	})
	for _, b := range bufs {
		p.putFloats(b)
	}
}
