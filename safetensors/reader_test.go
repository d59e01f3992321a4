package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"moxie/format"
)

// fileBytes builds a safetensors file from a raw JSON header and dataLen data
// bytes (byte i of the data section is byte(i*7+1), so views can be checked).
func fileBytes(hdr string, dataLen int) []byte {
	b := make([]byte, 8, 8+len(hdr)+dataLen)
	binary.LittleEndian.PutUint64(b, uint64(len(hdr)))
	b = append(b, hdr...)
	for i := range dataLen {
		b = append(b, byte(i*7+1))
	}
	return b
}

func writeTemp(t testing.TB, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "x.safetensors")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// zeroTail is an io.ReaderAt over prefix followed by zeros, up to a claimed size;
// it lets tests present files of absurd size without storing them.
type zeroTail struct {
	prefix []byte
	size   int64
	reads  int64 // bytes handed out
}

func (z *zeroTail) ReadAt(p []byte, off int64) (int, error) {
	if off >= z.size {
		return 0, io.EOF
	}
	n := len(p)
	if rem := z.size - off; int64(n) > rem {
		n = int(rem)
	}
	for i := range n {
		if o := off + int64(i); o < int64(len(z.prefix)) {
			p[i] = z.prefix[o]
		} else {
			p[i] = 0
		}
	}
	z.reads += int64(n)
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func deep(open, close string, n int) string {
	return strings.Repeat(open, n) + strings.Repeat(close, n)
}

// hostileCase is a malformed file and the FormatError it must produce.
type hostileCase struct {
	name   string
	file   []byte
	field  string // expected FormatError.Field
	tensor string // expected FormatError.Tensor
	msg    string // substring of the message
}

func hostileCases() []hostileCase {
	f := func(hdr string, data int) []byte { return fileBytes(hdr, data) }
	lenOnly := func(n uint64, total int) []byte {
		b := make([]byte, total)
		binary.LittleEndian.PutUint64(b, n)
		return b
	}
	ok1 := `"dtype":"F32","shape":[2],"data_offsets":[0,8]`
	return []hostileCase{
		{"empty file", nil, "header length", "", "want at least 8"},
		{"7 bytes", []byte{2, 0, 0, 0, 0, 0, 0}, "header length", "", "file is 7 bytes"},
		{"header length 0", lenOnly(0, 16), "header length", "", "is 0"},
		{"header length past end", lenOnly(100, 50), "header length", "", "only 42 bytes follow"},
		{"header length 2^63", lenOnly(1<<63, 16), "header length", "", "only 8 bytes follow"},
		{"not an object", f(`[1,2]`, 0), "json", "", "starting with '{'"},
		{"empty header text", f(`   `, 0), "json", "", "found end of JSON"},
		{"string top", f(`"x"`, 0), "json", "", "starting with '{'"},
		{"two objects", f(`{}{}`, 0), "json", "", "after the top-level object"},
		{"trailing garbage", f(`{} x`, 0), "json", "", "after the top-level object"},
		{"trailing NUL", f("{}\x00", 0), "json", "", "after the top-level object"},
		{"unterminated", f(`{"a":{`, 0), "entry", "a", "end of JSON"},
		{"deep arrays", f(deep("[", "]", 100000), 0), "json", "", "starting with '{'"},
		{"deep objects in entry", f(`{"a":`+deep(`{"b":`, "}", 100000)+`}`, 0), "entry", "a", "unknown key"},
		{"deep in dtype", f(`{"a":{"dtype":`+deep("[", "]", 100000)+`}}`, 0), "dtype", "a", "expected a string"},
		{"deep in shape", f(`{"a":{"shape":`+deep("[", "]", 100000)+`}}`, 0), "shape", "a", "non-negative integer"},
		{"deep in metadata", f(`{"__metadata__":{"k":`+deep("[", "]", 1000)+`}}`, 0), "__metadata__", "", "must be a string"},
		{"duplicate tensor", f(`{"a":{`+ok1+`},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, 16), "name", "a", "duplicate"},
		{"empty tensor name", f(`{"":{`+ok1+`}}`, 8), "name", "", "empty tensor name"},
		{"unknown key in entry", f(`{"a":{`+ok1+`,"extra":1}}`, 8), "entry", "a", `unknown key "extra"`},
		{"duplicate key in entry", f(`{"a":{`+ok1+`,"dtype":"F32"}}`, 8), "dtype", "a", "twice"},
		{"entry not object", f(`{"a":[1]}`, 0), "entry", "a", "'{' starting a tensor entry"},
		{"entry null", f(`{"a":null}`, 0), "entry", "a", "'{' starting a tensor entry"},
		{"missing dtype", f(`{"a":{"shape":[2],"data_offsets":[0,8]}}`, 8), "dtype", "a", "missing"},
		{"missing shape", f(`{"a":{"dtype":"F32","data_offsets":[0,8]}}`, 8), "shape", "a", "missing"},
		{"missing offsets", f(`{"a":{"dtype":"F32","shape":[2]}}`, 8), "data_offsets", "a", "missing"},
		{"unknown dtype", f(`{"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}`, 8), "dtype", "a", `unknown dtype "F4"`},
		{"lowercase dtype", f(`{"a":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}}`, 8), "dtype", "a", "unknown dtype"},
		{"dtype number", f(`{"a":{"dtype":7,"shape":[2],"data_offsets":[0,8]}}`, 8), "dtype", "a", "expected a string"},
		{"negative shape", f(`{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, 8), "shape", "a", "negative"},
		{"fractional shape", f(`{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}`, 8), "shape", "a", "fraction or exponent"},
		{"exponent shape", f(`{"a":{"dtype":"F32","shape":[2e0],"data_offsets":[0,8]}}`, 8), "shape", "a", "fraction or exponent"},
		{"leading zero shape", f(`{"a":{"dtype":"F32","shape":[02],"data_offsets":[0,8]}}`, 8), "shape", "a", "leading zero"},
		{"string shape", f(`{"a":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}}`, 8), "shape", "a", "non-negative integer"},
		{"shape not array", f(`{"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}}`, 8), "shape", "a", "'['"},
		{"shape trailing comma", f(`{"a":{"dtype":"F32","shape":[2,],"data_offsets":[0,8]}}`, 8), "shape", "a", "non-negative integer"},
		{"shape huge int", f(`{"a":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,8]}}`, 8), "shape", "a", "does not fit in int64"},
		{"shape bytes overflow", f(`{"a":{"dtype":"F32","shape":[4611686018427387904,2],"data_offsets":[0,8]}}`, 8), "shape", "a", "overflows"},
		{"shape elems overflow past zero", f(`{"a":{"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}}`, 8), "shape", "a", "overflows"},
		{"shape overflow after zero dim", f(`{"a":{"dtype":"F32","shape":[0,4611686018427387904,4],"data_offsets":[0,0]}}`, 8), "shape", "a", "overflows"},
		{"rank too large", f(`{"a":{"dtype":"U8","shape":[`+strings.Repeat("1,", 64)+`1],"data_offsets":[0,1]}}`, 8), "shape", "a", "more than 64"},
		{"size mismatch", f(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, 16), "data_offsets", "a", "want 12"},
		{"begin after end", f(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}}`, 16), "data_offsets", "a", "begin > end"},
		{"end past data", f(`{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, 15), "data_offsets", "a", "past the data section (15 bytes)"},
		{"claims 2^60 bytes", f(`{"a":{"dtype":"U8","shape":[1152921504606846976],"data_offsets":[0,1152921504606846976]}}`, 8), "data_offsets", "a", "past the data section"},
		{"offsets one entry", f(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[8]}}`, 8), "data_offsets", "a", "exactly 2"},
		{"offsets three entries", f(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}}`, 16), "data_offsets", "a", "more than 2"},
		{"negative offset", f(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}}`, 16), "data_offsets", "a", "negative"},
		{"overlap", f(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, 16), "data_offsets", "b", `[4, 12] overlaps tensor "a" at [0, 8]`},
		{"same range", f(`{"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}}`, 16), "data_offsets", "b", `overlaps tensor "a" at [0, 8]`},
		{"nested overlap", f(`{"big":{"dtype":"U8","shape":[16],"data_offsets":[0,16]},"mid":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},"late":{"dtype":"U8","shape":[2],"data_offsets":[10,12]}}`, 16), "data_offsets", "mid", `[4, 6] overlaps tensor "big" at [0, 16]`},
		{"metadata number", f(`{"__metadata__":{"k":1}}`, 0), "__metadata__", "", `key "k" must be a string`},
		{"metadata array", f(`{"__metadata__":["x"]}`, 0), "__metadata__", "", "'{'"},
		{"metadata string", f(`{"__metadata__":"x"}`, 0), "__metadata__", "", "'{'"},
		{"metadata duplicate key", f(`{"__metadata__":{"k":"1","k":"2"}}`, 0), "__metadata__", "", `key "k" appears twice`},
		{"metadata twice", f(`{"__metadata__":{},"__metadata__":{}}`, 0), "__metadata__", "", "twice"},
		{"invalid utf8 name", f("{\"a\xff\":{"+ok1+"}}", 8), "json", "", "invalid UTF-8"},
		{"raw control char", f("{\"a\nb\":{"+ok1+"}}", 8), "json", "", "control character"},
		{"lone high surrogate", f(`{"\ud800":{`+ok1+`}}`, 8), "json", "", "unpaired high surrogate"},
		{"lone low surrogate", f(`{"\udc00":{`+ok1+`}}`, 8), "json", "", "unpaired low surrogate"},
		{"bad escape", f(`{"\q":{`+ok1+`}}`, 8), "json", "", `invalid escape \q`},
		{"missing colon", f(`{"a" {`+ok1+`}}`, 8), "json", "", "':' after key"},
		{"missing comma", f(`{"a":{`+ok1+`} "b":{}}`, 8), "json", "", "expected ',' or '}'"},
		{"single quotes", f(`{'a':{}}`, 0), "json", "", "starting a key"},
		{"trailing comma", f(`{"a":{`+ok1+`},}`, 8), "json", "", "starting a key"},
	}
}

func TestHostileHeaders(t *testing.T) {
	cases := hostileCases()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			check := func(how string, err error) {
				t.Helper()
				var fe *FormatError
				if !errors.As(err, &fe) {
					t.Fatalf("%s: got error %v (%T), want *FormatError", how, err, err)
				}
				if fe.Field != c.field || fe.Tensor != c.tensor || !strings.Contains(fe.Msg, c.msg) {
					t.Fatalf("%s: got field=%q tensor=%q msg=%q\nwant field=%q tensor=%q msg containing %q",
						how, fe.Field, fe.Tensor, fe.Msg, c.field, c.tensor, c.msg)
				}
				if fe.Path == "" || !strings.Contains(err.Error(), fe.Path) {
					t.Fatalf("%s: error %q does not name the file", how, err)
				}
			}
			_, err := OpenReaderAt("mem.safetensors", bytes.NewReader(c.file), int64(len(c.file)))
			check("OpenReaderAt", err)
			p := writeTemp(t, c.file)
			f, err := Open(p)
			if f != nil {
				f.Close()
			}
			check("Open", err)
			_, _, err = ReadHeader(p)
			check("ReadHeader", err)
		})
	}
}

// TestHugeClaims checks that absurd sizes are rejected before anything of that
// size is allocated or read.
func TestHugeClaims(t *testing.T) {
	t.Run("header over limit in huge file", func(t *testing.T) {
		prefix := make([]byte, 8)
		binary.LittleEndian.PutUint64(prefix, MaxHeaderSize+1)
		z := &zeroTail{prefix: prefix, size: 1 << 50}
		_, err := OpenReaderAt("huge", z, z.size)
		var fe *FormatError
		if !errors.As(err, &fe) || fe.Field != "header length" || !strings.Contains(fe.Msg, "limit") {
			t.Fatalf("got %v, want header length limit error", err)
		}
		if z.reads > 8 {
			t.Fatalf("read %d bytes, want only the 8-byte prefix", z.reads)
		}
	})
	t.Run("header 2^60 in huge file", func(t *testing.T) {
		prefix := make([]byte, 8)
		binary.LittleEndian.PutUint64(prefix, 1<<60)
		z := &zeroTail{prefix: prefix, size: 1 << 61}
		_, err := OpenReaderAt("huge", z, z.size)
		var fe *FormatError
		if !errors.As(err, &fe) || fe.Field != "header length" {
			t.Fatalf("got %v, want header length error", err)
		}
	})
	t.Run("sparse file header over limit", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "sparse.safetensors")
		fd, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		prefix := make([]byte, 8)
		binary.LittleEndian.PutUint64(prefix, 150<<20)
		fd.Write(prefix)
		if err := fd.Truncate(200 << 20); err != nil {
			t.Fatal(err)
		}
		fd.Close()
		for name, open := range map[string]func(string) error{
			"Open":       func(p string) error { _, err := Open(p); return err },
			"ReadHeader": func(p string) error { _, _, err := ReadHeader(p); return err },
		} {
			err := open(p)
			var fe *FormatError
			if !errors.As(err, &fe) || fe.Field != "header length" || !strings.Contains(fe.Msg, "limit") {
				t.Fatalf("%s: got %v, want header length limit error", name, err)
			}
		}
	})
}

