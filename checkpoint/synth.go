package checkpoint

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"io/fs"
	"math"
	"math/rand/v2"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"

	"moxie/dsv4/config"
	"moxie/format"
)

// SynthPrefix starts a synthetic source spec: "synth:PRESET?key=value&...".
const SynthPrefix = "synth:"

// SynthSpec is a parsed synthetic source spec.
type SynthSpec struct {
	Preset string // "tiny" or "flash"
	Seed   uint64
	Config *config.Config
	canon  string
}

// String renders the canonical spec (preset and the options that differ from it).
func (s *SynthSpec) String() string { return s.canon }

// synth keys and what they override.
var synthKeys = "seed, layers, experts, topk, mtp"

// ParseSynth parses "synth:PRESET?key=value&..." (the "synth:" prefix optional).
// Presets: tiny (every V4 block type at small widths) and flash (the exact
// V4-Flash shapes). Keys: seed (uint64, default 0), layers (main layers; the
// compress-ratio schedule and hash layers are cut to fit), experts (routed
// experts per layer), topk (experts per token), mtp (MTP blocks, 0 or more).
func ParseSynth(spec string) (*SynthSpec, error) {
	rest := strings.TrimPrefix(spec, SynthPrefix)
	preset, query, _ := strings.Cut(rest, "?")
	var c *config.Config
	switch preset {
	case "tiny":
		c = config.Tiny()
	case "flash":
		c = config.Flash()
	default:
		return nil, fmt.Errorf("synthetic source %q: unknown preset %q (want tiny or flash)", spec, preset)
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, fmt.Errorf("synthetic source %q: %w", spec, err)
	}
	s := &SynthSpec{Preset: preset, Config: c}
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	canon := []string{}
	for _, k := range keys {
		vals := q[k]
		if len(vals) != 1 {
			return nil, fmt.Errorf("synthetic source %q: key %q given %d times", spec, k, len(vals))
		}
		v := vals[0]
		if k == "seed" {
			s.Seed, err = strconv.ParseUint(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("synthetic source %q: seed %q is not an unsigned integer", spec, v)
			}
			canon = append(canon, "seed="+v)
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 1<<20 {
			return nil, fmt.Errorf("synthetic source %q: %s=%q is not a non-negative integer", spec, k, v)
		}
		switch k {
		case "layers":
			if n < 1 || n > c.NLayers {
				return nil, fmt.Errorf("synthetic source %q: layers=%d, want 1..%d", spec, n, c.NLayers)
			}
			mtp := c.CompressRatios[c.NLayers:]
			c.CompressRatios = append(append([]int{}, c.CompressRatios[:n]...), mtp...)
			c.NLayers = n
			c.NHashLayers = min(c.NHashLayers, n)
		case "experts":
			if n < 1 {
				return nil, fmt.Errorf("synthetic source %q: experts=%d, want >= 1", spec, n)
			}
			c.NRoutedExperts = n
			c.NActivatedExperts = min(c.NActivatedExperts, n)
		case "topk":
			if n < 1 {
				return nil, fmt.Errorf("synthetic source %q: topk=%d, want >= 1", spec, n)
			}
			c.NActivatedExperts = n
		case "mtp":
			c.CompressRatios = append(c.CompressRatios[:c.NLayers:c.NLayers], make([]int, n)...)
			c.NMTPLayers = n
		default:
			return nil, fmt.Errorf("synthetic source %q: unknown key %q (want %s)", spec, k, synthKeys)
		}
		canon = append(canon, k+"="+v)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("synthetic source %q: %w", spec, err)
	}
	s.canon = SynthPrefix + preset
	if len(canon) > 0 {
		s.canon += "?" + strings.Join(canon, "&")
	}
	return s, nil
}

// Synth is a Source whose tensors are generated on demand from a seed. Each
// tensor depends only on the global seed, its name and the configuration, so a
// tensor generated twice is bit-identical, and no file is written.
type Synth struct {
	spec   *SynthSpec
	cfg    *config.Config
	layout map[string]config.Tensor
	infos  []TensorInfo
	files  map[string][]byte

	// A quantized weight's codes and scales come from one generation: the
	// half not asked for waits in pairs (by weight name) for its request,
	// which usually follows at once (loaders read a weight and its scales
	// together); pairBytes bounds what waits, oldest dropped first (a
	// dropped half is generated again when asked for).
	mu        sync.Mutex
	pairs     map[string]*quantPair
	pairOrder []string
	pairBytes int64
}

// quantPair is one generation of a quantized weight: done closes when q and
// sc are set; each half is handed out once (nil after).
type quantPair struct {
	done  chan struct{}
	q, sc []byte
}

// synthPairBudget bounds the bytes of generated halves waiting for their request.
const synthPairBudget = 1 << 30

// OpenSynth opens a synthetic source from a spec such as "synth:tiny?seed=3".
func OpenSynth(spec string) (*Synth, error) {
	s, err := ParseSynth(spec)
	if err != nil {
		return nil, err
	}
	return newSynth(s), nil
}

// NewSynth is a synthetic source for any valid configuration c (not only the
// presets), seeded with seed; its name is "synth:custom?seed=N". It generates
// values exactly as the presets do.
func NewSynth(c *config.Config, seed uint64) (*Synth, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("synthetic source: %w", err)
	}
	return newSynth(&SynthSpec{Preset: "custom", Seed: seed, Config: c, canon: fmt.Sprintf("%scustom?seed=%d", SynthPrefix, seed)}), nil
}

