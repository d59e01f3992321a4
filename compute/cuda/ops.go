package cuda

import (
	_ "embed"
	"fmt"
	"math"
	"os"
	"unsafe"

	"moxie/compute"
)

//go:embed kernels/ops.cu
var opsSrc string

// OpsSource returns the CUDA source of the ops module (kernels/ops.cu).
func OpsSource() string { return opsSrc }

// opsModuleName names the ops module among the device's modules.
const opsModuleName = "ops"

// opsModule returns the device's ops module, compiling (or loading from the
// disk cache) on first use.
func (c *Ctx) opsModule() (*Module, error) { return c.namedModule(opsModuleName, opsSrc, nil) }

// LoadOps compiles (or loads from the disk cache) the ops module now, so
// that the first op does not do it: call it before capturing a CUDA graph
// that contains ops, since loading a module is not a stream operation.
//
// It also makes the device's HCMix path choice ($MOXIE_CUDA_HCMIX, see
// HCMix) and allocates what that path needs, which must not happen during a
// capture either.
func (c *Ctx) LoadOps() error {
	if _, err := c.opsModule(); err != nil {
		return err
	}
	_, err := c.hcMixChoice()
	return err
}

// launchOp enqueues the ops kernel `name` on s.
func (c *Ctx) launchOp(name string, grid, block Dim3, shared int, s Stream, args ...unsafe.Pointer) error {
	return c.launchNamed(c.opsModule, name, grid, block, shared, s, args...)
}

type ptr = unsafe.Pointer

// Limits of the ops kernels.
const (
	// OpsMaxTopK is the largest k TopK takes.
	OpsMaxTopK = 2048
	// OpsMaxAttentionDim is the largest head dimension Attention takes.
	OpsMaxAttentionDim = 1024
	// OpsMaxExperts is the largest expert count Route takes.
	OpsMaxExperts = 2048
	// OpsMaxHCRows is the largest Fn row count ((2+HC)·HC) HCMix takes.
	OpsMaxHCRows = 128
	// opsMaxGridY is CUDA's limit on gridDim.y (the batch of the per-row kernels).
	opsMaxGridY = 65535
	// opsStaticShared is the shared memory a kernel may take without opting in.
	opsStaticShared = 48 << 10
)

func opErr(op, f string, a ...any) error { return fmt.Errorf("cuda "+op+": "+f, a...) }

// pos32 reports whether every value is in [1, MaxInt32].
func pos32(v ...int) bool {
	for _, x := range v {
		if x <= 0 || x > math.MaxInt32 {
			return false
		}
	}
	return true
}

func nonNull(p ...DevicePtr) bool {
	for _, x := range p {
		if x == 0 {
			return false
		}
	}
	return true
}

// gridFor returns a 1-D grid of 256-thread blocks covering n threads (grid-stride
// kernels handle the rest).
func gridFor(n int64) Dim3 {
	b := (n + 255) / 256
	return Dim3{X: uint32(min(max(b, 1), 1<<20))}
}

// RMSNorm enqueues y = w ⊙ x / sqrt(mean(x²) + eps) over `rows` rows of
// width dim (x, y [rows, dim]; w [dim], or 0 for unweighted). y may alias x.
func (c *Ctx) RMSNorm(y, x, w DevicePtr, rows, dim int, eps float32, s Stream) error {
	if !pos32(rows, dim) || !nonNull(y, x) {
		return opErr("RMSNorm", "rows %d, dim %d, y %#x, x %#x: want positive sizes and non-null buffers", rows, dim, y, x)
	}
	d := int32(dim)
	bs := uint32(min(1024, max(32, (dim+3)/4/32*32)))
	return c.launchOp("rmsnorm", Dim3{X: uint32(rows)}, Dim3{X: bs}, 0, s, ptr(&y), ptr(&x), ptr(&w), ptr(&d), ptr(&eps))
}

// HC holds one hyper-connection site on the device.
type HC struct {
	Fn           *DeviceWeight // [(2+HC)*HC, HC*D] or [HC, HC*D] (F32 or BF16 as stored)
	Base, Scale  DevicePtr     // float32 [Fn.Rows], [3] or [1]
	HC, Iters    int
	Eps, NormEps float32
}

