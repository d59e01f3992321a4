package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"moxie/internal/progress"
	"moxie/reap"
)

func runCalibrate(args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlags("calibrate", "--model M --file F --out S.json", `
Measure the REAP saliency of every routed expert on a calibration text, the
first step of expert pruning: the text is tokenized and run through the model
in windows of --window tokens (each from BOS), and for every layer and expert
moxie accumulates, over the tokens routed to it, the gate weight times the
norm of the expert's output (REAP, arXiv 2510.13999). The saliency is that
sum over the expert's routed tokens divided by their count; the least
salient experts of a layer are the ones to prune first, and an expert never
selected ranks below all. Writes every count and sum to --out as JSON and
prints each layer's spread and its least salient experts.

Then "moxie perplexity --prune S.json:N" on held-out text measures what it
costs never to select each score-routed layer's N least salient experts, and
run, serve and bench take the same --prune.

Calibration runs on the CPU (it observes each expert's output rows); use a
text apart from the one you later judge the pruned model on.`, stderr)
	model := fs.String("model", defaultModel(), "model: a checkpoint directory or synth:PRESET")
	file := fs.String("file", "", "calibration text file")
	out := fs.String("out", "", "write the saliency report (JSON) to this file")
	window := fs.Int("window", 1024, "tokens per window, BOS included (capped at the model's context)")
	show := fs.Int("show", 8, "least salient experts to list per layer")
	maxTokens := fs.Int("max-tokens", 0, "calibrate on at most this many of the text's tokens, from its start (0: all)")
	mf := addMemFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case fs.NArg() != 0 || *file == "" || *out == "":
		return usagef("want --file F and --out S.json (and no positional arguments)")
	case *window < 2:
		return usagef("--window must be at least 2")
	case *show < 0:
		return usagef("--show must be at least 0")
	case *maxTokens < 0:
		return usagef("--max-tokens must be at least 0")
	case mf.backend == "cuda":
		return usagef("calibration observes each expert's output on the CPU: drop --backend cuda")
	}
	mf.backend = "cpu"
	chunk := 256
	if mf.chunk > 0 {
		chunk = mf.chunk
	}
	text, err := os.ReadFile(*file)
	if err != nil {
		return fmt.Errorf("reading the calibration text: %w", err)
	}
	// The accumulator takes the model's shape, known once it loads; no
	// forward pass runs before it is set.
	obs := &lateObserver{}
	mf.observer = obs
	lm, err := loadModel(*model, mf, stderr)
	if err != nil {
		return err
	}
	defer lm.Close()
	sal, err := reap.New(lm.m.Cfg.NLayers, lm.m.Cfg.NRoutedExperts)
	if err != nil {
		return err
	}
	obs.s = sal
	ids, bos, err := encodeFile(lm, text, *file)
	if err != nil {
		return err
	}
	if *maxTokens > 0 && len(ids) > *maxTokens {
		ids = ids[:*maxTokens]
	}
	w := min(*window, lm.m.Cfg.MaxPositions)
	bar := progress.New(stderr, "calibrate", int64(len(ids)), false)
	start := time.Now()
	run := 0
	err = forWindows(ids, bos, w, func(seg []int) error {
		if err := prefillWindow(lm, seg, chunk); err != nil {
			return err
		}
		run += len(seg)
		bar.Add(int64(len(seg) - 1))
		return nil
	})
	if err != nil {
		return err
	}
	bar.Done()
	rep := sal.Report(lm.src.Name(), *file, run, lm.m.Cfg.NActivatedExperts)
	if lm.src.Synthetic() {
		rep.Note = "synthetic model with random weights"
	}
	if err := rep.Write(*out); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "model    %s\ntext     %s: %d tokens (%d run, BOS included) in %.1f s\nreport   %s\n",
		rep.Model, *file, len(ids), run, time.Since(start).Seconds(), *out)
	printSaliency(stdout, rep, *show)
	return nil
}

// prefillWindow runs seg through a fresh session in prefill chunks (the
// observer sees every routed expert's rows).
func prefillWindow(lm *loadedModel, seg []int, chunk int) error {
	s := lm.m.NewSession()
	defer s.Close()
	for lo := 0; lo < len(seg); lo += chunk {
		if _, err := s.Prefill(seg[lo:min(lo+chunk, len(seg))]); err != nil {
			return err
		}
	}
	return nil
}

// printSaliency prints a line per layer: how many experts were selected, the
// saliency's minimum, median and maximum over them, and the show least
// salient (never-selected ones are counted, not listed).
func printSaliency(w io.Writer, r *reap.Report, show int) {
	fmt.Fprintf(w, "layer  selected  saliency min / median / max   least salient\n")
	for l := range r.Layers {
		ls, err := r.Summary(l, show)
		if errors.Is(err, reap.ErrNoScores) {
			fmt.Fprintf(w, "%5d  %4d/%-4d  (no routed tokens)\n", l, 0, r.Experts)
			continue
		}
		low := make([]string, len(ls.Lowest))
		for i, e := range ls.Lowest {
			s, _ := r.Saliency(l, e)
			low[i] = fmt.Sprintf("%d (%.3g)", e, s)
		}
		fmt.Fprintf(w, "%5d  %4d/%-4d  %.4g / %.4g / %.4g   %s\n", l, ls.Selected, r.Experts, ls.Min, ls.Median, ls.Max, strings.Join(low, ", "))
	}
}

// lateObserver forwards to s, set after the model loads and before its first
// forward pass.
type lateObserver struct{ s *reap.Saliency }

func (o *lateObserver) ObserveExpert(layer, expert int, pos []int, weights, in, out []float32) {
	o.s.ObserveExpert(layer, expert, pos, weights, in, out)
}
