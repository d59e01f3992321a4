// Package dsv4 is the DeepSeek-V4-Flash model: weight binding against the exact
// checkpoint layout (Load), and the forward pass (dsv4-flash.md §4) over a
// compute.Backend with per-sequence state (Session: window rings, compressor
// buffers, compressed KV and indexer keys).
//
// Numeric target: Exact (plain float32 math on dequantized weights, what the
// transformers port computes with the shared-expert clamp off; dsv4-flash.md
// §0b). Residual streams stay float32. The qat target (Options.Target QAT,
// host sessions) adds DeepSeek's simulated FP8 activations, FP8 KV and FP4
// indexer (§3.2; qat.go).
//
// Points the spec leaves implicit, as implemented (and confirmed against the
// transformers oracle's golden logits and indexer selections on synth:tiny):
//   - Per layer and token the order is: window KV into the ring; indexer
//     compressor step; indexer scoring over keys s < ⌊(t+1)/R⌋ (so an entry
//     closed by token t is visible to t); main compressor step; attention over
//     the window (positions max(0, t−W+1)..t) plus the compressed entries.
//   - A compressed entry w is RMS-normalised and rotated at position w·R with
//     the layer's YaRN table; the CSA A half (first dw rows of wkv/wgate, first
//     dw columns of ape) feeds entry w+1, the B half entry w.
//   - Indexer top-k and score routing break ties toward the lower index
//     (compute.TopK); softplus uses torch's threshold (x > 20 gives x).
//   - Prefill runs the stateful parts token by token inside each layer (the
//     matrix products are batched), so any chunking gives the same function.
package dsv4

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"

	"moxie/checkpoint"
	"moxie/compute"
	"moxie/compute/cpu"
	"moxie/compute/cuda"
	"moxie/dsv4/config"
	"moxie/format"
)

// Target selects the numeric target of the forward pass.
type Target int

const (
	// Exact is plain float32 math on dequantized weights: no activation, KV or
	// indexer fake quantization and no Hadamard rotation; routed experts clamped,
	// shared expert not; router renormalisation without epsilon.
	Exact Target = iota
	// QAT reproduces the quantization steps of DeepSeek's reference code
	// (dsv4-flash.md §3.2): every FP8/FP4 linear's input through act_quant
	// (E4M3, blocks of 128, power-of-two scales), the stored window and
	// compressed KV's unrotated dims through E4M3 (blocks of 64), the
	// indexer's queries and keys through a Walsh–Hadamard rotation and E2M1
	// (blocks of 32), wo_a's input and output rounded to BF16 (the
	// reference's BF16 grouped product), the routed weight multiplied in
	// before W2. Activations between sublayers stay float32 (the reference
	// keeps them in BF16), so it is the reference's quantization, not its
	// bits. Host sessions only.
	QAT
)

func (t Target) String() string {
	switch t {
	case Exact:
		return "exact"
	case QAT:
		return "qat"
	}
	return fmt.Sprintf("Target(%d)", int(t))
}

