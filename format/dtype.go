// Package format holds moxie's numeric storage formats: the element types a
// checkpoint may store (BF16, F16, F32, FP8 E4M3fn, E8M0, E2M1/MXFP4, ...), their
// exact scalar codecs, bulk row decoders, the block-scaled weight layouts of
// DeepSeek-V4 (FP8 with 128x128 E8M0 block scales, MXFP4, MXFP8), and exact
// (lossless) repacks between them.
//
// Every decoder is exact: it returns the value the format defines, computed in
// float32 where float32 holds it exactly (all of these formats fit). Encoders round
// to nearest, ties to even, and saturate where the format has no infinities.
package format

import "fmt"

// DType is the element type of a stored tensor. Names follow the safetensors
// header spelling ("BF16", "F8_E4M3", ...).
type DType uint8

// The stored element types moxie understands.
const (
	Invalid DType = iota
	BOOL
	U8
	I8
	I16
	I32
	I64
	F16
	BF16
	F32
	F64
	F8E4M3 // FP8 E4M3fn: bias 7, no infinities, 0x7F/0xFF are NaN, max 448
	F8E5M2 // FP8 E5M2 (IEEE-like, bias 15); recognised, not used by V4
	F8E8M0 // E8M0 exponent-only scale: 2^(b-127), 0xFF is NaN
)

var dtypeNames = [...]string{
	Invalid: "INVALID",
	BOOL:    "BOOL",
	U8:      "U8",
	I8:      "I8",
	I16:     "I16",
	I32:     "I32",
	I64:     "I64",
	F16:     "F16",
	BF16:    "BF16",
	F32:     "F32",
	F64:     "F64",
	F8E4M3:  "F8_E4M3",
	F8E5M2:  "F8_E5M2",
	F8E8M0:  "F8_E8M0",
}

var dtypeSizes = [...]int{
	BOOL: 1, U8: 1, I8: 1, I16: 2, I32: 4, I64: 8, F16: 2, BF16: 2, F32: 4, F64: 8,
	F8E4M3: 1, F8E5M2: 1, F8E8M0: 1,
}

// String returns the safetensors spelling of d.
func (d DType) String() string {
	if int(d) < len(dtypeNames) {
		return dtypeNames[d]
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// Size is the size of one element in bytes (0 for Invalid).
func (d DType) Size() int {
	if int(d) < len(dtypeSizes) {
		return dtypeSizes[d]
	}
	return 0
}

// ParseDType maps a safetensors dtype name to a DType. Unknown names are an error
// that quotes the name and lists what is accepted.
func ParseDType(s string) (DType, error) {
	for i, n := range dtypeNames {
		if i != int(Invalid) && n == s {
			return DType(i), nil
		}
	}
	return Invalid, fmt.Errorf("unknown dtype %q (want one of BF16, F16, F32, F64, I8, U8, I16, I32, I64, F8_E4M3, F8_E5M2, F8_E8M0, BOOL)", s)
}
