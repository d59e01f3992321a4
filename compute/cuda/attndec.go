package cuda

import (
	_ "embed"
	"fmt"
	"math"
	"strconv"
	"strings"
	"structs"
	"unsafe"
)

//go:embed kernels/attndec.cu
var attnDecSrc string

// AttnDecSource returns the CUDA source of the decode attention module
// (kernels/attndec.cu).
func AttnDecSource() string { return attnDecSrc }

// attnDecModuleName names the decode attention module among the device's
// modules.
const attnDecModuleName = "attndec"

// attnDecVariant is one tiling of the decode attention's partial kernel:
// G heads per block, key tiles of KT keys, NB key buffers (2: the next
// tile's copies in flight during the current one), at most MaxSplits key
// splits per query (kernels/attndec.cu ad_partial<G, D, KT, NB>).
type attnDecVariant struct {
	Name      string
	G, KT, NB int
	MaxSplits int
	dims      []int // the head widths it is instantiated for
}

// attnDecVariants lists the partial kernel's tilings; the first is the
// default of AttentionDecode. The others stay for the benchmark.
var attnDecVariants = []attnDecVariant{
	{Name: "g8k16", G: 8, KT: 16, NB: 1, MaxSplits: 64, dims: []int{128, 256, 512}},
	{Name: "g16k16", G: 16, KT: 16, NB: 1, MaxSplits: 64, dims: []int{128, 256, 512}},
	{Name: "g8k32", G: 8, KT: 32, NB: 1, MaxSplits: 32, dims: []int{128, 256, 512}},
	{Name: "g4k32", G: 4, KT: 32, NB: 1, MaxSplits: 32, dims: []int{256, 512}},
	{Name: "g8k16db", G: 8, KT: 16, NB: 2, MaxSplits: 64, dims: []int{128, 256, 512}},
}

// attnDecMaxSplits is AD_MAXS in kernels/attndec.cu.
const attnDecMaxSplits = 1024

// attnDecScratchSplits bounds the splits of every tiling and choice, so that
// AttentionDecodeScratchBytes covers them all.
const attnDecScratchSplits = 64

// attnDecThreads is AD_NT (and AD_NW warps) in kernels/attndec.cu.
const (
	attnDecThreads = 256
	attnDecWarps   = 8
)

func attnDecFind(name string) (attnDecVariant, bool) {
	for _, v := range attnDecVariants {
		if v.Name == name {
			return v, true
		}
	}
	return attnDecVariant{}, false
}

// fits reports whether v is instantiated for heads of width dim among heads.
func (v attnDecVariant) fits(heads, dim int) bool {
	if heads <= 0 || heads%v.G != 0 {
		return false
	}
	for _, d := range v.dims {
		if d == dim {
			return true
		}
	}
	return false
}

// kernel names v's partial kernel for heads of width dim.
func (v attnDecVariant) kernel(dim int) string { return fmt.Sprintf("attndec_%s_d%d", v.Name, dim) }

// shared is AD_SHARED(G, D, KT, NB): the partial kernel's dynamic shared
// memory in bytes.
func (v attnDecVariant) shared(dim int) int {
	return 16*(v.G*(dim/4)+v.NB*v.KT*(dim/4+1)) + 4*(attnDecWarps*v.G*v.KT+v.KT*v.G)
}

// splits is the number of key splits per query for at most maxKeys keys.
func (v attnDecVariant) splits(maxKeys int) int {
	return max(1, min(v.MaxSplits, (maxKeys+v.KT-1)/v.KT))
}

// attnDecCombineParts is the combine kernel's split parts (SP): the splits
// of one (head, query) are summed by SP threads per float4 column, at most
// 1024 threads.
func attnDecCombineParts(dim int) int { return max(1, min(8, 1024/(dim/4))) }

// DecodeAttentionFits reports whether AttentionDecode takes `heads` heads of
// width dim: dim 128, 256 or 512 and heads a multiple of 8
// (DeepSeek-V4-Flash: 64 heads of 512).
func DecodeAttentionFits(heads, dim int) bool { return attnDecVariants[0].fits(heads, dim) }

