// Package compute is moxie's backend seam: a small, model-shaped set of
// operations that the DeepSeek-V4 forward pass (package dsv4) is written in.
// Each operation maps to one (possibly fused) kernel on a backend. compute/cpu
// implements it on the host; compute/ref is the float64 reference every backend
// is checked against by compute/computetest.
//
// Memory contract, for every operation: all slices are host float32 memory
// owned by the caller; outputs are fully overwritten (unless an op says it
// accumulates); inputs are only read; an output may not alias an input unless
// the op says so. Shapes are row-major. A length that does not match the stated
// shape is a programmer error and panics with a message naming the op.
package compute

import (
	"fmt"
	"math"
)

// Format is the stored element format of a weight matrix.
type Format int

const (
	// FP8Block: FP8 E4M3fn bytes [Rows, Cols] with one E8M0 scale byte per
	// Block×Block tile, Scale [ceil(Rows/Block), ceil(Cols/Block)].
	FP8Block Format = iota + 1
	// MXFP4: E2M1 codes packed two per byte (low nibble = even column),
	// Data [Rows, Cols/2], one E8M0 scale per 32 columns, Scale [Rows, ceil(Cols/32)].
	MXFP4
	// BF16: little-endian bfloat16 [Rows, Cols]; Scale unused.
	BF16
	// F32: little-endian float32 [Rows, Cols]; Scale unused.
	F32
	// MXFP8: FP8 E4M3fn bytes [Rows, Cols] with one E8M0 scale per 32 columns of
	// a row, Scale [Rows, ceil(Cols/32)] (a moxie repack of FP8Block).
	MXFP8
)

