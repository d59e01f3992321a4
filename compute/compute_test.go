package compute

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

func TestYaRNRangeFlash(t *testing.T) {
	// dsv4-flash.md §4.6: lo = 15, hi = 25 for θ=160000, factor 16, orig 65536, 64 rope dims.
	lo, hi := YaRNRange(160000, 64, YaRN{Factor: 16, OriginalSeqLen: 65536, BetaFast: 32, BetaSlow: 1})
	if lo != 15 || hi != 25 {
		t.Fatalf("YaRN range = [%d, %d], want [15, 25]", lo, hi)
	}
}

func TestRopeFreqs(t *testing.T) {
	y := &YaRN{Factor: 16, OriginalSeqLen: 65536, BetaFast: 32, BetaSlow: 1}
	f := RopeFreqs(160000, 64, y)
	p := RopeFreqs(10000, 64, nil)
	if len(f) != 32 || len(p) != 32 {
		t.Fatalf("len = %d, %d, want 32", len(f), len(p))
	}
	for i := range 32 {
		base := math.Pow(160000, -float64(2*i)/64)
		var want float64
		switch {
		case i <= 15:
			want = base // ramp 0: unchanged
		case i >= 25:
			want = base / 16 // ramp 1: divided by the factor
		default:
			r := float64(i-15) / 10
			want = base/16*r + base*(1-r)
		}
		if math.Abs(float64(f[i])-want) > 1e-6*want {
			t.Errorf("yarn freq[%d] = %g, want %g", i, f[i], want)
		}
		if w := math.Pow(10000, -float64(2*i)/64); math.Abs(float64(p[i])-w) > 1e-6*w {
			t.Errorf("plain freq[%d] = %g, want %g", i, p[i], w)
		}
	}
	// Factor 1 means no YaRN.
	if g := RopeFreqs(160000, 64, &YaRN{Factor: 1}); !slices.Equal(g, RopeFreqs(160000, 64, nil)) {
		t.Error("factor 1 changed the table")
	}
}

func TestTopK(t *testing.T) {
	nan := float32(math.NaN())
	cases := []struct {
		name   string
		scores []float32
		k      int
		want   []int
	}{
		{"basic", []float32{1, 5, 3, 4}, 2, []int{1, 3}},
		{"ties lower index first", []float32{0, 2, 0, 2, 0}, 3, []int{1, 3, 0}},
		{"all zero", []float32{0, 0, 0, 0, 0, 0}, 4, []int{0, 1, 2, 3}},
		{"k larger than n", []float32{1, 2}, 5, []int{1, 0}},
		{"k zero", []float32{1, 2}, 0, []int{}},
		{"nan last", []float32{nan, -1, nan, 3}, 3, []int{3, 1, 0}},
		{"negative", []float32{-3, -1, -2}, 2, []int{1, 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := TopK(nil, tc.scores, tc.k)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("TopK(%v, %d) = %v, want %v", tc.scores, tc.k, got, tc.want)
			}
		})
	}
	// Large random inputs (heap path) against a stable sort.
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 20 {
		n := 300 + trial*37
		s := make([]float32, n)
		for i := range s {
			s[i] = float32(rng.IntN(50)) // many ties
		}
		k := 100 + trial
		idx := make([]int, n)
		for i := range idx {
			idx[i] = i
		}
		sort.SliceStable(idx, func(a, b int) bool { return s[idx[a]] > s[idx[b]] })
		if got := TopK(nil, s, k); !slices.Equal(got, idx[:k]) {
			t.Fatalf("trial %d: TopK differs from stable sort", trial)
		}
	}
}

func TestWeightDataValidate(t *testing.T) {
	cases := []struct {
		name string
		w    WeightData
		ok   bool
	}{
		{"fp8 ok", WeightData{Format: FP8Block, Rows: 130, Cols: 10, Block: 128, Data: make([]byte, 1300), Scale: make([]byte, 2)}, true},
		{"fp8 scale", WeightData{Format: FP8Block, Rows: 130, Cols: 10, Block: 128, Data: make([]byte, 1300), Scale: make([]byte, 1)}, false},
		{"mxfp4 ok", WeightData{Format: MXFP4, Rows: 2, Cols: 64, Data: make([]byte, 64), Scale: make([]byte, 4)}, true},
		{"mxfp4 odd", WeightData{Format: MXFP4, Rows: 2, Cols: 63, Data: make([]byte, 63), Scale: make([]byte, 4)}, false},
		{"bf16 ok", WeightData{Format: BF16, Rows: 2, Cols: 3, Data: make([]byte, 12)}, true},
		{"bf16 short", WeightData{Format: BF16, Rows: 2, Cols: 3, Data: make([]byte, 11)}, false},
		{"f32 scale", WeightData{Format: F32, Rows: 1, Cols: 1, Data: make([]byte, 4), Scale: []byte{1}}, false},
		{"zero rows", WeightData{Format: F32, Rows: 0, Cols: 1}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.w.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}
