package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"unsafe"

	"moxie/compute"
	"moxie/compute/computetest"
	"moxie/compute/ref"
)

// topKRowsCase is a TopKRows test case: a row per entry of ns (ns[i]
// entries drawn by gen), the k largest of each (positions of compression
// ratio ratio).
type topKRowsCase struct {
	name  string
	ns    []int // entries per row
	topk  int
	ratio int
	gen   func(rng *rand.Rand, i int) float32
}

// topKRowsInput lays out one score row per entry of ns (ns[i] entries drawn
// by gen, then 1e30 up to the stride, which must never be selected) and
// positions making (pos+1)/ratio = ns[i] entries (0 entries: pos -1).
func topKRowsInput(rng *rand.Rand, ns []int, ratio int, gen func(rng *rand.Rand, i int) float32) (sc []float32, pos []int, stride int) {
	stride = 1
	for _, n := range ns {
		stride = max(stride, n)
	}
	sc = make([]float32, len(ns)*stride)
	pos = make([]int, len(ns))
	for i, n := range ns {
		for j := range n {
			sc[i*stride+j] = gen(rng, j)
		}
		for j := n; j < stride; j++ {
			sc[i*stride+j] = 1e30
		}
		pos[i] = n*ratio - 1
	}
	return sc, pos, stride
}

// fwdEnv gives a test an arena and helpers on the device thread.
type fwdEnv struct {
	t *testing.T
	c *Ctx
	a *Arena
	f *Fwd
}

func (e *fwdEnv) up(x []float32) DevicePtr {
	e.t.Helper()
	p, err := e.a.Alloc(4 * max(len(x), 1))
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.c.CopyFloatsToDevice(p, x); err != nil {
		e.t.Fatal(err)
	}
	return p
}

func (e *fwdEnv) upInts(x []int) DevicePtr {
	e.t.Helper()
	b := make([]byte, 4*max(len(x), 1))
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(int32(v)))
	}
	p, err := e.a.Alloc(len(b))
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.c.CopyToDevice(p, b); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// positions uploads the int32 positions p0 .. p0+T-1.
func (e *fwdEnv) positions(p0, T int) DevicePtr {
	pos := make([]int, T)
	for i := range pos {
		pos[i] = p0 + i
	}
	return e.upInts(pos)
}

// poisoned allocates n floats filled with NaN.
func (e *fwdEnv) poisoned(n int) DevicePtr {
	e.t.Helper()
	p, err := e.a.Alloc(4 * n)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.c.Memset(p, 0xff, 4*n, e.c.Stream()); err != nil {
		e.t.Fatal(err)
	}
	return p
}

