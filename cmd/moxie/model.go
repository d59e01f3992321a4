package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"moxie/internal/progress"
	"os"
	"time"

	"moxie/checkpoint"
	"moxie/compute/cpu"
	"moxie/compute/cuda"
	"moxie/dsv4"
	"moxie/dsv4/config"
	"moxie/experts"
	"moxie/experts/trace"
	"moxie/server"
)

// loadedModel is a model with everything it reads from: the source, the
// backend and, when the expert store is in use, the store and a route trace.
type loadedModel struct {
	src    checkpoint.Source
	m      *dsv4.Model
	be     *cpu.Backend
	store  *experts.Store // nil when experts are bound straight from the source
	plan   *experts.Plan
	routes *trace.Writer
	dev    *cuda.Device // the GPU the model is resident on (--backend cuda), or nil
}

// backendName is "cuda" when the model runs on a GPU, else "cpu".
func (l *loadedModel) backendName() string {
	if l.dev != nil {
		return "cuda"
	}
	return "cpu"
}

// Close releases the store, finishes the route trace, and closes the source.
func (l *loadedModel) Close() error {
	var errs []error
	if l.store != nil {
		errs = append(errs, l.store.Close())
	}
	if l.routes != nil {
		errs = append(errs, l.routes.Close())
	}
	if l.be != nil {
		l.be.Close()
	}
	if l.m != nil {
		errs = append(errs, l.m.Close())
	}
	if l.dev != nil {
		errs = append(errs, l.dev.Close())
	}
	errs = append(errs, l.src.Close())
	return errors.Join(errs...)
}

// memFlags are the memory and residency flags shared by run, serve and bench.
type memFlags struct {
	mem, policy, routes, backend, gpuMem string
	prune, target                        string
	ctx, chunk                           int
	// observer (not a flag): every routed expert's work in host forward
	// passes (moxie calibrate); the model then runs on the CPU.
	observer dsv4.ExpertObserver
	// preloadSynthetic (not a flag): a synthetic model's routed experts
	// that fit are generated before the first token too, as a checkpoint's
	// are read (moxie bench: its decode timings then measure decoding, not
	// the generation of experts on first use).
	preloadSynthetic bool
}

// addMemFlags registers --mem, --ctx, --chunk, --policy, --record-routes, --gpu-mem and --backend on fs.
func addMemFlags(fs *flag.FlagSet) *memFlags {
	f := &memFlags{}
	fs.StringVar(&f.mem, "mem", "", "memory budget, e.g. 24GiB: dense weights and state stay resident, routed experts fill the rest and are read from the checkpoint on a miss (default: a safe share of available memory)")
	fs.IntVar(&f.ctx, "ctx", 0, "context length in tokens the memory plan reserves state for (default 32768, or the model's maximum if smaller)")
	fs.IntVar(&f.chunk, "chunk", 0, "prefill chunk: the most prompt tokens one forward pass takes at once (default 512 on the CPU; on the GPU the largest of 4096, 2048, 1024, 512 whose state fits in free GPU memory); larger chunks use more activation memory and give the GPU's expert matrix products more rows per tile")
	fs.StringVar(&f.policy, "policy", "lru", "expert residency policy: lru, decay[:h=64,ratio=1.25,margin=4] or static:FREQFILE")
	fs.StringVar(&f.routes, "record-routes", "", "write every routing decision to this trace file (see moxie residency)")
	fs.StringVar(&f.gpuMem, "gpu-mem", "", "with --backend cuda: GPU memory the model may use, e.g. 80GiB (default: all that is free); when the routed experts do not fit, they are cached in GPU slots and copied from host memory on a miss")
	fs.StringVar(&f.prune, "prune", "", "REPORT.json:N: the routers never select the N least salient experts of each score-routed layer, by a moxie calibrate report (REAP saliency); their weights stay in the checkpoint; judge the quality with moxie perplexity")
	fs.StringVar(&f.target, "target", "exact", "numeric target: exact (float32 math on the stored weights, as the transformers port computes) or qat (adds the quantization steps of DeepSeek's reference code: FP8 linear inputs and KV, a Hadamard-rotated FP4 indexer; runs on the CPU)")
	fs.StringVar(&f.backend, "backend", "auto", "where the model runs: auto (the GPU when a CUDA GPU, its driver and NVRTC are found and the model fits, else the CPU, saying why), cpu, or cuda (the model resident on GPU 0: weights, routed experts and sequence state)")
	return f
}

