package dsv4

import (
	"fmt"
	"io/fs"
	"sort"

	"moxie/checkpoint"
	"moxie/dsv4/config"
	"moxie/format"
)

// memSource is an in-memory checkpoint.Source for tests: every tensor of
// config.Layout(cfg) with random, sanely scaled values quantized to its dtype.
type memSource struct {
	cfg   *config.Config
	files map[string][]byte
	infos []checkpoint.TensorInfo
	data  map[string][]byte
}

func (s *memSource) Name() string    { return "mem:test" }
func (s *memSource) Synthetic() bool { return true }
func (s *memSource) File(name string) ([]byte, error) {
	if b, ok := s.files[name]; ok {
		return b, nil
	}
	return nil, fmt.Errorf("mem: %s: %w", name, fs.ErrNotExist)
}
func (s *memSource) Tensors() []checkpoint.TensorInfo { return s.infos }
func (s *memSource) Lookup(name string) (checkpoint.TensorInfo, bool) {
	i := sort.Search(len(s.infos), func(i int) bool { return s.infos[i].Name >= name })
	if i < len(s.infos) && s.infos[i].Name == name {
		return s.infos[i], true
	}
	return checkpoint.TensorInfo{}, false
}
func (s *memSource) TensorData(name string) ([]byte, error) {
	if d, ok := s.data[name]; ok {
		return d, nil
	}
	return nil, fmt.Errorf("mem: no tensor %s", name)
}
func (s *memSource) Close() error { return nil }

func (s *memSource) put(name string, dt format.DType, shape []int64, d []byte) {
	info := checkpoint.TensorInfo{Name: name, DType: dt, Shape: shape, Size: int64(len(d))}
	s.data[name] = d
	i := sort.Search(len(s.infos), func(i int) bool { return s.infos[i].Name >= name })
	if i < len(s.infos) && s.infos[i].Name == name {
		s.infos[i] = info
		return
	}
	s.infos = append(s.infos, checkpoint.TensorInfo{})
	copy(s.infos[i+1:], s.infos[i:])
	s.infos[i] = info
}

// clone returns a copy whose maps and lists can be changed independently
// (tensor bytes are shared: replace them, never modify them in place).
func (s *memSource) clone() *memSource {
	c := &memSource{cfg: s.cfg, files: map[string][]byte{}, data: map[string][]byte{}}
	for k, v := range s.files {
		c.files[k] = v
	}
	for k, v := range s.data {
		c.data[k] = v
	}
	c.infos = append([]checkpoint.TensorInfo(nil), s.infos...)
	return c
}

func (s *memSource) remove(name string) {
	delete(s.data, name)
	for i, t := range s.infos {
		if t.Name == name {
			s.infos = append(s.infos[:i], s.infos[i+1:]...)
			return
		}
	}
}

// newMemSource copies every tensor of checkpoint.NewSynth(cfg, seed) into a
// mutable in-memory source.
func newMemSource(cfg *config.Config, seed uint64) *memSource {
	gen, err := checkpoint.NewSynth(cfg, seed)
	if err != nil {
		panic(err)
	}
	s := &memSource{cfg: cfg, files: map[string][]byte{"config.json": cfg.HubJSON()}, data: map[string][]byte{}}
	for _, ti := range gen.Tensors() {
		d, err := gen.TensorData(ti.Name)
		if err != nil {
			panic(err)
		}
		s.put(ti.Name, ti.DType, ti.Shape, d)
	}
	return s
}
