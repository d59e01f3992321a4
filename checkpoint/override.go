package checkpoint

import (
	"fmt"
	"maps"
	"slices"
)

// WithTensors returns src with the stored bytes of some tensors replaced:
// data maps a tensor name to its new bytes, in the tensor's stored dtype and
// of its stored size (both checked; the bytes are not copied and must not
// change). Everything else, Close included, is src's. Where src is a
// Locator, so is the result, for every tensor but the replaced ones (whose
// bytes live in memory: Locate says so, and a reader takes TensorData).
// The result is how a run masks experts (moxie's --prune) without writing a
// checkpoint.
func WithTensors(src Source, data map[string][]byte) (Source, error) {
	for _, name := range slices.Sorted(maps.Keys(data)) {
		info, ok := src.Lookup(name)
		if !ok {
			return nil, fmt.Errorf("checkpoint: %s has no tensor %s to replace", src.Name(), name)
		}
		if int64(len(data[name])) != info.Size {
			return nil, fmt.Errorf("checkpoint: replacing %s of %s: %d bytes, want the stored %d (%v %v)", name, src.Name(), len(data[name]), info.Size, info.DType, info.Shape)
		}
	}
	o := &overridden{Source: src, data: data}
	if loc, ok := src.(Locator); ok {
		return &overriddenLoc{overridden: o, loc: loc}, nil
	}
	return o, nil
}

type overridden struct {
	Source
	data map[string][]byte
}

func (o *overridden) TensorData(name string) ([]byte, error) {
	if b, ok := o.data[name]; ok {
		return b, nil
	}
	return o.Source.TensorData(name)
}

// FileNames lists src's auxiliary files as WriteDir would find them.
func (o *overridden) FileNames() []string { return auxNames(o.Source) }

type overriddenLoc struct {
	*overridden
	loc Locator
}

func (o *overriddenLoc) Locate(name string) (string, int64, int64, error) {
	if _, ok := o.data[name]; ok {
		return "", 0, 0, fmt.Errorf("checkpoint: tensor %s of %s is replaced in memory, not in a file: read it with TensorData", name, o.Name())
	}
	return o.loc.Locate(name)
}
