package dsv4

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"moxie/compute/cuda"
	"moxie/dsv4/config"
	"moxie/generate"
	"moxie/sample"
)

// fakeDevice is device memory for transferState on the host: DevicePtr
// values are byte offsets into mem from fakeBase.
type fakeDevice struct {
	mem []float32
}

const fakeBase = 1 << 20

func (f *fakeDevice) alloc(floats int) cuda.DevicePtr {
	p := cuda.DevicePtr(fakeBase + 4*len(f.mem))
	f.mem = append(f.mem, make([]float32, floats)...)
	return p
}

func (f *fakeDevice) at(p cuda.DevicePtr, n int) []float32 {
	i := (int(p) - fakeBase) / 4
	return f.mem[i : i+n]
}

func (f *fakeDevice) CopyFloatsToDevice(dst cuda.DevicePtr, src []float32) error {
	copy(f.at(dst, len(src)), src)
	return nil
}

func (f *fakeDevice) CopyFloatsFromDevice(dst []float32, src cuda.DevicePtr) error {
	copy(dst, f.at(src, len(dst)))
	return nil
}

// fakeLayers allocates a device session's state buffers as
// planDeviceSession sizes them for a chunk of T tokens and a limit.
func fakeLayers(f *fakeDevice, m *Model, T, limit int) []*devLayerState {
	c := m.Cfg
	hs := m.blankState()
	var out []*devLayerState
	for l := range c.NLayers {
		ls := &devLayerState{ringRows: c.Window + T}
		ls.ring = f.alloc(ls.ringRows * c.HeadDim)
		comp := func(cs *compState) *devCompState {
			if cs == nil {
				return nil
			}
			cp := cs.c
			d := &devCompState{rows: 2*cp.ratio + T}
			d.ringKV, d.ringZ = f.alloc(d.rows*cp.c*cp.dw), f.alloc(d.rows*cp.c*cp.dw)
			d.entries = f.alloc(max(limit/cp.ratio, 1) * cp.dw)
			return d
		}
		ls.comp, ls.icomp = comp(hs.layers[l].comp), comp(hs.layers[l].icomp)
		out = append(out, ls)
	}
	return out
}