// Options configure Load. The zero value is usable.
type Options struct {
	// Backend runs the operations; nil means a CPU backend on all cores.
	Backend compute.Backend
	// Experts provides the routed experts; nil means binding them from the source.
	Experts Experts
	// Target is the numeric target: Exact (the default) or QAT (host
	// sessions only: Load refuses it with Device set).
	Target Target
	// Routes, if set, receives every routing decision (route traces).
	Routes RouteRecorder
	// Observer, if set, receives every routed expert's inputs and outputs
	// in a host forward pass (calibration: REAP saliency). Host sessions
	// only: Load refuses it with Device set.
	Observer ExpertObserver
	// MaxChunk bounds how many tokens one forward pass processes at once:
	// longer prefills run as consecutive chunks (the same function, bounded
	// activation memory). 0 means DefaultMaxChunk; with Device set, each
	// device session takes the largest chunk up to 4096 tokens whose state
	// fits in the free GPU memory (see NewDeviceSession).
	MaxChunk int
	// Device, if set, makes the model GPU-resident: Load uploads the main
	// stack (dense weights, embedding, head and every routed expert) to this
	// device, and NewSequence returns DeviceSessions (see
	// device_session.go). When the routed experts do not all fit, they are
	// cached on the device and loaded from host memory on demand (see
	// expertTier); if not even that fits, Load fails naming the bytes needed
	// and free. Experts must be nil. Close frees the device memory; the
	// device stays open.
	Device *cuda.Device
	// DeviceContext is the most tokens a device session holds (its state is
	// allocated for it); 0 means DefaultDeviceContext.
	DeviceContext int
	// DeviceMemory, if > 0, caps the device memory Load plans with (bytes;
	// default: all that is free): when the weights plus DeviceReserve do not
	// fit under it, the dense weights stay resident, most of the rest holds
	// routed experts that are never evicted, a cache of device slots takes
	// the others on a miss, and those others wait in pinned host memory
	// (filled once at Load). Where an expert lives never changes the output.
	DeviceMemory int64

	// deviceExpertSlots > 0 forces the device expert cache with that many
	// slots (tests; Load sizes the cache itself when the experts do not fit).
	deviceExpertSlots int
}

// DefaultMaxChunk is the prefill chunk size when Options.MaxChunk is 0.
const DefaultMaxChunk = 512

// DefaultDeviceChunk is a GPU-resident model's fallback prefill chunk when
// Options.MaxChunk is 0 (NewDeviceSession tries 4096 first): larger chunks
// give each routed expert more rows per tensor-core tile (at 512 tokens and
// 192-256 experts an expert sees about a dozen rows, and the expert GEMMs
// ran at ~19 TFLOP/s on the H200).
const DefaultDeviceChunk = 2048

// ExpertWeights are the three projections of one routed expert, bound to the
// model's backend: W1 (gate) and W3 (up) [inter, D], W2 (down) [D, inter].
type ExpertWeights struct {
	W1, W3, W2 compute.Weight
}

// Experts provides routed expert weights. layer counts main layers
// 0..NLayers-1, then MTP blocks. Implementations (the expert store) may fetch
// from slower tiers; they must be safe for use by the goroutine running the
// forward pass, and the returned weights must stay valid until the next call
// for the same layer.
type Experts interface {
	Expert(layer, e int) (ExpertWeights, error)
}

// ExpertSet is implemented by Experts that can hand out several experts of
// one layer at once, so that a decoded token's expert products run in one
// parallel split. ExpertSet fills dst[i] with the weights of expert es[i]
// (es ascending and distinct, len(dst) == len(es)), all valid until the
// next call for the same layer, and reports true. false, with a nil error,
// means the set cannot be held at once now (nothing is counted); the caller
// then asks for the experts one at a time with Expert.
type ExpertSet interface {
	ExpertSet(layer int, es []int, dst []ExpertWeights) (bool, error)
}

// Model is a loaded DeepSeek-V4 model. Its weights are views of the source's
// stored bytes (small vectors such as norms and HC parameters are decoded to
// float32); the source must stay open while the model is used. A Model is
// read-only after Load and may be shared by any number of Sessions on any
// goroutines: their forward passes (each Prefill or Decode call) run one at a
// time, so that an Experts implementation only ever serves one pass.
type Model struct {
	Cfg *config.Config
	be  compute.Backend
	src checkpoint.Source

	pass sync.Mutex // one forward pass at a time (see the type comment)

	embed  []byte // BF16 [V, D]
	head   compute.Weight
	norm   []float32
	hcHead compute.HCParams

	layers []*block // main stack
	mtp    []*mtpBlock

	experts Experts
	target  Target
	routes  RouteRecorder
	observe ExpertObserver

	ownBackend *cpu.Backend // created by Load; closed by Close
	// hostUnbound: loaded with Options.Device, the weights are bound on the
	// GPU only, and host Sessions refuse to run.
	hostUnbound bool
	maxChunk    int
	autoChunk   bool // device sessions pick their chunk from free memory (MaxChunk 0)

	freqPlain, freqCompress []float32

	dev *deviceModel // Options.Device
}