func TestValidHeaders(t *testing.T) {
	type want struct {
		name  string
		dt    format.DType
		shape []int64
		begin int64 // relative to the data section
		size  int64
	}
	cases := []struct {
		name string
		hdr  string
		data int
		meta map[string]string
		want []want // in offset order
	}{
		{"empty", `{}`, 0, nil, nil},
		{"empty with padding and data", "  {  }  \n\t", 5, nil, nil},
		{"scalar", `{"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}}`, 8, nil,
			[]want{{"s", format.F64, []int64{}, 0, 8}}},
		{"zero-size tensors anywhere", `{"z1":{"dtype":"F32","shape":[0,5],"data_offsets":[3,3]},"a":{"dtype":"U8","shape":[6],"data_offsets":[0,6]},"z0":{"dtype":"BF16","shape":[0],"data_offsets":[3,3]},"z2":{"dtype":"I64","shape":[7,0],"data_offsets":[6,6]}}`, 6, nil,
			[]want{{"a", format.U8, []int64{6}, 0, 6}, {"z0", format.BF16, []int64{0}, 3, 0}, {"z1", format.F32, []int64{0, 5}, 3, 0}, {"z2", format.I64, []int64{7, 0}, 6, 0}}},
		{"gaps and reversed order", `{"b":{"dtype":"I16","shape":[2,2],"data_offsets":[20,28]},"a":{"dtype":"F8_E4M3","shape":[3],"data_offsets":[2,5]}}`, 40, nil,
			[]want{{"a", format.F8E4M3, []int64{3}, 2, 3}, {"b", format.I16, []int64{2, 2}, 20, 8}}},
		{"metadata and escapes", `{"__metadata__":{"format":"pt","q\"\\\/\b\f\n\r\t":"\u00e9\ud83d\ude00"},"caf\u00e9.w":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]}}`, 1,
			map[string]string{"format": "pt", "q\"\\/\b\f\n\r\t": "é😀"},
			[]want{{"café.w", format.BOOL, []int64{1}, 0, 1}}},
		{"metadata null", `{"__metadata__":null,"x":{"data_offsets":[0,2],"shape":[1],"dtype":"F16"}}`, 2, nil,
			[]want{{"x", format.F16, []int64{1}, 0, 2}}},
		{"utf8 name raw", `{"ß/層":{"dtype":"F8_E8M0","shape":[2],"data_offsets":[0,2]}}`, 2, nil,
			[]want{{"ß/層", format.F8E8M0, []int64{2}, 0, 2}}},
		{"all dtypes", `{"a":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},"c":{"dtype":"I8","shape":[1],"data_offsets":[2,3]},"d":{"dtype":"I16","shape":[1],"data_offsets":[3,5]},"e":{"dtype":"I32","shape":[1],"data_offsets":[5,9]},"f":{"dtype":"I64","shape":[1],"data_offsets":[9,17]},"g":{"dtype":"F16","shape":[1],"data_offsets":[17,19]},"h":{"dtype":"BF16","shape":[1],"data_offsets":[19,21]},"i":{"dtype":"F32","shape":[1],"data_offsets":[21,25]},"j":{"dtype":"F64","shape":[1],"data_offsets":[25,33]},"k":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[33,34]},"l":{"dtype":"F8_E5M2","shape":[1],"data_offsets":[34,35]},"m":{"dtype":"F8_E8M0","shape":[1],"data_offsets":[35,36]}}`, 36, nil,
			[]want{{"a", format.BOOL, []int64{1}, 0, 1}, {"b", format.U8, []int64{1}, 1, 1}, {"c", format.I8, []int64{1}, 2, 1}, {"d", format.I16, []int64{1}, 3, 2}, {"e", format.I32, []int64{1}, 5, 4}, {"f", format.I64, []int64{1}, 9, 8}, {"g", format.F16, []int64{1}, 17, 2}, {"h", format.BF16, []int64{1}, 19, 2}, {"i", format.F32, []int64{1}, 21, 4}, {"j", format.F64, []int64{1}, 25, 8}, {"k", format.F8E4M3, []int64{1}, 33, 1}, {"l", format.F8E5M2, []int64{1}, 34, 1}, {"m", format.F8E8M0, []int64{1}, 35, 1}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := fileBytes(c.hdr, c.data)
			dataStart := int64(8 + len(c.hdr))
			p := writeTemp(t, b)
			mm, err := Open(p)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer mm.Close()
			ra, err := OpenReaderAt(p, bytes.NewReader(b), int64(len(b)))
			if err != nil {
				t.Fatalf("OpenReaderAt: %v", err)
			}
			hts, hmeta, err := ReadHeader(p)
			if err != nil {
				t.Fatalf("ReadHeader: %v", err)
			}
			for how, f := range map[string]*File{"Open": mm, "OpenReaderAt": ra} {
				ts := f.Tensors()
				if len(ts) != len(c.want) {
					t.Fatalf("%s: %d tensors, want %d", how, len(ts), len(c.want))
				}
				// Shared slices are clipped, so a caller's append cannot write into them.
				if cap(ts) != len(ts) {
					t.Errorf("%s: Tensors has cap %d > len %d", how, cap(ts), len(ts))
				}
				for _, ti := range ts {
					if cap(ti.Shape) != len(ti.Shape) {
						t.Errorf("%s: %q Shape has cap %d > len %d", how, ti.Name, cap(ti.Shape), len(ti.Shape))
					}
				}
				for i, w := range c.want {
					g := ts[i]
					if g.Name != w.name || g.DType != w.dt || !equalShape(g.Shape, w.shape) || g.Offset != dataStart+w.begin || g.Size != w.size {
						t.Errorf("%s: tensor %d = %+v, want %+v at %d", how, i, g, w, dataStart+w.begin)
					}
					l, ok := f.Lookup(w.name)
					if !ok || l.Name != w.name || l.Offset != g.Offset {
						t.Errorf("%s: Lookup(%q) = %+v, %v", how, w.name, l, ok)
					}
					d, err := f.Data(w.name)
					if err != nil {
						t.Fatalf("%s: Data(%q): %v", how, w.name, err)
					}
					if !bytes.Equal(d, b[dataStart+w.begin:dataStart+w.begin+w.size]) {
						t.Errorf("%s: Data(%q) = %v, want file bytes", how, w.name, d)
					}
				}
				if !equalMeta(f.Metadata(), c.meta) {
					t.Errorf("%s: metadata %q, want %q", how, f.Metadata(), c.meta)
				}
				if _, ok := f.Lookup("nope"); ok {
					t.Errorf("%s: Lookup of missing tensor succeeded", how)
				}
				if _, err := f.Data("nope"); err == nil {
					t.Errorf("%s: Data of missing tensor succeeded", how)
				}
			}
			if len(hts) != len(c.want) || !equalMeta(hmeta, c.meta) {
				t.Fatalf("ReadHeader: %d tensors, meta %q", len(hts), hmeta)
			}
			for i := range hts {
				if hts[i].Name != c.want[i].name || hts[i].Offset != dataStart+c.want[i].begin {
					t.Errorf("ReadHeader tensor %d = %+v", i, hts[i])
				}
			}
		})
	}
}

