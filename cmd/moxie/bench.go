package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"time"

	"moxie/compute/cpu/kern"
	"moxie/compute/cuda"
	"moxie/dsv4"
	"moxie/dsv4/config"
	"moxie/generate"
	"moxie/internal/membw"
	"moxie/internal/progress"
	"moxie/sample"
)

// benchReport is what `moxie bench` measures; --json writes it as evidence.
type benchReport struct {
	Model          string  `json:"model"`
	Synthetic      bool    `json:"synthetic"`
	Backend        string  `json:"backend"`
	Threads        int     `json:"threads"`
	SIMD           bool    `json:"simd_build"`
	GoVersion      string  `json:"go_version"`
	Date           string  `json:"date"`
	PromptTokens   int     `json:"prompt_tokens"`
	DecodeTokens   int     `json:"decode_tokens"`
	Runs           int     `json:"runs"`
	WarmupRuns     int     `json:"warmup_runs"`
	PrefillTokPerS float64 `json:"prefill_tok_per_s"` // median over runs
	DecodeTokPerS  float64 `json:"decode_tok_per_s"`  // median step time over all runs
	DecodeStepMs   float64 `json:"decode_step_ms"`    // median
	// Sampling: with --sample, the parameters each decode step sampled
	// its token with (inside the timed step).
	Sampling      string  `json:"sampling,omitempty"`
	BytesPerToken int64   `json:"weight_bytes_per_token"`
	MemReadGBps   float64 `json:"mem_read_gbps"` // measured in the same run: the larger of the probes below (GPU), or the host probe
	// With --backend cuda, the two probes MemReadGBps is the larger of: a
	// fresh buffer of --bw-size bytes, and the same size (or less) read in
	// place from the middle of the resident weights.
	MemReadFreshGBps   float64 `json:"mem_read_fresh_gbps,omitempty"`
	MemReadWeightsGBps float64 `json:"mem_read_weights_gbps,omitempty"`
	DecodeBoundTokS    float64 `json:"decode_bound_tok_per_s"` // MemReadGBps / BytesPerToken
	Efficiency         float64 `json:"decode_efficiency"`      // DecodeTokPerS / DecodeBoundTokS
	// With --backend cuda: how the routed experts were served during the
	// timed runs. ExpertHitRate is the share of expert uses found in GPU
	// memory and PCIeBytesPerToken the expert bytes copied host→device per
	// token, over the decode steps (Prefill*: over the prefills); the
	// all-resident model reports 1 and 0.
	ExpertHitRate            *float64 `json:"expert_hit_rate,omitempty"`
	PCIeBytesPerToken        *float64 `json:"pcie_bytes_per_token,omitempty"`
	PrefillExpertHitRate     *float64 `json:"prefill_expert_hit_rate,omitempty"`
	PrefillPCIeBytesPerToken *float64 `json:"prefill_pcie_bytes_per_token,omitempty"`
	// With an expert tier (the experts do not all fit under --gpu-mem): GPU
	// slots in all (static + cache), experts kept static, cache slots, and
	// the experts held in pinned host memory with its bytes.
	DeviceExpertSlots   int   `json:"device_expert_slots,omitempty"`
	DeviceStaticExperts int   `json:"device_static_experts,omitempty"`
	DeviceCacheSlots    int   `json:"device_cache_slots,omitempty"`
	HostExperts         int   `json:"host_experts,omitempty"`
	PinnedHostBytes     int64 `json:"pinned_host_bytes,omitempty"`
	// ExpertsMapped: the host-held experts were read in place over PCIe
	// (MOXIE_DEVICE_EXPERTS=mapped); hit rates and PCIe bytes are not
	// counted then.
	ExpertsMapped bool `json:"experts_mapped,omitempty"`
	// With --timing on a device: the medians over the timed decode steps
	// of where a step's time went (dsv4.StepTiming, in milliseconds).
	DecodeTiming *stepTimingMs `json:"decode_timing_ms,omitempty"`
}

