package cuda

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"

	"moxie/compute"
)

// BenchmarkMoEDecode times the fused MoE decode of one token at V4-Flash
// shapes (D 4096, expert width 2048, 6 of 32 resident MXFP4 experts, FP8
// shared expert of width 2048) for every MoEVariant, and the existing
// 12-kernel path (RunExperts13, SwiGLU, RunExperts2, AddRows, Memset, shared
// w1, w3, SwiGLU, w2, Axpy; captured as CUDA graphs) for comparison.
// Consecutive launches use disjoint experts (ids rotate through the 32) and
// one of 4 shared-expert copies, so weights come from HBM, not L2 (≥ 5× L2
// between reuses). Each sub-benchmark times itself with CUDA events (median
// of 15 repetitions of 40 launches behind a spin kernel); run it with
// -test.benchtime 1x. Metrics: us/op, GB/s and %HBM of the weight bytes
// (data + scales) read, against read_bw4's ceiling measured first.
// Sub-benchmarks: <variant>/stage1, <variant>/stage2, <variant>/both (with
// the shared expert), <variant>/routed (both stages, no shared expert),
// <variant>/graph (both, with the shared expert, replayed as a captured
// CUDA graph: the decode step's figure), baseline/both, baseline/routed. MOXIE_BENCH_MOE=u8,persist,baseline limits the
// variants (names as MoEVariant.String, and baseline).
func BenchmarkMoEDecode(b *testing.B) {
	dev := testDevice(b)
	hbm, err := dev.ReadBandwidth(4<<30, 11)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("HBM read ceiling %.0f GB/s", hbm/1e9)
	const E, K, D, I, Is, nsh, nrot = 32, 6, 4096, 2048, 2048, 4, 16
	var results []moeResult
	err = dev.Do(func(c *Ctx) error {
		lin, err := c.linearModule()
		if err != nil {
			return err
		}
		spin, err := lin.Kernel("spin")
		if err != nil {
			return err
		}
		fw, err := c.Fwd()
		if err != nil {
			return err
		}
		rng := rand.New(rand.NewPCG(42, 9))
		d1, d3, d2 := randomWeight(rng, compute.MXFP4, I, D), randomWeight(rng, compute.MXFP4, I, D), randomWeight(rng, compute.MXFP4, D, I)
		s1, s3, s2 := randomWeight(rng, compute.FP8Block, Is, D), randomWeight(rng, compute.FP8Block, Is, D), randomWeight(rng, compute.FP8Block, D, Is)
		size := func(ds ...compute.WeightData) int {
			n := 0
			for _, d := range ds {
				n += len(d.Data) + len(d.Scale) + 512
			}
			return n
		}
		a, err := c.NewArena(E*size(d1, d3, d2) + nsh*size(s1, s3, s2) + 64<<20)
		if err != nil {
			return err
		}
		defer c.ReleaseArena(a)
		// copies returns n device copies of d (the first uploaded, the
		// others copied on the device).
		copies := func(d compute.WeightData, n int) ([]*DeviceWeight, error) {
			w0, err := c.UploadWeight(a, d)
			if err != nil {
				return nil, err
			}
			ws := []*DeviceWeight{w0}
			for len(ws) < n {
				w := *w0
				if w.Data, err = a.Alloc(len(d.Data)); err != nil {
					return nil, err
				}
				if err := c.CopyAsync(w.Data, w0.Data, len(d.Data), c.Stream()); err != nil {
					return nil, err
				}
				if w.Scale, err = a.Alloc(len(d.Scale)); err != nil {
					return nil, err
				}
				if err := c.CopyAsync(w.Scale, w0.Scale, len(d.Scale), c.Stream()); err != nil {
					return nil, err
				}
				ws = append(ws, &w)
			}
			return ws, nil
		}
		var w1s, w3s, w2s, sh1, sh3, sh2 []*DeviceWeight
		for _, p := range []struct {
			d   compute.WeightData
			n   int
			dst *[]*DeviceWeight
		}{{d1, E, &w1s}, {d3, E, &w3s}, {d2, E, &w2s}, {s1, nsh, &sh1}, {s3, nsh, &sh3}, {s2, nsh, &sh2}} {
			if *p.dst, err = copies(p.d, p.n); err != nil {
				return err
			}
		}
		tab, err := c.PrepareExpertTable(a, w1s, w3s, w2s)
		if err != nil {
			return err
		}
		alloc := func(n int) DevicePtr {
			p, e := a.Alloc(4 * n)
			if e != nil && err == nil {
				err = e
			}
			return p
		}
		x, out := alloc(D), alloc(D)
		ids, rw := alloc(nrot*K), alloc(K)
		g, u, h, y := alloc(K*I), alloc(K*I), alloc(K*I), alloc(K*D)
		gs, us, hs, ys := alloc(Is), alloc(Is), alloc(Is), alloc(D)
		if err != nil {
			return err
		}
		xv := make([]float32, D)
		for i := range xv {
			xv[i] = float32(rng.NormFloat64())
		}
		if err := c.CopyFloatsToDevice(x, xv); err != nil {
			return err
		}
		if err := c.CopyFloatsToDevice(rw, []float32{0.3, 0.2, 0.2, 0.1, 0.1, 0.1}); err != nil {
			return err
		}
		idv := make([]byte, 4*nrot*K)
		for r := range nrot {
			for j := range K {
				idv[4*(r*K+j)] = byte((r*K + j) % E)
			}
		}
		if err := c.CopyToDevice(ids, idv); err != nil {
			return err
		}
		idsAt := func(i int) DevicePtr { return ids + DevicePtr(4*K*(i%nrot)) }
		shared := func(i int) *SharedExpert {
			return &SharedExpert{W1: sh1[i%nsh], W3: sh3[i%nsh], W2: sh2[i%nsh]}
		}
		// Measured here on the device's OS thread; reported by sub-benchmarks
		// after Do returns (b.Run would move the work off the thread).
		bench := func(name string, bytes int, launch func(i int) error) {
			for i := range 2 * nrot { // warm-up
				if err := launch(i); err != nil {
					results = append(results, moeResult{name: name, err: err})
					return
				}
			}
			ts, err := timed(c, spin, 40, 15, launch)
			results = append(results, moeResult{name: name, ts: ts, bytes: bytes, err: err})
		}
		want := os.Getenv("MOXIE_BENCH_MOE")
		for v := range moeVariantCount {
			if want != "" && !slices.Contains(strings.Split(want, ","), v.String()) {
				continue
			}
			ms := make([]*MoEDecode, nsh)
			for i := range ms {
				if ms[i], err = c.PrepareMoEDecode(a, tab, K, shared(i), x, out, 10, v); err != nil {
					return err
				}
			}
			routed, err := c.PrepareMoEDecode(a, tab, K, nil, x, out, 10, v)
			if err != nil {
				return err
			}
			m := ms[0]
			bench(v.String()+"/stage1", m.Bytes1, func(i int) error { return c.runMoEStage1(ms[i%nsh], idsAt(i), rw, c.Stream()) })
			bench(v.String()+"/stage2", m.Bytes2, func(i int) error { return c.runMoEStage2(ms[i%nsh], idsAt(i), c.Stream()) })
			bench(v.String()+"/both", m.Bytes1+m.Bytes2, func(i int) error { return c.RunMoEDecode(ms[i%nsh], idsAt(i), rw, c.Stream()) })
			bench(v.String()+"/routed", routed.Bytes1+routed.Bytes2, func(i int) error { return c.RunMoEDecode(routed, idsAt(i), rw, c.Stream()) })
			// Both stages as a captured graph (as the decode step runs them),
			// one graph per ids rotation (and its shared copy).
			s := c.Stream()
			gr := make([]*Graph, 0, nrot)
			for r := range nrot {
				if err := c.BeginCapture(s); err != nil {
					return err
				}
				if err := c.RunMoEDecode(ms[r%nsh], idsAt(r), rw, s); err != nil {
					_, _ = c.EndCapture(s)
					return err
				}
				graph, err := c.EndCapture(s)
				if err != nil {
					return fmt.Errorf("capturing %v: %w", v, err)
				}
				gr = append(gr, graph)
			}
			bench(v.String()+"/graph", m.Bytes1+m.Bytes2, func(i int) error { return c.LaunchGraph(gr[i%nrot], s) })
			for _, graph := range gr {
				if err := c.DestroyGraph(graph); err != nil {
					return err
				}
			}
			for _, mm := range append(ms, routed) {
				if err := mm.Free(a); err != nil {
					return err
				}
			}
		}
		if want != "" && !slices.Contains(strings.Split(want, ","), "baseline") {
			return nil
		}
		// The existing path, one CUDA graph per (ids rotation, shared copy).
		run, err := c.PrepareExpertRun(a, tab, K, x, g, u, h, y)
		if err != nil {
			return err
		}
		s := c.Stream()
		capture := func(r int, withShared bool, graph bool) (*Graph, error) {
			if graph {
				if err := c.BeginCapture(s); err != nil {
					return nil, err
				}
			}
			steps := []func() error{
				func() error { return c.Memset(out, 0, 4*D, s) },
				func() error { return fw.RunExperts13(c, run, idsAt(r), s) },
				func() error { return c.SwiGLU(h, g, u, rw, K, I, 10, s) },
				func() error { return fw.RunExperts2(c, run, s) },
				func() error { return fw.AddRows(c, out, y, K, D, s) },
			}
			if withShared {
				sx := shared(r)
				steps = append(steps,
					func() error { return c.Linear(sx.W1, gs, x, 1, s) },
					func() error { return c.Linear(sx.W3, us, x, 1, s) },
					func() error { return c.SwiGLU(hs, gs, us, 0, 1, Is, 0, s) },
					func() error { return c.Linear(sx.W2, ys, hs, 1, s) },
					func() error { return c.Axpy(out, ys, 1, D, s) })
			}
			for _, f := range steps {
				if err := f(); err != nil {
					if graph {
						_, _ = c.EndCapture(s)
					}
					return nil, err
				}
			}
			if !graph {
				return nil, c.Sync(s)
			}
			return c.EndCapture(s)
		}
		// One uncaptured run first: every module the path needs is loaded
		// before capturing.
		if _, err := capture(0, true, false); err != nil {
			return fmt.Errorf("the baseline path: %w", err)
		}
		for _, withShared := range []bool{true, false} {
			gr := make([]*Graph, nrot)
			for r := range gr {
				if gr[r], err = capture(r, withShared, true); err != nil {
					return fmt.Errorf("capturing the baseline: %w", err)
				}
			}
			bytes := K * (w1s[0].Bytes + w3s[0].Bytes + w2s[0].Bytes)
			name := "baseline/routed"
			if withShared {
				bytes += sh1[0].Bytes + sh3[0].Bytes + sh2[0].Bytes
				name = "baseline/both"
			}
			bench(name, bytes, func(i int) error { return c.LaunchGraph(gr[i%nrot], s) })
			for _, g := range gr {
				if err := c.DestroyGraph(g); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	report := func(b *testing.B, ts []float64, bytes int) {
		us := median(ts)
		gbps := float64(bytes) / (us * 1e3)
		b.ReportMetric(us, "us/op")
		b.ReportMetric(slices.Min(ts), "us_min")
		b.ReportMetric(gbps, "GB/s")
		b.ReportMetric(100*gbps*1e9/hbm, "%HBM")
	}
	for _, r := range results {
		b.Run(r.name, func(b *testing.B) {
			if r.err != nil {
				b.Fatal(r.err)
			}
			report(b, r.ts, r.bytes)
		})
	}
}

// moeResult is one sub-benchmark's timings (µs per launch), measured on the
// device thread and reported afterwards.
type moeResult struct {
	name  string
	ts    []float64
	bytes int
	err   error
}