// loadModel opens spec (a directory or synth:...), plans memory, and binds the
// model with its routed experts served by the expert store under the budget.
// mf may be nil (all defaults). It tells the user on stderr what it loaded and
// when the weights are synthetic.
func loadModel(spec string, mf *memFlags, stderr io.Writer) (*loadedModel, error) {
	if mf == nil {
		mf = &memFlags{policy: "lru", backend: "cpu"} // programmatic callers (tests): the CPU
	}
	switch mf.backend {
	case "", "cpu", "cuda", "auto":
	default:
		return nil, usagef("--backend %q: want cpu, cuda or auto", mf.backend)
	}
	var target dsv4.Target
	switch mf.target {
	case "", "exact":
	case "qat":
		target = dsv4.QAT
	default:
		return nil, usagef("--target %q: want exact or qat", mf.target)
	}
	if target == dsv4.QAT && mf.backend == "cuda" {
		return nil, usagef("--target qat runs on the CPU: use --backend cpu (or auto)")
	}
	hostFlags := mf.mem != "" || mf.policy != "lru" || target == dsv4.QAT
	if mf.chunk < 0 {
		return nil, usagef("--chunk %d: want a positive number of tokens (0 for the default)", mf.chunk)
	}
	var gpuMem int64
	switch {
	case mf.gpuMem != "" && (mf.backend == "" || mf.backend == "cpu"):
		return nil, usagef("--gpu-mem applies to --backend cuda or auto")
	case mf.gpuMem != "":
		n, err := parseBytes(mf.gpuMem)
		if err != nil {
			return nil, usagef("--gpu-mem: %v", err)
		}
		gpuMem = n
	}
	if mf.backend == "cuda" && hostFlags {
		return nil, usagef("--mem and --policy plan host memory; with --backend cuda the model is resident on the GPU (see --gpu-mem)")
	}
	pol, polName, err := experts.ParsePolicy(mf.policy)
	if err != nil {
		return nil, usagef("--policy: %v", err)
	}
	var budget int64
	var note string
	if mf.mem != "" {
		if budget, err = parseBytes(mf.mem); err != nil {
			return nil, usagef("--mem: %v", err)
		}
		note = "--mem " + mf.mem
	} else if budget, note, err = experts.DefaultBudget(); err != nil {
		return nil, err
	}
	if spec == builtinModel {
		if _, err := os.Stat(spec); err != nil {
			return nil, fmt.Errorf("the built-in model %s was not found in this directory, its parents or beside the moxie executable: run moxie inside its repository, set MOXIE_MODEL to the model's directory, or pass --model (a checkpoint directory, or synth:tiny for a synthetic model that needs no files)", builtinModel)
		}
	}
	src, err := checkpoint.Open(spec)
	if err != nil {
		return nil, err
	}
	l := &loadedModel{src: src}
	fail := func(err error) (*loadedModel, error) {
		l.Close()
		return nil, err
	}
	if src.Synthetic() {
		fmt.Fprintf(stderr, "note: %s is a synthetic model with random weights; its output is meaningless.\n", src.Name())
	}
	cfgJSON, err := src.File("config.json")
	if err != nil {
		return fail(err)
	}
	cfg, err := config.Parse(cfgJSON)
	if err != nil {
		return fail(fmt.Errorf("%s: %w", src.Name(), err))
	}
	if mf.prune != "" {
		p, err := parsePrune(mf.prune)
		if err != nil {
			return fail(usagef("%v", err))
		}
		masked, err := applyPrune(l.src, cfg, p, stderr)
		if err != nil {
			return fail(err)
		}
		l.src, src = masked, masked
	}
	ctx := mf.ctx
	if ctx == 0 {
		ctx = min(32768, cfg.MaxPositions)
	}
	if mf.routes != "" {
		if l.routes, err = trace.Create(mf.routes, trace.HeaderFor(src.Name(), cfg)); err != nil {
			return fail(err)
		}
	}
	switch {
	case mf.backend == "auto" && target == dsv4.QAT:
		fmt.Fprintf(stderr, "note: --target qat runs on the CPU\n")
	case mf.backend == "auto" && hostFlags:
		fmt.Fprintf(stderr, "note: --mem/--policy plan host memory: running on the CPU\n")
	case mf.backend == "cuda" || mf.backend == "auto":
		dev, err := cuda.Open(0)
		if err == nil {
			l.dev = dev
			if err = loadOnDevice(l, cfg, ctx, mf.chunk, gpuMem, stderr); err == nil {
				return l, nil
			}
			l.dev.Close()
			l.dev = nil
		}
		if mf.backend == "cuda" {
			return fail(fmt.Errorf("--backend cuda: %w", err))
		}
		if errors.Is(err, cuda.ErrUnavailable) {
			fmt.Fprintf(stderr, "note: no CUDA GPU and driver found; running on the CPU (--backend cpu skips the search)\n")
		} else {
			fmt.Fprintf(stderr, "note: not running on the GPU (%v); running on the CPU\n", err)
		}
	}
	plan, err := experts.NewPlan(src, cfg, budget, ctx)
	if err != nil {
		return fail(fmt.Errorf("memory plan for %s: %w", src.Name(), err))
	}
	plan.BudgetNote = note
	l.plan = plan
	l.be = cpu.New(0)
	if l.store, err = plan.NewStore(src, l.be, pol); err != nil {
		return fail(err)
	}

	opts := dsv4.Options{Backend: l.be, Experts: l.store, MaxChunk: mf.chunk, Observer: mf.observer, Target: target}
	if l.routes != nil {
		opts.Routes = l.routes
	}
	if l.m, err = dsv4.Load(src, opts); err != nil {
		return fail(err)
	}
	total := cfg.NLayers * cfg.NRoutedExperts
	fmt.Fprintf(stderr, "memory: budget %s (%s); dense %s resident; %d of %d routed experts fit (%s, policy %s)\n",
		progress.FormatBytes(budget), note, progress.FormatBytes(plan.Dense), plan.Resident(), total,
		progress.FormatBytes(plan.ExpertsBytes), polName)
	// Generated experts cost as much made ahead as on use, except where the
	// decode is timed.
	if !src.Synthetic() || mf.preloadSynthetic {
		preloadExperts(l.store, stderr)
	}
	return l, nil
}