type compressor struct {
	wkv, wgate compute.Weight
	ape        []float32 // [R, c·dw]
	norm       []float32 // [dw]
	ratio, c   int
	dw         int
}

type indexer struct {
	wqB   compute.Weight // [IH·ID, QL]
	wproj compute.Weight // [IH, D]
	comp  *compressor
}

type block struct {
	layer int
	kind  config.LayerKind
	ratio int
	hash  bool

	attnNorm, ffnNorm []float32
	hcAttn, hcFFN     compute.HCParams
	sink              []float32
	wqA, wqB, wkv     compute.Weight
	woA, woB          compute.Weight
	qNorm, kvNorm     []float32
	comp              *compressor
	idx               *indexer

	gate    compute.Weight
	bias    []float32 // score-routed layers
	tid2eid []int     // hash layers: [V, topk]
	shared  *ExpertWeights
}

// mtpBlock holds the MTP extras; the MTP forward is not run yet.
type mtpBlock struct {
	*block
	eProj, hProj       compute.Weight
	enorm, hnorm, norm []float32
	hcHead             compute.HCParams
}

// Load binds the model in src. It checks every tensor against the layout that
// config.json implies (config.Layout): a missing, unexpected, mis-typed or
// mis-shaped tensor is an error naming it with the expected and actual
// dtype/shape (all problems are listed, up to a limit).
func Load(src checkpoint.Source, opts Options) (*Model, error) {
	switch {
	case opts.Target != Exact && opts.Target != QAT:
		return nil, fmt.Errorf("dsv4: numeric target %v: want exact or qat", opts.Target)
	case opts.Target == QAT && opts.Device != nil:
		return nil, fmt.Errorf("dsv4: the qat target runs on the CPU backend only; load without a device (--backend cpu) or use the exact target")
	}
	if opts.Observer != nil && opts.Device != nil {
		return nil, fmt.Errorf("dsv4: an expert observer needs host sessions; load without a device (the CPU backend) to observe experts")
	}
	raw, err := src.File("config.json")
	if err != nil {
		return nil, fmt.Errorf("dsv4: %s: %w", src.Name(), err)
	}
	cfg, err := config.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("dsv4: %s: %w", src.Name(), err)
	}
	if err := CheckLayout(src, cfg); err != nil {
		return nil, fmt.Errorf("dsv4: %s: %w", src.Name(), err)
	}
	be := opts.Backend
	var own *cpu.Backend
	if be == nil {
		own = cpu.New(0)
		be = own
	}
	m := &Model{Cfg: cfg, be: be, src: src, target: opts.Target, routes: opts.Routes, observe: opts.Observer, ownBackend: own}
	m.maxChunk = opts.MaxChunk
	switch {
	case m.maxChunk > 0:
	case opts.Device != nil:
		m.maxChunk, m.autoChunk = DefaultDeviceChunk, true
	default:
		m.maxChunk = DefaultMaxChunk
	}
	if opts.Device != nil {
		// The GPU copy is bound by loadDevice with the same binder and checks;
		// binding host views as well would read (or, for a synthetic source,
		// generate) every tensor twice. Host sessions of this model fail.
		m.hostUnbound = true
		return m.finishLoad(src, opts)
	}
	b := &binder{src: src, be: be, cfg: cfg}
	m.embed = b.bytes("embed.weight")
	m.head = b.weight("head.weight")
	m.norm = b.vec("norm.weight")
	m.hcHead = b.hc("hc_head", cfg.HCMult)
	for i := range cfg.NLayers {
		m.layers = append(m.layers, b.block(fmt.Sprintf("layers.%d.", i), i))
	}
	for k := range cfg.NMTPLayers {
		p := fmt.Sprintf("mtp.%d.", k)
		mb := &mtpBlock{block: b.block(p, cfg.NLayers+k)}
		mb.eProj, mb.hProj = b.weight(p+"e_proj.weight"), b.weight(p+"h_proj.weight")
		mb.enorm, mb.hnorm, mb.norm = b.vec(p+"enorm.weight"), b.vec(p+"hnorm.weight"), b.vec(p+"norm.weight")
		mb.hcHead = b.hc(p+"hc_head", cfg.HCMult)
		m.mtp = append(m.mtp, mb)
	}
	m.experts = opts.Experts
	if m.experts == nil {
		se := &sourceExperts{cfg: cfg}
		for l := range cfg.NLayers + cfg.NMTPLayers {
			p := fmt.Sprintf("layers.%d.", l)
			if l >= cfg.NLayers {
				p = fmt.Sprintf("mtp.%d.", l-cfg.NLayers)
			}
			row := make([]ExpertWeights, cfg.NRoutedExperts)
			for e := range row {
				row[e] = b.expert(fmt.Sprintf("%sffn.experts.%d.", p, e))
			}
			se.w = append(se.w, row)
		}
		m.experts = se
	}
	if err := b.err(); err != nil {
		m.Close()
		return nil, fmt.Errorf("dsv4: %s: %w", src.Name(), err)
	}
	return m.finishLoad(src, opts)
}