// stepTimingMs is dsv4.StepTiming in milliseconds: each field the median
// over the timed decode steps (so they need not add up to Wall); Idle is
// the median of Wall - Device, the time the GPU waits for the host.
type stepTimingMs struct {
	Wall     float64 `json:"wall"`
	Device   float64 `json:"device"`
	Idle     float64 `json:"gpu_idle"`
	Handoff  float64 `json:"handoff"`
	Enqueue  float64 `json:"enqueue"`
	Wait     float64 `json:"wait"`
	Download float64 `json:"download"`
	Return   float64 `json:"return"`
}

// medianTimings reduces per-step timings to their medians (nil for none).
func medianTimings(ts []dsv4.StepTiming) *stepTimingMs {
	if len(ts) == 0 {
		return nil
	}
	med := func(f func(dsv4.StepTiming) time.Duration) float64 {
		v := make([]time.Duration, len(ts))
		for i, t := range ts {
			v[i] = f(t)
		}
		slices.Sort(v)
		return float64(v[len(v)/2]) / float64(time.Millisecond)
	}
	return &stepTimingMs{
		Wall:   med(func(t dsv4.StepTiming) time.Duration { return t.Wall }),
		Device: med(func(t dsv4.StepTiming) time.Duration { return t.Device }),
		Idle: med(func(t dsv4.StepTiming) time.Duration {
			if t.Ahead { // started by the call before: its idle is the gap before it
				return t.Gap
			}
			return t.Wall - t.Device
		}),
		Handoff:  med(func(t dsv4.StepTiming) time.Duration { return t.Handoff }),
		Enqueue:  med(func(t dsv4.StepTiming) time.Duration { return t.Enqueue }),
		Wait:     med(func(t dsv4.StepTiming) time.Duration { return t.Wait }),
		Download: med(func(t dsv4.StepTiming) time.Duration { return t.Download }),
		Return:   med(func(t dsv4.StepTiming) time.Duration { return t.Return }),
	}
}

// The sampling defaults of `moxie run`, which `moxie bench --sample` uses.
const (
	defaultTemperature = 0.6
	defaultTopP        = 0.95
)

// stepTimer is a sequence that can time its calls (dsv4.DeviceSession).
type stepTimer interface {
	TimeSteps(on bool)
	LastTiming() (dsv4.StepTiming, bool)
}

// expertServing fills rep's expert figures of a device run: tier is the
// model's expert tier (tiered false: every expert resident), dec and pre the
// tier's counters over the timed decode steps and prefills, of decTokens
// and preTokens tokens.
func (rep *benchReport) expertServing(tier dsv4.DeviceExpertCache, tiered bool, dec, pre dsv4.DeviceExpertCache, decTokens, preTokens int) {
	one, zero := 1.0, 0.0
	if !tiered {
		rep.ExpertHitRate, rep.PCIeBytesPerToken = &one, &zero
		rep.PrefillExpertHitRate, rep.PrefillPCIeBytesPerToken = &one, &zero
		return
	}
	rep.DeviceExpertSlots = tier.Static + tier.Slots
	rep.DeviceStaticExperts, rep.DeviceCacheSlots = tier.Static, tier.Slots
	rep.HostExperts, rep.PinnedHostBytes = tier.Host, tier.HostBytes
	if rep.ExpertsMapped = tier.Mapped; tier.Mapped {
		return
	}
	rate := func(c dsv4.DeviceExpertCache) *float64 { r := c.HitRate(); return &r }
	per := func(b int64, n int) *float64 { r := float64(b) / float64(max(n, 1)); return &r }
	rep.ExpertHitRate, rep.PCIeBytesPerToken = rate(dec), per(dec.PCIeBytes, decTokens)
	rep.PrefillExpertHitRate, rep.PrefillPCIeBytesPerToken = rate(pre), per(pre.PCIeBytes, preTokens)
}

