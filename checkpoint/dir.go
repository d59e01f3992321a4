package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"moxie/safetensors"
)

// IndexFile is the name of the sharded checkpoint's index.
const IndexFile = "model.safetensors.index.json"

// Dir is a checkpoint directory in the shipped layout: config.json, and either
// model.safetensors.index.json with its shards or a single model.safetensors.
// Shards are memory-mapped; opening reads headers only.
type Dir struct {
	dir       string
	synthetic bool
	files     []*safetensors.File
	where     map[string]dirTensor
	infos     []TensorInfo
}

type dirTensor struct {
	file *safetensors.File
	info safetensors.TensorInfo
}

// OpenDir opens a checkpoint directory. Every shard header is validated, each
// tensor of the index must be in the shard it names and nowhere else, and every
// tensor of every shard must be in the index.
func OpenDir(dir string) (*Dir, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", dir, err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("checkpoint %s: not a directory (want a directory with config.json and safetensors shards, or synth:PRESET)", dir)
	}
	d := &Dir{dir: dir, where: map[string]dirTensor{}}
	cfg, err := d.File("config.json")
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: config.json is required: %w", dir, err)
	}
	var marker map[string]json.RawMessage
	if json.Unmarshal(cfg, &marker) == nil {
		_, d.synthetic = marker[SyntheticKey]
	}
	var shards []string
	var index *safetensors.Index
	if _, err := os.Stat(filepath.Join(dir, IndexFile)); err == nil {
		index, err = safetensors.ReadIndex(filepath.Join(dir, IndexFile))
		if err != nil {
			return nil, err
		}
		seen := map[string]bool{}
		for _, f := range index.WeightMap {
			if !seen[f] {
				seen[f] = true
				shards = append(shards, f)
			}
		}
		sort.Strings(shards)
	} else if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); err == nil {
		shards = []string{"model.safetensors"}
	} else {
		return nil, fmt.Errorf("checkpoint %s: neither %s nor model.safetensors found", dir, IndexFile)
	}
	for _, name := range shards {
		f, err := safetensors.Open(filepath.Join(dir, name))
		if err != nil {
			d.Close()
			return nil, err
		}
		d.files = append(d.files, f)
		for _, ti := range f.Tensors() {
			if prev, dup := d.where[ti.Name]; dup {
				d.Close()
				return nil, fmt.Errorf("checkpoint %s: tensor %q is stored twice, in %s and %s", dir, ti.Name, filepath.Base(prev.file.Path()), name)
			}
			if index != nil && index.WeightMap[ti.Name] != name {
				d.Close()
				if want, ok := index.WeightMap[ti.Name]; ok {
					return nil, fmt.Errorf("checkpoint %s: tensor %q is in %s but the index says %s", dir, ti.Name, name, want)
				}
				return nil, fmt.Errorf("checkpoint %s: tensor %q in %s is missing from %s", dir, ti.Name, name, IndexFile)
			}
			d.where[ti.Name] = dirTensor{file: f, info: ti}
			d.infos = append(d.infos, TensorInfo{Name: ti.Name, DType: ti.DType, Shape: ti.Shape, Size: ti.Size})
		}
	}
	if index != nil {
		var total int64
		for name, shard := range index.WeightMap {
			t, ok := d.where[name]
			if !ok {
				d.Close()
				return nil, fmt.Errorf("checkpoint %s: %s lists tensor %q in %s, but that shard does not hold it", dir, IndexFile, name, shard)
			}
			total += t.info.Size
		}
		if index.TotalSize != 0 && index.TotalSize != total {
			d.Close()
			return nil, fmt.Errorf("checkpoint %s: %s metadata.total_size is %d, but the tensors hold %d bytes", dir, IndexFile, index.TotalSize, total)
		}
	}
	sort.Slice(d.infos, func(i, j int) bool { return d.infos[i].Name < d.infos[j].Name })
	return d, nil
}

// Name is the directory path.
func (d *Dir) Name() string { return d.dir }

// Synthetic reports whether config.json carries the moxie_synthetic marker that
// `moxie synth` writes.
func (d *Dir) Synthetic() bool { return d.synthetic }

// File reads an auxiliary file of the directory. Names are plain file names.
func (d *Dir) File(name string) ([]byte, error) {
	if name == "" || strings.ContainsAny(name, `/\`) || name == "." || name == ".." {
		return nil, fmt.Errorf("checkpoint %s: invalid file name %q", d.dir, name)
	}
	b, err := os.ReadFile(filepath.Join(d.dir, name))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("checkpoint %s: %s: %w", d.dir, name, fs.ErrNotExist)
		}
		return nil, fmt.Errorf("checkpoint %s: %w", d.dir, err)
	}
	return b, nil
}

// Tensors lists every tensor, sorted by name.
func (d *Dir) Tensors() []TensorInfo { return d.infos }

// Lookup describes one tensor.
func (d *Dir) Lookup(name string) (TensorInfo, bool) {
	t, ok := d.where[name]
	if !ok {
		return TensorInfo{}, false
	}
	return TensorInfo{Name: name, DType: t.info.DType, Shape: t.info.Shape, Size: t.info.Size}, true
}

// TensorData returns a read-only view of the tensor in its memory-mapped shard.
func (d *Dir) TensorData(name string) ([]byte, error) {
	t, ok := d.where[name]
	if !ok {
		return nil, fmt.Errorf("checkpoint %s: no tensor %q", d.dir, name)
	}
	return t.file.Data(name)
}

// Locate returns the shard path and byte range of a tensor, for pread access.
func (d *Dir) Locate(name string) (string, int64, int64, error) {
	t, ok := d.where[name]
	if !ok {
		return "", 0, 0, fmt.Errorf("checkpoint %s: no tensor %q", d.dir, name)
	}
	return t.file.Path(), t.info.Offset, t.info.Size, nil
}

// Shards is the number of safetensors files.
func (d *Dir) Shards() int { return len(d.files) }

// Close unmaps every shard.
func (d *Dir) Close() error {
	var first error
	for _, f := range d.files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	d.files = nil
	return first
}

// Open opens a checkpoint by spec: "synth:PRESET?..." for a synthetic source,
// anything else as a directory.
func Open(spec string) (Source, error) {
	if strings.HasPrefix(spec, SynthPrefix) {
		return OpenSynth(spec)
	}
	return OpenDir(spec)
}

// FileNames lists the directory's auxiliary files: every regular top-level file
// that is neither a safetensors shard nor the index, sorted.
func (d *Dir) FileNames() []string {
	ents, err := os.ReadDir(d.dir)
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range ents {
		n := e.Name()
		if !e.Type().IsRegular() || strings.HasSuffix(n, ".safetensors") || n == IndexFile {
			continue
		}
		names = append(names, n)
	}
	return names
}