func (e *fwdEnv) down(p DevicePtr, n int) []float32 {
	e.t.Helper()
	out := make([]float32, n)
	if err := e.c.CopyFloatsFromDevice(out, p); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// withFwd runs f on the device thread with a 256 MiB arena.
func withFwd(t *testing.T, f func(e *fwdEnv)) {
	dev := testDevice(t)
	err := dev.Do(func(c *Ctx) error {
		fw, err := c.Fwd()
		if err != nil {
			return err
		}
		a, err := c.NewArena(256 << 20)
		if err != nil {
			return err
		}
		defer c.ReleaseArena(a)
		f(&fwdEnv{t: t, c: c, a: a, f: fw})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestFwdAttentionRing(t *testing.T) {
	cases := []struct {
		name                 string
		window, ringRows, p0 int
		T, heads, dim        int
		kind                 string // "window", "hca", "csa"
		ratio, topk          int
	}{
		{"window early positions", 8, 12, 0, 5, 4, 48, "window", 0, 0},
		{"window ring wraps", 8, 13, 21, 6, 4, 48, "window", 0, 0},
		{"hca all entries", 8, 16, 30, 8, 3, 64, "hca", 8, 0},
		{"csa top-k", 8, 11, 17, 4, 4, 48, "csa", 4, 3},
		{"csa fewer entries than k", 8, 16, 2, 8, 2, 32, "csa", 4, 4},
		{"flash-like decode", 128, 129, 700, 1, 8, 512, "csa", 4, 64},
		{"flash-like prefill", 128, 128 + 3, 300, 3, 8, 512, "csa", 4, 64},
		{"hca many tiles", 128, 128 + 4, 2000, 4, 8, 64, "hca", 8, 0},
	}
	withFwd(t, func(e *fwdEnv) {
		for i, tc := range cases {
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			last := tc.p0 + tc.T - 1
			keys := computetest.Normal(rng, (last+1)*tc.dim, 1) // key of every position
			ring := make([]float32, tc.ringRows*tc.dim)
			for p := max(0, tc.p0-tc.window+1); p <= last; p++ {
				copy(ring[(p%tc.ringRows)*tc.dim:], keys[p*tc.dim:(p+1)*tc.dim])
			}
			nEnt := 0
			if tc.ratio > 0 {
				nEnt = (last + 1) / tc.ratio
			}
			ent := computetest.Normal(rng, max(nEnt, 1)*tc.dim, 1)
			q := computetest.Normal(rng, tc.T*tc.heads*tc.dim, 1)
			sinks := computetest.Normal(rng, tc.heads, 1)
			idxStride := max(tc.topk, 1)
			idx := make([]int, tc.T*idxStride)
			for qi := range tc.T {
				n := (tc.p0 + qi + 1) / max(tc.ratio, 1)
				perm := rng.Perm(max(n, 1))
				for j := 0; j < min(n, tc.topk); j++ {
					idx[qi*idxStride+j] = perm[j]
				}
			}
			scale := 1 / math.Sqrt(float64(tc.dim))
			p := AttnParams{O: e.poisoned(tc.T * tc.heads * tc.dim), Q: e.up(q), Ring: e.up(ring), Sinks: e.up(sinks),
				Pos: e.positions(tc.p0, tc.T), RingRows: tc.ringRows, Window: tc.window, T: tc.T, Ratio: tc.ratio, IdxStride: idxStride, TopK: tc.topk,
				Heads: tc.heads, Dim: tc.dim, MaxKeys: tc.window + max(tc.topk, nEnt), Scale: float32(scale)}
			if tc.kind != "window" {
				p.Comp = e.up(ent)
			}
			if tc.kind == "csa" {
				p.Idx = e.upInts(idx)
			}
			for _, g := range []int{1, 2, 4, 8} {
				if g > 1 && !GroupedAttentionFits(g, tc.heads, tc.dim) {
					continue
				}
				p.HeadsPerBlock = g
				name := fmt.Sprintf("%s, %d heads per block", tc.name, g)
				if err := e.c.Memset(p.O, 0xff, 4*tc.T*tc.heads*tc.dim, e.c.Stream()); err != nil {
					t.Fatal(err)
				}
				if err := e.f.AttentionRing(e.c, p, e.c.Stream()); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				got := e.down(p.O, tc.T*tc.heads*tc.dim)
				checkAttention(t, name, got, q, keys, ent, sinks, idx, idxStride, tc.p0, tc.T, tc.window, tc.heads, tc.dim, tc.kind, tc.ratio, tc.topk, scale)
			}
		}
		// Bad sizes are errors, not launches.
		if err := e.f.AttentionRing(e.c, AttnParams{O: 1, Q: 1, Ring: 1, Sinks: 1, Pos: 1, RingRows: 4, Window: 8, T: 1, Heads: 1, Dim: 8, MaxKeys: 8}, e.c.Stream()); err == nil {
			t.Error("a ring smaller than the window was accepted")
		}
		if err := e.f.AttentionRing(e.c, AttnParams{O: 1, Q: 1, Ring: 1, Sinks: 1, Pos: 1, RingRows: 8, Window: 8, T: 1, Heads: 1, Dim: 8, MaxKeys: 1 << 20}, e.c.Stream()); err == nil {
			t.Error("max keys beyond the shared memory was accepted")
		}
		if err := e.f.AttentionRing(e.c, AttnParams{O: 1, Q: 1, Ring: 1, Sinks: 1, Pos: 1, RingRows: 8, Window: 8, T: 1, Heads: 6, Dim: 8, MaxKeys: 8, HeadsPerBlock: 4}, e.c.Stream()); err == nil {
			t.Error("4 heads per block of 6 heads was accepted")
		}
	})
}

// checkAttention compares AttentionRing's output with ref.Attention over each
// query's key list, gathered on the host.
func checkAttention(t *testing.T, name string, got, q, keys, ent, sinks []float32, idx []int, idxStride, p0, T, window, heads, dim int, kind string, ratio, topk int, scale float64) {
	t.Helper()
	for qi := range T {
		t0 := p0 + qi
		var kv []float32
		for pp := max(0, t0-window+1); pp <= t0; pp++ {
			kv = append(kv, keys[pp*dim:(pp+1)*dim]...)
		}
		switch kind {
		case "hca":
			kv = append(kv, ent[:(t0+1)/ratio*dim]...)
		case "csa":
			n := min((t0+1)/ratio, topk)
			for j := range n {
				en := idx[qi*idxStride+j]
				kv = append(kv, ent[en*dim:(en+1)*dim]...)
			}
		}
		want := ref.Attention(f64s(q[qi*heads*dim:(qi+1)*heads*dim]), f64s(kv), f64s(sinks), len(kv)/dim, heads, dim, scale)
		if r := computetest.MaxRel(got[qi*heads*dim:(qi+1)*heads*dim], want); !(r <= computetest.TolAttention) {
			t.Errorf("%s: query %d (position %d, %d keys): max relative error %.3g > %.3g", name, qi, t0, len(kv)/dim, r, computetest.TolAttention)
		}
	}
}

func TestFwdCompressor(t *testing.T) {
	cases := []struct {
		name      string
		ratio, dw int
		overlap   bool
		ringRows  int
		p0, T     int
		nfreq     int
	}{
		{"hca ratio 8", 8, 48, false, 16 + 5, 0, 21, 8},
		{"hca across chunks with wrap", 8, 48, false, 16 + 7, 13, 7, 8},
		{"csa entry 0 and later", 4, 32, true, 8 + 9, 0, 9, 8},
		{"csa wrap", 4, 32, true, 8 + 6, 22, 6, 8},
		{"flash csa", 4, 512, true, 8 + 16, 40, 16, 32},
	}
	withFwd(t, func(e *fwdEnv) {
		for i, tc := range cases {
			rng := rand.New(rand.NewPCG(uint64(i), 11))
			width := tc.dw
			if tc.overlap {
				width = 2 * tc.dw
			}
			last := tc.p0 + tc.T - 1
			// Every position's κ and z (before ape); the ring gets the
			// positions before p0 directly, the chunk through CompStore.
			kvAll := computetest.Normal(rng, (last+1)*width, 1)
			zAll := computetest.Normal(rng, (last+1)*width, 1)
			ape := computetest.Normal(rng, tc.ratio*width, 0.5)
			ringKV := make([]float32, tc.ringRows*width)
			ringZ := make([]float32, tc.ringRows*width)
			for p := max(0, tc.p0-2*tc.ratio); p < tc.p0; p++ {
				for c := range width {
					ringKV[(p%tc.ringRows)*width+c] = kvAll[p*width+c]
					ringZ[(p%tc.ringRows)*width+c] = zAll[p*width+c] + ape[(p%tc.ratio)*width+c]
				}
			}
			norm := computetest.Normal(rng, tc.dw, 1)
			freq := compute.RopeFreqs(160000, 2*tc.nfreq, &compute.YaRN{Factor: 16, OriginalSeqLen: 64, BetaFast: 32, BetaSlow: 1})
			dRK, dRZ := e.up(ringKV), e.up(ringZ)
			e0, e1 := tc.p0/tc.ratio, (tc.p0+tc.T)/tc.ratio
			out := e.poisoned((e1 + 1) * tc.dw)
			pos := e.positions(tc.p0, tc.T)
			if err := e.f.CompStore(e.c, dRK, dRZ, e.up(kvAll[tc.p0*width:]), e.up(zAll[tc.p0*width:]), e.up(ape), pos, tc.T, tc.ratio, tc.ringRows, width, e.c.Stream()); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if err := e.f.CompClose(e.c, CompCloseParams{Out: out, RingKV: dRK, RingZ: dRZ, RingRows: tc.ringRows, Ratio: tc.ratio,
				Width: width, DW: tc.dw, Overlap: tc.overlap, Pos: pos, T: tc.T, Norm: e.up(norm), Eps: 1e-6,
				Freq: e.up(freq), NFreq: tc.nfreq}, e.c.Stream()); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			got := e.down(out, (e1+1)*tc.dw)
			if e1 == e0 {
				t.Fatalf("%s: no window closes", tc.name)
			}
			for en := e0; en < e1; en++ {
				want := compEntryRef(kvAll, zAll, ape, norm, freq, tc.ratio, tc.dw, tc.overlap, en)
				if r := computetest.MaxRel(got[en*tc.dw:(en+1)*tc.dw], want); !(r <= 2*computetest.TolElemwise) {
					t.Errorf("%s: entry %d: max relative error %.3g > %.3g", tc.name, en, r, 2*computetest.TolElemwise)
				}
			}
			// Rows outside [e0, e1) are untouched (NaN poison).
			for _, en := range []int{e1} {
				if v := got[en*tc.dw]; v == v {
					t.Errorf("%s: entry %d (not closed) was written: %g", tc.name, en, v)
				}
			}
		}
	})
}

// compEntryRef is compressed entry en in float64 (dsv4-flash.md §4.5): the
// softmax pool of the window's rows (kvAll, zAll: every position's rows of
// width floats before ape), RMSNorm with norm (eps 1e-6), RoPE at en·ratio.
func compEntryRef(kvAll, zAll, ape, norm, freq []float32, ratio, dw int, overlap bool, en int) []float64 {
	width := dw
	if overlap {
		width = 2 * dw
	}
	var kv, z []float64
	addRow := func(p, off int) {
		for c := range dw {
			kv = append(kv, float64(kvAll[p*width+off+c]))
			z = append(z, float64(zAll[p*width+off+c])+float64(ape[(p%ratio)*width+off+c]))
		}
	}
	if overlap && en > 0 {
		for r := range ratio {
			addRow((en-1)*ratio+r, 0)
		}
	}
	off := 0
	if overlap {
		off = dw
	}
	for r := range ratio {
		addRow(en*ratio+r, off)
	}
	want := ref.CompressPool(kv, z, len(kv)/dw, dw)
	want = ref.RMSNorm(want, f64s(norm), dw, 1e-6)
	return ref.RoPE(want, en*ratio, freq, dw, false)
}

// TestFwdCompStep runs one-token compressor steps (CompStep, one or two
// compressors a launch) from p0 through p0+n−1: every entry they close
// against the float64 reference, and the rings and entries bit for bit
// against CompStore then CompClose at T = 1 on copies of the same state.
func TestFwdCompStep(t *testing.T) {
	type comp struct {
		ratio, dw int
		overlap   bool
		ringRows  int
	}
	cases := []struct {
		name  string
		comps []comp
		p0, n int
		nfreq int
	}{
		{"csa from entry 0, with wrap", []comp{{4, 32, true, 9}}, 0, 14, 8},
		{"hca with wrap", []comp{{8, 48, false, 17}}, 5, 22, 8},
		{"csa and hca in one launch", []comp{{4, 32, true, 11}, {8, 48, false, 19}}, 3, 19, 8},
		{"flash csa and its indexer", []comp{{4, 512, true, 24}, {4, 128, true, 24}}, 40, 9, 32},
	}
	withFwd(t, func(e *fwdEnv) {
		for i, tc := range cases {
			rng := rand.New(rand.NewPCG(uint64(i), 23))
			freq := compute.RopeFreqs(160000, 2*tc.nfreq, &compute.YaRN{Factor: 16, OriginalSeqLen: 64, BetaFast: 32, BetaSlow: 1})
			dFreq := e.up(freq)
			last := tc.p0 + tc.n - 1
			type state struct {
				comp
				width                int
				kvAll, zAll, ape, nm []float32
				rk, rz, out          [2]DevicePtr // [0] CompStep's, [1] the chain's
				kv, z, dApe, dNorm   DevicePtr
				entries              int
			}
			st := make([]*state, len(tc.comps))
			for k, cp := range tc.comps {
				s := &state{comp: cp, width: cp.dw}
				if cp.overlap {
					s.width = 2 * cp.dw
				}
				s.kvAll = computetest.Normal(rng, (last+1)*s.width, 1)
				s.zAll = computetest.Normal(rng, (last+1)*s.width, 1)
				s.ape = computetest.Normal(rng, cp.ratio*s.width, 0.5)
				s.nm = computetest.Normal(rng, cp.dw, 1)
				ringKV := make([]float32, cp.ringRows*s.width)
				ringZ := make([]float32, cp.ringRows*s.width)
				for p := max(0, tc.p0-2*cp.ratio); p < tc.p0; p++ {
					for c := range s.width {
						ringKV[(p%cp.ringRows)*s.width+c] = s.kvAll[p*s.width+c]
						ringZ[(p%cp.ringRows)*s.width+c] = s.zAll[p*s.width+c] + s.ape[(p%cp.ratio)*s.width+c]
					}
				}
				s.entries = (last+1)/cp.ratio + 1
				for v := range 2 {
					s.rk[v], s.rz[v] = e.up(ringKV), e.up(ringZ)
					s.out[v] = e.poisoned(s.entries * cp.dw)
				}
				s.kv, s.z = e.poisoned(s.width), e.poisoned(s.width)
				s.dApe, s.dNorm = e.up(s.ape), e.up(s.nm)
				st[k] = s
			}
			for p := tc.p0; p <= last; p++ {
				pos := e.positions(p, 1)
				var jobs []CompJob
				for _, s := range st {
					if err := e.c.CopyFloatsToDevice(s.kv, s.kvAll[p*s.width:(p+1)*s.width]); err != nil {
						t.Fatal(err)
					}
					if err := e.c.CopyFloatsToDevice(s.z, s.zAll[p*s.width:(p+1)*s.width]); err != nil {
						t.Fatal(err)
					}
					jobs = append(jobs, CompJob{Out: s.out[0], RingKV: s.rk[0], RingZ: s.rz[0], KV: s.kv, Z: s.z, APE: s.dApe, Norm: s.dNorm,
						RingRows: s.ringRows, Ratio: s.ratio, Width: s.width, DW: s.dw, Overlap: s.overlap})
					if err := e.f.CompStore(e.c, s.rk[1], s.rz[1], s.kv, s.z, s.dApe, pos, 1, s.ratio, s.ringRows, s.width, e.c.Stream()); err != nil {
						t.Fatalf("%s: %v", tc.name, err)
					}
					if err := e.f.CompClose(e.c, CompCloseParams{Out: s.out[1], RingKV: s.rk[1], RingZ: s.rz[1], RingRows: s.ringRows, Ratio: s.ratio,
						Width: s.width, DW: s.dw, Overlap: s.overlap, Pos: pos, T: 1, Norm: s.dNorm, Eps: 1e-6, Freq: dFreq, NFreq: tc.nfreq}, e.c.Stream()); err != nil {
						t.Fatalf("%s: %v", tc.name, err)
					}
				}
				if err := e.f.CompStep(e.c, jobs, pos, dFreq, tc.nfreq, 1e-6, e.c.Stream()); err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
			}
			for k, s := range st {
				got := e.down(s.out[0], s.entries*s.dw)
				closed := 0
				for en := range s.entries {
					row := got[en*s.dw : (en+1)*s.dw]
					if (en+1)*s.ratio-1 < tc.p0 || (en+1)*s.ratio-1 > last { // not closed by these steps: untouched
						if v := row[0]; v == v {
							t.Errorf("%s: compressor %d: entry %d (not closed) was written: %g", tc.name, k, en, v)
						}
						continue
					}
					closed++
					want := compEntryRef(s.kvAll, s.zAll, s.ape, s.nm, freq, s.ratio, s.dw, s.overlap, en)
					if r := computetest.MaxRel(row, want); !(r <= 2*computetest.TolElemwise) {
						t.Errorf("%s: compressor %d: entry %d: max relative error %.3g > %.3g", tc.name, k, en, r, 2*computetest.TolElemwise)
					}
				}
				if closed == 0 {
					t.Errorf("%s: compressor %d: no entry closed", tc.name, k)
				}
				n := s.ringRows * s.width
				for _, c := range []struct {
					what string
					a, b DevicePtr
					n    int
				}{{"entries", s.out[0], s.out[1], s.entries * s.dw}, {"kv ring", s.rk[0], s.rk[1], n}, {"z ring", s.rz[0], s.rz[1], n}} {
					if !bitsEqual(e.down(c.a, c.n), e.down(c.b, c.n)) {
						t.Errorf("%s: compressor %d: %s differ from CompStore then CompClose", tc.name, k, c.what)
					}
				}
			}
		}
	})
}

// TestFwdCompStepArgs checks CompStep's argument checks (no launch) and
// the mirrored argument layout.
func TestFwdCompStepArgs(t *testing.T) {
	if a, b := unsafe.Sizeof(compJob{}), unsafe.Sizeof(compStepArgs{}); a != 80 || b != 192 {
		t.Fatalf("compJob %d bytes, compStepArgs %d: want 80 and 192 (struct CompJob, CompStepArgs in kernels/fwd.cu)", a, b)
	}
	ok := CompJob{Out: 256, RingKV: 512, RingZ: 768, KV: 1024, Z: 1280, APE: 1536, Norm: 1792, RingRows: 9, Ratio: 4, Width: 64, DW: 32, Overlap: true}
	f := &Fwd{}
	for _, tc := range []struct {
		name string
		edit func(j *CompJob)
		jobs int
		want string
	}{
		{"no jobs", nil, 0, "0 jobs"},
		{"three jobs", nil, 3, "3 jobs"},
		{"width not 2·dw with overlap", func(j *CompJob) { j.Width = 32 }, 1, "job 0: ratio 4, width 32"},
		{"width not a multiple of 4", func(j *CompJob) { j.Overlap, j.DW, j.Width = false, 30, 30 }, 1, "a multiple of 4"},
		{"ring too short", func(j *CompJob) { j.RingRows = 7 }, 1, "ring rows 7 for ratio 4"},
		{"kv misaligned", func(j *CompJob) { j.KV += 4 }, 1, "16-byte aligned"},
		{"no norm", func(j *CompJob) { j.Norm = 0 }, 1, "norm 0x0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := ok
			if tc.edit != nil {
				tc.edit(&j)
			}
			jobs := make([]CompJob, tc.jobs)
			for i := range jobs {
				jobs[i] = j
			}
			err := f.CompStep(nil, jobs, 2048, 4096, 8, 1e-6, Stream{})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "fwd_comp_step1") {
				t.Errorf("error %v, want one naming fwd_comp_step1 and %q", err, tc.want)
			}
		})
	}
}

func TestFwdIndexScores(t *testing.T) {
	withFwd(t, func(e *fwdEnv) {
		for i, tc := range []struct{ p0, T, ratio, heads, dim, stride int }{
			{0, 9, 4, 16, 32, 8}, {37, 5, 4, 16, 32, 12}, {500, 2, 4, 64, 128, 200},
		} {
			rng := rand.New(rand.NewPCG(uint64(i), 3))
			n := (tc.p0 + tc.T) / tc.ratio
			q := computetest.Normal(rng, tc.T*tc.heads*tc.dim, 1)
			w := computetest.Normal(rng, tc.T*tc.heads, 1)
			keys := computetest.Normal(rng, max(n, 1)*tc.dim, 1)
			sc := e.poisoned(tc.T * tc.stride)
			if err := e.f.IndexScores(e.c, sc, e.up(q), e.up(w), e.up(keys), e.positions(tc.p0, tc.T), tc.T, n, tc.ratio, tc.heads, tc.dim, tc.stride, e.c.Stream()); err != nil {
				t.Fatal(err)
			}
			got := e.down(sc, tc.T*tc.stride)
			for qi := range tc.T {
				ni := (tc.p0 + qi + 1) / tc.ratio
				want := ref.IndexScores(f64s(q[qi*tc.heads*tc.dim:(qi+1)*tc.heads*tc.dim]), f64s(w[qi*tc.heads:(qi+1)*tc.heads]), f64s(keys), ni, tc.heads, tc.dim)
				row := got[qi*tc.stride : qi*tc.stride+ni]
				if r := computetest.MaxRel(row, want); !(r <= computetest.TolAttention) {
					t.Errorf("case %d query %d (%d entries): max relative error %.3g", i, qi, ni, r)
				}
				for s := ni; s < tc.stride; s++ {
					if v := got[qi*tc.stride+s]; v == v {
						t.Errorf("case %d query %d: entry %d past the count %d was written (%g)", i, qi, s, ni, v)
						break
					}
				}
			}
		}
		if err := e.f.IndexScores(e.c, 1, 1, 1, 1, 0, 9, 4, 4, 16, 32, 8, e.c.Stream()); err == nil {
			t.Error("a null position buffer was accepted")
		}
	})
}

func TestFwdGathers(t *testing.T) {
	withFwd(t, func(e *fwdEnv) {
		rng := rand.New(rand.NewPCG(5, 5))
		const rowsN, width = 7, 33
		sel := []int{4, 0, 6}
		// GatherRows at widths of 4-float multiples (4 floats per access
		// where the rows are 16-byte aligned: src shifted by 0 floats) and
		// not (one at a time).
		for _, g := range []struct{ width, shift int }{{33, 0}, {36, 0}, {36, 1}, {4096, 0}, {4096, 2}} {
			src := computetest.Normal(rng, rowsN*g.width+g.shift, 1)
			dst := e.poisoned(len(sel) * g.width)
			if err := e.f.GatherRows(e.c, dst, e.up(src)+DevicePtr(4*g.shift), e.upInts(sel), len(sel), g.width, e.c.Stream()); err != nil {
				t.Fatal(err)
			}
			got := e.down(dst, len(sel)*g.width)
			for j, r := range sel {
				for c := range g.width {
					if want := src[g.shift+r*g.width+c]; got[j*g.width+c] != want {
						t.Fatalf("GatherRows width %d shift %d: row %d col %d = %g, want %g", g.width, g.shift, j, c, got[j*g.width+c], want)
					}
				}
			}
		}
		src := computetest.Normal(rng, rowsN*width, 1)
		var got []float32
		base := computetest.Normal(rng, rowsN*width, 1)
		dBase := e.up(base)
		if err := e.f.ScatterAdd(e.c, dBase, e.up(src[:len(sel)*width]), e.upInts(sel), len(sel), width, e.c.Stream()); err != nil {
			t.Fatal(err)
		}
		got = e.down(dBase, rowsN*width)
		want := append([]float32(nil), base...)
		for j, r := range sel {
			for c := range width {
				want[r*width+c] += src[j*width+c]
			}
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("ScatterAdd: element %d = %g, want %g", i, got[i], want[i])
			}
		}
		out := computetest.Normal(rng, width, 1)
		dOut := e.up(out)
		if err := e.f.AddRows(e.c, dOut, e.up(src[:3*width]), 3, width, e.c.Stream()); err != nil {
			t.Fatal(err)
		}
		got = e.down(dOut, width)
		for c := range width {
			w := out[c] + src[c] + src[width+c] + src[2*width+c]
			if math.Abs(float64(got[c]-w)) > 1e-6*math.Max(1, math.Abs(float64(w))) {
				t.Fatalf("AddRows: %d = %g, want %g", c, got[c], w)
			}
		}
		table := []int{5, 1, 7, 2, 0, 3} // 3 tokens × 2
		toks := []int{2, 0, 2, 1}
		ids, err := e.a.Alloc(4 * len(toks) * 2)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.f.GatherI32(e.c, ids, e.upInts(table), e.upInts(toks), len(toks), 2, e.c.Stream()); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 4*len(toks)*2)
		if err := e.c.CopyFromDevice(b, ids); err != nil {
			t.Fatal(err)
		}
		for i, tk := range toks {
			for k := range 2 {
				if g := int(int32(binary.LittleEndian.Uint32(b[4*(2*i+k):]))); g != table[2*tk+k] {
					t.Fatalf("GatherI32: [%d, %d] = %d, want %d", i, k, g, table[2*tk+k])
				}
			}
		}
	})
}

