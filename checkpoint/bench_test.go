package checkpoint

import (
	"fmt"
	"moxie/internal/cputime"
	"os"
	"path/filepath"
	"testing"

	"moxie/dsv4/config"
	"moxie/safetensors"
)

// writeSparseFlashDir writes a checkpoint directory with the V4-Flash layout in
// 46 shards, like the shipped one: real headers and index, data sections left as
// holes (sparse files), so the 159.6 GB take no disk space.
func writeSparseFlashDir(tb testing.TB, dir string) {
	tb.Helper()
	cfg := config.Flash()
	layout := config.Layout(cfg)
	var total int64
	for _, t := range layout {
		total += t.Bytes()
	}
	const shards = 46
	ix := &safetensors.Index{WeightMap: map[string]string{}}
	start := 0
	var cum int64
	for k := range shards {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", k+1, shards)
		var specs []safetensors.TensorSpec
		for start < len(layout) && (cum < total*int64(k+1)/shards || k == shards-1) {
			t := layout[start]
			specs = append(specs, safetensors.TensorSpec{Name: t.Name, DType: t.DType, Shape: t.Shape})
			ix.WeightMap[t.Name] = name
			cum += t.Bytes()
			start++
		}
		prefix, data, err := safetensors.EncodeHeader(specs, map[string]string{"format": "pt"})
		if err != nil {
			tb.Fatal(err)
		}
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			tb.Fatal(err)
		}
		if _, err := f.Write(prefix); err != nil {
			tb.Fatal(err)
		}
		if err := f.Truncate(int64(len(prefix)) + data); err != nil {
			tb.Fatal(err)
		}
		f.Close()
	}
	ix.TotalSize = total
	if err := safetensors.WriteIndex(filepath.Join(dir, IndexFile), ix); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg.HubJSON(), 0o644); err != nil {
		tb.Fatal(err)
	}
}

// TestSparseFlashDirOpens checks the benchmark's fixture: a 46-shard directory
// with the shipped total opens and lists every tensor of the layout.
func TestSparseFlashDirOpens(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 46 sparse shard headers")
	}
	dir := t.TempDir()
	writeSparseFlashDir(t, dir)
	d, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var total int64
	for _, ti := range d.Tensors() {
		total += ti.Size
	}
	if d.Shards() != 46 || total != 159_609_485_896 || len(d.Tensors()) != len(config.Layout(config.Flash())) {
		t.Fatalf("%d shards, %d bytes, %d tensors", d.Shards(), total, len(d.Tensors()))
	}
}

// BenchmarkOpenDir46Shards opens a V4-Flash-shaped 46-shard checkpoint directory
// (index, 46 mmapped shards, every header validated). Target: under 100 ms.
func BenchmarkOpenDir46Shards(b *testing.B) {
	dir := b.TempDir()
	writeSparseFlashDir(b, dir)
	cpu0 := cputime.Process()
	for b.Loop() {
		d, err := OpenDir(dir)
		if err != nil {
			b.Fatal(err)
		}
		d.Close()
	}
	// On a loaded machine wall time overstates the cost; CPU time per open is
	// what one uncontended core would take (GC included).
	b.ReportMetric(float64((cputime.Process()-cpu0).Milliseconds())/float64(b.N), "cpu-ms/op")
}
