package dsv4

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"moxie/checkpoint"
	"moxie/compute/cpu"
	"moxie/compute/cuda"
	"moxie/sample"
)

// The device tests compare the GPU-resident forward pass (DeviceSession) with
// the CPU Session on the same checkpoint, and with the oracle's golden logits.
// They skip when no GPU is usable (cuda.Open fails). Run from the package
// directory (testdata/ is read relative to it), e.g. on the GPU machine:
//
//	cd dsv4 && ../.carry/dsv4.test -test.run Device -test.v

var testDevice struct {
	once sync.Once
	d    *cuda.Device
	err  error
}

// deviceForTest opens GPU 0 once per test binary (never closed: the process
// exit releases it).
func deviceForTest(t testing.TB) *cuda.Device {
	t.Helper()
	testDevice.once.Do(func() { testDevice.d, testDevice.err = cuda.Open(0) })
	if testDevice.err != nil {
		t.Skipf("no GPU: %v", testDevice.err)
	}
	return testDevice.d
}

// loadDeviceModel loads spec with Options.Device set (plus opts).
func loadDeviceModel(t testing.TB, spec string, opts Options) *Model {
	t.Helper()
	dev := deviceForTest(t)
	src, err := checkpoint.Open(spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	be := cpu.New(2)
	t.Cleanup(be.Close)
	opts.Backend, opts.Device = be, dev
	t0 := time.Now()
	m, err := Load(src, opts)
	if err != nil {
		t.Fatalf("Load(%s) with a device: %v", spec, err)
	}
	t.Cleanup(func() { m.Close() })
	t.Logf("%s on %s: %d bytes of weights resident, loaded in %v", spec, dev.Info(), m.DeviceBytes(), time.Since(t0).Round(time.Millisecond))
	return m
}

// tinyPair loads synth:tiny on the device (with opts) and on the CPU.
func tinyPair(t testing.TB, opts Options) (dev, host *Model) {
	t.Helper()
	dev = loadDeviceModel(t, "synth:tiny", opts)
	src, err := checkpoint.Open("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	return dev, loadTiny(t, src)
}

func newDeviceSession(t testing.TB, m *Model) *DeviceSession {
	t.Helper()
	s, err := m.NewDeviceSession()
	if err != nil {
		t.Fatalf("NewDeviceSession: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// runSchedule feeds toks to run in chunks (PrefillAll each) and returns all logits.
func runSchedule(t testing.TB, prefillAll func([]int) ([]float32, error), toks []int, chunks []int) []float32 {
	t.Helper()
	var out []float32
	at := 0
	for _, n := range chunks {
		l, err := prefillAll(toks[at : at+n])
		if err != nil {
			t.Fatalf("chunk [%d, %d): %v", at, at+n, err)
		}
		out = append(out, l...)
		at += n
	}
	return out
}

// decodeSchedule is one prefill of n tokens, then one decode step per token.
func decodeSchedule(total, n int) []int {
	s := []int{n}
	for range total - n {
		s = append(s, 1)
	}
	return s
}

// compareDevice checks every position's logits: max|a−b|/max|b| ≤ tol and
// the same argmax; it logs the worst error and lists the first failures.
func compareDevice(t *testing.T, what string, got, want []float32, V int, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d logits from the device, want %d (%d positions)", what, len(got), len(want), len(want)/V)
	}
	worst, bad := 0.0, 0
	for i := 0; i < len(want)/V; i++ {
		a, b := got[i*V:(i+1)*V], want[i*V:(i+1)*V]
		r := maxRel(a, b)
		if r > worst || r != r {
			worst = r
		}
		if r > tol || r != r || argmax(a) != argmax(b) {
			bad++
			if bad <= 10 {
				t.Errorf("%s: position %d: max|dev-ref|/max|ref| = %.3g (limit %.0g), argmax %d vs %d", what, i, r, tol, argmax(a), argmax(b))
			}
		}
	}
	if bad > 10 {
		t.Errorf("%s: %d positions failed in all", what, bad)
	}
	t.Logf("%s: worst per-position relative error %.3g over %d positions", what, worst, len(want)/V)
}

// diagnoseLayers reruns toks as one prefill on both sides with layer hooks
// and logs how far the device's streams are from the CPU's after each layer
// (the first layer that diverges localises a failure).
func diagnoseLayers(t *testing.T, mc, md *Model, toks []int) {
	t.Helper()
	var cpuX, devX [][]float32
	cs := mc.NewSession()
	cs.layerHook = func(l int, X []float32) { cpuX = append(cpuX, append([]float32(nil), X...)) }
	if _, err := cs.PrefillAll(toks); err != nil {
		t.Logf("diagnosis: CPU prefill: %v", err)
		return
	}
	ds, err := md.NewDeviceSession()
	if err != nil {
		t.Logf("diagnosis: %v", err)
		return
	}
	defer ds.Close()
	ds.layerHook = func(l int, X []float32) { devX = append(devX, append([]float32(nil), X...)) }
	if _, err := ds.PrefillAll(toks); err != nil {
		t.Logf("diagnosis: device prefill: %v", err)
		return
	}
	c := mc.Cfg
	n := c.HCMult * c.Dim
	for l := range min(len(cpuX), len(devX)) {
		first := -1
		for i := 0; i < len(toks) && i*n < len(cpuX[l]); i++ {
			if maxRel(devX[l][i*n:(i+1)*n], cpuX[l][i*n:(i+1)*n]) > 1e-4 {
				first = i
				break
			}
		}
		t.Logf("diagnosis: layer %d (%v, ratio %d, hash %v): streams max rel diff %.3g, first position above 1e-4: %d",
			l, c.Kind(l), c.Ratio(l), c.HashRouted(l), maxRel(devX[l], cpuX[l]), first)
	}
}

// selections runs toks through a session's hook and returns layer → pos → sorted selection.
func recordSelections(set func(func(layer, pos int, sel []int))) map[int]map[int][]int {
	out := map[int]map[int][]int{}
	set(func(l, p int, sel []int) {
		if out[l] == nil {
			out[l] = map[int][]int{}
		}
		out[l][p] = slices.Sorted(slices.Values(sel))
	})
	return out
}

// TestDeviceTiny compares the device forward pass with the CPU one on
// synth:tiny (every block type: window, CSA with indexer top-4, HCA ratio 8,
// hash and score routing, shared expert) for prefill, chunked prefill,
// decode after prefill and pure decode, and the indexer's selections.
func TestDeviceTiny(t *testing.T) {
	md, mc := tinyPair(t, Options{})
	V := mc.Cfg.VocabSize
	toks := testTokens(40, V, 11)
	cpuFull, err := mc.NewSession().PrefillAll(toks)
	if err != nil {
		t.Fatal(err)
	}
	if md.dev.tableErr != nil {
		t.Errorf("decode cannot select experts on the device (it routes through the host): %v", md.dev.tableErr)
	}
	cases := []struct {
		name      string
		chunks    []int
		noGraphs  bool
		noGrouped bool
		hostMoE   bool
		headRows  int    // > 0: the LM head runs in blocks of this many rows
		prefetch  string // $MOXIE_CUDA_PREFETCH for the session
		env       string // NAME=value set for the session (a MOXIE_CUDA_ switch)
	}{
		{"prefill40", []int{40}, false, false, false, 0, "", ""},
		{"prefill40 one head per block", []int{40}, false, true, false, 0, "", ""},
		{"prefill40 experts grouped on the host", []int{40}, false, false, true, 0, "", ""},
		{"chunked 13+11+16", []int{13, 11, 16}, false, false, false, 0, "", ""},
		{"prefill17 then decode", decodeSchedule(40, 17), false, false, false, 0, "", ""},
		{"prefill17 then decode without graphs", decodeSchedule(40, 17), true, false, false, 0, "", ""},
		{"decode only", decodeSchedule(40, 1), false, false, false, 0, "", ""},
		{"chunks 3+5+8+1+23", []int{3, 5, 8, 1, 23}, false, false, false, 0, "", ""},
		{"prefill40 head in blocks of 7", []int{40}, false, false, false, 7, "", ""},
		{"chunks 13+11+16 head in blocks of 1", []int{13, 11, 16}, false, false, false, 1, "", ""},
		{"prefill17 then decode with every L2 prefetch", decodeSchedule(40, 17), false, false, false, 0, "all", ""},
		{"decode only with L2 prefetch by lines", decodeSchedule(40, 1), false, false, false, 0, "q,o,s:lines", ""},
		{"decode only with wo_a and the MoE's first weights prefetched", decodeSchedule(40, 1), false, false, false, 0, "a,m:bulk_el", ""},
		{"prefill17 then decode, queries prepared in the kernels", decodeSchedule(40, 17), false, false, false, 0, "", "MOXIE_CUDA_QPREP=on"},
		{"decode only, compressors stored and closed by four launches", decodeSchedule(40, 1), false, false, false, 0, "", "MOXIE_CUDA_COMPSTEP=off"},
		// A conversation: prompt, answer, the next prompt continues the
		// sequence after captured decode steps, and so on.
		{"chat turns: 12, 4 decodes, 9, 4 decodes, 11", []int{12, 1, 1, 1, 1, 9, 1, 1, 1, 1, 11}, false, false, false, 0, "", ""},
		{"prefill17 then decode, logits copied from device memory (pageable)", decodeSchedule(40, 17), false, false, false, 0, "", "MOXIE_CUDA_LOGITS=pageable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// The CPU reference with the same schedule (its chunkings agree
			// with each other to 1e-5: TestPrefillChunkDecodeAgree).
			cs := mc.NewSession()
			want := runSchedule(t, cs.PrefillAll, toks, tc.chunks)
			if tc.prefetch != "" {
				t.Setenv("MOXIE_CUDA_PREFETCH", tc.prefetch)
			}
			if name, value, ok := strings.Cut(tc.env, "="); ok {
				t.Setenv(name, value)
			}
			ds := newDeviceSession(t, md)
			if on := tc.env == "MOXIE_CUDA_QPREP=on"; ds.qPrep != on {
				t.Errorf("%s: the session's qPrep is %v", tc.env, ds.qPrep)
			}
			if on := tc.env != "MOXIE_CUDA_COMPSTEP=off"; ds.compOne != on {
				t.Errorf("%s: the session's compOne is %v", tc.env, ds.compOne)
			}
			if on := tc.env != "MOXIE_CUDA_LOGITS=pageable"; ds.pinnedLogits != on {
				t.Errorf("%s: the session's pinnedLogits is %v", tc.env, ds.pinnedLogits)
			}
			if tc.prefetch != "" && !ds.pf.ok {
				t.Errorf("MOXIE_CUDA_PREFETCH=%s: prefetching is off in the session", tc.prefetch)
			}
			ds.UseGraphs(!tc.noGraphs)
			ds.UseGroupedAttention(!tc.noGrouped)
			ds.UseDeviceExperts(!tc.hostMoE)
			if tc.headRows > 0 {
				ds.headRows = min(ds.headRows, tc.headRows) // the logits buffer holds at least this many rows
			}
			if ds.tiles == nil {
				t.Errorf("no device expert tiles (prefill groups experts on the host): %v", ds.runErr)
			}
			got := runSchedule(t, ds.PrefillAll, toks, tc.chunks)
			if ds.Pos() != len(toks) || ds.Len() != len(toks) {
				t.Errorf("Pos %d, Len %d after %d tokens", ds.Pos(), ds.Len(), len(toks))
			}
			if ds.runErr != nil {
				t.Errorf("expert runs: %v", ds.runErr)
			}
			if ds.graphErr != nil {
				t.Errorf("decode graph capture failed (the steps ran uncaptured): %v", ds.graphErr)
			}
			decodes := 0 // single-token chunks after the first: decode steps (the first runs uncaptured, the second captures)
			for _, n := range tc.chunks[1:] {
				if n == 1 {
					decodes++
				}
			}
			if !tc.noGraphs && decodes >= 2 && ds.graph == nil {
				t.Errorf("%d decode steps and no captured graph", decodes)
			}
			compareDevice(t, "device vs CPU", got, want, V, 1e-4)
			compareDevice(t, "device vs CPU single prefill", got, cpuFull, V, 1e-4)
			if t.Failed() {
				diagnoseLayers(t, mc, md, toks)
			}
		})
	}
	t.Run("prefill last row", func(t *testing.T) {
		ds := newDeviceSession(t, md)
		got, err := ds.Prefill(toks)
		if err != nil {
			t.Fatal(err)
		}
		compareDevice(t, "Prefill", got, cpuFull[(len(toks)-1)*V:], V, 1e-4)
	})
	for _, env := range []string{"", "pinned", "pageable"} {
		t.Run("decode logits into the caller's slice, MOXIE_CUDA_LOGITS="+env, func(t *testing.T) {
			// AppendInto's logits are Append's, in dst when it has room
			// and in a new slice when it has not; by default dst is
			// registered and downloaded into directly (two slices
			// alternating: each call registers anew).
			t.Setenv("MOXIE_CUDA_LOGITS", env)
			sched := decodeSchedule(len(toks), 17)
			want := runSchedule(t, newDeviceSession(t, md).PrefillAll, toks, sched)
			ds := newDeviceSession(t, md)
			ctx := context.Background()
			dsts := [][]float32{make([]float32, V+3), make([]float32, V)}
			small := make([]float32, V-1)
			var lastBig []float32
			at := 0
			for i, n := range sched {
				in := small
				if i%3 < 2 {
					in = dsts[i%3]
				}
				l, err := ds.AppendInto(ctx, toks[at:at+n], in)
				if err != nil {
					t.Fatal(err)
				}
				at += n
				switch {
				case len(l) != V:
					t.Fatalf("call %d: %d logits, want %d", i, len(l), V)
				case &in[0] == &l[0] && cap(in) < V:
					t.Errorf("call %d: logits written into a slice of capacity %d < %d", i, cap(in), V)
				case &in[0] != &l[0] && cap(in) >= V:
					t.Errorf("call %d: logits in a new slice although dst holds %d", i, cap(in))
				}
				if w := want[(at-1)*V : at*V]; !slices.Equal(l, w) {
					compareDevice(t, fmt.Sprintf("call %d: AppendInto vs PrefillAll", i), l, w, V, 0)
				}
				if cap(in) >= V {
					lastBig = in
				}
				if reg := ds.dstHost != nil; reg != (env == "") || reg && unsafe.Pointer(&ds.dstHost.Bytes()[0]) != unsafe.Pointer(&lastBig[0]) {
					t.Fatalf("call %d: dst registered %v, want %v (the last dst with room)", i, reg, env == "")
				}
			}
			ds.Close()
			if ds.dstHost != nil {
				t.Error("Close left the caller's slice registered")
			}
		})
	}
	t.Run("decode reduced for the sampler", func(t *testing.T) {
		// AppendReduce's reduction is the float64 reduction of the logits
		// the step computed (LastLogits): the argmax, and for random
		// sampling the sum and the candidates.
		ds := newDeviceSession(t, md)
		ctx := context.Background()
		if _, err := ds.Prefill(toks[:17]); err != nil {
			t.Fatal(err)
		}
		var r sample.Reduction
		for i, p := range []sample.Params{{}, {Temperature: 0.6, TopP: 0.95}, {Temperature: 1.5, MinP: 0.02}, {Temperature: 0.3, TopK: 5}, {}} {
			sp, err := sample.New(p)
			if err != nil {
				t.Fatal(err)
			}
			spec := sp.Reduce()
			if err := ds.AppendReduce(ctx, toks[17+i:18+i], spec, &r); err != nil {
				t.Fatal(err)
			}
			l, err := ds.LastLogits(nil)
			if err != nil {
				t.Fatal(err)
			}
			best, m := -1, math.Inf(-1)
			for id, v := range l {
				if float64(v) > m {
					best, m = id, float64(v)
				}
			}
			if r.N != V || r.Best != best || r.Bad {
				t.Fatalf("step %d %+v: N %d best %d bad %v, want %d %d false", i, p, r.N, r.Best, r.Bad, V, best)
			}
			if spec.Greedy {
				continue
			}
			var z float64
			var ids []int32
			var e []float64
			for id, v := range l {
				x := math.Exp((float64(v) - m) * spec.InvT)
				z += x
				if x > 0 && x >= spec.Threshold {
					ids, e = append(ids, int32(id)), append(e, x)
				}
			}
			if !r.Complete || !slices.Equal(r.IDs, ids) || math.Abs(r.Z-z) > 1e-12*z {
				t.Fatalf("step %d %+v: complete %v, z %v, ids %v; want z %v, ids %v", i, p, r.Complete, r.Z, r.IDs, z, ids)
			}
			for j := range e {
				if math.Abs(r.E[j]-e[j]) > 1e-14*e[j] {
					t.Fatalf("step %d: candidate %d e %v, want %v", i, ids[j], r.E[j], e[j])
				}
			}
		}
		ds.Close()
		if _, err := ds.LastLogits(nil); err == nil {
			t.Error("LastLogits after Close: no error")
		}
	})
	t.Run("step timing", func(t *testing.T) {
		// Timing a session's calls must not change its logits, and each
		// call's intervals are disjoint parts of its wall time.
		sched := decodeSchedule(len(toks), 17)
		want := runSchedule(t, newDeviceSession(t, md).PrefillAll, toks, sched)
		ds := newDeviceSession(t, md)
		if _, ok := ds.LastTiming(); ok {
			t.Error("LastTiming ok before any call")
		}
		ds.TimeSteps(true)
		var got []float32
		at := 0
		for i, n := range sched {
			l, err := ds.PrefillAll(toks[at : at+n])
			if err != nil {
				t.Fatal(err)
			}
			at += n
			got = append(got, l...)
			tm, ok := ds.LastTiming()
			if !ok {
				t.Fatalf("call %d: no timing with TimeSteps on", i)
			}
			parts := tm.Handoff + tm.Enqueue + tm.Wait + tm.Download + tm.Return
			if tm.Device <= 0 || tm.Device > tm.Wall || parts > tm.Wall || min(tm.Handoff, tm.Enqueue, tm.Wait, tm.Download, tm.Return) < 0 {
				t.Errorf("call %d (%d tokens): timing %+v: want 0 < Device <= Wall and non-negative parts adding up to at most Wall", i, n, tm)
			}
			if i == len(sched)-1 {
				t.Logf("last decode step: %+v", tm)
			}
		}
		if !slices.Equal(got, want) {
			compareDevice(t, "timed vs untimed session", got, want, V, 0)
			t.Error("a timed session's logits differ from an untimed one's")
		}
	})
	t.Run("indexer selections", func(t *testing.T) {
		cs := mc.NewSession()
		want := recordSelections(func(f func(int, int, []int)) { cs.selHook = f })
		if _, err := cs.PrefillAll(toks); err != nil {
			t.Fatal(err)
		}
		ds := newDeviceSession(t, md)
		got := recordSelections(func(f func(int, int, []int)) { ds.selHook = f })
		runSchedule(t, ds.PrefillAll, toks, decodeSchedule(len(toks), 9))
		n := 0
		for l, byPos := range want {
			for p, sel := range byPos {
				n++
				if !slices.Equal(got[l][p], sel) {
					t.Errorf("layer %d position %d: device selected %v, CPU %v", l, p, got[l][p], sel)
				}
			}
		}
		if n == 0 {
			t.Fatal("the CPU session reported no indexer selections")
		}
		t.Logf("%d selections compared", n)
	})
	t.Run("generate.Model", func(t *testing.T) {
		seq, err := md.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		defer seq.Close()
		if _, ok := seq.(*DeviceSession); !ok {
			t.Fatalf("NewSequence returned %T, want *DeviceSession", seq)
		}
		if md.MaxContext() != DefaultDeviceContext {
			t.Errorf("MaxContext %d, want the device context %d", md.MaxContext(), DefaultDeviceContext)
		}
		if _, err := seq.(*DeviceSession).Prefill([]int{V}); err == nil || !strings.Contains(err.Error(), "vocabulary") {
			t.Errorf("token %d (outside the vocabulary): error %v", V, err)
		}
	})
}

// TestDeviceLong runs 300 tokens through a device model with small chunks
// (MaxChunk 64, so the window ring and the compressor rings wrap many times
// and HCA/CSA windows close inside and across chunks; top-4 of up to 75
// entries) against the CPU, then checks the context limit.
func TestDeviceLong(t *testing.T) {
	if testing.Short() {
		t.Skip("long sequence")
	}
	md := loadDeviceModel(t, "synth:tiny", Options{MaxChunk: 64, DeviceContext: 320})
	src, err := checkpoint.Open("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	mc := loadTiny(t, src)
	V := mc.Cfg.VocabSize
	toks := testTokens(300, V, 3)
	for _, tc := range []struct {
		name   string
		chunks []int
	}{
		{"prefill200 then decode", decodeSchedule(300, 200)},
		{"odd chunks", []int{1, 63, 64, 65, 7, 100}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := runSchedule(t, mc.NewSession().PrefillAll, toks, tc.chunks)
			ds := newDeviceSession(t, md)
			got := runSchedule(t, ds.PrefillAll, toks, tc.chunks)
			compareDevice(t, "device vs CPU", got, want, V, 1e-4)
			if t.Failed() {
				diagnoseLayers(t, mc, md, toks[:64])
			}
		})
	}
	t.Run("context limit", func(t *testing.T) {
		ds := newDeviceSession(t, md)
		if _, err := ds.Prefill(toks[:300]); err != nil {
			t.Fatal(err)
		}
		_, err := ds.Prefill(toks[:21])
		if err == nil || !strings.Contains(err.Error(), "context of 320") {
			t.Errorf("21 tokens at position 300 of a 320-token device context: error %v, want one naming the context", err)
		}
	})
}

// TestDeviceGoldenTiny compares the device forward pass with the oracle's
// golden logits (testdata/golden/tiny, as TestGoldenTiny does for the CPU):
// max|a−b|/max|b| ≤ 1e-4 and the same argmax per position, and the indexer's
// selections.
func TestDeviceGoldenTiny(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(goldenDir, "cases.json"))
	if err != nil {
		t.Skipf("no golden files (run from the dsv4 directory): %v", err)
	}
	md := loadDeviceModel(t, "synth:tiny", Options{})
	V := md.Cfg.VocabSize
	cases, err := parseGoldenCases(raw, V)
	if err != nil {
		t.Fatal(err)
	}
	for _, gc := range cases {
		t.Run(gc.Name, func(t *testing.T) {
			T := len(gc.Tokens)
			want := loadGolden(t, gc.Logits, T, V)
			s := newDeviceSession(t, md)
			sels := map[string]map[string][]int{}
			s.selHook = func(l, pos int, sel []int) {
				k := fmt.Sprint(l)
				if sels[k] == nil {
					sels[k] = map[string][]int{}
				}
				sels[k][fmt.Sprint(pos)] = slices.Sorted(slices.Values(sel))
			}
			got := runSchedule(t, s.PrefillAll, gc.Tokens, gc.schedule())
			compareLogits(t, "device cached", got, want, V)
			if gc.UncachedLogits != "" {
				compareLogits(t, "device vs uncached", got, loadGolden(t, gc.UncachedLogits, T, V), V)
			}
			compareSelections(t, gc.Name, sels)
		})
	}
}

// TestDeviceRejects checks the load-time errors of the device path.
func TestDeviceRejects(t *testing.T) {
	dev := deviceForTest(t)
	src, err := checkpoint.Open("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	be := cpu.New(1)
	defer be.Close()
	_, err = Load(src, Options{Backend: be, Device: dev, Experts: failingExperts{}})
	if err == nil || !strings.Contains(err.Error(), "Experts") {
		t.Errorf("Options.Experts with Options.Device: error %v, want one naming Experts", err)
	}
	m, err := Load(src, Options{Backend: be})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.NewDeviceSession(); err == nil {
		t.Error("NewDeviceSession on a model loaded without a device succeeded")
	}
}

var deviceBench struct {
	once sync.Once
	m    *Model
	err  error
}

// cachedSource memoises TensorData, so that Load's CPU binding and the device
// upload generate each synthetic tensor once (generation runs at tens of
// MB/s per core).
type cachedSource struct {
	checkpoint.Source
	mu sync.Mutex
	m  map[string][]byte
}

func (c *cachedSource) TensorData(name string) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d, ok := c.m[name]; ok {
		return d, nil
	}
	d, err := c.Source.TensorData(name)
	if err == nil {
		c.m[name] = d
	}
	return d, err
}

// DefaultDeviceBench is the benchmark model: the exact V4-Flash widths, 2
// window layers with hash routing, 16 routed experts per layer (a decode step
// reads 6 of them whatever the count, so bytes/token are those of 256) and
// no MTP block, which keeps the synthetic generation short.
const DefaultDeviceBench = "synth:flash?layers=2&experts=16&mtp=0"

// benchDeviceModel loads $MOXIE_DEVICE_BENCH (default DefaultDeviceBench;
// e.g. synth:flash?layers=2 for all 256 experts, which takes minutes to
// generate) once per test binary, with an 8192-token device context.
func benchDeviceModel(b *testing.B) *Model {
	dev := deviceForTest(b)
	deviceBench.once.Do(func() {
		spec := os.Getenv("MOXIE_DEVICE_BENCH")
		if spec == "" {
			spec = DefaultDeviceBench
		}
		raw, err := checkpoint.Open(spec)
		if err != nil {
			deviceBench.err = err
			return
		}
		src := &cachedSource{Source: raw, m: map[string][]byte{}}
		t0 := time.Now()
		deviceBench.m, deviceBench.err = Load(src, Options{Device: dev, DeviceContext: 8192})
		if deviceBench.err == nil {
			fmt.Fprintf(os.Stderr, "benchmark model %s: %d bytes on %s, loaded in %v\n", spec, deviceBench.m.DeviceBytes(), dev.Info(), time.Since(t0).Round(time.Second))
		}
	})
	if deviceBench.err != nil {
		b.Fatal(deviceBench.err)
	}
	return deviceBench.m
}

// BenchmarkDeviceDecode measures one device decode step (batch 1) after a
// 16-token prefill; bytes per op are the weight bytes one step reads
// (dense + top-k routed experts + head), so MB/s compares with HBM bandwidth.
func BenchmarkDeviceDecode(b *testing.B) {
	for _, graphs := range []bool{true, false} {
		name := "graph"
		if !graphs {
			name = "launches"
		}
		b.Run(name, func(b *testing.B) { benchDeviceDecode(b, graphs) })
	}
}

func benchDeviceDecode(b *testing.B, graphs bool) {
	m := benchDeviceModel(b)
	s, err := m.NewDeviceSession()
	if err != nil {
		b.Fatal(err)
	}
	defer func() { s.Close() }()
	s.UseGraphs(graphs)
	if _, err := s.Prefill(testTokens(16, m.Cfg.VocabSize, 1)); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(decodeBytes(m))
	n := 0
	t0 := time.Now()
	b.ResetTimer()
	for b.Loop() {
		if s.Pos() >= s.Limit() {
			b.StopTimer()
			s.Close()
			if s, err = m.NewDeviceSession(); err != nil {
				b.Fatal(err)
			}
			s.UseGraphs(graphs)
			if _, err := s.Prefill(testTokens(16, m.Cfg.VocabSize, 1)); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		if _, err := s.Decode(s.Pos()*7919%m.Cfg.VocabSize + 3); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.ReportMetric(float64(n)/time.Since(t0).Seconds(), "tok/s")
	b.ReportMetric(float64(decodeBytes(m)), "bytes/token")
	b.Log(s.Describe())
	if s.graphErr != nil {
		b.Errorf("decode graph capture failed: %v", s.graphErr)
	}
	if s.runErr != nil || m.dev.tableErr != nil {
		b.Errorf("experts route through the host: %v %v", s.runErr, m.dev.tableErr)
	}
}

// BenchmarkDevicePrefill measures a prefill of $MOXIE_DEVICE_PREFILL tokens
// (default 4096) on a fresh device session (last-position logits).
func BenchmarkDevicePrefill(b *testing.B) {
	m := benchDeviceModel(b)
	n := benchPrefillTokens(b)
	toks := testTokens(n, m.Cfg.VocabSize, 2)
	var d time.Duration
	for b.Loop() {
		s, t := timedPrefill(b, m, toks)
		d += t
		s.Close()
	}
	b.ReportMetric(float64(n*b.N)/d.Seconds(), "tok/s")
}

// benchPrefillTokens is $MOXIE_DEVICE_PREFILL, the prompt length of the
// prefill benchmarks (default 4096).
func benchPrefillTokens(b *testing.B) int {
	n := 4096
	if v := os.Getenv("MOXIE_DEVICE_PREFILL"); v != "" {
		if _, err := fmt.Sscan(v, &n); err != nil || n < 1 {
			b.Fatalf("MOXIE_DEVICE_PREFILL=%q", v)
		}
	}
	return n
}

// timedPrefill prefills toks into a new device session of m and returns
// it and the prefill's wall time.
func timedPrefill(b *testing.B, m *Model, toks []int) (*DeviceSession, time.Duration) {
	s, err := m.NewDeviceSession()
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	if _, err := s.Prefill(toks); err != nil {
		b.Fatal(err)
	}
	return s, time.Since(t0)
}

// routeRecord keeps every routing decision by (position, layer).
type routeRecord struct {
	experts map[[2]int][]int
	weights map[[2]int][]float32
}

func (r *routeRecord) RecordRoute(pos, layer int, experts []int, weights []float32) {
	k := [2]int{pos, layer}
	r.experts[k] = append([]int(nil), experts...)
	r.weights[k] = append([]float32(nil), weights...)
}

// TestDeviceRoutes records the routing of a device model (Options.Routes:
// the MoE routes through the host, also for decode steps) and of the CPU
// model: the same experts in the same order, weights within 1e-5, and the
// logits within 1e-4.
func TestDeviceRoutes(t *testing.T) {
	dr := &routeRecord{map[[2]int][]int{}, map[[2]int][]float32{}}
	md := loadDeviceModel(t, "synth:tiny", Options{Routes: dr})
	src, err := checkpoint.Open("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	cr := &routeRecord{map[[2]int][]int{}, map[[2]int][]float32{}}
	be := cpu.New(2)
	defer be.Close()
	mc, err := Load(src, Options{Backend: be, Routes: cr})
	if err != nil {
		t.Fatal(err)
	}
	V := mc.Cfg.VocabSize
	toks := testTokens(30, V, 4)
	sched := decodeSchedule(30, 20)
	want := runSchedule(t, mc.NewSession().PrefillAll, toks, sched)
	ds := newDeviceSession(t, md)
	got := runSchedule(t, ds.PrefillAll, toks, sched)
	compareDevice(t, "device (host-routed) vs CPU", got, want, V, 1e-4)
	if len(dr.experts) != len(cr.experts) || len(cr.experts) != len(toks)*mc.Cfg.NLayers {
		t.Fatalf("%d device and %d CPU route records, want %d", len(dr.experts), len(cr.experts), len(toks)*mc.Cfg.NLayers)
	}
	for k, ce := range cr.experts {
		if !slices.Equal(dr.experts[k], ce) {
			t.Errorf("position %d layer %d: device routed to %v, CPU to %v", k[0], k[1], dr.experts[k], ce)
			continue
		}
		for j, w := range cr.weights[k] {
			if d := float64(dr.weights[k][j] - w); d > 1e-5*float64(max(w, 1)) || -d > 1e-5*float64(max(w, 1)) {
				t.Errorf("position %d layer %d expert %d: device weight %g, CPU %g", k[0], k[1], ce[j], dr.weights[k][j], w)
			}
		}
	}
}

// TestDeviceExpertTier forces the device expert cache (the path Load takes
// when the routed experts do not all fit): with 3 slots for synth:tiny's 4×8
// experts (2 per token) nearly every use misses and evicts; with 32 every
// expert stays once loaded. Logits must match the CPU for prefill (experts
// grouped on the host, loaded one by one) and decode (loaded per step).
func TestDeviceExpertTier(t *testing.T) {
	src, err := checkpoint.Open("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	mc := loadTiny(t, src)
	V := mc.Cfg.VocabSize
	toks := testTokens(40, V, 8)
	for _, slots := range []int{3, 32} {
		t.Run(fmt.Sprint(slots, " slots"), func(t *testing.T) {
			md := loadDeviceModel(t, "synth:tiny", Options{deviceExpertSlots: slots})
			if n, _, _ := md.DeviceExpertStats(); n != slots {
				t.Fatalf("expert cache has %d slots, want %d", n, slots)
			}
			for _, sched := range [][]int{decodeSchedule(40, 25), {13, 11, 16}} {
				want := runSchedule(t, mc.NewSession().PrefillAll, toks, sched)
				ds := newDeviceSession(t, md)
				got := runSchedule(t, ds.PrefillAll, toks, sched)
				compareDevice(t, fmt.Sprintf("%d slots, chunks %v", slots, sched[:min(len(sched), 3)]), got, want, V, 1e-4)
			}
			n, hits, misses := md.DeviceExpertStats()
			t.Logf("expert cache: %d slots, %d hits, %d misses", n, hits, misses)
			if misses == 0 {
				t.Errorf("expert cache reported %d misses and %d hits", misses, hits)
			}
			if slots == 32 && misses > 32 {
				t.Errorf("%d misses with room for every expert (32)", misses)
			}
		})
	}
}

// TestDeviceAutoChunk checks how a GPU session picks its prefill chunk when
// Options.MaxChunk is 0: the largest candidate that fits (4096 for
// synth:tiny's small state), never more than the context, and an explicit
// MaxChunk as given.
func TestDeviceAutoChunk(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		want int
	}{
		{"fits", Options{DeviceContext: 8192}, 4096},
		{"context below the candidates", Options{DeviceContext: 700}, 700},
		{"explicit", Options{DeviceContext: 8192, MaxChunk: 96}, 96},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := loadDeviceModel(t, "synth:tiny", tc.opts)
			if s := newDeviceSession(t, m); s.chunk != tc.want {
				t.Fatalf("chunk %d, want %d", s.chunk, tc.want)
			}
		})
	}
}