func newSynth(s *SynthSpec) *Synth {
	src := &Synth{spec: s, cfg: s.Config, layout: map[string]config.Tensor{}, pairs: map[string]*quantPair{}}
	for _, t := range config.Layout(s.Config) {
		src.layout[t.Name] = t
		src.infos = append(src.infos, TensorInfo{Name: t.Name, DType: t.DType, Shape: t.Shape, Size: t.Bytes()})
	}
	sort.Slice(src.infos, func(i, j int) bool { return src.infos[i].Name < src.infos[j].Name })
	cfgJSON := s.Config.HubJSON()
	// Mark the config as synthetic, so a directory written from it still says so.
	cfgJSON = []byte(strings.Replace(string(cfgJSON), "{\n", fmt.Sprintf("{\n  %q: %q,\n", SyntheticKey, s.String()), 1))
	src.files = map[string][]byte{
		"config.json":            cfgJSON,
		"generation_config.json": []byte("{\n  \"bos_token_id\": 0,\n  \"eos_token_id\": 1,\n  \"do_sample\": true,\n  \"temperature\": 1.0,\n  \"top_p\": 1.0\n}\n"),
	}
	if s.Preset == "tiny" {
		src.files["tokenizer.json"] = TinyTokenizerJSON()
		src.files["tokenizer_config.json"] = TinyTokenizerConfigJSON()
	}
	return src
}

// SyntheticKey is the config.json key that marks a synthetic model and records
// the spec that generated it.
const SyntheticKey = "moxie_synthetic"

// Config returns the configuration of the synthetic model.
func (s *Synth) Config() *config.Config { return s.cfg }

// Name is the canonical spec, e.g. "synth:flash?layers=2".
func (s *Synth) Name() string { return s.spec.String() }

// Synthetic is always true.
func (s *Synth) Synthetic() bool { return true }

// File returns config.json, generation_config.json and, for the tiny preset, a
// byte-level tokenizer.json and tokenizer_config.json.
func (s *Synth) File(name string) ([]byte, error) {
	b, ok := s.files[name]
	if !ok {
		return nil, fmt.Errorf("%s: %s: %w", s.Name(), name, fs.ErrNotExist)
	}
	return append([]byte(nil), b...), nil
}

