// Package ref is the float64 reference of every compute operation: simple,
// obviously-correct loops, written independently of the backends, used by the
// compliance suite (compute/computetest) as the expected value. It is slow on
// purpose; never use it on real model sizes.
package ref

import (
	"encoding/binary"
	"math"
	"sort"

	"moxie/compute"
	"moxie/format"
)

// Dequant returns the weight as a float64 row-major [Rows, Cols] matrix,
// decoding element by element with the scalar codecs of package format.
func Dequant(w compute.WeightData) []float64 {
	out := make([]float64, w.Rows*w.Cols)
	for r := 0; r < w.Rows; r++ {
		for c := 0; c < w.Cols; c++ {
			var v float64
			switch w.Format {
			case compute.FP8Block:
				nb := (w.Cols + w.Block - 1) / w.Block
				s := float64(format.E8M0ToFloat32(w.Scale[(r/w.Block)*nb+c/w.Block]))
				v = float64(format.E4M3ToFloat32(w.Data[r*w.Cols+c])) * s
			case compute.MXFP8:
				s := float64(format.E8M0ToFloat32(w.Scale[r*((w.Cols+31)/32)+c/32]))
				v = float64(format.E4M3ToFloat32(w.Data[r*w.Cols+c])) * s
			case compute.MXFP4:
				b := w.Data[r*(w.Cols/2)+c/2]
				code := b & 15
				if c%2 == 1 {
					code = b >> 4
				}
				ns := (w.Cols + 31) / 32
				s := float64(format.E8M0ToFloat32(w.Scale[r*ns+c/32]))
				v = float64(format.E2M1ToFloat32(code)) * s
			case compute.BF16:
				v = float64(format.BF16ToFloat32(binary.LittleEndian.Uint16(w.Data[2*(r*w.Cols+c):])))
			case compute.F32:
				v = float64(math.Float32frombits(binary.LittleEndian.Uint32(w.Data[4*(r*w.Cols+c):])))
			}
			out[r*w.Cols+c] = v
		}
	}
	return out
}

// Linear: y[b, r] = Σ_c W[r, c] x[b, c]; W is [rows, cols].
func Linear(W []float64, rows, cols int, x []float64, batch int) []float64 {
	y := make([]float64, batch*rows)
	for b := 0; b < batch; b++ {
		for r := 0; r < rows; r++ {
			s := 0.0
			for c := 0; c < cols; c++ {
				s += W[r*cols+c] * x[b*cols+c]
			}
			y[b*rows+r] = s
		}
	}
	return y
}

// GroupedLinear: group g uses rows [g·rows/G, (g+1)·rows/G) of W and columns
// [g·cols, (g+1)·cols) of each x row.
func GroupedLinear(W []float64, rows, cols int, x []float64, batch, groups int) []float64 {
	y := make([]float64, batch*rows)
	rg := rows / groups
	for b := 0; b < batch; b++ {
		for r := 0; r < rows; r++ {
			g := r / rg
			s := 0.0
			for c := 0; c < cols; c++ {
				s += W[r*cols+c] * x[b*groups*cols+g*cols+c]
			}
			y[b*rows+r] = s
		}
	}
	return y
}

