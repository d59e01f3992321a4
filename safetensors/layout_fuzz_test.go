package safetensors

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"moxie/format"
)

// layoutCase decodes bytes into a header of up to 8 tensors with small shapes
// and offsets chosen to collide often (duplicate names, overlaps, wrong sizes,
// out-of-range ends), and decides independently whether a correct reader must
// accept it.
type layoutTensor struct {
	name       string
	dtype      string
	elem       int64 // element size, 0 for an unknown dtype
	shape      []int64
	begin, end int64
}

var layoutDTypes = []struct {
	name string
	size int64
}{{"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"I16", 2}, {"I32", 4}, {"I64", 8}, {"F16", 2}, {"BF16", 2},
	{"F32", 4}, {"F64", 8}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1}, {"F4", 0}, {"bf16", 0}}

func decodeLayout(b []byte) (ts []layoutTensor, dataLen int64) {
	next := func() int {
		if len(b) == 0 {
			return 0
		}
		v := int(b[0])
		b = b[1:]
		return v
	}
	dataLen = int64(next())
	n := next() % 9
	for range n {
		t := layoutTensor{name: fmt.Sprintf("t%d", next()%12)}
		dt := layoutDTypes[next()%len(layoutDTypes)]
		if next()%8 != 0 { // mostly known dtypes
			dt = layoutDTypes[next()%13]
		}
		t.dtype, t.elem = dt.name, dt.size
		for range next() % 4 {
			t.shape = append(t.shape, int64(next()%6))
		}
		t.begin = int64(next() % 64)
		size := t.elem
		for _, d := range t.shape {
			size *= d
		}
		switch next() % 8 {
		case 0:
			t.end = t.begin + int64(next()%16) // arbitrary
		case 1:
			t.end = t.begin - 1 - int64(next()%4) // backwards (may be negative)
		default:
			t.end = t.begin + size
		}
		ts = append(ts, t)
	}
	return ts, dataLen
}

// layoutValid is the oracle: the rules of the format, checked by brute force.
func layoutValid(ts []layoutTensor, dataLen int64) bool {
	seen := map[string]bool{}
	for i, t := range ts {
		if seen[t.name] || t.elem == 0 || t.begin < 0 || t.end < t.begin || t.end > dataLen {
			return false
		}
		seen[t.name] = true
		size := t.elem
		for _, d := range t.shape {
			size *= d
		}
		if t.end-t.begin != size {
			return false
		}
		for _, o := range ts[:i] {
			if t.end > t.begin && o.end > o.begin && t.begin < o.end && o.begin < t.end {
				return false
			}
		}
	}
	return true
}

func layoutJSON(ts []layoutTensor) string {
	var sb strings.Builder
	sb.WriteString("{")
	for i, t := range ts {
		if i > 0 {
			sb.WriteString(",")
		}
		shape := make([]string, len(t.shape))
		for j, d := range t.shape {
			shape[j] = fmt.Sprint(d)
		}
		fmt.Fprintf(&sb, `%q:{"dtype":%q,"shape":[%s],"data_offsets":[%d,%d]}`, t.name, t.dtype, strings.Join(shape, ","), t.begin, t.end)
	}
	sb.WriteString("}")
	return sb.String()
}

func checkLayout(t *testing.T, b []byte) {
	ts, dataLen := decodeLayout(b)
	hdr := layoutJSON(ts)
	file := fileBytes(hdr, int(dataLen))
	f, err := OpenReaderAt("layout", bytes.NewReader(file), int64(len(file)))
	want := layoutValid(ts, dataLen)
	if (err == nil) != want {
		t.Fatalf("header %s with %d data bytes: reader error %v, oracle valid=%v", hdr, dataLen, err, want)
	}
	if err != nil {
		var fe *FormatError
		if !errors.As(err, &fe) {
			t.Fatalf("error %T, want *FormatError", err)
		}
		return
	}
	if len(f.Tensors()) != len(ts) {
		t.Fatalf("%d tensors, want %d", len(f.Tensors()), len(ts))
	}
	dataStart := int64(8 + len(hdr))
	for _, lt := range ts {
		ti, ok := f.Lookup(lt.name)
		dt, _ := format.ParseDType(lt.dtype)
		if !ok || ti.DType != dt || !equalShape(ti.Shape, append([]int64{}, lt.shape...)) || ti.Offset != dataStart+lt.begin || ti.Size != lt.end-lt.begin {
			t.Fatalf("tensor %s = %+v, want %+v", lt.name, ti, lt)
		}
	}
	checkInvariants(t, f, file, dataStart)
}

// FuzzHeaderLayout checks accept/reject decisions against a brute-force oracle
// on structured headers built from the fuzz input.
func FuzzHeaderLayout(f *testing.F) {
	f.Add([]byte{40, 3, 1, 0, 1, 8, 2, 2, 3, 0, 3, 2, 0, 1, 1, 2, 2, 9, 1, 4, 1, 5, 4})
	f.Add([]byte{16, 2, 1, 0, 1, 8, 1, 4, 0, 2, 1, 0, 1, 8, 1, 4, 2, 2})
	f.Fuzz(checkLayout)
}

// TestRandomLayouts runs the same oracle check on many random layouts.
func TestRandomLayouts(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	n := 20000
	if testing.Short() {
		n = 2000
	}
	accepted := 0
	for range n {
		b := make([]byte, 2+r.IntN(60))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		if r.IntN(2) == 0 {
			b[1] = byte(1 + r.IntN(3)) // few tensors: more likely valid
		}
		checkLayout(t, b)
		ts, dl := decodeLayout(b)
		if layoutValid(ts, dl) {
			accepted++
		}
	}
	if accepted < n/50 {
		t.Fatalf("only %d of %d random layouts valid: the generator does not exercise acceptance", accepted, n)
	}
	t.Logf("%d of %d random layouts valid", accepted, n)
}
