package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"moxie/compute/computetest"
	"moxie/compute/ref"
)

// attnPrefillTol bounds AttentionPrefill's error against the float64
// reference: max|got−want| / max|want| over each query's heads. The split-f16
// products carry about 22 significant bits, so the error is that of float32
// arithmetic, far inside computetest.TolAttention.
const attnPrefillTol = 5e-6

// attnCase is one AttentionPrefill test shape: T queries at positions
// p0 .. p0+T−1 over a window ring and, for "hca"/"csa", compressed entries.
type attnCase struct {
	name          string
	window, p0, T int
	heads, dim    int
	kind          string // "window", "hca", "csa"
	ratio, topk   int
	pad           bool    // csa: some selected entries are −1 (padding)
	qstd          float64 // query spread (sharper softmax when larger)
	infSink       bool    // head 0's sink is −∞
}

// attnData is a case's host inputs and the device launch parameters.
type attnData struct {
	q, keys, ent, sinks []float32
	idx                 []int
	idxStride           int
	p                   AttnParams
}

// attnDev uploads and downloads on the device thread, keeping the first
// error (t.Fatal must not run there).
type attnDev struct {
	c   *Ctx
	a   *Arena
	err error
}

func (u *attnDev) alloc(n int) DevicePtr {
	p, err := u.a.Alloc(max(n, 4))
	if err != nil && u.err == nil {
		u.err = err
	}
	return p
}

func (u *attnDev) up(x []float32) DevicePtr {
	p := u.alloc(4 * len(x))
	if err := u.c.CopyFloatsToDevice(p, x); err != nil && u.err == nil {
		u.err = err
	}
	return p
}

func (u *attnDev) upInts(x []int) DevicePtr {
	b := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(int32(v)))
	}
	p := u.alloc(len(b))
	if err := u.c.CopyToDevice(p, b); err != nil && u.err == nil {
		u.err = err
	}
	return p
}

// poison fills n floats at p with NaN.
func (u *attnDev) poison(p DevicePtr, n int) {
	if err := u.c.Memset(p, 0xff, 4*n, u.c.Stream()); err != nil && u.err == nil {
		u.err = err
	}
}

func (u *attnDev) down(p DevicePtr, n int) []float32 {
	out := make([]float32, n)
	if err := u.c.CopyFloatsFromDevice(out, p); err != nil && u.err == nil {
		u.err = err
	}
	return out
}

// attnSetup builds a case's inputs (every position's key, the ring holding
// the chunk's window, compressed entries, a top-k selection) and uploads
// them; the output buffer is poisoned with NaN.
func attnSetup(u *attnDev, tc attnCase, seed uint64) *attnData {
	rng := rand.New(rand.NewPCG(seed, 11))
	last := tc.p0 + tc.T - 1
	ringRows := tc.window + tc.T + 3
	keys := computetest.Normal(rng, (last+1)*tc.dim, 1)
	ring := make([]float32, ringRows*tc.dim)
	for p := max(0, tc.p0-tc.window+1); p <= last; p++ {
		copy(ring[(p%ringRows)*tc.dim:], keys[p*tc.dim:(p+1)*tc.dim])
	}
	nEnt := 0
	if tc.ratio > 0 {
		nEnt = (last + 1) / tc.ratio
	}
	d := &attnData{keys: keys, ent: computetest.Normal(rng, max(nEnt, 1)*tc.dim, 1),
		q: computetest.Normal(rng, tc.T*tc.heads*tc.dim, max(tc.qstd, 1)), sinks: computetest.Normal(rng, tc.heads, 1)}
	if tc.infSink {
		d.sinks[0] = float32(math.Inf(-1))
	}
	d.idxStride = max(tc.topk, 1) + 3 // a stride wider than k
	d.idx = make([]int, tc.T*d.idxStride)
	for qi := range tc.T {
		n := (tc.p0 + qi + 1) / max(tc.ratio, 1)
		perm := rng.Perm(max(n, 1))
		row := d.idx[qi*d.idxStride : (qi+1)*d.idxStride]
		for j := range row {
			row[j] = -7 // never read: past min(topk, n)
		}
		for j := 0; j < min(n, tc.topk); j++ {
			row[j] = perm[j]
			if tc.pad && j%5 == 3 {
				row[j] = -1
			}
		}
	}
	scale := 1 / math.Sqrt(float64(tc.dim))
	n := tc.T * tc.heads * tc.dim
	d.p = AttnParams{O: u.alloc(4 * n), Q: u.up(d.q), Ring: u.up(ring), Sinks: u.up(d.sinks),
		RingRows: ringRows, Window: tc.window, T: tc.T, Ratio: tc.ratio, IdxStride: d.idxStride, TopK: tc.topk,
		Heads: tc.heads, Dim: tc.dim, MaxKeys: tc.window + max(tc.topk, nEnt), Scale: float32(scale)}
	pos := make([]int, tc.T)
	for i := range pos {
		pos[i] = tc.p0 + i
	}
	d.p.Pos = u.upInts(pos)
	u.poison(d.p.O, n)
	if tc.kind != "window" {
		d.p.Comp = u.up(d.ent)
	}
	if tc.kind == "csa" {
		d.p.Idx = u.upInts(d.idx)
	}
	return d
}

