package cuda

import (
	_ "embed"
	"fmt"
	"os"
	"structs"
	"unsafe"
)

//go:embed kernels/idxdec.cu
var idxdecSrc string

// IdxDecSource returns the CUDA source of the decode-speed indexer kernels
// (kernels/idxdec.cu).
func IdxDecSource() string { return idxdecSrc }

// IdxDec holds the decode-speed lightning-indexer kernels of one device:
// IndexScores and TopKRows with the signatures and the exact results (the
// same bits, the same selections in the same order) of Fwd.IndexScores and
// Fwd.TopKRows, but parallel over a single query's entries and heads. Get it
// once with Ctx.IdxDec (before any graph capture: it loads a module) and
// keep it for the device's life; its methods take the device thread's Ctx
// and enqueue asynchronously on s.
type IdxDec struct {
	scores        [4]*Kernel // idx_scores_h1, h2, h4, h8
	prep          [4]*Kernel // idx_scores_p_h1 … h8 (IndexScoresPrep)
	generic, topk *Kernel
	sel           *Kernel // idx_topk_sel
	// oldTopK: TopKRows launches idx_topk instead of idx_topk_sel
	// ($MOXIE_CUDA_IDXTOPK=old; A/B comparisons).
	oldTopK bool
}

// IdxDecMaxTopK is the largest k IdxDec.TopKRows takes (FwdMaxTopK).
const IdxDecMaxTopK = 2048

const (
	idxTile     = 16  // IDX_TE in kernels/idxdec.cu
	idxWarps    = 8   // IDX_WARPS
	idxMaxDim   = 128 // 32·IDX_DPL
	idxMaxHeads = 64  // IDX_MAXH = IDX_WARPS·8
	idxMaxGrid  = 4096
	// idxTopKCache is the most keys of a row idx_topk_sel keeps
	// in shared memory (4 bytes each; with its 25,748 bytes of static shared
	// memory 222 KB, within the H200 opt-in) when a launch has at most
	// idxTopKWave rows; more rows keep at most idxTopKCacheMany, so that
	// two blocks fit on a multiprocessor.
	idxTopKCache     = 49152
	idxTopKCacheMany = 8192
	idxTopKWave      = 132
)

// IdxDec compiles (or loads from the kernel cache) the idxdec module. The
// top-k kernel is idx_topk_sel unless $MOXIE_CUDA_IDXTOPK is "old"
// (idx_topk; both give the same results); another value is an error.
func (c *Ctx) IdxDec() (*IdxDec, error) {
	x := &IdxDec{}
	switch v := os.Getenv("MOXIE_CUDA_IDXTOPK"); v {
	case "", "sel":
	case "old":
		x.oldTopK = true
	default:
		return nil, fmt.Errorf("MOXIE_CUDA_IDXTOPK=%q: want sel or old (or unset for the default, sel)", v)
	}
	err := c.loadKernels("idxdec", idxdecSrc,
		kernelRef{"idx_scores_h1", &x.scores[0]}, kernelRef{"idx_scores_h2", &x.scores[1]},
		kernelRef{"idx_scores_h4", &x.scores[2]}, kernelRef{"idx_scores_h8", &x.scores[3]},
		kernelRef{"idx_scores_p_h1", &x.prep[0]}, kernelRef{"idx_scores_p_h2", &x.prep[1]},
		kernelRef{"idx_scores_p_h4", &x.prep[2]}, kernelRef{"idx_scores_p_h8", &x.prep[3]},
		kernelRef{"idx_scores_generic", &x.generic}, kernelRef{"idx_topk", &x.topk},
		kernelRef{"idx_topk_sel", &x.sel})
	if err != nil {
		return nil, err
	}
	if err := c.raiseDynamicShared(x.sel, 4*idxTopKCache); err != nil {
		return nil, fmt.Errorf("cuda idxdec module: %w", err)
	}
	return x, nil
}