// servingStats are the figures of a loaded model a stats line and /metrics
// show: the routed experts' hit rate since start (from the host expert store,
// or the GPU expert tier), PCIe bytes the tier copied, and the GPU memory
// the model's weights hold.
type servingStats struct {
	experts   bool // hitRate is meaningful (a store or a GPU tier counts hits)
	hitRate   float64
	pcieBytes int64
	gpuBytes  int64
}

func (l *loadedModel) servingStats() servingStats {
	var st servingStats
	if l.store != nil {
		st.experts, st.hitRate = true, l.store.Stats().Total.HitRate()
	}
	if l.m != nil && l.dev != nil {
		st.gpuBytes = int64(l.m.DeviceBytes())
		if c, ok := l.m.DeviceExpertCache(); ok && !c.Mapped {
			st.experts, st.hitRate, st.pcieBytes = true, c.HitRate(), c.PCIeBytes
		}
	}
	return st
}

// gauges reports the expert store and memory for the server's /metrics.
func (l *loadedModel) gauges() []server.Gauge {
	g := []server.Gauge{{Name: "moxie_resident_memory_bytes", Help: "Resident memory of the process (VmRSS).", Value: float64(residentBytes())}}
	if st := l.servingStats(); l.dev != nil {
		g = append(g, server.Gauge{Name: "moxie_gpu_weight_bytes", Help: "GPU memory held by the model's weights.", Value: float64(st.gpuBytes)})
		if st.experts {
			g = append(g,
				server.Gauge{Name: "moxie_expert_hit_rate", Help: "Share of routed-expert uses served from GPU memory since start.", Value: st.hitRate},
				server.Gauge{Name: "moxie_expert_pcie_bytes", Help: "Bytes of routed experts copied from host to GPU since start.", Value: float64(st.pcieBytes)})
		}
	}
	if l.store == nil {
		return g
	}
	st := l.store.Stats()
	return append(g,
		server.Gauge{Name: "moxie_expert_hit_rate", Help: "Share of routed-expert uses served from memory since start.", Value: st.Total.HitRate()},
		server.Gauge{Name: "moxie_expert_resident_bytes", Help: "Memory held by resident routed experts and scratch.", Value: float64(st.ResidentBytes)},
		server.Gauge{Name: "moxie_expert_bytes_read", Help: "Bytes of routed experts read from the checkpoint since start.", Value: float64(st.Total.BytesRead)},
		server.Gauge{Name: "moxie_expert_wait_seconds", Help: "Time forward passes waited for expert reads since start.", Value: st.Total.Wait.Seconds()},
	)
}

