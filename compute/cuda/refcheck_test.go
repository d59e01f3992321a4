package cuda

import (
	"math"
	"math/rand/v2"
	"runtime"
	"sort"
	"sync"
	"testing"

	"moxie/compute"
	"moxie/compute/computetest"
	"moxie/compute/ref"
)

// The GPU tests' float64 references run on the test machine's CPUs while the
// device waits, so they are spread over the cores (compute/ref's Parallel
// forms, bit-identical to the serial ones) and, for the largest products,
// computed at sampled outputs only.

// fullCheckMACs is the largest product (batch·rows·cols multiply-adds)
// linRef.rel compares at every output (2^27: ~0.1 s on one core of the GPU
// machine per case and batch, computed once for all variants); larger ones
// are sampled.
const fullCheckMACs = 1 << 27

// sampledOutputs is how many outputs besides the first and last token's
// rows linRef.rel compares in a sampled check.
const sampledOutputs = 256

// linRef is one (grouped) linear's float64 inputs: W [rows, cols]
// dequantized, x [batch, groups·cols].
type linRef struct {
	W                  []float64
	rows, cols, groups int
	x                  []float64
	batch              int
	full               []float64 // the whole product, once computed
}

// newLinRef dequantizes d (on all CPUs) and widens x.
func newLinRef(d compute.WeightData, groups int, x []float32, batch int) *linRef {
	return &linRef{W: ref.ParallelDequant(d), rows: d.Rows, cols: d.Cols, groups: groups, x: f64s(x), batch: batch}
}

// rel returns computetest.MaxRel of y, the device's [batch, rows] output,
// against the float64 product: over every output when the product has at
// most fullCheckMACs multiply-adds; else every output must be finite (a
// NaN-poisoned or overflowed output fails wherever it is) and the max is
// over the outputs of the first and last token (every row) and
// sampledOutputs others drawn from a fixed seed. The full product is
// computed on the first call and kept for the next ones (the variants of a
// case).
func (l *linRef) rel(y []float32) float64 {
	n := l.batch * l.rows
	if len(y) != n {
		return math.Inf(1)
	}
	if l.batch*l.rows*l.cols <= fullCheckMACs {
		if l.full == nil {
			l.full = ref.ParallelGroupedLinear(l.W, l.rows, l.cols, l.x, l.batch, l.groups)
		}
		return computetest.MaxRel(y, l.full)
	}
	for _, v := range y {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return math.Inf(1)
		}
	}
	idx := sampleOutputs(l.batch, l.rows, uint64(l.rows)<<32|uint64(l.batch))
	got := make([]float32, len(idx))
	for k, i := range idx {
		got[k] = y[i]
	}
	return computetest.MaxRel(got, ref.GroupedLinearAt(l.W, l.rows, l.cols, l.x, l.batch, l.groups, idx))
}

// sampleOutputs returns sorted distinct flat indices b·rows + r: every row
// of tokens 0 and batch-1 and sampledOutputs others from a PCG seeded with
// seed.
func sampleOutputs(batch, rows int, seed uint64) []int {
	seen := map[int]bool{}
	for r := range rows {
		seen[r], seen[(batch-1)*rows+r] = true, true
	}
	rng := rand.New(rand.NewPCG(seed, 5))
	for k := 0; k < sampledOutputs && len(seen) < batch*rows; {
		if i := rng.IntN(batch * rows); !seen[i] {
			seen[i] = true
			k++
		}
	}
	idx := make([]int, 0, len(seen))
	for i := range seen {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	return idx
}

// multiData is one matrix of a multi-linear test set at one batch: its
// weight, input and reference.
type multiData struct {
	d   compute.WeightData
	x   []float32
	ref *linRef
}

// multiWeights is a multi-linear test set's weights (scale 0.05), made
// once for all its batches and variants.
type multiWeights struct {
	seed uint64
	ds   []compute.WeightData
	Ws   [][]float64
}

// newMultiWeights makes the weights of a set of shapes [rows, cols] from a
// PCG seeded (seed, 0) and dequantizes them.
func newMultiWeights(f compute.Format, shape [][2]int, seed uint64) multiWeights {
	rng := rand.New(rand.NewPCG(seed, 0))
	mw := multiWeights{seed: seed}
	for _, sh := range shape {
		d := computetest.RandomWeight(rng, f, sh[0], sh[1], 0.05)
		mw.ds, mw.Ws = append(mw.ds, d), append(mw.Ws, ref.ParallelDequant(d))
	}
	return mw
}

// data draws each matrix's input for batch tokens from a PCG seeded
// (seed, batch).
func (mw multiWeights) data(batch int) []multiData {
	rng := rand.New(rand.NewPCG(mw.seed, uint64(batch)))
	var out []multiData
	for i, d := range mw.ds {
		x := computetest.Normal(rng, batch*d.Cols, 1)
		out = append(out, multiData{d, x, &linRef{W: mw.Ws[i], rows: d.Rows, cols: d.Cols, groups: 1, x: f64s(x), batch: batch}})
	}
	return out
}

// poisonedLinear fills y's batch·w.Rows floats with NaN, runs variant v of
// the (grouped) linear y = W x on the compute stream and returns y.
func poisonedLinear(c *Ctx, w *DeviceWeight, y, x DevicePtr, batch, groups int, v LinearVariant) ([]float32, error) {
	n := batch * w.Rows
	if err := c.Memset(y, 0xff, 4*n, c.Stream()); err != nil {
		return nil, err
	}
	if err := c.LinearWith(w, y, x, batch, groups, v, c.Stream()); err != nil {
		return nil, err
	}
	out := make([]float32, n)
	if err := c.CopyFloatsFromDevice(out, y); err != nil {
		return nil, err
	}
	return out, nil
}

// randomWeightPar is computetest.RandomWeight (entries of standard
// deviation std, quantized with FP8 blocks of 128) made in bands of 128 rows
// on all CPUs, band i drawn from a PCG seeded (seed, i): for the V4-width
// weights whose serial generation would cost the test machine seconds.
func randomWeightPar(seed uint64, f compute.Format, rows, cols int, std float64) compute.WeightData {
	const band = 128
	nb := (rows + band - 1) / band
	parts := make([]compute.WeightData, nb)
	parallelFor(nb, func(b int) {
		rng := rand.New(rand.NewPCG(seed, uint64(b)))
		parts[b] = computetest.RandomWeight(rng, f, min(band, rows-b*band), cols, std)
	})
	d := compute.WeightData{Format: f, Rows: rows, Cols: cols, Block: parts[0].Block}
	for _, p := range parts {
		d.Data = append(d.Data, p.Data...)
		d.Scale = append(d.Scale, p.Scale...)
	}
	return d
}

// parallelFor calls f(i) for every i in [0, n), on GOMAXPROCS goroutines
// that take the next i as they finish, and returns when all calls have.
func parallelFor(n int, f func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

// logMaxErrs logs each key's max relative error, in key order.
func logMaxErrs(t *testing.T, maxErr map[string]float64) {
	keys := make([]string, 0, len(maxErr))
	for k := range maxErr {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("max relative error %-26s %.3g", k, maxErr[k])
	}
}