// check validates p for a mix (head 0: Fn has (2+HC)·HC rows) or a head's
// pre weights (head 1: HC rows) and returns Fn's format code.
func (p *HC) check(op string, head int32) (fmtCode int32, err error) {
	if p == nil || p.Fn == nil {
		return 0, opErr(op, "nil HC parameters or Fn")
	}
	rows := (2 + p.HC) * p.HC
	if head != 0 {
		rows = p.HC
	}
	switch p.Fn.Format {
	case compute.F32:
		fmtCode = 4
	case compute.BF16:
		fmtCode = 3
	default:
		return 0, opErr(op, "Fn is %v, want f32 or bf16", p.Fn.Format)
	}
	if p.HC <= 0 || p.Fn.Rows != rows || rows > OpsMaxHCRows || !pos32(p.Fn.Cols) || p.Fn.Cols%p.HC != 0 {
		return 0, opErr(op, "HC %d with Fn [%d, %d]: want Fn rows %d (at most %d) and columns a positive multiple of HC", p.HC, p.Fn.Rows, p.Fn.Cols, rows, OpsMaxHCRows)
	}
	if !nonNull(p.Base, p.Scale, p.Fn.Data) {
		return 0, opErr(op, "null Base, Scale or Fn data")
	}
	return fmtCode, nil
}

func (c *Ctx) hcMix(op string, pre, post, comb, x DevicePtr, p *HC, batch int, head int32, s Stream) error {
	if p == nil {
		return opErr(op, "nil HC parameters")
	}
	code, err := p.check(op, head)
	if err != nil {
		return err
	}
	rows := p.Fn.Rows // check: (2+HC)·HC, or HC for a head
	if !pos32(batch) || !nonNull(pre, x) || (head == 0 && !nonNull(post, comb)) {
		return opErr(op, "batch %d, pre %#x, post %#x, comb %#x, x %#x: want a positive batch and non-null buffers", batch, pre, post, comb, x)
	}
	st, err := c.hcMixChoice()
	if err != nil {
		return opErr(op, "%v", err)
	}
	fn := p.Fn.Data
	hc, n, iters, nm, b32 := int32(p.HC), int32(p.Fn.Cols), int32(p.Iters), int32(rows), int32(batch)
	eps, neps := p.Eps, p.NormEps
	base, scale := p.Base, p.Scale
	if st.split && batch <= hcSmallBatch && hcSplitAligned(x, fn, p.Fn.Cols, code) {
		rb, groups, splits, cq, threads := hcSplitShape(rows, p.Fn.Cols)
		part, s32, cq32, rb32 := st.scratch, int32(splits), int32(cq), int32(rb)
		grid := Dim3{X: uint32(groups), Y: uint32(splits), Z: uint32((batch + hcSplitTB - 1) / hcSplitTB)}
		if err := c.launchOp("hc_split_dots", grid, Dim3{X: uint32(threads)}, 0, s,
			ptr(&part), ptr(&x), ptr(&fn), ptr(&code), ptr(&n), ptr(&nm), ptr(&cq32), ptr(&rb32), ptr(&b32)); err != nil {
			return err
		}
		return c.launchOp("hc_split_finish", Dim3{X: uint32(batch)}, Dim3{X: uint32(max(64, (rows+32)/32*32))}, 0, s,
			ptr(&pre), ptr(&post), ptr(&comb), ptr(&part), ptr(&base), ptr(&scale), ptr(&hc), ptr(&n), ptr(&nm), ptr(&s32),
			ptr(&iters), ptr(&eps), ptr(&neps), ptr(&head))
	}
	dots, grid := "hc_dots_r1_t1", Dim3{X: uint32(rows), Y: uint32(batch)}
	if batch > hcSmallBatch {
		dots, grid = "hc_dots_r8_t8", Dim3{X: uint32((rows + 7) / 8), Y: uint32((batch + 7) / 8)}
	}
	if grid.Y > opsMaxGridY {
		return opErr(op, "batch %d is too large (at most %d)", batch, 8*opsMaxGridY)
	}
	if err := c.launchOp(dots, grid, Dim3{X: 256}, 0, s,
		ptr(&pre), ptr(&post), ptr(&comb), ptr(&x), ptr(&fn), ptr(&code), ptr(&hc), ptr(&n), ptr(&nm), ptr(&b32), ptr(&head)); err != nil {
		return err
	}
	return c.launchOp("hc_finish", Dim3{X: uint32(batch)}, Dim3{X: 512}, 0, s,
		ptr(&pre), ptr(&post), ptr(&comb), ptr(&x), ptr(&base), ptr(&scale), ptr(&hc), ptr(&n), ptr(&iters), ptr(&eps), ptr(&neps), ptr(&head))
}