// AttentionDecodeScratchBytes is the size in bytes of the scratch buffer
// AttentionDecode needs for T queries of `heads` heads of width dim with at
// most maxKeys keys each (any variant): 4·T·splits·heads·(dim+2) with
// splits ≤ 64 (the key splits per query). 0 for non-positive sizes.
func AttentionDecodeScratchBytes(heads, dim, T, maxKeys int) int {
	if heads <= 0 || dim <= 0 || T <= 0 || maxKeys <= 0 {
		return 0
	}
	n := 0
	for _, v := range attnDecVariants {
		n = max(n, 4*T*v.splits(maxKeys)*heads*(dim+2))
	}
	return n
}

// attnDecArgs mirrors struct ADArgs in kernels/attndec.cu.
type attnDecArgs struct {
	_                                                             structs.HostLayout
	O, Q, Ring, Comp, Idx, Sinks, Pos, Part                       uint64
	RingRows, Window, Ratio, IdxStride, TopK, Heads, Dim, MaxKeys int32
	Splits, NQ, KT, RoPENF                                        int32
	Scale, Pad2                                                   float32
	RoPEFreq                                                      uint64
	QPrep                                                         int32
	QEps                                                          float32
	Early, Pad3                                                   int32
}

// qprep flags of ADArgs (AD_QNORM, AD_QROPE in kernels/attndec.cu).
const (
	attnDecQNorm = 1
	attnDecQRoPE = 2
)

