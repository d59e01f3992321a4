package reap

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
)

func TestObserveExpert(t *testing.T) {
	s, err := New(2, 4)
	if err != nil {
		t.Fatal(err)
	}
	// Layer 1, expert 2: rows (3, 4) and (0, 0.5) at weights 0.5 and 0.25:
	// Σ‖out‖ = 5 + 0.5, Σg = 0.75, two slots.
	s.ObserveExpert(1, 2, []int{7, 9}, []float32{0.5, 0.25}, make([]float32, 4), []float32{3, 4, 0, 0.5})
	// Layer 1, expert 2 again (a later chunk): (6, 8) at weight 1.
	s.ObserveExpert(1, 2, []int{12}, []float32{1}, make([]float32, 2), []float32{6, 8})
	// Layer 0, expert 0: one row (1, 1, 1, 1) of width 4 (norm 2).
	s.ObserveExpert(0, 0, []int{3}, []float32{0.125}, make([]float32, 4), []float32{1, 1, 1, 1})
	// Ignored: a layer, an expert out of range, no rows, a ragged output.
	s.ObserveExpert(2, 0, []int{1}, []float32{1}, nil, []float32{1})
	s.ObserveExpert(0, 4, []int{1}, []float32{1}, nil, []float32{1})
	s.ObserveExpert(0, 1, nil, nil, nil, []float32{1})
	s.ObserveExpert(0, 1, []int{1, 2}, []float32{1, 1}, nil, []float32{1, 2, 3})
	cases := []struct {
		layer, expert int
		want          float64
		ok            bool
	}{
		{1, 2, (5 + 0.5 + 10) / 3, true},
		{0, 0, 2, true},
		{0, 1, 0, false},
		{1, 3, 0, false},
	}
	for _, c := range cases {
		got, ok := s.Score(c.layer, c.expert)
		if ok != c.ok || math.Abs(got-c.want) > 1e-12*math.Abs(c.want) {
			t.Errorf("Score(%d, %d) = %v, %v; want %v, %v", c.layer, c.expert, got, ok, c.want, c.ok)
		}
	}
	r := s.Report("m", "calib.txt", 10, 2)
	if got := r.Stats[1].GateSum[2]; got != 1.75 {
		t.Errorf("gate sum = %v, want 1.75", got)
	}
	if got := r.Stats[1].Count[2]; got != 3 {
		t.Errorf("count = %v, want 3", got)
	}
	if s, ok := r.Saliency(1, 2); !ok || math.Abs(s-15.5/3) > 1e-12 {
		t.Errorf("report saliency %v, %v; want %v", s, ok, 15.5/3)
	}
}

func TestNewRejects(t *testing.T) {
	for _, c := range [][2]int{{0, 4}, {4, 0}, {-1, 4}, {maxLayers + 1, 4}, {4, maxExperts + 1}} {
		if _, err := New(c[0], c[1]); err == nil || !strings.Contains(err.Error(), "layers") {
			t.Errorf("New(%d, %d): error %v, want one about the shape", c[0], c[1], err)
		}
	}
}

func TestRanking(t *testing.T) {
	r := &Report{Layers: 1, Experts: 5, TopK: 1, Version: ReportVersion, Stats: []LayerReport{{
		Count:    []int64{2, 0, 1, 4, 0},
		GNormSum: []float64{4, 0, 1, 8, 0}, // saliency 2, -, 1, 2, -
		GateSum:  []float64{1, 0, 1, 1, 0},
	}}}
	if got, want := r.Ranking(0), []int{1, 4, 2, 0, 3}; !reflect.DeepEqual(got, want) {
		t.Errorf("Ranking = %v, want %v (never selected first, then ascending, ties by id)", got, want)
	}
	if got, want := r.Unselected(0), []int{1, 4}; !reflect.DeepEqual(got, want) {
		t.Errorf("Unselected = %v, want %v", got, want)
	}
	ls, err := r.Summary(0, 2)
	if err != nil {
		t.Fatal(err)
	}
	if want := (LayerSummary{Selected: 3, Min: 1, Median: 2, Max: 2, Lowest: []int{2, 0}}); !reflect.DeepEqual(ls, want) {
		t.Errorf("Summary = %+v, want %+v", ls, want)
	}
	empty := &Report{Layers: 1, Experts: 2, TopK: 1, Version: ReportVersion, Stats: []LayerReport{{Count: []int64{0, 0}, GNormSum: []float64{0, 0}, GateSum: []float64{0, 0}}}}
	if _, err := empty.Summary(0, 1); err != ErrNoScores {
		t.Errorf("Summary of a layer never routed: %v, want ErrNoScores", err)
	}
}

