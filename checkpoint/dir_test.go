package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"moxie/dsv4/config"
	"moxie/format"
	"moxie/safetensors"
)

// writeTinyDir writes synth:tiny as a directory of several shards and returns it.
func writeTinyDir(t *testing.T) string {
	t.Helper()
	gen, err := OpenSynth("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	aux, _ := AuxFiles(gen)
	dir := filepath.Join(t.TempDir(), "tiny")
	if err := WriteDir(dir, aux, gen.OutTensors(), WriteOptions{ShardSize: 512 << 10}); err != nil {
		t.Fatal(err)
	}
	return dir
}

func editIndex(t *testing.T, dir string, edit func(ix *safetensors.Index)) {
	t.Helper()
	p := filepath.Join(dir, IndexFile)
	ix, err := safetensors.ReadIndex(p)
	if err != nil {
		t.Fatal(err)
	}
	edit(ix)
	if err := safetensors.WriteIndex(p, ix); err != nil {
		t.Fatal(err)
	}
}

func TestOpenDirRejects(t *testing.T) {
	const moved = "layers.0.attn.wq_a.weight"
	cases := []struct {
		name    string
		corrupt func(t *testing.T, dir string)
		want    []string
	}{
		{"tensor under the wrong shard", func(t *testing.T, dir string) {
			editIndex(t, dir, func(ix *safetensors.Index) {
				for _, s := range ix.Shards() {
					if s != ix.WeightMap[moved] {
						ix.WeightMap[moved] = s
						return
					}
				}
			})
		}, []string{moved, "the index says"}},
		{"tensor missing from the index", func(t *testing.T, dir string) {
			editIndex(t, dir, func(ix *safetensors.Index) { delete(ix.WeightMap, moved) })
		}, []string{moved, "missing from " + IndexFile}},
		{"index lists a tensor no shard holds", func(t *testing.T, dir string) {
			editIndex(t, dir, func(ix *safetensors.Index) { ix.WeightMap["layers.9.ghost"] = ix.WeightMap[moved] })
		}, []string{"layers.9.ghost", "does not hold it"}},
		{"total size mismatch", func(t *testing.T, dir string) {
			editIndex(t, dir, func(ix *safetensors.Index) { ix.TotalSize++ })
		}, []string{"total_size"}},
		{"no config", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "config.json"))
		}, []string{"config.json is required"}},
		{"no index or model file", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, IndexFile))
		}, []string{"neither"}},
		{"truncated shard", func(t *testing.T, dir string) {
			ix, _ := safetensors.ReadIndex(filepath.Join(dir, IndexFile))
			p := filepath.Join(dir, ix.WeightMap[moved])
			st, _ := os.Stat(p)
			os.Truncate(p, st.Size()/2)
		}, []string{".safetensors"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeTinyDir(t)
			tc.corrupt(t, dir)
			d, err := OpenDir(dir)
			if err == nil {
				d.Close()
				t.Fatal("opened a broken checkpoint")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	t.Run("not a directory", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "file")
		os.WriteFile(f, nil, 0o644)
		if _, err := OpenDir(f); err == nil || !strings.Contains(err.Error(), "not a directory") {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestDirLookupLocateAndFiles(t *testing.T) {
	dir := writeTinyDir(t)
	d, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	name := "layers.3.ffn.experts.5.w2.weight"
	info, ok := d.Lookup(name)
	if !ok {
		t.Fatalf("Lookup(%s) failed", name)
	}
	path, off, size, err := d.Locate(name)
	if err != nil || size != info.Size {
		t.Fatalf("Locate: %v, size %d want %d", err, size, info.Size)
	}
	// The bytes at that range of that file are the tensor's bytes.
	f, _ := os.Open(path)
	defer f.Close()
	buf := make([]byte, size)
	if _, err := f.ReadAt(buf, off); err != nil {
		t.Fatal(err)
	}
	want, _ := d.TensorData(name)
	if string(buf) != string(want) {
		t.Fatal("Locate's byte range does not hold the tensor")
	}
	if _, ok := d.Lookup("nope"); ok {
		t.Fatal("Lookup of an unknown tensor succeeded")
	}
	if _, err := d.TensorData("nope"); err == nil {
		t.Fatal("TensorData of an unknown tensor succeeded")
	}
	if _, err := d.File("tokenizer.json"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.File("absent.json"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v, want fs.ErrNotExist", err)
	}
	for _, bad := range []string{"../config.json", "a/b", ".."} {
		if _, err := d.File(bad); err == nil {
			t.Fatalf("File(%q) escaped the directory", bad)
		}
	}
	names := d.FileNames()
	if strings.Join(names, ",") != "config.json,generation_config.json,tokenizer.json,tokenizer_config.json" {
		t.Fatalf("FileNames = %v", names)
	}
	if got := len(d.Tensors()); got != len(config.Layout(config.Tiny())) {
		t.Fatalf("%d tensors", got)
	}
}

func TestOpenDirSingleFile(t *testing.T) {
	dir := writeTinyDir(t)
	// Merge into one model.safetensors without an index.
	src, _ := OpenDir(dir)
	var specs []safetensors.TensorSpec
	for _, ti := range src.Tensors() {
		specs = append(specs, safetensors.TensorSpec{Name: ti.Name, DType: ti.DType, Shape: ti.Shape})
	}
	one := filepath.Join(t.TempDir(), "one")
	os.Mkdir(one, 0o755)
	w, err := safetensors.Create(filepath.Join(one, "model.safetensors"), specs, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range specs {
		b, _ := src.TensorData(s.Name)
		if err := w.Write(s.Name, b); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	src.Close()
	cfg, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	os.WriteFile(filepath.Join(one, "config.json"), cfg, 0o644)
	d, err := OpenDir(one)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Shards() != 1 || len(d.Tensors()) != len(specs) || !d.Synthetic() {
		t.Fatalf("single-file dir: %d shards, %d tensors", d.Shards(), len(d.Tensors()))
	}
	if _, ok := d.Lookup("embed.weight"); !ok {
		t.Fatal("lookup in a single-file dir failed")
	}
}

// A failing tensor stops WriteDir without generating the rest, and leaves no
// directory behind.
func TestWriteDirStopsOnError(t *testing.T) {
	var calls atomic.Int64
	tensors := make([]OutTensor, 1000)
	for i := range tensors {
		tensors[i] = OutTensor{Name: fmt.Sprintf("t%04d", i), DType: format.F32, Shape: []int64{4},
			Data: func() ([]byte, error) {
				calls.Add(1)
				if i == 3 {
					return nil, errors.New("boom")
				}
				return make([]byte, 16), nil
			}}
	}
	dir := filepath.Join(t.TempDir(), "out")
	err := WriteDir(dir, nil, tensors, WriteOptions{Workers: 2})
	if err == nil || !strings.Contains(err.Error(), "t0003") || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("err = %v, want the failing tensor named", err)
	}
	if n := calls.Load(); n > 10 {
		t.Fatalf("%d of 1000 tensors generated after an early failure", n)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("a failed WriteDir left %s", dir)
	}
}
