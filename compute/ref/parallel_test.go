package ref_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"moxie/compute"
	"moxie/compute/computetest"
	"moxie/compute/ref"
)

// The parallel and sampled forms must give exactly the serial results.
func TestParallelMatchesSerial(t *testing.T) {
	for _, tc := range []struct {
		f                 compute.Format
		rows, cols, block int
		batch, groups     int
	}{
		{compute.FP8Block, 300, 256, 128, 5, 1},
		{compute.FP8Block, 100, 480, 96, 3, 1},
		{compute.FP8Block, 256, 128, 128, 4, 4},
		{compute.MXFP4, 129, 96, 0, 7, 1},
		{compute.MXFP8, 34, 64, 0, 2, 1},
		{compute.BF16, 33, 50, 0, 3, 1},
		{compute.F32, 1, 20, 0, 1, 1},
	} {
		t.Run(tc.f.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(tc.rows), uint64(tc.cols)))
			block := tc.block
			if block == 0 {
				block = 128
			}
			d := computetest.Quantize(tc.f, computetest.Normal(rng, tc.rows*tc.cols, 1), tc.rows, tc.cols, block)
			W := ref.Dequant(d)
			same(t, "ParallelDequant", ref.ParallelDequant(d), W)
			x := make([]float64, tc.batch*tc.groups*tc.cols)
			for i := range x {
				x[i] = rng.NormFloat64()
			}
			want := ref.GroupedLinear(W, tc.rows, tc.cols, x, tc.batch, tc.groups)
			same(t, "ParallelGroupedLinear", ref.ParallelGroupedLinear(W, tc.rows, tc.cols, x, tc.batch, tc.groups), want)
			if tc.groups == 1 {
				same(t, "ParallelLinear", ref.ParallelLinear(W, tc.rows, tc.cols, x, tc.batch), ref.Linear(W, tc.rows, tc.cols, x, tc.batch))
			}
			idx := []int{len(want) - 1, 0, 7 % len(want), len(want) / 2}
			at := ref.GroupedLinearAt(W, tc.rows, tc.cols, x, tc.batch, tc.groups, idx)
			for k, i := range idx {
				if math.Float64bits(at[k]) != math.Float64bits(want[i]) {
					t.Errorf("GroupedLinearAt output %d = %v, want %v", i, at[k], want[i])
				}
			}
		})
	}
}

func same(t *testing.T, what string, got, want []float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
			t.Fatalf("%s[%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}

func TestGroupedLinearAtRejectsIndex(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("an index past the output was accepted")
		}
	}()
	ref.GroupedLinearAt(make([]float64, 4), 2, 2, make([]float64, 2), 1, 1, []int{2})
}
