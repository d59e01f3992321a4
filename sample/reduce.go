package sample

import (
	"fmt"
	"math"
)

// ReduceSpec is what a backend that holds the logits (a GPU) may compute
// in place of the host for the next Sample call, so that only a Reduction
// crosses to the host instead of the whole vector.
type ReduceSpec struct {
	// OK is false when the sampler needs every logit: a repetition
	// penalty, or random sampling without top-k, top-p or min-p (the draw
	// may land on any id).
	OK bool
	// Greedy: only the argmax (and the NaN/+Inf check) is needed.
	Greedy bool
	// InvT is 1/temperature: e(id) = exp((l[id] - l[best])·InvT).
	InvT float64
	// Threshold: the candidates are the ids with e >= Threshold (and > 0).
	Threshold float64
}

// Reduction is a backend's reduction of one logits vector under a
// ReduceSpec: the first two passes of Sample.
type Reduction struct {
	// N is the vocabulary size (the logits' length).
	N int
	// Best is the argmax, the lowest id on ties; -1 when every logit is
	// -Inf.
	Best int
	// Bad is set when a logit is NaN or +Inf.
	Bad bool
	// Z is the sum of e over every id (unused when greedy).
	Z float64
	// Count is how many candidates there are and CandMass the sum of
	// their e (both also when not Complete).
	Count    int
	CandMass float64
	// IDs are the candidates' ids in ascending order and E their e, when
	// Complete (unused when greedy).
	IDs []int32
	E   []float64
	// Complete is false when there were more candidates than the backend
	// keeps: SampleReduced then asks for the logits.
	Complete bool
}

// Reduce returns the reduction the next Sample call may use (see
// SampleReduced). It depends only on the sampler's Params.
func (s *Sampler) Reduce() ReduceSpec {
	p := s.p
	if pen := p.RepetitionPenalty; pen > 0 && pen != 1 {
		return ReduceSpec{}
	}
	invT := 1 / p.Temperature
	if p.Temperature == 0 || math.IsInf(invT, 1) {
		return ReduceSpec{OK: true, Greedy: true}
	}
	if !(p.TopK > 0 || p.TopP > 0 && p.TopP < 1 || p.MinP > 0) {
		return ReduceSpec{}
	}
	return ReduceSpec{OK: true, InvT: invT, Threshold: firstThreshold(p)}
}

// firstThreshold is the e above which Sample first collects candidates:
// min-p's cut where it is set (no id below it is ever kept), else 1e-4.
func firstThreshold(p Params) float64 {
	if p.MinP > 0 {
		return p.MinP
	}
	return 1e-4
}

// SampleReduced is Sample over r, a backend's reduction under Reduce's
// spec. It returns full = true, having drawn nothing, when it needs the
// logits after all (r incomplete, or the kept set reaching below r's
// candidates): the caller then calls Sample with them. It errors as Sample
// does on NaN, +Inf or all-masked logits, and on a malformed r (ids out of
// range or not ascending, lengths that differ, e outside (0, 1]).
func (s *Sampler) SampleReduced(r *Reduction) (id int, full bool, err error) {
	spec := s.Reduce()
	switch {
	case !spec.OK:
		return 0, true, nil
	case r.N <= 0:
		return 0, false, ErrEmpty
	case r.Bad:
		return 0, false, ErrNaN
	case r.Best < 0:
		return 0, false, ErrAllMasked
	case r.Best >= r.N:
		return 0, false, fmt.Errorf("sample: reduction's argmax %d outside the vocabulary of %d", r.Best, r.N)
	case spec.Greedy:
		return r.Best, false, nil
	case !r.Complete:
		return 0, true, nil
	case len(r.IDs) != len(r.E):
		return 0, false, fmt.Errorf("sample: reduction has %d candidate ids and %d values", len(r.IDs), len(r.E))
	case !(r.Z >= 1) || math.IsInf(r.Z, 1):
		return 0, false, fmt.Errorf("sample: reduction's sum %v: want a finite value >= 1 (the argmax contributes 1)", r.Z)
	}
	n := r.N
	s.order = s.order[:0]
	var mass float64
	prev := int32(-1)
	for i, id := range r.IDs {
		x := r.E[i]
		if id <= prev || int(id) >= n {
			return 0, false, fmt.Errorf("sample: reduction's candidate %d has id %d: want ascending ids below %d", i, id, n)
		}
		if !(x > 0 && x <= 1) {
			return 0, false, fmt.Errorf("sample: reduction's candidate id %d has e %v: want a value in (0, 1]", id, x)
		}
		prev = id
		s.order = append(s.order, cand{int(id), x})
		mass += x
	}
	k, topP, truncate := s.cuts(n)
	if !truncate {
		return 0, true, nil // top-k over the whole vocabulary: no truncation
	}
	if !s.enough(k, n, len(s.order), topP, mass, r.Z) {
		return 0, true, nil // the kept set reaches below the candidates
	}
	return s.draw(s.order, k, n, topP, r.Z, r.Best), false, nil
}

// DeviceDraw is what a backend needs to make a step's draw itself when
// its candidates did not fit in a Reduction (Complete false): the same
// selection as Sample's over every candidate, then one draw in id order
// (the same distribution as Sample's; with the same U, not always the
// same token).
type DeviceDraw struct {
	// TopK keeps the TopK first ranked candidates (rank: larger e first,
	// the lower id on ties); 0 keeps them all.
	TopK int
	// TopP then keeps the fewest ranked first whose e sum to at least TopP
	// times the kept mass (the top-k set's, or Z without top-k); 0: off.
	TopP float64
	// Z is the row's sum of e.
	Z float64
	// U in [0, 1) is the draw: U times the kept mass, walked over the
	// kept ids in id order.
	U float64
}

// PrepareDeviceDraw returns the parameters of a backend's own draw from
// r, an incomplete reduction that SampleReduced asked the logits for,
// and consumes the step's one draw from the sampler's generator (the
// backend's drawn id is the step's token). ok is false, and nothing is
// drawn, when only the logits will do: r complete or flagged, no
// truncation, or the top-k set or the nucleus reaching below the
// candidates.
func (s *Sampler) PrepareDeviceDraw(r *Reduction) (d DeviceDraw, ok bool) {
	spec := s.Reduce()
	if !spec.OK || spec.Greedy || r.Complete || r.Bad || r.Best < 0 || r.N <= 0 || r.Count < 1 {
		return DeviceDraw{}, false
	}
	n := r.N
	k, topP, truncate := s.cuts(n)
	if !truncate || !s.enough(k, n, r.Count, topP, r.CandMass, r.Z) {
		return DeviceDraw{}, false // no truncation, or the kept set reaching below the candidates
	}
	d = DeviceDraw{Z: r.Z, U: s.rng.Float64()}
	if k < n {
		d.TopK = k
	}
	if topP {
		d.TopP = s.p.TopP
	}
	return d, true
}