// writeJSONFile writes v as indented JSON to path through a temporary file
// beside it, renamed into place, so path is complete or absent.
func writeJSONFile(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// loadOnDevice binds the model resident on l.dev: every weight and routed
// expert is uploaded (the CPU memory plan and expert store are not used), and
// sequences run as device sessions of up to ctx tokens in prefill chunks of
// chunk tokens (0: dsv4.DefaultDeviceChunk); gpuMem > 0 caps the
// device memory planned with (Options.DeviceMemory); routing decisions go to
// l.routes when set. On an error it leaves l as it found it (the caller closes
// the device or falls back to the CPU).
func loadOnDevice(l *loadedModel, cfg *config.Config, ctx, chunk int, gpuMem int64, stderr io.Writer) error {
	opts := dsv4.Options{Device: l.dev, DeviceContext: ctx, DeviceMemory: gpuMem, MaxChunk: chunk}
	if l.routes != nil {
		opts.Routes = l.routes
	}
	t0 := time.Now()
	m, err := dsv4.Load(l.src, opts)
	if err != nil {
		return fmt.Errorf("loading %s onto %s: %w", l.src.Name(), l.dev.Info().Name, err)
	}
	l.m = m
	experts := "every routed expert"
	if slots, _, _ := m.DeviceExpertStats(); slots > 0 {
		experts = fmt.Sprintf("routed experts cached in %d of %d slots, loaded from host memory on a miss", slots, cfg.NLayers*cfg.NRoutedExperts)
	}
	fmt.Fprintf(stderr, "device: %s; %s of weights resident (%s), context %d tokens, uploaded in %s\n",
		l.dev.Info().Name, progress.FormatBytes(int64(m.DeviceBytes())), experts, ctx, time.Since(t0).Round(time.Millisecond))
	return nil
}

// preloadExperts reads, before the first token, every expert of the layers
// whose budget holds all of them, with a progress bar; a failed read is only
// reported (that expert is read on first use).
func preloadExperts(st *experts.Store, stderr io.Writer) {
	var bar *progress.Bar
	err := st.Preload(context.Background(), func(done, total int) {
		switch {
		case bar == nil && total > 0:
			bar = progress.New(stderr, "experts", int64(total), false)
		case bar != nil:
			bar.Add(1)
		}
	})
	if bar != nil {
		bar.Done()
	}
	if err != nil {
		fmt.Fprintf(stderr, "note: preloading routed experts: %v (they are read on first use)\n", err)
	}
}
