package dsv4

import (
	"encoding/binary"
	"fmt"
	"math"
	"sort"
	"strings"

	"moxie/compute"
	"moxie/compute/ref"
	"moxie/dsv4/config"
	"moxie/format"
)

// refModel is an independent float64 forward pass for tests: no caches, every
// position recomputed from all earlier tokens, weights dequantized with the
// float64 reference decoder. Slow; tiny configs only.
type refModel struct {
	cfg *config.Config
	src *memSource
	mem map[string][]float64
}

func newRefModel(src *memSource) *refModel {
	return &refModel{cfg: src.cfg, src: src, mem: map[string][]float64{}}
}

// mat returns a dequantized 2-D weight [rows, cols].
func (r *refModel) mat(name string) []float64 {
	if m, ok := r.mem[name]; ok {
		return m
	}
	info, _ := r.src.Lookup(name)
	d := compute.WeightData{Rows: int(info.Shape[0]), Cols: int(info.Shape[1]), Data: r.src.data[name], Block: r.cfg.BlockSize}
	sc := r.src.data[strings.TrimSuffix(name, ".weight")+".scale"]
	switch info.DType {
	case format.BF16:
		d.Format = compute.BF16
	case format.F32:
		d.Format = compute.F32
	case format.F8E4M3:
		d.Format, d.Scale = compute.FP8Block, sc
		if r.cfg.DenseFormat == "mxfp8" {
			d.Format = compute.MXFP8
		}
	case format.I8:
		d.Format, d.Scale, d.Cols = compute.MXFP4, sc, d.Cols*2
	}
	m := ref.Dequant(d)
	r.mem[name] = m
	return m
}

func (r *refModel) vec(name string) []float64 {
	if m, ok := r.mem[name]; ok {
		return m
	}
	info, _ := r.src.Lookup(name)
	d := r.src.data[name]
	out := make([]float64, info.Elements())
	for i := range out {
		if info.DType == format.BF16 {
			out[i] = float64(format.BF16ToFloat32(binary.LittleEndian.Uint16(d[2*i:])))
		} else {
			out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(d[4*i:])))
		}
	}
	r.mem[name] = out
	return out
}

func (r *refModel) linear(name string, x []float64) []float64 {
	m := r.mat(name)
	cols := len(x)
	return ref.Linear(m, len(m)/cols, cols, x, 1)
}

func rms(x, w []float64, eps float64) []float64 { return ref.RMSNorm(x, w, len(x), eps) }

// forward returns logits [T][V] for every position.
func (r *refModel) forward(tokens []int) [][]float64 {
	c := r.cfg
	T, D, hc := len(tokens), c.Dim, c.HCMult
	X := make([][]float64, T)
	emb := r.mat("embed.weight")
	for t, tok := range tokens {
		X[t] = make([]float64, hc*D)
		for j := range hc {
			copy(X[t][j*D:], emb[tok*D:(tok+1)*D])
		}
	}
	for l := range c.NLayers {
		p := fmt.Sprintf("layers.%d.", l)
		pres, posts, combs := make([][]float64, T), make([][]float64, T), make([][]float64, T)
		a := make([][]float64, T)
		for t := range T {
			pres[t], posts[t], combs[t] = ref.HCMix(X[t], r.mat(p+"hc_attn_fn"), r.vec(p+"hc_attn_base"), r.vec(p+"hc_attn_scale"), hc, c.HCSinkhornIters, c.HCEps, c.NormEps)
			a[t] = rms(ref.HCCollapse(X[t], pres[t], hc, D), r.vec(p+"attn_norm.weight"), c.NormEps)
		}
		o := r.attention(l, p+"attn.", a)
		for t := range T {
			X[t] = ref.HCExpand(X[t], o[t], posts[t], combs[t], hc, D)
			pre, post, comb := ref.HCMix(X[t], r.mat(p+"hc_ffn_fn"), r.vec(p+"hc_ffn_base"), r.vec(p+"hc_ffn_scale"), hc, c.HCSinkhornIters, c.HCEps, c.NormEps)
			f := rms(ref.HCCollapse(X[t], pre, hc, D), r.vec(p+"ffn_norm.weight"), c.NormEps)
			X[t] = ref.HCExpand(X[t], r.moe(l, p+"ffn.", f, tokens[t]), post, comb, hc, D)
		}
	}
	out := make([][]float64, T)
	for t := range T {
		pre := ref.HCHeadPre(X[t], r.mat("hc_head_fn"), r.vec("hc_head_base"), r.vec("hc_head_scale"), hc, c.HCEps, c.NormEps)
		y := rms(ref.HCCollapse(X[t], pre, hc, D), r.vec("norm.weight"), c.NormEps)
		out[t] = r.linear("head.weight", y)
	}
	return out
}