// hcSmallBatch is the largest batch HCMix computes with one block per
// (token, Fn row), or with the split kernels when chosen; larger batches use
// 8×8 tiles.
const hcSmallBatch = 16

// The split path of HCMix/HCHeadPre (kernels hc_split_dots and
// hc_split_finish): the Fn rows and the Σx² "row" of a token are cut into at
// most hcMaxSplits column chunks; a block reduces one chunk for a tile of up
// to hcSplitRB rows × hcSplitTB tokens, each (token, row, chunk) into a fixed
// slot of the device's scratch buffer [batch, rows+1, splits].
const (
	hcMaxSplits = 64 // HCS_MAXS in ops.cu
	hcSplitRB   = 8  // HCS_RB in ops.cu
	hcSplitTB   = 4  // HCS_TB in ops.cu
	// hcMinBlocks is the grid size the split shape aims for at batch 1: two
	// blocks per SM of an H100/H200 (132 SMs).
	hcMinBlocks    = 264
	hcScratchBytes = 4 * hcSmallBatch * (OpsMaxHCRows + 1) * hcMaxSplits
)

// hcMixState is a device's HCMix/HCHeadPre path choice and the split path's
// scratch buffer, owned by the device thread. The zero value is "not chosen
// yet".
type hcMixState struct {
	chosen  bool
	split   bool      // batches up to hcSmallBatch take the split kernels
	scratch DevicePtr // float32 [hcSmallBatch, OpsMaxHCRows+1, hcMaxSplits], once split was chosen
}

// hcMixChoice returns the device's HCMix path choice, reading
// $MOXIE_CUDA_HCMIX ("rows" for the per-row kernels; unset or "split" for
// the split-K kernels, the default since they measured 12.0 against 25.9 µs
// per decode mix on the H200) on the first
// call, which also allocates the split path's scratch buffer: LoadOps makes
// that first call before any capture. An unknown value is an error (and is
// read again on the next call).
func (c *Ctx) hcMixChoice() (*hcMixState, error) {
	st := &c.d.hcMix
	if st.chosen {
		return st, nil
	}
	split := true
	switch v := os.Getenv("MOXIE_CUDA_HCMIX"); v {
	case "", "split":
	case "rows":
		split = false
	default:
		return nil, fmt.Errorf("MOXIE_CUDA_HCMIX=%q: want rows or split (or unset for the default, split)", v)
	}
	if err := c.setHCMixSplit(split); err != nil {
		return nil, err
	}
	return st, nil
}

// setHCMixSplit makes the device's HCMix path choice (the split kernels on
// or off), allocating the scratch buffer the first time the split path is
// chosen; it stays allocated until the device closes. Tests call it to
// switch paths on a shared device.
func (c *Ctx) setHCMixSplit(on bool) error {
	st := &c.d.hcMix
	if on && st.scratch == 0 {
		p, err := c.MemAlloc(hcScratchBytes)
		if err != nil {
			return fmt.Errorf("HCMix split scratch (%d bytes): %w", hcScratchBytes, err)
		}
		st.scratch = p
	}
	st.chosen, st.split = true, on
	return nil
}

// hcSplitAligned reports whether hc_split_dots can read x and Fn (format
// code fmtCode, n columns) with 16-byte (x, F32 Fn) or 8-byte (BF16 Fn)
// loads.
func hcSplitAligned(x, fn DevicePtr, n int, fmtCode int32) bool {
	fa := DevicePtr(16)
	if fmtCode == 3 {
		fa = 8
	}
	return n%4 == 0 && x%16 == 0 && fn%fa == 0
}