// TestFwdExperts selects experts on the device (ids in device memory) and
// checks every selected expert's w1, w3 and w2 products against the float64
// reference of that expert's weights.
func TestFwdExperts(t *testing.T) {
	for _, f := range []compute.Format{compute.MXFP4, compute.FP8Block} {
		t.Run(f.String(), func(t *testing.T) {
			withFwd(t, func(e *fwdEnv) {
				const E, K, inter, dim = 5, 3, 64, 256
				rng := rand.New(rand.NewPCG(9, uint64(f)))
				var w1, w3, w2 []*DeviceWeight
				var d1, d3, d2 []compute.WeightData
				for range E {
					a := computetest.RandomWeight(rng, f, inter, dim, 0.05)
					b := computetest.RandomWeight(rng, f, inter, dim, 0.05)
					c := computetest.RandomWeight(rng, f, dim, inter, 0.05)
					for _, p := range []struct {
						d   compute.WeightData
						dst *[]*DeviceWeight
					}{{a, &w1}, {b, &w3}, {c, &w2}} {
						w, err := e.c.UploadWeight(e.a, p.d)
						if err != nil {
							t.Fatal(err)
						}
						*p.dst = append(*p.dst, w)
					}
					d1, d3, d2 = append(d1, a), append(d3, b), append(d2, c)
				}
				tab, err := e.c.PrepareExpertTable(e.a, w1, w3, w2)
				if err != nil {
					t.Fatal(err)
				}
				x := computetest.Normal(rng, dim, 1)
				h := computetest.Normal(rng, K*inter, 1)
				dx, dh := e.up(x), e.up(h)
				g, u, y := e.poisoned(K*inter), e.poisoned(K*inter), e.poisoned(K*dim)
				run, err := e.c.PrepareExpertRun(e.a, tab, K, dx, g, u, dh, y)
				if err != nil {
					t.Fatal(err)
				}
				for _, ids := range [][]int{{3, 0, 4}, {1, 1, 2}} {
					if err := e.f.RunExperts13(e.c, run, e.upInts(ids), e.c.Stream()); err != nil {
						t.Fatal(err)
					}
					if err := e.f.RunExperts2(e.c, run, e.c.Stream()); err != nil {
						t.Fatal(err)
					}
					gg, uu, yy := e.down(g, K*inter), e.down(u, K*inter), e.down(y, K*dim)
					for k, id := range ids {
						name := fmt.Sprintf("ids %v slot %d (expert %d)", ids, k, id)
						check := func(what string, got []float32, d compute.WeightData, rows, cols int, in []float32) {
							want := ref.Linear(ref.Dequant(d), rows, cols, f64s(in), 1)
							if r := computetest.MaxRel(got, want); !(r <= computetest.TolLinear) {
								t.Errorf("%s %s: max relative error %.3g", name, what, r)
							}
						}
						check("w1", gg[k*inter:(k+1)*inter], d1[id], inter, dim, x)
						check("w3", uu[k*inter:(k+1)*inter], d3[id], inter, dim, x)
						check("w2", yy[k*dim:(k+1)*dim], d2[id], dim, inter, h[k*inter:(k+1)*inter])
					}
				}
			})
		})
	}
}

