package cuda

import (
	_ "embed"
	"fmt"
	"structs"
	"unsafe"

	"moxie/compute"
)

//go:embed kernels/linear.cu
var linearSrc string

// LinearSource returns the embedded CUDA source of the linear kernels.
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
	_                                                        structs.HostLayout
	W, S, X, Y                                               uint64
	Rows, Cols, Sdivr, Sdivc, Sstride, Rpg, Xstride, Ystride int32
	Batch                                                    int32
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
	// Generic forces the element-wise kernel.
	Generic bool
}

// linKey names one instantiated fast linear kernel.
type linKey struct {
	format    int32
	nb, rb, u int
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
	switch w.Format {
	case compute.FP8Block:
		a.Sdivr, a.Sdivc, a.Sstride = int32(w.Block), int32(w.Block), int32((w.Cols+w.Block-1)/w.Block)
	case compute.MXFP4, compute.MXFP8:
		a.Sdivc, a.Sstride = 32, int32((w.Cols+31)/32)
	}
	rpg := w.Rows / groups
	generic := v.Generic || w.Cols%cpw != 0
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
			u = 4
		}
		kw := v.KW
		if kw == 0 {
			blocks := (w.Rows + rb - 1) / rb
			target := c.d.info.SMs * 48 // warps wanted in flight
			kw = min(max((target+blocks-1)/blocks, 1), 8)
			nw := w.Cols / cpw
			kw = min(kw, max((nw+32*u-1)/(32*u), 1))
		}
		key := linKey{code, NB, rb, u}
		k := c.d.linKernels[key]
		if k == nil {
			var err error
			if k, err = m.Kernel(fmt.Sprintf("linear_%s_b%d_r%d_u%d", name, NB, rb, u)); err != nil {
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