// FileNames lists the auxiliary files, sorted.
func (s *Synth) FileNames() []string {
	names := make([]string, 0, len(s.files))
	for n := range s.files {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Tensors lists every tensor of the layout, sorted by name.
func (s *Synth) Tensors() []TensorInfo { return s.infos }

// Lookup describes one tensor.
func (s *Synth) Lookup(name string) (TensorInfo, bool) {
	t, ok := s.layout[name]
	if !ok {
		return TensorInfo{}, false
	}
	return TensorInfo{Name: t.Name, DType: t.DType, Shape: t.Shape, Size: t.Bytes()}, true
}

// Close does nothing.
func (s *Synth) Close() error { return nil }

// TensorData generates the tensor's bytes. Each call returns a new slice owned by
// the caller. The scale tensor of a quantized weight is generated together with
// the weight, so both halves always agree.
func (s *Synth) TensorData(name string) ([]byte, error) {
	t, ok := s.layout[name]
	if !ok {
		return nil, fmt.Errorf("%s: no tensor %q", s.Name(), name)
	}
	if t.ScaleOf != "" {
		return s.half(s.layout[t.ScaleOf], true), nil
	}
	if sc, ok := s.layout[strings.TrimSuffix(name, ".weight")+".scale"]; ok && sc.ScaleOf == name {
		return s.half(t, false), nil
	}
	return s.plain(t), nil
}

// half returns the scales (or the codes) of quantized weight t, from a
// generation of both halves that a request for the other half started or
// will use (see Synth.pairs).
func (s *Synth) half(t config.Tensor, scales bool) []byte {
	take := func(p *quantPair) []byte {
		var b []byte
		if scales {
			b, p.sc = p.sc, nil
		} else {
			b, p.q = p.q, nil
		}
		if b != nil {
			s.pairBytes -= int64(len(b))
		}
		if p.q == nil && p.sc == nil && s.pairs[t.Name] == p {
			delete(s.pairs, t.Name)
		}
		return b
	}
	s.mu.Lock()
	if p, ok := s.pairs[t.Name]; ok {
		s.mu.Unlock()
		<-p.done
		s.mu.Lock()
		b := take(p)
		s.mu.Unlock()
		if b != nil {
			return b
		}
		return s.quantized(t, scales) // this half was handed out already
	}
	p := &quantPair{done: make(chan struct{})}
	s.pairs[t.Name] = p
	s.pairOrder = append(s.pairOrder, t.Name)
	s.mu.Unlock()
	q, sc := s.generateQuantized(t, false)
	s.mu.Lock()
	defer s.mu.Unlock()
	p.q, p.sc = q, sc
	s.pairBytes += int64(len(q) + len(sc))
	close(p.done)
	b := take(p)
	// Forget the names of complete pairs at the front of the order, and drop
	// the oldest finished halves while over the budget.
	for len(s.pairOrder) > 0 {
		o := s.pairs[s.pairOrder[0]]
		if o != nil {
			if o == p || s.pairBytes <= synthPairBudget {
				break
			}
			select {
			case <-o.done:
			default:
				return b // still being generated
			}
			s.pairBytes -= int64(len(o.q) + len(o.sc))
			o.q, o.sc = nil, nil
			delete(s.pairs, s.pairOrder[0])
		}
		s.pairOrder = s.pairOrder[1:]
	}
	return b
}

// pcg returns the generator of one tensor: a PCG seeded from the global seed and
// the FNV-1a hash of the tensor name.
func (s *Synth) pcg(name string) *rand.PCG {
	h := fnv.New64a()
	h.Write([]byte(name))
	return rand.NewPCG(s.spec.Seed, h.Sum64())
}

// fanInScale is the half-width of uniform values with standard deviation
// gain/sqrt(fanIn), so that a product with a unit-RMS input keeps unit RMS
// (times gain).
func fanInScale(fanIn int, gain float64) float64 { return gain * math.Sqrt(3/float64(fanIn)) }

// quantized generates a quantized weight (FP8 blocks, MXFP8 or MXFP4): its scales if
// scales is set, else its element codes. Both come from the same generated
// values, so they always agree; asking for the scales skips the encoding.
func (s *Synth) quantized(t config.Tensor, scales bool) []byte {
	if scales {
		_, sc := s.generateQuantized(t, true)
		return sc
	}
	q, _ := s.generateQuantized(t, false)
	return q
}

// generateQuantized generates the codes (unless scales: only the scales) and
// the scales of quantized weight t.
func (s *Synth) generateQuantized(t config.Tensor, scales bool) (codes, scaleBytes []byte) {
	rows, cols := int(t.Shape[0]), int(t.Shape[1])
	if t.DType == format.I8 { // MXFP4 packs two values per byte
		cols *= 2
	}
	gain := 1.0
	if t.Role == config.RoleRoutedExpert || t.Role == config.RoleMTP && t.Expert >= 0 {
		gain = 1.5 // so that the SwiGLU clamp engages on the tiny preset
	}
	g := newUniformGen(s.pcg(t.Name), fanInScale(cols, gain))
	var q, sc []byte
	switch {
	case t.DType == format.I8:
		q, sc = genMXFP4(&g, rows, cols, scales)
	case s.cfg.DenseFormat == "mxfp8": // E4M3 with one scale per 32 values of a row
		q, sc = genMXFP8(&g, rows, cols, scales)
	default:
		q, sc = genFP8Block(&g, rows, cols, s.cfg.BlockSize, scales)
	}
	return q, sc
}

// plain generates an unquantized tensor (BF16, F32, I64).
func (s *Synth) plain(t config.Tensor) []byte {
	p := s.pcg(t.Name)
	n := int(t.Bytes()) / t.DType.Size()
	base := t.Name[strings.LastIndexByte(t.Name, '.')+1:]
	var a float64
	var off float32
	switch {
	case t.DType == format.I64: // tid2eid: each row distinct expert ids
		r := rand.New(p)
		k := int(t.Shape[1])
		out := make([]byte, t.Bytes())
		perm := make([]int64, s.cfg.NRoutedExperts)
		for row := range int(t.Shape[0]) {
			for i := range perm {
				perm[i] = int64(i)
			}
			for i := range k { // partial Fisher-Yates
				j := i + r.IntN(len(perm)-i)
				perm[i], perm[j] = perm[j], perm[i]
				binary.LittleEndian.PutUint64(out[(row*k+i)*8:], uint64(perm[i]))
			}
		}
		return out
	case strings.HasSuffix(t.Name, "norm.weight"):
		a, off = 0.2, 1
	case strings.HasSuffix(base, "_fn"):
		a = fanInScale(int(t.Shape[1]), 1)
	case strings.HasSuffix(base, "_base"):
		a = 0.5
	case strings.HasSuffix(base, "_scale"):
		a, off = 0.25, 0.75
	case base == "attn_sink":
		a = 1
	case base == "ape":
		a = 0.5
	case base == "bias": // router correction bias
		a = 0.1
	case t.Name == "embed.weight":
		a = math.Sqrt(3)
	case len(t.Shape) == 2: // BF16 linear weights: head, router gate, compressors, weights_proj
		a = fanInScale(int(t.Shape[1]), 1)
	default:
		a = 0.5
	}
	if t.DType != format.BF16 && t.DType != format.F32 {
		panic(fmt.Sprintf("synth: no generator for %s of dtype %s", t.Name, t.DType))
	}
	g := newUniformGen(p, a)
	return genPlain(&g, n, off, t.DType)
}

// OutTensors lists every tensor of the layout, in layout order, for WriteDir;
// each one's bytes are generated when WriteDir asks for them.
func (s *Synth) OutTensors() []OutTensor {
	layout := config.Layout(s.cfg)
	out := make([]OutTensor, len(layout))
	for i, t := range layout {
		out[i] = OutTensor{Name: t.Name, DType: t.DType, Shape: t.Shape,
			Data: func() ([]byte, error) { return s.TensorData(t.Name) }}
	}
	return out
}