func (f Format) String() string {
	switch f {
	case FP8Block:
		return "fp8-block"
	case MXFP4:
		return "mxfp4"
	case BF16:
		return "bf16"
	case F32:
		return "f32"
	case MXFP8:
		return "mxfp8"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// WeightData is a weight matrix in its stored form: views of checkpoint bytes.
// The bytes are read-only and must stay valid while any Weight bound from them
// is in use.
type WeightData struct {
	Format     Format
	Rows, Cols int
	Data       []byte
	Scale      []byte // FP8Block, MXFP8 and MXFP4 only
	Block      int    // FP8Block tile edge (128 for V4-Flash)
}

// Validate checks that the byte lengths match the format and shape.
func (w WeightData) Validate() error {
	data, scale, err := StoredSizes(w.Format, w.Rows, w.Cols, w.Block)
	if err != nil {
		return err
	}
	if len(w.Data) != data {
		return fmt.Errorf("%s weight [%d, %d] has %d data bytes, want %d", w.Format, w.Rows, w.Cols, len(w.Data), data)
	}
	if len(w.Scale) != scale {
		return fmt.Errorf("%s weight [%d, %d] has %d scale bytes, want %d", w.Format, w.Rows, w.Cols, len(w.Scale), scale)
	}
	return nil
}

// StoredSizes returns the data and scale bytes of a [rows, cols] weight of
// format f (block: the FP8Block tile edge), or an error naming what does not
// fit the format.
func StoredSizes(f Format, rows, cols, block int) (data, scale int, err error) {
	if rows <= 0 || cols <= 0 {
		return 0, 0, fmt.Errorf("%s weight has shape [%d, %d], want positive", f, rows, cols)
	}
	switch f {
	case FP8Block:
		if block <= 0 {
			return 0, 0, fmt.Errorf("fp8-block weight has block %d, want > 0", block)
		}
		return rows * cols, ceilDiv(rows, block) * ceilDiv(cols, block), nil
	case MXFP4:
		if cols%2 != 0 {
			return 0, 0, fmt.Errorf("mxfp4 weight has %d columns, want an even number", cols)
		}
		return rows * cols / 2, rows * ceilDiv(cols, 32), nil
	case MXFP8:
		return rows * cols, rows * ceilDiv(cols, 32), nil
	case BF16:
		return 2 * rows * cols, 0, nil
	case F32:
		return 4 * rows * cols, 0, nil
	}
	return 0, 0, fmt.Errorf("unknown weight format %d", int(f))
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// Weight is a weight matrix bound to a backend (for the CPU backend, a view of
// the stored bytes; for a device backend, a device-resident copy).
type Weight interface {
	Rows() int
	Cols() int
}

// HCParams are the parameters of one hyper-connection mixing site
// (dsv4-flash.md §4.3). Fn is [(2+HC)·HC, HC·D] for a full mix, or [HC, HC·D]
// for the head collapse; Base has Fn.Rows() entries; Scale has 3 (mix) or 1 (head).
type HCParams struct {
	Fn          Weight
	Base, Scale []float32
	HC          int     // number of streams
	Iters       int     // Sinkhorn iterations (20 in V4-Flash)
	Eps         float32 // hc_eps
	NormEps     float32 // rms eps of the flattened streams
}

// LinearJob is one product of ManyLinear.LinearMany: Y = W·X for one row
// (Y is [Rows], X is [Cols]).
type LinearJob struct {
	W    Weight
	Y, X []float32
}

// ManyLinear is implemented by backends that run several batch-1 products
// at once (a token's expert matrices) in one parallel split rather than
// one each. Every product's result is Linear's, bit for bit; the Ys must
// not overlap each other or any X.
type ManyLinear interface {
	LinearMany(jobs []LinearJob)
}

// Backend is the set of operations the forward pass needs. Implementations are
// safe for use by one goroutine at a time (a backend may parallelise inside an op).
type Backend interface {
	Name() string

	// Bind prepares a stored weight for use by this backend; errors name the
	// mismatch (see WeightData.Validate).
	Bind(w WeightData) (Weight, error)

	// Linear: y[b, r] = Σ_c W[r, c] · x[b, c] for b < batch.
	// y is [batch, Rows], x is [batch, Cols].
	Linear(w Weight, y, x []float32, batch int)
	// GroupedLinear splits W's rows into `groups` equal blocks and x's rows into
	// `groups` equal segments of Cols: y[b, g·R/G + r] = Σ_c W[g·R/G + r, c] · x[b, g·Cols + c].
	// y is [batch, Rows], x is [batch, groups·Cols].
	GroupedLinear(w Weight, y, x []float32, batch, groups int)

	// RMSNorm: for every row of width dim, y = w ⊙ x / sqrt(mean(x²) + eps);
	// w == nil means unweighted. y may alias x.
	RMSNorm(y, x, w []float32, dim int, eps float32)

	// HCMix computes the hyper-connection coefficients of `batch` tokens from the
	// streams x [batch, HC, D]: pre [batch, HC], post [batch, HC] and the
	// Sinkhorn-normalised comb [batch, HC, HC] (index [source j, destination k]),
	// in the exact order of dsv4-flash.md §4.3 / algorithms.md §6.
	HCMix(pre, post, comb, x []float32, p *HCParams, batch int)
	// HCHeadPre computes only pre [batch, HC] = sigmoid(m·scale[0] + base) + eps
	// (the final head collapse: no post, no comb, no Sinkhorn).
	HCHeadPre(pre, x []float32, p *HCParams, batch int)
	// HCCollapse: y[b] = Σ_j pre[b, j] · x[b, j] with x [batch, hc, dim], y [batch, dim].
	HCCollapse(y, x, pre []float32, hc, dim, batch int)
	// HCExpand: out[b, k] = post[b, k] · o[b] + Σ_j comb[b, j, k] · x[b, j];
	// out and x are [batch, hc, dim], o is [batch, dim]. out may not alias x.
	HCExpand(out, x, o, post, comb []float32, hc, dim, batch int)

	// RoPE rotates, in place, interleaved pairs (even = real, odd = imaginary) of
	// the last 2·len(freq) dims of every dim-wide segment of x. x has len(pos)
	// rows of rowLen values (rowLen a multiple of dim); row i is rotated by angle
	// float32(pos[i])·freq[p] (computed in float32), or by its negative if inverse.
	RoPE(x []float32, pos []int, freq []float32, rowLen, dim int, inverse bool)

	// Attention for one query token: q [heads, dim], kv [nKeys, dim] (K = V),
	// sinks [heads]; o[h] = Σ_i e^(s_i−M) kv_i / (Σ_i e^(s_i−M) + e^(sink_h−M)),
	// s_i = scale · q_h·kv_i, M = max(max_i s_i, sink_h). nKeys == 0 gives o = 0.
	Attention(o, q, kv, sinks []float32, nKeys, heads, dim int, scale float32)

	// CompressPool: out[ch] = Σ_s softmax_s(z[s, ch]) · kv[s, ch], a per-channel
	// softmax over `slots` rows of kv and z [slots, width].
	CompressPool(out, kv, z []float32, slots, width int)

	// IndexScores: s[i] = Σ_h w[h] · ReLU(q[h]·keys[i]) for q [heads, dim],
	// w [heads], keys [nKeys, dim], s [nKeys].
	IndexScores(s, q, w, keys []float32, nKeys, heads, dim int)

	// Route turns router logits [E] into len(ids) experts and weights:
	// p_e = sqrt(softplus(logit_e)); if hash != nil the experts are hash (a
	// token's tid2eid row), otherwise the len(ids) largest p_e + bias[e] (bias
	// may be nil; ties go to the lower expert index); weights[k] = p_{ids[k]} /
	// Σ_k' p_{ids[k']} · scale (no epsilon). ids and weights have the same length.
	Route(ids []int, weights, logits, bias []float32, hash []int, scale float32)

	// SwiGLU: h[b, i] = silu(g[b, i]) · u[b, i] · rowScale[b] over rows of width.
	// If limit > 0, u is first clamped to [−limit, limit] and g to (−∞, limit]
	// (routed experts); limit == 0 means no clamp (the V4 shared expert).
	// rowScale == nil means 1. h may alias g or u.
	SwiGLU(h, g, u, rowScale []float32, width int, limit float32)
}

// TopK returns the indices of the k largest scores (k is clamped to
// len(scores)), ordered by descending score; ties go to the LOWER index first.
// NaN scores rank below every number. This is the deterministic tie-break of the
// indexer's top-k (design.md §6). dst is reused if it has the capacity.
func TopK(dst []int, scores []float32, k int) []int {
	k = min(k, len(scores))
	dst = dst[:0]
	if k <= 0 {
		return dst
	}
	less := func(a, b int) bool { // a ranks after b
		sa, sb := scores[a], scores[b]
		na, nb := sa != sa, sb != sb
		switch {
		case na != nb:
			return na
		case na && nb:
			return a > b
		case sa != sb:
			return sa < sb
		}
		return a > b
	}
	// Insertion into a sorted list of k: O(n·k) worst case, fine for the
	// sizes here; a heap would be O(n log k).
	if k*4 >= len(scores) || k <= 64 {
		for i := range scores {
			if len(dst) == k && !less(dst[k-1], i) {
				continue
			}
			if len(dst) < k {
				dst = append(dst, i)
			} else {
				dst[k-1] = i
			}
			for j := len(dst) - 1; j > 0 && less(dst[j-1], dst[j]); j-- {
				dst[j-1], dst[j] = dst[j], dst[j-1]
			}
		}
		return dst
	}
	// Heap of k with the worst at the root.
	h := dst
	down := func(i int) {
		for {
			l := 2*i + 1
			if l >= len(h) {
				return
			}
			w := l
			if r := l + 1; r < len(h) && less(h[r], h[l]) {
				w = r
			}
			if !less(h[w], h[i]) {
				return
			}
			h[i], h[w] = h[w], h[i]
			i = w
		}
	}
	for i := range scores {
		if len(h) < k {
			h = append(h, i)
			for j := len(h) - 1; j > 0; {
				p := (j - 1) / 2
				if !less(h[j], h[p]) {
					break
				}
				h[j], h[p] = h[p], h[j]
				j = p
			}
			continue
		}
		if less(h[0], i) {
			h[0] = i
			down(0)
		}
	}
	// Heap sort: pop worst to the end.
	for n := len(h) - 1; n > 0; n-- {
		h[0], h[n] = h[n], h[0]
		hh := h[:n]
		i := 0
		for {
			l := 2*i + 1
			if l >= len(hh) {
				break
			}
			w := l
			if r := l + 1; r < len(hh) && less(hh[r], hh[l]) {
				w = r
			}
			if !less(hh[w], hh[i]) {
				break
			}
			hh[i], hh[w] = hh[w], hh[i]
			i = w
		}
	}
	return h
}

// YaRN holds the YaRN frequency-scaling parameters (dsv4-flash.md §4.6).
type YaRN struct {
	Factor             float64
	OriginalSeqLen     int
	BetaFast, BetaSlow float64
}

// YaRNRange returns the correction range [lo, hi] in pair indices for a rotary
// width of dim dims: lo = max(floor(d(betaFast)), 0), hi = min(ceil(d(betaSlow)), dim−1),
// d(r) = dim·ln(orig/(2π r)) / (2 ln base).
func YaRNRange(base float64, dim int, y YaRN) (lo, hi int) {
	d := func(r float64) float64 {
		return float64(dim) * math.Log(float64(y.OriginalSeqLen)/(2*math.Pi*r)) / (2 * math.Log(base))
	}
	lo = max(int(math.Floor(d(y.BetaFast))), 0)
	hi = min(int(math.Ceil(d(y.BetaSlow))), dim-1)
	return lo, hi
}

// RopeFreqs returns the dim/2 rotation frequencies θ_i = base^(−2i/dim), with
// YaRN blending when y != nil and y.Factor > 1:
// θ'_i = θ_i/factor·ramp_i + θ_i·(1−ramp_i), ramp_i = clamp((i−lo)/(hi−lo), 0, 1)
// (hi−lo is taken as 0.001 if they coincide). Computed in float64, returned as float32.
func RopeFreqs(base float64, dim int, y *YaRN) []float32 {
	n := dim / 2
	out := make([]float32, n)
	lo, hi := 0, 0
	yarn := y != nil && y.Factor > 1
	if yarn {
		lo, hi = YaRNRange(base, dim, *y)
	}
	for i := range n {
		th := math.Pow(base, -2*float64(i)/float64(dim))
		if yarn {
			span := float64(hi - lo)
			if span == 0 {
				span = 0.001
			}
			ramp := math.Min(math.Max((float64(i)-float64(lo))/span, 0), 1)
			th = th/y.Factor*ramp + th*(1-ramp)
		}
		out[i] = float32(th)
	}
	return out
}
