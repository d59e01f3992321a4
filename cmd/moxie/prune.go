package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"moxie/checkpoint"
	"moxie/dsv4/config"
	"moxie/reap"
)

// pruneSpec is --prune's value: a saliency report (moxie calibrate) and how
// many experts a layer to mask.
type pruneSpec struct {
	report string
	n      int
}

// parsePrune reads "S.json:N" (the last colon splits, so paths may hold
// colons).
func parsePrune(v string) (pruneSpec, error) {
	i := strings.LastIndex(v, ":")
	if i <= 0 || i == len(v)-1 {
		return pruneSpec{}, fmt.Errorf("--prune %q: want REPORT.json:N (a moxie calibrate report and the experts a layer to mask)", v)
	}
	n, err := strconv.Atoi(v[i+1:])
	if err != nil || n < 1 {
		return pruneSpec{}, fmt.Errorf("--prune %q: N must be a positive number of experts, not %q", v, v[i+1:])
	}
	return pruneSpec{report: v[:i], n: n}, nil
}

// prunedBiasValue is the gate bias a masked expert gets: its selection key
// p + bias is then far below every other expert's (p = sqrt(softplus(·)) is
// finite), so the router never selects it; the weights of the selected
// experts do not use the bias.
const prunedBiasValue = -1e30

// applyPrune masks, in every score-routed main layer of the model, the n
// least salient experts of the report (reap.Report.Ranking: never-selected
// ones first) by giving them a gate bias the router never selects: the
// returned source serves those layers' gate.bias with the masked entries
// replaced (checkpoint.WithTensors), so CPU and GPU runs see the same mask.
// Hash-routed layers (a fixed token-to-expert table) and MTP blocks keep
// every expert. The masked experts' weights stay in the checkpoint; the
// expert store reads them only where it preloads a whole layer (a budget
// holding all of its experts), never on demand. It says what it did on
// stderr.
func applyPrune(src checkpoint.Source, cfg *config.Config, p pruneSpec, stderr io.Writer) (checkpoint.Source, error) {
	rep, err := reap.ReadReportFile(p.report)
	if err != nil {
		return nil, fmt.Errorf("--prune: %w", err)
	}
	switch {
	case rep.Layers != cfg.NLayers || rep.Experts != cfg.NRoutedExperts:
		return nil, fmt.Errorf("--prune: %s is a report on %d layers of %d experts, and %s has %d layers of %d", p.report, rep.Layers, rep.Experts, src.Name(), cfg.NLayers, cfg.NRoutedExperts)
	case p.n > cfg.NRoutedExperts-cfg.NActivatedExperts:
		return nil, fmt.Errorf("--prune: masking %d of %d experts leaves fewer than the %d a token selects", p.n, cfg.NRoutedExperts, cfg.NActivatedExperts)
	}
	if rep.Model != src.Name() {
		fmt.Fprintf(stderr, "note: --prune: the report was measured on %s, not %s (same shape)\n", rep.Model, src.Name())
	}
	data := map[string][]byte{}
	var hash []int
	for l := range cfg.NLayers {
		if cfg.HashRouted(l) {
			hash = append(hash, l)
			continue
		}
		name := fmt.Sprintf("layers.%d.ffn.gate.bias", l)
		b, err := src.TensorData(name)
		if err != nil {
			return nil, fmt.Errorf("--prune: %w", err)
		}
		if len(b) != 4*cfg.NRoutedExperts {
			return nil, fmt.Errorf("--prune: %s of %s is %d bytes, want %d float32", name, src.Name(), len(b), cfg.NRoutedExperts)
		}
		nb := append([]byte(nil), b...)
		for _, e := range rep.Ranking(l)[:p.n] {
			binary.LittleEndian.PutUint32(nb[4*e:], math.Float32bits(prunedBiasValue))
		}
		data[name] = nb
	}
	out, err := checkpoint.WithTensors(src, data)
	if err != nil {
		return nil, fmt.Errorf("--prune: %w", err)
	}
	note := ""
	if len(hash) > 0 {
		note = fmt.Sprintf("; hash-routed layers %v keep all", hash)
	}
	fmt.Fprintf(stderr, "prune: the routers of %d layers never select their %d least salient of %d experts (%s)%s; measure the quality with moxie perplexity --prune\n",
		len(data), p.n, cfg.NRoutedExperts, p.report, note)
	return out, nil
}
