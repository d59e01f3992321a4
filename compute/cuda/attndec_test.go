package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"moxie/compute/computetest"
)

// attnDecTol bounds AttentionDecode's max relative error (max |error| over
// max |want| of one query's outputs) against the float64 reference and
// against AttentionRing.
const attnDecTol = 1e-5

// attnDecRef is the attention of dsv4-flash.md §4.4 in float64 for one
// query: q [heads, dim], keys [n, dim] (K = V), one sink logit per head:
// o_h = Σ_i e^(s_i−M) k_i / (Σ_i e^(s_i−M) + e^(sink_h−M)), s_i = scale q_h·k_i,
// M = the largest real score (0 outputs when there is no key).
func attnDecRef(q, keys, sinks []float32, heads, dim int, scale float64) []float64 {
	n := len(keys) / dim
	out := make([]float64, heads*dim)
	s := make([]float64, n)
	for h := range heads {
		if n == 0 {
			continue
		}
		M := math.Inf(-1)
		for i := range n {
			d := 0.0
			for c := range dim {
				d += float64(q[h*dim+c]) * float64(keys[i*dim+c])
			}
			s[i] = d * scale
			M = math.Max(M, s[i])
		}
		den := math.Exp(float64(sinks[h]) - M)
		for i := range n {
			s[i] = math.Exp(s[i] - M)
			den += s[i]
		}
		o := out[h*dim : (h+1)*dim]
		for i := range n {
			w := s[i] / den
			for c := range dim {
				o[c] += w * float64(keys[i*dim+c])
			}
		}
	}
	return out
}

// attnDecCase is one decode attention problem: T consecutive queries from
// position p0, keys of every position, compressed entries, an Idx table.
type attnDecCase struct {
	name                 string
	window, ringRows, p0 int
	T, heads, dim        int
	kind                 string // "window", "hca", "csa"
	ratio, topk          int
	maxKeys              int     // 0: window + topk (csa) or + the last query's entries (hca)
	pad                  bool    // csa: every third selected entry is −1 (padding)
	sinkShift            float32 // added to every sink
}

type attnDecData struct {
	q, keys, ent, sinks []float32
	idx                 []int
	idxStride, maxKeys  int
	ring                []float32
}

// params are the case's AttnParams with d's inputs uploaded (compressed
// entries unless a window case, the selection for a CSA case) and a
// poisoned output.
func (tc attnDecCase) params(e *fwdEnv, d attnDecData, scale float64) AttnParams {
	p := AttnParams{O: e.poisoned(tc.T * tc.heads * tc.dim), Q: e.up(d.q), Ring: e.up(d.ring), Sinks: e.up(d.sinks), Pos: e.positions(tc.p0, tc.T),
		RingRows: tc.ringRows, Window: tc.window, T: tc.T, Ratio: tc.ratio, IdxStride: d.idxStride, TopK: tc.topk,
		Heads: tc.heads, Dim: tc.dim, MaxKeys: d.maxKeys, Scale: float32(scale)}
	if tc.kind != "window" {
		p.Comp = e.up(d.ent)
	}
	if tc.kind == "csa" {
		p.Idx = e.upInts(d.idx)
	}
	return p
}

func (tc attnDecCase) data(seed uint64) attnDecData {
	rng := rand.New(rand.NewPCG(seed, 13))
	last := tc.p0 + tc.T - 1
	d := attnDecData{keys: computetest.Normal(rng, (last+1)*tc.dim, 1)}
	d.ring = make([]float32, tc.ringRows*tc.dim)
	for p := max(0, tc.p0-tc.window+1); p <= last; p++ {
		copy(d.ring[(p%tc.ringRows)*tc.dim:], d.keys[p*tc.dim:(p+1)*tc.dim])
	}
	nEnt := 0
	if tc.ratio > 0 {
		nEnt = (last + 1) / tc.ratio
	}
	d.ent = computetest.Normal(rng, max(nEnt, 1)*tc.dim, 1)
	d.q = computetest.Normal(rng, tc.T*tc.heads*tc.dim, 1)
	d.sinks = computetest.Normal(rng, tc.heads, 1)
	for h := range d.sinks {
		d.sinks[h] += tc.sinkShift
	}
	d.idxStride = max(tc.topk, 1) + 3
	d.idx = make([]int, tc.T*d.idxStride)
	for i := range d.idx {
		d.idx[i] = 1 << 30 // never read: past each row's count
	}
	for qi := range tc.T {
		n := (tc.p0 + qi + 1) / max(tc.ratio, 1)
		perm := rng.Perm(max(n, 1))
		for j := 0; j < min(n, tc.topk); j++ {
			d.idx[qi*d.idxStride+j] = perm[j]
			if tc.pad && j%3 == 1 {
				d.idx[qi*d.idxStride+j] = -1
			}
		}
	}
	d.maxKeys = tc.maxKeys
	if d.maxKeys == 0 {
		d.maxKeys = tc.window
		switch tc.kind {
		case "csa":
			d.maxKeys += tc.topk
		case "hca":
			d.maxKeys += nEnt
		}
	}
	return d
}

