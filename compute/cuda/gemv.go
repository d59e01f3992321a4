package cuda

import (
	_ "embed"
	"fmt"
	"math/bits"
	"structs"
	"unsafe"

	"moxie/compute"
)

//go:embed kernels/gemv.cu
var gemvSrc string

// GemvSource returns the CUDA source of the one-token matrix-vector kernels
// (kernels/gemv.cu).
func GemvSource() string { return gemvSrc }

// GemvMax is the most matrices one Gemv launch takes.
const GemvMax = 8

// gemvR and gemvWarps are GEMV_R and GEMV_WARPS in kernels/gemv.cu.
const (
	gemvR     = 2
	gemvWarps = 8
)

// gemvMat and gemvArgs mirror struct GemvMat and GemvArgs in kernels/gemv.cu.
type gemvMat struct {
	_                                structs.HostLayout
	W, S, X, Y                       uint64
	Rows, Cols, Rpg, Bshift, Sstride int32
	Fmt, Wpr, Blk0                   int32
}

type gemvArgs struct {
	_ structs.HostLayout
	M [GemvMax]gemvMat
	N int32
	_ int32
}

// GemvProj is one product of a Gemv launch: Y [W.Rows] = W·X for X of
// Groups slices of W.Cols floats, row group g (W.Rows/Groups rows) reading
// slice g (Groups 0 or 1: plain). Buffers are float32 device memory owned by
// the caller; X 16-byte aligned; Y must not overlap another product's X or Y.
type GemvProj struct {
	W      *DeviceWeight
	Y, X   DevicePtr
	Groups int
}

// Gemv is a prepared launch of up to GemvMax one-token products (FP8 blocks
// or BF16 weights) as one kernel. Its arguments travel by value, so the
// launch can be captured in a CUDA graph.
type Gemv struct {
	args   gemvArgs
	kernel *Kernel
	grid   Dim3
	bytes  int
}

// Bytes returns the stored bytes of all the launch's weights.
func (g *Gemv) Bytes() int { return g.bytes }

// GemvVariant picks the loads in flight per lane and row (U: 2, 4 or 8; 0
// means 2) of a Gemv launch.
type GemvVariant struct{ U int }

// gemvWPR picks the warps splitting each row group's columns: enough warps
// over all rows to fill the device (about 16 per SM), at most 8, and only
// splits that leave every warp whole 32-lane steps.
func gemvWPR(rows, cols, cpl, sms int) int {
	w := 1
	for w < gemvWarps && (rows/gemvR)*w < 16*sms && cols%(2*w*32*cpl) == 0 {
		w *= 2
	}
	return w
}

// PrepareGemv validates the products and plans their launch: each weight
// FP8Block (a power-of-two block edge of at least 16, columns a multiple of
// 512) or BF16 (columns a multiple of 256), an even row count, rows per
// group a multiple of 2, and at most GemvMax products.
func (c *Ctx) PrepareGemv(ps []GemvProj, v GemvVariant) (*Gemv, error) {
	if len(ps) == 0 || len(ps) > GemvMax {
		return nil, fmt.Errorf("cuda gemv: %d products, want 1..%d", len(ps), GemvMax)
	}
	u := v.U
	if u == 0 {
		u = 2 // the H200's best on wo_a, wo_b and wq_a+wkv (BenchmarkGemv)
	}
	if u != 2 && u != 4 && u != 8 {
		return nil, fmt.Errorf("cuda gemv: U %d, want 2, 4 or 8", u)
	}
	g := &Gemv{}
	blocks := 0
	for i, p := range ps {
		w := p.W
		if w == nil || p.Y == 0 || p.X == 0 || p.X%16 != 0 {
			return nil, fmt.Errorf("cuda gemv: product %d: nil weight or buffers, or x %#x not 16-byte aligned", i, p.X)
		}
		groups := max(p.Groups, 1)
		m := gemvMat{W: uint64(w.Data), S: uint64(w.Scale), X: uint64(p.X), Y: uint64(p.Y), Rows: int32(w.Rows), Cols: int32(w.Cols)}
		var cpl int
		switch w.Format {
		case compute.FP8Block:
			if w.Block < 16 || w.Block&(w.Block-1) != 0 || w.Cols%512 != 0 {
				return nil, fmt.Errorf("cuda gemv: product %d: FP8 [%d, %d] block %d: want a power-of-two block of at least 16 and columns a multiple of 512", i, w.Rows, w.Cols, w.Block)
			}
			m.Fmt, cpl = 1, 16
			m.Bshift = int32(bits.TrailingZeros(uint(w.Block)))
			m.Sstride = int32((w.Cols + w.Block - 1) / w.Block)
		case compute.BF16:
			if w.Cols%256 != 0 {
				return nil, fmt.Errorf("cuda gemv: product %d: BF16 [%d, %d]: want columns a multiple of 256", i, w.Rows, w.Cols)
			}
			m.Fmt, cpl = 3, 8
		default:
			return nil, fmt.Errorf("cuda gemv: product %d: %v weights: want FP8 blocks or BF16", i, w.Format)
		}
		if w.Rows%groups != 0 || (w.Rows/groups)%gemvR != 0 {
			return nil, fmt.Errorf("cuda gemv: product %d: %d rows in %d groups: want whole groups of an even row count", i, w.Rows, groups)
		}
		m.Rpg = int32(w.Rows / groups)
		m.Wpr = int32(gemvWPR(w.Rows, w.Cols, cpl, c.d.info.SMs))
		m.Blk0 = int32(blocks)
		perBlock := (gemvWarps / int(m.Wpr)) * gemvR
		blocks += (w.Rows + perBlock - 1) / perBlock
		g.args.M[i] = m
		g.bytes += w.Bytes
	}
	g.args.N = int32(len(ps))
	g.grid = Dim3{X: uint32(blocks)}
	if err := c.loadKernels("gemv", gemvSrc, kernelRef{fmt.Sprintf("gemv_u%d", u), &g.kernel}); err != nil {
		return nil, err
	}
	return g, nil
}

// LaunchGemv enqueues a prepared launch on s.
func (c *Ctx) LaunchGemv(g *Gemv, s Stream) error {
	if g == nil || g.kernel == nil {
		return fmt.Errorf("cuda gemv: launch of an unprepared Gemv")
	}
	return c.Launch(g.kernel, g.grid, Dim3{X: 32 * gemvWarps}, 0, s, unsafe.Pointer(&g.args))
}