// idxHeadsPerWarp returns the idx_scores_h* variant (index into
// IdxDec.scores) for heads and dim, or -1 for the generic kernel.
func idxHeadsPerWarp(heads, dim int) int {
	if dim > idxMaxDim || heads > idxMaxHeads {
		return -1
	}
	for v, hpw := 0, 1; v < 4; v, hpw = v+1, hpw*2 {
		if heads <= idxWarps*hpw {
			return v
		}
	}
	return -1
}

// IndexScores enqueues the indexer scores of T queries (positions pos[i],
// int32 [T]): sc[i, e] = Σ_h w[i, h]·ReLU(q[i, h]·keys[e]) for
// e < min((pos[i]+1)/ratio, stride) (later entries of a row are not
// written). q is [T, heads, dim], w [T, heads], keys [*, dim], sc
// [T, stride]. maxN bounds the entry count of any query (it sizes the grid).
// The float32 operations and their order are Fwd.IndexScores'.
func (x *IdxDec) IndexScores(c *Ctx, sc, q, w, keys, pos DevicePtr, T, maxN, ratio, heads, dim, stride int, s Stream) error {
	if T <= 0 || T > 65535 || ratio <= 0 || heads <= 0 || dim <= 0 || stride <= 0 || pos == 0 {
		return fmt.Errorf("cuda idx_scores: T %d, ratio %d, heads %d, dim %d, stride %d", T, ratio, heads, dim, stride)
	}
	n := min(maxN, stride)
	if n <= 0 {
		return nil
	}
	a1, a2, a3, a4 := int32(ratio), int32(heads), int32(dim), int32(stride)
	args := []unsafe.Pointer{unsafe.Pointer(&sc), unsafe.Pointer(&q), unsafe.Pointer(&w), unsafe.Pointer(&keys), unsafe.Pointer(&pos),
		unsafe.Pointer(&a1), unsafe.Pointer(&a2), unsafe.Pointer(&a3), unsafe.Pointer(&a4)}
	v := idxHeadsPerWarp(heads, dim)
	if v < 0 {
		return c.Launch(x.generic, Dim3{X: uint32(min((n+7)/8, 1024)), Y: uint32(T)}, Dim3{X: 256}, 0, s, args...)
	}
	return c.Launch(x.scores[v], Dim3{X: uint32(min((n+idxTile-1)/idxTile, idxMaxGrid)), Y: uint32(T)}, Dim3{X: 32 * idxWarps}, 0, s, args...)
}

// idxPrep mirrors struct IdxPrep of kernels/idxdec.cu (passed by value).
type idxPrep struct {
	_      structs.HostLayout
	Freq   uint64
	NF     int32
	WScale float32
}

// IndexScoresPrepFits reports whether IndexScoresPrep takes heads of width
// dim: at most 64 heads of at most 128 (DeepSeek-V4-Flash: 64 of 128).
func IndexScoresPrepFits(heads, dim int) bool {
	return heads > 0 && dim > 0 && idxHeadsPerWarp(heads, dim) >= 0
}

