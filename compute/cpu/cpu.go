// Package cpu is the host implementation of compute.Backend: float32 math,
// weights kept in their stored formats (views of checkpoint bytes) and decoded
// row by row inside the matrix products, which are spread over goroutines.
package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"unsafe"

	"moxie/compute"
	"moxie/compute/cpu/kern"
	"moxie/format"
)

// Backend is the CPU backend. The zero value is not usable; call New.
type Backend struct {
	workers int
	pool    *kern.Pool
}

// New returns a CPU backend using up to workers goroutines per operation
// (workers <= 0 means runtime.GOMAXPROCS(0)). Call Close when done with it.
func New(workers int) *Backend {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	return &Backend{workers: workers, pool: kern.NewPool(workers)}
}

// Close stops the worker goroutines. The backend must not be used afterwards.
func (b *Backend) Close() { b.pool.Close() }

var _ compute.Backend = (*Backend)(nil)

// Name implements compute.Backend.
func (b *Backend) Name() string { return fmt.Sprintf("cpu(%d)", b.workers) }

// weight is a bound CPU weight: a view of the stored bytes, multiplied by a
// kern kernel when kern supports the format (k != nil), otherwise by decoding
// rows (MXFP8, MXFP4 with columns not a multiple of 32).
type weight struct {
	d compute.WeightData
	k kern.Matrix
}

func (w *weight) Rows() int { return w.d.Rows }
func (w *weight) Cols() int { return w.d.Cols }

// decodeRow writes row r of w into dst [Cols].
func (w *weight) decodeRow(dst []float32, r int) {
	d := &w.d
	switch d.Format {
	case compute.FP8Block:
		nb := (d.Cols + d.Block - 1) / d.Block
		br := r / d.Block
		format.DecodeFP8BlockRow(dst, d.Data[r*d.Cols:(r+1)*d.Cols], d.Scale[br*nb:(br+1)*nb], d.Block)
	case compute.MXFP4:
		ns := (d.Cols + 31) / 32
		h := d.Cols / 2
		format.DecodeMXFP4Row(dst, d.Data[r*h:(r+1)*h], d.Scale[r*ns:(r+1)*ns])
	case compute.MXFP8:
		ns := (d.Cols + 31) / 32
		format.DecodeMXFP8Row(dst, d.Data[r*d.Cols:(r+1)*d.Cols], d.Scale[r*ns:(r+1)*ns])
	case compute.BF16:
		format.DecodeBF16(dst, d.Data[2*r*d.Cols:2*(r+1)*d.Cols])
	case compute.F32:
		format.DecodeF32(dst, d.Data[4*r*d.Cols:4*(r+1)*d.Cols])
	}
}

// Bind implements compute.Backend: it validates the byte lengths and keeps a view.
func (b *Backend) Bind(d compute.WeightData) (compute.Weight, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	w := &weight{d: d}
	switch d.Format {
	case compute.FP8Block:
		w.k = kern.FP8Block{Q: d.Data, Scale: d.Scale, Rows: d.Rows, Cols: d.Cols, Block: d.Block}
	case compute.MXFP4:
		if d.Cols%32 == 0 {
			w.k = kern.MXFP4{Packed: d.Data, Scale: d.Scale, Rows: d.Rows, Cols: d.Cols}
		}
	case compute.BF16:
		w.k = kern.BF16{W: d.Data, Rows: d.Rows, Cols: d.Cols}
	case compute.F32:
		w.k = kern.F32{W: float32View(d.Data), Rows: d.Rows, Cols: d.Cols}
	}
	return w, nil
}

// float32View returns little-endian float32 bytes as []float32: a view when
// the host is little-endian and the bytes are 4-aligned, else a decoded copy.
func float32View(b []byte) []float32 {
	n := len(b) / 4
	if n == 0 {
		return nil
	}
	var probe [2]byte
	binary.NativeEndian.PutUint16(probe[:], 1)
	if probe[0] == 1 && uintptr(unsafe.Pointer(&b[0]))%4 == 0 {
		return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n)
	}
	out := make([]float32, n)
	format.DecodeF32(out, b)
	return out
}

func asWeight(op string, w compute.Weight) *weight {
	cw, ok := w.(*weight)
	if !ok {
		panic(fmt.Sprintf("cpu.%s: weight %T was not bound by the CPU backend", op, w))
	}
	return cw
}

func check(op string, ok bool, format string, args ...any) {
	if !ok {
		panic(fmt.Sprintf("cpu."+op+": "+format, args...))
	}
}

