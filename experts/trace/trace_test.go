package trace

import (
	"bytes"
	"encoding/binary"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"moxie/checkpoint"
	"moxie/dsv4"
	"moxie/dsv4/config"
)

var _ dsv4.RouteRecorder = (*Writer)(nil)

func testHeader() Header {
	return Header{Name: "synth:tiny", Layers: 5, Experts: 8, TopK: 2, ExpertBytes: 1234, DenseBytesPerToken: 99}
}

func TestRoundTrip(t *testing.T) {
	h := testHeader()
	recs := []Record{
		{Pos: 0, Layer: 0, Experts: []int{3, 1}, Weights: []float32{0.75, 0.5}},
		{Pos: 0, Layer: 4, Experts: []int{7, 0}, Weights: []float32{-1, float32(math.SmallestNonzeroFloat32)}},
		{Pos: math.MaxUint32, Layer: 2, Experts: []int{2, 5}, Weights: []float32{0, 1e30}},
	}
	var buf bytes.Buffer
	w, err := NewWriter(&buf, h)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		w.RecordRoute(r.Pos, r.Layer, r.Experts, r.Weights)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	// Size from the format description: 42 + len(name) header bytes, 6+6·topk per record.
	if want := 42 + len(h.Name) + len(recs)*(6+6*2); buf.Len() != want {
		t.Fatalf("file is %d bytes, want %d", buf.Len(), want)
	}
	// Spot-check the layout by hand: record 0 starts after the header.
	b := buf.Bytes()
	if string(b[:8]) != "MOXROUTE" || binary.LittleEndian.Uint32(b[20:]) != 2 {
		t.Fatalf("header bytes % x", b[:24])
	}
	r0 := b[42+len(h.Name):]
	if binary.LittleEndian.Uint16(r0[6:]) != 3 || math.Float32frombits(binary.LittleEndian.Uint32(r0[10:])) != 0.75 {
		t.Fatalf("record 0 bytes % x", r0[:18])
	}
	got, err := Read(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if got.Header != h {
		t.Fatalf("header %+v, want %+v", got.Header, h)
	}
	if len(got.Records) != len(recs) {
		t.Fatalf("%d records, want %d", len(got.Records), len(recs))
	}
	for i, r := range got.Records {
		if r.Pos != recs[i].Pos || r.Layer != recs[i].Layer || !slices.Equal(r.Experts, recs[i].Experts) || !slices.Equal(r.Weights, recs[i].Weights) {
			t.Fatalf("record %d = %+v, want %+v", i, r, recs[i])
		}
	}
}

func TestWriterRejectsBadRecords(t *testing.T) {
	for _, tc := range []struct {
		name    string
		pos, l  int
		e       []int
		w       []float32
		wantErr string
	}{
		{"layer", 0, 5, []int{0, 1}, []float32{1, 1}, "layer 5 out of range"},
		{"expert", 0, 0, []int{0, 8}, []float32{1, 1}, "expert 8 out of range"},
		{"dup", 0, 0, []int{2, 2}, []float32{1, 1}, "selected twice"},
		{"count", 0, 0, []int{2}, []float32{1}, "want 2 each"},
		{"nan", 0, 0, []int{0, 1}, []float32{1, float32(math.NaN())}, "want finite"},
		{"pos", -1, 0, []int{0, 1}, []float32{1, 1}, "position -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			w, err := NewWriter(&buf, testHeader())
			if err != nil {
				t.Fatal(err)
			}
			w.RecordRoute(tc.pos, tc.l, tc.e, tc.w)
			w.RecordRoute(0, 0, []int{0, 1}, []float32{1, 1}) // dropped after the error
			err = w.Close()
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Close = %v, want an error containing %q", err, tc.wantErr)
			}
			if w.Records() != 0 {
				t.Fatalf("%d records written after a failure", w.Records())
			}
		})
	}
}