// IndexScoresPrep is IndexScores on queries and weights as the projections
// store them, before their row ops: the kernel rotates the last 2·nfreq
// dims of each query head forward by the angle float32(pos[i])·freq[k]
// and multiplies each weight by wscale as it loads them, with RowOps'
// float32 and float64 operations (RowOp NFreq and Scale), so the scores
// are those of RowOps([{q: NFreq}, {w: Scale, A: wscale}]) followed by
// IndexScores. q and w are not written. freq is float32 [nfreq] device
// memory (0 ≤ nfreq ≤ dim/2; nfreq 0 rotates nothing); it needs
// IndexScoresPrepFits(heads, dim). Bad sizes are errors naming them.
func (x *IdxDec) IndexScoresPrep(c *Ctx, sc, q, w, keys, pos DevicePtr, T, maxN, ratio, heads, dim, stride int, freq DevicePtr, nfreq int, wscale float32, s Stream) error {
	switch {
	case T <= 0 || T > 65535 || ratio <= 0 || heads <= 0 || dim <= 0 || stride <= 0 || pos == 0:
		return fmt.Errorf("cuda idx_scores_p: T %d, ratio %d, heads %d, dim %d, stride %d", T, ratio, heads, dim, stride)
	case !IndexScoresPrepFits(heads, dim):
		return fmt.Errorf("cuda idx_scores_p: %d heads of width %d (want at most %d of at most %d)", heads, dim, idxMaxHeads, idxMaxDim)
	case nfreq < 0 || 2*nfreq > dim || (nfreq > 0 && freq == 0):
		return fmt.Errorf("cuda idx_scores_p: %d frequencies (table %#x) for heads of width %d: want 0..width/2 and a table", nfreq, freq, dim)
	}
	n := min(maxN, stride)
	if n <= 0 {
		return nil
	}
	a1, a2, a3, a4 := int32(ratio), int32(heads), int32(dim), int32(stride)
	pp := idxPrep{Freq: uint64(freq), NF: int32(nfreq), WScale: wscale}
	v := idxHeadsPerWarp(heads, dim)
	return c.Launch(x.prep[v], Dim3{X: uint32(min((n+idxTile-1)/idxTile, idxMaxGrid)), Y: uint32(T)}, Dim3{X: 32 * idxWarps}, 0, s,
		unsafe.Pointer(&sc), unsafe.Pointer(&q), unsafe.Pointer(&w), unsafe.Pointer(&keys), unsafe.Pointer(&pos),
		unsafe.Pointer(&a1), unsafe.Pointer(&a2), unsafe.Pointer(&a3), unsafe.Pointer(&a4), unsafe.Pointer(&pp))
}

// TopKRows enqueues the indexer's selection for T queries: row i of sc
// [T, stride] holds n = min((pos[i]+1)/ratio, stride) scores, and
// idx[i, 0 .. min(topk, n)) (int32 [T, topk]) receives the indices of the
// min(topk, n) largest in compute.TopK's order (descending, ties to the
// lower index, NaN last, −0 == +0). Rows with n <= 0 and the slots past
// min(topk, n) are not written. Fwd.TopKRows' results, from idx_topk_sel
// (or idx_topk with $MOXIE_CUDA_IDXTOPK=old; the same results). The launch
// takes up to 196,608 bytes of dynamic shared memory per row (IdxDec
// allows it).
func (x *IdxDec) TopKRows(c *Ctx, idx, sc, pos DevicePtr, T, ratio, topk, stride int, s Stream) error {
	if T <= 0 || T > 1<<31-1 || ratio <= 0 || topk <= 0 || topk > IdxDecMaxTopK || stride <= 0 || idx == 0 || sc == 0 || pos == 0 {
		return fmt.Errorf("cuda idx_topk: T %d, ratio %d, topk %d (at most %d), stride %d", T, ratio, topk, IdxDecMaxTopK, stride)
	}
	return x.topKRows(c, x.oldTopK, idx, sc, pos, T, ratio, topk, stride, s)
}

// topKRows is TopKRows with the kernel chosen by old (idx_topk) rather
// than by $MOXIE_CUDA_IDXTOPK; arguments already checked.
func (x *IdxDec) topKRows(c *Ctx, old bool, idx, sc, pos DevicePtr, T, ratio, topk, stride int, s Stream) error {
	r, k, st := int32(ratio), int32(topk), int32(stride)
	if old {
		return c.Launch(x.topk, Dim3{X: uint32(T)}, Dim3{X: 1024}, 0, s, unsafe.Pointer(&idx), unsafe.Pointer(&sc),
			unsafe.Pointer(&pos), unsafe.Pointer(&r), unsafe.Pointer(&k), unsafe.Pointer(&st))
	}
	cache := min(stride, idxTopKCache)
	if T > idxTopKWave {
		cache = min(stride, idxTopKCacheMany)
	}
	c32 := int32(cache)
	return c.Launch(x.sel, Dim3{X: uint32(T)}, Dim3{X: 1024}, 4*cache, s, unsafe.Pointer(&idx), unsafe.Pointer(&sc),
		unsafe.Pointer(&pos), unsafe.Pointer(&r), unsafe.Pointer(&k), unsafe.Pointer(&st), unsafe.Pointer(&c32))
}