// writeExperts prints the expert figures of a device run (nothing without).
func (rep *benchReport) writeExperts(w io.Writer) {
	if rep.ExpertsMapped {
		fmt.Fprintf(w, "expert tier        %d static on the GPU, %d experts read in place from mapped host memory (%s); hits and PCIe bytes not counted\n",
			rep.DeviceStaticExperts, rep.HostExperts, progress.FormatBytes(rep.PinnedHostBytes))
		return
	}
	if rep.ExpertHitRate == nil {
		return
	}
	if rep.DeviceExpertSlots == 0 {
		fmt.Fprintf(w, "experts            all resident on the GPU (hit rate 100%%, nothing copied over PCIe)\n")
		return
	}
	fmt.Fprintf(w, "expert tier        %d static + %d cache slots on the GPU, %d experts in pinned host memory (%s)\n",
		rep.DeviceStaticExperts, rep.DeviceCacheSlots, rep.HostExperts, progress.FormatBytes(rep.PinnedHostBytes))
	fmt.Fprintf(w, "expert hits        decode %.1f%%, %s per token over PCIe; prefill %.1f%%, %s per token\n",
		*rep.ExpertHitRate*100, progress.FormatBytes(int64(*rep.PCIeBytesPerToken)),
		*rep.PrefillExpertHitRate*100, progress.FormatBytes(int64(*rep.PrefillPCIeBytesPerToken)))
}