// attnOnDevice makes case tc's data from seed in an arena of its own on the
// device (inside Do); release frees the arena.
func attnOnDevice(c *Ctx, tc attnCase, seed uint64) (fw *Fwd, u *attnDev, d *attnData, release func(), err error) {
	if fw, err = c.Fwd(); err != nil {
		return nil, nil, nil, nil, err
	}
	a, err := c.NewArena(attnArena(tc))
	if err != nil {
		return nil, nil, nil, nil, err
	}
	release = func() { c.ReleaseArena(a) }
	u = &attnDev{c: c, a: a}
	if d = attnSetup(u, tc, seed); u.err != nil {
		release()
		return nil, nil, nil, nil, u.err
	}
	return fw, u, d, release, nil
}

// attnArena is the device memory one case takes (inputs, one output).
func attnArena(tc attnCase) int {
	last := tc.p0 + tc.T - 1
	floats := 2*tc.T*tc.heads*tc.dim + (last+1+tc.window+tc.T+3)*tc.dim + tc.heads
	if tc.ratio > 0 {
		floats += (last + 1) / tc.ratio * tc.dim
	}
	return 4*floats + 4*tc.T*(tc.topk+5) + 1<<20
}

// attnFullQueries is the most queries attnRefErr checks every one of;
// longer chunks are checked at the first and last 16 queries and 32 drawn
// between (the float64 reference of a 512-query chunk at 64 heads of 512
// is tens of GFLOP).
const attnFullQueries = 64

// attnRefErr returns, for each of outs, the largest per-query error against
// ref.Attention (float64) over each query's key list gathered on the host
// from the spec (window positions, then all entries (HCA) or the selected
// non-negative ones (CSA)), over every query of chunks of at most
// attnFullQueries and sampled ones of longer chunks (whose every output must
// then be finite: +Inf otherwise); the queries are spread over the CPUs.
func attnRefErr(tc attnCase, d *attnData, outs ...[]float32) []float64 {
	queries := make([]int, tc.T)
	for qi := range queries {
		queries[qi] = qi
	}
	finite := make([]bool, len(outs))
	for k, got := range outs {
		finite[k] = true
		if tc.T > attnFullQueries {
			for _, v := range got {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					finite[k] = false
					break
				}
			}
		}
	}
	if tc.T > attnFullQueries {
		picked := map[int]bool{}
		for i := range 16 {
			picked[i], picked[tc.T-1-i] = true, true
		}
		rng := rand.New(rand.NewPCG(uint64(tc.T), uint64(tc.p0)))
		for len(picked) < min(tc.T, 64) {
			picked[rng.IntN(tc.T)] = true
		}
		queries = queries[:0]
		for qi := range tc.T {
			if picked[qi] {
				queries = append(queries, qi)
			}
		}
	}
	errs := make([][]float64, tc.T)
	parallelFor(len(queries), func(k int) {
		qi := queries[k]
		t0 := tc.p0 + qi
		var kv []float32
		for pp := max(0, t0-tc.window+1); pp <= t0; pp++ {
			kv = append(kv, d.keys[pp*tc.dim:(pp+1)*tc.dim]...)
		}
		switch tc.kind {
		case "hca":
			kv = append(kv, d.ent[:(t0+1)/tc.ratio*tc.dim]...)
		case "csa":
			for j := range min((t0+1)/tc.ratio, tc.topk) {
				if en := d.idx[qi*d.idxStride+j]; en >= 0 {
					kv = append(kv, d.ent[en*tc.dim:(en+1)*tc.dim]...)
				}
			}
		}
		hd := tc.heads * tc.dim
		want := ref.Attention(f64s(d.q[qi*hd:(qi+1)*hd]), f64s(kv), f64s(d.sinks), len(kv)/tc.dim, tc.heads, tc.dim, float64(d.p.Scale))
		for _, got := range outs {
			errs[qi] = append(errs[qi], computetest.MaxRel(got[qi*hd:(qi+1)*hd], want))
		}
	})
	worst := make([]float64, len(outs))
	for k, ok := range finite {
		if !ok {
			worst[k] = math.Inf(1)
		}
	}
	for _, e := range errs {
		for k, r := range e {
			if !(r <= worst[k]) {
				worst[k] = r // MaxRel's +Inf for a NaN mismatch propagates
			}
		}
	}
	return worst
}

