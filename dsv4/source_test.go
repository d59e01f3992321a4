package dsv4

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"io/fs"
	"math"
	"math/rand/v2"
	"sort"
	"strings"

	"moxie/checkpoint"
	"moxie/compute"
	"moxie/compute/computetest"
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

func newMemSource(cfg *config.Config, seed uint64) *memSource {
	s := &memSource{cfg: cfg, files: map[string][]byte{"config.json": cfg.HubJSON()}, data: map[string][]byte{}}
	lay := config.Layout(cfg)
	scaleOf := map[string]bool{}
	for _, t := range lay {
		if t.ScaleOf != "" {
			scaleOf[t.Name] = true
		}
	}
	for _, t := range lay {
		if scaleOf[t.Name] {
			continue // written with its weight
		}
		h := fnv.New64a()
		h.Write([]byte(t.Name))
		rng := rand.New(rand.NewPCG(seed, h.Sum64()))
		n := 1
		for _, d := range t.Shape {
			n *= int(d)
		}
		cols := int(t.Shape[len(t.Shape)-1])
		if t.DType == format.I8 {
			cols *= 2
		}
		rows := n / int(t.Shape[len(t.Shape)-1])
		name := t.Name
		var std, mean float64
		switch {
		case strings.HasSuffix(name, "norm.weight"):
			mean, std = 1, 0.1
		case name == "embed.weight":
			std = 1
		case strings.Contains(name, "hc_") && strings.HasSuffix(name, "_fn"):
			std = 0.5 / math.Sqrt(float64(cols))
		case strings.Contains(name, "hc_") && strings.HasSuffix(name, "_base"):
			std = 0.5
		case strings.Contains(name, "hc_") && strings.HasSuffix(name, "_scale"):
			mean, std = 1, 0.2
		case strings.HasSuffix(name, "attn_sink"):
			std = 1
		case strings.HasSuffix(name, ".ape"):
			std = 0.5
		case strings.HasSuffix(name, "gate.bias"):
			std = 0.1
		default:
			std = 1 / math.Sqrt(float64(cols))
		}
		switch t.DType {
		case format.I64:
			k := int(t.Shape[1])
			d := make([]byte, 8*n)
			for r := 0; r < int(t.Shape[0]); r++ {
				perm := rng.Perm(cfg.NRoutedExperts)
				for j := range k {
					binary.LittleEndian.PutUint64(d[8*(r*k+j):], uint64(perm[j]))
				}
			}
			s.put(name, t.DType, t.Shape, d)
			continue
		}
		v := computetest.Normal(rng, rows*cols, std)
		for i := range v {
			v[i] += float32(mean)
		}
		var f compute.Format
		switch t.DType {
		case format.BF16:
			f = compute.BF16
		case format.F32:
			f = compute.F32
		case format.F8E4M3:
			f = compute.FP8Block
			if cfg.DenseFormat == "mxfp8" {
				f = compute.MXFP8
			}
		case format.I8:
			f = compute.MXFP4
		default:
			panic("unhandled dtype " + t.DType.String())
		}
		wd := computetest.Quantize(f, v, rows, cols, cfg.BlockSize)
		s.put(name, t.DType, t.Shape, wd.Data)
		if wd.Scale != nil {
			sn := strings.TrimSuffix(name, ".weight") + ".scale"
			for _, u := range lay {
				if u.Name == sn {
					s.put(sn, u.DType, u.Shape, wd.Scale)
				}
			}
		}
	}
	return s
}
