package cuda

import (
	_ "embed"
	"fmt"
	"structs"
	"unsafe"
)

//go:embed kernels/attn.cu
var attnSrc string

// AttnSource returns the CUDA source of the prefill attention module
// (kernels/attn.cu).
func AttnSource() string { return attnSrc }

// attnModuleName names the prefill attention module among the device's modules.
const attnModuleName = "attn"

// Prefill attention tiling: kernels/attn.cu's AP_HB (heads per block), AP_KT
// (keys per tile), AP_NW (warps per block) and AP_SS (score row stride).
const (
	attnPHeads = 32
	attnPTile  = 32
	attnPWarps = 8
	attnPSS    = attnPTile + 8
)

// Prefill attention variants (kernels/attn.cu): attnLdsm (the default)
// splits each key tile into f16 parts once and reads the mma fragments with
// ldmatrix; attnSplit keeps the keys f32 and splits at every fragment load.
const (
	attnLdsm  = ""
	attnSplit = "split"
)

// attnPrefillShared is AP_SHARED(dim/8) (attnLdsm) or AP_SHARED_SPLIT(dim/8)
// (attnSplit) in kernels/attn.cu: the kernel's dynamic shared memory for
// heads of width dim, in bytes.
func attnPrefillShared(variant string, dim int) int {
	dw := dim / attnPWarps
	common := 4*attnPWarps*attnPHeads*attnPSS + 2*3*attnPHeads*attnPSS + 4*2*attnPHeads
	if variant == attnSplit {
		return 4*2*attnPWarps*attnPTile*(dw+8) + common
	}
	return 4*attnPWarps*attnPTile*dw + 2*2*attnPWarps*attnPTile*(dw+8) + common
}

// attnPrefillKernel names the variant's kernel for heads of width dim, or ""
// if none.
func attnPrefillKernel(variant string, dim int) string {
	switch dim {
	case 128, 256, 512:
		if variant == attnSplit {
			return fmt.Sprintf("attn_prefill_split_d%d", dim)
		}
		return fmt.Sprintf("attn_prefill_d%d", dim)
	}
	return ""
}

// PrefillAttentionFits reports whether AttentionPrefill takes `heads` heads
// of width dim: heads a multiple of 32 and dim one of 128, 256, 512
// (DeepSeek-V4-Flash: 64 heads of 512).
func PrefillAttentionFits(heads, dim int) bool {
	return heads > 0 && heads%attnPHeads == 0 && attnPrefillKernel(attnLdsm, dim) != ""
}

// attnPrefillArgs mirrors struct APArgs in kernels/attn.cu.
type attnPrefillArgs struct {
	_                                                         structs.HostLayout
	O, Q, Ring, Comp, Idx, Sinks, Pos                         uint64
	RingRows, Window, Ratio, IdxStride, TopK, Heads, Dim, Pad int32
	Scale                                                     float32
}

// attnModule returns the device's prefill attention module, compiling (or
// loading from the disk cache) it on first use and raising its kernels'
// dynamic shared-memory limit to what they need.
func (c *Ctx) attnModule() (*Module, error) {
	m, err := c.namedModule(attnModuleName, attnSrc, func(m *Module) error {
		for _, variant := range []string{attnLdsm, attnSplit} {
			for _, dim := range []int{128, 256, 512} {
				k, err := m.Kernel(attnPrefillKernel(variant, dim))
				if err != nil {
					return err
				}
				if err := c.raiseDynamicShared(k, attnPrefillShared(variant, dim)); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cuda attn module: %w", err)
	}
	return m, nil
}

// LoadAttn compiles (or loads from the disk cache) the prefill attention
// module now, so that the first AttentionPrefill does not: call it before
// capturing a CUDA graph that contains AttentionPrefill (loading a module is
// not a stream operation).
func (c *Ctx) LoadAttn() error {
	_, err := c.attnModule()
	return err
}

// AttentionPrefill enqueues the same attention as AttentionRing (same
// arguments, same semantics for T >= 1 queries) on tensor cores, for
// prefill chunks: one block per (query, 32 heads) reads each key once for
// its 32 heads, and Q·Kᵀ and P·V run as mma.sync with every float32 operand
// split into two f16 parts (three products, f32 accumulation; about 22
// significant bits per product, float32-level results). It needs PrefillAttentionFits(Heads, Dim)
// and |q|, |k| < 65504 (f16 range); MaxKeys and HeadsPerBlock are ignored
// (keys stream through shared memory, no key-count bound). A negative entry
// in Idx's first min(TopK, (t+1)/Ratio) columns is a padding entry and is
// skipped. Bad sizes are errors naming the argument.
func (f *Fwd) AttentionPrefill(c *Ctx, p AttnParams, s Stream) error {
	return f.attentionPrefill(c, p, attnLdsm, s)
}

// attentionPrefill is AttentionPrefill with the given kernel variant.
func (f *Fwd) attentionPrefill(c *Ctx, p AttnParams, variant string, s Stream) error {
	keysErr := p.checkKeys("attn_prefill")
	switch {
	case p.O == 0 || p.Q == 0 || p.Ring == 0 || p.Sinks == 0 || p.Pos == 0:
		return fmt.Errorf("cuda attn_prefill: nil buffer (o %#x q %#x ring %#x sinks %#x pos %#x)", p.O, p.Q, p.Ring, p.Sinks, p.Pos)
	case p.T <= 0 || p.T > 65535 || p.Window <= 0:
		return fmt.Errorf("cuda attn_prefill: T %d (want 1..65535), window %d", p.T, p.Window)
	case !PrefillAttentionFits(p.Heads, p.Dim):
		return fmt.Errorf("cuda attn_prefill: %d heads of width %d (want a multiple of %d heads of width 128, 256 or 512)", p.Heads, p.Dim, attnPHeads)
	case keysErr != nil:
		return keysErr
	}
	m, err := c.attnModule()
	if err != nil {
		return err
	}
	k, err := m.Kernel(attnPrefillKernel(variant, p.Dim))
	if err != nil {
		return err
	}
	a := attnPrefillArgs{O: uint64(p.O), Q: uint64(p.Q), Ring: uint64(p.Ring), Comp: uint64(p.Comp), Idx: uint64(p.Idx), Sinks: uint64(p.Sinks),
		Pos: uint64(p.Pos), RingRows: int32(p.RingRows), Window: int32(p.Window), Ratio: int32(max(p.Ratio, 1)),
		IdxStride: int32(p.IdxStride), TopK: int32(p.TopK), Heads: int32(p.Heads), Dim: int32(p.Dim), Scale: p.Scale}
	return c.Launch(k, Dim3{X: uint32(p.Heads / attnPHeads), Y: uint32(p.T)}, Dim3{X: 256}, attnPrefillShared(variant, p.Dim), s, unsafe.Pointer(&a))
}