// maxRelF32 is computetest.MaxRel against a float32 reference.
func maxRelF32(got, want []float32, heads, dim int) float64 {
	worst := 0.0
	for q := 0; q < len(got); q += heads * dim {
		if r := computetest.MaxRel(got[q:q+heads*dim], f64s(want[q:q+heads*dim])); !(r <= worst) {
			worst = r
		}
	}
	return worst
}

func TestAttentionPrefill(t *testing.T) {
	cases := []attnCase{
		{name: "window T=1 position 0", window: 128, p0: 0, T: 1, heads: 64, dim: 512, kind: "window"},
		{name: "window T=7 early positions", window: 128, p0: 3, T: 7, heads: 64, dim: 512, kind: "window"},
		{name: "window T=64 ring wraps", window: 128, p0: 1000, T: 64, heads: 64, dim: 512, kind: "window", infSink: true},
		{name: "window T=512", window: 128, p0: 4000, T: 512, heads: 64, dim: 512, kind: "window"},
		{name: "hca T=1", window: 128, p0: 700, T: 1, heads: 64, dim: 512, kind: "hca", ratio: 128},
		{name: "hca T=7 entry closes inside", window: 128, p0: 5*128 - 3, T: 7, heads: 64, dim: 512, kind: "hca", ratio: 128},
		{name: "hca T=64 many entries", window: 128, p0: 20000, T: 64, heads: 64, dim: 512, kind: "hca", ratio: 128, qstd: 3},
		{name: "hca T=512", window: 128, p0: 40000, T: 512, heads: 64, dim: 512, kind: "hca", ratio: 128},
		{name: "csa T=1 decode", window: 128, p0: 3000, T: 1, heads: 64, dim: 512, kind: "csa", ratio: 4, topk: 512},
		{name: "csa T=7 fewer entries than k", window: 128, p0: 100, T: 7, heads: 64, dim: 512, kind: "csa", ratio: 4, topk: 512},
		{name: "csa T=64 padding entries", window: 128, p0: 2500, T: 64, heads: 64, dim: 512, kind: "csa", ratio: 4, topk: 512, pad: true, infSink: true},
		{name: "csa T=64 k=37 sharp", window: 128, p0: 900, T: 64, heads: 64, dim: 512, kind: "csa", ratio: 4, topk: 37, qstd: 4},
		{name: "csa T=512", window: 128, p0: 2048, T: 512, heads: 64, dim: 512, kind: "csa", ratio: 4, topk: 512},
		{name: "csa T=512 padding entries", window: 128, p0: 1500, T: 512, heads: 64, dim: 512, kind: "csa", ratio: 4, topk: 512, pad: true},
		{name: "small heads dim 128 window 8", window: 8, p0: 5, T: 9, heads: 32, dim: 128, kind: "csa", ratio: 4, topk: 3},
		{name: "dim 256 hca", window: 16, p0: 60, T: 33, heads: 96, dim: 256, kind: "hca", ratio: 8},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dev := testDevice(t)
			n := tc.T * tc.heads * tc.dim
			var d *attnData
			gots := map[string][]float32{}
			olds := map[int][]float32{}
			err := dev.Do(func(c *Ctx) error {
				fw, u, dd, release, err := attnOnDevice(c, tc, uint64(i))
				if err != nil {
					return err
				}
				defer release()
				d = dd
				for _, v := range []string{attnLdsm, attnSplit} {
					u.poison(d.p.O, n)
					if err := fw.attentionPrefill(c, d.p, v, c.Stream()); err != nil {
						return err
					}
					gots[v] = u.down(d.p.O, n)
				}
				if tc.pad {
					return u.err // AttentionRing does not take padding entries
				}
				// The existing kernels on the same inputs.
				for _, g := range []int{1, 8} {
					p := d.p
					p.HeadsPerBlock = g
					if g > 1 && !GroupedAttentionFits(g, tc.heads, tc.dim) || g == 1 && 4*p.MaxKeys > maxStaticShared {
						continue
					}
					u.poison(p.O, n)
					if err := fw.AttentionRing(c, p, c.Stream()); err != nil {
						return err
					}
					olds[g] = u.down(p.O, n)
				}
				return u.err
			})
			if err != nil {
				t.Fatal(err)
			}
			variants := []string{attnLdsm, attnSplit}
			outs := [][]float32{gots[attnLdsm], gots[attnSplit]}
			var groups []int
			for _, g := range []int{1, 8} {
				if old, ok := olds[g]; ok {
					groups = append(groups, g)
					outs = append(outs, old)
				}
			}
			worst := attnRefErr(tc, d, outs...)
			rOld := map[int]float64{}
			for k, g := range groups {
				rOld[g] = worst[len(variants)+k]
				t.Logf("AttentionRing (%d heads per block): max relative error %.3g vs the float64 reference", g, rOld[g])
			}
			for k, v := range variants {
				got := gots[v]
				name := "AttentionPrefill"
				if v != attnLdsm {
					name += " (variant " + v + ")"
				}
				r := worst[k]
				t.Logf("%s: max relative error %.3g vs the float64 reference", name, r)
				if !(r <= attnPrefillTol) {
					t.Errorf("%s: max relative error %.3g vs the float64 reference > %.3g", name, r, attnPrefillTol)
				}
				for _, g := range groups {
					old := olds[g]
					rv := maxRelF32(got, old, tc.heads, tc.dim)
					t.Logf("%s vs AttentionRing (%d heads per block): %.3g", name, g, rv)
					if !(rv <= attnPrefillTol+rOld[g]) {
						t.Errorf("%s differs from AttentionRing (%d heads per block) by %.3g > %.3g", name, g, rv, attnPrefillTol+rOld[g])
					}
				}
			}
		})
	}
}