func validFile(t testing.TB) []byte {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, testHeader())
	if err != nil {
		t.Fatal(err)
	}
	w.RecordRoute(1, 1, []int{4, 6}, []float32{0.5, 0.25})
	w.RecordRoute(2, 3, []int{0, 7}, []float32{1, 2})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestReaderRejectsCorruptFiles(t *testing.T) {
	good := validFile(t)
	hdrEnd := 42 + len(testHeader().Name)
	edit := func(f func(b []byte) []byte) []byte { return f(slices.Clone(good)) }
	put16 := func(off int, v uint16) []byte {
		return edit(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[off:], v); return b })
	}
	put32 := func(off int, v uint32) []byte {
		return edit(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[off:], v); return b })
	}
	for _, tc := range []struct {
		name    string
		data    []byte
		wantErr string
	}{
		{"empty", nil, "want 42 bytes"},
		{"magic", edit(func(b []byte) []byte { b[0] = 'X'; return b }), "not a moxie route trace"},
		{"version", put32(8, 2), "version 2"},
		{"layers0", put32(12, 0), "layers is 0"},
		{"experts", put32(16, 70000), "experts is 70000"},
		{"topk", put32(20, 9), "topk is 9"},
		{"name long", put16(40, 2000), "name is 2000 bytes"},
		{"name short", good[:44], "name of 10 bytes"},
		{"name utf8", edit(func(b []byte) []byte { b[42] = 0xff; return b }), "not valid UTF-8"},
		{"expert bytes", edit(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[24:], 1<<63); return b }), "too large"},
		{"partial record", good[:len(good)-3], "record 1 at byte"},
		{"record layer", put16(hdrEnd+4, 5), "layer 5 out of range"},
		{"record expert", put16(hdrEnd+6, 8), "expert 8 out of range"},
		{"record dup", put16(hdrEnd+6, 6), "selected twice"},
		{"record inf", put32(hdrEnd+10, math.Float32bits(float32(math.Inf(1)))), "want finite"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Read(bytes.NewReader(tc.data))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Read = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestCreateIsAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "routes.trace")
	w, err := Create(path, testHeader())
	if err != nil {
		t.Fatal(err)
	}
	w.RecordRoute(0, 0, []int{1, 2}, []float32{1, 1})
	if _, err := os.Stat(path); err == nil {
		t.Fatal("trace visible before Close")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	tr, err := ReadFile(path)
	if err != nil || len(tr.Records) != 1 {
		t.Fatalf("read back: %v, %v", tr, err)
	}
	// A failed writer leaves nothing behind.
	bad := filepath.Join(dir, "bad.trace")
	w, err = Create(bad, testHeader())
	if err != nil {
		t.Fatal(err)
	}
	w.RecordRoute(0, 9, []int{1, 2}, []float32{1, 1})
	if err := w.Close(); err == nil {
		t.Fatal("Close succeeded after a bad record")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("directory holds %d entries after a failed write, want 1", len(ents))
	}
}

// TestHeaderForFlash: expert bytes from dsv4-flash.md §8 shapes: w1 and w3
// [2048, 4096] MXFP4 = 2048·2048 bytes + 2048·128 scales each; w2 [4096, 2048]
// = 4096·1024 + 4096·64.
func TestHeaderForFlash(t *testing.T) {
	h := HeaderFor("flash", config.Flash())
	want := int64(2*(2048*2048+2048*128) + 4096*1024 + 4096*64)
	if h.ExpertBytes != want {
		t.Fatalf("ExpertBytes = %d, want %d", h.ExpertBytes, want)
	}
	if h.Layers != 44 || h.Experts != 256 || h.TopK != 6 {
		t.Fatalf("header %+v", h)
	}
	// §8: 11.22 GB/token in total, of which 3.449 GB routed experts.
	if d := float64(h.DenseBytesPerToken) / 1e9; d < 7.7 || d > 7.8 {
		t.Fatalf("dense bytes per token %.3f GB, want about 11.22-3.45 = 7.77", d)
	}
}

// TestRecordsAForwardPass records synth:tiny's routes through dsv4 and checks
// the count the model implies: one record per token and main layer.
func TestRecordsAForwardPass(t *testing.T) {
	src, err := checkpoint.Open("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg := src.(*checkpoint.Synth).Config()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, HeaderFor(src.Name(), cfg))
	if err != nil {
		t.Fatal(err)
	}
	m, err := dsv4.Load(src, dsv4.Options{Routes: w})
	if err != nil {
		t.Fatal(err)
	}
	s := m.NewSession()
	if _, err := s.Prefill([]int{5, 6, 7}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Decode(9); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	tr, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Records) != 4*cfg.NLayers {
		t.Fatalf("%d records, want %d", len(tr.Records), 4*cfg.NLayers)
	}
	last := tr.Records[len(tr.Records)-1]
	if last.Pos != 3 || last.Layer != cfg.NLayers-1 {
		t.Fatalf("last record %+v, want position 3 in layer %d", last, cfg.NLayers-1)
	}
	var _ io.Reader = &buf
}
