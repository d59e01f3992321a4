package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"moxie/compute"
	"moxie/compute/computetest"
	"moxie/compute/ref"
)

func TestIdxHeadsPerWarp(t *testing.T) {
	for _, tc := range []struct{ heads, dim, want int }{
		{1, 32, 0}, {8, 128, 0}, {9, 128, 1}, {16, 32, 1}, {17, 64, 2}, {32, 128, 2}, {33, 1, 3}, {64, 128, 3},
		{65, 128, -1}, {64, 129, -1}, {3, 500, -1},
	} {
		if got := idxHeadsPerWarp(tc.heads, tc.dim); got != tc.want {
			t.Errorf("idxHeadsPerWarp(%d, %d) = %d, want %d", tc.heads, tc.dim, got, tc.want)
		}
	}
}

// TestIdxDecIndexScores checks IdxDec.IndexScores against the float64
// reference and, bit for bit, against Fwd.IndexScores on the same inputs
// (every kernel variant: heads per warp 1..8 and the generic kernel), with
// rows past a query's count left unwritten.
func TestIdxDecIndexScores(t *testing.T) {
	withFwd(t, func(e *fwdEnv) {
		x, err := e.c.IdxDec()
		if err != nil {
			t.Fatal(err)
		}
		for i, tc := range []struct {
			name                             string
			p0, T, ratio, heads, dim, stride int
		}{
			{"fwd case 0", 0, 9, 4, 16, 32, 8},
			{"fwd case 1", 37, 5, 4, 16, 32, 12},
			{"fwd case 2", 500, 2, 4, 64, 128, 200},
			{"decode n=1", 4, 1, 4, 64, 128, 2048},
			{"decode n=17", 68, 1, 4, 64, 128, 2048},
			{"decode n=2048", 8191, 1, 4, 64, 128, 2048},
			{"decode n=2047 odd tile", 8190, 1, 4, 64, 128, 2048},
			{"heads 8 dim 100", 99, 3, 4, 8, 100, 40},
			{"heads 5 dim 128", 200, 2, 4, 5, 128, 64},
			{"heads 30 dim 64", 300, 2, 4, 30, 64, 100},
			{"generic heads 70", 120, 2, 4, 70, 64, 40},
			{"generic dim 160", 120, 2, 4, 8, 160, 40},
			{"stride caps the count", 999, 2, 4, 64, 128, 100},
		} {
			rng := rand.New(rand.NewPCG(uint64(i), 31))
			n := (tc.p0 + tc.T) / tc.ratio
			q := computetest.Normal(rng, tc.T*tc.heads*tc.dim, 1)
			w := computetest.Normal(rng, tc.T*tc.heads, 1)
			keys := computetest.Normal(rng, max(n, 1)*tc.dim, 1)
			dq, dw, dk, dp := e.up(q), e.up(w), e.up(keys), e.positions(tc.p0, tc.T)
			sc, old := e.poisoned(tc.T*tc.stride), e.poisoned(tc.T*tc.stride)
			if err := x.IndexScores(e.c, sc, dq, dw, dk, dp, tc.T, n, tc.ratio, tc.heads, tc.dim, tc.stride, e.c.Stream()); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if err := e.f.IndexScores(e.c, old, dq, dw, dk, dp, tc.T, n, tc.ratio, tc.heads, tc.dim, tc.stride, e.c.Stream()); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			got, want0 := e.down(sc, tc.T*tc.stride), e.down(old, tc.T*tc.stride)
			for qi := range tc.T {
				ni := min((tc.p0+qi+1)/tc.ratio, tc.stride)
				want := ref.IndexScores(f64s(q[qi*tc.heads*tc.dim:(qi+1)*tc.heads*tc.dim]), f64s(w[qi*tc.heads:(qi+1)*tc.heads]), f64s(keys), ni, tc.heads, tc.dim)
				row := got[qi*tc.stride : qi*tc.stride+ni]
				if r := computetest.MaxRel(row, want); !(r <= computetest.TolAttention) {
					t.Errorf("%s: query %d (%d entries): max relative error %.3g", tc.name, qi, ni, r)
				}
				for s := range ni {
					if a, b := math.Float32bits(row[s]), math.Float32bits(want0[qi*tc.stride+s]); a != b {
						t.Errorf("%s: query %d entry %d: %g (%#x), Fwd.IndexScores gives %g (%#x)", tc.name, qi, s, row[s], a, want0[qi*tc.stride+s], b)
						break
					}
				}
				for s := ni; s < tc.stride; s++ {
					if v := got[qi*tc.stride+s]; v == v {
						t.Errorf("%s: query %d: entry %d past the count %d was written (%g)", tc.name, qi, s, ni, v)
						break
					}
				}
			}
		}
		if err := x.IndexScores(e.c, 1, 1, 1, 1, 0, 9, 4, 4, 16, 32, 8, e.c.Stream()); err == nil {
			t.Error("a null position buffer was accepted")
		}
	})
}

