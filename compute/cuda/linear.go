package cuda

import (
	_ "embed"
	"fmt"
	"math/bits"
	"strings"
	"structs"
	"unsafe"

	"moxie/compute"
)

var (
	//go:embed kernels/linear.cu
	linearSrc string
	//go:embed kernels/persist.cu
	persistOnlySrc string
)

// persistSource returns the persistent kernels' module source: linear.cu's
// definitions (everything before linear_fast) followed by persist.cu.
func persistSource() (string, error) {
	i := strings.Index(linearSrc, "template <int FMT, int NB, int RB, int U, int DEC>\n__device__ __forceinline__ void linear_fast")
	if i < 0 {
		return "", fmt.Errorf("cuda: kernels/linear.cu has no linear_fast template to split its definitions at")
	}
	return linearSrc[:i] + persistOnlySrc, nil
}

// LinearSource returns the CUDA source of the linear kernels' module.
func LinearSource() string { return linearSrc }

// DeviceWeight is a weight matrix resident in device memory in its stored
// format (the bytes of compute.WeightData, uploaded unchanged).
type DeviceWeight struct {
	Format     compute.Format
	Rows, Cols int
	Block      int       // FP8Block tile edge
	Data       DevicePtr // stored bytes
	Scale      DevicePtr // E8M0 scales (FP8Block, MXFP8, MXFP4); Data otherwise
	Bytes      int       // data + scale bytes (what one matvec must read)
}