// hcSplitShape returns the launch shape of hc_split_dots for rows Fn rows
// (rows+1 with the Σx² row) of n columns (n a positive multiple of 4): the
// rows in groups of rb (at most hcSplitRB, groups as even as rb allows),
// the columns in splits chunks of cq quads (4 columns) each, none empty, and
// threads per block (a multiple of 32, 32 to 256) for cq quads. It aims at
// hcMinBlocks blocks per token group: at least hcMinBlocks/hcMaxSplits row
// groups where there are that many rows, then splits the smallest power of
// two that reaches hcMinBlocks, at most hcMaxSplits and n/4 (before empty
// chunks are dropped). The shape depends on rows and n only, never on the
// batch, so a token's results do not depend on the batch it is in.
func hcSplitShape(rows, n int) (rb, groups, splits, cq, threads int) {
	r1, nq := rows+1, n/4
	groups = min(r1, max((hcMinBlocks+hcMaxSplits-1)/hcMaxSplits, (r1+hcSplitRB-1)/hcSplitRB))
	rb = (r1 + groups - 1) / groups
	groups = (r1 + rb - 1) / rb
	s := 1
	for s < hcMaxSplits && s*groups < hcMinBlocks {
		s *= 2
	}
	s = min(s, nq)
	cq = (nq + s - 1) / s
	splits = (nq + cq - 1) / cq
	threads = min(256, max(32, (cq+31)/32*32))
	return rb, groups, splits, cq, threads
}

// HCMix enqueues the hyper-connection coefficients of `batch` tokens from the
// streams x [batch, HC, D] (D = Fn.Cols/HC): pre [batch, HC], post [batch, HC]
// and comb [batch, HC, HC], fused (norm, projection, sigmoids, Sinkhorn) in
// the host backend's order (compute.Backend.HCMix).
//
// Unless MOXIE_CUDA_HCMIX=rows is in the environment when the device makes
// its choice (its first LoadOps, HCMix or HCHeadPre), batches up to 16 with
// Fn.Cols % 4 == 0 and 16-byte aligned x and Fn (8-byte for BF16) take
// split-K kernels that spread the dot products over many blocks; the
// results are deterministic but may differ from the default path's in the
// last bits (float32 sums in another order). That path keeps its partial
// sums in one scratch buffer per device, so split-path calls must not run
// concurrently on different streams.
func (c *Ctx) HCMix(pre, post, comb, x DevicePtr, p *HC, batch int, s Stream) error {
	return c.hcMix("HCMix", pre, post, comb, x, p, batch, 0, s)
}

// HCHeadPre enqueues pre [batch, HC] = sigmoid(ρ·(Fn·x)·Scale[0] + Base) + Eps
// for x [batch, HC, D] (Fn [HC, HC·D]), by the same paths as HCMix.
func (c *Ctx) HCHeadPre(pre, x DevicePtr, p *HC, batch int, s Stream) error {
	return c.hcMix("HCHeadPre", pre, 0, 0, x, p, batch, 1, s)
}

func rowGrid(op string, dim, batch int) (Dim3, error) {
	if !pos32(dim, batch) || batch > opsMaxGridY {
		return Dim3{}, opErr(op, "dim %d, batch %d: want positive sizes, batch at most %d", dim, batch, opsMaxGridY)
	}
	return Dim3{X: uint32((dim + 255) / 256), Y: uint32(batch)}, nil
}

// HCCollapse enqueues y[b] = Σ_j pre[b, j]·x[b, j] for x [batch, hc, dim],
// pre [batch, hc], y [batch, dim].
func (c *Ctx) HCCollapse(y, x, pre DevicePtr, hc, dim, batch int, s Stream) error {
	g, err := rowGrid("HCCollapse", dim, batch)
	if err != nil {
		return err
	}
	if !pos32(hc) || !nonNull(y, x, pre) {
		return opErr("HCCollapse", "hc %d, y %#x, x %#x, pre %#x: want positive hc and non-null buffers", hc, y, x, pre)
	}
	h, d := int32(hc), int32(dim)
	return c.launchOp("hc_collapse", g, Dim3{X: 256}, 0, s, ptr(&y), ptr(&x), ptr(&pre), ptr(&h), ptr(&d))
}

