// Package reap measures REAP saliency of routed experts (Router-weighted
// Expert Activation Pruning, arXiv 2510.13999, Eq. 9): for layer ℓ and
// expert j, over the token positions whose selected experts include j,
//
//	S_j = (1/|X_j|) · Σ_{x ∈ X_j} g_j(x) · ‖f_j(x)‖₂
//
// with g_j(x) the gate weight the model applied and f_j(x) the expert's
// output before that weight. Experts with the lowest S_j in a layer are the
// candidates for pruning; an expert never selected has no score and ranks
// below every scored one.
//
// A Saliency is a dsv4.ExpertObserver: attach it to a host forward pass over
// a calibration text (moxie calibrate) and it accumulates, in float64, per
// (layer, expert) the sum of g·‖f‖, the number of routed slots and the sum
// of g. Since every gate weight of DeepSeek-V4 is positive, g·‖f‖ = ‖g·f‖:
// the norm of the output row the layer adds, which the observer receives.
package reap

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
)

// Saliency accumulates REAP statistics for Layers layers of Experts routed
// experts each. It is safe for concurrent use.
type Saliency struct {
	Layers, Experts int

	mu    sync.Mutex
	sum   []float64 // Σ g·‖f‖, [layer·Experts + expert]
	gsum  []float64 // Σ g
	count []int64   // routed slots
}

// New returns an empty accumulator; layers and experts must be positive.
func New(layers, experts int) (*Saliency, error) {
	if layers <= 0 || experts <= 0 || layers > maxLayers || experts > maxExperts {
		return nil, fmt.Errorf("reap: %d layers of %d experts, want 1..%d layers of 1..%d experts", layers, experts, maxLayers, maxExperts)
	}
	n := layers * experts
	return &Saliency{Layers: layers, Experts: experts, sum: make([]float64, n), gsum: make([]float64, n), count: make([]int64, n)}, nil
}

// Bounds on a report's shape (a report is read from files: no allocation
// beyond these).
const (
	maxLayers  = 1 << 10
	maxExperts = 1 << 14
)

// ObserveExpert adds one expert's rows of a chunk (dsv4.ExpertObserver's
// contract): out holds len(weights) rows, each the weighted output whose
// norm is g·‖f‖. Observations outside the accumulator's layers or experts,
// or with out not a whole number of rows, are ignored (MTP blocks beyond
// the layers asked for, say).
func (s *Saliency) ObserveExpert(layer, expert int, pos []int, weights, in, out []float32) {
	n := len(weights)
	if layer < 0 || layer >= s.Layers || expert < 0 || expert >= s.Experts || n == 0 || len(out)%n != 0 {
		return
	}
	d := len(out) / n
	var sum, gsum float64
	for r := range n {
		var ss float64
		for _, v := range out[r*d : (r+1)*d] {
			ss += float64(v) * float64(v)
		}
		sum += math.Sqrt(ss)
		gsum += float64(weights[r])
	}
	i := layer*s.Experts + expert
	s.mu.Lock()
	s.sum[i] += sum
	s.gsum[i] += gsum
	s.count[i] += int64(n)
	s.mu.Unlock()
}

// Score returns expert's saliency in layer, S = Σ g·‖f‖ / count, and false
// when it was never selected.
func (s *Saliency) Score(layer, expert int) (float64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := layer*s.Experts + expert
	if s.count[i] == 0 {
		return 0, false
	}
	return s.sum[i] / float64(s.count[i]), true
}

// Report is a calibration's result as written to JSON: per layer, per
// expert, the routed slots, Σ g·‖f‖ and Σ g; Saliency is derived (S =
// GNormSum/Count, 0 where Count is 0).
type Report struct {
	Model   string        `json:"model"`
	Text    string        `json:"text,omitempty"` // the calibration text's file
	Tokens  int           `json:"tokens"`         // calibration tokens run
	Layers  int           `json:"layers"`         // main layers observed
	Experts int           `json:"experts"`        // routed experts a layer
	TopK    int           `json:"top_k"`          // experts selected a token
	Stats   []LayerReport `json:"stats"`          // one a layer
	Note    string        `json:"note,omitempty"` // free text
	Version int           `json:"version"`        // ReportVersion
}

// LayerReport is one layer's statistics, indexed by expert.
type LayerReport struct {
	Count    []int64   `json:"count"`
	GNormSum []float64 `json:"gnorm_sum"`
	GateSum  []float64 `json:"gate_sum"`
}

// ReportVersion is the format version Report writes and ReadReport reads.
const ReportVersion = 1

// Report snapshots the accumulator.
func (s *Saliency) Report(model, text string, tokens, topK int) *Report {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := &Report{Model: model, Text: text, Tokens: tokens, Layers: s.Layers, Experts: s.Experts, TopK: topK, Version: ReportVersion}
	for l := range s.Layers {
		lo, hi := l*s.Experts, (l+1)*s.Experts
		r.Stats = append(r.Stats, LayerReport{Count: slices.Clone(s.count[lo:hi]), GNormSum: slices.Clone(s.sum[lo:hi]), GateSum: slices.Clone(s.gsum[lo:hi])})
	}
	return r
}

// Saliency returns expert's saliency in layer and whether it was selected.
func (r *Report) Saliency(layer, expert int) (float64, bool) {
	st := r.Stats[layer]
	if st.Count[expert] == 0 {
		return 0, false
	}
	return st.GNormSum[expert] / float64(st.Count[expert]), true
}