// TestFwdLinArgsMirror checks that kernels/fwd.cu's LinArgs has the fields
// of kernels/linear.cu's, in order, and that the Go mirror is 80 bytes (the
// record size fwd_moe_args copies and dsv4 budgets for).
func TestFwdLinArgsMirror(t *testing.T) {
	fields := func(src, file string) string {
		m := regexp.MustCompile(`(?s)struct LinArgs \{(.*?)\};`).FindStringSubmatch(src)
		if m == nil {
			t.Fatalf("%s has no struct LinArgs", file)
		}
		body := regexp.MustCompile(`//[^\n]*`).ReplaceAllString(m[1], "")
		var names []string
		for _, decl := range strings.Split(body, ";") {
			decl = strings.TrimSpace(decl)
			if decl == "" {
				continue
			}
			// "const u8 *W" or "int rows, cols": keep the type and the names.
			decl = strings.Join(strings.Fields(strings.ReplaceAll(decl, "*", " * ")), " ")
			names = append(names, decl)
		}
		// Split "int a, b" into "int a", "int b".
		var out []string
		for _, d := range names {
			if i := strings.Index(d, ","); i >= 0 && strings.HasPrefix(d, "int ") {
				for _, n := range strings.Split(strings.TrimPrefix(d, "int "), ",") {
					out = append(out, "int "+strings.TrimSpace(n))
				}
				continue
			}
			out = append(out, d)
		}
		return strings.Join(out, "; ")
	}
	a, b := fields(LinearSource(), "linear.cu"), fields(fwdSrc, "fwd.cu")
	if a != b {
		t.Errorf("LinArgs differ:\nlinear.cu: %s\nfwd.cu:    %s", a, b)
	}
	if n := unsafe.Sizeof(linArgs{}); n != 80 {
		t.Errorf("linArgs is %d bytes, want 80", n)
	}
	// struct AttnArgs in fwd.cu: 7 pointers, 8 ints, a float (static_assert 96).
	if n, o := unsafe.Sizeof(attnArgs{}), unsafe.Offsetof(attnArgs{}.Scale); n != 96 || o != 88 {
		t.Errorf("attnArgs is %d bytes with Scale at %d, want 96 and 88", n, o)
	}
}

