package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"moxie/internal/progress"
	"os"

	"moxie/checkpoint"
	"moxie/compute/cpu"
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
	errs = append(errs, l.src.Close())
	return errors.Join(errs...)
}

// memFlags are the memory and residency flags shared by run, serve and bench.
type memFlags struct {
	mem, policy, routes string
	ctx                 int
}

// addMemFlags registers --mem, --ctx, --policy and --record-routes on fs.
func addMemFlags(fs *flag.FlagSet) *memFlags {
	f := &memFlags{}
	fs.StringVar(&f.mem, "mem", "", "memory budget, e.g. 24GiB: dense weights and state stay resident, routed experts fill the rest and are read from the checkpoint on a miss (default: a safe share of available memory)")
	fs.IntVar(&f.ctx, "ctx", 0, "context length in tokens the memory plan reserves state for (default 32768, or the model's maximum if smaller)")
	fs.StringVar(&f.policy, "policy", "lru", "expert residency policy: lru, decay[:h=64,ratio=1.25,margin=4] or static:FREQFILE")
	fs.StringVar(&f.routes, "record-routes", "", "write every routing decision to this trace file (see moxie residency)")
	return f
}

// loadModel opens spec (a directory or synth:...), plans memory, and binds the
// model with its routed experts served by the expert store under the budget.
// mf may be nil (all defaults). It tells the user on stderr what it loaded and
// when the weights are synthetic.
func loadModel(spec string, mf *memFlags, stderr io.Writer) (*loadedModel, error) {
	if mf == nil {
		mf = &memFlags{policy: "lru"}
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
	ctx := mf.ctx
	if ctx == 0 {
		ctx = min(32768, cfg.MaxPositions)
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
	opts := dsv4.Options{Backend: l.be, Experts: l.store}
	if mf.routes != "" {
		if l.routes, err = trace.Create(mf.routes, trace.HeaderFor(src.Name(), cfg)); err != nil {
			return fail(err)
		}
		opts.Routes = l.routes
	}
	if l.m, err = dsv4.Load(src, opts); err != nil {
		return fail(err)
	}
	total := cfg.NLayers * cfg.NRoutedExperts
	fmt.Fprintf(stderr, "memory: budget %s (%s); dense %s resident; %d of %d routed experts fit (%s, policy %s)\n",
		progress.FormatBytes(budget), note, progress.FormatBytes(plan.Dense), plan.Resident(), total,
		progress.FormatBytes(plan.ExpertsBytes), polName)
	return l, nil
}

// expertHitRate is the store's overall hit rate so far (0 without a store).
func (l *loadedModel) expertHitRate() float64 {
	if l.store == nil {
		return 0
	}
	return l.store.Stats().Total.HitRate()
}

// gauges reports the expert store and memory for the server's /metrics.
func (l *loadedModel) gauges() []server.Gauge {
	g := []server.Gauge{{Name: "moxie_resident_memory_bytes", Help: "Resident memory of the process (VmRSS).", Value: float64(residentBytes())}}
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
