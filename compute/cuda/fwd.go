package cuda

import (
	_ "embed"
	"fmt"
	"os"
	"strings"
	"structs"
	"unsafe"
)

//go:embed kernels/fwd.cu
var fwdSrc string

// FwdSource returns the CUDA source of the forward-pass kernels (kernels/fwd.cu).
func FwdSource() string { return fwdSrc }

// Fwd holds the kernels of the device-resident DeepSeek-V4 forward pass
// (package dsv4's device session) for one device. Get it once with Ctx.Fwd
// and keep it for the device's life; its methods take the device thread's
// Ctx and enqueue asynchronously on s. Every buffer is a device pointer to
// float32 unless marked int32; size arguments are element counts. Bad sizes
// are errors naming the kernel and the argument.
type Fwd struct {
	attn, attnHG, ringStore, compStore, compClose, indexScores, topk *Kernel
	compStep                                                         *Kernel
	moeArgs, addRows, gather, scatter, gatherI32                     *Kernel
	moePlan, moeTiles, moeCombine                                    *Kernel
	moeCount, moeOffsets, moeScatter                                 *Kernel
}

// FwdMaxTopK is the largest k TopKRows takes.
const FwdMaxTopK = 2048

// maxStaticShared is the dynamic shared memory a launch may use without the
// opt-in attribute.
const maxStaticShared = 48 << 10