// UploadWeight validates d, allocates its bytes in a and copies them to the
// device. The arena keeps the memory until it is freed or reset.
func (c *Ctx) UploadWeight(a *Arena, d compute.WeightData) (*DeviceWeight, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	w := &DeviceWeight{Format: d.Format, Rows: d.Rows, Cols: d.Cols, Block: d.Block, Bytes: len(d.Data) + len(d.Scale)}
	var err error
	if w.Data, err = a.Alloc(len(d.Data)); err != nil {
		return nil, err
	}
	if err = c.CopyToDevice(w.Data, d.Data); err != nil {
		return nil, err
	}
	w.Scale = w.Data
	if len(d.Scale) > 0 {
		if w.Scale, err = a.Alloc(len(d.Scale)); err != nil {
			return nil, err
		}
		if err = c.CopyToDevice(w.Scale, d.Scale); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// FreeWeight returns a weight's memory to the arena it came from.
func FreeWeight(a *Arena, w *DeviceWeight) error {
	err := a.Free(w.Data)
	if w.Scale != w.Data {
		if err2 := a.Free(w.Scale); err == nil {
			err = err2
		}
	}
	return err
}

// linArgs mirrors struct LinArgs in kernels/linear.cu.
type linArgs struct {
	_                                          structs.HostLayout
	W, S, X, Y                                 uint64
	Rows, Cols, Sdivr, Sdivc, Srshift, Scshift int32
	Sstride, Rpg, Xstride, Ystride, Batch      int32
}

func fmtInfo(f compute.Format) (name string, code int32, cpw int) {
	switch f {
	case compute.FP8Block:
		return "fp8", 1, 4
	case compute.MXFP4:
		return "mxfp4", 2, 8
	case compute.BF16:
		return "bf16", 3, 4
	case compute.F32:
		return "f32", 4, 4
	case compute.MXFP8:
		return "mxfp8", 5, 4
	}
	return "", 0, 0
}

// LinearVariant picks a kernel shape; zero fields mean automatic.
type LinearVariant struct {
	RB int // rows per block: 1 or 2 (2 when the row count allows)
	U  int // 32-word chunks each lane loads before use: 4 (8 for RB 1 in the benchmark set)
	KW int // warps per block splitting a row's columns (1..8)
	// Decode picks the E4M3 decoder of FP8Block, MXFP8 and MXFP4 weights:
	// DecodeAuto, DecodeCvt (hardware f16x2 conversion) or DecodeBits
	// (integer operations; maps the E4M3 NaN code to ±480 instead of NaN).
	Decode int
	// Width picks the fast kernel family for FP8Block, MXFP8 and MXFP4:
	// WidthAuto, WidthNarrow (4-byte words per lane) or WidthWide (16-byte
	// words; needs columns a multiple of 16, or 32 for MXFP4, and FP8 blocks
	// of at least 16). BF16 and F32 always use the narrow family.
	Width int
	// Generic forces the element-wise kernel.
	Generic bool
}

// Kernel families of the fast linear kernels.
const (
	WidthAuto = iota
	WidthNarrow
	WidthWide
	// WidthPersist: wide words, each warp walks a contiguous range of rows
	// with the next chunk's loads in flight (same shape rules as WidthWide).
	WidthPersist
)

// defaultWidth is the family WidthAuto selects where the shape allows it.
const defaultWidth = WidthNarrow

// wideOK reports whether w can use the wide kernels.
func wideOK(w *DeviceWeight) bool {
	switch w.Format {
	case compute.FP8Block:
		return w.Cols%16 == 0 && w.Block >= 16 && w.Block&(w.Block-1) == 0
	case compute.MXFP8:
		return w.Cols%16 == 0
	case compute.MXFP4:
		return w.Cols%32 == 0
	}
	return false
}

// E4M3 decoders of the fast linear kernels.
const (
	DecodeAuto = iota
	DecodeCvt
	DecodeBits
)

// defaultDecode is the decoder DecodeAuto selects.
const defaultDecode = DecodeCvt

func (c *Ctx) persistModule() (*Module, error) {
	if c.d.persist == nil {
		src, err := persistSource()
		if err != nil {
			return nil, err
		}
		m, err := c.Module("persist", src)
		if err != nil {
			return nil, err
		}
		c.d.persist = m
	}
	return c.d.persist, nil
}

// linearPersist launches the persistent kernels (wideOK(w) holds).
func (c *Ctx) linearPersist(w *DeviceWeight, y, x DevicePtr, batch, groups int, v LinearVariant, dec int, s Stream) error {
	m, err := c.persistModule()
	if err != nil {
		return err
	}
	name, code, _ := fmtInfo(w.Format)
	a := linArgs{W: uint64(w.Data), S: uint64(w.Scale), Rows: int32(w.Rows), Cols: int32(w.Cols), Sdivr: 1, Sdivc: 1,
		Rpg: int32(w.Rows / groups), Xstride: int32(groups * w.Cols), Ystride: int32(w.Rows)}
	switch w.Format {
	case compute.FP8Block:
		a.Sdivr, a.Sdivc, a.Sstride = int32(w.Block), int32(w.Block), int32((w.Cols+w.Block-1)/w.Block)
		a.Srshift = int32(bits.TrailingZeros(uint(w.Block)))
		a.Scshift = a.Srshift
	case compute.MXFP4, compute.MXFP8:
		a.Sdivc, a.Sstride, a.Scshift = 32, int32((w.Cols+31)/32), 5
	}
	rpg := w.Rows / groups
	warps := c.d.info.SMs * 32
	rb := v.RB
	if rb == 0 {
		rb = 1
		if rpg%2 == 0 && w.Rows/2 >= warps {
			rb = 2
		}
	}
	if rb != 1 && rb != 2 || rpg%rb != 0 {
		return fmt.Errorf("cuda linear: persistent kernels take RB 1 or 2 dividing %d rows per group, not %d", rpg, rb)
	}
	d := 0
	if dec == DecodeBits {
		d = 1
	}
	G := (w.Rows + rb - 1) / rb
	tw := min(G, warps)
	for b0 := 0; b0 < batch; b0 += maxNB {
		nb := min(batch-b0, maxNB)
		NB := 1
		for NB < nb {
			NB *= 2
		}
		a.Batch = int32(nb)
		a.X = uint64(x) + uint64(4*b0*groups*w.Cols)
		a.Y = uint64(y) + uint64(4*b0*w.Rows)
		dd := d
		if NB > 1 {
			dd = 0 // the integer decoder is instantiated for batch tile 1 only
		}
		key := linKey{code, NB, rb, 2, fmt.Sprint("linp", dd)}
		k := c.d.linKernels[key]
		if k == nil {
			if k, err = m.Kernel(fmt.Sprintf("linp_%s_b%d_r%d_u2_d%d", name, NB, rb, dd)); err != nil {
				return err
			}
			c.d.linKernels[key] = k
		}
		if err := c.Launch(k, Dim3{X: uint32((tw + 3) / 4)}, Dim3{X: 128}, 0, s, unsafe.Pointer(&a)); err != nil {
			return err
		}
	}
	return nil
}

// linKey names one instantiated fast linear kernel.
type linKey struct {
	format    int32
	nb, rb, u int
	suffix    string
}

// maxNB is the largest batch one launch of the fast kernels takes.
const maxNB = 16

// Linear enqueues y[b, r] = Σ_c W[r, c]·x[b, c] on s for device buffers
// x [batch, Cols] and y [batch, Rows] (float32).
func (c *Ctx) Linear(w *DeviceWeight, y, x DevicePtr, batch int, s Stream) error {
	return c.LinearWith(w, y, x, batch, 1, LinearVariant{}, s)
}

// GroupedLinear enqueues the grouped projection of compute.Backend
// (x [batch, groups·Cols], y [batch, Rows]).
func (c *Ctx) GroupedLinear(w *DeviceWeight, y, x DevicePtr, batch, groups int, s Stream) error {
	return c.LinearWith(w, y, x, batch, groups, LinearVariant{}, s)
}

// LinearWith is Linear/GroupedLinear with an explicit kernel variant.
func (c *Ctx) LinearWith(w *DeviceWeight, y, x DevicePtr, batch, groups int, v LinearVariant, s Stream) error {
	name, code, cpw := fmtInfo(w.Format)
	if name == "" {
		return fmt.Errorf("cuda linear: unknown weight format %v", w.Format)
	}
	if batch <= 0 || groups <= 0 || w.Rows%groups != 0 {
		return fmt.Errorf("cuda linear: batch %d, groups %d for a [%d, %d] weight", batch, groups, w.Rows, w.Cols)
	}
	m := c.d.linear
	if m == nil {
		var err error
		if m, err = c.Module("linear", linearSrc); err != nil {
			return err
		}
		c.d.linear = m
	}
	a := linArgs{W: uint64(w.Data), S: uint64(w.Scale), X: uint64(x), Y: uint64(y),
		Rows: int32(w.Rows), Cols: int32(w.Cols), Sdivr: 1, Sdivc: 1,
		Rpg: int32(w.Rows / groups), Xstride: int32(groups * w.Cols), Ystride: int32(w.Rows)}
	pow2 := true
	switch w.Format {
	case compute.FP8Block:
		a.Sdivr, a.Sdivc, a.Sstride = int32(w.Block), int32(w.Block), int32((w.Cols+w.Block-1)/w.Block)
		pow2 = w.Block&(w.Block-1) == 0
		a.Srshift = int32(bits.TrailingZeros(uint(w.Block)))
		a.Scshift = a.Srshift
	case compute.MXFP4, compute.MXFP8:
		a.Sdivc, a.Sstride, a.Scshift = 32, int32((w.Cols+31)/32), 5
	}
	rpg := w.Rows / groups
	generic := v.Generic || w.Cols%cpw != 0 || !pow2
	dec := v.Decode
	if dec == DecodeAuto {
		dec = defaultDecode
	}
	suffix := "_d0"
	if dec == DecodeBits && (w.Format == compute.FP8Block || w.Format == compute.MXFP8 || w.Format == compute.MXFP4) {
		suffix = "_d1"
	}
	width := v.Width
	if width == WidthAuto {
		width = defaultWidth
	}
	if width == WidthPersist && wideOK(w) && !generic {
		return c.linearPersist(w, y, x, batch, groups, v, dec, s)
	}
	wide := width == WidthWide && wideOK(w)
	prefix, defU := "linear", 4
	if wide {
		prefix, defU, cpw = "linw", 2, 4*cpw
	}
	for b0 := 0; b0 < batch; b0 += maxNB {
		nb := min(batch-b0, maxNB)
		a.Batch = int32(nb)
		a.X = uint64(x) + uint64(4*b0*groups*w.Cols)
		a.Y = uint64(y) + uint64(4*b0*w.Rows)
		if generic {
			k, err := m.Kernel("linear_generic")
			if err != nil {
				return err
			}
			if err := c.Launch(k, Dim3{X: uint32((w.Rows + 7) / 8)}, Dim3{X: 256}, 0, s, unsafe.Pointer(&a), unsafe.Pointer(&code)); err != nil {
				return err
			}
			continue
		}
		NB := 1
		for NB < nb {
			NB *= 2
		}
		rb := v.RB
		if rb == 0 {
			rb = 1
			if rpg%2 == 0 {
				rb = 2
			}
		}
		if rpg%rb != 0 {
			return fmt.Errorf("cuda linear: %d rows per group is not a multiple of RB %d", rpg, rb)
		}
		u := v.U
		if u == 0 {
			u = defU
		}
		kw := v.KW
		if kw == 0 {
			blocks := (w.Rows + rb - 1) / rb
			target := c.d.info.SMs * 48 // warps wanted in flight
			kw = min(max((target+blocks-1)/blocks, 1), 8)
			nw := w.Cols / cpw
			kw = min(kw, max((nw+32*u-1)/(32*u), 1))
		}
		key := linKey{code, NB, rb, u, prefix + suffix}
		k := c.d.linKernels[key]
		if k == nil {
			var err error
			if k, err = m.Kernel(fmt.Sprintf("%s_%s_b%d_r%d_u%d%s", prefix, name, NB, rb, u, suffix)); err != nil {
				return fmt.Errorf("no %s kernel for batch tile %d, RB %d, U %d: %w", name, NB, rb, u, err)
			}
			c.d.linKernels[key] = k
		}
		if err := c.Launch(k, Dim3{X: uint32((w.Rows + rb - 1) / rb)}, Dim3{X: uint32(32 * kw)}, 0, s, unsafe.Pointer(&a)); err != nil {
			return err
		}
	}
	return nil
}

// MultiLinear is a prepared launch of several projections of one format, each
// with its own weight, input and output (y_i = W_i·x_i, batch rows each), as
// one kernel: e.g. the w1 and w3 of a token's active experts. Its argument
// table lives in device memory, so the launch can be captured in a graph.
type MultiLinear struct {
	args    DevicePtr
	n       int
	kernel  *Kernel
	grid    Dim3
	block   Dim3
	weights int // bytes of all weights (for bandwidth figures)
}

// Bytes returns the stored bytes of all the launch's weights.
func (m *MultiLinear) Bytes() int { return m.weights }

// PrepareMultiLinear validates the set (same format, even row counts, columns
// a multiple of the decode width, batch <= 16) and uploads the argument table
// into a. ys[i] and xs[i] are device buffers [batch, Rows_i] and [batch, Cols_i].
func (c *Ctx) PrepareMultiLinear(a *Arena, ws []*DeviceWeight, ys, xs []DevicePtr, batch int, v LinearVariant) (*MultiLinear, error) {
	if len(ws) == 0 || len(ys) != len(ws) || len(xs) != len(ws) {
		return nil, fmt.Errorf("cuda multi-linear: %d weights, %d outputs, %d inputs", len(ws), len(ys), len(xs))
	}
	if batch <= 0 || batch > maxNB {
		return nil, fmt.Errorf("cuda multi-linear: batch %d, want 1..%d", batch, maxNB)
	}
	f := ws[0].Format
	name, _, cpw := fmtInfo(f)
	if name == "" || f == compute.F32 || f == compute.MXFP8 {
		return nil, fmt.Errorf("cuda multi-linear: no multi kernel for %v weights", f)
	}
	args := make([]linArgs, len(ws))
	maxRows, totalRows, bytes := 0, 0, 0
	for i, w := range ws {
		if w.Format != f || w.Rows%2 != 0 || w.Cols%cpw != 0 || (f == compute.FP8Block && w.Block&(w.Block-1) != 0) {
			return nil, fmt.Errorf("cuda multi-linear: weight %d (%v [%d, %d]) does not fit a %v set (even rows, columns a multiple of %d)", i, w.Format, w.Rows, w.Cols, f, cpw)
		}
		la := linArgs{W: uint64(w.Data), S: uint64(w.Scale), X: uint64(xs[i]), Y: uint64(ys[i]),
			Rows: int32(w.Rows), Cols: int32(w.Cols), Sdivr: 1, Sdivc: 1, Rpg: int32(w.Rows),
			Xstride: int32(w.Cols), Ystride: int32(w.Rows), Batch: int32(batch)}
		switch f {
		case compute.FP8Block:
			la.Sdivr, la.Sdivc, la.Sstride = int32(w.Block), int32(w.Block), int32((w.Cols+w.Block-1)/w.Block)
			la.Srshift = int32(bits.TrailingZeros(uint(w.Block)))
			la.Scshift = la.Srshift
		case compute.MXFP4:
			la.Sdivc, la.Sstride, la.Scshift = 32, int32((w.Cols+31)/32), 5
		}
		args[i] = la
		maxRows = max(maxRows, w.Rows)
		totalRows += w.Rows
		bytes += w.Bytes
	}
	NB := 1
	for NB < batch {
		NB *= 2
	}
	dec := v.Decode
	if dec == DecodeAuto {
		dec = defaultDecode
	}
	suffix := "_d0"
	if dec == DecodeBits && f != compute.BF16 {
		suffix = "_d1"
	}
	mod := c.d.linear
	if mod == nil {
		var err error
		if mod, err = c.Module("linear", linearSrc); err != nil {
			return nil, err
		}
		c.d.linear = mod
	}
	width := v.Width
	if width == WidthAuto {
		width = defaultWidth
	}
	wide := width == WidthWide && f != compute.BF16
	for _, w := range ws {
		wide = wide && wideOK(w)
	}
	persist := width == WidthPersist && f != compute.BF16
	for _, w := range ws {
		persist = persist && wideOK(w)
	}
	kname, u := fmt.Sprintf("linmulti_%s_b%d_r2_u4%s", name, NB, suffix), 4
	if wide {
		kname, u, cpw = fmt.Sprintf("linmultiw_%s_b%d_r2_u2%s", name, NB, suffix), 2, 4*cpw
	}
	if persist {
		pm, err := c.persistModule()
		if err != nil {
			return nil, err
		}
		mod = pm
		d := 0
		if suffix == "_d1" && NB == 1 {
			d = 1
		}
		kname = fmt.Sprintf("linpmulti_%s_b%d_r2_u2_d%d", name, NB, d)
	}
	k, err := mod.Kernel(kname)
	if err != nil {
		return nil, err
	}
	kw := v.KW
	if kw == 0 {
		blocks := totalRows / 2
		kw = min(max((c.d.info.SMs*48+blocks-1)/blocks, 1), 8)
		kw = min(kw, max((ws[0].Cols/cpw+32*u-1)/(32*u), 1))
	}
	m := &MultiLinear{n: len(ws), kernel: k, grid: Dim3{X: uint32(maxRows / 2), Y: uint32(len(ws))}, block: Dim3{X: uint32(32 * kw)}, weights: bytes}
	if persist { // warps per matrix: a share of the chip, at most one per row pair
		tw := min(maxRows/2, max(c.d.info.SMs*32/len(ws), 1))
		m.grid.X, m.block.X = uint32((tw+3)/4), 128
	}
	size := len(args) * int(unsafe.Sizeof(linArgs{}))
	if m.args, err = a.Alloc(size); err != nil {
		return nil, err
	}
	if err := c.CopyToDevice(m.args, unsafe.Slice((*byte)(unsafe.Pointer(&args[0])), size)); err != nil {
		return nil, err
	}
	return m, nil
}

// LaunchMultiLinear enqueues a prepared set on s.
func (c *Ctx) LaunchMultiLinear(m *MultiLinear, s Stream) error {
	return c.Launch(m.kernel, m.grid, m.block, 0, s, unsafe.Pointer(&m.args))
}
