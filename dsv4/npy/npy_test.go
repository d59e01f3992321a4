package npy

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// handMade builds a .npy by hand, the way numpy lays it out.
func handMade(version byte, descr, shape string, body []byte) []byte {
	hdr := "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }\n"
	b := append([]byte("\x93NUMPY"), version, 0)
	if version == 1 {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(hdr)))
	} else {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(hdr)))
	}
	b = append(b, hdr...)
	return append(b, body...)
}

func f32s(v ...float32) []byte {
	var b []byte
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

func TestParse(t *testing.T) {
	f64 := binary.LittleEndian.AppendUint64(nil, math.Float64bits(2.5))
	cases := []struct {
		name  string
		in    []byte
		shape []int
		data  []float32
		err   string
	}{
		{"2d f4", handMade(1, "<f4", "(2, 3)", f32s(1, 2, 3, 4, 5, 6)), []int{2, 3}, []float32{1, 2, 3, 4, 5, 6}, ""},
		{"1d", handMade(1, "<f4", "(2,)", f32s(-1, 0.5)), []int{2}, []float32{-1, 0.5}, ""},
		{"scalar", handMade(1, "<f4", "()", f32s(7)), nil, []float32{7}, ""},
		{"v2", handMade(2, "<f4", "(1, 1)", f32s(3)), []int{1, 1}, []float32{3}, ""},
		{"f8", handMade(1, "<f8", "(1,)", f64), []int{1}, []float32{2.5}, ""},
		{"empty", handMade(1, "<f4", "(0, 5)", nil), []int{0, 5}, []float32{}, ""},
		{"bad magic", []byte("NUMPY\x01\x00\x00\x00xxxx"), nil, nil, "magic"},
		{"big endian", handMade(1, ">f4", "(1,)", f32s(1)), nil, nil, "dtype"},
		{"int", handMade(1, "<i8", "(1,)", make([]byte, 8)), nil, nil, "dtype"},
		{"short data", handMade(1, "<f4", "(2, 2)", f32s(1, 2, 3)), nil, nil, "want 16"},
		{"long data", handMade(1, "<f4", "(1,)", f32s(1, 2)), nil, nil, "want 4"},
		{"bad dim", handMade(1, "<f4", "(a,)", nil), nil, nil, "dimension"},
		{"huge", handMade(1, "<f4", "(100000, 100000, 100000)", nil), nil, nil, "elements"},
		{"version", append([]byte("\x93NUMPY\x09\x00"), 0, 0), nil, nil, "version"},
		{"truncated header", []byte("\x93NUMPY\x01\x00\xff\x00{'descr'"), nil, nil, "header"},
		{"fortran", bytes.Replace(handMade(1, "<f4", "(1,)", f32s(1)), []byte("False"), []byte("True "), 1), nil, nil, "fortran"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, err := Parse("x.npy", tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "x.npy") {
					t.Fatalf("err = %v, want mention of %q and the file", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(a.Shape, tc.shape) || !slices.Equal(a.Data, tc.data) {
				t.Fatalf("got %v %v, want %v %v", a.Shape, a.Data, tc.shape, tc.data)
			}
		})
	}
}

func TestWriteRoundTrip(t *testing.T) {
	dir := t.TempDir()
	for _, shape := range [][]int{{3}, {2, 5}, {1, 2, 2}} {
		n := 1
		for _, d := range shape {
			n *= d
		}
		data := make([]float32, n)
		for i := range data {
			data[i] = float32(i)*0.25 - 1
		}
		p := filepath.Join(dir, "a.npy")
		if err := WriteFile(p, data, shape); err != nil {
			t.Fatal(err)
		}
		raw, _ := os.ReadFile(p)
		// numpy requires the data offset to be a multiple of 64 (v1: 16 is the minimum).
		hl := int(binary.LittleEndian.Uint16(raw[8:10]))
		if (10+hl)%64 != 0 || raw[10+hl-1] != '\n' {
			t.Fatalf("header length %d: data offset %d not 64-aligned or no newline", hl, 10+hl)
		}
		a, err := Parse(p, raw)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a.Shape, shape) || !slices.Equal(a.Data, data) {
			t.Fatalf("round trip: %v %v", a.Shape, a.Data)
		}
	}
	if err := Write(&bytes.Buffer{}, []float32{1}, []int{2}); err == nil {
		t.Fatal("Write accepted a wrong length")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("temp files left behind: %d entries", len(ents))
	}
}

func FuzzParse(f *testing.F) {
	f.Add(handMade(1, "<f4", "(2, 3)", f32s(1, 2, 3, 4, 5, 6)))
	f.Add(handMade(2, "<f8", "(1,)", make([]byte, 8)))
	f.Add(handMade(1, "<f4", "()", f32s(1)))
	f.Add([]byte("\x93NUMPY\x01\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := Parse("fuzz", b)
		if err != nil {
			return
		}
		n := 1
		for _, d := range a.Shape {
			n *= d
		}
		if n != len(a.Data) {
			t.Fatalf("shape %v but %d values", a.Shape, len(a.Data))
		}
		var buf bytes.Buffer
		if err := Write(&buf, a.Data, a.Shape); err != nil {
			t.Fatal(err)
		}
		b2, err := Parse("again", buf.Bytes())
		if err != nil || !slices.Equal(b2.Shape, a.Shape) || len(b2.Data) != len(a.Data) {
			t.Fatalf("rewrite does not parse back: %v", err)
		}
	})
}