// TestFwdTopK checks the indexer top-k against compute.TopK (exact indices
// and order) on rows with ties, NaN, ±0, ±Inf, k above the row count, empty
// rows and long rows.
func TestFwdTopK(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	negZero := float32(math.Copysign(0, -1))
	withFwd(t, func(e *fwdEnv) {
		for ci, tc := range []topKRowsCase{
			{"random", []int{1000, 500, 11, 1}, 512, 1, func(rng *rand.Rand, i int) float32 { return float32(rng.NormFloat64()) }},
			{"ties", []int{100, 37, 64}, 7, 1, func(rng *rand.Rand, i int) float32 { return float32(rng.IntN(4)) }},
			{"all equal", []int{300}, 16, 1, func(rng *rand.Rand, i int) float32 { return 0.5 }},
			{"specials", []int{64, 200}, 20, 1, func(rng *rand.Rand, i int) float32 {
				return []float32{nan, inf, -inf, 0, negZero, 1, -1, float32(rng.NormFloat64())}[rng.IntN(8)]
			}},
			{"k above n and empty rows", []int{5, 0, 3}, 64, 1, func(rng *rand.Rand, i int) float32 { return float32(rng.NormFloat64()) }},
			{"ratio 4", []int{40, 3}, 4, 4, func(rng *rand.Rand, i int) float32 { return float32(rng.NormFloat64()) }},
			{"long", []int{20000}, 2048, 1, func(rng *rand.Rand, i int) float32 { return float32(rng.IntN(5000)) / 7 }},
		} {
			T := len(tc.ns)
			sc, pos, stride := topKRowsInput(rand.New(rand.NewPCG(uint64(ci), 99)), tc.ns, tc.ratio, tc.gen)
			idx, err := e.a.Alloc(4 * T * tc.topk)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.c.Memset(idx, 0xff, 4*T*tc.topk, e.c.Stream()); err != nil {
				t.Fatal(err)
			}
			if err := e.f.TopKRows(e.c, idx, e.up(sc), e.upInts(pos), T, tc.ratio, tc.topk, stride, e.c.Stream()); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			b := make([]byte, 4*T*tc.topk)
			if err := e.c.CopyFromDevice(b, idx); err != nil {
				t.Fatal(err)
			}
			for i, n := range tc.ns {
				want := compute.TopK(nil, sc[i*stride:i*stride+n], min(tc.topk, n))
				got := make([]int, tc.topk)
				for j := range got {
					got[j] = int(int32(binary.LittleEndian.Uint32(b[4*(i*tc.topk+j):])))
				}
				for j, w := range want {
					if got[j] != w {
						t.Errorf("%s: row %d (n %d, k %d): index %d is %d, want %d (compute.TopK %v...)", tc.name, i, n, len(want), j, got[j], w, want[:min(len(want), 8)])
						break
					}
				}
				for j := len(want); j < tc.topk; j++ {
					if got[j] != -1 {
						t.Errorf("%s: row %d: slot %d past k = %d was written (%d)", tc.name, i, j, len(want), got[j])
						break
					}
				}
			}
		}
		if err := e.f.TopKRows(e.c, 1, 1, 1, 1, 1, FwdMaxTopK+1, 4096, e.c.Stream()); err == nil {
			t.Errorf("k = %d was accepted", FwdMaxTopK+1)
		}
	})
}

// TestFwdRingStore checks the window ring's slot placement (with wrap).
func TestFwdRingStore(t *testing.T) {
	withFwd(t, func(e *fwdEnv) {
		const rows, dim, T, p0 = 7, 5, 4, 12
		kv := computetest.Normal(rand.New(rand.NewPCG(1, 2)), T*dim, 1)
		ring := e.poisoned(rows * dim)
		if err := e.f.RingStore(e.c, ring, e.up(kv), e.positions(p0, T), T, rows, dim, e.c.Stream()); err != nil {
			t.Fatal(err)
		}
		got := e.down(ring, rows*dim)
		for r := range rows {
			i := -1
			for j := range T {
				if (p0+j)%rows == r {
					i = j
				}
			}
			for c := range dim {
				v := got[r*dim+c]
				if i < 0 && v == v || i >= 0 && v != kv[i*dim+c] {
					t.Fatalf("slot %d col %d = %g (token %d)", r, c, v, i)
				}
			}
		}
	})
}

// TestFwdExpertTiles runs a chunk's experts laid out on the device (plan,
// gather, tiled w1/w3 and w2 launches, combine) and checks the layout
// against a host stable sort and every product against compute/ref: with
// the CUDA-core kernels (16-row tiles; w2's 64 columns are not the
// tensor-core kernels'), the tensor-core ones in their automatic modes
// (64-row records; the 64x32 tile below 40 routed rows per expert, 128x64
// from there) and explicit modes (records of 128 and 256 rows, the 256x64,
// 128x128 and 256x32 tiles, a small chunk planned with the first of two
// modes).
func TestFwdExpertTiles(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		inter, dim, T, e0, tile int
		modes                   []ExpertTileMode
		kernel                  string // a part of the w1/w3 or the w2 kernel's name
	}{
		{"cuda cores", 64, 128, 23, 20, moeTile, nil, "linmulti_"},
		{"tensor cores", 128, 256, 75, 70, moeTileTC, nil, "_64x32_"},
		{"tensor cores 128x64", 128, 256, 100, 90, moeTileTC, nil, "_128x64_"},
		{"records of 128", 128, 256, 100, 90, 128, []ExpertTileMode{{64, 2, 0}, {128, 1, 20}}, "_128x64_"},
		{"records of 256 tile 256x64", 256, 512, 100, 95, 256, []ExpertTileMode{{256, 16, 0}}, "_256x64_"},
		{"records of 128 tile 128x128", 128, 256, 60, 50, 128, []ExpertTileMode{{128, 13, 0}}, "_128x128_"},
		{"records of 64 tile 256x32", 256, 512, 60, 50, 64, []ExpertTileMode{{64, 17, 0}}, "_256x32_"},
		{"small chunk of two modes", 128, 256, 20, 15, 64, []ExpertTileMode{{64, 2, 0}, {128, 1, 20}}, "_64x32_"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testFwdExpertTiles(t, tc.inter, tc.dim, tc.T, tc.e0, tc.tile, tc.modes, tc.kernel)
		})
	}
}