// TestIdxDecIndexScoresPrep checks IdxDec.IndexScoresPrep on raw queries
// and weights against the chain it replaces (RowOps' RoPE of the queries
// and scaling of the weights, then IndexScores: the same float32 and
// float64 operations, so within 1e-6, bit-identity logged) and against
// float64 scores of queries rotated and weights scaled in float64, for
// every heads-per-warp variant, V4's 32 frequencies on heads of 128, odd
// frequency counts and none; the inputs must stay as they were.
func TestIdxDecIndexScoresPrep(t *testing.T) {
	withFwd(t, func(e *fwdEnv) {
		x, err := e.c.IdxDec()
		if err != nil {
			t.Fatal(err)
		}
		if err := e.c.LoadFuse(); err != nil {
			t.Fatal(err)
		}
		for i, tc := range []struct {
			name                                 string
			p0, T, ratio, heads, dim, stride, nf int
		}{
			{"decode v4", 8191, 1, 4, 64, 128, 2048, 32},
			{"decode v4 early", 68, 1, 4, 64, 128, 2048, 32},
			{"T3 heads 30 dim 64, 5 frequencies", 300, 3, 4, 30, 64, 100, 5},
			{"heads 8 dim 100, all rotated", 99, 2, 4, 8, 100, 40, 50},
			{"heads 5 dim 128, no rotation", 200, 2, 4, 5, 128, 64, 0},
		} {
			rng := rand.New(rand.NewPCG(uint64(i), 37))
			n := (tc.p0 + tc.T) / tc.ratio
			q := computetest.Normal(rng, tc.T*tc.heads*tc.dim, 1)
			w := computetest.Normal(rng, tc.T*tc.heads, 1)
			keys := computetest.Normal(rng, max(n, 1)*tc.dim, 1)
			const wscale = 0.0110485 // V4's 1/sqrt(128)/sqrt(64), rounded
			freq := ropeFreqs(max(tc.nf, 1))[:tc.nf]
			dfreq := DevicePtr(0)
			if tc.nf > 0 {
				dfreq = e.up(freq)
			}
			dq, dw, dk, dp := e.up(q), e.up(w), e.up(keys), e.positions(tc.p0, tc.T)
			s := e.c.Stream()
			// The chain, on prepared copies.
			cq, cw := e.up(q), e.up(w)
			ops := []RowOp{{Y: cw, X: cw, Rows: tc.T, Dim: tc.heads, Scale: true, A: wscale}}
			if tc.nf > 0 {
				ops = append(ops, RowOp{Y: cq, X: cq, Rows: tc.T * tc.heads, Dim: tc.dim, Heads: tc.heads, NFreq: tc.nf, Freq: dfreq, Pos: dp})
			}
			if err := e.c.RowOps(ops, s); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			chainSc, sc := e.poisoned(tc.T*tc.stride), e.poisoned(tc.T*tc.stride)
			if err := x.IndexScores(e.c, chainSc, cq, cw, dk, dp, tc.T, n, tc.ratio, tc.heads, tc.dim, tc.stride, s); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if err := x.IndexScoresPrep(e.c, sc, dq, dw, dk, dp, tc.T, n, tc.ratio, tc.heads, tc.dim, tc.stride, dfreq, tc.nf, wscale, s); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			got, chain := e.down(sc, tc.T*tc.stride), e.down(chainSc, tc.T*tc.stride)
			if !bitsEqual(e.down(dq, len(q)), q) || !bitsEqual(e.down(dw, len(w)), w) {
				t.Errorf("%s: the queries or weights were written", tc.name)
			}
			same := true
			for qi := range tc.T {
				ni := min((tc.p0+qi+1)/tc.ratio, tc.stride)
				row, crow := got[qi*tc.stride:qi*tc.stride+ni], chain[qi*tc.stride:qi*tc.stride+ni]
				same = same && bitsEqual(row, crow)
				if r := computetest.MaxRel(row, f64s(crow)); !(r <= 1e-6) {
					t.Errorf("%s: query %d: vs RowOps+IndexScores max rel. error %.3g", tc.name, qi, r)
				}
				qd := f64s(q[qi*tc.heads*tc.dim : (qi+1)*tc.heads*tc.dim])
				if tc.nf > 0 {
					ropeInvRef(qd, -(tc.p0 + qi), freq, tc.dim) // the forward rotation: the angle's sign flipped
				}
				wd := f64s(w[qi*tc.heads : (qi+1)*tc.heads])
				for h := range wd {
					wd[h] *= float64(float32(wscale))
				}
				want := ref.IndexScores(qd, wd, f64s(keys), ni, tc.heads, tc.dim)
				if r := computetest.MaxRel(row, want); !(r <= computetest.TolAttention) {
					t.Errorf("%s: query %d (%d entries): max relative error %.3g vs float64", tc.name, qi, ni, r)
				}
			}
			t.Logf("%s: bit-identical to the chain: %v", tc.name, same)
		}
		for _, bad := range []struct {
			heads, dim, nf int
			freq           DevicePtr
			want           string
		}{
			{70, 64, 4, 1, "70 heads of width 64"},
			{8, 160, 4, 1, "8 heads of width 160"},
			{8, 64, 33, 1, "33 frequencies"},
			{8, 64, 4, 0, "4 frequencies (table 0x0)"},
		} {
			err := x.IndexScoresPrep(e.c, 1, 1, 1, 1, 1, 1, 4, 4, bad.heads, bad.dim, 8, bad.freq, bad.nf, 1, e.c.Stream())
			if err == nil || !strings.Contains(err.Error(), bad.want) {
				t.Errorf("heads %d dim %d nf %d: error %v, want one containing %q", bad.heads, bad.dim, bad.nf, err, bad.want)
			}
		}
	})
}