// keyList gathers query qi's keys on the host from the spec: the window
// positions, then the entries (all, or the selected ones less padding), at
// most maxKeys (padding entries count, as in AttentionRing's key list).
func (tc attnDecCase) keyList(d attnDecData, qi int) []float32 {
	t := tc.p0 + qi
	var list [][]float32
	for p := max(0, t-tc.window+1); p <= t; p++ {
		list = append(list, d.keys[p*tc.dim:(p+1)*tc.dim])
	}
	switch tc.kind {
	case "hca":
		for e := range (t + 1) / tc.ratio {
			list = append(list, d.ent[e*tc.dim:(e+1)*tc.dim])
		}
	case "csa":
		for j := range min((t+1)/tc.ratio, tc.topk) {
			e := d.idx[qi*d.idxStride+j]
			if e < 0 {
				list = append(list, nil)
				continue
			}
			list = append(list, d.ent[e*tc.dim:(e+1)*tc.dim])
		}
	}
	list = list[:min(len(list), d.maxKeys)]
	var kv []float32
	for _, k := range list {
		kv = append(kv, k...) // nil (padding) adds nothing
	}
	return kv
}

var attnDecCases = []attnDecCase{
	{name: "window first position", window: 128, ringRows: 128, p0: 0, T: 1, heads: 64, dim: 512, kind: "window"},
	{name: "window early, fewer keys than a tile", window: 128, ringRows: 131, p0: 5, T: 4, heads: 64, dim: 512, kind: "window"},
	{name: "window ring wraps", window: 128, ringRows: 131, p0: 1000, T: 4, heads: 64, dim: 512, kind: "window"},
	{name: "window wraps T=2 small heads", window: 16, ringRows: 17, p0: 40, T: 2, heads: 8, dim: 128, kind: "window"},
	{name: "hca no entry yet", window: 128, ringRows: 129, p0: 100, T: 1, heads: 64, dim: 512, kind: "hca", ratio: 128, maxKeys: 128 + 40},
	{name: "hca 32 entries", window: 128, ringRows: 132, p0: 4093, T: 4, heads: 64, dim: 512, kind: "hca", ratio: 128},
	{name: "hca max keys above need", window: 128, ringRows: 129, p0: 2100, T: 1, heads: 16, dim: 256, kind: "hca", ratio: 128, maxKeys: 128 + 512},
	{name: "csa fewer entries than k", window: 128, ringRows: 132, p0: 30, T: 4, heads: 64, dim: 512, kind: "csa", ratio: 4, topk: 512},
	{name: "csa full 512", window: 128, ringRows: 129, p0: 4000, T: 1, heads: 64, dim: 512, kind: "csa", ratio: 4, topk: 512},
	{name: "csa T=2 wrap", window: 128, ringRows: 130, p0: 2500, T: 2, heads: 64, dim: 512, kind: "csa", ratio: 4, topk: 512},
	{name: "csa small heads", window: 32, ringRows: 36, p0: 300, T: 4, heads: 16, dim: 128, kind: "csa", ratio: 4, topk: 40},
	{name: "csa large sinks", window: 128, ringRows: 129, p0: 900, T: 1, heads: 64, dim: 512, kind: "csa", ratio: 4, topk: 512, sinkShift: 6},
	{name: "csa small sinks", window: 128, ringRows: 129, p0: 900, T: 1, heads: 64, dim: 512, kind: "csa", ratio: 4, topk: 512, sinkShift: -30},
	{name: "hca splits of several tiles", window: 16, ringRows: 19, p0: 4000, T: 2, heads: 8, dim: 128, kind: "hca", ratio: 2},
	{name: "hca 2k entries", window: 128, ringRows: 129, p0: 8191, T: 1, heads: 64, dim: 512, kind: "hca", ratio: 4},
	{name: "csa max keys truncates", window: 128, ringRows: 129, p0: 900, T: 1, heads: 64, dim: 512, kind: "csa", ratio: 4, topk: 512, maxKeys: 128 + 100},
}