// parallel runs f over [0, n) split into contiguous chunks, one per worker,
// when the work (n·cost) is large enough to pay for the goroutines.
func (b *Backend) parallel(n int, cost int, f func(lo, hi int)) {
	if n*cost < 1<<15 || b.workers <= 1 || n < 2 {
		f(0, n)
		return
	}
	b.pool.Run(n, f)
}

func dot(a, b []float32) float32 { return kern.Dot(a, b) }

// linear computes rows [r0, r1) for every batch row, with x rows of stride xs
// starting at column offset xo (for grouped projections).
func (b *Backend) linearRows(w *weight, y, x []float32, batch, r0, r1, xs, xo int) {
	cols := w.d.Cols
	rows := w.d.Rows
	b.parallel(r1-r0, cols*batch, func(lo, hi int) {
		buf := make([]float32, cols)
		for r := r0 + lo; r < r0+hi; r++ {
			w.decodeRow(buf, r)
			for bi := 0; bi < batch; bi++ {
				y[bi*rows+r] = dot(buf, x[bi*xs+xo:bi*xs+xo+cols])
			}
		}
	})
}

// Linear implements compute.Backend.
func (b *Backend) Linear(wt compute.Weight, y, x []float32, batch int) {
	w := asWeight("Linear", wt)
	check("Linear", len(y) == batch*w.d.Rows && len(x) == batch*w.d.Cols,
		"weight [%d, %d], batch %d: len(y)=%d len(x)=%d", w.d.Rows, w.d.Cols, batch, len(y), len(x))
	if w.k != nil {
		w.k.MatMul(b.pool, y, x, batch)
		return
	}
	b.linearRows(w, y, x, batch, 0, w.d.Rows, w.d.Cols, 0)
}

var _ compute.ManyLinear = (*Backend)(nil)

// LinearMany implements compute.ManyLinear: the products whose weights
// have a kern kernel share one split over the workers (kern.MatVecs); the
// others run one at a time.
func (b *Backend) LinearMany(jobs []compute.LinearJob) {
	ms := make([]kern.MatVec, 0, len(jobs))
	for _, j := range jobs {
		w := asWeight("LinearMany", j.W)
		check("LinearMany", len(j.Y) == w.d.Rows && len(j.X) == w.d.Cols,
			"weight [%d, %d]: len(y)=%d len(x)=%d", w.d.Rows, w.d.Cols, len(j.Y), len(j.X))
		if w.k == nil {
			b.Linear(j.W, j.Y, j.X, 1)
			continue
		}
		ms = append(ms, kern.MatVec{W: w.k, Y: j.Y, X: j.X})
	}
	kern.MatVecs(b.pool, ms)
}

// groupUnit is the row granularity of GroupedLinear's split at batch 1 (a
// multiple of the FP8 block of 128 rows, so that the FP8 kernel keeps its
// four streams per block).
const groupUnit = 128

// GroupedLinear implements compute.Backend.
func (b *Backend) GroupedLinear(wt compute.Weight, y, x []float32, batch, groups int) {
	w := asWeight("GroupedLinear", wt)
	check("GroupedLinear", groups > 0 && w.d.Rows%groups == 0 && len(y) == batch*w.d.Rows && len(x) == batch*groups*w.d.Cols,
		"weight [%d, %d], batch %d, groups %d: len(y)=%d len(x)=%d", w.d.Rows, w.d.Cols, batch, groups, len(y), len(x))
	rg, cols := w.d.Rows/groups, w.d.Cols
	if w.k == nil {
		for g := range groups {
			b.linearRows(w, y, x, batch, g*rg, (g+1)*rg, groups*cols, g*cols)
		}
		return
	}
	if batch == 1 {
		// One fan-out for all groups (not one per group): units of
		// groupUnit rows, a chunk split where it crosses a group.
		units := (rg + groupUnit - 1) / groupUnit
		b.parallel(groups*units, groupUnit*cols, func(lo, hi int) {
			for u := lo; u < hi; {
				g := u / units
				ue := min(hi, (g+1)*units)
				r0 := g*rg + (u-g*units)*groupUnit
				r1 := g*rg + min(rg, (ue-g*units)*groupUnit)
				w.k.MatMulRows(nil, y[r0:r1], x[g*cols:(g+1)*cols], 1, r0, r1)
				u = ue
			}
		})
		return
	}
	xg := make([]float32, batch*cols)
	yg := make([]float32, batch*rg)
	for g := range groups {
		for bi := range batch {
			copy(xg[bi*cols:(bi+1)*cols], x[(bi*groups+g)*cols:])
		}
		w.k.MatMulRows(b.pool, yg, xg, batch, g*rg, (g+1)*rg)
		for bi := range batch {
			copy(y[bi*w.d.Rows+g*rg:bi*w.d.Rows+(g+1)*rg], yg[bi*rg:(bi+1)*rg])
		}
	}
}