// entries computes every compressed entry that tokens 0..T-1 close, for the
// compressor under prefix with output width dw.
func (r *refModel) entries(prefix string, a [][]float64, ratio, dw int, freq []float32) [][]float64 {
	c := r.cfg
	csa := ratio == config.CSARatio
	w := dw
	if csa {
		w = 2 * dw
	}
	ape := r.vec(prefix + "ape")
	kv := make([][]float64, len(a))
	z := make([][]float64, len(a))
	for t := range a {
		kv[t] = r.linear(prefix+"wkv.weight", a[t])
		z[t] = r.linear(prefix+"wgate.weight", a[t])
		for i := range z[t] {
			z[t][i] += ape[(t%ratio)*w+i]
		}
	}
	var out [][]float64
	for e := 0; (e+1)*ratio <= len(a); e++ {
		var skv, sz []float64
		add := func(t, off int) {
			skv = append(skv, kv[t][off:off+dw]...)
			sz = append(sz, z[t][off:off+dw]...)
		}
		if csa {
			if e > 0 {
				for t := (e - 1) * ratio; t < e*ratio; t++ {
					add(t, 0) // A half of the previous window
				}
			}
			for t := e * ratio; t < (e+1)*ratio; t++ {
				add(t, dw) // B half of this window
			}
		} else {
			for t := e * ratio; t < (e+1)*ratio; t++ {
				add(t, 0)
			}
		}
		ent := ref.CompressPool(skv, sz, len(skv)/dw, dw)
		ent = rms(ent, r.vec(prefix+"norm.weight"), c.NormEps)
		out = append(out, ref.RoPE(ent, e*ratio, freq, dw, false))
	}
	return out
}

func (r *refModel) attention(l int, p string, a [][]float64) [][]float64 {
	c := r.cfg
	T, H, hd := len(a), c.NHeads, c.HeadDim
	ratio := c.Ratio(l)
	freq := compute.RopeFreqs(c.RopeTheta, c.RopeHeadDim, nil)
	if ratio > 0 {
		freq = compute.RopeFreqs(c.CompressRopeTheta, c.RopeHeadDim, &compute.YaRN{Factor: c.RopeFactor, OriginalSeqLen: c.OriginalSeqLen, BetaFast: c.BetaFast, BetaSlow: c.BetaSlow})
	}
	kv := make([][]float64, T)
	for t := range T {
		kv[t] = ref.RoPE(rms(r.linear(p+"wkv.weight", a[t]), r.vec(p+"kv_norm.weight"), c.NormEps), t, freq, hd, false)
	}
	var comp, ikeys [][]float64
	if ratio > 0 {
		comp = r.entries(p+"compressor.", a, ratio, hd, freq)
	}
	if c.Kind(l) == config.CSA {
		ikeys = r.entries(p+"indexer.compressor.", a, ratio, c.IndexHeadDim, freq)
	}
	sinks := r.vec(p + "attn_sink")
	out := make([][]float64, T)
	for t := range T {
		qlat := rms(r.linear(p+"wq_a.weight", a[t]), r.vec(p+"q_norm.weight"), c.NormEps)
		q := ref.RMSNorm(r.linear(p+"wq_b.weight", qlat), nil, hd, c.NormEps)
		q = ref.RoPE(q, t, freq, hd, false)
		var keys []float64
		for s := max(0, t-c.Window+1); s <= t; s++ {
			keys = append(keys, kv[s]...)
		}
		n := 0
		if ratio > 0 {
			n = (t + 1) / ratio
		}
		switch c.Kind(l) {
		case config.HCA:
			for e := range n {
				keys = append(keys, comp[e]...)
			}
		case config.CSA:
			IH, ID := c.IndexNHeads, c.IndexHeadDim
			qi := ref.RoPE(r.linear(p+"indexer.wq_b.weight", qlat), t, freq, ID, false)
			wts := r.linear(p+"indexer.weights_proj.weight", a[t])
			for h := range wts {
				wts[h] *= 1 / math.Sqrt(float64(ID)) / math.Sqrt(float64(IH))
			}
			var flat []float64
			for e := range n {
				flat = append(flat, ikeys[e]...)
			}
			sc := ref.IndexScores(qi, wts, flat, n, IH, ID)
			order := make([]int, n)
			for i := range order {
				order[i] = i
			}
			sort.SliceStable(order, func(i, j int) bool { return sc[order[i]] > sc[order[j]] })
			for _, e := range order[:min(n, c.IndexTopK)] {
				keys = append(keys, comp[e]...)
			}
		}
		o := ref.Attention(q, keys, sinks, len(keys)/hd, H, hd, 1/math.Sqrt(float64(hd)))
		o = ref.RoPE(o, t, freq, hd, true)
		woA := r.mat(p + "wo_a.weight")
		u := ref.GroupedLinear(woA, c.OGroups*c.OLoraRank, H*hd/c.OGroups, o, 1, c.OGroups)
		out[t] = r.linear(p+"wo_b.weight", u)
	}
	return out
}

func (r *refModel) moe(l int, p string, f []float64, tok int) []float64 {
	c := r.cfg
	logits := r.linear(p+"gate.weight", f)
	var hash []int
	var bias []float64
	K := c.NActivatedExperts
	if c.HashRouted(l) {
		d := r.src.data[p+"gate.tid2eid"]
		for k := range K {
			hash = append(hash, int(binary.LittleEndian.Uint64(d[8*(tok*K+k):])))
		}
	} else {
		bias = r.vec(p + "gate.bias")
	}
	ids, wts := ref.Route(logits, bias, hash, K, c.RouteScale)
	out := make([]float64, c.Dim)
	swiglu := func(ep string, scale, limit float64) {
		g := r.linear(ep+"w1.weight", f)
		u := r.linear(ep+"w3.weight", f)
		y := r.linear(ep+"w2.weight", ref.SwiGLU(g, u, scale, limit))
		for i := range out {
			out[i] += y[i]
		}
	}
	for k, e := range ids {
		swiglu(fmt.Sprintf("%sexperts.%d.", p, e), wts[k], c.SwigluLimit)
	}
	if c.NSharedExperts > 0 {
		swiglu(p+"shared_experts.", 1, 0)
	}
	return out
}