// testFwdExpertTiles: E experts, K per token, expert 0 chosen first by the
// first e0 tokens, tiles of `tile` rows and a w1/w3 or w2 kernel whose name
// holds `kernel` expected, with the given modes (nil: PrepareExpertTiles).
func testFwdExpertTiles(t *testing.T, inter, dim, T, e0, tile int, modes []ExpertTileMode, kernel string) {
	withFwd(t, func(e *fwdEnv) {
		const E, K = 6, 3
		rng := rand.New(rand.NewPCG(4, 4))
		var w1, w3, w2 []*DeviceWeight
		var d1, d3, d2 []compute.WeightData
		for range E {
			ds := []compute.WeightData{computetest.RandomWeight(rng, compute.MXFP4, inter, dim, 0.05),
				computetest.RandomWeight(rng, compute.MXFP4, inter, dim, 0.05), computetest.RandomWeight(rng, compute.MXFP4, dim, inter, 0.05)}
			var ws []*DeviceWeight
			for _, d := range ds {
				w, err := e.c.UploadWeight(e.a, d)
				if err != nil {
					t.Fatal(err)
				}
				ws = append(ws, w)
			}
			w1, w3, w2 = append(w1, ws[0]), append(w3, ws[1]), append(w2, ws[2])
			d1, d3, d2 = append(d1, ds[0]), append(d3, ds[1]), append(d2, ds[2])
		}
		tab, err := e.c.PrepareExpertTable(e.a, w1, w3, w2)
		if err != nil {
			t.Fatal(err)
		}
		n := T * K
		// Expert 0 gets e0 rows (two tiles), expert 5 none; token 4 names
		// expert 2 twice (a hash row may).
		ids := make([]int, n)
		for j := range ids {
			ids[j] = rng.IntN(E - 1)
			if j%K == 0 && j/K < e0 {
				ids[j] = 0
			} else if ids[j] == 0 {
				ids[j] = 1 + rng.IntN(E-2)
			}
		}
		ids[4*K+1], ids[4*K+2] = 2, 2
		wts := computetest.Normal(rng, n, 1)
		x := computetest.Normal(rng, T*dim, 1)
		bufs := ExpertTileBufs{RowTok: e.upInts(make([]int, n)), RowW: e.poisoned(n), Inv: e.upInts(make([]int, n)),
			Tiles: e.upInts(make([]int, 3*expertMaxTiles(n, E, moeTile))), XE: e.poisoned(n * dim), G: e.poisoned(n * inter),
			U: e.poisoned(n * inter), H: e.poisoned(n * inter), Y: e.poisoned(n * dim)}
		var et *ExpertTiles
		if modes == nil {
			et, err = e.c.PrepareExpertTiles(e.a, tab, T, K, bufs)
		} else {
			et, err = e.c.PrepareExpertTilesWith(e.a, tab, T, K, bufs, modes)
		}
		if err != nil {
			t.Fatal(err)
		}
		s := e.c.Stream()
		if err := e.f.PlanExperts(e.c, et, e.upInts(ids), e.up(wts), T, s); err != nil {
			t.Fatal(err)
		}
		if k13, k2 := et.Kernels(); et.Tile() != tile || !strings.Contains(k13+" "+k2, kernel) {
			t.Fatalf("tiles of %d rows (kernels %s, %s), want %d and a %s kernel", et.Tile(), k13, k2, tile, kernel)
		}
		if err := e.f.GatherRows(e.c, bufs.XE, e.up(x), bufs.RowTok, n, dim, s); err != nil {
			t.Fatal(err)
		}
		if err := e.f.RunExpertTiles13(e.c, et, tab, s); err != nil {
			t.Fatal(err)
		}
		// Host reference layout: stable by (expert, entry).
		var slotTok, slotExp []int
		inv := make([]int, n)
		for ex := range E {
			for j, id := range ids {
				if id == ex {
					inv[j] = len(slotTok)
					slotTok, slotExp = append(slotTok, j/K), append(slotExp, ex)
				}
			}
		}
		ib := make([]byte, 4*n)
		if err := e.c.CopyFromDevice(ib, bufs.Inv); err != nil {
			t.Fatal(err)
		}
		for j := range n {
			if g := int(int32(binary.LittleEndian.Uint32(ib[4*j:]))); g != inv[j] {
				t.Fatalf("entry %d (token %d, expert %d): slot %d, want %d", j, j/K, ids[j], g, inv[j])
			}
		}
		W1, W3, W2 := make([][]float64, E), make([][]float64, E), make([][]float64, E)
		for ex := range E {
			W1[ex], W3[ex], W2[ex] = ref.ParallelDequant(d1[ex]), ref.ParallelDequant(d3[ex]), ref.ParallelDequant(d2[ex])
		}
		rw := e.down(bufs.RowW, n)
		g, u := e.down(bufs.G, n*inter), e.down(bufs.U, n*inter)
		for sl := range n {
			if rw[sl] != wts[func() int {
				for j := range n {
					if inv[j] == sl {
						return j
					}
				}
				return 0
			}()] {
				t.Fatalf("slot %d: weight %g is not its entry's", sl, rw[sl])
			}
			xt := x[slotTok[sl]*dim : (slotTok[sl]+1)*dim]
			for _, c := range []struct {
				what string
				got  []float32
				W    []float64
			}{{"w1", g[sl*inter : (sl+1)*inter], W1[slotExp[sl]]}, {"w3", u[sl*inter : (sl+1)*inter], W3[slotExp[sl]]}} {
				want := ref.Linear(c.W, inter, dim, f64s(xt), 1)
				if r := computetest.MaxRel(c.got, want); !(r <= computetest.TolLinear) {
					t.Errorf("slot %d (token %d, expert %d) %s: max relative error %.3g", sl, slotTok[sl], slotExp[sl], c.what, r)
				}
			}
		}
		h := computetest.Normal(rng, n*inter, 1)
		if err := e.c.CopyFloatsToDevice(bufs.H, h); err != nil {
			t.Fatal(err)
		}
		if err := e.f.RunExpertTiles2(e.c, et, s); err != nil {
			t.Fatal(err)
		}
		y := e.down(bufs.Y, n*dim)
		for sl := range n {
			want := ref.Linear(W2[slotExp[sl]], dim, inter, f64s(h[sl*inter:(sl+1)*inter]), 1)
			if r := computetest.MaxRel(y[sl*dim:(sl+1)*dim], want); !(r <= computetest.TolLinear) {
				t.Errorf("slot %d w2: max relative error %.3g", sl, r)
			}
		}
		base := computetest.Normal(rng, T*dim, 1)
		out := e.up(base)
		if err := e.f.CombineExperts(e.c, out, et, T, s); err != nil {
			t.Fatal(err)
		}
		got := e.down(out, T*dim)
		for tk := range T {
			for c := range dim {
				w := float64(base[tk*dim+c])
				for k := range K {
					w += float64(y[inv[tk*K+k]*dim+c])
				}
				if math.Abs(float64(got[tk*dim+c])-w) > 1e-5*math.Max(1, math.Abs(w)) {
					t.Fatalf("combine: token %d col %d = %g, want %g", tk, c, got[tk*dim+c], w)
				}
			}
		}
	})
}

// downInts copies n int32 values down from the device.
func (e *fwdEnv) downInts(p DevicePtr, n int) []int {
	e.t.Helper()
	b := make([]byte, 4*n)
	if err := e.c.CopyFromDevice(b, p); err != nil {
		e.t.Fatal(err)
	}
	out := make([]int, n)
	for i := range out {
		out[i] = int(int32(binary.LittleEndian.Uint32(b[4*i:])))
	}
	return out
}

// planRouting returns T·K routing ids over E experts of the named kind:
// "uniform" (K distinct experts per token), "skewed" (the first choice is
// expert 3 for 90% of the tokens, the rest from the lower half of the
// experts, repeats allowed: the upper half gets no rows), "single" (every
// entry names expert E-1) or "hostile" (ids in [-2, E+2): outside [0, E)
// counts as expert 0).
func planRouting(rng *rand.Rand, kind string, T, K, E int) []int {
	ids := make([]int, T*K)
	for tk := range T {
		var perm []int
		if kind == "uniform" {
			perm = rng.Perm(E)[:K]
		}
		for k := range K {
			j := tk*K + k
			switch kind {
			case "uniform":
				ids[j] = perm[k]
			case "skewed":
				if k == 0 && rng.IntN(10) != 0 {
					ids[j] = 3
				} else {
					ids[j] = rng.IntN(max(1, E/2))
				}
			case "single":
				ids[j] = E - 1
			case "hostile":
				ids[j] = rng.IntN(E+4) - 2
			}
		}
	}
	return ids
}