// HCExpand enqueues out[b, k] = post[b, k]·o[b] + Σ_j comb[b, j, k]·x[b, j]
// for out, x [batch, hc, dim], o [batch, dim], post [batch, hc],
// comb [batch, hc, hc]. out may not alias x.
func (c *Ctx) HCExpand(out, x, o, post, comb DevicePtr, hc, dim, batch int, s Stream) error {
	g, err := rowGrid("HCExpand", dim, batch)
	if err != nil {
		return err
	}
	if !pos32(hc) || !nonNull(out, x, o, post, comb) {
		return opErr("HCExpand", "hc %d: want positive hc and non-null buffers", hc)
	}
	if out == x {
		return opErr("HCExpand", "out aliases x")
	}
	h, d := int32(hc), int32(dim)
	return c.launchOp("hc_expand", g, Dim3{X: 256}, 0, s, ptr(&out), ptr(&x), ptr(&o), ptr(&post), ptr(&comb), ptr(&h), ptr(&d))
}

// RoPE rotates, in place, the last 2·nfreq dims of every dim-wide segment of
// each rowLen-wide row of x [rows, rowLen] by angle float32(pos[r])·freq[p]
// (negated if inverse); pos is int32 [rows], freq float32 [nfreq].
func (c *Ctx) RoPE(x, pos, freq DevicePtr, rows, rowLen, dim, nfreq int, inverse bool, s Stream) error {
	if !pos32(rows, rowLen, dim, nfreq) || 2*nfreq > dim || rowLen%dim != 0 || int64(rows)*int64(rowLen) > math.MaxInt64/4 {
		return opErr("RoPE", "rows %d, rowLen %d, dim %d, nfreq %d: want positive sizes, 2·nfreq <= dim, rowLen a multiple of dim", rows, rowLen, dim, nfreq)
	}
	if !nonNull(x, pos, freq) {
		return opErr("RoPE", "null x, pos or freq")
	}
	r, rl, d, nf := int32(rows), int32(rowLen), int32(dim), int32(nfreq)
	var inv int32
	if inverse {
		inv = 1
	}
	return c.launchOp("rope", gridFor(int64(rows)*int64(rowLen/dim)*int64(nfreq)), Dim3{X: 256}, 0, s,
		ptr(&x), ptr(&pos), ptr(&freq), ptr(&r), ptr(&rl), ptr(&d), ptr(&nf), ptr(&inv))
}

// attnWarps returns the number of warps that split one head's keys (their
// partial outputs, 4·(2+dim) bytes each, share 48 KiB of shared memory).
func attnWarps(dim int) int {
	if dim <= 512 {
		return 16
	}
	return 8
}

// Attention enqueues one query token's attention with sinks
// (compute.Backend.Attention): q [heads, dim], kv [nKeys, dim] (K = V),
// sinks [heads], o [heads, dim]. nKeys == 0 gives o = 0 (kv may then be 0).
func (c *Ctx) Attention(o, q, kv, sinks DevicePtr, nKeys, heads, dim int, scale float32, s Stream) error {
	if !pos32(heads, dim) || dim > OpsMaxAttentionDim || nKeys < 0 || nKeys > math.MaxInt32 {
		return opErr("Attention", "keys %d, heads %d, dim %d: want heads > 0, 0 < dim <= %d, keys >= 0", nKeys, heads, dim, OpsMaxAttentionDim)
	}
	if !nonNull(o, q, sinks) || (nKeys > 0 && kv == 0) {
		return opErr("Attention", "null o, q, kv or sinks")
	}
	name := "attention32"
	switch {
	case dim <= 128:
		name = "attention4"
	case dim <= 512:
		name = "attention16"
	}
	nk, d := int32(nKeys), int32(dim)
	nw := attnWarps(dim)
	shared := 4 * nw * (2 + dim)
	return c.launchOp(name, Dim3{X: uint32(heads)}, Dim3{X: uint32(32 * nw)}, shared, s,
		ptr(&o), ptr(&q), ptr(&kv), ptr(&sinks), ptr(&nk), ptr(&d), ptr(&scale))
}