// RMSNorm implements compute.Backend.
func (b *Backend) RMSNorm(y, x, w []float32, dim int, eps float32) {
	check("RMSNorm", dim > 0 && len(x)%dim == 0 && len(y) == len(x) && (w == nil || len(w) == dim),
		"dim %d, len(x)=%d len(y)=%d len(w)=%d", dim, len(x), len(y), len(w))
	for r := 0; r < len(x); r += dim {
		xr, yr := x[r:r+dim], y[r:r+dim]
		var ss float32
		for _, v := range xr {
			ss += v * v
		}
		inv := float32(1 / math.Sqrt(float64(ss/float32(dim)+eps)))
		if w == nil {
			for i, v := range xr {
				yr[i] = v * inv
			}
		} else {
			for i, v := range xr {
				yr[i] = w[i] * (v * inv)
			}
		}
	}
}

func sigmoid(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }

// hcProject computes m [batch, Fn.Rows()] = ρ·(Fn·x) for x [batch, HC·D].
func (b *Backend) hcProject(x []float32, p *compute.HCParams, batch int) []float32 {
	w := asWeight("HCMix", p.Fn)
	n := w.d.Cols
	check("HCMix", len(x) == batch*n, "len(x)=%d, want batch %d × %d", len(x), batch, n)
	m := make([]float32, batch*w.d.Rows)
	b.Linear(w, m, x, batch)
	for bi := range batch {
		var ss float32
		for _, v := range x[bi*n : (bi+1)*n] {
			ss += v * v
		}
		rho := float32(1 / math.Sqrt(float64(ss/float32(n)+p.NormEps)))
		for i := range w.d.Rows {
			m[bi*w.d.Rows+i] *= rho
		}
	}
	return m
}

// HCMix implements compute.Backend (Sinkhorn order: row softmax + eps, one
// column pass, then Iters−1 × (row, column); sums left to right, eps after each sum).
func (b *Backend) HCMix(pre, post, comb, x []float32, p *compute.HCParams, batch int) {
	hc := p.HC
	nm := (2 + hc) * hc
	check("HCMix", p.Fn.Rows() == nm && len(p.Base) == nm && len(p.Scale) == 3 &&
		len(pre) == batch*hc && len(post) == batch*hc && len(comb) == batch*hc*hc,
		"hc %d, fn rows %d, base %d, scale %d, pre %d, post %d, comb %d, batch %d",
		hc, p.Fn.Rows(), len(p.Base), len(p.Scale), len(pre), len(post), len(comb), batch)
	m := b.hcProject(x, p, batch)
	eps := p.Eps
	for bi := range batch {
		kern.ClearUpper() // scalar float code below; see ClearUpper
		mb := m[bi*nm : (bi+1)*nm]
		for j := range hc {
			pre[bi*hc+j] = sigmoid(mb[j]*p.Scale[0]+p.Base[j]) + eps
			post[bi*hc+j] = 2 * sigmoid(mb[hc+j]*p.Scale[1]+p.Base[hc+j])
		}
		c := comb[bi*hc*hc : (bi+1)*hc*hc]
		for j := range hc {
			row := c[j*hc : (j+1)*hc]
			mx := float32(math.Inf(-1))
			for k := range hc {
				row[k] = mb[2*hc+j*hc+k]*p.Scale[2] + p.Base[2*hc+j*hc+k]
				mx = max(mx, row[k])
			}
			var s float32
			for k := range hc {
				row[k] = float32(math.Exp(float64(row[k] - mx)))
				s += row[k]
			}
			for k := range hc {
				row[k] = row[k]/s + eps
			}
		}
		colNorm(c, hc, eps)
		for it := 1; it < p.Iters; it++ {
			for j := range hc {
				var s float32
				for k := range hc {
					s += c[j*hc+k]
				}
				for k := range hc {
					c[j*hc+k] /= s + eps
				}
			}
			colNorm(c, hc, eps)
		}
	}
}

func colNorm(c []float32, hc int, eps float32) {
	for k := range hc {
		var s float32
		for j := range hc {
			s += c[j*hc+k]
		}
		for j := range hc {
			c[j*hc+k] /= s + eps
		}
	}
}

