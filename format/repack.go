package format

import (
	"encoding/binary"
	"fmt"
	"math"
)

// FP8BlockTensor is an FP8-block weight as stored in a checkpoint: Q holds
// [Rows, Cols] E4M3fn bytes, Scale holds [ceil(Rows/Block), ceil(Cols/Block)] scale
// values of dtype ScaleDType, either F8E8M0 (one byte each, DeepSeek-V4 ".scale") or
// F32 (little-endian float32 multipliers, like "weight_scale_inv" checkpoints).
// Name is used in error messages only. The slices are only read.
type FP8BlockTensor struct {
	Name       string
	Rows, Cols int
	Block      int
	Q          []byte
	Scale      []byte
	ScaleDType DType
}

// RepackFP8BlockToMXFP8 converts the block scales of t to MXFP8 scales without
// touching the elements: the result is a fresh [Rows, Cols/32] E8M0 array with
// mxScale[r, g] = scale[r/Block, 32g/Block], and t.Q is reused unchanged as the
// MXFP8 element array. Every element then decodes bit-identically (DequantMXFP8
// with mxScale equals DequantFP8Block with t's scales).
//
// It refuses, with an error naming t.Name and the reason: a shape with Rows or Cols
// < 0, Rows*Cols overflowing int, or Block <= 0; Cols or Block not a multiple of 32 (a 32-group would straddle
// two source blocks or run past the row); len(Q) != Rows*Cols; a Scale length that
// does not match the block grid and ScaleDType; a ScaleDType other than F8E8M0 or
// F32; an E8M0 scale byte 0xFF (NaN); a float32 scale that is not exactly 2^e with
// e in [-127, 127] (NaN, Inf, zero, negative or non-power-of-two values included).
// Element bytes are not inspected: NaN codes (0x7F/0xFF) stay NaN in both layouts.
func RepackFP8BlockToMXFP8(t FP8BlockTensor) (mxScale []byte, err error) {
	fail := func(format string, args ...any) ([]byte, error) {
		return nil, fmt.Errorf("repack FP8-block tensor %q to MXFP8: "+format, append([]any{t.Name}, args...)...)
	}
	if !validShape(t.Rows, t.Cols) || t.Block <= 0 {
		return fail("bad shape rows=%d cols=%d block=%d", t.Rows, t.Cols, t.Block)
	}
	if t.Cols%MXGroup != 0 {
		return fail("cols=%d is not a multiple of %d: a 32-group would run past the row", t.Cols, MXGroup)
	}
	if t.Block%MXGroup != 0 {
		return fail("block=%d is not a multiple of %d: 32-groups would straddle two source blocks", t.Block, MXGroup)
	}
	if len(t.Q) != t.Rows*t.Cols {
		return fail("len(Q)=%d, want rows*cols=%d*%d=%d", len(t.Q), t.Rows, t.Cols, t.Rows*t.Cols)
	}
	rb, cb := (t.Rows+t.Block-1)/t.Block, (t.Cols+t.Block-1)/t.Block
	blk := make([]byte, rb*cb) // E8M0 block scales
	switch t.ScaleDType {
	case F8E8M0:
		if len(t.Scale) != rb*cb {
			return fail("scale size mismatch: len(Scale)=%d bytes, want %d*%d=%d F8_E8M0 values", len(t.Scale), rb, cb, rb*cb)
		}
		for i, b := range t.Scale {
			if b == 0xFF {
				return fail("scale[%d,%d] is 0xFF (E8M0 NaN)", i/cb, i%cb)
			}
		}
		copy(blk, t.Scale)
	case F32:
		if len(t.Scale) != 4*rb*cb {
			return fail("scale size mismatch: len(Scale)=%d bytes, want 4*%d*%d=%d for F32 values", len(t.Scale), rb, cb, 4*rb*cb)
		}
		for i := range blk {
			v := math.Float32frombits(binary.LittleEndian.Uint32(t.Scale[4*i:]))
			b, ok := E8M0Exact(v)
			if !ok {
				return fail("scale[%d,%d]=%g is not an exact power of two 2^e with e in [-127, 127]", i/cb, i%cb, v)
			}
			blk[i] = b
		}
	default:
		return fail("scale dtype %v unsupported, want F8_E8M0 or F32", t.ScaleDType)
	}
	gpr := t.Cols / MXGroup // groups per row
	per := t.Block / MXGroup
	mxScale = make([]byte, t.Rows*gpr)
	for r := 0; r < t.Rows; r++ {
		src := blk[(r/t.Block)*cb : (r/t.Block)*cb+cb]
		dst := mxScale[r*gpr : r*gpr+gpr]
		for g := range dst {
			dst[g] = src[g/per]
		}
	}
	return mxScale, nil
}
