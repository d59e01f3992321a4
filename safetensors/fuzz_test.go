package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzParseHeader feeds arbitrary bytes as a whole file. It must never panic, and
// any accepted file must satisfy the invariants the package documents, checked
// independently here (big-integer sizes, encoding/json as a JSON oracle), read
// the same through Open and OpenReaderAt, and survive a rewrite with Writer.
func FuzzParseHeader(f *testing.F) {
	for _, c := range hostileCases() {
		f.Add(c.file)
	}
	f.Add(fileBytes(`{}`, 0))
	f.Add(fileBytes(`{"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},"b":{"dtype":"F8_E4M3","shape":[],"data_offsets":[12,13]}}`, 16))
	f.Fuzz(checkFile)
}

// FuzzParseHeaderJSON fuzzes the JSON header alone (the length prefix is always
// right and dataLen data bytes follow), so that the fuzzer spends its effort on
// the grammar and the range checks; the checks are those of FuzzParseHeader.
func FuzzParseHeaderJSON(f *testing.F) {
	for _, c := range hostileCases() {
		if len(c.file) >= 8 {
			n := binary.LittleEndian.Uint64(c.file)
			if n <= uint64(len(c.file)-8) {
				f.Add(c.file[8:8+n], uint16(len(c.file)-8-int(n)))
			}
		}
	}
	f.Add([]byte(`{"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},"b":{"dtype":"F8_E4M3","shape":[],"data_offsets":[12,13]}}`), uint16(16))
	f.Fuzz(func(t *testing.T, hdr []byte, dataLen uint16) {
		checkFile(t, fileBytes(string(hdr), int(dataLen)))
	})
}