func runBench(args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlags("bench", "[MODEL]", `
Measure prefill and decode speed at batch 1: a random prompt of
--prompt tokens is prefilled, then --decode tokens are decoded one at a time,
--runs times. Reports median prefill tokens/s, median decode step, the weight
bytes a decoded token reads, and the efficiency against the memory read
bandwidth measured in the same run (bound = bandwidth / bytes per token): host
memory on the CPU backend, the GPU's memory with --backend cuda (the faster
of a fresh buffer and the resident weights read in place: a buffer allocated
beside a nearly full GPU's model can read slower than the weights do).
MODEL defaults to the built-in model; use synth:flash?layers=2 for V4-Flash shapes.`, stderr)
	prompt := fs.Int("prompt", 64, "prompt tokens to prefill")
	decode := fs.Int("decode", 16, "tokens to decode after the prompt")
	runs := fs.Int("runs", 3, "repetitions (medians are reported)")
	warmup := fs.Int("warmup", 1, "untimed runs of the same shape first, so that experts loaded on first use, kernel compilation and cold caches stay out of the medians (0 measures from cold)")
	bwSize := fs.String("bw-size", "1GiB", "buffer size for the bandwidth probe (several times the last-level cache)")
	seed := fs.Uint64("seed", 1, "seed for the random prompt")
	jsonOut := fs.String("json", "", "also write the report as JSON to this file")
	timing := fs.Bool("timing", false, "with --backend cuda, also split each decode step into GPU time (CUDA events) and the host's work around it: hand-off to the device thread, enqueue, wait, logits download, return (costs two event records a step)")
	hostSample := fs.Bool("sample-host", false, "with --sample: download every step's logits and sample on the host even where the backend can reduce them for the sampler where they are (the GPU)")
	sampled := fs.Bool("sample", false, "sample each decode step's token from its logits as moxie run does (--temperature, --top-p) inside the timed step, and decode the sampled tokens: the step a user sees (default: random tokens, no sampling)")
	greedy := fs.Bool("greedy", false, "decode greedily as moxie run --temperature 0 does: each step's argmax is the next token, found where the logits are, and on the GPU each step starts before the host has read the one before (MOXIE_CUDA_AHEAD=off waits); the tokens then follow the model, so with an expert tier the hit rate is the model's own, not random tokens'")
	temp := fs.Float64("temperature", defaultTemperature, "with --sample: the sampling temperature (0 is greedy)")
	topP := fs.Float64("top-p", defaultTopP, "with --sample: the nucleus (1 disables)")
	mf := addMemFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 1 {
		return usagef("want at most one MODEL")
	}
	if *prompt < 1 || *decode < 1 || *runs < 1 {
		return usagef("--prompt, --decode and --runs must be at least 1")
	}
	if *warmup < 0 {
		return usagef("--warmup must be at least 0")
	}
	if *greedy && *sampled {
		return usagef("--greedy and --sample exclude each other (--sample --temperature 0 samples greedily on the host's terms)")
	}
	bw, err := parseBytes(*bwSize)
	if err != nil {
		return usagef("--bw-size: %v", err)
	}
	spec := defaultModel()
	if fs.NArg() == 1 {
		spec = fs.Arg(0)
	}
	t0 := time.Now()
	mf.preloadSynthetic = true // the timed decode must not generate experts on first use
	lm, err := loadModel(spec, mf, stderr)
	if err != nil {
		return err
	}
	defer lm.Close()
	m := lm.m
	fmt.Fprintf(stderr, "loaded %s in %s\n", lm.src.Name(), time.Since(t0).Round(time.Millisecond))
	if *prompt+*decode > m.Cfg.MaxPositions {
		return usagef("--prompt + --decode = %d exceeds the model's context of %d", *prompt+*decode, m.Cfg.MaxPositions)
	}
	rep := &benchReport{Model: lm.src.Name(), Synthetic: lm.src.Synthetic(), Backend: lm.backendName(), Threads: runtime.NumCPU(), SIMD: kern.SIMD,
		GoVersion: runtime.Version(), Date: time.Now().UTC().Format(time.RFC3339), PromptTokens: *prompt,
		DecodeTokens: *decode, Runs: *runs, WarmupRuns: *warmup, BytesPerToken: config.BytesPerToken(m.Cfg)}
	r := rand.New(rand.NewPCG(*seed, 0))
	var prefillRates []float64
	var describe string // how a device session ran (graphs, expert paths)
	var steps []time.Duration
	var timings []dsv4.StepTiming // with --timing on a device
	// Expert tier counters over the timed prefills and decode steps.
	tier, tiered := m.DeviceExpertCache()
	var preTier, decTier dsv4.DeviceExpertCache
	snap := func() dsv4.DeviceExpertCache { c, _ := m.DeviceExpertCache(); return c }
	total := *warmup + *runs
	bar := progress.New(stderr, "bench", int64(total*(*decode+1)), false)
	reducedOn := ""                             // where --sample's logits were reduced ("": not at all)
	var fullSteps, drawnSteps, reducedSteps int // reduced steps, those whose sampler needed every logit, those drawn where the logits are
	for run := range total {
		timed := run >= *warmup
		toks := make([]int, *prompt+*decode)
		for i := range toks {
			toks[i] = r.IntN(m.Cfg.VocabSize)
		}
		ctx := context.Background()
		s, err := m.NewSequence()
		if err != nil {
			return err
		}
		timer, canTime := s.(stepTimer)
		if *timing && canTime {
			timer.TimeSteps(true)
		}
		c0 := snap()
		start := time.Now()
		if _, err := s.Append(ctx, toks[:*prompt]); err != nil {
			return err
		}
		if timed {
			prefillRates = append(prefillRates, float64(*prompt)/time.Since(start).Seconds())
		}
		c1 := snap()
		bar.Add(1)
		into, _ := s.(generate.IntoAppender) // as generate's decode loop does
		var logits []float32
		var smp *sample.Sampler
		if *sampled || *greedy {
			p := sample.Params{Temperature: *temp, TopP: *topP, Seed: *seed + uint64(run)}
			if *greedy {
				p = sample.Params{}
			}
			if smp, err = sample.New(p); err != nil {
				return err
			}
		}
		red, _ := s.(generate.Reducer)
		var spec sample.ReduceSpec
		if smp != nil && red != nil && !*hostSample {
			spec = smp.Reduce() // as generate's decode loop does
		}
		if spec.OK {
			reducedOn = "device"
		}
		pipe, _ := s.(generate.Pipeliner)
		if pipe != nil && spec.OK && spec.Greedy {
			pipe.Pipeline(*decode > 1) // as generate's decode loop does
		} else {
			pipe = nil
		}
		var reduction sample.Reduction
		for i, t := range toks[*prompt:] {
			st := time.Now()
			if pipe != nil && i == *decode-1 {
				pipe.Pipeline(false) // the last step: none after it
			}
			if spec.OK {
				reducedSteps++
				err = red.AppendReduce(ctx, []int{t}, spec, &reduction)
				if err != nil {
					return err
				}
				id, full, err := smp.SampleReduced(&reduction)
				if err == nil && full && !reduction.Complete {
					if d, ok := smp.PrepareDeviceDraw(&reduction); ok {
						full = false
						drawnSteps++
						id, err = red.DrawReduced(d)
					}
				}
				if err == nil && full {
					fullSteps++
					if logits, err = red.LastLogits(logits); err == nil {
						id, err = smp.Sample(logits, nil)
					}
				}
				if err != nil {
					return err
				}
				if j := *prompt + i + 1; j < len(toks) {
					toks[j] = id
				}
			} else if into != nil {
				logits, err = into.AppendInto(ctx, []int{t}, logits)
			} else {
				logits, err = s.Append(ctx, []int{t})
			}
			if err != nil {
				return err
			}
			if smp != nil && !spec.OK {
				id, err := smp.Sample(logits, nil)
				if err != nil {
					return err
				}
				if j := *prompt + i + 1; j < len(toks) {
					toks[j] = id // the next step decodes the sampled token
				}
			}
			if timed {
				steps = append(steps, time.Since(st))
				if *timing && canTime {
					if t, ok := timer.LastTiming(); ok {
						timings = append(timings, t)
					}
				}
			}
			bar.Add(1)
		}
		if pipe != nil {
			if err := pipe.Settle(); err != nil {
				return err
			}
		}
		if timed && tiered {
			preTier = preTier.Add(c1.Sub(c0))
			decTier = decTier.Add(snap().Sub(c1))
		}
		if d, ok := s.(interface{ Describe() string }); ok && run == total-1 {
			describe = d.Describe()
		}
		s.Close()
	}
	bar.Done()
	if describe != "" {
		fmt.Fprintln(stderr, describe)
	}
	if lm.dev != nil {
		rep.expertServing(tier, tiered, decTier, preTier, *runs**decode, *runs**prompt)
	}
	var ceiling string
	if lm.dev != nil {
		gbps, err := lm.dev.ReadBandwidth(int(bw), 11)
		if err != nil {
			return err
		}
		rep.MemReadFreshGBps = gbps / 1e9
		rep.MemReadGBps = rep.MemReadFreshGBps
		ceiling = fmt.Sprintf("%s memory, measured now", lm.dev.Info().Name)
		if p, n, ok := m.ResidentWeights(); ok && n >= 1<<20 {
			size := min(n, int(bw)) &^ 255
			at := p + cuda.DevicePtr((n-size)/2&^255)
			w, err := lm.dev.ReadBandwidthAt(at, size, 11)
			if err != nil {
				return err
			}
			rep.MemReadWeightsGBps = w / 1e9
			if rep.MemReadWeightsGBps > rep.MemReadGBps {
				rep.MemReadGBps = rep.MemReadWeightsGBps
				ceiling = fmt.Sprintf("%s memory, measured now over the resident weights; a fresh buffer read %.1f", lm.dev.Info().Name, rep.MemReadFreshGBps)
			} else {
				ceiling += fmt.Sprintf("; the resident weights read %.1f", rep.MemReadWeightsGBps)
			}
		}
	} else {
		mbw := membw.Measure(bw, 0, 5)
		rep.MemReadGBps = mbw.GBps()
		ceiling = fmt.Sprintf("host memory, measured now, %d workers", mbw.Workers)
	}
	slices.Sort(prefillRates)
	slices.Sort(steps)
	step := steps[len(steps)/2]
	rep.PrefillTokPerS = prefillRates[len(prefillRates)/2]
	rep.DecodeStepMs = float64(step.Microseconds()) / 1000
	rep.DecodeTokPerS = 1 / step.Seconds()
	rep.DecodeBoundTokS = rep.MemReadGBps * 1e9 / float64(rep.BytesPerToken)
	rep.Efficiency = rep.DecodeTokPerS / rep.DecodeBoundTokS
	fmt.Fprintf(stdout, "model              %s%s\n", rep.Model, map[bool]string{true: " (synthetic)", false: ""}[rep.Synthetic])
	if lm.dev != nil {
		fmt.Fprintf(stdout, "backend            cuda, %s, %s\n", lm.dev.Info().Name, rep.GoVersion)
	} else {
		fmt.Fprintf(stdout, "backend            cpu, %d threads, %s\n", rep.Threads, rep.GoVersion)
	}
	fmt.Fprintf(stdout, "prefill            %.1f tok/s (median of %d runs, %d-token prompt)\n", rep.PrefillTokPerS, rep.Runs, rep.PromptTokens)
	if *greedy {
		// Whether steps ran ahead is the session's to say (Describe, on
		// stderr above): it depends on its switch and on the graph.
		rep.Sampling = "greedy"
		if reducedOn != "" {
			rep.Sampling += ", the argmax found on the " + reducedOn
		}
		fmt.Fprintf(stdout, "decode             %.2f tok/s (median step %.2f ms over %d steps, %s)\n", rep.DecodeTokPerS, rep.DecodeStepMs, len(steps), rep.Sampling)
	} else if *sampled {
		rep.Sampling = fmt.Sprintf("temperature %g, top-p %g", *temp, *topP)
		if reducedOn != "" {
			rep.Sampling += fmt.Sprintf(", logits reduced on the %s (%d of %d steps drawn there, %d needed every logit)", reducedOn, drawnSteps, reducedSteps, fullSteps)
		} else {
			rep.Sampling += ", on the host"
		}
		fmt.Fprintf(stdout, "decode             %.2f tok/s (median step %.2f ms over %d steps, sampling included: %s)\n", rep.DecodeTokPerS, rep.DecodeStepMs, len(steps), rep.Sampling)
	} else {
		fmt.Fprintf(stdout, "decode             %.2f tok/s (median step %.2f ms over %d steps)\n", rep.DecodeTokPerS, rep.DecodeStepMs, len(steps))
	}
	fmt.Fprintf(stdout, "weights per token  %s (%s)\n", commas(rep.BytesPerToken), progress.FormatBytes(rep.BytesPerToken))
	fmt.Fprintf(stdout, "memory read        %.1f GB/s (%s) -> decode bound %.2f tok/s\n", rep.MemReadGBps, ceiling, rep.DecodeBoundTokS)
	fmt.Fprintf(stdout, "efficiency         %.1f%% of the bandwidth bound\n", rep.Efficiency*100)
	rep.writeExperts(stdout)
	if rep.DecodeTiming = medianTimings(timings); rep.DecodeTiming != nil {
		t := rep.DecodeTiming
		fmt.Fprintf(stdout, "decode timing      GPU %.3f ms a step (events), GPU idle %.3f ms: hand-off %.3f, enqueue %.3f, wait %.3f, download %.3f, return %.3f (medians)\n",
			t.Device, t.Idle, t.Handoff, t.Enqueue, t.Wait, t.Download, t.Return)
	} else if *timing {
		fmt.Fprintf(stdout, "decode timing      not available: only device sessions (--backend cuda) time their steps\n")
	}
	if !kern.SIMD && lm.dev == nil {
		fmt.Fprintf(stdout, "note               portable build: its kernels and bandwidth probe are scalar Go and may understate\n                   the machine; build with GOEXPERIMENT=simd for speed and a true ceiling\n")
	}
	if *jsonOut != "" {
		return writeJSONFile(*jsonOut, rep)
	}
	return nil
}