// attnDecModule returns the device's decode attention module, compiling (or
// loading from the disk cache) it on first use and raising its partial
// kernels' dynamic shared-memory limit to what they need.
func (c *Ctx) attnDecModule() (*Module, error) {
	m, err := c.namedModule(attnDecModuleName, attnDecSrc, func(m *Module) error {
		for _, v := range attnDecVariants {
			for _, dim := range v.dims {
				k, err := m.Kernel(v.kernel(dim))
				if err != nil {
					return err
				}
				if err := c.raiseDynamicShared(k, v.shared(dim)); err != nil {
					return err
				}
			}
		}
		_, err := m.Kernel("attndec_combine")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cuda attndec module: %w", err)
	}
	return m, nil
}

// LoadAttnDec compiles (or loads from the disk cache) the decode attention
// module now, so that the first AttentionDecode does not: call it before
// capturing a CUDA graph that contains AttentionDecode (loading a module is
// not a stream operation).
func (c *Ctx) LoadAttnDec() error {
	_, err := c.attnDecModule()
	return err
}

// AttentionDecode enqueues the same attention as Fwd.AttentionRing (same
// arguments and semantics: window ring, compressed entries all (Idx == 0)
// or selected by Idx, sinks in the denominator, at most MaxKeys keys per
// query), split over the keys for decode (T = 1..4; any T works): two
// launches, a partial kernel over (heads/8, key splits, T) blocks and a
// combine kernel over (heads, T) blocks that merges the splits in a fixed
// order (deterministic). A negative entry in Idx's first
// min(TopK, (t+1)/Ratio) columns is padding and is skipped.
//
// It needs DecodeAttentionFits(Heads, Dim) and MaxKeys ≥ 1 (the grid is
// sized from MaxKeys, never from the positions, so a captured graph replays
// at every position up to MaxKeys keys); HeadsPerBlock is ignored. scratch
// is a device buffer of at least AttentionDecodeScratchBytes(Heads, Dim, T,
// MaxKeys) bytes, owned by the caller, that no other work in flight may use
// (it holds the partial results between the two launches; nothing is
// allocated at launch time). Bad sizes are errors naming the argument.
func (c *Ctx) AttentionDecode(p AttnParams, scratch DevicePtr, s Stream) error {
	return c.attentionDecode(p, scratch, attnDecVariants[0].Name, s)
}

// AttentionDecodeInvRoPE is AttentionDecode followed by the inverse rotary
// embedding of its output, RoPE(p.O, p.Pos, freq, p.T, p.Heads·p.Dim,
// p.Dim, nfreq, true), in AttentionDecode's two launches: the combine
// kernel rotates the last 2·nfreq dims of every head's output by the angle
// −float32(Pos[i])·freq[k] (pair k: dims Dim−2·nfreq+2k and +1) as it writes
// them, with the rope kernel's float32 and float64 operations, so the
// results are those of the two calls (the same bits where the compiler
// contracts the rotation alike in both kernels). freq is float32 [nfreq]
// device memory owned by the caller, 1 ≤ nfreq ≤ Dim/2; the rotation's
// positions are p.Pos. Everything else is AttentionDecode's contract
// (graph-capturable; bad sizes are errors naming the argument).
func (c *Ctx) AttentionDecodeInvRoPE(p AttnParams, freq DevicePtr, nfreq int, scratch DevicePtr, s Stream) error {
	return c.AttentionDecodeInvRoPEWith(p, freq, nfreq, scratch, AttnDecChoice{}, s)
}

// AttentionDecodeNormQ is AttentionDecodeInvRoPE on queries that p.Q holds
// before their per-head RMSNorm and RoPE: the partial kernel normalizes
// each head's Dim values (no weight, ε eps; 1/sqrtf(Σv²/Dim + eps) as
// RowOp.Norm forms it, the sum in another order) and rotates their last
// 2·nfreq dims forward by the angle float32(Pos[i])·freq[k] (RowOp's
// rotation) as it stages them, then the combine rotates the output back
// with the same table. So the results are those of RowOps([{Y: Q, X: Q,
// Rows: T·Heads, Dim, Heads, Norm: true, Eps: eps, NFreq: nfreq, Freq:
// freq, Pos}]) followed by AttentionDecodeInvRoPE, within rounding; p.Q is
// not written. eps must be positive and finite; everything else is
// AttentionDecodeInvRoPE's contract.
func (c *Ctx) AttentionDecodeNormQ(p AttnParams, eps float32, freq DevicePtr, nfreq int, scratch DevicePtr, s Stream) error {
	r := attnDecRoPE{freq: freq, nf: nfreq}
	if err := r.check(p.Dim, true); err != nil {
		return err
	}
	if !(eps > 0) || math.IsInf(float64(eps), 0) {
		return fmt.Errorf("cuda attndec: query norm epsilon %g, want a positive finite value", eps)
	}
	r.qprep, r.qeps = attnDecQNorm|attnDecQRoPE, eps
	return c.attentionDecodeVR(p, scratch, attnDecVariants[0], r, s)
}

// AttnDecChoice names a tiling of decode attention's partial kernel (one
// of attnDecVariants: "g8k16", "g16k16", "g8k32", "g4k32", "g8k16db") and
// its most key splits per query (1..64; 0 keeps the tiling's own). The zero
// value is AttentionDecode's default. Every choice computes the same
// attention; the splits change only the order of the combine's sums.
type AttnDecChoice struct {
	Variant   string
	MaxSplits int
	// Early: what the caller promises about the launches before this one
	// (the zero value promises nothing).
	Early AttnDecEarly
}

// AttnDecEarly are promises about the memory an AttentionDecodeInvRoPEWith
// launch reads, which let its partial kernel start reading before it waits
// for the launch before it on the stream (programmatic dependent launch).
// A promise that does not hold is a race: wrong results now and then.
type AttnDecEarly int32

const (
	// AttnEarlyKeys: p.Pos and the window ring p.Ring were last written
	// two or more launches back on the stream, or before a dependency that
	// is not programmatic (an event wait, a host synchronisation): the
	// kernel reads the positions and copies its first tile of ring rows
	// before its wait.
	AttnEarlyKeys AttnDecEarly = 1
	// AttnEarlyComp (with AttnEarlyKeys): p.Comp too; used where p.Idx is 0
	// (every entry a key).
	AttnEarlyComp AttnDecEarly = 2
)

// ParseAttnDecChoice reads "NAME" or "NAME:SPLITS" (e.g. "g8k16db:16"); ""
// is the default choice.
func ParseAttnDecChoice(v string) (AttnDecChoice, error) {
	if v == "" {
		return AttnDecChoice{}, nil
	}
	name, sp, hasSplits := strings.Cut(v, ":")
	if _, ok := attnDecFind(name); !ok {
		names := make([]string, len(attnDecVariants))
		for i, x := range attnDecVariants {
			names[i] = x.Name
		}
		return AttnDecChoice{}, fmt.Errorf("cuda attndec: unknown tiling %q (want one of %s, optionally :SPLITS)", name, strings.Join(names, ", "))
	}
	ch := AttnDecChoice{Variant: name}
	if hasSplits {
		n, err := strconv.Atoi(sp)
		if err != nil || n < 1 || n > attnDecScratchSplits {
			return AttnDecChoice{}, fmt.Errorf("cuda attndec: splits %q in %q, want an integer 1..%d", sp, v, attnDecScratchSplits)
		}
		ch.MaxSplits = n
	}
	return ch, nil
}

// variant resolves ch to its tiling with its splits.
func (ch AttnDecChoice) variant() (attnDecVariant, error) {
	if ch.Variant == "" {
		return attnDecVariants[0], nil
	}
	v, ok := attnDecFind(ch.Variant)
	if !ok {
		return v, fmt.Errorf("cuda attndec: unknown tiling %q", ch.Variant)
	}
	if ch.MaxSplits != 0 {
		if ch.MaxSplits < 0 || ch.MaxSplits > attnDecScratchSplits {
			return v, fmt.Errorf("cuda attndec: %d splits, want 1..%d", ch.MaxSplits, attnDecScratchSplits)
		}
		v.MaxSplits = ch.MaxSplits
	}
	return v, nil
}

// Fits reports whether ch's tiling takes `heads` heads of width dim (as
// DecodeAttentionFits does for the default).
func (ch AttnDecChoice) Fits(heads, dim int) bool {
	v, err := ch.variant()
	return err == nil && v.fits(heads, dim)
}

// AttentionDecodeInvRoPEWith is AttentionDecodeInvRoPE with the partial
// kernel's tiling and splits ch (the same contract; the scratch size of
// AttentionDecodeScratchBytes covers every choice).
func (c *Ctx) AttentionDecodeInvRoPEWith(p AttnParams, freq DevicePtr, nfreq int, scratch DevicePtr, ch AttnDecChoice, s Stream) error {
	v, err := ch.variant()
	if err != nil {
		return err
	}
	if ch.Early&^(AttnEarlyKeys|AttnEarlyComp) != 0 || ch.Early == AttnEarlyComp {
		return fmt.Errorf("cuda attndec: early promises %#x: want AttnEarlyKeys, optionally with AttnEarlyComp", int32(ch.Early))
	}
	r := attnDecRoPE{freq: freq, nf: nfreq, early: ch.Early}
	if err := r.check(p.Dim, true); err != nil {
		return err
	}
	return c.attentionDecodeVR(p, scratch, v, r, s)
}

// attentionDecode is AttentionDecode with the named partial-kernel variant.
func (c *Ctx) attentionDecode(p AttnParams, scratch DevicePtr, variant string, s Stream) error {
	v, ok := attnDecFind(variant)
	if !ok {
		return fmt.Errorf("cuda attndec: unknown variant %q", variant)
	}
	return c.attentionDecodeV(p, scratch, v, s)
}

// attnDecRoPE is the inverse rotation the combine kernel applies: nf
// frequencies at freq (nf 0: none).
type attnDecRoPE struct {
	freq DevicePtr
	nf   int
	// qprep (attnDecQNorm|attnDecQRoPE) and qeps: the partial kernel
	// prepares the queries (AttentionDecodeNormQ); 0: stored as they are.
	qprep int32
	qeps  float32
	// early: the caller's promises (AttnDecChoice.Early).
	early AttnDecEarly
}

// check reports a rotation the combine cannot apply to heads of width dim
// (nf 0, no rotation, is an error only when one is required).
func (r attnDecRoPE) check(dim int, required bool) error {
	if r.nf < 0 || 2*r.nf > dim || (r.nf > 0 && r.freq == 0) || (required && r.nf == 0) {
		return fmt.Errorf("cuda attndec: inverse RoPE of %d frequencies (table %#x) for heads of width %d: want 1..width/2 and a table", r.nf, r.freq, dim)
	}
	return nil
}

// attentionDecodeV is AttentionDecode with partial-kernel variant v (its
// MaxSplits may differ from the listed one's; scratch must hold
// 4·T·v.splits(MaxKeys)·Heads·(Dim+2) bytes).
func (c *Ctx) attentionDecodeV(p AttnParams, scratch DevicePtr, v attnDecVariant, s Stream) error {
	return c.attentionDecodeVR(p, scratch, v, attnDecRoPE{}, s)
}

// attentionDecodeVR is attentionDecodeV with the combine's inverse
// rotation r.
func (c *Ctx) attentionDecodeVR(p AttnParams, scratch DevicePtr, v attnDecVariant, r attnDecRoPE, s Stream) error {
	if err := r.check(p.Dim, false); err != nil {
		return err
	}
	keysErr := p.checkKeys("attndec")
	switch {
	case v.MaxSplits <= 0 || v.MaxSplits > attnDecMaxSplits:
		return fmt.Errorf("cuda attndec: %d splits, want 1..%d", v.MaxSplits, attnDecMaxSplits)
	case p.O == 0 || p.Q == 0 || p.Ring == 0 || p.Sinks == 0 || p.Pos == 0 || scratch == 0:
		return fmt.Errorf("cuda attndec: nil buffer (o %#x q %#x ring %#x sinks %#x pos %#x scratch %#x)", p.O, p.Q, p.Ring, p.Sinks, p.Pos, scratch)
	case p.T <= 0 || p.T > 65535 || p.Window <= 0:
		return fmt.Errorf("cuda attndec: T %d (want 1..65535), window %d", p.T, p.Window)
	case !v.fits(p.Heads, p.Dim):
		return fmt.Errorf("cuda attndec: %d heads of width %d (want a multiple of %d heads of width %v)", p.Heads, p.Dim, v.G, v.dims)
	case keysErr != nil:
		return keysErr
	case p.MaxKeys <= 0 || p.MaxKeys > 1<<30:
		return fmt.Errorf("cuda attndec: max keys %d, want 1..%d", p.MaxKeys, 1<<30)
	}
	m, err := c.attnDecModule()
	if err != nil {
		return err
	}
	kp, err := m.Kernel(v.kernel(p.Dim))
	if err != nil {
		return err
	}
	kc, err := m.Kernel("attndec_combine")
	if err != nil {
		return err
	}
	S := v.splits(p.MaxKeys)
	a := attnDecArgs{O: uint64(p.O), Q: uint64(p.Q), Ring: uint64(p.Ring), Comp: uint64(p.Comp), Idx: uint64(p.Idx), Sinks: uint64(p.Sinks),
		Pos: uint64(p.Pos), Part: uint64(scratch), RingRows: int32(p.RingRows), Window: int32(p.Window), Ratio: int32(max(p.Ratio, 1)),
		IdxStride: int32(p.IdxStride), TopK: int32(p.TopK), Heads: int32(p.Heads), Dim: int32(p.Dim), MaxKeys: int32(p.MaxKeys),
		Splits: int32(S), NQ: int32(p.T), KT: int32(v.KT), Scale: p.Scale, RoPENF: int32(r.nf), RoPEFreq: uint64(r.freq),
		QPrep: r.qprep, QEps: r.qeps, Early: int32(r.early)}
	if err := c.Launch(kp, Dim3{X: uint32(p.Heads / v.G), Y: uint32(S), Z: uint32(p.T)}, Dim3{X: attnDecThreads}, v.shared(p.Dim), s, unsafe.Pointer(&a)); err != nil {
		return err
	}
	d4 := p.Dim / 4
	sp := attnDecCombineParts(p.Dim)
	return c.Launch(kc, Dim3{X: uint32(p.Heads), Y: uint32(p.T)}, Dim3{X: uint32(d4 * sp)}, 16*(sp-1)*d4, s, unsafe.Pointer(&a))
}