func TestReportRoundTrip(t *testing.T) {
	s, _ := New(3, 8)
	for l := range 3 {
		for e := range 8 {
			if (l+e)%3 != 0 {
				s.ObserveExpert(l, e, []int{l, e}, []float32{0.25, 0.75}, make([]float32, 4), []float32{float32(l), 1, float32(e), 2})
			}
		}
	}
	want := s.Report("synth:tiny", "a.txt", 123, 2)
	path := filepath.Join(t.TempDir(), "sal.json")
	if err := want.Write(path); err != nil {
		t.Fatal(err)
	}
	got, err := ReadReportFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("read back %+v, want %+v", got, want)
	}
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
		t.Errorf("the directory holds %d entries after Write, want the report only", len(ents))
	}
	bad := *want
	bad.TopK = 0
	if err := bad.Write(filepath.Join(t.TempDir(), "bad.json")); err == nil {
		t.Error("Write of an invalid report succeeded")
	}
}

func TestReadReportRejects(t *testing.T) {
	good := func() map[string]any {
		return map[string]any{"model": "m", "tokens": 4, "layers": 1, "experts": 2, "top_k": 1, "version": ReportVersion,
			"stats": []any{map[string]any{"count": []any{1, 0}, "gnorm_sum": []any{2.5, 0}, "gate_sum": []any{0.5, 0}}}}
	}
	enc := func(m map[string]any) string {
		b, _ := json.Marshal(m)
		return string(b)
	}
	if _, err := ReadReport(strings.NewReader(enc(good()))); err != nil {
		t.Fatalf("a valid report: %v", err)
	}
	stat := func(f func(st map[string]any)) string {
		m := good()
		f(m["stats"].([]any)[0].(map[string]any))
		return enc(m)
	}
	top := func(k string, v any) string {
		m := good()
		m[k] = v
		return enc(m)
	}
	cases := []struct{ name, in, want string }{
		{"not json", "{", "not valid JSON"},
		{"version", top("version", 9), "version"},
		{"layers", top("layers", 0), "layers"},
		{"experts", top("experts", maxExperts+1), "experts"},
		{"top_k", top("top_k", 3), "top_k"},
		{"tokens", top("tokens", -1), "tokens"},
		{"stats count", top("layers", 2), "entries in stats"},
		{"short list", stat(func(st map[string]any) { st["count"] = []any{1} }), "entries"},
		{"negative count", stat(func(st map[string]any) { st["count"] = []any{-1, 0} }), "count[0]"},
		{"negative sum", stat(func(st map[string]any) { st["gnorm_sum"] = []any{-2, 0} }), "non-negative"},
		{"sum without count", stat(func(st map[string]any) { st["gate_sum"] = []any{0.5, 0.25} }), "never selected"},
		{"wrong type", stat(func(st map[string]any) { st["count"] = "x" }), "not valid JSON"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadReport(strings.NewReader(c.in))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("ReadReport: error %v, want one containing %q", err, c.want)
			}
		})
	}
	big := bytes.Repeat([]byte(" "), maxReportBytes+1)
	if _, err := ReadReport(bytes.NewReader(big)); err == nil || !strings.Contains(err.Error(), "over") {
		t.Errorf("an oversized report: %v", err)
	}
}

func TestObserveConcurrent(t *testing.T) {
	s, _ := New(1, 2)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				s.ObserveExpert(0, 1, []int{0}, []float32{1}, nil, []float32{0, 2})
			}
		})
	}
	wg.Wait()
	if got, ok := s.Score(0, 1); !ok || got != 2 {
		t.Errorf("Score = %v, %v; want 2, true", got, ok)
	}
	if r := s.Report("m", "", 0, 1); r.Stats[0].Count[1] != 800 {
		t.Errorf("count %d, want 800", r.Stats[0].Count[1])
	}
}

// FuzzReadReport: any input gives a report that passes validation and
// survives a round trip, or an error; never a panic.
func FuzzReadReport(f *testing.F) {
	s, _ := New(2, 3)
	s.ObserveExpert(0, 1, []int{0}, []float32{0.5}, nil, []float32{3, 4})
	b, _ := json.Marshal(s.Report("m", "t", 1, 2))
	f.Add(b)
	f.Add([]byte(`{"version":1,"layers":1,"experts":1,"top_k":1,"stats":[{"count":[0],"gnorm_sum":[0],"gate_sum":[0]}]}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		r, err := ReadReport(bytes.NewReader(in))
		if err != nil {
			return
		}
		for l := range r.Layers {
			rk := r.Ranking(l)
			if len(rk) != r.Experts {
				t.Fatalf("ranking of %d experts, want %d", len(rk), r.Experts)
			}
			_, _ = r.Summary(l, 3)
		}
		out, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ReadReport(bytes.NewReader(out)); err != nil {
			t.Fatalf("a report that passed validation fails after a round trip: %v", err)
		}
	})
}
