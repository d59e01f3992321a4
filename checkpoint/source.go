// Package checkpoint gives the rest of moxie one view of a model's files and
// tensors, whatever holds them: a directory in the shipped DeepSeek-V4 layout
// (config.json, model.safetensors.index.json and shards) or a synthetic generator
// (synth:PRESET?key=value) that produces the same layout deterministically.
package checkpoint

import (
	"fmt"

	"moxie/format"
)

// TensorInfo describes one stored tensor. Shape is row-major, outermost first;
// Size is the byte length of its data (product of Shape times DType.Size()).
type TensorInfo struct {
	Name  string
	DType format.DType
	Shape []int64
	Size  int64
}

// Elements is the number of elements in t (1 for a scalar).
func (t TensorInfo) Elements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

func (t TensorInfo) String() string {
	return fmt.Sprintf("%s %s%v", t.Name, t.DType, t.Shape)
}

// Source is a checkpoint: auxiliary files (config.json, tokenizer.json, ...) and
// named tensors. Implementations are safe for concurrent use by multiple
// goroutines.
type Source interface {
	// Name is how the user named the source: a directory path or "synth:...".
	Name() string
	// Synthetic reports whether the weights are generated rather than trained;
	// anything that shows a synthetic model to a user must say so.
	Synthetic() bool
	// File returns the bytes of an auxiliary file such as "config.json" or
	// "tokenizer.json". A missing file is an error wrapping fs.ErrNotExist.
	File(name string) ([]byte, error)
	// Tensors lists every tensor, sorted by name. The slice is shared: do not modify.
	Tensors() []TensorInfo
	// Lookup returns the description of one tensor.
	Lookup(name string) (TensorInfo, bool)
	// TensorData returns the raw stored bytes of one tensor (little-endian, in the
	// stored dtype). The slice is read-only and stays valid until Close; for a
	// directory it is a view of a memory-mapped shard, so reading it may fault
	// pages in from disk.
	TensorData(name string) ([]byte, error)
	// Close releases mappings and files. Slices returned earlier become invalid.
	Close() error
}

// Locator is implemented by sources whose tensors live in files, so that a reader
// can fetch a tensor with pread (the expert store's slow tier) instead of through
// the mapping.
type Locator interface {
	// Locate returns the file holding the tensor and the byte range of its data.
	Locate(name string) (path string, offset, size int64, err error)
}