// TestTransferState checks the mapping between a device session's rings
// and a Session's state on the host, against the device's documented
// layout (RingStore, CompStore: position p in row p mod the ring's rows;
// entry e in row e): a CPU session decodes token by token while a fake
// device is filled as the device's kernels would fill it (each position's
// rows copied from the CPU state just after that position, to row p mod
// rows); then the state downloaded from it continues exactly as the CPU
// session does, and the CPU state uploaded to an empty fake device fills
// the rows a continuation reads with the same values.
func TestTransferState(t *testing.T) {
	m := loadTiny(t, newMemSource(config.Tiny(), 1))
	c := m.Cfg
	const T, limit = 5, 200
	toks := testTokens(120, c.VocabSize, 9)
	for _, at := range []int{0, 1, 7, 8, 9, 33, 100} {
		t.Run(fmt.Sprint("pos", at), func(t *testing.T) {
			f := &fakeDevice{}
			dls := fakeLayers(f, m, T, limit)
			cpu := m.NewSession()
			for p := range at {
				if _, err := cpu.Decode(toks[p]); err != nil {
					t.Fatal(err)
				}
				for l, ls := range cpu.layers {
					d := dls[l]
					copy(f.at(off(d.ring, p%d.ringRows*c.HeadDim), c.HeadDim), ls.ring[p%c.Window*c.HeadDim:])
					for _, pr := range []struct {
						h *compState
						d *devCompState
						e []float32
					}{{ls.comp, d.comp, ls.ckv}, {ls.icomp, d.icomp, ls.ikeys}} {
						if pr.h == nil {
							continue
						}
						cp := pr.h.c
						w := cp.c * cp.dw
						kv, z := pr.h.cur, pr.h.curZ
						if cp.c == 2 && (p+1)%cp.ratio == 0 { // closed: swapped into prev
							kv, z = pr.h.prev, pr.h.prevZ
						}
						slot := p % cp.ratio
						copy(f.at(off(pr.d.ringKV, p%pr.d.rows*w), w), kv[slot*w:(slot+1)*w])
						copy(f.at(off(pr.d.ringZ, p%pr.d.rows*w), w), z[slot*w:(slot+1)*w])
						copy(f.at(pr.d.entries, len(pr.e)), pr.e)
					}
				}
			}
			// Down: the fake device's state continues as the CPU session.
			h := m.blankState()
			h.pos = at
			if err := transferState(f, c, dls, h, false); err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			if err := h.SaveSequence(&b); err != nil {
				t.Fatal(err)
			}
			seq, err := m.RestoreSequence(&b)
			if err != nil {
				t.Fatal(err)
			}
			rest := toks[at : at+12]
			ref, _ := cpu.Clone()
			want := append(feed(t, ref, rest[:4]), feed(t, ref, rest[4:])...)
			got := append(feed(t, seq.(*Session), rest[:4]), feed(t, seq.(*Session), rest[4:])...)
			if !slices.Equal(got, want) {
				t.Errorf("the state read from the device continues differently (max rel %.3g)", maxRel(got, want))
			}
			// Up: the CPU state in an empty fake device; every row a
			// continuation reads holds the simulated device's value.
			f2 := &fakeDevice{mem: make([]float32, 0, len(f.mem))}
			dls2 := fakeLayers(f2, m, T, limit)
			if err := transferState(f2, c, dls2, cpu0(t, m, toks[:at]), true); err != nil {
				t.Fatal(err)
			}
			for l := range dls {
				a, b := dls[l], dls2[l]
				for p := max(0, at-c.Window); p < at; p++ {
					r := p % a.ringRows * c.HeadDim
					if !slices.Equal(f.at(off(a.ring, r), c.HeadDim), f2.at(off(b.ring, r), c.HeadDim)) {
						t.Fatalf("layer %d: window row of position %d differs after the upload", l, p)
					}
				}
				for k, pr := range [][2]*devCompState{{a.comp, b.comp}, {a.icomp, b.icomp}} {
					if pr[0] == nil {
						continue
					}
					hc := []*compState{cpu.layers[l].comp, cpu.layers[l].icomp}[k]
					R, w := hc.c.ratio, hc.c.c*hc.c.dw
					from := at / R * R
					if hc.c.c == 2 {
						from = max(0, from-R)
					}
					for p := from; p < at; p++ {
						r := p % pr[0].rows * w
						if !slices.Equal(f.at(off(pr[0].ringKV, r), w), f2.at(off(pr[1].ringKV, r), w)) ||
							!slices.Equal(f.at(off(pr[0].ringZ, r), w), f2.at(off(pr[1].ringZ, r), w)) {
							t.Fatalf("layer %d compressor %d: rows of position %d differ after the upload", l, k, p)
						}
					}
					n := at / R * hc.c.dw
					if !slices.Equal(f.at(pr[0].entries, n), f2.at(pr[1].entries, n)) {
						t.Fatalf("layer %d compressor %d: entries differ after the upload", l, k)
					}
				}
			}
		})
	}
}