// RMSNorm over rows of width dim; w nil = unweighted.
func RMSNorm(x, w []float64, dim int, eps float64) []float64 {
	y := make([]float64, len(x))
	for r := 0; r*dim < len(x); r++ {
		ss := 0.0
		for _, v := range x[r*dim : (r+1)*dim] {
			ss += v * v
		}
		inv := 1 / math.Sqrt(ss/float64(dim)+eps)
		for i := 0; i < dim; i++ {
			v := x[r*dim+i] * inv
			if w != nil {
				v *= w[i]
			}
			y[r*dim+i] = v
		}
	}
	return y
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// HCMix for one token: x [hc·D] flattened streams, fn [(2+hc)·hc, hc·D].
// Returns pre [hc], post [hc], comb [hc·hc] (index [j·hc + k]).
func HCMix(x, fn, base, scale []float64, hc, iters int, eps, normEps float64) (pre, post, comb []float64) {
	n := len(x)
	ss := 0.0
	for _, v := range x {
		ss += v * v
	}
	rho := 1 / math.Sqrt(ss/float64(n)+normEps)
	m := make([]float64, (2+hc)*hc)
	for i := range m {
		s := 0.0
		for c := 0; c < n; c++ {
			s += fn[i*n+c] * x[c]
		}
		m[i] = s * rho
	}
	pre = make([]float64, hc)
	post = make([]float64, hc)
	for j := 0; j < hc; j++ {
		pre[j] = sigmoid(m[j]*scale[0]+base[j]) + eps
		post[j] = 2 * sigmoid(m[hc+j]*scale[1]+base[hc+j])
	}
	comb = make([]float64, hc*hc)
	for j := 0; j < hc; j++ {
		mx := math.Inf(-1)
		for k := 0; k < hc; k++ {
			l := m[2*hc+j*hc+k]*scale[2] + base[2*hc+j*hc+k]
			comb[j*hc+k] = l
			mx = math.Max(mx, l)
		}
		s := 0.0
		for k := 0; k < hc; k++ {
			comb[j*hc+k] = math.Exp(comb[j*hc+k] - mx)
			s += comb[j*hc+k]
		}
		for k := 0; k < hc; k++ {
			comb[j*hc+k] = comb[j*hc+k]/s + eps
		}
	}
	colNorm := func() {
		for k := 0; k < hc; k++ {
			s := 0.0
			for j := 0; j < hc; j++ {
				s += comb[j*hc+k]
			}
			for j := 0; j < hc; j++ {
				comb[j*hc+k] /= s + eps
			}
		}
	}
	rowNorm := func() {
		for j := 0; j < hc; j++ {
			s := 0.0
			for k := 0; k < hc; k++ {
				s += comb[j*hc+k]
			}
			for k := 0; k < hc; k++ {
				comb[j*hc+k] /= s + eps
			}
		}
	}
	colNorm()
	for it := 1; it < iters; it++ {
		rowNorm()
		colNorm()
	}
	return pre, post, comb
}

// HCHeadPre for one token: fn [hc, hc·D]; pre[j] = sigmoid(ρ(fn·x)_j·scale[0] + base[j]) + eps.
func HCHeadPre(x, fn, base, scale []float64, hc int, eps, normEps float64) []float64 {
	n := len(x)
	ss := 0.0
	for _, v := range x {
		ss += v * v
	}
	rho := 1 / math.Sqrt(ss/float64(n)+normEps)
	pre := make([]float64, hc)
	for j := range pre {
		s := 0.0
		for c := 0; c < n; c++ {
			s += fn[j*n+c] * x[c]
		}
		pre[j] = sigmoid(s*rho*scale[0]+base[j]) + eps
	}
	return pre
}

// HCCollapse for one token: y = Σ_j pre[j] x[j], x [hc, dim].
func HCCollapse(x, pre []float64, hc, dim int) []float64 {
	y := make([]float64, dim)
	for j := 0; j < hc; j++ {
		for i := 0; i < dim; i++ {
			y[i] += pre[j] * x[j*dim+i]
		}
	}
	return y
}

// HCExpand for one token: out[k] = post[k] o + Σ_j comb[j, k] x[j].
func HCExpand(x, o, post, comb []float64, hc, dim int) []float64 {
	out := make([]float64, hc*dim)
	for k := 0; k < hc; k++ {
		for i := 0; i < dim; i++ {
			s := post[k] * o[i]
			for j := 0; j < hc; j++ {
				s += comb[j*hc+k] * x[j*dim+i]
			}
			out[k*dim+i] = s
		}
	}
	return out
}

// RoPE rotates the last 2·len(freq) dims of every dim-wide segment of one row
// by angle pos·freq[p] (negated if inverse), as complex multiplication on
// (even, odd) pairs. The angle is formed in float32 like the backends do.
func RoPE(row []float64, pos int, freq []float32, dim int, inverse bool) []float64 {
	out := append([]float64(nil), row...)
	r := 2 * len(freq)
	for s := 0; s+dim <= len(row); s += dim {
		for p := range freq {
			ang := float64(float32(pos) * freq[p])
			if inverse {
				ang = -ang
			}
			c, sn := math.Cos(ang), math.Sin(ang)
			i := s + dim - r + 2*p
			re, im := row[i], row[i+1]
			out[i] = re*c - im*sn
			out[i+1] = re*sn + im*c
		}
	}
	return out
}

// Attention for one query: see compute.Backend.Attention.
func Attention(q, kv, sinks []float64, nKeys, heads, dim int, scale float64) []float64 {
	o := make([]float64, heads*dim)
	if nKeys == 0 {
		return o
	}
	for h := 0; h < heads; h++ {
		s := make([]float64, nKeys)
		mx := math.Inf(-1)
		for i := range s {
			d := 0.0
			for c := 0; c < dim; c++ {
				d += q[h*dim+c] * kv[i*dim+c]
			}
			s[i] = d * scale
			mx = math.Max(mx, s[i])
		}
		den := math.Exp(sinks[h] - mx)
		for i := range s {
			s[i] = math.Exp(s[i] - mx)
			den += s[i]
		}
		for i := range s {
			for c := 0; c < dim; c++ {
				o[h*dim+c] += s[i] / den * kv[i*dim+c]
			}
		}
	}
	return o
}

// CompressPool: per-channel softmax over slots of z, weighting kv.
func CompressPool(kv, z []float64, slots, width int) []float64 {
	out := make([]float64, width)
	for ch := 0; ch < width; ch++ {
		mx := math.Inf(-1)
		for s := 0; s < slots; s++ {
			mx = math.Max(mx, z[s*width+ch])
		}
		den, num := 0.0, 0.0
		for s := 0; s < slots; s++ {
			e := math.Exp(z[s*width+ch] - mx)
			den += e
			num += e * kv[s*width+ch]
		}
		out[ch] = num / den
	}
	return out
}

// IndexScores: s[i] = Σ_h w[h] ReLU(q[h]·keys[i]).
func IndexScores(q, w, keys []float64, nKeys, heads, dim int) []float64 {
	s := make([]float64, nKeys)
	for i := range s {
		for h := 0; h < heads; h++ {
			d := 0.0
			for c := 0; c < dim; c++ {
				d += q[h*dim+c] * keys[i*dim+c]
			}
			s[i] += w[h] * math.Max(d, 0)
		}
	}
	return s
}

// Route: see compute.Backend.Route. k experts.
func Route(logits, bias []float64, hash []int, k int, scale float64) (ids []int, weights []float64) {
	p := make([]float64, len(logits))
	for e, g := range logits {
		sp := math.Log1p(math.Exp(g))
		if g > 30 {
			sp = g
		}
		p[e] = math.Sqrt(sp)
	}
	if hash != nil {
		ids = append([]int(nil), hash...)
	} else {
		order := make([]int, len(p))
		for i := range order {
			order[i] = i
		}
		key := func(e int) float64 {
			if bias != nil {
				return p[e] + bias[e]
			}
			return p[e]
		}
		sort.SliceStable(order, func(a, b int) bool { return key(order[a]) > key(order[b]) })
		ids = order[:k]
	}
	sum := 0.0
	for _, e := range ids {
		sum += p[e]
	}
	weights = make([]float64, len(ids))
	for i, e := range ids {
		weights[i] = p[e] / sum * scale
	}
	return ids, weights
}

// SwiGLU for one row: h = silu(g)·u·rowScale with the optional clamp.
func SwiGLU(g, u []float64, rowScale, limit float64) []float64 {
	h := make([]float64, len(g))
	for i := range g {
		gi, ui := g[i], u[i]
		if limit > 0 {
			gi = math.Min(gi, limit)
			ui = math.Max(math.Min(ui, limit), -limit)
		}
		h[i] = gi / (1 + math.Exp(-gi)) * ui * rowScale
	}
	return h
}
