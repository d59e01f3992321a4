package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"moxie/format"
)

// elemBytes is the element size of each dtype, written out independently of
// format.DType.Size.
var elemBytes = map[format.DType]int64{
	format.BOOL: 1, format.U8: 1, format.I8: 1, format.I16: 2, format.I32: 4, format.I64: 8,
	format.F16: 2, format.BF16: 2, format.F32: 4, format.F64: 8,
	format.F8E4M3: 1, format.F8E5M2: 1, format.F8E8M0: 1,
}

func specBytes(s TensorSpec) int64 {
	n := elemBytes[s.DType]
	for _, d := range s.Shape {
		n *= d
	}
	return n
}

func randomBytes(r *rand.Rand, n int64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// listDir returns the names in dir, to check that no temp files are left behind.
func listDir(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

// oracleHeader decodes a file's header with encoding/json, independently of this
// package's parser.
type oracleEntry struct {
	DType       string   `json:"dtype"`
	Shape       []int64  `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

func oracleHeader(t *testing.T, b []byte) (int64, map[string]oracleEntry, map[string]string) {
	t.Helper()
	n := int64(binary.LittleEndian.Uint64(b))
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &raw); err != nil {
		t.Fatalf("encoding/json rejects written header: %v", err)
	}
	ents := make(map[string]oracleEntry)
	var meta map[string]string
	for k, v := range raw {
		if k == "__metadata__" {
			if err := json.Unmarshal(v, &meta); err != nil {
				t.Fatal(err)
			}
			continue
		}
		var e oracleEntry
		dec := json.NewDecoder(bytes.NewReader(v))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil {
			t.Fatal(err)
		}
		ents[k] = e
	}
	return n, ents, meta
}

func TestWriterRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	dtypes := []format.DType{format.BOOL, format.U8, format.I8, format.I16, format.I32, format.I64,
		format.F16, format.BF16, format.F32, format.F64, format.F8E4M3, format.F8E5M2, format.F8E8M0}
	shapes := [][]int64{{}, {0}, {1}, {7}, {3, 5}, {2, 0, 4}, {2, 3, 4}, {1, 1, 1, 1, 9}, {128, 33}}
	var specs []TensorSpec
	for i, dt := range dtypes {
		for j, sh := range shapes {
			if (i+j)%3 == 0 {
				continue
			}
			specs = append(specs, TensorSpec{Name: dt.String() + "/" + string(rune('a'+j)), DType: dt, Shape: sh})
		}
	}
	specs = append(specs, TensorSpec{Name: "needs \"escaping\"\n\\é", DType: format.F32, Shape: []int64{2}})
	// Not sorted by name, to check that spec order is the file order.
	r.Shuffle(len(specs), func(i, j int) { specs[i], specs[j] = specs[j], specs[i] })
	meta := map[string]string{"format": "pt", "quote\"": "tab\tnl\n", "": "empty key"}

	dir := t.TempDir()
	p := filepath.Join(dir, "model.safetensors")
	w, err := Create(p, specs, meta)
	if err != nil {
		t.Fatal(err)
	}
	data := make([][]byte, len(specs))
	for i, s := range specs {
		data[i] = randomBytes(r, specBytes(s))
		if i%2 == 0 {
			err = w.Write(s.Name, data[i])
		} else {
			err = w.WriteFrom(s.Name, bytes.NewReader(data[i]))
		}
		if err != nil {
			t.Fatalf("writing %q: %v", s.Name, err)
		}
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("destination exists before Close: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if got := listDir(t, dir); !slices.Equal(got, []string{"model.safetensors"}) {
		t.Fatalf("directory holds %q, want only the file", got)
	}
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}

	// Independent decode of the layout: contiguous, in spec order, 8-aligned start.
	n, ents, gotMeta := oracleHeader(t, raw)
	if n%8 != 0 {
		t.Errorf("header length %d is not a multiple of 8", n)
	}
	if !equalMeta(gotMeta, meta) {
		t.Errorf("oracle metadata %q, want %q", gotMeta, meta)
	}
	var off int64
	for i, s := range specs {
		e, ok := ents[s.Name]
		size := specBytes(s)
		if !ok || e.DType != s.DType.String() || !equalShape(e.Shape, s.Shape) || e.DataOffsets != [2]int64{off, off + size} {
			t.Fatalf("oracle entry %q = %+v, want %s %v [%d %d]", s.Name, e, s.DType, s.Shape, off, off+size)
		}
		if !bytes.Equal(raw[8+n+off:8+n+off+size], data[i]) {
			t.Fatalf("file bytes of %q differ", s.Name)
		}
		off += size
	}
	if int64(len(raw)) != 8+n+off {
		t.Fatalf("file is %d bytes, want %d", len(raw), 8+n+off)
	}

	mm, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer mm.Close()
	ra, err := OpenReaderAt(p, bytes.NewReader(raw), int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}
	for how, f := range map[string]*File{"Open": mm, "OpenReaderAt": ra} {
		if !equalMeta(f.Metadata(), meta) {
			t.Errorf("%s: metadata %q", how, f.Metadata())
		}
		if len(f.Tensors()) != len(specs) {
			t.Fatalf("%s: %d tensors, want %d", how, len(f.Tensors()), len(specs))
		}
		prev := int64(-1)
		for _, ti := range f.Tensors() {
			if ti.Offset < prev {
				t.Fatalf("%s: Tensors not sorted by offset", how)
			}
			prev = ti.Offset
		}
		for i, s := range specs {
			ti, ok := f.Lookup(s.Name)
			if !ok || ti.DType != s.DType || !equalShape(ti.Shape, s.Shape) || ti.Size != specBytes(s) {
				t.Fatalf("%s: Lookup(%q) = %+v", how, s.Name, ti)
			}
			d, err := f.Data(s.Name)
			if err != nil || !bytes.Equal(d, data[i]) {
				t.Fatalf("%s: Data(%q) differs (err %v)", how, s.Name, err)
			}
		}
	}
	// Tensors of the two readers agree exactly.
	if a, b := mm.Tensors(), ra.Tensors(); !slices.EqualFunc(a, b, func(x, y TensorInfo) bool {
		return x.Name == y.Name && x.DType == y.DType && equalShape(x.Shape, y.Shape) && x.Offset == y.Offset && x.Size == y.Size
	}) {
		t.Fatal("Open and OpenReaderAt disagree")
	}
}

func TestWriteFromOtherFile(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	dir := t.TempDir()
	src := filepath.Join(dir, "src.safetensors")
	specs := []TensorSpec{
		{"w", format.F8E4M3, []int64{64, 32}},
		{"w.scale", format.F8E8M0, []int64{1, 1}},
		{"norm", format.BF16, []int64{32}},
		{"empty", format.F32, []int64{0}},
	}
	w, err := Create(src, specs, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{}
	for _, s := range specs {
		want[s.Name] = randomBytes(r, specBytes(s))
		if err := w.Write(s.Name, want[s.Name]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	in, err := Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()

	// Copy a subset in a different order, by byte range only.
	dst := filepath.Join(dir, "dst.safetensors")
	order := []string{"norm", "empty", "w"}
	var outSpecs []TensorSpec
	for _, name := range order {
		ti, _ := in.Lookup(name)
		outSpecs = append(outSpecs, TensorSpec{ti.Name, ti.DType, ti.Shape})
	}
	w, err = Create(dst, outSpecs, map[string]string{"source": "src"})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range order {
		ti, _ := in.Lookup(name)
		if err := w.WriteFrom(name, io.NewSectionReader(in, ti.Offset, ti.Size)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	out, err := Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	for _, name := range order {
		d, err := out.Data(name)
		if err != nil || !bytes.Equal(d, want[name]) {
			t.Errorf("copied %q differs (err %v)", name, err)
		}
	}
	if _, ok := out.Lookup("w.scale"); ok {
		t.Error("uncopied tensor present")
	}
}

func TestWriterErrors(t *testing.T) {
	specs := []TensorSpec{{"a", format.F32, []int64{2}}, {"b", format.U8, []int64{3}}}
	type step func(w *Writer) error
	cases := []struct {
		name    string
		steps   []step
		stepErr string // substring of the last step's error ("" = all steps succeed)
		usable  bool   // after the failing step, can the file still be completed?
	}{
		{"close with nothing written", nil, "", false},
		{"close with one missing", []step{func(w *Writer) error { return w.Write("a", make([]byte, 8)) }}, "", false},
		{"out of order", []step{func(w *Writer) error { return w.Write("b", make([]byte, 3)) }}, `want "a" next`, true},
		{"unknown name", []step{func(w *Writer) error { return w.Write("zz", make([]byte, 3)) }}, `want "a" next`, true},
		{"short data", []step{func(w *Writer) error { return w.Write("a", make([]byte, 7)) }}, "got 7 bytes, want 8", true},
		{"long data", []step{func(w *Writer) error { return w.Write("a", make([]byte, 9)) }}, "got 9 bytes, want 8", true},
		{"short reader", []step{func(w *Writer) error { return w.WriteFrom("a", bytes.NewReader(make([]byte, 5))) }}, "gave 5 of 8 bytes", false},
		{"long reader", []step{func(w *Writer) error { return w.WriteFrom("a", bytes.NewReader(make([]byte, 9))) }}, "more than the 8 bytes", false},
		{"failing reader", []step{func(w *Writer) error {
			return w.WriteFrom("a", io.MultiReader(bytes.NewReader(make([]byte, 4)), errReader{}))
		}}, "boom", false},
		{"too many", []step{
			func(w *Writer) error { return w.Write("a", []byte{1, 2, 3, 4, 5, 6, 7, 8}) },
			func(w *Writer) error { return w.Write("b", []byte{9, 10, 11}) },
			func(w *Writer) error { return w.Write("c", nil) }}, "already written", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "out.safetensors")
			w, err := Create(p, specs, nil)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range c.steps {
				err := s(w)
				if i < len(c.steps)-1 || c.stepErr == "" {
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					continue
				}
				if err == nil || !strings.Contains(err.Error(), c.stepErr) || !strings.Contains(err.Error(), p) {
					t.Fatalf("step %d: got %v, want error containing %q and the path", i, err, c.stepErr)
				}
			}
			if c.usable {
				// Finish properly: the failed step must not have corrupted anything.
				var fresh = []struct {
					n string
					d []byte
				}{{"a", []byte{1, 2, 3, 4, 5, 6, 7, 8}}, {"b", []byte{9, 10, 11}}}
				for _, f := range fresh[w.next:] {
					if err := w.Write(f.n, f.d); err != nil {
						t.Fatal(err)
					}
				}
				if err := w.Close(); err != nil {
					t.Fatal(err)
				}
				f, err := Open(p)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				if d, _ := f.Data("a"); !bytes.Equal(d, []byte{1, 2, 3, 4, 5, 6, 7, 8}) {
					t.Fatalf("a = %v", d)
				}
				if d, _ := f.Data("b"); !bytes.Equal(d, []byte{9, 10, 11}) {
					t.Fatalf("b = %v", d)
				}
				return
			}
			if err := w.Close(); err == nil {
				t.Fatal("Close succeeded on an incomplete file")
			}
			if got := listDir(t, dir); len(got) != 0 {
				t.Fatalf("directory holds %q after failed Close, want nothing", got)
			}
			if err := w.Write("a", make([]byte, 8)); err == nil {
				t.Fatal("Write after Close succeeded")
			}
		})
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("boom") }

func TestWriterKeepsExistingUntilClose(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "m.safetensors")
	if err := os.WriteFile(p, []byte("old contents"), 0o644); err != nil {
		t.Fatal(err)
	}
	specs := []TensorSpec{{"a", format.U8, []int64{2}}}
	// Aborted and failed writes leave the old file.
	w, err := Create(p, specs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write("a", []byte{1, 2}); err != nil {
		t.Fatal(err)
	}
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	if err := w.Abort(); err != nil {
		t.Fatalf("second Abort: %v", err)
	}
	if err := w.Close(); err == nil {
		t.Fatal("Close after Abort succeeded")
	}
	if b, _ := os.ReadFile(p); string(b) != "old contents" {
		t.Fatalf("destination changed by aborted writer: %q", b)
	}
	if got := listDir(t, dir); !slices.Equal(got, []string{"m.safetensors"}) {
		t.Fatalf("directory holds %q after Abort", got)
	}
	// A completed write replaces it; Abort afterwards is a no-op.
	w, err = Create(p, specs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write("a", []byte{1, 2}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Abort(); err != nil {
		t.Fatalf("Abort after Close: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	f, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if d, _ := f.Data("a"); !bytes.Equal(d, []byte{1, 2}) {
		t.Fatalf("a = %v", d)
	}
	if st, _ := os.Stat(p); st.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644", st.Mode().Perm())
	}
}

func TestCreateRejects(t *testing.T) {
	cases := []struct {
		name  string
		specs []TensorSpec
		meta  map[string]string
		msg   string
	}{
		{"empty name", []TensorSpec{{"", format.F32, nil}}, nil, "empty tensor name"},
		{"reserved name", []TensorSpec{{"__metadata__", format.F32, nil}}, nil, "reserved"},
		{"duplicate", []TensorSpec{{"a", format.F32, nil}, {"a", format.U8, nil}}, nil, "duplicate"},
		{"invalid dtype", []TensorSpec{{"a", format.Invalid, nil}}, nil, "invalid dtype"},
		{"out of range dtype", []TensorSpec{{"a", format.DType(200), nil}}, nil, "invalid dtype"},
		{"negative dim", []TensorSpec{{"a", format.F32, []int64{2, -1}}}, nil, "negative"},
		{"overflow", []TensorSpec{{"a", format.F64, []int64{1 << 40, 1 << 21}}}, nil, "overflows"},
		{"bad utf8 name", []TensorSpec{{"a\xff", format.F32, nil}}, nil, "UTF-8"},
		{"bad utf8 metadata", []TensorSpec{{"a", format.F32, nil}}, map[string]string{"k": "\xfe"}, "UTF-8"},
		{"rank", []TensorSpec{{"a", format.F32, make([]int64, 65)}}, nil, "rank 65"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "x.safetensors")
			w, err := Create(p, c.specs, c.meta)
			if err == nil {
				w.Abort()
				t.Fatal("Create succeeded")
			}
			if !strings.Contains(err.Error(), c.msg) || !strings.Contains(err.Error(), p) {
				t.Fatalf("got %v, want error containing %q and the path", err, c.msg)
			}
			if got := listDir(t, dir); len(got) != 0 {
				t.Fatalf("directory holds %q", got)
			}
		})
	}
	if _, err := Create(filepath.Join(t.TempDir(), "no", "such", "dir.safetensors"), nil, nil); err == nil {
		t.Error("Create in a missing directory succeeded")
	}
}

func TestEmptyFileRoundTrip(t *testing.T) {
	p := filepath.Join(t.TempDir(), "e.safetensors")
	w, err := Create(p, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if len(f.Tensors()) != 0 || f.Metadata() != nil {
		t.Fatalf("tensors %v meta %v", f.Tensors(), f.Metadata())
	}
}