// Bad sizes are errors, not launches.
func TestAttentionPrefillBadParams(t *testing.T) {
	dev := testDevice(t)
	ok := AttnParams{O: 1, Q: 1, Ring: 1, Sinks: 1, Pos: 1, RingRows: 200, Window: 128, T: 8, Heads: 64, Dim: 512, Scale: 1}
	for _, bad := range []struct {
		name string
		edit func(p *AttnParams)
	}{
		{"nil q", func(p *AttnParams) { p.Q = 0 }},
		{"T 0", func(p *AttnParams) { p.T = 0 }},
		{"T 65536", func(p *AttnParams) { p.T, p.RingRows = 65536, 70000 }},
		{"window 0", func(p *AttnParams) { p.Window = 0 }},
		{"heads 48", func(p *AttnParams) { p.Heads = 48 }},
		{"dim 64", func(p *AttnParams) { p.Dim = 64 }},
		{"ring too small", func(p *AttnParams) { p.RingRows = 100 }},
		{"comp without ratio", func(p *AttnParams) { p.Comp = 1 }},
		{"idx stride < k", func(p *AttnParams) { p.Comp, p.Ratio, p.Idx, p.TopK, p.IdxStride = 1, 4, 1, 8, 4 }},
		{"idx with k 0", func(p *AttnParams) { p.Comp, p.Ratio, p.Idx, p.TopK, p.IdxStride = 1, 4, 1, 0, 4 }},
	} {
		t.Run(bad.name, func(t *testing.T) {
			p := ok
			bad.edit(&p)
			err := dev.Do(func(c *Ctx) error {
				fw, err := c.Fwd()
				if err != nil {
					return err
				}
				if fw.AttentionPrefill(c, p, c.Stream()) == nil {
					return fmt.Errorf("accepted %+v", p)
				}
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
}

func TestPrefillAttentionFits(t *testing.T) {
	for _, c := range []struct {
		heads, dim int
		want       bool
	}{
		{64, 512, true}, {32, 128, true}, {96, 256, true},
		{0, 512, false}, {48, 512, false}, {64, 64, false}, {64, 1024, false}, {64, 384, false},
	} {
		if got := PrefillAttentionFits(c.heads, c.dim); got != c.want {
			t.Errorf("PrefillAttentionFits(%d, %d) = %v, want %v", c.heads, c.dim, got, c.want)
		}
	}
}

// BenchmarkAttentionPrefill times a chunk of DeepSeek-V4-Flash attention
// (64 heads of 512) with AttentionPrefill, its "split" variant and
// AttentionRing's grouped kernel (8 heads per block): 512 queries
// window-only (128 keys each) and CSA (128 window + 512 selected entries),
// and CSA chunks of 64 and 16 queries (where AttentionPrefill's 2 blocks per
// query start to leave SMs idle). CUDA events around 10 back-to-back
// launches, median of 7; TFLOP/s counts 4·heads·dim flops per (query, key)
// pair (Q·Kᵀ and P·V), not the split's three products.
func BenchmarkAttentionPrefill(b *testing.B) {
	dev := testDevice(b)
	for _, tc := range []attnCase{
		{name: "window-128", window: 128, p0: 4096, T: 512, heads: 64, dim: 512, kind: "window"},
		{name: "csa-128+512", window: 128, p0: 4096, T: 512, heads: 64, dim: 512, kind: "csa", ratio: 4, topk: 512},
		{name: "csa-128+512-T64", window: 128, p0: 4096, T: 64, heads: 64, dim: 512, kind: "csa", ratio: 4, topk: 512},
		{name: "csa-128+512-T16", window: 128, p0: 4096, T: 16, heads: 64, dim: 512, kind: "csa", ratio: 4, topk: 512},
	} {
		pairs := 0
		for qi := range tc.T {
			t0 := tc.p0 + qi
			pairs += min(t0+1, tc.window)
			if tc.kind == "csa" {
				pairs += min((t0+1)/tc.ratio, tc.topk)
			}
		}
		flops := 4 * float64(pairs) * float64(tc.heads*tc.dim)
		for _, kern := range []string{"prefill", "prefill-split", "ring-g8"} {
			b.Run(tc.name+"/"+kern, func(b *testing.B) {
				err := dev.Do(func(c *Ctx) error {
					fw, _, d, release, err := attnOnDevice(c, tc, 1)
					if err != nil {
						return err
					}
					defer release()
					run := func() error { return fw.AttentionPrefill(c, d.p, c.Stream()) }
					switch kern {
					case "prefill-split":
						run = func() error { return fw.attentionPrefill(c, d.p, attnSplit, c.Stream()) }
					case "ring-g8":
						d.p.HeadsPerBlock = 8
						run = func() error { return fw.AttentionRing(c, d.p, c.Stream()) }
					}
					const launches = 10
					for range b.N {
						var us []float64
						for rep := range 8 {
							ms, err := deviceMS(c, c.Stream(), repeat(launches, run))
							if err != nil {
								return err
							}
							if rep > 0 { // the first repetition warms up
								us = append(us, 1000*ms/launches)
							}
						}
						slices.Sort(us)
						med := us[len(us)/2]
						b.ReportMetric(med, "us/op")
						b.ReportMetric(flops/med/1e6, "TFLOP/s")
					}
					return nil
				})
				if err != nil {
					b.Fatal(fmt.Errorf("%s/%s: %w", tc.name, kern, err))
				}
			})
		}
	}
}
