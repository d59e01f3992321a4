package cuda

import (
	"math"
	"math/rand/v2"
	"testing"

	"moxie/compute"
	"moxie/compute/computetest"
	"moxie/compute/ref"
)

// TestRandomWeightPar checks (no device needed) that the banded generator
// gives a valid weight whose rows are each band's own RandomWeight.
func TestRandomWeightPar(t *testing.T) {
	for _, f := range []compute.Format{compute.FP8Block, compute.MXFP4, compute.MXFP8, compute.BF16, compute.F32} {
		t.Run(f.String(), func(t *testing.T) {
			const rows, cols = 300, 256
			d := randomWeightPar(9, f, rows, cols, 0.05)
			if err := d.Validate(); err != nil {
				t.Fatal(err)
			}
			all := ref.Dequant(d)
			for b := range 3 {
				part := computetest.RandomWeight(rand.New(rand.NewPCG(9, uint64(b))), f, min(128, rows-b*128), cols, 0.05)
				want := ref.Dequant(part)
				got := all[b*128*cols : b*128*cols+len(want)]
				for i := range want {
					if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
						t.Fatalf("band %d element %d = %v, want %v", b, i, got[i], want[i])
					}
				}
			}
		})
	}
}

// TestLinRefSampled checks the sampled comparison (no device needed): it
// passes the exact values at the compared outputs, and sees an error in a
// compared row, a NaN anywhere and each of 50 single-output errors at
// sampled outputs.
func TestLinRefSampled(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	const rows, cols, batch = 512, 1024, 300 // 157M multiply-adds: sampled
	d := randomWeightPar(4, compute.FP8Block, rows, cols, 0.05)
	x := computetest.Normal(rng, batch*cols, 1)
	lr := newLinRef(d, 1, x, batch)
	if lr.batch*lr.rows*lr.cols <= fullCheckMACs {
		t.Fatal("case is not large enough to be sampled")
	}
	idx := sampleOutputs(batch, rows, uint64(rows)<<32|uint64(batch))
	if len(idx) != 2*rows+sampledOutputs {
		t.Fatalf("%d outputs sampled, want %d", len(idx), 2*rows+sampledOutputs)
	}
	at := ref.GroupedLinearAt(lr.W, rows, cols, lr.x, batch, 1, idx)
	y := make([]float32, batch*rows) // zero (finite) where not compared
	for k, i := range idx {
		y[i] = float32(at[k])
	}
	if e := lr.rel(y); !(e <= 1e-6) {
		t.Errorf("exact values: max relative error %.3g", e)
	}
	bad := append([]float32(nil), y...)
	bad[(batch-1)*rows+rows/2] += 1 // last token: always compared
	if e := lr.rel(bad); !(e > 1e-3) {
		t.Errorf("error in the last token's row not seen: %.3g", e)
	}
	nan := append([]float32(nil), y...)
	nan[batch*rows/2+7] = float32(math.NaN())
	if e := lr.rel(nan); !math.IsInf(e, 1) {
		t.Errorf("NaN output not seen: %.3g", e)
	}
	seen := 0
	for _, i := range idx[rows : rows+50] {
		b := append([]float32(nil), y...)
		b[i] += 1
		if lr.rel(b) > 1e-3 {
			seen++
		}
	}
	if seen != 50 {
		t.Errorf("%d of 50 errors at sampled outputs seen", seen)
	}
}