// checkFile is the body of the header fuzzers: data is a whole file.
func checkFile(t *testing.T, data []byte) {
	ra, err := OpenReaderAt("fuzz", bytes.NewReader(data), int64(len(data)))
	if err != nil {
		if _, ok := err.(*FormatError); !ok {
			t.Fatalf("rejection is %T, want *FormatError: %v", err, err)
		}
		return
	}
	defer ra.Close()
	n := int64(binary.LittleEndian.Uint64(data))
	hdr := data[8 : 8+n]
	checkInvariants(t, ra, data, 8+n)

	// encoding/json agrees the header is one valid object with the same keys
	// (this package rejects duplicates and invalid UTF-8, so the map is exact).
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(hdr, &raw); err != nil {
		t.Fatalf("accepted header that encoding/json rejects: %v", err)
	}
	wantKeys := len(ra.Tensors())
	if _, ok := raw[metadataKey]; ok {
		wantKeys++
	}
	if len(raw) != wantKeys {
		t.Fatalf("encoding/json sees %d keys, reader %d tensors (+metadata)", len(raw), len(ra.Tensors()))
	}
	for _, ti := range ra.Tensors() {
		var e oracleEntry
		if err := json.Unmarshal(raw[ti.Name], &e); err != nil {
			t.Fatalf("oracle entry %q: %v", ti.Name, err)
		}
		if e.DType != ti.DType.String() || !equalShape(e.Shape, ti.Shape) || e.DataOffsets != [2]int64{ti.Offset - 8 - n, ti.Offset - 8 - n + ti.Size} {
			t.Fatalf("oracle entry %q = %+v, reader %+v", ti.Name, e, ti)
		}
	}

	// Open (mmap) and ReadHeader agree with OpenReaderAt.
	dir := t.TempDir()
	p := filepath.Join(dir, "f.safetensors")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	mm, err := Open(p)
	if err != nil {
		t.Fatalf("OpenReaderAt accepts, Open rejects: %v", err)
	}
	defer mm.Close()
	if !sameInfos(mm.Tensors(), ra.Tensors()) || !maps.Equal(mm.Metadata(), ra.Metadata()) {
		t.Fatal("Open and OpenReaderAt disagree")
	}
	hts, hmeta, err := ReadHeader(p)
	if err != nil || !sameInfos(hts, ra.Tensors()) || !maps.Equal(hmeta, ra.Metadata()) {
		t.Fatalf("ReadHeader disagrees (err %v)", err)
	}

	// Rewrite in offset order and read back.
	var specs []TensorSpec
	for _, ti := range ra.Tensors() {
		specs = append(specs, TensorSpec{ti.Name, ti.DType, ti.Shape})
	}
	out := filepath.Join(dir, "out.safetensors")
	w, err := Create(out, specs, ra.Metadata())
	if err != nil {
		t.Fatalf("Create rejects specs of an accepted file: %v", err)
	}
	for _, ti := range ra.Tensors() {
		d, _ := mm.Data(ti.Name)
		if err := w.Write(ti.Name, d); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	back, err := Open(out)
	if err != nil {
		t.Fatalf("rewritten file rejected: %v", err)
	}
	defer back.Close()
	if !maps.Equal(back.Metadata(), ra.Metadata()) || len(back.Tensors()) != len(specs) {
		t.Fatal("rewrite changed metadata or tensor count")
	}
	for _, ti := range ra.Tensors() {
		b, ok := back.Lookup(ti.Name)
		d1, _ := back.Data(ti.Name)
		d0, _ := mm.Data(ti.Name)
		if !ok || b.DType != ti.DType || !equalShape(b.Shape, ti.Shape) || !bytes.Equal(d0, d1) {
			t.Fatalf("rewrite changed %q", ti.Name)
		}
	}
}

func sameInfos(a, b []TensorInfo) bool {
	return slices.EqualFunc(a, b, func(x, y TensorInfo) bool {
		return x.Name == y.Name && x.DType == y.DType && equalShape(x.Shape, y.Shape) && x.Offset == y.Offset && x.Size == y.Size
	})
}

// checkInvariants verifies what an accepted file promises, from first principles.
func checkInvariants(t *testing.T, f *File, data []byte, dataStart int64) {
	t.Helper()
	ts := f.Tensors()
	names := map[string]bool{}
	for i, ti := range ts {
		if ti.Name == "" || ti.Name == metadataKey || names[ti.Name] {
			t.Fatalf("bad or duplicate name %q", ti.Name)
		}
		names[ti.Name] = true
		eb, ok := elemBytes[ti.DType]
		if !ok {
			t.Fatalf("%q: unknown dtype %v accepted", ti.Name, ti.DType)
		}
		size := big.NewInt(eb)
		for _, d := range ti.Shape {
			if d < 0 {
				t.Fatalf("%q: negative dim", ti.Name)
			}
			size.Mul(size, big.NewInt(d))
		}
		if !size.IsInt64() || size.Int64() != ti.Size {
			t.Fatalf("%q: size %d, want %v", ti.Name, ti.Size, size)
		}
		if ti.Offset < dataStart || ti.Size < 0 || ti.Offset+ti.Size > int64(len(data)) {
			t.Fatalf("%q: range [%d,+%d) outside data section [%d,%d)", ti.Name, ti.Offset, ti.Size, dataStart, len(data))
		}
		if i > 0 && ts[i-1].Offset > ti.Offset {
			t.Fatal("not sorted by offset")
		}
		for _, o := range ts[:i] {
			if ti.Size > 0 && o.Size > 0 && ti.Offset < o.Offset+o.Size && o.Offset < ti.Offset+ti.Size {
				t.Fatalf("%q overlaps %q", ti.Name, o.Name)
			}
		}
		l, ok := f.Lookup(ti.Name)
		if !ok || l.Offset != ti.Offset {
			t.Fatalf("Lookup(%q) inconsistent", ti.Name)
		}
		d, err := f.Data(ti.Name)
		if err != nil || !bytes.Equal(d, data[ti.Offset:ti.Offset+ti.Size]) {
			t.Fatalf("Data(%q) wrong (err %v)", ti.Name, err)
		}
	}
}

// FuzzReadIndex feeds arbitrary bytes as an index file. It must never panic; an
// accepted index must be valid JSON that encoding/json reads the same way, hold
// only plain shard file names, and round-trip through WriteIndex.
func FuzzReadIndex(f *testing.F) {
	f.Add([]byte(`{"metadata":{"total_size":10},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}`))
	f.Add([]byte(`{"weight_map":{},"metadata":{"total_size":0,"x":[1,{"y":null}]}}`))
	f.Add([]byte(`{"metadata":{"total_size":1},"weight_map":{"a":"../x"}}`))
	f.Add([]byte(`{"metadata":{"total_size":1},"weight_map":{"a":"s","a":"t"}}`))
	f.Add([]byte(`{"metadata":{"total_size":-1},"weight_map":{}}`))
	f.Add([]byte(`{"metadata":{"total_size":1,"x":[[[[[[[]]]]]]]},"weight_map":{}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		ix, err := parseIndex("fuzz.json", data)
		if err != nil {
			if _, ok := err.(*FormatError); !ok {
				t.Fatalf("rejection is %T, want *FormatError: %v", err, err)
			}
			return
		}
		if ix.TotalSize < 0 || ix.WeightMap == nil {
			t.Fatalf("accepted index %+v", ix)
		}
		var o struct {
			Metadata  map[string]json.RawMessage `json:"metadata"`
			WeightMap map[string]string          `json:"weight_map"`
		}
		if err := json.Unmarshal(data, &o); err != nil {
			t.Fatalf("accepted index that encoding/json rejects: %v", err)
		}
		if !maps.Equal(o.WeightMap, ix.WeightMap) {
			t.Fatal("encoding/json reads a different weight_map")
		}
		var total int64
		if err := json.Unmarshal(o.Metadata["total_size"], &total); err != nil || total != ix.TotalSize {
			t.Fatalf("encoding/json reads total_size %d (%v), want %d", total, err, ix.TotalSize)
		}
		for name, shard := range ix.WeightMap {
			if name == "" || shard == "" || shard == "." || strings.ContainsAny(shard, "/\\\x00") || strings.Contains(shard, "..") {
				t.Fatalf("accepted tensor %q -> shard %q", name, shard)
			}
		}
		p := filepath.Join(t.TempDir(), IndexFile)
		if err := WriteIndex(p, ix); err != nil {
			t.Fatalf("WriteIndex rejects an accepted index: %v", err)
		}
		back, err := ReadIndex(p)
		if err != nil || back.TotalSize != ix.TotalSize || !maps.Equal(back.WeightMap, ix.WeightMap) {
			t.Fatalf("round trip: %+v, %v", back, err)
		}
	})
}

// FuzzIndexNames builds an index around arbitrary tensor and shard names (JSON
// escaped by encoding/json, independently of this package) and checks the
// accept/reject decision against the documented rule and the decoded values.
func FuzzIndexNames(f *testing.F) {
	f.Add("layers.0.ffn.experts.1.w1.weight", "model-00002-of-00046.safetensors", int64(5))
	f.Add("a", "../model.safetensors", int64(1))
	f.Add("a", "sub\\x", int64(1))
	f.Add("", "s", int64(0))
	f.Add("é\u2028<>&", "x..y", int64(-3))
	f.Add("a", "\x00", int64(1))
	f.Add("a\xff", "s", int64(1))
	f.Fuzz(func(t *testing.T, name, shard string, total int64) {
		if !utf8.ValidString(name) || !utf8.ValidString(shard) {
			t.Skip("JSON text cannot carry invalid UTF-8 (encoding/json would substitute U+FFFD)")
		}
		nb, _ := json.Marshal(name)
		sb, _ := json.Marshal(shard)
		text := fmt.Sprintf(`{"metadata": {"total_size": %d}, "weight_map": {%s: %s}}`, total, nb, sb)
		ix, err := parseIndex("names.json", []byte(text))
		valid := total >= 0 && name != "" &&
			shard != "" && shard != "." && !strings.ContainsAny(shard, "/\\\x00") && !strings.Contains(shard, "..")
		if (err == nil) != valid {
			t.Fatalf("%s: error %v, want valid=%v", text, err, valid)
		}
		if err == nil && (ix.TotalSize != total || len(ix.WeightMap) != 1 || ix.WeightMap[name] != shard) {
			t.Fatalf("%s: decoded %+v", text, ix)
		}
	})
}