func equalShape(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func equalMeta(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestReadAtAndClose(t *testing.T) {
	b := fileBytes(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}`, 10)
	p := writeTemp(t, b)
	mm, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	ra, err := OpenReaderAt(p, bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	for how, f := range map[string]*File{"Open": mm, "OpenReaderAt": ra} {
		if f.Path() != p {
			t.Errorf("%s: Path = %q", how, f.Path())
		}
		cases := []struct {
			off  int64
			n    int
			want int
			eof  bool
		}{
			{0, 8, 8, false},
			{int64(len(b)) - 3, 3, 3, false},
			{int64(len(b)) - 3, 5, 3, true},
			{int64(len(b)), 1, 0, true},
			{int64(len(b)) + 100, 1, 0, true},
		}
		for _, c := range cases {
			p := make([]byte, c.n)
			n, err := f.ReadAt(p, c.off)
			if n != c.want || (err == io.EOF) != c.eof || (err != nil && err != io.EOF) {
				t.Errorf("%s: ReadAt(%d bytes at %d) = %d, %v; want %d, eof=%v", how, c.n, c.off, n, err, c.want, c.eof)
			}
			if !bytes.Equal(p[:n], b[min(c.off, int64(len(b))):min(c.off, int64(len(b)))+int64(n)]) {
				t.Errorf("%s: ReadAt(%d at %d) bytes differ", how, c.n, c.off)
			}
		}
		if _, err := f.ReadAt(make([]byte, 1), -1); err == nil {
			t.Errorf("%s: ReadAt at -1 succeeded", how)
		}
		ti, _ := f.Lookup("a")
		sec, err := io.ReadAll(io.NewSectionReader(f, ti.Offset, ti.Size))
		if err != nil || !bytes.Equal(sec, b[ti.Offset:ti.Offset+4]) {
			t.Errorf("%s: section read = %v, %v", how, sec, err)
		}
		if err := f.Close(); err != nil {
			t.Fatalf("%s: Close: %v", how, err)
		}
		if err := f.Close(); err != nil {
			t.Fatalf("%s: second Close: %v", how, err)
		}
		if _, err := f.Data("a"); err == nil {
			t.Errorf("%s: Data after Close succeeded", how)
		}
		if _, err := f.ReadAt(make([]byte, 1), 0); err == nil {
			t.Errorf("%s: ReadAt after Close succeeded", how)
		}
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Open(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open(missing) = %v, want ErrNotExist", err)
	}
	if _, _, err := ReadHeader(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ReadHeader(missing) = %v, want ErrNotExist", err)
	}
	var fe *FormatError
	if _, err := Open(dir); !errors.As(err, &fe) || fe.Field != "file" {
		t.Errorf("Open(dir) = %v, want a FormatError on field file", err)
	}
	// A reader shorter than the size it is said to have.
	b := fileBytes(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}`, 4)
	if _, err := OpenReaderAt("short", bytes.NewReader(b[:20]), int64(len(b))); err == nil || !strings.Contains(err.Error(), "short") {
		t.Errorf("OpenReaderAt(short reader) = %v, want an error naming the file", err)
	}
	f, err := OpenReaderAt("trunc", bytes.NewReader(b[:len(b)-1]), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Data("a"); err == nil || !strings.Contains(err.Error(), `"a"`) {
		t.Errorf("Data from truncated reader = %v, want an error naming the tensor", err)
	}
}

func TestConcurrentReads(t *testing.T) {
	specs := []TensorSpec{{"a", format.F32, []int64{64}}, {"b", format.BF16, []int64{8, 8}}, {"c", format.U8, []int64{3}}}
	p := filepath.Join(t.TempDir(), "c.safetensors")
	w, err := Create(p, specs, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{}
	for i, s := range specs {
		want[s.Name] = bytes.Repeat([]byte{byte(i + 1)}, int(specBytes(s)))
		if err := w.Write(s.Name, want[s.Name]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(p)
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
		errs := make(chan error, 8)
		for g := range 8 {
			go func() {
				for i := range 200 {
					s := specs[(g+i)%len(specs)]
					d, err := f.Data(s.Name)
					if err != nil || !bytes.Equal(d, want[s.Name]) {
						errs <- errors.New(how + ": Data(" + s.Name + ") wrong")
						return
					}
					ti, _ := f.Lookup(s.Name)
					buf := make([]byte, ti.Size)
					if _, err := f.ReadAt(buf, ti.Offset); err != nil || !bytes.Equal(buf, want[s.Name]) {
						errs <- errors.New(how + ": ReadAt(" + s.Name + ") wrong")
						return
					}
				}
				errs <- nil
			}()
		}
		for range 8 {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
	}
}