// TestFwdPlanExperts checks PlanExperts' layout with both planners (the
// multi-block default and MOXIE_CUDA_MOEPLAN=old) against a host reference
// written from the contract: slots expert-major, entries of one expert in
// entry order, RowTok/RowW/Inv of every slot, the tile records (expert,
// first slot, rows) of every expert then records of 0 rows up to the
// mode's tile count and nothing past it; chunks of 1..2048 tokens (up to
// 12288 routed rows), 6..1025 experts (past 1024 both run the one-block
// planner), experts without rows, one expert taking most or all rows, and
// ids out of range.
func TestFwdPlanExperts(t *testing.T) {
	type planCase struct {
		name          string
		T, K, E, tile int
		kind          string
	}
	cases := []planCase{
		{"t23_e6_uniform", 23, 3, 6, 16, "uniform"},
		{"t1_e256_uniform", 1, 6, 256, 64, "uniform"},
		{"t100_e6_hostile", 100, 3, 6, 16, "hostile"},
		{"t512_e192_uniform", 512, 6, 192, 64, "uniform"},
		{"t700_e1024_skewed", 700, 6, 1024, 64, "skewed"},
		{"t300_e1025_uniform", 300, 6, 1025, 64, "uniform"},
		{"t2048_e256_uniform", 2048, 6, 256, 64, "uniform"},
		{"t2048_e256_skewed", 2048, 6, 256, 64, "skewed"},
		{"t2048_e192_skewed_128", 2048, 6, 192, 128, "skewed"},
		{"t2048_e256_single", 2048, 6, 256, 64, "single"},
		{"t2047_e192_hostile_16", 2047, 6, 192, 16, "hostile"},
	}
	if testing.Short() {
		cases = cases[:4]
	}
	for ci, tc := range cases {
		for _, v := range []struct {
			name string
			v    moePlanVariant
		}{{"multi", moePlanMulti}, {"old", moePlanOld}} {
			t.Run(tc.name+"_"+v.name, func(t *testing.T) {
				withFwd(t, func(e *fwdEnv) {
					testPlanExperts(e, rand.New(rand.NewPCG(uint64(ci), 11)), tc.T, tc.K, tc.E, tc.tile, tc.kind, v.v)
				})
			})
		}
	}
}

func testPlanExperts(e *fwdEnv, rng *rand.Rand, T, K, E, tile int, kind string, v moePlanVariant) {
	t := e.t
	const dim, spare = 256, 8
	n := T * K
	ids := planRouting(rng, kind, T, K, E)
	wts := computetest.Normal(rng, n, 1)
	mt := expertMaxTiles(n, E, tile)
	sentinel := make([]int, max(n, 3*(mt+spare)))
	for i := range sentinel {
		sentinel[i] = -7
	}
	bufs := ExpertTileBufs{RowTok: e.upInts(sentinel[:n]), RowW: e.poisoned(n), Inv: e.upInts(sentinel[:n]),
		Tiles: e.upInts(sentinel[:3*(mt+spare)]), XE: e.poisoned(n * dim)}
	et := &ExpertTiles{modes: []expertMode{{ExpertTileMode: ExpertTileMode{Rows: tile}, maxTiles: mt}}, maxRows: n, K: K, E: E, dim: dim, b: bufs}
	if multi := et.planMulti(n); multi != (E <= planMaxExperts) {
		t.Fatalf("planMulti(%d) = %v with %d experts", n, multi, E)
	}
	s := e.c.Stream()
	if err := e.f.planExperts(e.c, et, e.upInts(ids), e.up(wts), T, v, s); err != nil {
		t.Fatal(err)
	}
	// Host reference, from the contract.
	expertOf := func(id int) int {
		if id < 0 || id >= E {
			return 0
		}
		return id
	}
	var slotEntry []int
	inv := make([]int, n)
	var tiles []int
	for ex := range E {
		first := len(slotEntry)
		for j, id := range ids {
			if expertOf(id) == ex {
				inv[j] = len(slotEntry)
				slotEntry = append(slotEntry, j)
			}
		}
		for r := first; r < len(slotEntry); r += tile {
			tiles = append(tiles, ex, r, min(tile, len(slotEntry)-r))
		}
	}
	for len(tiles) < 3*mt {
		tiles = append(tiles, 0, 0, 0)
	}
	tiles = append(tiles[:3*mt], sentinel[3*mt:3*(mt+spare)]...)
	gotInv, gotTok := e.downInts(bufs.Inv, n), e.downInts(bufs.RowTok, n)
	gotW, gotTiles := e.down(bufs.RowW, n), e.downInts(bufs.Tiles, 3*(mt+spare))
	for j := range n {
		if gotInv[j] != inv[j] {
			t.Fatalf("entry %d (token %d, id %d): slot %d, want %d", j, j/K, ids[j], gotInv[j], inv[j])
		}
	}
	for sl, j := range slotEntry {
		if gotTok[sl] != j/K || math.Float32bits(gotW[sl]) != math.Float32bits(wts[j]) {
			t.Fatalf("slot %d: token %d weight %g, want entry %d's: token %d weight %g", sl, gotTok[sl], gotW[sl], j, j/K, wts[j])
		}
	}
	for i := range tiles {
		if gotTiles[i] != tiles[i] {
			t.Fatalf("tile %d of %d: (expert, first, rows) = %v, want %v", i/3, mt, gotTiles[i/3*3:i/3*3+3], tiles[i/3*3:i/3*3+3])
		}
	}
}

