package cuda

import (
	"fmt"
	"math"
	"unsafe"

	"moxie/compute"
)

// Backend adapts a Device to compute.Backend so that the compliance suite
// (compute/computetest) runs every op on the GPU: Linear and GroupedLinear
// through the kernels of Ctx.Linear, every other op through the same-named
// Ctx method of ops.go. Weights live in device memory (uploaded by Bind);
// each call copies its host inputs into scratch device memory, runs the
// kernel and copies the outputs back, so these calls measure correctness, not
// speed. Where the host arguments alias (RMSNorm's y and x, SwiGLU's h and g
// or u) the device buffers alias too.
//
// HCMix and HCHeadPre take Fn weights stored as F32 or BF16 only (the
// checkpoint's hc_*_fn tensors are F32).
//
// A device failure inside an op panics with the CUDA error, since
// compute.Backend has no error results; so do shape mismatches, like the CPU
// backend. Not safe for concurrent use.
type Backend struct {
	dev   *Device
	arena *Arena
}

var _ compute.Backend = (*Backend)(nil)

// NewBackend reserves arenaBytes of device memory for bound weights and
// per-call scratch. Close releases it.
func NewBackend(dev *Device, arenaBytes int) (*Backend, error) {
	b := &Backend{dev: dev}
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
	dw *DeviceWeight
}

func (w *weight) Rows() int { return w.dw.Rows }
func (w *weight) Cols() int { return w.dw.Cols }

// Bind implements compute.Backend: validates d and uploads its bytes.
func (b *Backend) Bind(d compute.WeightData) (compute.Weight, error) {
	w := &weight{}
	err := b.dev.Do(func(c *Ctx) error {
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

func check(op string, ok bool, format string, args ...any) {
	if !ok {
		panic(fmt.Sprintf("cuda."+op+": "+format, args...))
	}
}

// scratch is one call's device buffers, freed together.
type scratch struct {
	c    *Ctx
	a    *Arena
	live []DevicePtr
}

// alloc returns n bytes of scratch (0 for n == 0).
func (s *scratch) alloc(n int) (DevicePtr, error) {
	if n == 0 {
		return 0, nil
	}
	p, err := s.a.Alloc(n)
	if err != nil {
		return 0, err
	}
	s.live = append(s.live, p)
	return p, nil
}

// floats uploads x (nil or empty gives 0).
func (s *scratch) floats(x []float32) (DevicePtr, error) {
	p, err := s.alloc(4 * len(x))
	if err != nil || p == 0 {
		return p, err
	}
	return p, s.c.CopyFloatsToDevice(p, x)
}

// ints uploads x as int32 (nil or empty gives 0).
func (s *scratch) ints(op string, x []int) (DevicePtr, error) {
	if len(x) == 0 {
		return 0, nil
	}
	v := make([]int32, len(x))
	for i, e := range x {
		if e < math.MinInt32 || e > math.MaxInt32 {
			return 0, fmt.Errorf("%s: value %d at %d does not fit int32", op, e, i)
		}
		v[i] = int32(e)
	}
	p, err := s.alloc(4 * len(v))
	if err != nil {
		return 0, err
	}
	return p, s.c.CopyToDevice(p, unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v)))
}

// uploaded waits until the synchronous uploads have landed: pageable copies
// may still be in flight on the legacy stream when they return, and the
// compute stream does not wait for that stream.
func (s *scratch) uploaded() error { return s.c.Sync(Stream{}) }

// getInts downloads len(dst) int32 values into dst.
func (s *scratch) getInts(dst []int, p DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	v := make([]int32, len(dst))
	if err := s.c.CopyFromDevice(unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v)), p); err != nil {
		return err
	}
	for i, e := range v {
		dst[i] = int(e)
	}
	return nil
}

func (s *scratch) release() {
	for _, p := range s.live {
		_ = s.a.Free(p)
	}
}

// run executes f on the device thread with a fresh scratch set; any error
// panics naming op.
func (b *Backend) run(op string, f func(c *Ctx, s *scratch) error) {
	err := b.dev.Do(func(c *Ctx) error {
		s := &scratch{c: c, a: b.arena}
		defer s.release()
		return f(c, s)
	})
	if err != nil {
		panic(fmt.Sprintf("cuda.%s: %v", op, err))
	}
}