func TestAttentionDecode(t *testing.T) {
	withFwd(t, func(e *fwdEnv) {
		if err := e.c.LoadAttnDec(); err != nil {
			t.Fatal(err)
		}
		cases := append([]attnDecCase(nil), attnDecCases...)
		cases = append(cases, attnDecCase{name: "csa padding entries", window: 128, ringRows: 132, p0: 1500, T: 4, heads: 64, dim: 512,
			kind: "csa", ratio: 4, topk: 512, pad: true})
		for ci, tc := range cases {
			// Not a subtest: t.Run would move the case off the device's
			// locked OS thread (CUDA_ERROR_INVALID_CONTEXT).
			t.Logf("case %s", tc.name)
			func(t *testing.T) {
				d := tc.data(uint64(ci))
				n := tc.T * tc.heads * tc.dim
				scale := 1 / math.Sqrt(float64(tc.dim))
				p := tc.params(e, d, scale)
				want := make([][]float64, tc.T)
				for qi := range tc.T {
					want[qi] = attnDecRef(d.q[qi*tc.heads*tc.dim:(qi+1)*tc.heads*tc.dim], tc.keyList(d, qi), d.sinks, tc.heads, tc.dim, scale)
				}
				// AttentionRing on the same inputs (it reads padding entries
				// as rows, so not with padding).
				var ring []float32
				if !tc.pad {
					if err := e.f.AttentionRing(e.c, p, e.c.Stream()); err != nil {
						t.Fatal(err)
					}
					ring = e.down(p.O, n)
				}
				scratchBytes := AttentionDecodeScratchBytes(tc.heads, tc.dim, tc.T, d.maxKeys)
				scratch, err := e.a.Alloc(scratchBytes)
				if err != nil {
					t.Fatal(err)
				}
				for _, v := range attnDecVariants {
					if !v.fits(tc.heads, tc.dim) {
						continue
					}
					var first []float32
					for rep := range 2 {
						if err := e.c.Memset(p.O, 0xff, 4*n, e.c.Stream()); err != nil {
							t.Fatal(err)
						}
						if err := e.c.Memset(scratch, 0xff, scratchBytes, e.c.Stream()); err != nil {
							t.Fatal(err)
						}
						if err := e.c.attentionDecode(p, scratch, v.Name, e.c.Stream()); err != nil {
							t.Fatalf("%s: %v", v.Name, err)
						}
						got := e.down(p.O, n)
						if rep == 1 {
							for i := range got {
								if math.Float32bits(got[i]) != math.Float32bits(first[i]) {
									t.Fatalf("%s: output %d differs between two runs (%g, %g)", v.Name, i, first[i], got[i])
								}
							}
							break
						}
						first = got
						var worst, worstRing float64
						for qi := range tc.T {
							g := got[qi*tc.heads*tc.dim : (qi+1)*tc.heads*tc.dim]
							r := computetest.MaxRel(g, want[qi])
							worst = max(worst, r)
							if !(r <= attnDecTol) {
								t.Errorf("%s: query %d (position %d): max relative error %.3g vs float64 > %.3g", v.Name, qi, tc.p0+qi, r, attnDecTol)
							}
							if ring != nil {
								rr := computetest.MaxRel(g, f64s(ring[qi*tc.heads*tc.dim:(qi+1)*tc.heads*tc.dim]))
								worstRing = max(worstRing, rr)
								if !(rr <= attnDecTol) {
									t.Errorf("%s: query %d (position %d): max relative error %.3g vs AttentionRing > %.3g", v.Name, qi, tc.p0+qi, rr, attnDecTol)
								}
							}
						}
						t.Logf("%s (%d splits): max rel. error %.3g vs float64, %.3g vs AttentionRing", v.Name, v.splits(d.maxKeys), worst, worstRing)
					}
				}
			}(t)
		}
	})
}