// finishLoad computes the rotary tables and, with Options.Device, uploads
// the model to the GPU.
func (m *Model) finishLoad(src checkpoint.Source, opts Options) (*Model, error) {
	cfg := m.Cfg
	var err error
	m.freqPlain = compute.RopeFreqs(cfg.RopeTheta, cfg.RopeHeadDim, nil)
	m.freqCompress = compute.RopeFreqs(cfg.CompressRopeTheta, cfg.RopeHeadDim, &compute.YaRN{
		Factor: cfg.RopeFactor, OriginalSeqLen: cfg.OriginalSeqLen, BetaFast: cfg.BetaFast, BetaSlow: cfg.BetaSlow})
	if opts.Device != nil {
		if m.dev, err = loadDevice(m, src, opts); err != nil {
			m.Close()
			return nil, fmt.Errorf("dsv4: %s: %w", src.Name(), err)
		}
	}
	return m, nil
}

// Close releases what Load created (the default CPU backend's workers, the
// device copy of Options.Device). It does not close the source, a backend
// or a device passed in Options.
func (m *Model) Close() error {
	if m.dev != nil {
		m.dev.close()
		m.dev = nil
	}
	if m.ownBackend != nil {
		m.ownBackend.Close()
		m.ownBackend = nil
	}
	return nil
}

// Backend is the backend the model's weights are bound to.
func (m *Model) Backend() compute.Backend { return m.be }

// CheckLayout compares the tensors of src with config.Layout(cfg) exactly.
func CheckLayout(src checkpoint.Source, cfg *config.Config) error {
	const maxErrs = 20
	var errs []string
	n := 0
	add := func(f string, a ...any) {
		n++
		if len(errs) < maxErrs {
			errs = append(errs, fmt.Sprintf(f, a...))
		}
	}
	want := map[string]bool{}
	for _, t := range config.Layout(cfg) {
		want[t.Name] = true
		got, ok := src.Lookup(t.Name)
		switch {
		case !ok:
			add("missing tensor %s (want %s%v)", t.Name, t.DType, t.Shape)
		case !sameStorage(got.DType, t.DType) || !equalShape(got.Shape, t.Shape):
			add("tensor %s is %s%v, want %s%v", t.Name, got.DType, got.Shape, t.DType, t.Shape)
		case got.Size != t.Bytes():
			add("tensor %s has %d bytes, want %d", t.Name, got.Size, t.Bytes())
		}
	}
	for _, t := range src.Tensors() {
		if !want[t.Name] {
			add("unexpected tensor %s (%s%v) not in the DeepSeek-V4 layout for this config", t.Name, t.DType, t.Shape)
		}
	}
	if n == 0 {
		return nil
	}
	msg := strings.Join(errs, "; ")
	if n > len(errs) {
		msg += fmt.Sprintf("; and %d more", n-len(errs))
	}
	return fmt.Errorf("checkpoint does not match the layout (%d problems): %s", n, msg)
}