// outputs allocates len(n_i) floats of scratch for each size.
func (s *scratch) outputs(n ...int) ([]DevicePtr, error) {
	out := make([]DevicePtr, len(n))
	for i, v := range n {
		var err error
		if out[i], err = s.alloc(4 * v); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// uploadAll uploads each slice (nil gives 0) then waits for the copies.
func (s *scratch) uploadAll(xs ...[]float32) ([]DevicePtr, error) {
	out := make([]DevicePtr, len(xs))
	for i, x := range xs {
		var err error
		if out[i], err = s.floats(x); err != nil {
			return nil, err
		}
	}
	return out, s.uploaded()
}

func sameStart(a, b []float32) bool {
	return len(a) > 0 && len(b) > 0 && &a[0] == &b[0]
}

// linear runs one (grouped) projection on the device with host x and y.
func (b *Backend) linear(op string, w *weight, y, x []float32, batch, groups int) {
	b.run(op, func(c *Ctx, s *scratch) error {
		in, err := s.uploadAll(x)
		if err != nil {
			return err
		}
		out, err := s.outputs(len(y))
		if err != nil {
			return err
		}
		if err := c.LinearWith(w.dw, out[0], in[0], batch, groups, LinearVariant{}, c.Stream()); err != nil {
			return err
		}
		return c.CopyFloatsFromDevice(y, out[0])
	})
}

// Linear implements compute.Backend.
func (b *Backend) Linear(wt compute.Weight, y, x []float32, batch int) {
	w := asWeight("Linear", wt)
	check("Linear", batch > 0 && len(y) == batch*w.dw.Rows && len(x) == batch*w.dw.Cols,
		"weight [%d, %d], batch %d: len(y)=%d len(x)=%d", w.dw.Rows, w.dw.Cols, batch, len(y), len(x))
	b.linear("Linear", w, y, x, batch, 1)
}

// GroupedLinear implements compute.Backend.
func (b *Backend) GroupedLinear(wt compute.Weight, y, x []float32, batch, groups int) {
	w := asWeight("GroupedLinear", wt)
	check("GroupedLinear", batch > 0 && groups > 0 && w.dw.Rows%groups == 0 && len(y) == batch*w.dw.Rows && len(x) == batch*groups*w.dw.Cols,
		"weight [%d, %d], batch %d, groups %d: len(y)=%d len(x)=%d", w.dw.Rows, w.dw.Cols, batch, groups, len(y), len(x))
	b.linear("GroupedLinear", w, y, x, batch, groups)
}

// RMSNorm implements compute.Backend.
func (b *Backend) RMSNorm(y, x, w []float32, dim int, eps float32) {
	check("RMSNorm", dim > 0 && len(x)%dim == 0 && len(y) == len(x) && (w == nil || len(w) == dim),
		"dim %d, len(x)=%d len(y)=%d len(w)=%d", dim, len(x), len(y), len(w))
	if len(x) == 0 {
		return
	}
	b.run("RMSNorm", func(c *Ctx, s *scratch) error {
		in, err := s.uploadAll(x, w)
		if err != nil {
			return err
		}
		dy := in[0] // in place, like the host call
		if !sameStart(y, x) {
			out, err := s.outputs(len(y))
			if err != nil {
				return err
			}
			dy = out[0]
		}
		if err := c.RMSNorm(dy, in[0], in[1], len(x)/dim, dim, eps, c.Stream()); err != nil {
			return err
		}
		return c.CopyFloatsFromDevice(y, dy)
	})
}

// hc uploads an HCParams' vectors and returns the device form.
func (s *scratch) hc(op string, p *compute.HCParams) (*HC, error) {
	w := asWeight(op, p.Fn)
	base, err := s.floats(p.Base)
	if err != nil {
		return nil, err
	}
	scale, err := s.floats(p.Scale)
	if err != nil {
		return nil, err
	}
	return &HC{Fn: w.dw, Base: base, Scale: scale, HC: p.HC, Iters: p.Iters, Eps: p.Eps, NormEps: p.NormEps}, nil
}

// HCMix implements compute.Backend.
func (b *Backend) HCMix(pre, post, comb, x []float32, p *compute.HCParams, batch int) {
	hc := p.HC
	nm := (2 + hc) * hc
	check("HCMix", batch > 0 && p.Fn.Rows() == nm && len(p.Base) == nm && len(p.Scale) == 3 &&
		len(pre) == batch*hc && len(post) == batch*hc && len(comb) == batch*hc*hc && len(x) == batch*p.Fn.Cols(),
		"hc %d, fn [%d, %d], base %d, scale %d, pre %d, post %d, comb %d, x %d, batch %d",
		hc, p.Fn.Rows(), p.Fn.Cols(), len(p.Base), len(p.Scale), len(pre), len(post), len(comb), len(x), batch)
	b.run("HCMix", func(c *Ctx, s *scratch) error {
		dp, err := s.hc("HCMix", p)
		if err != nil {
			return err
		}
		in, err := s.uploadAll(x)
		if err != nil {
			return err
		}
		out, err := s.outputs(len(pre), len(post), len(comb))
		if err != nil {
			return err
		}
		if err := c.HCMix(out[0], out[1], out[2], in[0], dp, batch, c.Stream()); err != nil {
			return err
		}
		if err := c.CopyFloatsFromDevice(pre, out[0]); err != nil {
			return err
		}
		if err := c.CopyFloatsFromDevice(post, out[1]); err != nil {
			return err
		}
		return c.CopyFloatsFromDevice(comb, out[2])
	})
}

// HCHeadPre implements compute.Backend.
func (b *Backend) HCHeadPre(pre, x []float32, p *compute.HCParams, batch int) {
	hc := p.HC
	check("HCHeadPre", batch > 0 && p.Fn.Rows() == hc && len(p.Base) == hc && len(p.Scale) >= 1 && len(pre) == batch*hc && len(x) == batch*p.Fn.Cols(),
		"hc %d, fn [%d, %d], base %d, scale %d, pre %d, x %d, batch %d", hc, p.Fn.Rows(), p.Fn.Cols(), len(p.Base), len(p.Scale), len(pre), len(x), batch)
	b.run("HCHeadPre", func(c *Ctx, s *scratch) error {
		dp, err := s.hc("HCHeadPre", p)
		if err != nil {
			return err
		}
		in, err := s.uploadAll(x)
		if err != nil {
			return err
		}
		out, err := s.outputs(len(pre))
		if err != nil {
			return err
		}
		if err := c.HCHeadPre(out[0], in[0], dp, batch, c.Stream()); err != nil {
			return err
		}
		return c.CopyFloatsFromDevice(pre, out[0])
	})
}

// HCCollapse implements compute.Backend.
func (b *Backend) HCCollapse(y, x, pre []float32, hc, dim, batch int) {
	check("HCCollapse", hc > 0 && dim > 0 && batch > 0 && len(y) == batch*dim && len(x) == batch*hc*dim && len(pre) == batch*hc,
		"hc %d dim %d batch %d: len(y)=%d len(x)=%d len(pre)=%d", hc, dim, batch, len(y), len(x), len(pre))
	b.run("HCCollapse", func(c *Ctx, s *scratch) error {
		in, err := s.uploadAll(x, pre)
		if err != nil {
			return err
		}
		out, err := s.outputs(len(y))
		if err != nil {
			return err
		}
		if err := c.HCCollapse(out[0], in[0], in[1], hc, dim, batch, c.Stream()); err != nil {
			return err
		}
		return c.CopyFloatsFromDevice(y, out[0])
	})
}

// HCExpand implements compute.Backend.
func (b *Backend) HCExpand(out, x, o, post, comb []float32, hc, dim, batch int) {
	check("HCExpand", hc > 0 && dim > 0 && batch > 0 && len(out) == batch*hc*dim && len(x) == batch*hc*dim && len(o) == batch*dim &&
		len(post) == batch*hc && len(comb) == batch*hc*hc,
		"hc %d dim %d batch %d: len(out)=%d len(x)=%d len(o)=%d len(post)=%d len(comb)=%d",
		hc, dim, batch, len(out), len(x), len(o), len(post), len(comb))
	b.run("HCExpand", func(c *Ctx, s *scratch) error {
		in, err := s.uploadAll(x, o, post, comb)
		if err != nil {
			return err
		}
		res, err := s.outputs(len(out))
		if err != nil {
			return err
		}
		if err := c.HCExpand(res[0], in[0], in[1], in[2], in[3], hc, dim, batch, c.Stream()); err != nil {
			return err
		}
		return c.CopyFloatsFromDevice(out, res[0])
	})
}

// RoPE implements compute.Backend.
func (b *Backend) RoPE(x []float32, pos []int, freq []float32, rowLen, dim int, inverse bool) {
	r := 2 * len(freq)
	check("RoPE", dim > 0 && r <= dim && rowLen > 0 && rowLen%dim == 0 && len(x) == len(pos)*rowLen,
		"len(x)=%d rows %d rowLen %d dim %d rope dims %d", len(x), len(pos), rowLen, dim, r)
	if len(pos) == 0 || len(freq) == 0 {
		return
	}
	b.run("RoPE", func(c *Ctx, s *scratch) error {
		dpos, err := s.ints("RoPE pos", pos)
		if err != nil {
			return err
		}
		in, err := s.uploadAll(x, freq)
		if err != nil {
			return err
		}
		if err := c.RoPE(in[0], dpos, in[1], len(pos), rowLen, dim, len(freq), inverse, c.Stream()); err != nil {
			return err
		}
		return c.CopyFloatsFromDevice(x, in[0])
	})
}

// Attention implements compute.Backend.
func (b *Backend) Attention(o, q, kv, sinks []float32, nKeys, heads, dim int, scale float32) {
	check("Attention", nKeys >= 0 && len(o) == heads*dim && len(q) == heads*dim && len(kv) >= nKeys*dim && len(sinks) == heads,
		"heads %d dim %d keys %d: len(o)=%d len(q)=%d len(kv)=%d len(sinks)=%d", heads, dim, nKeys, len(o), len(q), len(kv), len(sinks))
	b.run("Attention", func(c *Ctx, s *scratch) error {
		in, err := s.uploadAll(q, kv[:nKeys*dim], sinks)
		if err != nil {
			return err
		}
		out, err := s.outputs(len(o))
		if err != nil {
			return err
		}
		if err := c.Attention(out[0], in[0], in[1], in[2], nKeys, heads, dim, scale, c.Stream()); err != nil {
			return err
		}
		return c.CopyFloatsFromDevice(o, out[0])
	})
}

// CompressPool implements compute.Backend.
func (b *Backend) CompressPool(out, kv, z []float32, slots, width int) {
	check("CompressPool", slots > 0 && width > 0 && len(out) == width && len(kv) == slots*width && len(z) == slots*width,
		"slots %d width %d: len(out)=%d len(kv)=%d len(z)=%d", slots, width, len(out), len(kv), len(z))
	b.run("CompressPool", func(c *Ctx, s *scratch) error {
		in, err := s.uploadAll(kv, z)
		if err != nil {
			return err
		}
		res, err := s.outputs(width)
		if err != nil {
			return err
		}
		if err := c.CompressPool(res[0], in[0], in[1], slots, width, c.Stream()); err != nil {
			return err
		}
		return c.CopyFloatsFromDevice(out, res[0])
	})
}

// IndexScores implements compute.Backend.
func (b *Backend) IndexScores(sc, q, w, keys []float32, nKeys, heads, dim int) {
	check("IndexScores", nKeys >= 0 && len(sc) == nKeys && len(q) == heads*dim && len(w) == heads && len(keys) >= nKeys*dim,
		"keys %d heads %d dim %d: len(s)=%d len(q)=%d len(w)=%d len(keys)=%d", nKeys, heads, dim, len(sc), len(q), len(w), len(keys))
	if nKeys == 0 {
		return
	}
	b.run("IndexScores", func(c *Ctx, s *scratch) error {
		in, err := s.uploadAll(q, w, keys[:nKeys*dim])
		if err != nil {
			return err
		}
		res, err := s.outputs(nKeys)
		if err != nil {
			return err
		}
		if err := c.IndexScores(res[0], in[0], in[1], in[2], nKeys, heads, dim, c.Stream()); err != nil {
			return err
		}
		return c.CopyFloatsFromDevice(sc, res[0])
	})
}

// Route implements compute.Backend.
func (b *Backend) Route(ids []int, weights, logits, bias []float32, hash []int, scale float32) {
	k := len(ids)
	check("Route", k > 0 && len(weights) == k && k <= len(logits) && (bias == nil || len(bias) == len(logits)) && (hash == nil || len(hash) == k),
		"k %d: len(weights)=%d len(logits)=%d len(bias)=%d len(hash)=%d", k, len(weights), len(logits), len(bias), len(hash))
	for i, e := range hash {
		check("Route", e >= 0 && e < len(logits), "hash[%d] = %d, want an expert in [0, %d)", i, e, len(logits))
	}
	b.run("Route", func(c *Ctx, s *scratch) error {
		dh, err := s.ints("Route hash", hash)
		if err != nil {
			return err
		}
		in, err := s.uploadAll(logits, bias)
		if err != nil {
			return err
		}
		out, err := s.outputs(k, k)
		if err != nil {
			return err
		}
		if err := c.Route(out[0], out[1], in[0], in[1], dh, 1, len(logits), k, scale, c.Stream()); err != nil {
			return err
		}
		if err := s.getInts(ids, out[0]); err != nil {
			return err
		}
		return c.CopyFloatsFromDevice(weights, out[1])
	})
}

// SwiGLU implements compute.Backend.
func (b *Backend) SwiGLU(h, g, u, rowScale []float32, width int, limit float32) {
	check("SwiGLU", width > 0 && len(g)%width == 0 && len(u) == len(g) && len(h) == len(g) &&
		(rowScale == nil || len(rowScale) == len(g)/width),
		"width %d: len(h)=%d len(g)=%d len(u)=%d len(rowScale)=%d", width, len(h), len(g), len(u), len(rowScale))
	if len(g) == 0 {
		return
	}
	b.run("SwiGLU", func(c *Ctx, s *scratch) error {
		in, err := s.uploadAll(g, u, rowScale)
		if err != nil {
			return err
		}
		var dh DevicePtr
		switch {
		case sameStart(h, g):
			dh = in[0]
		case sameStart(h, u):
			dh = in[1]
		default:
			out, err := s.outputs(len(h))
			if err != nil {
				return err
			}
			dh = out[0]
		}
		if err := c.SwiGLU(dh, in[0], in[1], in[2], len(g)/width, width, limit, c.Stream()); err != nil {
			return err
		}
		return c.CopyFloatsFromDevice(h, dh)
	})
}
