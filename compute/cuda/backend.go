package cuda

import (
	"fmt"

	"moxie/compute"
	"moxie/compute/cpu"
)

// Backend adapts a Device to compute.Backend so that the compliance suite
// (compute/computetest) runs on the GPU.
//
// Where each op runs:
//   - on the GPU: Linear and GroupedLinear (every format: FP8Block, MXFP8,
//     MXFP4, BF16, F32), through the kernels of Ctx.Linear. The weight lives in
//     device memory (uploaded by Bind); x is copied in and y copied out on
//     every call, so these calls measure correctness, not speed.
//   - on the CPU (compute/cpu, delegated): RMSNorm, HCMix, HCHeadPre,
//     HCCollapse, HCExpand, RoPE, Attention, CompressPool, IndexScores, Route,
//     SwiGLU.
//
// A device failure inside an op panics with the CUDA error, since
// compute.Backend has no error results. Not safe for concurrent use.
type Backend struct {
	dev   *Device
	cpu   *cpu.Backend
	arena *Arena
}

var _ compute.Backend = (*Backend)(nil)

// NewBackend reserves arenaBytes of device memory for bound weights and
// per-call scratch. Close releases it.
func NewBackend(dev *Device, arenaBytes int) (*Backend, error) {
	b := &Backend{dev: dev, cpu: cpu.New(0)}
	err := dev.Do(func(c *Ctx) error {
		var err error
		b.arena, err = c.NewArena(arenaBytes)
		return err
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// Close frees the backend's device memory; weights bound by it become invalid.
func (b *Backend) Close() error {
	return b.dev.Do(func(c *Ctx) error { return c.ReleaseArena(b.arena) })
}

// Name implements compute.Backend.
func (b *Backend) Name() string { return "cuda(" + b.dev.Info().Name + ")" }

type weight struct {
	dw  *DeviceWeight
	cpu compute.Weight
}

func (w *weight) Rows() int { return w.dw.Rows }
func (w *weight) Cols() int { return w.dw.Cols }

// Bind implements compute.Backend: validates d and uploads its bytes. The CPU
// view of d is kept too, for ops delegated to the CPU backend.
func (b *Backend) Bind(d compute.WeightData) (compute.Weight, error) {
	cw, err := b.cpu.Bind(d)
	if err != nil {
		return nil, err
	}
	w := &weight{cpu: cw}
	err = b.dev.Do(func(c *Ctx) error {
		var err error
		w.dw, err = c.UploadWeight(b.arena, d)
		return err
	})
	if err != nil {
		return nil, err
	}
	return w, nil
}

func asWeight(op string, w compute.Weight) *weight {
	cw, ok := w.(*weight)
	if !ok {
		panic(fmt.Sprintf("cuda.%s: weight %T was not bound by the CUDA backend", op, w))
	}
	return cw
}

// linear runs one (grouped) projection on the device with host x and y.
func (b *Backend) linear(op string, w *weight, y, x []float32, batch, groups int) {
	err := b.dev.Do(func(c *Ctx) error {
		dx, err := b.arena.Alloc(4 * len(x))
		if err != nil {
			return err
		}
		defer b.arena.Free(dx)
		dy, err := b.arena.Alloc(4 * len(y))
		if err != nil {
			return err
		}
		defer b.arena.Free(dy)
		if err := c.CopyFloatsToDevice(dx, x); err != nil {
			return err
		}
		if err := c.LinearWith(w.dw, dy, dx, batch, groups, LinearVariant{}, c.Stream()); err != nil {
			return err
		}
		return c.CopyFloatsFromDevice(y, dy)
	})
	if err != nil {
		panic(fmt.Sprintf("cuda.%s: %v", op, err))
	}
}

// Linear implements compute.Backend (on the GPU).
func (b *Backend) Linear(wt compute.Weight, y, x []float32, batch int) {
	w := asWeight("Linear", wt)
	if batch <= 0 || len(y) != batch*w.dw.Rows || len(x) != batch*w.dw.Cols {
		panic(fmt.Sprintf("cuda.Linear: weight [%d, %d], batch %d: len(y)=%d len(x)=%d", w.dw.Rows, w.dw.Cols, batch, len(y), len(x)))
	}
	b.linear("Linear", w, y, x, batch, 1)
}

// GroupedLinear implements compute.Backend (on the GPU).
func (b *Backend) GroupedLinear(wt compute.Weight, y, x []float32, batch, groups int) {
	w := asWeight("GroupedLinear", wt)
	if batch <= 0 || groups <= 0 || w.dw.Rows%groups != 0 || len(y) != batch*w.dw.Rows || len(x) != batch*groups*w.dw.Cols {
		panic(fmt.Sprintf("cuda.GroupedLinear: weight [%d, %d], batch %d, groups %d: len(y)=%d len(x)=%d", w.dw.Rows, w.dw.Cols, batch, groups, len(y), len(x)))
	}
	b.linear("GroupedLinear", w, y, x, batch, groups)
}

// RMSNorm implements compute.Backend (delegated to the CPU).
func (b *Backend) RMSNorm(y, x, w []float32, dim int, eps float32) { b.cpu.RMSNorm(y, x, w, dim, eps) }

func (b *Backend) hcCPU(p *compute.HCParams) *compute.HCParams {
	q := *p
	q.Fn = asWeight("HCMix", p.Fn).cpu
	return &q
}

// HCMix implements compute.Backend (delegated to the CPU).
func (b *Backend) HCMix(pre, post, comb, x []float32, p *compute.HCParams, batch int) {
	b.cpu.HCMix(pre, post, comb, x, b.hcCPU(p), batch)
}

// HCHeadPre implements compute.Backend (delegated to the CPU).
func (b *Backend) HCHeadPre(pre, x []float32, p *compute.HCParams, batch int) {
	b.cpu.HCHeadPre(pre, x, b.hcCPU(p), batch)
}

// HCCollapse implements compute.Backend (delegated to the CPU).
func (b *Backend) HCCollapse(y, x, pre []float32, hc, dim, batch int) {
	b.cpu.HCCollapse(y, x, pre, hc, dim, batch)
}

// HCExpand implements compute.Backend (delegated to the CPU).
func (b *Backend) HCExpand(out, x, o, post, comb []float32, hc, dim, batch int) {
	b.cpu.HCExpand(out, x, o, post, comb, hc, dim, batch)
}

// RoPE implements compute.Backend (delegated to the CPU).
func (b *Backend) RoPE(x []float32, pos []int, freq []float32, rowLen, dim int, inverse bool) {
	b.cpu.RoPE(x, pos, freq, rowLen, dim, inverse)
}

// Attention implements compute.Backend (delegated to the CPU).
func (b *Backend) Attention(o, q, kv, sinks []float32, nKeys, heads, dim int, scale float32) {
	b.cpu.Attention(o, q, kv, sinks, nKeys, heads, dim, scale)
}

// CompressPool implements compute.Backend (delegated to the CPU).
func (b *Backend) CompressPool(out, kv, z []float32, slots, width int) {
	b.cpu.CompressPool(out, kv, z, slots, width)
}

// IndexScores implements compute.Backend (delegated to the CPU).
func (b *Backend) IndexScores(s, q, w, keys []float32, nKeys, heads, dim int) {
	b.cpu.IndexScores(s, q, w, keys, nKeys, heads, dim)
}

// Route implements compute.Backend (delegated to the CPU).
func (b *Backend) Route(ids []int, weights, logits, bias []float32, hash []int, scale float32) {
	b.cpu.Route(ids, weights, logits, bias, hash, scale)
}

// SwiGLU implements compute.Backend (delegated to the CPU).
func (b *Backend) SwiGLU(h, g, u, rowScale []float32, width int, limit float32) {
	b.cpu.SwiGLU(h, g, u, rowScale, width, limit)
}