// cpu0 returns a CPU session that decoded toks one at a time.
func cpu0(t *testing.T, m *Model, toks []int) *Session {
	t.Helper()
	s := m.NewSession()
	for _, tk := range toks {
		if _, err := s.Decode(tk); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// TestRowRuns: every position lands in its rows, runs are maximal and
// contiguous on both sides.
func TestRowRuns(t *testing.T) {
	for _, c := range []struct{ p0, p1, hr, dr int }{
		{0, 0, 8, 13}, {0, 8, 8, 13}, {5, 13, 8, 13}, {120, 128, 128, 130}, {100, 228, 128, 133}, {7, 9, 4, 9},
	} {
		runs := rowRuns(c.p0, c.p1, c.hr, c.dr)
		p := c.p0
		for _, r := range runs {
			if r.n <= 0 || r.host+r.n > c.hr || r.dev+r.n > c.dr {
				t.Fatalf("%+v: run %+v out of range", c, r)
			}
			for i := range r.n {
				if (p+i)%c.hr != r.host+i || (p+i)%c.dr != r.dev+i {
					t.Fatalf("%+v: position %d in run %+v", c, p+i, r)
				}
			}
			p += r.n
		}
		if p != c.p1 {
			t.Errorf("%+v: runs cover up to %d", c, p)
		}
		if max := 2 + (c.p1-c.p0)/min(c.hr, c.dr)*2; len(runs) > max {
			t.Errorf("%+v: %d runs", c, len(runs))
		}
	}
}

// TestDeviceSaveRestore (GPU): a state saved by a CPU session continues on
// the device, one saved by a device session (after captured decode steps)
// continues on the CPU, both within the device-vs-CPU tolerance, and a
// device session restored from a device session's state, or cloned from it
// (CloneSequence), continues with its bits; both loads of the weights give
// one SequenceID.
func TestDeviceSaveRestore(t *testing.T) {
	md, mc := tinyPair(t, Options{DeviceContext: 320})
	V := mc.Cfg.VocabSize
	if a, b := md.SequenceID(), mc.SequenceID(); a != b {
		t.Errorf("SequenceID %s on the device, %s on the CPU", a, b)
	}
	toks := testTokens(90, V, 13)
	head, rest := toks[:70], toks[70:82]
	ctx := context.Background()
	save := func(s generate.Saver) []byte {
		t.Helper()
		var b bytes.Buffer
		if err := s.SaveSequence(&b); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	// cont: a prefill of 4 tokens, then 8 decode steps; the logits of each.
	cont := func(seq generate.Sequence) []float32 {
		t.Helper()
		out, err := seq.Append(ctx, rest[:4])
		if err != nil {
			t.Fatal(err)
		}
		for _, tk := range rest[4:] {
			l, err := seq.Append(ctx, []int{tk})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, l...)
		}
		return out
	}
	restore := func(m *Model, b []byte) generate.Sequence {
		t.Helper()
		seq, err := m.RestoreSequence(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { seq.Close() })
		if seq.Len() != len(head) {
			t.Fatalf("restored at %d, want %d", seq.Len(), len(head))
		}
		return seq
	}
	ref := mc.NewSession()
	feed(t, ref, head)
	want := cont(ref)

	cs := mc.NewSession()
	feed(t, cs, head)
	onDev := restore(md, save(cs))
	if _, ok := onDev.(*DeviceSession); !ok {
		t.Fatalf("the device model restored a %T", onDev)
	}
	compareDevice(t, "CPU state continued on the device", cont(onDev), want, V, 1e-4)

	ds := newDeviceSession(t, md)
	if _, err := ds.Prefill(head[:50]); err != nil {
		t.Fatal(err)
	}
	for _, tk := range head[50:] {
		if _, err := ds.Decode(tk); err != nil {
			t.Fatal(err)
		}
	}
	if ds.graph == nil {
		t.Errorf("no captured decode graph before saving: %v", ds.graphErr)
	}
	state := save(ds)
	compareDevice(t, "device state continued on the CPU", cont(restore(mc, state)), want, V, 1e-4)
	// A clone (generate.Cloner: Options.Snapshot's copy) continues with the
	// original's bits, and continuing it first leaves the original as it was.
	clone, err := ds.CloneSequence()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { clone.Close() })
	if clone.Len() != len(head) {
		t.Fatalf("clone at %d, want %d", clone.Len(), len(head))
	}
	again := restore(md, state)
	fromClone := cont(clone)
	if got, wantDev := cont(again), cont(ds); !slices.Equal(got, wantDev) {
		t.Errorf("a device session restored from a device session's state continues with other bits (max rel %.3g)", maxRel(got, wantDev))
	} else if !slices.Equal(fromClone, wantDev) {
		t.Errorf("a clone of a device session continues with other bits (max rel %.3g)", maxRel(fromClone, wantDev))
	}
	// A state longer than the device session's context limit (320).
	big := mc.NewSession()
	feed(t, big, testTokens(400, V, 3))
	if _, err := md.RestoreSequence(bytes.NewReader(save(big))); err == nil || !strings.Contains(err.Error(), "context limit") {
		t.Errorf("a state past the context limit: %v", err)
	}
}

// BenchmarkDeviceRestore (GPU) compares, on $MOXIE_DEVICE_BENCH, a fresh
// session's prefill of $MOXIE_DEVICE_PREFILL tokens (default 4096) with
// writing that session's state to a file and restoring it from the file
// into a new device session (read, parse, upload): what a prompt whose
// start was saved (the prompt cache's disk tier) costs instead of the
// prefill. Each iteration does all three after an untimed prefill that
// compiles the kernels; the metrics are means. The file is read back just
// after it is written (from the page cache).
func BenchmarkDeviceRestore(b *testing.B) {
	m := benchDeviceModel(b)
	n := benchPrefillTokens(b)
	toks := testTokens(n, m.Cfg.VocabSize, 2)
	path := filepath.Join(b.TempDir(), "state")
	// One untimed prefill first: the kernels compile on first use.
	w, _ := timedPrefill(b, m, toks)
	w.Close()
	var pre, save, restore time.Duration
	var size int64
	for b.Loop() {
		s, tp := timedPrefill(b, m, toks)
		t1 := time.Now()
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		w := bufio.NewWriterSize(f, 1<<20)
		if err := s.SaveSequence(w); err != nil {
			b.Fatal(err)
		}
		if err := w.Flush(); err != nil {
			b.Fatal(err)
		}
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		s.Close()
		t3 := time.Now()
		f, err = os.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		seq, err := m.RestoreSequence(bufio.NewReaderSize(f, 1<<20))
		if err != nil {
			b.Fatal(err)
		}
		t4 := time.Now()
		info, _ := f.Stat()
		f.Close()
		size = info.Size()
		if seq.Len() != n {
			b.Fatalf("restored %d tokens, want %d", seq.Len(), n)
		}
		seq.Close()
		pre += tp
		save += t2.Sub(t1)
		restore += t4.Sub(t3)
	}
	ms := func(d time.Duration) float64 { return d.Seconds() * 1e3 / float64(b.N) }
	b.ReportMetric(ms(pre), "prefill-ms")
	b.ReportMetric(ms(save), "save-ms")
	b.ReportMetric(ms(restore), "restore-ms")
	b.ReportMetric(float64(size)/1e6, "state-MB")
}

// aheadCases are the models and spans of the tests of steps run past a
// sequence's end: a tiny model, and (not under -short) V4-Flash widths
// with 4 layers, a 128-key window and compress ratios 4 and 128, over
// 140 positions.
var aheadCases = []aheadCase{
	{"tiny", "synth:tiny", 20, 40, false},
	{"flash4", "synth:flash?layers=4&experts=8&mtp=0", 200, 140, true},
}

type aheadCase struct {
	name, spec    string
	prompt, steps int
	long          bool
}

// prefilledPair loads c's model (false when -short skips it) and returns
// n test tokens of seed and two sessions that have prefilled c.prompt of
// them: the reference and the session under test.
func (c aheadCase) prefilledPair(t *testing.T, n, seed int) (md *Model, toks []int, ref, st *DeviceSession, ok bool) {
	t.Helper()
	if c.long && testing.Short() {
		t.Logf("%s: skipped under -short", c.name)
		return nil, nil, nil, nil, false
	}
	md = loadDeviceModel(t, c.spec, Options{DeviceContext: 512})
	toks = testTokens(n, md.Cfg.VocabSize, seed)
	ref, st = newDeviceSession(t, md), newDeviceSession(t, md)
	for _, s := range []*DeviceSession{ref, st} {
		if _, err := s.Prefill(toks[:c.prompt]); err != nil {
			t.Fatal(err)
		}
	}
	return md, toks, ref, st, true
}

// TestDeviceStrayStep checks the property that decode steps enqueued ahead
// of the host would rely on (compute/cuda/NOTES.md, session 17): a
// one-token step past the sequence's end (a step enqueued before the host
// saw the stop), undone by setting the host's length back, leaves nothing
// a later step reads (a decode step, or a chunk of three now and then).
// Before every real step from the prompt's end on, a
// second session runs a stray step with another token at the same
// position and is set back; its logits must equal, bit for bit, those of
// a session that never strayed, over a span that wraps the window ring
// and closes compressed entries of every ratio. The flash-shaped case
// (V4-Flash widths, 4 layers, a 128-key window, ratios 4 and 128) is
// skipped under -short.
func TestDeviceStrayStep(t *testing.T) {
	for _, c := range aheadCases {
		md, toks, ref, st, ok := c.prefilledPair(t, c.prompt+c.steps, 21)
		if !ok {
			continue
		}
		stray := testTokens(c.prompt+c.steps, md.Cfg.VocabSize, 77)
		bad := 0
		for i := c.prompt; i < len(toks); {
			// Mostly decode steps; every seventh real step is a chunk of
			// three (a prompt continuing a sequence whose last step strayed).
			n := 1
			if (i-c.prompt)%7 == 3 && i+3 <= len(toks) {
				n = 3
			}
			want, err := ref.Prefill(toks[i : i+n])
			if err != nil {
				t.Fatal(err)
			}
			if _, err := st.Decode(stray[i]); err != nil {
				t.Fatal(err)
			}
			st.pos-- // the host's length set back: the stray token is not in the sequence
			got, err := st.Prefill(toks[i : i+n])
			if err != nil {
				t.Fatal(err)
			}
			i += n
			if !slices.Equal(got, want) {
				if bad++; bad <= 3 {
					t.Errorf("%s: position %d after a stray step: other logits than without it (max rel %.3g)", c.name, i, maxRel(got, want))
				}
			}
		}
		if ref.graph == nil || st.graph == nil {
			t.Errorf("%s: no captured decode graph (%v, %v): the stray steps did not take the decode path", c.name, ref.graphErr, st.graphErr)
		}
		if bad > 0 {
			t.Errorf("%s: %d of %d positions differ", c.name, bad, c.steps)
		}
	}
}

// TestDevicePipeline checks greedy steps run ahead (Pipeline) against a
// session that runs each step when asked: the same argmax at every step,
// including across another session's pass (which drops the step in
// flight), LastLogits refused while a step runs ahead, and after a stop
// (Settle) the same logits, bit for bit, for the tokens that follow.
func TestDevicePipeline(t *testing.T) {
	greedy := sample.ReduceSpec{OK: true, Greedy: true}
	for _, c := range aheadCases {
		md, toks, ref, st, ok := c.prefilledPair(t, c.prompt+8, 31)
		if !ok {
			continue
		}
		// The reference first: a pass of another session would drop the
		// step st runs ahead.
		ctx := context.Background()
		var rw, rg sample.Reduction
		bests := make([]int, c.steps)
		next := toks[c.prompt]
		for i := range c.steps {
			if err := ref.AppendReduce(ctx, []int{next}, greedy, &rw); err != nil {
				t.Fatal(err)
			}
			if rw.Bad || rw.Best < 0 {
				t.Fatalf("%s: step %d: reference reduction %+v", c.name, i, rw)
			}
			bests[i], next = rw.Best, rw.Best
		}
		st.Pipeline(true)
		next = toks[c.prompt]
		confirmed := 0
		for i := range c.steps {
			wasPend := st.pend && st.pendTok == next
			if err := st.AppendReduce(ctx, []int{next}, greedy, &rg); err != nil {
				t.Fatal(err)
			}
			if wasPend {
				confirmed++
			}
			if rg.Best != bests[i] || rg.Bad || st.Len() != c.prompt+i+1 {
				t.Fatalf("%s: step %d: argmax %d (bad %v, length %d) run ahead, %d (length %d) without", c.name, i, rg.Best, rg.Bad, st.Len(), bests[i], c.prompt+i+1)
			}
			if i == 5 {
				if _, err := st.LastLogits(nil); !errors.Is(err, errRanAhead) {
					t.Errorf("%s: LastLogits with a step run ahead: %v, want errRanAhead", c.name, err)
				}
			}
			if i == c.steps/2 {
				// Another session's pass drops the step in flight; the
				// next call then runs its step itself.
				other := newDeviceSession(t, md)
				if _, err := other.Prefill(toks[:3]); err != nil {
					t.Fatal(err)
				}
				if st.pend {
					t.Errorf("%s: a step still in flight after another session's pass", c.name)
				}
			}
			next = rg.Best
		}
		if want := c.steps - 3; confirmed < want || st.ranAhead != confirmed {
			t.Errorf("%s: %d of %d steps were confirmed runs ahead (the session counted %d), want at least %d", c.name, confirmed, c.steps, st.ranAhead, want)
		}
		// A stop: the step started for next is dropped.
		st.Pipeline(false)
		if err := st.Settle(); err != nil {
			t.Fatal(err)
		}
		if st.pend || st.Len() != ref.Len() {
			t.Fatalf("%s: after Settle: in flight %v, length %d, want %d", c.name, st.pend, st.Len(), ref.Len())
		}
		for i, tk := range toks[c.prompt+1:] {
			want, err := ref.Decode(tk)
			if err != nil {
				t.Fatal(err)
			}
			got, err := st.Decode(tk)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Errorf("%s: token %d after the stop: other logits than without steps ahead (max rel %.3g)", c.name, i, maxRel(got, want))
			}
		}
		if st.graph == nil {
			t.Errorf("%s: no captured decode graph (%v): nothing ran ahead", c.name, st.graphErr)
		}
	}
}
