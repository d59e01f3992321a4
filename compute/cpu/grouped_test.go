package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"moxie/compute"
	"moxie/compute/computetest"
	"moxie/compute/ref"
)

// TestGroupedLinearSplit checks the batch-1 GroupedLinear split on shapes
// where the parallel chunks cross group boundaries and a group's rows are
// not a multiple of the split unit, against the float64 reference.
func TestGroupedLinearSplit(t *testing.T) {
	for _, tc := range []struct {
		f            compute.Format
		groups, rg   int
		cols, worker int
	}{
		{compute.FP8Block, 5, 320, 160, 2},
		{compute.FP8Block, 8, 128, 256, 3},
		{compute.FP8Block, 3, 700, 130, 4},
		{compute.MXFP4, 6, 200, 96, 2},
		{compute.BF16, 7, 150, 64, 3},
	} {
		t.Run(fmt.Sprintf("%s/g%d/rg%d/c%d/w%d", tc.f, tc.groups, tc.rg, tc.cols, tc.worker), func(t *testing.T) {
			b := New(tc.worker)
			defer b.Close()
			rng := rand.New(rand.NewPCG(uint64(tc.groups), uint64(tc.rg)))
			rows := tc.groups * tc.rg
			d := computetest.RandomWeight(rng, tc.f, rows, tc.cols, 0.05)
			w, err := b.Bind(d)
			if err != nil {
				t.Fatal(err)
			}
			x := computetest.Normal(rng, tc.groups*tc.cols, 1)
			y := make([]float32, rows)
			b.GroupedLinear(w, y, x, 1, tc.groups)
			xf := make([]float64, len(x))
			for i, v := range x {
				xf[i] = float64(v)
			}
			want := ref.GroupedLinear(ref.Dequant(d), rows, tc.cols, xf, 1, tc.groups)
			for i := range y {
				if d := math.Abs(float64(y[i]) - want[i]); !(d <= 2e-5*(1+math.Abs(want[i]))) {
					t.Fatalf("y[%d] (group %d) = %g, want %g", i, i/tc.rg, y[i], want[i])
				}
			}
		})
	}
}

// BenchmarkGroupedLinearWoA is the decode case of V4-Flash's grouped output
// projection wo_a (FP8, 8 groups of 1024x4096 rows), rotated over copies
// larger than the last-level cache; GB/s of stored weight bytes.
func BenchmarkGroupedLinearWoA(b *testing.B) {
	const groups, rg, cols = 8, 1024, 4096
	rows := groups * rg
	be := New(0)
	defer be.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	size := rows*cols + (rows/128)*(cols/128)
	var ws []compute.Weight
	for range max(2, (512<<20)/size) {
		d := compute.WeightData{Format: compute.FP8Block, Rows: rows, Cols: cols, Block: 128,
			Data: make([]byte, rows*cols), Scale: make([]byte, (rows/128)*(cols/128))}
		for i := range d.Data {
			d.Data[i] = byte(rng.Uint32()) &^ 0x78 // no NaN codes, modest values
		}
		for i := range d.Scale {
			d.Scale[i] = 120
		}
		w, err := be.Bind(d)
		if err != nil {
			b.Fatal(err)
		}
		ws = append(ws, w)
	}
	x := computetest.Normal(rng, groups*cols, 1)
	y := make([]float32, rows)
	b.SetBytes(int64(size))
	i := 0
	for b.Loop() {
		be.GroupedLinear(ws[i%len(ws)], y, x, 1, groups)
		i++
	}
}