// sameStorage reports whether a tensor stored as got holds what the layout
// describes as want: the same dtype, or packed MXFP4 bytes labelled U8 rather
// than I8 (both appear in MXFP4 checkpoints; the bytes are the same).
func sameStorage(got, want format.DType) bool {
	return got == want || want == format.I8 && got == format.U8
}

func equalShape(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// binder reads tensors after CheckLayout has passed; it collects errors.
type binder struct {
	src  checkpoint.Source
	be   compute.Backend
	cfg  *config.Config
	errs []error
}

func (b *binder) err() error { return errors.Join(b.errs...) }

func (b *binder) fail(name string, err error) {
	b.errs = append(b.errs, fmt.Errorf("tensor %s: %w", name, err))
}

// bytes returns the stored bytes of a tensor, checking their length.
func (b *binder) bytes(name string) []byte {
	info, ok := b.src.Lookup(name)
	if !ok {
		b.fail(name, errors.New("missing"))
		return nil
	}
	d, err := b.src.TensorData(name)
	if err != nil {
		b.fail(name, err)
		return nil
	}
	if int64(len(d)) != info.Size {
		b.fail(name, fmt.Errorf("source returned %d bytes, want %d", len(d), info.Size))
		return nil
	}
	return d
}

// vec decodes a small BF16 or F32 tensor to float32.
func (b *binder) vec(name string) []float32 {
	info, _ := b.src.Lookup(name)
	d := b.bytes(name)
	if d == nil {
		return nil
	}
	out := make([]float32, info.Elements())
	switch info.DType {
	case format.BF16:
		format.DecodeBF16(out, d)
	case format.F32:
		format.DecodeF32(out, d)
	default:
		b.fail(name, fmt.Errorf("dtype %s, want BF16 or F32", info.DType))
		return nil
	}
	for i, v := range out {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			b.fail(name, fmt.Errorf("element %d is %g", i, v))
			return nil
		}
	}
	return out
}

// weight binds a 2-D weight; FP8 and MXFP4 weights take their ".scale" tensor.
func (b *binder) weight(name string) compute.Weight {
	info, ok := b.src.Lookup(name)
	if !ok || len(info.Shape) != 2 {
		b.fail(name, errors.New("missing or not 2-D"))
		return nil
	}
	d := compute.WeightData{Rows: int(info.Shape[0]), Cols: int(info.Shape[1]), Data: b.bytes(name), Block: b.cfg.BlockSize}
	scaleName := strings.TrimSuffix(name, ".weight") + ".scale"
	switch info.DType {
	case format.BF16:
		d.Format = compute.BF16
	case format.F32:
		d.Format = compute.F32
	case format.F8E4M3:
		d.Format = compute.FP8Block
		if b.cfg.DenseFormat == "mxfp8" {
			d.Format = compute.MXFP8
		}
		d.Scale = b.bytes(scaleName)
	case format.I8, format.U8:
		d.Format = compute.MXFP4
		d.Cols *= 2
		d.Scale = b.bytes(scaleName)
	default:
		b.fail(name, fmt.Errorf("dtype %s is not a weight format", info.DType))
		return nil
	}
	if d.Data == nil {
		return nil
	}
	w, err := b.be.Bind(d)
	if err != nil {
		b.fail(name, err)
		return nil
	}
	return w
}

// hc binds one hyper-connection site: prefix_fn, prefix_base, prefix_scale.
func (b *binder) hc(prefix string, hc int) compute.HCParams {
	return compute.HCParams{
		Fn: b.weight(prefix + "_fn"), Base: b.vec(prefix + "_base"), Scale: b.vec(prefix + "_scale"),
		HC: hc, Iters: b.cfg.HCSinkhornIters, Eps: float32(b.cfg.HCEps), NormEps: float32(b.cfg.NormEps),
	}
}

func (b *binder) compressor(prefix string, ratio, dw int) *compressor {
	c := &compressor{wkv: b.weight(prefix + "wkv.weight"), wgate: b.weight(prefix + "wgate.weight"),
		ape: b.vec(prefix + "ape"), norm: b.vec(prefix + "norm.weight"), ratio: ratio, dw: dw, c: 1}
	if ratio == config.CSARatio {
		c.c = 2
	}
	return c
}