// TestMoEPlanEmulated runs the multi-block planner (fwd_moe_count,
// fwd_moe_offsets, fwd_moe_scatter of kernels/fwd.cu) on the CPU (no GPU
// needed): moePlanEmuHarness turns every CUDA thread into a std::thread
// with barriers for __syncthreads and the warp exchanges (__match_any_sync,
// __shfl_up_sync), launches the three kernels as PlanExperts does and
// compares Inv, RowTok, RowW and the tile records (and the spare records
// past the last, which must stay untouched) with its own reference: slots
// expert-major, each expert's entries in entry order. Skipped with -short
// or without g++ (C++20).
func TestMoEPlanEmulated(t *testing.T) {
	src := FwdSource()
	i, j := strings.Index(src, "#define PLAN_CHUNK"), strings.Index(src, "// fwd_moe_tiles:")
	if i < 0 || j < i {
		t.Fatal("fwd.cu: the multi-block planner's section not found; update the emulation")
	}
	sec := src[i:j]
	const dyn = "extern __shared__ int sh[];"
	if strings.Count(sec, dyn) != 2 {
		t.Fatalf("fwd.cu: the planner's kernels no longer declare %q; update the emulation", dyn)
	}
	sec = strings.ReplaceAll(sec, dyn, "int *sh = g_dyn;")
	for _, d := range []string{fmt.Sprintf("#define PLAN_CHUNK %d\n", planChunk), fmt.Sprintf("#define PLAN_THREADS %d\n", planThreads)} {
		if !strings.Contains(sec, d) {
			t.Fatalf("fwd.cu does not %q as fwd.go's planChunk / planThreads say", strings.TrimSpace(d))
		}
	}
	lines := runHostEmulation(t, map[string]string{"kern.inc": sec, "emu.cpp": moePlanEmuHarness})
	if len(lines) != 9 {
		t.Errorf("emulation printed %d lines, want 9 (one per case):\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for _, l := range lines {
		t.Log(l)
		if !strings.HasPrefix(l, "ok ") {
			t.Error(l)
		}
	}
}

// moePlanEmuHarness is TestMoEPlanEmulated's C++ program (it includes
// kern.inc, the planner's section of fwd.cu).
const moePlanEmuHarness = `// CPU emulation of the multi-block MoE planner of kernels/fwd.cu: every
// CUDA thread of a block is a std::thread, __syncthreads a block barrier,
// each warp exchange a write between two warp barriers, __shared__
// variables statics and the dynamic shared memory one array (one block runs
// at a time, in launch order). Prints "ok <case>" or "FAIL <case>: why".
#include <barrier>
#include <thread>
#include <vector>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <random>
#include <algorithm>
using std::min; using std::max;
#include "cuda_emu.h"  // threadIdx, blockIdx, the barriers, __syncthreads, the CUDA keywords
int g_xch[32][32];
int g_dyn[1 << 14];
static int warp_xch(int v, int src) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  g_warp_bar[w]->arrive_and_wait();
  g_xch[w][l] = v;
  g_warp_bar[w]->arrive_and_wait();
  return g_xch[w][src];
}
inline int __shfl_up_sync(unsigned, int v, unsigned o) {
  const int l = threadIdx.x % 32;
  return warp_xch(v, l >= (int)o ? l - (int)o : l);
}
inline unsigned __match_any_sync(unsigned, int v) {
  const int w = threadIdx.x / 32;
  warp_xch(v, threadIdx.x % 32);
  unsigned m = 0;
  for (int i = 0; i < 32; i++)
    if (g_xch[w][i] == v) m |= 1u << i;
  return m;
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
#include "kern.inc"

template <class F> void launch(unsigned grid, unsigned threads, F body) {
  gridDim = {grid, 1, 1}; blockDim = {threads, 1, 1};
  for (unsigned x = 0; x < grid; x++) {
    std::barrier<> bb(threads);
    g_block_bar = &bb;
    for (unsigned w = 0; w < threads / 32; w++) g_warp_bar[w] = new std::barrier<>(32);
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < threads; t++)
      ts.emplace_back([=] { threadIdx = {t, 0, 0}; blockIdx = {x, 0, 0}; body(); });
    for (auto &t : ts) t.join();
    for (unsigned w = 0; w < threads / 32; w++) delete g_warp_bar[w];
  }
}

struct Case { const char *name; int T, K, E, tile; char kind; };  // u uniform, s skewed, 1 single, h hostile

int main() {
  const Case cases[] = {
    {"t23_k3_e6_tile16_uniform", 23, 3, 6, 16, 'u'},
    {"t100_k3_e6_tile16_hostile", 100, 3, 6, 16, 'h'},
    {"t1_k6_e256_tile64_uniform", 1, 6, 256, 64, 'u'},
    {"t171_k6_e1024_tile64_skewed", 171, 6, 1024, 64, 's'},
    {"t512_k6_e192_tile64_uniform", 512, 6, 192, 64, 'u'},
    {"t2048_k6_e256_tile64_uniform", 2048, 6, 256, 64, 'u'},
    {"t2048_k6_e256_tile64_skewed", 2048, 6, 256, 64, 's'},
    {"t2047_k6_e192_tile128_single", 2047, 6, 192, 128, '1'},
    {"t1000_k6_e192_tile16_hostile", 1000, 6, 192, 16, 'h'},
  };
  for (const Case &c : cases) {
    std::mt19937 rng(c.T * 131 + c.E);
    const int n = c.T * c.K, E = c.E, nb = (n + PLAN_CHUNK - 1) / PLAN_CHUNK, mt = (n + c.tile - 1) / c.tile + E, spare = 8;
    std::vector<int> ids(n);
    for (int t = 0; t < c.T; t++) {
      std::vector<int> perm(E);
      for (int e = 0; e < E; e++) perm[e] = e;
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int k = 0; k < c.K; k++) {
        const int j = t * c.K + k;
        switch (c.kind) {
          case 'u': ids[j] = perm[k]; break;
          case 's': ids[j] = (k == 0 && rng() % 10) ? 3 : (int)(rng() % max(1, E / 2)); break;
          case '1': ids[j] = E - 1; break;
          default: ids[j] = (int)(rng() % (E + 4)) - 2;
        }
      }
    }
    std::vector<float> w(n), row_w(n, NAN);
    for (int j = 0; j < n; j++) w[j] = (float)j * 0.25f - 3.f;
    std::vector<int> cnt(nb * E, -5), tiles(3 * (mt + spare), -7), row_tok(n, -7), inv(n, -7);
    int *pc = cnt.data(), *pt = tiles.data(), *prt = row_tok.data(), *pinv = inv.data(), *pids = ids.data();
    float *prw = row_w.data(), *pw = w.data();
    launch(nb, PLAN_THREADS, [=] { fwd_moe_count(pc, pids, n, E); });
    launch(1, 1024, [=] { fwd_moe_offsets(pc, pt, nb, E, mt, c.tile); });
    launch(nb, PLAN_THREADS, [=] { fwd_moe_scatter(prt, prw, pinv, pc, pids, pw, n, c.K, E); });
    // Reference: slots expert-major, entries of an expert in entry order.
    std::vector<int> want_inv(n), want_tok, want_entry, want_tiles;
    for (int e = 0; e < E; e++) {
      const int first = (int)want_tok.size();
      for (int j = 0; j < n; j++) {
        const int ej = (ids[j] < 0 || ids[j] >= E) ? 0 : ids[j];
        if (ej != e) continue;
        want_inv[j] = (int)want_tok.size();
        want_tok.push_back(j / c.K);
        want_entry.push_back(j);
      }
      for (int r = first; r < (int)want_tok.size(); r += c.tile) {
        want_tiles.push_back(e); want_tiles.push_back(r); want_tiles.push_back(min(c.tile, (int)want_tok.size() - r));
      }
    }
    while ((int)want_tiles.size() < 3 * mt) want_tiles.push_back(0);
    want_tiles.resize(3 * mt);
    for (int i = 0; i < 3 * spare; i++) want_tiles.push_back(-7);
    char why[256] = "";
    for (int j = 0; j < n && !why[0]; j++)
      if (inv[j] != want_inv[j]) snprintf(why, sizeof why, "entry %d (id %d): slot %d, want %d", j, ids[j], inv[j], want_inv[j]);
    for (int s = 0; s < n && !why[0]; s++)
      if (row_tok[s] != want_tok[s] || row_w[s] != w[want_entry[s]])
        snprintf(why, sizeof why, "slot %d: token %d weight %g, want %d %g", s, row_tok[s], row_w[s], want_tok[s], w[want_entry[s]]);
    for (int i = 0; i < (int)want_tiles.size() && !why[0]; i++)
      if (tiles[i] != want_tiles[i])
        snprintf(why, sizeof why, "tile %d of %d: (%d, %d, %d), want (%d, %d, %d)", i / 3, mt, tiles[i / 3 * 3], tiles[i / 3 * 3 + 1],
                 tiles[i / 3 * 3 + 2], want_tiles[i / 3 * 3], want_tiles[i / 3 * 3 + 1], want_tiles[i / 3 * 3 + 2]);
    if (why[0]) printf("FAIL %s: %s\n", c.name, why);
    else printf("ok %s (%d rows, %d blocks, %d tiles)\n", c.name, n, nb, mt);
  }
  return 0;
}
`

// TestFwdCombine checks CombineExperts (out[t] += Σ_k Y[Inv[t·K+k]], k in
// order, in float32) against the same float32 sums on the host, bit for
// bit, at widths of 4-float multiples (4 floats per access on 16-byte
// aligned rows: out shifted by 0 floats) and not.
func TestFwdCombine(t *testing.T) {
	for _, tc := range []struct{ T, K, dim, shift int }{{5, 3, 33, 0}, {5, 3, 36, 0}, {5, 3, 36, 1}, {9, 6, 4096, 0}, {9, 6, 4096, 3}} {
		t.Run(fmt.Sprintf("t%d_k%d_dim%d_shift%d", tc.T, tc.K, tc.dim, tc.shift), func(t *testing.T) {
			withFwd(t, func(e *fwdEnv) {
				rng := rand.New(rand.NewPCG(uint64(tc.dim), 8))
				n := tc.T * tc.K
				inv := rng.Perm(n)
				y := computetest.Normal(rng, n*tc.dim, 1)
				base := computetest.Normal(rng, tc.T*tc.dim+tc.shift, 1)
				et := &ExpertTiles{maxRows: n, K: tc.K, dim: tc.dim, b: ExpertTileBufs{Y: e.up(y), Inv: e.upInts(inv)}}
				out := e.up(base)
				if err := e.f.CombineExperts(e.c, out+DevicePtr(4*tc.shift), et, tc.T, e.c.Stream()); err != nil {
					t.Fatal(err)
				}
				got := e.down(out, tc.T*tc.dim+tc.shift)
				for i := range tc.shift {
					if got[i] != base[i] {
						t.Fatalf("element %d before out changed: %g, want %g", i, got[i], base[i])
					}
				}
				for tk := range tc.T {
					for c := range tc.dim {
						w := base[tc.shift+tk*tc.dim+c]
						for k := range tc.K {
							w += y[inv[tk*tc.K+k]*tc.dim+c]
						}
						if g := got[tc.shift+tk*tc.dim+c]; math.Float32bits(g) != math.Float32bits(w) {
							t.Fatalf("token %d col %d = %g, want %g", tk, c, g, w)
						}
					}
				}
			})
		})
	}
}