// TestIdxDecTopKRows checks IdxDec.TopKRows against compute.TopK and
// against Fwd.TopKRows (the same indices in the same slots) at decode shapes
// around k and the whole-sort limit, with ties, specials and long rows.
func TestIdxDecTopKRows(t *testing.T) {
	nan, inf, negZero := float32(math.NaN()), float32(math.Inf(1)), float32(math.Copysign(0, -1))
	normal := func(rng *rand.Rand, i int) float32 { return float32(rng.NormFloat64()) }
	withFwd(t, func(e *fwdEnv) {
		x, err := e.c.IdxDec()
		if err != nil {
			t.Fatal(err)
		}
		for ci, tc := range []topKRowsCase{
			{"decode sizes around k", []int{1, 511, 512, 513, 2048}, 512, 1, normal},
			{"decode ratio 4", []int{2048, 700}, 512, 4, normal},
			{"whole-sort limit", []int{2047, 2048, 2049, 4096}, 512, 1, normal},
			{"k 2048", []int{2048, 2049, 5000}, 2048, 1, normal},
			{"random", []int{1000, 500, 11, 1}, 512, 1, normal},
			{"ties", []int{100, 37, 64, 3000}, 7, 1, func(rng *rand.Rand, i int) float32 { return float32(rng.IntN(4)) }},
			{"many ties at the cut", []int{2048, 6000}, 512, 1, func(rng *rand.Rand, i int) float32 { return float32(rng.IntN(3)) }},
			{"all equal", []int{300, 3000}, 16, 1, func(rng *rand.Rand, i int) float32 { return 0.5 }},
			{"specials", []int{64, 200, 2500}, 20, 1, func(rng *rand.Rand, i int) float32 {
				return []float32{nan, inf, -inf, 0, negZero, 1, -1, float32(rng.NormFloat64())}[rng.IntN(8)]
			}},
			{"mostly NaN", []int{600, 2600}, 512, 1, func(rng *rand.Rand, i int) float32 {
				if rng.IntN(10) < 9 {
					return nan
				}
				return float32(rng.NormFloat64())
			}},
			{"k above n and empty rows", []int{5, 0, 3}, 64, 1, normal},
			{"long", []int{20000}, 2048, 1, func(rng *rand.Rand, i int) float32 { return float32(rng.IntN(5000)) / 7 }},
			{"long distinct", []int{30000}, 512, 1, normal},
		} {
			T := len(tc.ns)
			sc, pos, stride := topKRowsInput(rand.New(rand.NewPCG(uint64(ci), 77)), tc.ns, tc.ratio, tc.gen)
			dsc, dpos := e.up(sc), e.upInts(pos)
			run := func(f func(idx DevicePtr) error) []int {
				idx, err := e.a.Alloc(4 * T * tc.topk)
				if err != nil {
					t.Fatal(err)
				}
				if err := e.c.Memset(idx, 0xff, 4*T*tc.topk, e.c.Stream()); err != nil {
					t.Fatal(err)
				}
				if err := f(idx); err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				b := make([]byte, 4*T*tc.topk)
				if err := e.c.CopyFromDevice(b, idx); err != nil {
					t.Fatal(err)
				}
				out := make([]int, T*tc.topk)
				for j := range out {
					out[j] = int(int32(binary.LittleEndian.Uint32(b[4*j:])))
				}
				return out
			}
			got := run(func(idx DevicePtr) error {
				return x.TopKRows(e.c, idx, dsc, dpos, T, tc.ratio, tc.topk, stride, e.c.Stream())
			})
			old := run(func(idx DevicePtr) error {
				return e.f.TopKRows(e.c, idx, dsc, dpos, T, tc.ratio, tc.topk, stride, e.c.Stream())
			})
			for i, n := range tc.ns {
				want := compute.TopK(nil, sc[i*stride:i*stride+n], min(tc.topk, n))
				row, orow := got[i*tc.topk:(i+1)*tc.topk], old[i*tc.topk:(i+1)*tc.topk]
				for j, w := range want {
					if row[j] != w {
						t.Errorf("%s: row %d (n %d, k %d): slot %d is %d, want %d (compute.TopK %v...)", tc.name, i, n, len(want), j, row[j], w, want[:min(len(want), 8)])
						break
					}
				}
				for j := range row {
					if row[j] != orow[j] {
						t.Errorf("%s: row %d: slot %d is %d, Fwd.TopKRows gives %d", tc.name, i, j, row[j], orow[j])
						break
					}
				}
				for j := len(want); j < tc.topk; j++ {
					if row[j] != -1 {
						t.Errorf("%s: row %d: slot %d past k = %d was written (%d)", tc.name, i, j, len(want), row[j])
						break
					}
				}
			}
		}
		if err := x.TopKRows(e.c, 1, 1, 1, 1, 1, IdxDecMaxTopK+1, 4096, e.c.Stream()); err == nil {
			t.Errorf("k = %d was accepted", IdxDecMaxTopK+1)
		}
		if err := x.TopKRows(e.c, 1, 1, 0, 1, 1, 4, 4096, e.c.Stream()); err == nil {
			t.Error("a null position buffer was accepted")
		}
	})
}