// Ranking returns layer's experts from the least salient to the most: the
// never-selected ones first (in id order), then by ascending saliency (ties
// by id). Pruning n experts removes the first n.
func (r *Report) Ranking(layer int) []int {
	ids := make([]int, r.Experts)
	for i := range ids {
		ids[i] = i
	}
	slices.SortStableFunc(ids, func(a, b int) int {
		sa, oka := r.Saliency(layer, a)
		sb, okb := r.Saliency(layer, b)
		switch {
		case oka != okb:
			if !oka {
				return -1
			}
			return 1
		case sa < sb:
			return -1
		case sa > sb:
			return 1
		}
		return 0
	})
	return ids
}

// Unselected returns layer's experts never selected, in id order.
func (r *Report) Unselected(layer int) []int {
	var ids []int
	for e, c := range r.Stats[layer].Count {
		if c == 0 {
			ids = append(ids, e)
		}
	}
	return ids
}

// Write writes r as indented JSON to path through a temporary file beside
// it, renamed into place: path is complete or absent.
func (r *Report) Write(path string) error {
	if err := r.validate(); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", " ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(append(b, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("reap: writing %s: %w", path, err)
	}
	return nil
}

// maxReportBytes bounds a report file (a V4-Flash report is about 1.3 MB).
const maxReportBytes = 64 << 20

// ReadReport parses and validates a report: the version, shapes (a
// LayerReport per layer, Experts entries in each list), non-negative counts
// and sums, finite numbers, and sums of zero where a count is zero. Errors
// name the field.
func ReadReport(rd io.Reader) (*Report, error) {
	b, err := io.ReadAll(io.LimitReader(rd, maxReportBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reap: reading the report: %w", err)
	}
	if len(b) > maxReportBytes {
		return nil, fmt.Errorf("reap: the report is over %d bytes", maxReportBytes)
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("reap: the report is not valid JSON: %w", err)
	}
	if err := r.validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// ReadReportFile is ReadReport of a file, naming it in errors.
func ReadReportFile(path string) (*Report, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r, err := ReadReport(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

func (r *Report) validate() error {
	switch {
	case r.Version != ReportVersion:
		return fmt.Errorf("reap: report version %d, want %d", r.Version, ReportVersion)
	case r.Layers <= 0 || r.Layers > maxLayers:
		return fmt.Errorf("reap: layers %d, want 1..%d", r.Layers, maxLayers)
	case r.Experts <= 0 || r.Experts > maxExperts:
		return fmt.Errorf("reap: experts %d, want 1..%d", r.Experts, maxExperts)
	case r.TopK <= 0 || r.TopK > r.Experts:
		return fmt.Errorf("reap: top_k %d, want 1..experts (%d)", r.TopK, r.Experts)
	case r.Tokens < 0:
		return fmt.Errorf("reap: tokens %d, want at least 0", r.Tokens)
	case len(r.Stats) != r.Layers:
		return fmt.Errorf("reap: %d entries in stats, want one a layer (%d)", len(r.Stats), r.Layers)
	}
	for l, st := range r.Stats {
		if len(st.Count) != r.Experts || len(st.GNormSum) != r.Experts || len(st.GateSum) != r.Experts {
			return fmt.Errorf("reap: stats[%d]: count, gnorm_sum and gate_sum have %d, %d and %d entries, want %d each",
				l, len(st.Count), len(st.GNormSum), len(st.GateSum), r.Experts)
		}
		for e := range r.Experts {
			c, g, w := st.Count[e], st.GNormSum[e], st.GateSum[e]
			switch {
			case c < 0:
				return fmt.Errorf("reap: stats[%d].count[%d] = %d, want at least 0", l, e, c)
			case !(g >= 0) || math.IsInf(g, 0) || !(w >= 0) || math.IsInf(w, 0):
				return fmt.Errorf("reap: stats[%d] expert %d: gnorm_sum %v, gate_sum %v: want finite, non-negative sums", l, e, g, w)
			case c == 0 && (g != 0 || w != 0):
				return fmt.Errorf("reap: stats[%d] expert %d: never selected but gnorm_sum %v, gate_sum %v", l, e, g, w)
			}
		}
	}
	return nil
}

// ErrNoScores is returned by Summary for a layer with no routed slots.
var ErrNoScores = errors.New("reap: no expert of the layer was selected")

// LayerSummary describes one layer's saliency distribution.
type LayerSummary struct {
	Selected         int     // experts selected at least once
	Min, Median, Max float64 // over the selected experts
	Lowest           []int   // the least salient selected experts, up to n
}

// Summary returns layer's distribution and its n least salient selected
// experts.
func (r *Report) Summary(layer, n int) (LayerSummary, error) {
	var sc []float64
	var ls LayerSummary
	for _, e := range r.Ranking(layer) {
		s, ok := r.Saliency(layer, e)
		if !ok {
			continue
		}
		sc = append(sc, s)
		if len(ls.Lowest) < n {
			ls.Lowest = append(ls.Lowest, e)
		}
	}
	if len(sc) == 0 {
		return ls, ErrNoScores
	}
	ls.Selected = len(sc)
	ls.Min, ls.Max = sc[0], sc[len(sc)-1]
	if len(sc)%2 == 1 {
		ls.Median = sc[len(sc)/2]
	} else {
		ls.Median = (sc[len(sc)/2-1] + sc[len(sc)/2]) / 2
	}
	return ls, nil
}