// CompressPool enqueues out[ch] = Σ_s softmax_s(z[s, ch])·kv[s, ch] for
// kv, z [slots, width], out [width].
func (c *Ctx) CompressPool(out, kv, z DevicePtr, slots, width int, s Stream) error {
	if !pos32(slots, width) || !nonNull(out, kv, z) {
		return opErr("CompressPool", "slots %d, width %d: want positive sizes and non-null buffers", slots, width)
	}
	sl, w := int32(slots), int32(width)
	return c.launchOp("compress_pool", Dim3{X: uint32((width + 255) / 256)}, Dim3{X: 256}, 0, s, ptr(&out), ptr(&kv), ptr(&z), ptr(&sl), ptr(&w))
}

// indexTile is IDX_KT in kernels/ops.cu.
const indexTile = 16

// IndexScores enqueues sc[i] = Σ_h w[h]·ReLU(q[h]·keys[i]) for q [heads, dim],
// w [heads], keys [nKeys, dim], sc [nKeys]. nKeys == 0 does nothing.
func (c *Ctx) IndexScores(sc, q, w, keys DevicePtr, nKeys, heads, dim int, s Stream) error {
	if !pos32(heads, dim) || nKeys < 0 || nKeys > math.MaxInt32 || int64(heads)*int64(dim) > math.MaxInt32 {
		return opErr("IndexScores", "keys %d, heads %d, dim %d: want positive heads and dim, keys >= 0", nKeys, heads, dim)
	}
	if nKeys == 0 {
		return nil
	}
	if !nonNull(sc, q, w, keys) {
		return opErr("IndexScores", "null sc, q, w or keys")
	}
	nk, h, d := int32(nKeys), int32(heads), int32(dim)
	args := []unsafe.Pointer{ptr(&sc), ptr(&q), ptr(&w), ptr(&keys), ptr(&nk), ptr(&h), ptr(&d)}
	shared := 4 * (dim*heads + indexTile*dim + indexTile*heads)
	if shared > opsStaticShared {
		return c.launchOp("index_scores_simple", gridFor(int64(nKeys)), Dim3{X: 256}, 0, s, args...)
	}
	tiles := (nKeys + indexTile - 1) / indexTile
	return c.launchOp("index_scores", Dim3{X: uint32(min(tiles, 4*132*4))}, Dim3{X: 256}, shared, s, args...)
}

// TopK enqueues idx (int32 [k]) = the indices of the k largest of scores [n],
// in the order and tie-break of compute.TopK (descending score, ties to the
// lower index, NaN last; −0 equals +0). 1 <= k <= min(n, OpsMaxTopK); k == 0
// does nothing.
func (c *Ctx) TopK(idx, scores DevicePtr, n, k int, s Stream) error {
	if k == 0 && n >= 0 {
		return nil
	}
	if !pos32(n, k) || k > n || k > OpsMaxTopK {
		return opErr("TopK", "n %d, k %d: want 1 <= k <= n and k <= %d", n, k, OpsMaxTopK)
	}
	if !nonNull(idx, scores) {
		return opErr("TopK", "null idx or scores")
	}
	n32, k32 := int32(n), int32(k)
	return c.launchOp("topk", Dim3{X: 1}, Dim3{X: 1024}, 0, s, ptr(&idx), ptr(&scores), ptr(&n32), ptr(&k32))
}

// TopKRows enqueues TopK for `rows` rows at once: row r of scores [rows,
// stride] is ranked over its first ns[r] entries (ns int32 [rows], clamped
// to [0, stride]) and idx [rows, k] (int32) receives its min(k, ns[r]) best
// indices in TopK's order, the rest of the row −1. 1 <= k <= OpsMaxTopK.
func (c *Ctx) TopKRows(idx, scores, ns DevicePtr, rows, stride, k int, s Stream) error {
	if !pos32(rows, stride, k) || k > OpsMaxTopK {
		return opErr("TopKRows", "rows %d, stride %d, k %d: want positive sizes and k <= %d", rows, stride, k, OpsMaxTopK)
	}
	if !nonNull(idx, scores, ns) {
		return opErr("TopKRows", "null idx, scores or ns")
	}
	st, k32 := int32(stride), int32(k)
	return c.launchOp("topk_rows", Dim3{X: uint32(rows)}, Dim3{X: 1024}, 0, s, ptr(&idx), ptr(&scores), ptr(&ns), ptr(&st), ptr(&k32))
}