// HCHeadPre implements compute.Backend.
func (b *Backend) HCHeadPre(pre, x []float32, p *compute.HCParams, batch int) {
	hc := p.HC
	check("HCHeadPre", p.Fn.Rows() == hc && len(p.Base) == hc && len(p.Scale) >= 1 && len(pre) == batch*hc,
		"hc %d, fn rows %d, base %d, scale %d, pre %d, batch %d", hc, p.Fn.Rows(), len(p.Base), len(p.Scale), len(pre), batch)
	m := b.hcProject(x, p, batch)
	for i := range pre {
		pre[i] = sigmoid(m[i]*p.Scale[0]+p.Base[i%hc]) + p.Eps
	}
}

// HCCollapse implements compute.Backend.
func (b *Backend) HCCollapse(y, x, pre []float32, hc, dim, batch int) {
	check("HCCollapse", len(y) == batch*dim && len(x) == batch*hc*dim && len(pre) == batch*hc,
		"hc %d dim %d batch %d: len(y)=%d len(x)=%d len(pre)=%d", hc, dim, batch, len(y), len(x), len(pre))
	for bi := range batch {
		yr := y[bi*dim : (bi+1)*dim]
		for i := range yr {
			var s float32
			for j := range hc {
				s += pre[bi*hc+j] * x[(bi*hc+j)*dim+i]
			}
			yr[i] = s
		}
	}
}

// HCExpand implements compute.Backend.
func (b *Backend) HCExpand(out, x, o, post, comb []float32, hc, dim, batch int) {
	check("HCExpand", len(out) == batch*hc*dim && len(x) == batch*hc*dim && len(o) == batch*dim &&
		len(post) == batch*hc && len(comb) == batch*hc*hc,
		"hc %d dim %d batch %d: len(out)=%d len(x)=%d len(o)=%d len(post)=%d len(comb)=%d",
		hc, dim, batch, len(out), len(x), len(o), len(post), len(comb))
	for bi := range batch {
		c := comb[bi*hc*hc:]
		for k := range hc {
			pk := post[bi*hc+k]
			dst := out[(bi*hc+k)*dim : (bi*hc+k+1)*dim]
			ob := o[bi*dim : (bi+1)*dim]
			for i := range dst {
				dst[i] = pk * ob[i]
			}
			for j := range hc {
				kern.AddScaled(dst, c[j*hc+k], x[(bi*hc+j)*dim:(bi*hc+j+1)*dim])
			}
		}
	}
}

// RoPE implements compute.Backend.
func (b *Backend) RoPE(x []float32, pos []int, freq []float32, rowLen, dim int, inverse bool) {
	r := 2 * len(freq)
	check("RoPE", dim > 0 && r <= dim && rowLen%dim == 0 && len(x) == len(pos)*rowLen,
		"len(x)=%d rows %d rowLen %d dim %d rope dims %d", len(x), len(pos), rowLen, dim, r)
	cs := make([]float32, 2*len(freq))
	for i, p := range pos {
		for f, th := range freq {
			ang := float64(float32(p) * th)
			if inverse {
				ang = -ang
			}
			cs[2*f], cs[2*f+1] = float32(math.Cos(ang)), float32(math.Sin(ang))
		}
		row := x[i*rowLen : (i+1)*rowLen]
		for s := 0; s < rowLen; s += dim {
			seg := row[s+dim-r : s+dim]
			for f := range freq {
				c, sn := cs[2*f], cs[2*f+1]
				re, im := seg[2*f], seg[2*f+1]
				seg[2*f] = re*c - im*sn
				seg[2*f+1] = re*sn + im*c
			}
		}
	}
}

// Attention implements compute.Backend; heads run in parallel.
func (b *Backend) Attention(o, q, kv, sinks []float32, nKeys, heads, dim int, scale float32) {
	check("Attention", len(o) == heads*dim && len(q) == heads*dim && len(kv) >= nKeys*dim && len(sinks) == heads,
		"heads %d dim %d keys %d: len(o)=%d len(q)=%d len(kv)=%d len(sinks)=%d", heads, dim, nKeys, len(o), len(q), len(kv), len(sinks))
	b.parallel(heads, nKeys*dim*2, func(lo, hi int) {
		s := make([]float32, nKeys)
		e := make([]float32, nKeys)
		for h := lo; h < hi; h++ {
			oh := o[h*dim : (h+1)*dim]
			clear(oh)
			if nKeys == 0 {
				continue
			}
			qh := q[h*dim : (h+1)*dim]
			mx := sinks[h]
			for i := range nKeys {
				s[i] = dot(qh, kv[i*dim:(i+1)*dim]) * scale
				mx = max(mx, s[i])
			}
			den := float32(math.Exp(float64(sinks[h] - mx)))
			for i := range nKeys {
				s[i] -= mx
			}
			kern.Exp(e, s)
			for i := range nKeys {
				den += e[i]
			}
			for i := range nKeys {
				e[i] /= den
			}
			kern.WeightedSum(oh, e, kv[:nKeys*dim])
		}
	})
}