// TestAttentionDecodeRejects checks that bad sizes are errors naming the
// argument, before anything touches the device (no GPU needed).
func TestAttentionDecodeRejects(t *testing.T) {
	ok := AttnParams{O: 1, Q: 1, Ring: 1, Sinks: 1, Pos: 1, RingRows: 131, Window: 128, T: 4, Heads: 64, Dim: 512, MaxKeys: 640, Scale: 1}
	cases := []struct {
		name    string
		edit    func(p *AttnParams)
		scratch DevicePtr
		variant string
		want    string
	}{
		{"nil q", func(p *AttnParams) { p.Q = 0 }, 1, "", "nil buffer"},
		{"nil scratch", func(p *AttnParams) {}, 0, "", "scratch"},
		{"T 0", func(p *AttnParams) { p.T = 0 }, 1, "", "T 0"},
		{"T 65536", func(p *AttnParams) { p.T, p.RingRows = 65536, 70000 }, 1, "", "T 65536"},
		{"window 0", func(p *AttnParams) { p.Window = 0 }, 1, "", "window 0"},
		{"heads 60", func(p *AttnParams) { p.Heads = 60 }, 1, "", "60 heads"},
		{"dim 48", func(p *AttnParams) { p.Dim = 48 }, 1, "", "width 48"},
		{"ring too small", func(p *AttnParams) { p.RingRows = 130 }, 1, "", "ring of 130 rows"},
		{"comp without ratio", func(p *AttnParams) { p.Comp = 1 }, 1, "", "ratio 0"},
		{"idx stride < k", func(p *AttnParams) { p.Comp, p.Ratio, p.Idx, p.TopK, p.IdxStride = 1, 4, 1, 8, 4 }, 1, "", "top-k 8"},
		{"idx with k 0", func(p *AttnParams) { p.Comp, p.Ratio, p.Idx, p.TopK, p.IdxStride = 1, 4, 1, 0, 4 }, 1, "", "top-k 0"},
		{"max keys 0", func(p *AttnParams) { p.MaxKeys = 0 }, 1, "", "max keys 0"},
		{"unknown variant", func(p *AttnParams) {}, 1, "nope", "variant"},
		{"g4 with dim 128", func(p *AttnParams) { p.Dim = 128 }, 1, "g4k32", "width 128"},
	}
	var c *Ctx // never reached: every case fails validation first
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := ok
			tc.edit(&p)
			v := tc.variant
			if v == "" {
				v = attnDecVariants[0].Name
			}
			err := c.attentionDecode(p, tc.scratch, v, Stream{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestAttentionDecodeScratchBytes(t *testing.T) {
	cases := []struct {
		heads, dim, T, maxKeys, want int
	}{
		// The largest split count of any variant: 64 splits of 16 keys
		// (g8k16, g16k16) at 1024+ keys, ceil(keys/16) below.
		{64, 512, 1, 640, 4 * 40 * 64 * 514},
		{64, 512, 4, 128 + 512, 4 * 4 * 40 * 64 * 514},
		{64, 512, 1, 1 << 20, 4 * 64 * 64 * 514},
		{8, 128, 2, 5, 4 * 2 * 1 * 8 * 130},
		{64, 512, 0, 640, 0},
		{0, 512, 1, 640, 0},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.heads, "x", tc.dim, " T", tc.T, " keys", tc.maxKeys), func(t *testing.T) {
			if got := AttentionDecodeScratchBytes(tc.heads, tc.dim, tc.T, tc.maxKeys); got != tc.want {
				t.Errorf("got %d bytes, want %d", got, tc.want)
			}
		})
	}
	if !DecodeAttentionFits(64, 512) || DecodeAttentionFits(4, 48) || DecodeAttentionFits(60, 512) {
		t.Error("DecodeAttentionFits: want 64x512 in, Tiny's 4x48 and 60 heads out")
	}
}

// ropeInvRef rotates, in place, the last 2·len(freq) dims of each dim-wide
// head of o back by the angle float32(pos)·freq[k] (the product rounded to
// float32, as RoPE defines the angle; sine, cosine and the rotation in
// float64).
func ropeInvRef(o []float64, pos int, freq []float32, dim int) {
	nf := len(freq)
	for h := 0; h < len(o)/dim; h++ {
		for k := range nf {
			ang := -float64(float32(pos) * freq[k])
			sn, cs := math.Sincos(ang)
			e := o[h*dim+dim-2*nf+2*k:]
			re, im := e[0], e[1]
			e[0], e[1] = re*cs-im*sn, re*sn+im*cs
		}
	}
}

// TestAttentionDecodeInvRoPE checks AttentionDecodeInvRoPE against the chain
// it replaces (AttentionDecode, then RoPE with inverse set: the same float32
// and float64 operations, so within fuseTol, bit-identity logged) and
// against the float64 attention rotated back in float64 (attnDecTol), for
// V4's 32 frequencies on heads of 512, frequency counts that start the
// rotated part inside a float4 column (odd counts) and a fully rotated head.
func TestAttentionDecodeInvRoPE(t *testing.T) {
	withFwd(t, func(e *fwdEnv) {
		if err := e.c.LoadAttnDec(); err != nil {
			t.Fatal(err)
		}
		if err := e.c.LoadOps(); err != nil {
			t.Fatal(err)
		}
		for ci, tc := range attnDecCases {
			nfs := map[int][]int{512: {32, 3}, 256: {64, 1}, 128: {64, 5}}[tc.dim]
			for _, nf := range nfs {
				// Not a subtest: t.Run would move the case off the device's
				// locked OS thread (CUDA_ERROR_INVALID_CONTEXT).
				t.Logf("case %s, %d frequencies", tc.name, nf)
				d := tc.data(uint64(100 + ci))
				n := tc.T * tc.heads * tc.dim
				scale := 1 / math.Sqrt(float64(tc.dim))
				freq := ropeFreqs(nf)
				p := tc.params(e, d, scale)
				dfreq := e.up(freq)
				scratchBytes := AttentionDecodeScratchBytes(tc.heads, tc.dim, tc.T, d.maxKeys)
				scratch, err := e.a.Alloc(scratchBytes)
				if err != nil {
					t.Fatal(err)
				}
				s := e.c.Stream()
				// The chain.
				if err := e.c.AttentionDecode(p, scratch, s); err != nil {
					t.Fatal(err)
				}
				if err := e.c.RoPE(p.O, p.Pos, dfreq, tc.T, tc.heads*tc.dim, tc.dim, nf, true, s); err != nil {
					t.Fatal(err)
				}
				chain := e.down(p.O, n)
				// The fused call, on a poisoned output and scratch.
				if err := e.c.Memset(p.O, 0xff, 4*n, s); err != nil {
					t.Fatal(err)
				}
				if err := e.c.Memset(scratch, 0xff, scratchBytes, s); err != nil {
					t.Fatal(err)
				}
				if err := e.c.AttentionDecodeInvRoPE(p, dfreq, nf, scratch, s); err != nil {
					t.Fatal(err)
				}
				got := e.down(p.O, n)
				r := computetest.MaxRel(got, f64s(chain))
				same := bitsEqual(got, chain)
				if !(r <= fuseTol) {
					t.Errorf("%s, %d frequencies: fused vs AttentionDecode+RoPE max rel. error %.3g > %.3g", tc.name, nf, r, fuseTol)
				}
				var worst float64
				for qi := range tc.T {
					want := attnDecRef(d.q[qi*tc.heads*tc.dim:(qi+1)*tc.heads*tc.dim], tc.keyList(d, qi), d.sinks, tc.heads, tc.dim, scale)
					ropeInvRef(want, tc.p0+qi, freq, tc.dim)
					rq := computetest.MaxRel(got[qi*tc.heads*tc.dim:(qi+1)*tc.heads*tc.dim], want)
					worst = max(worst, rq)
					if !(rq <= attnDecTol) {
						t.Errorf("%s, %d frequencies: query %d (position %d): max rel. error %.3g vs float64 > %.3g", tc.name, nf, qi, tc.p0+qi, rq, attnDecTol)
					}
				}
				t.Logf("vs the chain: max rel. %.3g (bit-identical %v); vs float64 %.3g", r, same, worst)
			}
		}
		// The whole head rotated (2·nfreq == dim).
		tc := attnDecCase{name: "all dims rotated", window: 16, ringRows: 17, p0: 40, T: 2, heads: 8, dim: 128, kind: "window"}
		d := tc.data(7)
		n := tc.T * tc.heads * tc.dim
		scale := 1 / math.Sqrt(float64(tc.dim))
		freq := ropeFreqs(64)
		p := AttnParams{O: e.poisoned(n), Q: e.up(d.q), Ring: e.up(d.ring), Sinks: e.up(d.sinks), Pos: e.positions(tc.p0, tc.T),
			RingRows: tc.ringRows, Window: tc.window, T: tc.T, Heads: tc.heads, Dim: tc.dim, MaxKeys: d.maxKeys, Scale: float32(scale)}
		scratch, err := e.a.Alloc(AttentionDecodeScratchBytes(tc.heads, tc.dim, tc.T, d.maxKeys))
		if err != nil {
			t.Fatal(err)
		}
		if err := e.c.AttentionDecodeInvRoPE(p, e.up(freq), 64, scratch, e.c.Stream()); err != nil {
			t.Fatal(err)
		}
		got := e.down(p.O, n)
		for qi := range tc.T {
			want := attnDecRef(d.q[qi*tc.heads*tc.dim:(qi+1)*tc.heads*tc.dim], tc.keyList(d, qi), d.sinks, tc.heads, tc.dim, scale)
			ropeInvRef(want, tc.p0+qi, freq, tc.dim)
			if r := computetest.MaxRel(got[qi*tc.heads*tc.dim:(qi+1)*tc.heads*tc.dim], want); !(r <= attnDecTol) {
				t.Errorf("%s: query %d: max rel. error %.3g vs float64 > %.3g", tc.name, qi, r, attnDecTol)
			}
		}
	})
}

// TestAttentionDecodeInvRoPERejects checks that a bad rotation is an error
// naming it, before anything touches the device (no GPU needed).
func TestAttentionDecodeInvRoPERejects(t *testing.T) {
	ok := AttnParams{O: 1, Q: 1, Ring: 1, Sinks: 1, Pos: 1, RingRows: 131, Window: 128, T: 4, Heads: 64, Dim: 512, MaxKeys: 640, Scale: 1}
	var c *Ctx // never reached: every case fails validation first
	for _, tc := range []struct {
		name string
		freq DevicePtr
		nf   int
		p    func(p *AttnParams)
		want string
	}{
		{"no table", 0, 32, nil, "inverse RoPE of 32 frequencies"},
		{"no frequencies", 1, 0, nil, "inverse RoPE of 0 frequencies"},
		{"negative", 1, -2, nil, "inverse RoPE of -2"},
		{"more than half the head", 1, 257, nil, "width 512"},
		{"bad attention", 1, 32, func(p *AttnParams) { p.Q = 0 }, "nil buffer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := ok
			if tc.p != nil {
				tc.p(&p)
			}
			err := c.AttentionDecodeInvRoPE(p, tc.freq, tc.nf, 1, Stream{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	// The internal path checks the rotation too.
	if err := c.attentionDecodeVR(ok, 1, attnDecVariants[0], attnDecRoPE{freq: 0, nf: 4}, Stream{}); err == nil || !strings.Contains(err.Error(), "inverse RoPE") {
		t.Errorf("rotation without a table: %v, want an error naming the inverse RoPE", err)
	}
}

// TestAttentionDecodeNormQ checks AttentionDecodeNormQ on raw queries
// against the chain it replaces (RowOps' per-head RMSNorm and RoPE of the
// queries, then AttentionDecodeInvRoPE: within attnDecTol, the sums of
// squares running in another order) and against float64 (the queries
// normalized and rotated, the attention, the output rotated back:
// attnDecTol), and that it leaves the queries as they were.
func TestAttentionDecodeNormQ(t *testing.T) {
	const eps = 1e-6
	withFwd(t, func(e *fwdEnv) {
		if err := e.c.LoadAttnDec(); err != nil {
			t.Fatal(err)
		}
		if err := e.c.LoadFuse(); err != nil {
			t.Fatal(err)
		}
		for ci, tc := range attnDecCases {
			nf := map[int]int{512: 32, 256: 64, 128: 5}[tc.dim]
			// Not a subtest: t.Run would move the case off the device's
			// locked OS thread (CUDA_ERROR_INVALID_CONTEXT).
			d := tc.data(uint64(200 + ci))
			n := tc.T * tc.heads * tc.dim
			scale := 1 / math.Sqrt(float64(tc.dim))
			freq := ropeFreqs(nf)
			dfreq := e.up(freq)
			p := tc.params(e, d, scale)
			raw := p.Q
			scratch, err := e.a.Alloc(AttentionDecodeScratchBytes(tc.heads, tc.dim, tc.T, d.maxKeys))
			if err != nil {
				t.Fatal(err)
			}
			s := e.c.Stream()
			// The chain, on a prepared copy of the queries.
			prepped := e.up(d.q)
			if err := e.c.RowOps([]RowOp{{Y: prepped, X: prepped, Rows: tc.T * tc.heads, Dim: tc.dim, Heads: tc.heads, Norm: true, Eps: eps,
				NFreq: nf, Freq: dfreq, Pos: p.Pos}}, s); err != nil {
				t.Fatal(err)
			}
			pc := p
			pc.Q = prepped
			if err := e.c.AttentionDecodeInvRoPE(pc, dfreq, nf, scratch, s); err != nil {
				t.Fatal(err)
			}
			chain := e.down(p.O, n)
			if err := e.c.Memset(p.O, 0xff, 4*n, s); err != nil {
				t.Fatal(err)
			}
			if err := e.c.AttentionDecodeNormQ(p, eps, dfreq, nf, scratch, s); err != nil {
				t.Fatal(err)
			}
			got := e.down(p.O, n)
			if r := computetest.MaxRel(got, f64s(chain)); !(r <= attnDecTol) {
				t.Errorf("%s: vs RowOps+AttentionDecodeInvRoPE max rel. error %.3g > %.3g", tc.name, r, attnDecTol)
			}
			if q := e.down(raw, n); !bitsEqual(q, d.q) {
				t.Errorf("%s: the queries were written", tc.name)
			}
			var worst float64
			for qi := range tc.T {
				qd := f64s(d.q[qi*tc.heads*tc.dim : (qi+1)*tc.heads*tc.dim])
				for h := range tc.heads {
					v := qd[h*tc.dim : (h+1)*tc.dim]
					var ss float64
					for _, x := range v {
						ss += x * x
					}
					inv := 1 / math.Sqrt(ss/float64(tc.dim)+eps)
					for i := range v {
						v[i] *= inv
					}
				}
				ropeInvRef(qd, -(tc.p0 + qi), freq, tc.dim) // the forward rotation: the angle's sign flipped
				qf := make([]float32, len(qd))
				for i, x := range qd {
					qf[i] = float32(x)
				}
				want := attnDecRef(qf, tc.keyList(d, qi), d.sinks, tc.heads, tc.dim, scale)
				ropeInvRef(want, tc.p0+qi, freq, tc.dim)
				rq := computetest.MaxRel(got[qi*tc.heads*tc.dim:(qi+1)*tc.heads*tc.dim], want)
				worst = max(worst, rq)
				if !(rq <= attnDecTol) {
					t.Errorf("%s: query %d (position %d): max rel. error %.3g vs float64 > %.3g", tc.name, qi, tc.p0+qi, rq, attnDecTol)
				}
			}
			t.Logf("%s: %d frequencies, vs float64 %.3g", tc.name, nf, worst)
		}
	})
}

// TestAttentionDecodeNormQRejects checks that a bad query epsilon or
// rotation is an error naming it, before anything touches the device (no
// GPU needed).
func TestAttentionDecodeNormQRejects(t *testing.T) {
	ok := AttnParams{O: 1, Q: 1, Ring: 1, Sinks: 1, Pos: 1, RingRows: 131, Window: 128, T: 1, Heads: 64, Dim: 512, MaxKeys: 640, Scale: 1}
	var c *Ctx // never reached: every case fails validation first
	for _, tc := range []struct {
		name string
		eps  float32
		nf   int
		want string
	}{
		{"zero epsilon", 0, 32, "epsilon 0"},
		{"negative epsilon", -1e-6, 32, "epsilon -1e-06"},
		{"NaN epsilon", float32(math.NaN()), 32, "epsilon NaN"},
		{"infinite epsilon", float32(math.Inf(1)), 32, "epsilon +Inf"},
		{"no frequencies", 1e-6, 0, "inverse RoPE of 0 frequencies"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.AttentionDecodeNormQ(ok, tc.eps, 1, tc.nf, 1, Stream{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestParseAttnDecChoice(t *testing.T) {
	cases := []struct {
		in      string
		want    AttnDecChoice
		wantErr string
	}{
		{"", AttnDecChoice{}, ""},
		{"g8k16", AttnDecChoice{Variant: "g8k16"}, ""},
		{"g8k16db:16", AttnDecChoice{Variant: "g8k16db", MaxSplits: 16}, ""},
		{"g16k16:64", AttnDecChoice{Variant: "g16k16", MaxSplits: 64}, ""},
		{"g8k16:65", AttnDecChoice{}, "splits"},
		{"g8k16:0", AttnDecChoice{}, "splits"},
		{"g8k16:x", AttnDecChoice{}, "splits"},
		{"g9k16", AttnDecChoice{}, "unknown tiling"},
		{":8", AttnDecChoice{}, "unknown tiling"},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			got, err := ParseAttnDecChoice(c.in)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("ParseAttnDecChoice(%q) = %v, %v; want an error about %q", c.in, got, err, c.wantErr)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("ParseAttnDecChoice(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
			}
		})
	}
	// Every choice's scratch fits AttentionDecodeScratchBytes, and fits
	// follows the tiling's head grouping.
	for _, v := range attnDecVariants {
		for _, sp := range []int{1, 4, 16, 64} {
			ch := AttnDecChoice{Variant: v.Name, MaxSplits: sp}
			w, err := ch.variant()
			if err != nil {
				t.Fatal(err)
			}
			for _, keys := range []int{1, 160, 640, 2176} {
				if need, have := 4*w.splits(keys)*64*(512+2), AttentionDecodeScratchBytes(64, 512, 1, keys); need > have {
					t.Errorf("%+v at %d keys needs %d scratch bytes, AttentionDecodeScratchBytes gives %d", ch, keys, need, have)
				}
			}
		}
		if got, want := (AttnDecChoice{Variant: v.Name}).Fits(8, 512), 8%v.G == 0; got != want {
			t.Errorf("%s Fits(8 heads) = %v, want %v", v.Name, got, want)
		}
	}
}

// TestAttentionDecodeEarly checks that the early promises
// (AttnDecChoice.Early: the positions and the first tile's ring rows, and
// entries without idx, read before the partial kernel's wait) change no
// bit: on every case, the default tiling (one key buffer) and g8k16db (two)
// with and without them, with the inverse rotation. The inputs come from
// host copies, so the promises hold. Bad promises are errors.
func TestAttentionDecodeEarly(t *testing.T) {
	withFwd(t, func(e *fwdEnv) {
		if err := e.c.LoadAttnDec(); err != nil {
			t.Fatal(err)
		}
		s := e.c.Stream()
		for ci, tc := range attnDecCases {
			// Not a subtest: t.Run would move the case off the device's
			// locked OS thread (CUDA_ERROR_INVALID_CONTEXT).
			d := tc.data(uint64(500 + ci))
			n := tc.T * tc.heads * tc.dim
			nf := min(32, tc.dim/8)
			dfreq := e.up(ropeFreqs(nf))
			p := tc.params(e, d, 1/math.Sqrt(float64(tc.dim)))
			scratch, err := e.a.Alloc(AttentionDecodeScratchBytes(tc.heads, tc.dim, tc.T, d.maxKeys))
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{attnDecVariants[0].Name, "g8k16db"} {
				if v, _ := attnDecFind(name); !v.fits(tc.heads, tc.dim) {
					continue
				}
				var ref []float32
				for _, early := range []AttnDecEarly{0, AttnEarlyKeys, AttnEarlyKeys | AttnEarlyComp} {
					if err := e.c.Memset(p.O, 0xff, 4*n, s); err != nil {
						t.Fatal(err)
					}
					if err := e.c.AttentionDecodeInvRoPEWith(p, dfreq, nf, scratch, AttnDecChoice{Variant: name, Early: early}, s); err != nil {
						t.Fatalf("%s: %s early %d: %v", tc.name, name, early, err)
					}
					got := e.down(p.O, n)
					if early == 0 {
						ref = got
						continue
					}
					if !bitsEqual(got, ref) {
						t.Errorf("%s: %s with early promises %d: not the bits without them (max rel. difference %.3g)", tc.name, name, early, computetest.MaxRel(got, f64s(ref)))
					}
				}
			}
		}
		ok := AttnParams{O: 1, Q: 1, Ring: 1, Sinks: 1, Pos: 1, T: 1, Window: 4, RingRows: 4, Heads: 64, Dim: 512, MaxKeys: 4}
		for _, bad := range []AttnDecEarly{AttnEarlyComp, 4, -1} {
			if err := e.c.AttentionDecodeInvRoPEWith(ok, 1, 32, 1, AttnDecChoice{Early: bad}, s); err == nil || !strings.Contains(err.Error(), "early") {
				t.Errorf("early %d: err = %v, want one about the promises", bad, err)
			}
		}
	})
}

// TestAttnDecEarlyRejects checks, without a device (the promises are
// checked before anything touches it), that AttnEarlyComp alone and
// unknown bits are errors naming the promises.
func TestAttnDecEarlyRejects(t *testing.T) {
	var c *Ctx
	p := AttnParams{O: 1, Q: 1, Ring: 1, Sinks: 1, Pos: 1, T: 1, Window: 4, RingRows: 4, Heads: 64, Dim: 512, MaxKeys: 4}
	for _, bad := range []AttnDecEarly{AttnEarlyComp, 4, -1, AttnEarlyKeys | 8} {
		if err := c.AttentionDecodeInvRoPEWith(p, 1, 32, 1, AttnDecChoice{Early: bad}, Stream{}); err == nil || !strings.Contains(err.Error(), "early") {
			t.Errorf("early %d: err = %v, want one about the promises", bad, err)
		}
	}
}
