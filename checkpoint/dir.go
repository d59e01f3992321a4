package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

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
	byName    map[string]*safetensors.File // shard file name -> shard
	index     *safetensors.Index           // nil for a single model.safetensors

	infosOnce sync.Once
	infos     []TensorInfo
}

// OpenDir opens a checkpoint directory. Every shard header is validated, each
// tensor of every shard must be listed in the index under that shard (so none is
// stored twice), and every tensor of the index must be in its shard.
func OpenDir(dir string) (*Dir, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", dir, err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("checkpoint %s: not a directory (want a directory with config.json and safetensors shards, or synth:PRESET)", dir)
	}
	d := &Dir{dir: dir, byName: map[string]*safetensors.File{}}
	cfg, err := d.File("config.json")
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: config.json is required: %w", dir, err)
	}
	var marker map[string]json.RawMessage
	if json.Unmarshal(cfg, &marker) == nil {
		_, d.synthetic = marker[SyntheticKey]
	}
	var shards []string
	if _, err := os.Stat(filepath.Join(dir, IndexFile)); err == nil {
		d.index, err = safetensors.ReadIndex(filepath.Join(dir, IndexFile))
		if err != nil {
			return nil, err
		}
		shards = d.index.Shards()
	} else if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); err == nil {
		shards = []string{"model.safetensors"}
	} else {
		return nil, fmt.Errorf("checkpoint %s: neither %s nor model.safetensors found", dir, IndexFile)
	}
	fail := func(format string, a ...any) (*Dir, error) {
		d.Close()
		return nil, fmt.Errorf("checkpoint %s: "+format, append([]any{dir}, a...)...)
	}
	// Open and check the shards in parallel: each header parse is independent.
	files := make([]*safetensors.File, len(shards))
	errs := make([]error, len(shards))
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i, name := range shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			files[i], errs[i] = safetensors.Open(filepath.Join(dir, name))
			if errs[i] == nil {
				errs[i] = d.checkShard(name, files[i])
			}
		}()
	}
	wg.Wait()
	for i, name := range shards {
		if files[i] != nil {
			d.files = append(d.files, files[i])
			d.byName[name] = files[i]
		}
	}
	for _, err := range errs {
		if err != nil {
			d.Close()
			return nil, err
		}
	}
	var count int
	var total int64
	for _, f := range d.files {
		for _, ti := range f.Tensors() {
			count++
			total += ti.Size
		}
	}
	if d.index != nil {
		// Every shard tensor is in the index under its own shard, so equal counts
		// mean every index entry was found.
		if count != len(d.index.WeightMap) {
			for name, shard := range d.index.WeightMap {
				if _, ok := d.byName[shard].Lookup(name); !ok {
					return fail("%s lists tensor %q in %s, but that shard does not hold it", IndexFile, name, shard)
				}
			}
		}
		if d.index.TotalSize != 0 && d.index.TotalSize != total {
			return fail("%s metadata.total_size is %d, but the tensors hold %d bytes", IndexFile, d.index.TotalSize, total)
		}
	}
	return d, nil
}

// checkShard checks that every tensor of shard name is listed in the index
// under that shard.
func (d *Dir) checkShard(name string, f *safetensors.File) error {
	if d.index == nil {
		return nil
	}
	for _, ti := range f.Tensors() {
		switch want, ok := d.index.WeightMap[ti.Name]; {
		case !ok:
			return fmt.Errorf("checkpoint %s: tensor %q in %s is missing from %s", d.dir, ti.Name, name, IndexFile)
		case want != name:
			return fmt.Errorf("checkpoint %s: tensor %q is in %s but the index says %s", d.dir, ti.Name, name, want)
		}
	}
	return nil
}

// lookup finds the shard holding a tensor.
func (d *Dir) lookup(name string) (*safetensors.File, safetensors.TensorInfo, bool) {
	f := d.files[0]
	if d.index != nil {
		shard, ok := d.index.WeightMap[name]
		if !ok {
			return nil, safetensors.TensorInfo{}, false
		}
		f = d.byName[shard]
	}
	ti, ok := f.Lookup(name)
	return f, ti, ok
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

// Tensors lists every tensor, sorted by name (built on first use).
func (d *Dir) Tensors() []TensorInfo {
	d.infosOnce.Do(func() {
		for _, f := range d.files {
			for _, ti := range f.Tensors() {
				d.infos = append(d.infos, TensorInfo{Name: ti.Name, DType: ti.DType, Shape: ti.Shape, Size: ti.Size})
			}
		}
		slices.SortFunc(d.infos, func(a, b TensorInfo) int { return strings.Compare(a.Name, b.Name) })
	})
	return d.infos
}

// Lookup describes one tensor.
func (d *Dir) Lookup(name string) (TensorInfo, bool) {
	_, ti, ok := d.lookup(name)
	if !ok {
		return TensorInfo{}, false
	}
	return TensorInfo{Name: name, DType: ti.DType, Shape: ti.Shape, Size: ti.Size}, true
}

// TensorData returns a read-only view of the tensor in its memory-mapped shard.
func (d *Dir) TensorData(name string) ([]byte, error) {
	f, _, ok := d.lookup(name)
	if !ok {
		return nil, fmt.Errorf("checkpoint %s: no tensor %q", d.dir, name)
	}
	return f.Data(name)
}

// Locate returns the shard path and byte range of a tensor, for pread access.
func (d *Dir) Locate(name string) (string, int64, int64, error) {
	f, ti, ok := d.lookup(name)
	if !ok {
		return "", 0, 0, fmt.Errorf("checkpoint %s: no tensor %q", d.dir, name)
	}
	return f.Path(), ti.Offset, ti.Size, nil
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
