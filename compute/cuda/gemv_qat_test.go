package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"moxie/compute"
	"moxie/compute/ref"
	"moxie/qat"
)

// qatGemvAccBits is how close TestGemvQAT asks the qat products to be: each
// row within 2^-qatGemvAccBits of Σ|w·q(x)| over the row. The E4M3 codes
// multiply exactly on the f16 tensor cores and every sum is float32; a
// misplaced operand or scale is off by the order of the sum itself.
const qatGemvAccBits = 18

// qatInput is x for the qat products: 128-column blocks of normal values at
// scales from 1e-2 to 1e2, one block all zero, one block under act_quant's
// floor (1e-4), and a few values far above their block's others.
func qatInput(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for lo := 0; lo < n; lo += 128 {
		s := math.Pow(10, float64(rng.IntN(5)-2))
		switch (lo / 128) % 7 {
		case 2:
			s = 0
		case 3:
			s = 1e-6
		}
		for i := lo; i < min(lo+128, n); i++ {
			x[i] = float32(rng.NormFloat64() * s)
		}
		if (lo/128)%7 == 5 {
			x[lo] *= 300
		}
	}
	return x
}

// TestGemvQAT checks the qat target's one-token products (GemvVariant QAT:
// act_quant inside the launch, the codes on the tensor cores) at V4-Flash's FP8
// shapes and small ones (one span, spans straddling 128-column blocks
// between warps, row groups, tiles past the grid) against float64 sums of
// the weights' values times qat.ActQuant(x) (package qat: act_quant checked
// against its own float64 grid), within qatGemvAccBits of Σ|w·q(x)| a row;
// that two runs give the same bits; and the refusals (a normalized x, the
// CUDA-core kernels, a chunk of one span).
func TestGemvQAT(t *testing.T) {
	sets := []gemvSet{
		{"wo_b_fp8_4096x8192", []gemvShape{{compute.FP8Block, 4096, 8192, 1}}},
		{"wo_a_fp8_8192x4096_g8", []gemvShape{{compute.FP8Block, 8192, 4096, 8}}},
		{"wq_a+wkv_fp8", []gemvShape{{compute.FP8Block, 1024, 4096, 1}, {compute.FP8Block, 512, 4096, 1}}},
		{"wq_b+idx_wq_b_fp8", []gemvShape{{compute.FP8Block, 32768, 1024, 1}, {compute.FP8Block, 8192, 1024, 1}}},
		{"one span; three spans in groups", []gemvShape{{compute.FP8Block, 16, 64, 1}, {compute.FP8Block, 96, 192, 3}}},
		{"tiles past the grid", []gemvShape{{compute.FP8Block, 48, 1024, 1}, {compute.FP8Block, 16, 512, 1}, {compute.FP8Block, 96, 8192, 3}}},
	}
	withFwd(t, func(e *fwdEnv) {
		for si, set := range sets {
			rng := rand.New(rand.NewPCG(uint64(si), 41))
			var ps []GemvProj
			var wants, mags [][]float64
			for _, m := range set.ms {
				d := randomWeightPar(rng.Uint64(), m.f, m.rows, m.cols, 0.05)
				w, err := e.c.UploadWeight(e.a, d)
				if err != nil {
					t.Fatal(err)
				}
				x := qatInput(rng, m.groups*m.cols)
				xq := qat.ActQuantCopy(x, m.cols)
				W := ref.ParallelDequant(d)
				want, mag := make([]float64, m.rows), make([]float64, m.rows)
				rpg := m.rows / m.groups
				for r := range m.rows {
					xr := xq[(r/rpg)*m.cols:][:m.cols]
					for c, v := range W[r*m.cols : (r+1)*m.cols] {
						want[r] += v * float64(xr[c])
						mag[r] += math.Abs(v * float64(xr[c]))
					}
				}
				ps = append(ps, GemvProj{W: w, Y: e.poisoned(m.rows), X: e.up(x), Groups: m.groups})
				wants, mags = append(wants, want), append(mags, mag)
			}
			for _, u := range []int{2, 4} {
				v := GemvVariant{U: u, MMA: true, QAT: true}
				g, err := e.c.PrepareGemv(ps, v)
				if err != nil {
					t.Fatalf("%s, %+v: %v", set.name, v, err)
				}
				gemvTwice(e, g, ps, fmt.Sprintf("%s, %+v", set.name, v), func(i int, got []float32) {
					p := ps[i]
					worst, at := 0.0, -1
					for r, y := range got {
						q := math.Abs(float64(y)-wants[i][r]) / math.Max(mags[i][r], 1e-300)
						if !(q <= worst) {
							worst, at = q, r
						}
					}
					if !(worst <= math.Ldexp(1, -qatGemvAccBits)) {
						t.Errorf("%s, %+v, product %d [%d, %d]: row %d: got %g, want %g: error %.3g of Σ|w·q(x)| %.3g, above 2^-%d",
							set.name, v, i, p.W.Rows, p.W.Cols, at, got[at], wants[i][at], worst, mags[i][at], qatGemvAccBits)
					} else {
						t.Logf("%s, %+v, product %d: largest error %.3g of a row's Σ|w·q(x)| (2^%.1f)", set.name, v, i, worst, math.Log2(worst))
					}
				})
			}
		}
		// Refusals.
		d := randomWeightPar(1, compute.FP8Block, 64, 512, 0.05)
		w, err := e.c.UploadWeight(e.a, d)
		if err != nil {
			t.Fatal(err)
		}
		p := GemvProj{W: w, Y: e.poisoned(64), X: e.up(make([]float32, 512))}
		pn := p
		pn.Norm, pn.Eps = e.up(make([]float32, 512)), 1e-6
		for _, tc := range []struct {
			name string
			p    GemvProj
			v    GemvVariant
			want string
		}{
			{"normalized x", pn, GemvVariant{U: 4, MMA: true, QAT: true}, "plain x"},
			{"CUDA-core kernels", p, GemvVariant{U: 4, QAT: true}, "MMA kernels only"},
			{"one span a chunk", p, GemvVariant{U: 1, MMA: true, QAT: true}, "want 2 or 4"},
		} {
			if _, err := e.c.PrepareGemv([]GemvProj{tc.p}, tc.v); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: error %v, want one saying %q", tc.name, err, tc.want)
			}
		}
	})
}