func (b *binder) expert(prefix string) ExpertWeights {
	return ExpertWeights{W1: b.weight(prefix + "w1.weight"), W3: b.weight(prefix + "w3.weight"), W2: b.weight(prefix + "w2.weight")}
}

func (b *binder) block(p string, i int) *block {
	c := b.cfg
	bl := &block{layer: i, kind: c.Kind(i), ratio: c.Ratio(i), hash: c.HashRouted(i)}
	bl.attnNorm, bl.ffnNorm = b.vec(p+"attn_norm.weight"), b.vec(p+"ffn_norm.weight")
	bl.hcAttn, bl.hcFFN = b.hc(p+"hc_attn", c.HCMult), b.hc(p+"hc_ffn", c.HCMult)
	a := p + "attn."
	bl.sink = b.vec(a + "attn_sink")
	bl.wqA, bl.wqB, bl.wkv = b.weight(a+"wq_a.weight"), b.weight(a+"wq_b.weight"), b.weight(a+"wkv.weight")
	bl.woA, bl.woB = b.weight(a+"wo_a.weight"), b.weight(a+"wo_b.weight")
	bl.qNorm, bl.kvNorm = b.vec(a+"q_norm.weight"), b.vec(a+"kv_norm.weight")
	switch bl.kind {
	case config.CSA:
		bl.comp = b.compressor(a+"compressor.", bl.ratio, c.HeadDim)
		bl.idx = &indexer{wqB: b.weight(a + "indexer.wq_b.weight"), wproj: b.weight(a + "indexer.weights_proj.weight"),
			comp: b.compressor(a+"indexer.compressor.", bl.ratio, c.IndexHeadDim)}
	case config.HCA:
		bl.comp = b.compressor(a+"compressor.", bl.ratio, c.HeadDim)
	}
	f := p + "ffn."
	bl.gate = b.weight(f + "gate.weight")
	if bl.hash {
		name := f + "gate.tid2eid"
		if d := b.bytes(name); d != nil {
			bl.tid2eid = make([]int, len(d)/8)
			for j := range bl.tid2eid {
				v := int64(binary.LittleEndian.Uint64(d[8*j:]))
				if v < 0 || v >= int64(c.NRoutedExperts) {
					b.fail(name, fmt.Errorf("entry %d (token %d) is expert %d, want 0..%d", j, j/c.NActivatedExperts, v, c.NRoutedExperts-1))
					bl.tid2eid = nil
					break
				}
				bl.tid2eid[j] = int(v)
			}
		}
	} else {
		bl.bias = b.vec(f + "gate.bias")
	}
	if c.NSharedExperts > 0 {
		s := b.expert(f + "shared_experts.")
		bl.shared = &s
	}
	return bl
}

// sourceExperts serves routed experts bound from the checkpoint source.
type sourceExperts struct {
	cfg *config.Config
	w   [][]ExpertWeights
}

// ExpertSet implements ExpertSet: the source's weights are always valid.
func (s *sourceExperts) ExpertSet(layer int, es []int, dst []ExpertWeights) (bool, error) {
	if err := EachExpert(s, layer, es, dst); err != nil {
		return false, err
	}
	return true, nil
}

// EachExpert fills dst[i] with x.Expert(layer, es[i]) in order, stopping at
// the first error: an ExpertSet for Experts whose answers for es stay valid
// together.
func EachExpert(x Experts, layer int, es []int, dst []ExpertWeights) error {
	for i, e := range es {
		w, err := x.Expert(layer, e)
		if err != nil {
			return err
		}
		dst[i] = w
	}
	return nil
}

func (s *sourceExperts) Expert(layer, e int) (ExpertWeights, error) {
	if layer < 0 || layer >= len(s.w) || e < 0 || e >= len(s.w[layer]) {
		return ExpertWeights{}, fmt.Errorf("dsv4: expert %d of layer %d out of range (%d layers, %d experts)", e, layer, len(s.w), s.cfg.NRoutedExperts)
	}
	return s.w[layer][e], nil
}
