package main

import (
	"fmt"
	"io"
	"moxie/internal/progress"

	"moxie/checkpoint"
	"moxie/dsv4/config"
	"moxie/experts"
)

func runPlan(args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlags("plan", "MODEL [--mem 24GiB] [--ctx 32768]", `
Plan how a memory budget is spent running MODEL: the dense weights (every tensor
of the main model that is not a routed expert), the KV and compressor state for
--ctx tokens (float32, as moxie stores it today), activation and expert scratch,
and how many routed experts per layer stay resident in what is left; the other
experts are read from the checkpoint on demand. Reads headers only. A budget that
cannot hold the dense part is refused with the amount needed. Without --mem the
budget is 80% of the memory available now.`, stderr)
	mem := fs.String("mem", "", "memory budget (e.g. 24GiB); default 80% of MemAvailable")
	ctx := fs.Int("ctx", 0, "context length in tokens to size the KV state for (default 32768, or the model's maximum if smaller)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usagef("want exactly one MODEL (a checkpoint directory or synth:PRESET), got %d arguments", fs.NArg())
	}
	var budget int64
	var note string
	if *mem != "" {
		b, err := parseBytes(*mem)
		if err != nil {
			return usagef("--mem: %v", err)
		}
		budget, note = b, "--mem "+*mem
	} else {
		b, n, err := experts.DefaultBudget()
		if err != nil {
			return err
		}
		budget, note = b, n
	}
	src, err := checkpoint.Open(fs.Arg(0))
	if err != nil {
		return err
	}
	defer src.Close()
	raw, err := src.File("config.json")
	if err != nil {
		return err
	}
	cfg, err := config.Parse(raw)
	if err != nil {
		return fmt.Errorf("%s: config.json: %w", src.Name(), err)
	}
	if *ctx == 0 {
		*ctx = min(32768, cfg.MaxPositions)
	}
	p, err := experts.NewPlan(src, cfg, budget, *ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", src.Name(), err)
	}
	p.BudgetNote = note
	printPlan(stdout, p, src.Synthetic())
	return nil
}

func printPlan(w io.Writer, p *experts.Plan, synthetic bool) {
	c := p.Config
	fb := progress.FormatBytes
	if synthetic {
		fmt.Fprintf(w, "model    %s (SYNTHETIC: random weights)\n", p.Model)
	} else {
		fmt.Fprintf(w, "model    %s\n", p.Model)
	}
	fmt.Fprintf(w, "budget   %s (%s bytes): %s\n", fb(p.Budget), commas(p.Budget), p.BudgetNote)
	fmt.Fprintf(w, "context  %s tokens\n\nresident:\n", commas(int64(p.Context)))
	row := func(label string, n int64, note string) {
		fmt.Fprintf(w, "  %-34s %12s  %s\n", label, fb(n), note)
	}
	row("dense weights", p.Dense, "every non-routed-expert tensor of the main model (MTP not run)")
	for _, r := range config.Roles() {
		if n := p.DenseByRole[r]; n > 0 {
			fmt.Fprintf(w, "    %-32s %12s\n", r, fb(n))
		}
	}
	row("KV and compressor state", p.KV, fmt.Sprintf("float32: %s fixed + %s B/token x %s tokens",
		fb(p.KVFixed), commas(int64(p.KVPerToken)), commas(int64(p.Context))))
	row("activations (estimate)", p.Activations, fmt.Sprintf("prefill chunks of up to %d tokens", experts.PlanChunk))
	row("expert scratch", p.ExpertScratch, fmt.Sprintf("one expert per layer (%s each) for misses served without installing", fb(p.ExpertBytes)))
	total := c.NLayers * c.NRoutedExperts
	lo, hi := p.Slots[0], p.Slots[0]
	for _, s := range p.Slots[:c.NLayers] {
		lo, hi = min(lo, s), max(hi, s)
	}
	perLayer := fmt.Sprint(lo)
	if hi != lo {
		perLayer = fmt.Sprintf("%d-%d", lo, hi)
	}
	row("routed experts", p.ExpertsBytes, fmt.Sprintf("%s of %s (%.1f%%): %s of %d per layer",
		commas(int64(p.Resident())), commas(int64(total)), 100*float64(p.Resident())/float64(total), perLayer, c.NRoutedExperts))
	row("unallocated", p.Budget-p.Required()-p.ExpertsBytes, "")
	slow := int64(total-p.Resident()) * p.ExpertBytes
	fmt.Fprintf(w, "\nslow tier: %s of routed experts (%s experts) read from the checkpoint's files on demand.\n",
		fb(slow), commas(int64(total-p.Resident())))
	fmt.Fprintf(w, "Dense weights are mapped from the checkpoint; the plan keeps room for them in memory (page cache).\n")
	if p.Resident() == total {
		fmt.Fprintf(w, "Every routed expert fits: nothing is read from disk after warm-up.\n")
	}
}