// TestIdxDecTopKSel checks idx_topk_sel (the default TopKRows kernel)
// against idx_topk (the same indices in the same slots) and compute.TopK at
// the long rows of decode (up to 65536 entries: keys cached in shared
// memory up to idxTopKCache, the rest read again), with many rows (the
// smaller cache), few distinct values, ties at the cut beyond the sort
// size, zeros, NaN and k from 1 to 2048.
func TestIdxDecTopKSel(t *testing.T) {
	if testing.Short() {
		t.Skip("long rows")
	}
	normal := func(rng *rand.Rand, i int) float32 { return float32(rng.NormFloat64()) }
	withFwd(t, func(e *fwdEnv) {
		x, err := e.c.IdxDec()
		if err != nil {
			t.Fatal(err)
		}
		for ci, tc := range []topKRowsCase{
			{"decode 8k..256k context", []int{2048}, 512, 4, normal},
			{"n 8192", []int{8192}, 512, 1, normal},
			{"n 32768", []int{32768}, 512, 1, normal},
			{"n 49153 past the cache", []int{49153}, 512, 1, normal},
			{"n 65536", []int{65536}, 512, 1, normal},
			{"rows of mixed length", []int{65536, 100, 0, 513, 40000, 2048}, 512, 1, normal},
			{"many rows", func() []int {
				ns := make([]int, 200)
				for i := range ns {
					ns[i] = 300 + 97*i
				}
				return ns
			}(), 512, 1, normal},
			{"k 1", []int{8192, 3}, 1, 1, normal},
			{"k 2048", []int{65536, 2100}, 2048, 1, normal},
			{"quantised", []int{65536, 8192}, 512, 1, func(rng *rand.Rand, i int) float32 { return float32(rng.IntN(5000)) / 7 }},
			{"ties past the sort size", []int{65536, 9000}, 512, 1, func(rng *rand.Rand, i int) float32 { return float32(rng.IntN(3)) }},
			{"mostly zero", []int{50000, 4000}, 512, 1, func(rng *rand.Rand, i int) float32 {
				if rng.IntN(10) < 8 {
					return 0
				}
				return float32(math.Abs(rng.NormFloat64()))
			}},
			{"narrow range", []int{65536}, 512, 1, func(rng *rand.Rand, i int) float32 { return 1 + float32(rng.Float64())*1e-6 }},
			{"NaN and inf", []int{30000}, 512, 1, func(rng *rand.Rand, i int) float32 {
				return []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), float32(rng.NormFloat64())}[rng.IntN(4)]
			}},
		} {
			T := len(tc.ns)
			sc, pos, stride := topKRowsInput(rand.New(rand.NewPCG(uint64(ci), 91)), tc.ns, tc.ratio, tc.gen)
			if tc.name == "decode 8k..256k context" {
				// Row length 65536 (a 256k-token context), 2048 entries live.
				stride = 65536
				sc = append(sc, make([]float32, stride-len(sc))...)
			}
			dsc, dpos := e.up(sc), e.upInts(pos)
			run := func(old bool) []int {
				idx := e.poisoned(T * tc.topk)
				if err := x.topKRows(e.c, old, idx, dsc, dpos, T, tc.ratio, tc.topk, stride, e.c.Stream()); err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				return e.downInts(idx, T*tc.topk)
			}
			got, old := run(false), run(true)
			for i, n := range tc.ns {
				want := compute.TopK(nil, sc[i*stride:i*stride+n], min(tc.topk, n))
				row, orow := got[i*tc.topk:(i+1)*tc.topk], old[i*tc.topk:(i+1)*tc.topk]
				for j := range row {
					if row[j] != orow[j] {
						t.Errorf("%s: row %d (n %d): slot %d is %d, idx_topk gives %d", tc.name, i, n, j, row[j], orow[j])
						break
					}
				}
				for j, w := range want {
					if row[j] != w {
						t.Errorf("%s: row %d (n %d): slot %d is %d, compute.TopK gives %d", tc.name, i, n, j, row[j], w)
						break
					}
				}
				for j := len(want); j < tc.topk; j++ {
					if row[j] != -1 {
						t.Errorf("%s: row %d: slot %d past k = %d was written (%d)", tc.name, i, j, len(want), row[j])
						break
					}
				}
			}
		}
	})
}