// Route enqueues compute.Backend.Route for `batch` tokens: logits
// [batch, experts], bias [experts] or 0, hash int32 [batch, k] (the tokens'
// tid2eid rows) or 0; ids int32 [batch, k], weights [batch, k]. A hash id
// outside [0, experts) makes that token's weights NaN (the device cannot
// return an error).
func (c *Ctx) Route(ids, weights, logits, bias, hash DevicePtr, batch, experts, k int, scale float32, s Stream) error {
	if !pos32(batch, experts, k) || k > experts || experts > OpsMaxExperts {
		return opErr("Route", "batch %d, experts %d, k %d: want positive sizes, k <= experts <= %d", batch, experts, k, OpsMaxExperts)
	}
	if !nonNull(ids, weights, logits) {
		return opErr("Route", "null ids, weights or logits")
	}
	e, k32 := int32(experts), int32(k)
	return c.launchOp("route", Dim3{X: uint32(batch)}, Dim3{X: 32}, 16*experts, s,
		ptr(&ids), ptr(&weights), ptr(&logits), ptr(&bias), ptr(&hash), ptr(&e), ptr(&k32), ptr(&scale))
}

// SwiGLU enqueues h[r, i] = silu(g[r, i])·u[r, i]·rowScale[r] over rows of
// width (rowScale 0 means 1); limit > 0 first clamps u to [−limit, limit] and
// g to (−∞, limit]. h may alias g or u.
func (c *Ctx) SwiGLU(h, g, u, rowScale DevicePtr, rows, width int, limit float32, s Stream) error {
	if !pos32(rows, width) || !nonNull(h, g, u) || limit < 0 || limit != limit {
		return opErr("SwiGLU", "rows %d, width %d, limit %g: want positive sizes, limit >= 0 and non-null buffers", rows, width, limit)
	}
	r, w := int32(rows), int32(width)
	return c.launchOp("swiglu", gridFor(int64(rows)*int64(width)), Dim3{X: 256}, 0, s,
		ptr(&h), ptr(&g), ptr(&u), ptr(&rowScale), ptr(&r), ptr(&w), ptr(&limit))
}

// EmbedBF16 enqueues x [n, hc, dim] (float32) = row tokens[i] of the BF16
// table [vocab, dim], copied into all hc streams; tokens is int32 [n]. The
// device does not know vocab: the caller must have checked every token id.
func (c *Ctx) EmbedBF16(x, table, tokens DevicePtr, n, dim, hc int, s Stream) error {
	if !pos32(n, dim, hc) || !nonNull(x, table, tokens) {
		return opErr("EmbedBF16", "n %d, dim %d, hc %d: want positive sizes and non-null buffers", n, dim, hc)
	}
	n32, d, h := int32(n), int32(dim), int32(hc)
	return c.launchOp("embed_bf16", gridFor(int64(n)*int64(dim)), Dim3{X: 256}, 0, s,
		ptr(&x), ptr(&table), ptr(&tokens), ptr(&n32), ptr(&d), ptr(&h))
}

// Axpy enqueues y[i] += a·x[i] for n floats (n == 0 does nothing).
func (c *Ctx) Axpy(y, x DevicePtr, a float32, n int, s Stream) error {
	if n == 0 {
		return nil
	}
	if n < 0 || !nonNull(y, x) {
		return opErr("Axpy", "n %d, y %#x, x %#x: want n >= 0 and non-null buffers", n, y, x)
	}
	n64 := int64(n)
	return c.launchOp("axpy", gridFor(n64), Dim3{X: 256}, 0, s, ptr(&y), ptr(&x), ptr(&a), ptr(&n64))
}

// Scale enqueues y[i] *= a for n floats (n == 0 does nothing).
func (c *Ctx) Scale(y DevicePtr, a float32, n int, s Stream) error {
	if n == 0 {
		return nil
	}
	if n < 0 || y == 0 {
		return opErr("Scale", "n %d, y %#x: want n >= 0 and a non-null buffer", n, y)
	}
	n64 := int64(n)
	return c.launchOp("scale_f32", gridFor(n64), Dim3{X: 256}, 0, s, ptr(&y), ptr(&a), ptr(&n64))
}
