package dsv4

import (
	"slices"
	"testing"

	"moxie/checkpoint"
)

// recordingExperts wraps the source's experts, logging prefetches and fetches.
type recordingExperts struct {
	inner      Experts
	prefetched map[int][]int // layer -> experts announced
	fetched    map[int][]int // layer -> experts asked for
}

func (r *recordingExperts) Expert(layer, e int) (ExpertWeights, error) {
	r.fetched[layer] = append(r.fetched[layer], e)
	return r.inner.Expert(layer, e)
}

func (r *recordingExperts) Prefetch(layer int, experts []int) {
	r.prefetched[layer] = append(r.prefetched[layer], experts...)
}

type routeLog struct{ pos, layer, experts []int }

func (l *routeLog) RecordRoute(pos, layer int, experts []int, weights []float32) {
	for _, e := range experts {
		l.pos, l.layer, l.experts = append(l.pos, pos), append(l.layer, layer), append(l.experts, e)
	}
}

func TestHooksPrefetchCoversFetchesAndRoutesAreRecorded(t *testing.T) {
	src, err := checkpoint.Open("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	base, err := Load(src, Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recordingExperts{inner: base.experts, prefetched: map[int][]int{}, fetched: map[int][]int{}}
	routes := &routeLog{}
	m, err := Load(src, Options{Experts: rec, Routes: routes})
	if err != nil {
		t.Fatal(err)
	}
	tokens := []int{5, 77, 200, 9, 31, 140, 250}
	want, err := base.NewSession().Prefill(tokens)
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.NewSession().Prefill(tokens)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatal("hooks changed the logits")
	}
	c := m.Cfg
	for l := range c.NLayers {
		if len(rec.fetched[l]) == 0 {
			t.Fatalf("layer %d fetched no experts", l)
		}
		for _, e := range rec.fetched[l] {
			if !slices.Contains(rec.prefetched[l], e) {
				t.Fatalf("layer %d fetched expert %d without announcing it (announced %v)", l, e, rec.prefetched[l])
			}
		}
	}
	// One route per token, layer and selected expert; positions 0..T-1.
	if n := len(routes.experts); n != len(tokens)*c.NLayers*c.NActivatedExperts {
		t.Fatalf("%d route entries, want %d", n, len(tokens)*c.NLayers*c.NActivatedExperts)
	}
	// Hash layers route exactly by tid2eid.
	b := m.layers[0]
	K := c.NActivatedExperts
	for i, p := range routes.pos {
		if routes.layer[i] != 0 {
			continue
		}
		if !slices.Contains(b.tid2eid[tokens[p]*K:(tokens[p]+1)*K], routes.experts[i]) {
			t.Fatalf("hash layer routed token %d to %d, not in its tid2eid row", tokens[p], routes.experts[i])
		}
	}
}
