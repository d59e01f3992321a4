package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"

	"moxie/format"
	"moxie/safetensors"
)

// OutTensor is one tensor to write: its description and a function producing its
// bytes (called once, possibly from another goroutine).
type OutTensor struct {
	Name  string
	DType format.DType
	Shape []int64
	Data  func() ([]byte, error)
}

func (t OutTensor) size() int64 {
	n := int64(t.DType.Size())
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// WriteOptions controls WriteDir.
type WriteOptions struct {
	// ShardSize is the largest shard in bytes (a tensor larger than it gets a
	// shard of its own). Zero means 4 GiB.
	ShardSize int64
	// Metadata is stored in every shard's __metadata__.
	Metadata map[string]string
	// Progress, if set, is called with the number of bytes written after each tensor.
	Progress func(bytes int64)
	// Workers produce tensor bytes concurrently (0 = number of CPUs).
	Workers int
}

// WriteDir writes a checkpoint directory: the auxiliary files (config.json, ...)
// and the tensors, in the given order, split into shards named
// model-NNNNN-of-MMMMM.safetensors with a model.safetensors.index.json. It
// builds everything in a temporary directory beside dir and renames it into place
// at the end, so dir appears complete or not at all. dir must not exist.
func WriteDir(dir string, aux map[string][]byte, tensors []OutTensor, opts WriteOptions) (err error) {
	if _, err := os.Stat(dir); err == nil {
		return fmt.Errorf("%s already exists; choose a new output directory (moxie never overwrites a checkpoint)", dir)
	}
	if opts.ShardSize <= 0 {
		opts.ShardSize = 4 << 30
	}
	seen := map[string]bool{}
	for _, t := range tensors {
		if seen[t.Name] {
			return fmt.Errorf("writing %s: tensor %q given twice", dir, t.Name)
		}
		seen[t.Name] = true
	}
	parent := filepath.Dir(filepath.Clean(dir))
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".tmp-")
	if err != nil {
		return fmt.Errorf("writing %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	for name, b := range aux {
		if err := os.WriteFile(filepath.Join(tmp, name), b, 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", dir, err)
		}
	}
	// Assign tensors to shards greedily in order.
	var shards [][]OutTensor
	var cur int64
	for _, t := range tensors {
		if len(shards) == 0 || cur > 0 && cur+t.size() > opts.ShardSize {
			shards = append(shards, nil)
			cur = 0
		}
		shards[len(shards)-1] = append(shards[len(shards)-1], t)
		cur += t.size()
	}
	done := make(chan struct{})
	defer close(done) // on an early return, producers stop instead of finishing every tensor
	data := produce(tensors, opts.Workers, done)
	index := &safetensors.Index{WeightMap: map[string]string{}}
	for si, shard := range shards {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", si+1, len(shards))
		specs := make([]safetensors.TensorSpec, len(shard))
		for i, t := range shard {
			specs[i] = safetensors.TensorSpec{Name: t.Name, DType: t.DType, Shape: t.Shape}
		}
		w, err := safetensors.Create(filepath.Join(tmp, name), specs, opts.Metadata)
		if err != nil {
			return err
		}
		for _, t := range shard {
			r := <-data
			if r.err == nil {
				r.err = w.Write(t.Name, r.b)
			}
			if r.err != nil {
				w.Abort()
				return fmt.Errorf("writing %s: tensor %s: %w", dir, t.Name, r.err)
			}
			index.WeightMap[t.Name] = name
			index.TotalSize += int64(len(r.b))
			if opts.Progress != nil {
				opts.Progress(int64(len(r.b)))
			}
		}
		if err := w.Close(); err != nil {
			return err
		}
	}
	if err := safetensors.WriteIndex(filepath.Join(tmp, IndexFile), index); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("writing %s: %w", dir, err)
	}
	return syncDir(parent)
}

type produced struct {
	b   []byte
	err error
}

// produce runs the tensors' Data functions on workers and delivers the results
// in order, with a bounded number in flight. Closing done stops it: no new
// tensor is started and delivery ends (the output channel may then stay open).
func produce(tensors []OutTensor, workers int, done <-chan struct{}) <-chan produced {
	if workers <= 0 {
		workers = runtime.NumCPU()
	}
	out := make(chan produced)
	slots := make([]chan produced, len(tensors))
	for i := range slots {
		slots[i] = make(chan produced, 1)
	}
	sem := make(chan struct{}, workers)
	go func() {
		for i, t := range tensors {
			select {
			case sem <- struct{}{}:
			case <-done:
				return
			}
			go func() {
				b, err := t.Data()
				if err == nil && int64(len(b)) != t.size() {
					err = fmt.Errorf("produced %d bytes, want %d for %s%v", len(b), t.size(), t.DType, t.Shape)
				}
				slots[i] <- produced{b, err} // buffered: never blocks
			}()
		}
	}()
	go func() {
		defer close(out)
		for i := range tensors {
			var r produced
			select {
			case r = <-slots[i]:
			case <-done:
				return
			}
			<-sem
			select {
			case out <- r:
			case <-done:
				return
			}
		}
	}()
	return out
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// auxNames lists a source's auxiliary file names, when it can say.
func auxNames(src Source) []string {
	if s, ok := src.(interface{ FileNames() []string }); ok {
		return s.FileNames()
	}
	var names []string
	for _, n := range []string{"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} {
		if _, err := src.File(n); err == nil {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

// AuxFiles reads a source's auxiliary files (config, generation config,
// tokenizer files) into a map for WriteDir.
func AuxFiles(src Source) (map[string][]byte, error) {
	m := map[string][]byte{}
	for _, n := range auxNames(src) {
		b, err := src.File(n)
		if err != nil {
			return nil, err
		}
		m[n] = b
	}
	return m, nil
}