// BenchmarkIdxTopK times the indexer's top 512 of one query row of n
// normal scores (row length 65536) captured in a CUDA graph, idx_topk
// ("old") against idx_topk_sel ("sel"), reporting device microseconds per
// row; "quant" rows hold 5000 distinct values (more ties near the cut).
func BenchmarkIdxTopK(b *testing.B) {
	dev := testDevice(b)
	const k, stride = 512, 65536
	for _, gen := range []string{"normal", "quant"} {
		for _, n := range []int{2048, 8192, 32768, 65536} {
			for _, old := range []bool{true, false} {
				name := "sel"
				if old {
					name = "old"
				}
				b.Run(fmt.Sprintf("%s/n%d/%s", gen, n, name), func(b *testing.B) {
					var us float64
					err := dev.Do(func(c *Ctx) error {
						d := &devBufs{c: c}
						defer d.free()
						x, err := c.IdxDec()
						if err != nil {
							return err
						}
						rng := rand.New(rand.NewPCG(uint64(n), 3))
						sc := make([]float32, stride)
						for i := range n {
							if gen == "quant" {
								sc[i] = float32(rng.IntN(5000)) / 7
							} else {
								sc[i] = float32(rng.NormFloat64())
							}
						}
						dsc, dpos, idx := d.floats(sc), d.int32s([]int32{int32(n - 1)}), d.alloc(4*k)
						d.synced()
						if d.err != nil {
							return d.err
						}
						us, err = graphTime(b, c, fuseGraphCalls, func() error {
							return x.topKRows(c, old, idx, dsc, dpos, 1, 1, k, stride, c.Stream())
						})
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(us, "device-us/op")
				})
			}
		}
	}
}