// Fwd compiles (or loads from the kernel cache) the forward-pass module.
func (c *Ctx) Fwd() (*Fwd, error) {
	f := &Fwd{}
	err := c.loadKernels("fwd", fwdSrc, []kernelRef{
		{"fwd_attention", &f.attn}, {"fwd_attention_hg", &f.attnHG}, {"fwd_ring_store", &f.ringStore}, {"fwd_comp_store", &f.compStore},
		{"fwd_comp_close", &f.compClose}, {"fwd_comp_step1", &f.compStep}, {"fwd_index_scores", &f.indexScores}, {"fwd_topk", &f.topk},
		{"fwd_moe_args", &f.moeArgs}, {"fwd_add_rows", &f.addRows},
		{"fwd_gather_rows", &f.gather}, {"fwd_scatter_add", &f.scatter}, {"fwd_gather_i32", &f.gatherI32},
		{"fwd_moe_plan", &f.moePlan}, {"fwd_moe_tiles", &f.moeTiles}, {"fwd_moe_combine", &f.moeCombine},
		{"fwd_moe_count", &f.moeCount}, {"fwd_moe_offsets", &f.moeOffsets}, {"fwd_moe_scatter", &f.moeScatter},
	}...)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// attnArgs mirrors struct AttnArgs in kernels/fwd.cu.
type attnArgs struct {
	_                                                             structs.HostLayout
	O, Q, Ring, Comp, Idx, Sinks, Pos                             uint64
	RingRows, Window, Ratio, IdxStride, TopK, Heads, Dim, MaxKeys int32
	Scale                                                         float32
}

// AttnParams describe one attention launch over T queries at the positions
// Pos (int32 [T], device); see AttentionRing.
type AttnParams struct {
	O, Q     DevicePtr // [T, Heads, Dim]
	Ring     DevicePtr // window ring [RingRows, Dim], position p in slot p mod RingRows
	Comp     DevicePtr // compressed entries [*, Dim], or 0 (window-only layer)
	Idx      DevicePtr // int32 [T, IdxStride] selected entries (CSA), or 0 (all entries, HCA)
	Sinks    DevicePtr // [Heads]
	Pos      DevicePtr // int32 [T]: each query's absolute position
	RingRows int
	Window   int
	T        int
	Ratio    int // compression ratio (Comp != 0)
	// IdxStride is the row stride of Idx; TopK bounds the selected count.
	IdxStride, TopK int
	Heads, Dim      int
	// MaxKeys bounds the keys of any query (Window + TopK, or Window +
	// entries); it sizes the shared memory of the one-head kernel (4·MaxKeys
	// bytes, at most 48 KiB).
	MaxKeys int
	Scale   float32
	// HeadsPerBlock 0 or 1 runs one block per (head, query); 2..8 (dividing
	// Heads, Dim <= 1024) runs the grouped kernel: one block per (group of
	// heads, query), keys read once per group and streamed with an online
	// softmax (no key-count bound). GroupedAttentionFits says which fit.
	HeadsPerBlock int
}

// checkKeys returns the error, naming kernel, for the first of p's key
// sources that the attention kernels (AttentionRing, AttentionPrefill,
// AttentionDecode) cannot read, or nil: a ring shorter than the window plus
// T−1 queries, compressed entries without a positive ratio, an index
// without a positive top-k within its row stride.
func (p *AttnParams) checkKeys(kernel string) error {
	switch {
	case p.RingRows < p.Window+p.T-1:
		return fmt.Errorf("cuda %s: ring of %d rows cannot hold window %d plus %d queries", kernel, p.RingRows, p.Window, p.T)
	case p.Comp != 0 && p.Ratio <= 0:
		return fmt.Errorf("cuda %s: compressed entries with ratio %d", kernel, p.Ratio)
	case p.Idx != 0 && (p.TopK <= 0 || p.IdxStride < p.TopK):
		return fmt.Errorf("cuda %s: top-k %d with index row stride %d", kernel, p.TopK, p.IdxStride)
	}
	return nil
}

// attnHGTile is ATT_KT in kernels/fwd.cu.
const attnHGTile = 8

// attnHGShared is the grouped kernel's dynamic shared memory in bytes.
func attnHGShared(g, dim int) int { return 4 * (g*dim + attnHGTile*dim + g*attnHGTile) }

// GroupedAttentionFits reports whether AttentionRing can run g heads per
// block for heads of width dim among `heads`.
func GroupedAttentionFits(g, heads, dim int) bool {
	return g >= 2 && g <= 8 && heads%g == 0 && dim <= 1024 && attnHGShared(g, dim) <= maxStaticShared
}

// AttentionRing enqueues the attention of T queries: query i (position
// t = Pos[i]) attends to the window positions max(0, t−Window+1)..t read from
// the ring, plus, if Comp != 0, the compressed entries w < (t+1)/Ratio (all of
// them when Idx == 0; the first min(TopK, (t+1)/Ratio) of Idx's row i
// otherwise), with the per-head sink in the denominator (compute.Backend's
// Attention semantics, K = V). The caller guarantees that the ring holds
// every position a query reads (consecutive positions need RingRows ≥
// Window+T−1) and that the key count never exceeds MaxKeys.
func (f *Fwd) AttentionRing(c *Ctx, p AttnParams, s Stream) error {
	keysErr := p.checkKeys("fwd_attention")
	switch {
	case p.O == 0 || p.Q == 0 || p.Ring == 0 || p.Sinks == 0 || p.Pos == 0:
		return fmt.Errorf("cuda fwd_attention: nil buffer (o %#x q %#x ring %#x sinks %#x pos %#x)", p.O, p.Q, p.Ring, p.Sinks, p.Pos)
	case p.T <= 0 || p.T > 65535 || p.Heads <= 0 || p.Dim <= 0 || p.Window <= 0:
		return fmt.Errorf("cuda fwd_attention: T %d, heads %d, dim %d, window %d", p.T, p.Heads, p.Dim, p.Window)
	case keysErr != nil:
		return keysErr
	case p.HeadsPerBlock > 1 && !GroupedAttentionFits(p.HeadsPerBlock, p.Heads, p.Dim):
		return fmt.Errorf("cuda fwd_attention: %d heads per block for %d heads of width %d (want 2..8 dividing the heads, width <= 1024, shared memory %d <= %d bytes)",
			p.HeadsPerBlock, p.Heads, p.Dim, attnHGShared(p.HeadsPerBlock, p.Dim), maxStaticShared)
	case p.HeadsPerBlock <= 1 && (p.MaxKeys < p.Window || 4*p.MaxKeys > maxStaticShared):
		return fmt.Errorf("cuda fwd_attention: max keys %d, want %d..%d", p.MaxKeys, p.Window, maxStaticShared/4)
	}
	a := attnArgs{O: uint64(p.O), Q: uint64(p.Q), Ring: uint64(p.Ring), Comp: uint64(p.Comp), Idx: uint64(p.Idx), Sinks: uint64(p.Sinks),
		Pos: uint64(p.Pos), RingRows: int32(p.RingRows), Window: int32(p.Window), Ratio: int32(max(p.Ratio, 1)),
		IdxStride: int32(p.IdxStride), TopK: int32(p.TopK), Heads: int32(p.Heads), Dim: int32(p.Dim), MaxKeys: int32(p.MaxKeys), Scale: p.Scale}
	if g := p.HeadsPerBlock; g > 1 {
		g32 := int32(g)
		return c.Launch(f.attnHG, Dim3{X: uint32(p.Heads / g), Y: uint32(p.T)}, Dim3{X: 256}, attnHGShared(g, p.Dim), s, unsafe.Pointer(&a), unsafe.Pointer(&g32))
	}
	return c.Launch(f.attn, Dim3{X: uint32(p.Heads), Y: uint32(p.T)}, Dim3{X: 256}, 4*p.MaxKeys, s, unsafe.Pointer(&a))
}

// RingStore enqueues ring[pos[i] mod ringRows] = kv[i] for i < T (rows of
// dim floats; pos int32 [T]).
func (f *Fwd) RingStore(c *Ctx, ring, kv, pos DevicePtr, T, ringRows, dim int, s Stream) error {
	if T <= 0 || ringRows < T || dim <= 0 || ring == 0 || kv == 0 || pos == 0 {
		return fmt.Errorf("cuda fwd_ring_store: T %d, ring rows %d, dim %d", T, ringRows, dim)
	}
	rr, d := int32(ringRows), int32(dim)
	return c.Launch(f.ringStore, Dim3{X: uint32(T)}, Dim3{X: 128}, 0, s, unsafe.Pointer(&ring), unsafe.Pointer(&kv),
		unsafe.Pointer(&pos), unsafe.Pointer(&rr), unsafe.Pointer(&d))
}

// CompStore enqueues the compressor's per-token store: for i < T (position
// p = pos[i]), ringKV[p mod ringRows] = kv[i] and ringZ[p mod ringRows] =
// z[i] + ape[p mod ratio], rows of width floats.
func (f *Fwd) CompStore(c *Ctx, ringKV, ringZ, kv, z, ape, pos DevicePtr, T, ratio, ringRows, width int, s Stream) error {
	if T <= 0 || ratio <= 0 || width <= 0 || ringRows < T || pos == 0 {
		return fmt.Errorf("cuda fwd_comp_store: T %d, ratio %d, width %d, ring rows %d, pos %#x", T, ratio, width, ringRows, pos)
	}
	a1, a2, a3 := int32(ratio), int32(ringRows), int32(width)
	return c.Launch(f.compStore, Dim3{X: uint32(T)}, Dim3{X: 128}, 0, s, unsafe.Pointer(&ringKV), unsafe.Pointer(&ringZ),
		unsafe.Pointer(&kv), unsafe.Pointer(&z), unsafe.Pointer(&ape), unsafe.Pointer(&pos), unsafe.Pointer(&a1),
		unsafe.Pointer(&a2), unsafe.Pointer(&a3))
}

// CompCloseParams describe the closing of the compressed entries that the
// T tokens at positions Pos[0] .. Pos[0]+T−1 complete: entries
// Pos[0]/Ratio .. (Pos[0]+T)/Ratio − 1 (possibly none).
type CompCloseParams struct {
	Out           DevicePtr // entries [*, DW]; entry e is written at row e
	RingKV, RingZ DevicePtr // compressor rings [RingRows, Width] (CompStore)
	RingRows      int
	Ratio         int
	Width, DW     int  // Width = 2·DW when Overlap (CSA), DW otherwise
	Overlap       bool // CSA: previous window's A halves + this window's B halves
	Pos           DevicePtr
	T             int
	Norm          DevicePtr // [DW]
	Eps           float32
	Freq          DevicePtr // [NFreq] rotation frequencies (the last 2·NFreq dims rotate)
	NFreq         int
}

// CompClose enqueues the pooling of the windows the chunk closes
// (dsv4-flash.md §4.5): per channel a softmax over the window's z rows
// weighting its kv rows (CSA: the A halves of window e−1's rows, if e > 0,
// then the B halves of window e's rows), then RMSNorm with Norm and RoPE at
// position e·Ratio. The ring must still hold those rows (RingRows ≥ 2·Ratio
// + T covers any chunk).
func (f *Fwd) CompClose(c *Ctx, p CompCloseParams, s Stream) error {
	want := p.DW
	if p.Overlap {
		want = 2 * p.DW
	}
	switch {
	case p.T <= 0 || p.Ratio <= 0 || p.DW <= 0 || p.Width != want || 2*p.NFreq > p.DW || p.Pos == 0:
		return fmt.Errorf("cuda fwd_comp_close: T %d, ratio %d, width %d, dw %d, overlap %v, nfreq %d", p.T, p.Ratio, p.Width, p.DW, p.Overlap, p.NFreq)
	case p.RingRows < 2*p.Ratio || 4*p.DW > maxStaticShared:
		return fmt.Errorf("cuda fwd_comp_close: ring rows %d for ratio %d, dw %d", p.RingRows, p.Ratio, p.DW)
	}
	ov := int32(0)
	if p.Overlap {
		ov = 1
	}
	rr, ra, wi, dw, t, nf := int32(p.RingRows), int32(p.Ratio), int32(p.Width), int32(p.DW), int32(p.T), int32(p.NFreq)
	eps := p.Eps
	return c.Launch(f.compClose, Dim3{X: uint32(p.T/p.Ratio + 1)}, Dim3{X: 256}, 4*p.DW, s,
		unsafe.Pointer(&p.Out), unsafe.Pointer(&p.RingKV), unsafe.Pointer(&p.RingZ), unsafe.Pointer(&rr), unsafe.Pointer(&ra),
		unsafe.Pointer(&wi), unsafe.Pointer(&dw), unsafe.Pointer(&ov), unsafe.Pointer(&p.Pos), unsafe.Pointer(&t),
		unsafe.Pointer(&p.Norm), unsafe.Pointer(&eps), unsafe.Pointer(&p.Freq), unsafe.Pointer(&nf))
}

// CompJob is one compressor's part of a CompStep: its rings and entries
// (as in CompStore and CompClose), this token's projections KV and Z
// [Width], APE [Ratio, Width] and Norm [DW].
type CompJob struct {
	Out, RingKV, RingZ DevicePtr
	KV, Z, APE, Norm   DevicePtr
	RingRows, Ratio    int
	Width, DW          int  // Width = 2·DW when Overlap (CSA), DW otherwise
	Overlap            bool // CSA: previous window's A halves + this window's B halves
}

// CompStepMaxJobs is the most compressors one CompStep takes.
const CompStepMaxJobs = 2

// compJob and compStepArgs mirror struct CompJob and CompStepArgs of
// kernels/fwd.cu (passed by value).
type compJob struct {
	_                                        structs.HostLayout
	RingKV, RingZ, Out, KV, Z, APE, Norm     uint64
	RingRows, Ratio, Width, DW, Overlap, Pad int32
}

type compStepArgs struct {
	_             structs.HostLayout
	J             [CompStepMaxJobs]compJob
	Pos, Freq     uint64
	Eps           float32
	NFreq, N, Pad int32
}

// CompStep enqueues, in one launch, what CompStore then CompClose do for
// one token (T = 1, position Pos[0]) for each of the jobs (at most
// CompStepMaxJobs, each a different compressor): the store of the token's
// rows, then, when the token closes an entry, its pooling, RMSNorm (Eps)
// and RoPE (Freq [NFreq]). The results are the bits of that chain. Each job
// needs Width a multiple of 4, its KV, Z, APE, RingKV and RingZ 16-byte
// aligned, and RingRows ≥ 2·Ratio.
func (f *Fwd) CompStep(c *Ctx, jobs []CompJob, pos, freq DevicePtr, nfreq int, eps float32, s Stream) error {
	if len(jobs) == 0 || len(jobs) > CompStepMaxJobs || pos == 0 || freq == 0 || nfreq < 0 {
		return fmt.Errorf("cuda fwd_comp_step1: %d jobs (want 1 to %d), pos %#x, freq %#x, nfreq %d", len(jobs), CompStepMaxJobs, pos, freq, nfreq)
	}
	a := compStepArgs{Pos: uint64(pos), Freq: uint64(freq), Eps: eps, NFreq: int32(nfreq), N: int32(len(jobs))}
	dw := 0
	for i, j := range jobs {
		want := j.DW
		if j.Overlap {
			want = 2 * j.DW
		}
		aligned := true
		for _, p := range []DevicePtr{j.KV, j.Z, j.APE, j.RingKV, j.RingZ} {
			aligned = aligned && p != 0 && p%16 == 0
		}
		switch {
		case j.Ratio <= 0 || j.DW <= 0 || j.Width != want || j.Width%4 != 0 || 2*nfreq > j.DW:
			return fmt.Errorf("cuda fwd_comp_step1: job %d: ratio %d, width %d, dw %d, overlap %v, nfreq %d (want width = dw or 2·dw with overlap, a multiple of 4, and 2·nfreq <= dw)",
				i, j.Ratio, j.Width, j.DW, j.Overlap, nfreq)
		case j.RingRows < 2*j.Ratio || 4*j.DW > maxStaticShared:
			return fmt.Errorf("cuda fwd_comp_step1: job %d: ring rows %d for ratio %d, dw %d", i, j.RingRows, j.Ratio, j.DW)
		case !aligned || j.Out == 0 || j.Norm == 0:
			return fmt.Errorf("cuda fwd_comp_step1: job %d: kv %#x, z %#x, ape %#x, rings %#x %#x (want non-zero and 16-byte aligned), out %#x, norm %#x",
				i, j.KV, j.Z, j.APE, j.RingKV, j.RingZ, j.Out, j.Norm)
		}
		ov := int32(0)
		if j.Overlap {
			ov = 1
		}
		a.J[i] = compJob{RingKV: uint64(j.RingKV), RingZ: uint64(j.RingZ), Out: uint64(j.Out), KV: uint64(j.KV), Z: uint64(j.Z),
			APE: uint64(j.APE), Norm: uint64(j.Norm), RingRows: int32(j.RingRows), Ratio: int32(j.Ratio), Width: int32(j.Width),
			DW: int32(j.DW), Overlap: ov}
		dw = max(dw, j.DW)
	}
	return c.Launch(f.compStep, Dim3{X: uint32(len(jobs))}, Dim3{X: 256}, 4*dw, s, unsafe.Pointer(&a))
}

// IndexScores enqueues the indexer scores of T queries (positions pos[i],
// int32 [T]): sc[i, e] = Σ_h w[i, h]·ReLU(q[i, h]·keys[e]) for
// e < min((pos[i]+1)/ratio, stride) (later entries of a row are not
// written). q is [T, heads, dim], w [T, heads], keys [*, dim], sc
// [T, stride]. maxN bounds the entry count of any query (it sizes the grid).
func (f *Fwd) IndexScores(c *Ctx, sc, q, w, keys, pos DevicePtr, T, maxN, ratio, heads, dim, stride int, s Stream) error {
	if T <= 0 || T > 65535 || ratio <= 0 || heads <= 0 || dim <= 0 || stride <= 0 || pos == 0 {
		return fmt.Errorf("cuda fwd_index_scores: T %d, ratio %d, heads %d, dim %d, stride %d", T, ratio, heads, dim, stride)
	}
	n := min(maxN, stride)
	if n <= 0 {
		return nil
	}
	a1, a2, a3, a4 := int32(ratio), int32(heads), int32(dim), int32(stride)
	return c.Launch(f.indexScores, Dim3{X: uint32(min((n+7)/8, 1024)), Y: uint32(T)}, Dim3{X: 256}, 0, s,
		unsafe.Pointer(&sc), unsafe.Pointer(&q), unsafe.Pointer(&w), unsafe.Pointer(&keys), unsafe.Pointer(&pos),
		unsafe.Pointer(&a1), unsafe.Pointer(&a2), unsafe.Pointer(&a3), unsafe.Pointer(&a4))
}

// TopKRows enqueues the indexer's selection for T queries: row i of sc
// [T, stride] holds n = min((pos[i]+1)/ratio, stride) scores, and
// idx[i, 0 .. min(topk, n)) (int32 [T, topk]) receives the indices of the
// min(topk, n) largest in compute.TopK's order (descending, ties to the
// lower index, NaN last, −0 == +0). Rows with n == 0 are not written.
func (f *Fwd) TopKRows(c *Ctx, idx, sc, pos DevicePtr, T, ratio, topk, stride int, s Stream) error {
	if T <= 0 || ratio <= 0 || topk <= 0 || topk > FwdMaxTopK || stride <= 0 || idx == 0 || sc == 0 || pos == 0 {
		return fmt.Errorf("cuda fwd_topk: T %d, ratio %d, topk %d (at most %d), stride %d", T, ratio, topk, FwdMaxTopK, stride)
	}
	r, k, st := int32(ratio), int32(topk), int32(stride)
	return c.Launch(f.topk, Dim3{X: uint32(T)}, Dim3{X: 1024}, 0, s, unsafe.Pointer(&idx), unsafe.Pointer(&sc),
		unsafe.Pointer(&pos), unsafe.Pointer(&r), unsafe.Pointer(&k), unsafe.Pointer(&st))
}

// GatherRows enqueues dst[j] = src[rows[j]] for j < n (rows int32, width floats each).
func (f *Fwd) GatherRows(c *Ctx, dst, src, rows DevicePtr, n, width int, s Stream) error {
	if n <= 0 || width <= 0 {
		return fmt.Errorf("cuda fwd_gather_rows: n %d, width %d", n, width)
	}
	w := int32(width)
	return c.Launch(f.gather, Dim3{X: uint32(n)}, Dim3{X: 256}, 0, s, unsafe.Pointer(&dst), unsafe.Pointer(&src), unsafe.Pointer(&rows), unsafe.Pointer(&w))
}

// ScatterAdd enqueues dst[rows[j]] += src[j] for j < n (rows int32 and
// distinct, width floats each).
func (f *Fwd) ScatterAdd(c *Ctx, dst, src, rows DevicePtr, n, width int, s Stream) error {
	if n <= 0 || width <= 0 {
		return fmt.Errorf("cuda fwd_scatter_add: n %d, width %d", n, width)
	}
	w := int32(width)
	return c.Launch(f.scatter, Dim3{X: uint32(n)}, Dim3{X: 256}, 0, s, unsafe.Pointer(&dst), unsafe.Pointer(&src), unsafe.Pointer(&rows), unsafe.Pointer(&w))
}

// GatherI32 enqueues dst[i] = table[tokens[i]] for i < n: int32 rows of k
// (e.g. the hash layers' tid2eid rows of the chunk's tokens).
func (f *Fwd) GatherI32(c *Ctx, dst, table, tokens DevicePtr, n, k int, s Stream) error {
	if n <= 0 || k <= 0 {
		return fmt.Errorf("cuda fwd_gather_i32: n %d, k %d", n, k)
	}
	kk := int32(k)
	return c.Launch(f.gatherI32, Dim3{X: uint32(n)}, Dim3{X: 32}, 0, s, unsafe.Pointer(&dst), unsafe.Pointer(&table), unsafe.Pointer(&tokens), unsafe.Pointer(&kk))
}

// AddRows enqueues out[d] += Σ_k y[k, d] (k in order) for y [K, dim].
func (f *Fwd) AddRows(c *Ctx, out, y DevicePtr, K, dim int, s Stream) error {
	if K <= 0 || dim <= 0 {
		return fmt.Errorf("cuda fwd_add_rows: K %d, dim %d", K, dim)
	}
	k, d := int32(K), int32(dim)
	return c.Launch(f.addRows, Dim3{X: uint32((dim + 255) / 256)}, Dim3{X: 256}, 0, s, unsafe.Pointer(&out), unsafe.Pointer(&y), unsafe.Pointer(&k), unsafe.Pointer(&d))
}

// ExpertTable is one layer's routed experts prepared for selection on the
// device: the multi-linear argument records of every expert's w1 and w3
// (interleaved) and w2, in device memory.
type ExpertTable struct {
	all13, all2   *MultiLinear
	w1, w3, w2    *DeviceWeight // expert 0: the launch shape of a run
	E, Inter, Dim int
	Bytes         int // stored bytes of one expert (w1 + w3 + w2)
}

// PrepareExpertTable validates that the experts (w1, w3 [inter, dim] and w2
// [dim, inter] each, all of one format) fit the multi-linear kernels and
// uploads their argument records into a. An error means the decode step must
// route through the host instead.
func (c *Ctx) PrepareExpertTable(a *Arena, w1, w3, w2 []*DeviceWeight) (*ExpertTable, error) {
	E := len(w1)
	if E == 0 || len(w3) != E || len(w2) != E {
		return nil, fmt.Errorf("cuda expert table: %d w1, %d w3, %d w2", len(w1), len(w3), len(w2))
	}
	inter, dim := w1[0].Rows, w1[0].Cols
	w13 := make([]*DeviceWeight, 0, 2*E)
	for e := range E {
		if w1[e].Rows != inter || w1[e].Cols != dim || w3[e].Rows != inter || w3[e].Cols != dim || w2[e].Rows != dim || w2[e].Cols != inter {
			return nil, fmt.Errorf("cuda expert table: expert %d has w1 [%d, %d], w3 [%d, %d], w2 [%d, %d], want [%d, %d] and [%d, %d]",
				e, w1[e].Rows, w1[e].Cols, w3[e].Rows, w3[e].Cols, w2[e].Rows, w2[e].Cols, inter, dim, dim, inter)
		}
		w13 = append(w13, w1[e], w3[e])
	}
	zeros := func(n int) []DevicePtr { return make([]DevicePtr, n) }
	t := &ExpertTable{E: E, Inter: inter, Dim: dim, Bytes: w1[0].Bytes + w3[0].Bytes + w2[0].Bytes, w1: w1[0], w3: w3[0], w2: w2[0]}
	var err error
	if t.all13, err = c.PrepareMultiLinear(a, w13, zeros(2*E), zeros(2*E), 1, LinearVariant{}); err != nil {
		return nil, err
	}
	if t.all2, err = c.PrepareMultiLinear(a, w2, zeros(E), zeros(E), 1, LinearVariant{}); err != nil {
		return nil, err
	}
	return t, nil
}

// ExpertRun is the launch state of K experts selected on the device for one
// token: argument tables rewritten by SelectExperts before each launch.
type ExpertRun struct {
	t             *ExpertTable
	run13, run2   *MultiLinear
	K             int
	x, g, u, h, y DevicePtr
}

// PrepareExpertRun allocates, in a, the argument tables of a K-expert launch
// over table t's experts, with x [dim] the input, g and u [K, inter] the w1
// and w3 outputs, h [K, inter] the w2 input and y [K, dim] the w2 outputs.
func (c *Ctx) PrepareExpertRun(a *Arena, t *ExpertTable, K int, x, g, u, h, y DevicePtr) (*ExpertRun, error) {
	if K <= 0 || K > t.E {
		return nil, fmt.Errorf("cuda expert run: %d of %d experts", K, t.E)
	}
	// K copies of expert 0 give the launch shape (every expert has it); the
	// records are overwritten by RunExperts13 before each launch.
	w13, w2 := make([]*DeviceWeight, 0, 2*K), make([]*DeviceWeight, 0, K)
	for range K {
		w13 = append(w13, t.w1, t.w3)
		w2 = append(w2, t.w2)
	}
	r := &ExpertRun{t: t, K: K, x: x, g: g, u: u, h: h, y: y}
	var err error
	if r.run13, err = c.PrepareMultiLinear(a, w13, make([]DevicePtr, 2*K), make([]DevicePtr, 2*K), 1, LinearVariant{}); err != nil {
		return nil, err
	}
	if r.run2, err = c.PrepareMultiLinear(a, w2, make([]DevicePtr, K), make([]DevicePtr, K), 1, LinearVariant{}); err != nil {
		return nil, err
	}
	return r, nil
}

// RunExperts13 enqueues the selection of the experts ids (int32 [K], device)
// into r's tables (recording them as
// selected for RunExperts2) and the launch of their w1 and w3 products (g, u).
func (f *Fwd) RunExperts13(c *Ctx, r *ExpertRun, ids DevicePtr, s Stream) error {
	k, e, in, d := int32(r.K), int32(r.t.E), int32(r.t.Inter), int32(r.t.Dim)
	if err := c.Launch(f.moeArgs, Dim3{X: 1}, Dim3{X: uint32((r.K + 31) / 32 * 32)}, 0, s,
		unsafe.Pointer(&r.run13.args), unsafe.Pointer(&r.run2.args), unsafe.Pointer(&r.t.all13.args), unsafe.Pointer(&r.t.all2.args),
		unsafe.Pointer(&ids), unsafe.Pointer(&k), unsafe.Pointer(&e), unsafe.Pointer(&r.x), unsafe.Pointer(&r.g),
		unsafe.Pointer(&r.u), unsafe.Pointer(&r.h), unsafe.Pointer(&r.y), unsafe.Pointer(&in), unsafe.Pointer(&d)); err != nil {
		return err
	}
	return c.LaunchMultiLinear(r.run13, s)
}

// RunExperts2 enqueues the w2 products of the experts selected by the last
// RunExperts13 (h → y).
func (f *Fwd) RunExperts2(c *Ctx, r *ExpertRun, s Stream) error {
	return c.LaunchMultiLinear(r.run2, s)
}

// moeTile is the rows per expert tile for the CUDA-core multi-linear
// kernels (at most maxNB), moeTileTC for the tensor-core ones (WidthTC),
// which PrepareExpertTiles uses wherever they take the experts' shapes.
const (
	moeTile   = 16
	moeTileTC = 64
)

// ExpertTileBufs are the device buffers of a chunk's expert-major layout, for
// up to N = T·K routed rows: RowTok (int32 [N]) and RowW ([N]) the token and
// route weight of each slot, Inv (int32 [N]) the slot of each (token, k),
// Tiles (int32 [MaxTiles, 3]); XE [N, dim] the gathered inputs, G, U, H
// [N, inter] the w1 and w3 outputs and the w2 input, Y [N, dim] the outputs.
// PlanExperts uses the start of XE as scratch (the gather that follows
// rewrites it).
type ExpertTileBufs struct {
	RowTok, RowW, Inv, Tiles DevicePtr
	XE, G, U, H, Y           DevicePtr
}

// ExpertTileMode is one way of running a chunk's experts on the tensor
// cores: records (tiles) of up to Rows routed rows of one expert, each
// launched with tensor-core tile Tile (LinearVariant.Tile: 2 is 64x32, 1
// 128x64, ...; 0 automatic for Rows rows per record). PlanExperts uses, of
// the modes prepared, the last whose MinRows is at most the chunk's mean
// routed rows per expert (T·K / E).
type ExpertTileMode struct {
	Rows, Tile, MinRows int
}

// autoExpertModes are the modes PrepareExpertTiles prepares where the
// tensor-core kernels take the experts: 64-row records with the 64x32 tile
// below multiBigRows routed rows per expert (chunks of 512 tokens over 192
// or 256 experts: 12-16), with the 128x64 tile from there on (chunks of
// 2048-4096 tokens: 48-128). Records longer than the tile's 64 batch rows
// would only add empty blocks: an expert's rows cost the same blocks either
// way, and the blocks that share its weights run side by side.
var autoExpertModes = [...]ExpertTileMode{{moeTileTC, multiTCTile, 0}, {moeTileTC, multiBigTile, multiBigRows}}

// expertMode is a prepared ExpertTileMode (Tile -1: the CUDA-core kernels).
type expertMode struct {
	ExpertTileMode
	maxTiles    int
	run13, run2 *MultiLinear
}

// ExpertTiles runs the routed experts of a chunk of tokens with the routing
// on the device: PlanExperts lays the chunk's (token, k) entries out
// expert-major in tiles of up to Tile() rows (64 with the tensor-core
// kernels, else 16), RunExpertTiles13/2 launch every
// tile's products as two multi-linear launches (tiles past the last have 0
// rows), CombineExperts sums each token's K outputs. It holds one or more
// modes (ExpertTileMode) and PlanExperts picks one per chunk.
type ExpertTiles struct {
	modes      []expertMode
	cur        int // the mode of the last PlanExperts
	maxRows, K int
	E          int
	inter, dim int
	b          ExpertTileBufs
}

// Tile returns the rows per expert tile of the last PlanExperts (before the
// first: of the first mode); tiles past an expert's last row are not
// planned: 64 when the tensor-core kernels run the experts automatically,
// else 16. A chunk of n routed rows over E experts needs at most n/Tile + E
// tiles (rounded up), never more than (n+15)/16 + E.
func (et *ExpertTiles) Tile() int { return et.modes[et.cur].Rows }

// Kernels returns the kernels of the w1/w3 and the w2 launches of the last
// PlanExperts (before the first: of the first mode).
func (et *ExpertTiles) Kernels() (w13, w2 string) {
	m := et.modes[et.cur]
	return m.run13.Kernel(), m.run2.Kernel()
}

// expertMaxTiles returns the tile count a chunk of n routed rows over E
// experts can need with tiles of up to `tile` rows.
func expertMaxTiles(n, E, tile int) int { return (n+tile-1)/tile + E }

// PrepareExpertTiles allocates in a the argument tables of a tiled launch for
// chunks of up to maxTokens tokens with K experts each over experts shaped
// like t's (every layer's table has the same shapes), with b the buffers
// (b.Tiles holds (maxTokens·K+15)/16 + E tiles). Where the tensor-core
// kernels take the experts it prepares the automatic modes (64-row records,
// the 64x32 tile for chunks of fewer than 40 routed rows per expert on
// average, the 128x64 tile for more; the arena then holds two sets of
// 3·(maxTokens·K/64 + E) records), else 16-row records on the CUDA cores.
func (c *Ctx) PrepareExpertTiles(a *Arena, t *ExpertTable, maxTokens, K int, b ExpertTileBufs) (*ExpertTiles, error) {
	et, err := c.PrepareExpertTilesWith(a, t, maxTokens, K, b, autoExpertModes[:])
	if err == nil {
		return et, nil
	}
	// The CUDA-core kernels.
	return c.prepareExpertTiles(a, t, maxTokens, K, b, []ExpertTileMode{{moeTile, -1, 0}})
}

// PrepareExpertTilesWith is PrepareExpertTiles with explicit tensor-core
// modes: Rows 16..1024, a multiple of 16; MinRows 0 for the first and
// ascending. It is an error when the tensor-core kernels do not take a
// mode's launches; the arena then holds nothing more.
func (c *Ctx) PrepareExpertTilesWith(a *Arena, t *ExpertTable, maxTokens, K int, b ExpertTileBufs, modes []ExpertTileMode) (*ExpertTiles, error) {
	if len(modes) == 0 {
		return nil, fmt.Errorf("cuda expert tiles: no modes")
	}
	for i, m := range modes {
		if m.Rows < 16 || m.Rows > 1024 || m.Rows%16 != 0 || m.Tile < 0 || m.Tile > len(tcTileList()) ||
			i == 0 && m.MinRows != 0 || i > 0 && m.MinRows < modes[i-1].MinRows {
			return nil, fmt.Errorf("cuda expert tiles: mode %d %+v (want rows 16..1024 a multiple of 16, tile 0..%d, MinRows 0 first, then ascending)", i, m, len(tcTileList()))
		}
	}
	return c.prepareExpertTiles(a, t, maxTokens, K, b, modes)
}

// prepareExpertTiles prepares the modes (Tile -1: the CUDA-core kernels
// at Rows <= maxNB) or frees what it allocated and fails.
func (c *Ctx) prepareExpertTiles(a *Arena, t *ExpertTable, maxTokens, K int, b ExpertTileBufs, modes []ExpertTileMode) (*ExpertTiles, error) {
	if maxTokens <= 0 || K <= 0 {
		return nil, fmt.Errorf("cuda expert tiles: %d tokens, K %d", maxTokens, K)
	}
	if 12*t.E > maxStaticShared-1024 {
		return nil, fmt.Errorf("cuda expert tiles: %d experts exceed the planner's shared memory", t.E)
	}
	et := &ExpertTiles{maxRows: maxTokens * K, K: K, E: t.E, inter: t.Inter, dim: t.Dim, b: b}
	fail := func(err error) (*ExpertTiles, error) {
		for _, m := range et.modes {
			a.Free(m.run13.args)
			a.Free(m.run2.args)
		}
		return nil, err
	}
	for _, mode := range modes {
		m := expertMode{ExpertTileMode: mode, maxTiles: expertMaxTiles(et.maxRows, t.E, mode.Rows)}
		w13, w2 := make([]*DeviceWeight, 0, 2*m.maxTiles), make([]*DeviceWeight, 0, m.maxTiles)
		for range m.maxTiles {
			w13 = append(w13, t.w1, t.w3)
			w2 = append(w2, t.w2)
		}
		v := LinearVariant{Width: WidthTC, Tile: mode.Tile}
		if mode.Tile < 0 {
			v = LinearVariant{}
		}
		var err error
		if m.run13, err = c.PrepareMultiLinear(a, w13, make([]DevicePtr, len(w13)), make([]DevicePtr, len(w13)), mode.Rows, v); err != nil {
			return fail(err)
		}
		if m.run2, err = c.PrepareMultiLinear(a, w2, make([]DevicePtr, len(w2)), make([]DevicePtr, len(w2)), mode.Rows, v); err != nil {
			a.Free(m.run13.args)
			return fail(err)
		}
		et.modes = append(et.modes, m)
		tc := func(m *MultiLinear) bool { return strings.HasPrefix(m.Kernel(), "lintmulti_") }
		if mode.Tile >= 0 && (!tc(m.run13) || !tc(m.run2)) {
			return fail(fmt.Errorf("cuda expert tiles: mode %+v runs on %s and %s, not the tensor cores", mode, m.run13.Kernel(), m.run2.Kernel()))
		}
	}
	return et, nil
}

// modeFor returns the index of the mode PlanExperts uses for n routed
// rows: the last whose MinRows·E <= n.
func (et *ExpertTiles) modeFor(n int) int {
	cur := 0
	for i, m := range et.modes {
		if m.MinRows*et.E <= n {
			cur = i
		}
	}
	return cur
}

// PlanExperts enqueues the expert-major layout of T tokens' routing (ids
// int32 [T, K], w [T, K]) into the tile buffers, in the records of the mode
// for T·K routed rows (see ExpertTileMode), which the following
// RunExpertTiles13/2 launch. Entry j = t·K + k (token t's k-th expert e,
// ids outside [0, E) count as expert 0) gets slot Inv[j] = the rows of the
// experts before e plus the entries before j routed to e; RowTok[slot] = t,
// RowW[slot] = w[j]; Tiles lists (expert, first slot, rows) of every
// expert's rows in tiles of up to Tile() rows in expert order, then tiles
// of 0 rows. It runs three kernels over the whole device (count, offsets,
// scatter: for up to planMaxExperts experts whose counts fit in XE), else,
// or with MOXIE_CUDA_MOEPLAN=old, the one-block planner.
func (f *Fwd) PlanExperts(c *Ctx, et *ExpertTiles, ids, w DevicePtr, T int, s Stream) error {
	v, err := moePlanFromEnv()
	if err != nil {
		return err
	}
	return f.planExperts(c, et, ids, w, T, v, s)
}

// planMaxExperts is the most experts the multi-block planner takes;
// planChunk and planThreads mirror PLAN_CHUNK and PLAN_THREADS in
// kernels/fwd.cu.
const (
	planMaxExperts = 1024
	planChunk      = 1024
	planThreads    = 256
)

// moePlanVariant picks PlanExperts' kernels.
type moePlanVariant int

const (
	moePlanMulti moePlanVariant = iota // count, offsets, scatter over the device
	moePlanOld                         // one block (fwd_moe_plan)
)

// moePlanFromEnv reads MOXIE_CUDA_MOEPLAN: unset or "multi" (the default),
// or "old" (the one-block planner).
func moePlanFromEnv() (moePlanVariant, error) {
	switch v := os.Getenv("MOXIE_CUDA_MOEPLAN"); v {
	case "", "multi":
		return moePlanMulti, nil
	case "old":
		return moePlanOld, nil
	default:
		return 0, fmt.Errorf("cuda fwd_moe_plan: MOXIE_CUDA_MOEPLAN=%q: want multi or old (or unset for multi)", v)
	}
}

// planMulti reports whether the multi-block planner takes n routed rows of
// et: at most planMaxExperts experts, and the counts ([blocks, E] int32)
// fit in XE.
func (et *ExpertTiles) planMulti(n int) bool {
	nb := (n + planChunk - 1) / planChunk
	return et.E <= planMaxExperts && nb*et.E <= et.maxRows*et.dim
}

// planExperts is PlanExperts with the planner chosen (moePlanMulti falls
// back to the one-block planner where it does not take the chunk).
func (f *Fwd) planExperts(c *Ctx, et *ExpertTiles, ids, w DevicePtr, T int, v moePlanVariant, s Stream) error {
	n := T * et.K
	if T <= 0 || n > et.maxRows {
		return fmt.Errorf("cuda fwd_moe_plan: %d tokens × %d experts, room for %d rows", T, et.K, et.maxRows)
	}
	et.cur = et.modeFor(n)
	m := et.modes[et.cur]
	n32, k32, e32, mt, tl := int32(n), int32(et.K), int32(et.E), int32(m.maxTiles), int32(m.Rows)
	b := &et.b
	if v == moePlanOld || !et.planMulti(n) {
		return c.Launch(f.moePlan, Dim3{X: 1}, Dim3{X: 1024}, 12*et.E, s, unsafe.Pointer(&b.RowTok), unsafe.Pointer(&b.RowW),
			unsafe.Pointer(&b.Inv), unsafe.Pointer(&b.Tiles), unsafe.Pointer(&ids), unsafe.Pointer(&w), unsafe.Pointer(&n32),
			unsafe.Pointer(&k32), unsafe.Pointer(&e32), unsafe.Pointer(&mt), unsafe.Pointer(&tl))
	}
	nb := (n + planChunk - 1) / planChunk
	cnt, nb32 := b.XE, int32(nb)
	if err := c.Launch(f.moeCount, Dim3{X: uint32(nb)}, Dim3{X: planThreads}, 4*et.E, s, unsafe.Pointer(&cnt), unsafe.Pointer(&ids),
		unsafe.Pointer(&n32), unsafe.Pointer(&e32)); err != nil {
		return err
	}
	if err := c.Launch(f.moeOffsets, Dim3{X: 1}, Dim3{X: 1024}, 0, s, unsafe.Pointer(&cnt), unsafe.Pointer(&b.Tiles),
		unsafe.Pointer(&nb32), unsafe.Pointer(&e32), unsafe.Pointer(&mt), unsafe.Pointer(&tl)); err != nil {
		return err
	}
	return c.Launch(f.moeScatter, Dim3{X: uint32(nb)}, Dim3{X: planThreads}, 4*et.E*(1+planThreads/32), s,
		unsafe.Pointer(&b.RowTok), unsafe.Pointer(&b.RowW), unsafe.Pointer(&b.Inv), unsafe.Pointer(&cnt), unsafe.Pointer(&ids),
		unsafe.Pointer(&w), unsafe.Pointer(&n32), unsafe.Pointer(&k32), unsafe.Pointer(&e32))
}

// RunExpertTiles13 enqueues the tiles' records for layer table t and the w1
// and w3 products (XE → G, U) of every planned row.
func (f *Fwd) RunExpertTiles13(c *Ctx, et *ExpertTiles, t *ExpertTable, s Stream) error {
	if t.E != et.E || t.Inter != et.inter || t.Dim != et.dim {
		return fmt.Errorf("cuda expert tiles: table of %d experts [%d, %d], tiles prepared for %d [%d, %d]", t.E, t.Inter, t.Dim, et.E, et.inter, et.dim)
	}
	if err := f.expertRecords(c, et, t.all13.args, t.all2.args, s); err != nil {
		return err
	}
	return c.LaunchMultiLinear(et.modes[et.cur].run13, s)
}

// expertRecords enqueues fwd_moe_tiles: the records of the last
// PlanExperts' tiles from the table records all13 (w1, w3 of each expert)
// and all2 (w2).
func (f *Fwd) expertRecords(c *Ctx, et *ExpertTiles, all13, all2 DevicePtr, s Stream) error {
	m := et.modes[et.cur]
	mt, in, d := int32(m.maxTiles), int32(et.inter), int32(et.dim)
	b := et.b
	return c.Launch(f.moeTiles, Dim3{X: uint32((m.maxTiles + 127) / 128)}, Dim3{X: 128}, 0, s,
		unsafe.Pointer(&m.run13.args), unsafe.Pointer(&m.run2.args), unsafe.Pointer(&all13), unsafe.Pointer(&all2),
		unsafe.Pointer(&b.Tiles), unsafe.Pointer(&mt), unsafe.Pointer(&b.XE), unsafe.Pointer(&b.G), unsafe.Pointer(&b.U),
		unsafe.Pointer(&b.H), unsafe.Pointer(&b.Y), unsafe.Pointer(&in), unsafe.Pointer(&d))
}

// RunExpertTiles2 enqueues the w2 products (H → Y) of the tiles recorded by
// the last RunExpertTiles13.
func (f *Fwd) RunExpertTiles2(c *Ctx, et *ExpertTiles, s Stream) error {
	return c.LaunchMultiLinear(et.modes[et.cur].run2, s)
}

// CombineExperts enqueues out[t] += Σ_k Y[Inv[t·K+k]] for t < T (out [T, dim]).
func (f *Fwd) CombineExperts(c *Ctx, out DevicePtr, et *ExpertTiles, T int, s Stream) error {
	if T <= 0 || T*et.K > et.maxRows {
		return fmt.Errorf("cuda fwd_moe_combine: %d tokens", T)
	}
	k, d := int32(et.K), int32(et.dim)
	return c.Launch(f.moeCombine, Dim3{X: uint32(T)}, Dim3{X: 256}, 0, s, unsafe.Pointer(&out), unsafe.Pointer(&et.b.Y),
		unsafe.Pointer(&et.b.Inv), unsafe.Pointer(&k), unsafe.Pointer(&d))
}

// SetTableExpert points table t's records of expert e at the weights w1, w3
// and w2 (e.g. a device cache slot the expert was just loaded into). It
// builds the records in scratch memory from a and copies them into the
// table on the compute stream, then waits for the stream, so it must not be
// called while a launch reading the table is being captured.
func (c *Ctx) SetTableExpert(a *Arena, t *ExpertTable, e int, w1, w3, w2 *DeviceWeight) error {
	if e < 0 || e >= t.E {
		return fmt.Errorf("cuda expert table: expert %d of %d", e, t.E)
	}
	for _, w := range []*DeviceWeight{w1, w3} {
		if w.Rows != t.Inter || w.Cols != t.Dim {
			return fmt.Errorf("cuda expert table: w1/w3 [%d, %d], want [%d, %d]", w.Rows, w.Cols, t.Inter, t.Dim)
		}
	}
	if w2.Rows != t.Dim || w2.Cols != t.Inter {
		return fmt.Errorf("cuda expert table: w2 [%d, %d], want [%d, %d]", w2.Rows, w2.Cols, t.Dim, t.Inter)
	}
	rec := int(unsafe.Sizeof(linArgs{}))
	m13, err := c.PrepareMultiLinear(a, []*DeviceWeight{w1, w3}, make([]DevicePtr, 2), make([]DevicePtr, 2), 1, LinearVariant{})
	if err != nil {
		return err
	}
	defer a.Free(m13.args)
	m2, err := c.PrepareMultiLinear(a, []*DeviceWeight{w2}, make([]DevicePtr, 1), make([]DevicePtr, 1), 1, LinearVariant{})
	if err != nil {
		return err
	}
	defer a.Free(m2.args)
	s := c.Stream()
	if err := c.CopyAsync(t.all13.args+DevicePtr(2*e*rec), m13.args, 2*rec, s); err != nil {
		return err
	}
	if err := c.CopyAsync(t.all2.args+DevicePtr(e*rec), m2.args, rec, s); err != nil {
		return err
	}
	return c.Sync(s)
}
