package main

import (
	"fmt"
	"io"
	"moxie/internal/progress"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"moxie/experts"
	"moxie/experts/sim"
	"moxie/experts/trace"
)

func runResidency(args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlags("residency", "TRACE --slots N [--policy P]", `
Replay a route trace (written with --record-routes) through residency policies
and through the offline optimum (Bélády: evict the expert used furthest in the
future, or bypass the miss if it is used later still), with N resident experts
per layer, and print hit rates per layer and overall, and a decode-speed
estimate from the tier bandwidths: each token reads the dense weights and its
resident experts at --fast-bw and its missed experts at --slow-bw, without
overlap. Policies (--policy, default all):
`+experts.PolicyHelp+`
all                         lru, decay and static with the trace's own
                            frequencies (an in-sample, optimistic hot set)`, stderr)
	slotsFlag := fs.String("slots", "", "resident experts per layer; a comma list replays each (e.g. 8,32,64)")
	policy := fs.String("policy", "all", "policy spec (see above)")
	fast := fs.String("fast-bw", "20GB", "fast-tier (memory) bandwidth in bytes per second")
	slow := fs.String("slow-bw", "1.5GB", "slow-tier (disk) bandwidth in bytes per second")
	writeFreq := fs.String("write-freq", "", "also write the trace's expert frequencies to this file (for static:FILE)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usagef("want exactly one TRACE file, got %d arguments", fs.NArg())
	}
	if *slotsFlag == "" {
		return usagef("--slots N is required (resident experts per layer)")
	}
	var slots []int
	for f := range strings.SplitSeq(*slotsFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return usagef("--slots: %q is not a non-negative integer", f)
		}
		slots = append(slots, n)
	}
	fastBW, err := parseBytes(*fast)
	if err != nil {
		return usagef("--fast-bw: %v", err)
	}
	slowBW, err := parseBytes(*slow)
	if err != nil {
		return usagef("--slow-bw: %v", err)
	}
	tr, err := trace.ReadFile(fs.Arg(0))
	if err != nil {
		return err
	}
	h := tr.Header
	for _, n := range slots {
		if n > h.Experts {
			return usagef("--slots %d exceeds the trace's %d experts per layer", n, h.Experts)
		}
	}
	freq := sim.Frequencies(tr)
	if *writeFreq != "" {
		if err := writeFileAtomic(*writeFreq, freq.Write); err != nil {
			return err
		}
	}
	type pol struct {
		f    experts.PolicyFunc
		name string
	}
	var pols []pol
	if *policy == "all" {
		for _, spec := range []string{"lru", "decay"} {
			f, name, err := experts.ParsePolicy(spec)
			if err != nil {
				return err
			}
			pols = append(pols, pol{f, name})
		}
		pols = append(pols, pol{experts.StaticFunc(freq), "static (in-sample)"})
	} else {
		f, name, err := experts.ParsePolicy(*policy)
		if err != nil {
			return usagef("--policy: %v", err)
		}
		pols = append(pols, pol{f, name})
	}
	var tokens int64
	fmt.Fprintf(stdout, "trace    %s: model %s, %d layers, %d experts, top-%d, %s records\n",
		fs.Arg(0), h.Name, h.Layers, h.Experts, h.TopK, commas(int64(len(tr.Records))))
	for _, n := range slots {
		var results []*sim.Result
		for _, p := range pols {
			r, err := sim.Replay(tr, n, p.f, p.name)
			if err != nil {
				return err
			}
			results = append(results, r)
		}
		b, err := sim.Belady(tr, n)
		if err != nil {
			return err
		}
		b.Policy = "belady (offline optimum)"
		results = append(results, b)
		tokens = b.Tokens
		fmt.Fprintf(stdout, "\nslots    %d of %d experts per layer (%.1f%%), %s tokens\n", n, h.Experts, 100*float64(n)/float64(h.Experts), commas(tokens))
		fmt.Fprintf(stdout, "  %-34s %9s %14s %12s %14s\n", "policy", "hit rate", "misses/token", "est. tok/s", "disk MB/token")
		for _, r := range results {
			est, err := sim.EstimateSpeed(h, r, float64(fastBW), float64(slowBW))
			speed, disk := "n/a", "n/a"
			if err == nil {
				speed, disk = fmt.Sprintf("%.2f", est.TokensPerSecond), fmt.Sprintf("%.1f", est.SlowBytesPerTok/1e6)
			}
			mpt := 0.0
			if r.Tokens > 0 {
				mpt = float64(r.Total.Misses) / float64(r.Tokens)
			}
			fmt.Fprintf(stdout, "  %-34s %9.4f %14.2f %12s %14s\n", r.Policy, r.Total.HitRate(), mpt, speed, disk)
		}
		fmt.Fprintf(stdout, "  per-layer hit rate:\n  %5s", "layer")
		for _, r := range results {
			short, _, _ := strings.Cut(strings.Fields(r.Policy)[0], ":")
			fmt.Fprintf(stdout, " %9.9s", short)
		}
		fmt.Fprintln(stdout)
		worst := make([]float64, len(results))
		for i := range worst {
			worst[i] = 1
		}
		for l := range h.Layers {
			if results[0].Layers[l].Slots() == 0 {
				continue
			}
			fmt.Fprintf(stdout, "  %5d", l)
			for i, r := range results {
				hr := r.Layers[l].HitRate()
				worst[i] = min(worst[i], hr)
				fmt.Fprintf(stdout, " %9.4f", hr)
			}
			fmt.Fprintln(stdout)
		}
		fmt.Fprintf(stdout, "  %5s", "worst")
		for _, w := range worst {
			fmt.Fprintf(stdout, " %9.4f", w)
		}
		fmt.Fprintln(stdout)
	}
	if h.ExpertBytes == 0 {
		fmt.Fprintf(stdout, "\n(the trace header has no byte sizes: no speed estimate)\n")
	} else {
		fmt.Fprintf(stdout, "\nestimate: %s dense + %s per expert per token; fast %s/s, slow %s/s; no overlap, no compute\n",
			progress.FormatBytes(h.DenseBytesPerToken), progress.FormatBytes(h.ExpertBytes), *fast, *slow)
	}
	return nil
}

// writeFileAtomic writes path through a temporary file in the same directory.
func writeFileAtomic(path string, write func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	err = write(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