// CompressPool implements compute.Backend.
func (b *Backend) CompressPool(out, kv, z []float32, slots, width int) {
	check("CompressPool", slots > 0 && len(out) == width && len(kv) == slots*width && len(z) == slots*width,
		"slots %d width %d: len(out)=%d len(kv)=%d len(z)=%d", slots, width, len(out), len(kv), len(z))
	for ch := range width {
		mx := float32(math.Inf(-1))
		for s := range slots {
			mx = max(mx, z[s*width+ch])
		}
		var den, num float32
		for s := range slots {
			e := float32(math.Exp(float64(z[s*width+ch] - mx)))
			den += e
			num += e * kv[s*width+ch]
		}
		out[ch] = num / den
	}
}

// IndexScores implements compute.Backend.
func (b *Backend) IndexScores(s, q, w, keys []float32, nKeys, heads, dim int) {
	check("IndexScores", len(s) == nKeys && len(q) == heads*dim && len(w) == heads && len(keys) >= nKeys*dim,
		"keys %d heads %d dim %d: len(s)=%d len(q)=%d len(w)=%d len(keys)=%d", nKeys, heads, dim, len(s), len(q), len(w), len(keys))
	b.parallel(nKeys, heads*dim, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			k := keys[i*dim : (i+1)*dim]
			var acc float32
			for h := range heads {
				if d := dot(q[h*dim:(h+1)*dim], k); d > 0 {
					acc += w[h] * d
				}
			}
			s[i] = acc
		}
	})
}

func softplus(x float32) float64 {
	if x > 20 { // torch's threshold
		return float64(x)
	}
	return math.Log1p(math.Exp(float64(x)))
}

// Route implements compute.Backend.
func (b *Backend) Route(ids []int, weights, logits, bias []float32, hash []int, scale float32) {
	k := len(ids)
	check("Route", len(weights) == k && k <= len(logits) && (bias == nil || len(bias) == len(logits)) && (hash == nil || len(hash) == k),
		"k %d: len(weights)=%d len(logits)=%d len(bias)=%d len(hash)=%d", k, len(weights), len(logits), len(bias), len(hash))
	p := make([]float32, len(logits))
	for e, g := range logits {
		p[e] = float32(math.Sqrt(softplus(g)))
	}
	if hash != nil {
		copy(ids, hash)
	} else {
		key := p
		if bias != nil {
			key = make([]float32, len(p))
			for e := range p {
				key[e] = p[e] + bias[e]
			}
		}
		copy(ids, compute.TopK(make([]int, 0, k), key, k))
	}
	var sum float32
	for _, e := range ids {
		sum += p[e]
	}
	for i, e := range ids {
		weights[i] = p[e] / sum * scale
	}
}

// SwiGLU implements compute.Backend.
func (b *Backend) SwiGLU(h, g, u, rowScale []float32, width int, limit float32) {
	check("SwiGLU", width > 0 && len(g)%width == 0 && len(u) == len(g) && len(h) == len(g) &&
		(rowScale == nil || len(rowScale) == len(g)/width),
		"width %d: len(h)=%d len(g)=%d len(u)=%d len(rowScale)=%d", width, len(h), len(g), len(u), len(rowScale))
	// Elementwise, so any split gives the same values; the exp dominates (~40
	// cost units per element against a matmul's 1 per weight).
	// The exponentials are taken 256 at a time with kern.Exp (vectorized
	// where the build has SIMD); g·sigmoid(g) = g / (1 + e^-g).
	b.parallel(len(g), 40, func(lo, hi int) {
		var gc, ng, e [256]float32
		for c0 := lo; c0 < hi; c0 += len(gc) {
			n := min(len(gc), hi-c0)
			for j := range n {
				gi := g[c0+j]
				if limit > 0 {
					gi = min(gi, limit)
				}
				gc[j], ng[j] = gi, -gi
			}
			kern.Exp(e[:n], ng[:n])
			for j := range n {
				i := c0 + j
				ui := u[i]
				if limit > 0 {
					ui = max(min(ui, limit), -limit)
				}
				v := gc[j] / (1 + e[j]) * ui
				if rowScale != nil {
					v *= rowScale[i/width]
				}
				h[i] = v
			}
		}
	})
}
