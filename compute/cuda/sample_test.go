package cuda

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"moxie/sample"
)

// smpCase is one row for the sampler reduction kernels: its logits, the
// spec and the candidate capacity the kernels get.
type smpCase struct {
	name   string
	logits []float32
	greedy bool
	invT   float64
	thr    float64
	keep   int
	// With more candidates than keep, smp_draw runs at each of us with
	// top-k k (0: none) and top-p topP (0: off).
	k    int
	topP float64
	us   []float64
}

// smpWant is a float64 reduction of c written from package sample's
// contract (ReduceSpec, Reduction): argmax with the lowest id on ties, the
// NaN/+Inf flag, Z and the candidates e >= thr in id order.
func smpWant(c smpCase) (r sample.Reduction, count int) {
	r = sample.Reduction{N: len(c.logits), Best: -1}
	m := math.Inf(-1)
	for id, v := range c.logits {
		f := float64(v)
		if math.IsNaN(f) || math.IsInf(f, 1) {
			r.Bad = true
		}
		if f > m {
			r.Best, m = id, f
		}
	}
	if c.greedy || r.Bad || r.Best < 0 {
		return r, 0
	}
	for id, v := range c.logits {
		x := math.Exp((float64(v) - m) * c.invT)
		r.Z += x
		if x > 0 && x >= c.thr {
			count++
			r.IDs = append(r.IDs, int32(id))
			r.E = append(r.E, x)
		}
	}
	r.Complete = count <= c.keep
	if !r.Complete {
		r.IDs, r.E = nil, nil
	}
	return r, count
}

func smpCases() []smpCase {
	rng := uint64(11)
	u := func() float32 {
		rng = rng*6364136223846793005 + 1442695040888963407
		return float32(rng>>40) / float32(1<<24)
	}
	row := func(n int, f func(i int) float32) []float32 {
		l := make([]float32, n)
		for i := range l {
			l[i] = f(i)
		}
		return l
	}
	peaked := row(3*smpChunk+77, func(i int) float32 {
		v := u()*8 - 4
		if i%997 == 0 {
			v += 9
		}
		return v
	})
	flat := row(2*smpChunk+5, func(int) float32 { return u() * 0.5 })
	ties := row(2*smpChunk+40, func(int) float32 { return u() })
	for _, id := range []int{smpChunk + 3, 7, 300, 2*smpChunk + 1} {
		ties[id] = 5 // the argmax is id 7, tied in three chunks
	}
	masked := row(smpChunk+10, func(i int) float32 {
		if i%3 == 0 {
			return float32(math.Inf(-1))
		}
		return u() * 6
	})
	inf := float32(math.Inf(1))
	nan := float32(math.NaN())
	allMasked := row(1000, func(int) float32 { return float32(math.Inf(-1)) })
	withNaN := row(smpChunk+9, func(i int) float32 { return u() })
	withNaN[smpChunk+4] = nan
	withInf := row(500, func(i int) float32 { return u() })
	withInf[499] = inf
	small := row(100, func(int) float32 { return u() * 10 })
	nFlat, _ := smpWant(smpCase{logits: flat, invT: 1 / 0.6, thr: 1e-4, keep: math.MaxInt})
	// Three values in runs of equal logits, so that every cut falls inside
	// a run: top-k runK ends 100 ids into the second run, top-p runP inside
	// it by mass.
	runs := row(2*smpChunk+300, func(i int) float32 { return -0.5 * float32(i%3) })
	runK := (len(runs)+2)/3 + 100
	e1 := math.Exp(-0.5)
	n0 := float64((len(runs) + 2) / 3)
	var zRuns float64
	for _, v := range runs {
		zRuns += math.Exp(float64(v))
	}
	runP := (n0 + 250.5*e1) / zRuns // 251 of the second run
	return []smpCase{
		{"peaked top-p", peaked, false, 1 / 0.6, 1e-4, SampleKeep, 0, 0, nil},
		{"peaked greedy", peaked, true, 0, 0, SampleKeep, 0, 0, nil},
		{"peaked min-p", peaked, false, 1.25, 0.05, SampleKeep, 0, 0, nil},
		{"ties", ties, false, 1, 1e-4, 64, 0, 0, nil},
		{"ties greedy", ties, true, 0, 0, 64, 0, 0, nil},
		{"masked ids", masked, false, 1, 1e-3, SampleKeep, 0, 0, nil},
		{"flat over the capacity", flat, false, 1 / 0.6, 1e-4, 64, 0, 0, nil},
		{"flat at the capacity", flat, false, 1 / 0.6, 1e-4, len(nFlat.IDs), 0, 0, nil},
		{"all masked", allMasked, false, 1, 1e-4, 64, 0, 0, nil},
		{"NaN", withNaN, false, 1, 1e-4, 64, 0, 0, nil},
		{"NaN greedy", withNaN, true, 0, 0, 64, 0, 0, nil},
		{"+Inf", withInf, false, 1, 1e-4, 64, 0, 0, nil},
		{"small row", small, false, 0.5, 1e-4, 64, 0, 0, nil},
		// More candidates than keep: smp_draw's selection and draw.
		{"draw: flat top-p", flat, false, 1 / 0.6, 1e-4, 64, 0, 0.95, []float64{0, 0.137, 0.5, 0.731, 0.999999}},
		{"draw: flat top-k and top-p", flat, false, 1 / 0.6, 1e-4, 64, 3000, 0.8, []float64{0, 0.137, 0.5, 0.731, 0.999999}},
		{"draw: flat top-k", flat, false, 1 / 0.6, 1e-4, 64, 777, 0, []float64{0, 0.137, 0.5, 0.731, 0.999999}},
		{"draw: peaked min-p", peaked, false, 0.5, 0.01, 16, 0, 0, []float64{0, 0.137, 0.5, 0.731, 0.999999}},
		{"draw: runs of ties top-k", runs, false, 1, 1e-4, 64, runK, 0, []float64{0, 0.137, 0.5, 0.731, 0.999999}},
		{"draw: runs of ties top-p", runs, false, 1, 1e-4, 64, 0, runP, []float64{0, 0.137, 0.5, 0.731, 0.999999}},
		{"draw: runs of ties both", runs, false, 1, 1e-4, 64, runK, 0.5, []float64{0, 0.137, 0.5, 0.731, 0.999999}},
	}
}

// smpEmuHarness runs kernels/sample.cu's kernels on the host (every CUDA
// thread a std::thread, __syncthreads a block barrier, blocks one at a
// time) for each case of gen.inc and prints, per case, one line "case I
// best B bad D count C complete K z Z" and one line "ids ID:E ...".
const smpEmuHarness = `
#include <barrier>
#include <thread>
#include <vector>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <algorithm>
using std::min; using std::max; using std::exp;
#include "cuda_emu.h"
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline long long __double_as_longlong(double d) { long long x; memcpy(&x, &d, 8); return x; }
#define SMP_DRAW_THREADS 128  // a smaller smp_draw block than the GPU's: the same operations, fewer threads to emulate
#include "kern.inc"

template <class F> void launch(unsigned grid, F k, unsigned threads = SMP_THREADS) {
  gridDim = {grid, 1, 1}; blockDim = {threads, 1, 1};
  for (unsigned b = 0; b < grid; b++) {
    std::barrier<> bb(threads);
    g_block_bar = &bb;
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < threads; t++)
      ts.emplace_back([=] { threadIdx = {t, 0, 0}; blockIdx = {b, 0, 0}; k(); });
    for (auto &t : ts) t.join();
  }
}

struct Case { std::vector<float> l; int greedy; double invT, thr; int keep; int k; double top_p; std::vector<double> us; };
#include "gen.inc"

int main() {
  for (size_t ci = 0; ci < cases.size(); ci++) {
    const Case &c = cases[ci];
    int n = c.l.size(), nb = (n + SMP_CHUNK - 1) / SMP_CHUNK;
    std::vector<SmpPart> part(nb);
    std::vector<int> cid(nb * SMP_CHUNK, -7);
    std::vector<double> ce(nb * SMP_CHUNK, -7);
    std::vector<unsigned char> out(SMP_IDS_OFF + 12 * c.keep, 0xAB);
    const float *l = c.l.data();
    SmpPart *p = part.data();
    launch(nb, [&] { smp_max(l, n, p); });
    if (!c.greedy) launch(nb, [&] { smp_exp(l, n, c.invT, c.thr, p, cid.data(), ce.data()); });
    int feed_tok = -5, feed_pos = 100;
    launch(1, [&] { smp_fin(p, nb, c.greedy, cid.data(), ce.data(), c.keep, out.data(), &feed_tok, &feed_pos); });
    SmpHead h; memcpy(&h, out.data(), sizeof h);
    printf("case %zu best %d bad %d count %d complete %d z %.17g feed %d %d\n", ci, h.best, h.bad, h.count, h.complete, h.z, feed_tok, feed_pos);
    printf("ids");
    if (!c.greedy && !h.bad && h.best >= 0 && h.complete)
      for (int i = 0; i < h.count; i++) {
        int id; double e;
        memcpy(&id, out.data() + SMP_IDS_OFF + 4 * i, 4);
        memcpy(&e, out.data() + SMP_IDS_OFF + 4 * c.keep + 8 * i, 8);
        printf(" %d:%.17g", id, e);
      }
    printf("\n");
    printf("drawn");
    if (!c.greedy && !h.bad && h.best >= 0 && !h.complete)
      for (double u : c.us) {
        int drawn = -7;
        SmpDrawArgs a{p, cid.data(), ce.data(), &drawn, h.z, c.top_p, u, nb, c.k};
        launch(1, [&] { smp_draw(a, n); }, SMP_DRAW_THREADS);
        printf(" %d", drawn);
      }
    printf("\n");
  }
}
`

func TestSampleReduceEmulated(t *testing.T) {
	cases := smpCases()
	var gen strings.Builder
	gen.WriteString("static std::vector<Case> cases = {\n")
	for _, c := range cases {
		gen.WriteString("  {{")
		for i, v := range c.logits {
			if i > 0 {
				gen.WriteByte(',')
			}
			switch {
			case math.IsNaN(float64(v)):
				gen.WriteString("NAN")
			case math.IsInf(float64(v), 1):
				gen.WriteString("INFINITY")
			case math.IsInf(float64(v), -1):
				gen.WriteString("-INFINITY")
			default:
				gen.WriteString(strconv.FormatFloat(float64(v), 'e', -1, 32) + "f")
			}
		}
		g := 0
		if c.greedy {
			g = 1
		}
		k := c.k
		if k <= 0 {
			k = math.MaxInt32
		}
		fmt.Fprintf(&gen, "}, %d, %s, %s, %d, %d, %s, {", g, strconv.FormatFloat(c.invT, 'g', -1, 64), strconv.FormatFloat(c.thr, 'g', -1, 64), c.keep, k, strconv.FormatFloat(c.topP, 'g', -1, 64))
		for j, u := range c.us {
			if j > 0 {
				gen.WriteByte(',')
			}
			gen.WriteString(strconv.FormatFloat(u, 'g', -1, 64))
		}
		gen.WriteString("}},\n")
	}
	gen.WriteString("};\n")
	lines := runHostEmulation(t, map[string]string{"kern.inc": sampleSrc, "gen.inc": gen.String(), "emu.cpp": smpEmuHarness})
	if len(lines) != 3*len(cases) {
		t.Fatalf("emulation printed %d lines, want three per case:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want, count := smpWant(c)
			var ci, best, bad, gotCount, complete, feedTok, feedPos int
			var z float64
			if _, err := fmt.Sscanf(lines[3*i], "case %d best %d bad %d count %d complete %d z %g feed %d %d", &ci, &best, &bad, &gotCount, &complete, &z, &feedTok, &feedPos); err != nil || ci != i {
				t.Fatalf("line %q: %v", lines[3*i], err)
			}
			if best != want.Best || (bad != 0) != want.Bad {
				t.Fatalf("best %d bad %d, want %d %v", best, bad, want.Best, want.Bad)
			}
			// The hand-off to the next step: the argmax (0 when none), the
			// position one on from the 100 the harness starts with.
			if wantTok := max(want.Best, 0); feedTok != wantTok || feedPos != 101 {
				t.Errorf("fed token %d at position %d, want %d at 101", feedTok, feedPos, wantTok)
			}
			if c.greedy || want.Bad || want.Best < 0 {
				if gotCount != 0 {
					t.Errorf("count %d, want 0", gotCount)
				}
				return
			}
			if gotCount != count || (complete != 0) != want.Complete {
				t.Fatalf("count %d complete %d, want %d %v", gotCount, complete, count, want.Complete)
			}
			if math.Abs(z-want.Z) > 1e-13*want.Z {
				t.Errorf("z %.17g, want %.17g", z, want.Z)
			}
			f := strings.Fields(lines[3*i+1])
			if len(f) == 0 || f[0] != "ids" {
				t.Fatalf("line %q: want ids", lines[3*i+1])
			}
			if !want.Complete {
				if len(f) != 1 {
					t.Errorf("an incomplete result listed %d candidates", len(f)-1)
				}
				d := strings.Fields(lines[3*i+2])
				if len(d) != 1+len(c.us) || d[0] != "drawn" {
					t.Fatalf("line %q: want %d draws", lines[3*i+2], len(c.us))
				}
				for j, u := range c.us {
					got, _ := strconv.Atoi(d[1+j])
					if w := smpDrawWant(c, u); got != w {
						t.Errorf("draw at u %v: id %d, want %d", u, got, w)
					}
				}
				return
			}
			if len(f)-1 != len(want.IDs) {
				t.Fatalf("%d candidates listed, want %d", len(f)-1, len(want.IDs))
			}
			for j, s := range f[1:] {
				var id int32
				var e float64
				if _, err := fmt.Sscanf(s, "%d:%g", &id, &e); err != nil {
					t.Fatalf("candidate %q: %v", s, err)
				}
				if id != want.IDs[j] || math.Abs(e-want.E[j]) > 1e-15*want.E[j] {
					t.Fatalf("candidate %d: %d:%.17g, want %d:%.17g", j, id, e, want.IDs[j], want.E[j])
				}
			}
		})
	}
}

func TestSampleCompiles(t *testing.T) {
	img := compileModuleForTest(t, "sample", sampleSrc)
	requireKernels(t, img, "smp_max", "smp_exp", "smp_fin")
}

// smpResult encodes r as smp_fin writes it for keep candidates.
func smpResult(r sample.Reduction, count, keep int) []byte {
	b := make([]byte, smpIDsOff+12*keep)
	le := binary.LittleEndian
	le.PutUint64(b[0:], math.Float64bits(r.Z))
	le.PutUint32(b[8:], uint32(int32(r.Best)))
	if r.Bad {
		le.PutUint32(b[12:], 1)
	}
	le.PutUint32(b[16:], uint32(int32(count)))
	if r.Complete {
		le.PutUint32(b[20:], 1)
	}
	le.PutUint64(b[24:], math.Float64bits(r.CandMass))
	for i := range r.IDs {
		le.PutUint32(b[smpIDsOff+4*i:], uint32(r.IDs[i]))
		le.PutUint64(b[smpIDsOff+4*keep+8*i:], math.Float64bits(r.E[i]))
	}
	return b
}

func TestDecodeReduction(t *testing.T) {
	good := sample.Reduction{N: 50, Best: 4, Z: 1.75, Count: 2, CandMass: 1.75, IDs: []int32{4, 9}, E: []float64{1, 0.75}, Complete: true}
	for _, c := range []struct {
		name    string
		b       []byte
		greedy  bool
		want    sample.Reduction
		wantErr string
	}{
		{"complete", smpResult(good, 2, 8), false, good, ""},
		{"greedy reads the head only", smpResult(good, 2, 8)[:smpIDsOff], true, sample.Reduction{N: 50, Best: 4, Z: 1.75, Count: 2, CandMass: 1.75}, ""},
		{"incomplete", smpResult(sample.Reduction{N: 50, Best: 4, Z: 30, CandMass: 29}, 40, 8), false, sample.Reduction{N: 50, Best: 4, Z: 30, Count: 40, CandMass: 29}, ""},
		{"bad", smpResult(sample.Reduction{N: 50, Best: 4, Bad: true, Complete: true}, 0, 8), false, sample.Reduction{N: 50, Best: 4, Bad: true}, ""},
		{"short", make([]byte, 10), false, sample.Reduction{}, "result of 10 bytes"},
		{"argmax out of range", smpResult(sample.Reduction{N: 50, Best: 50}, 0, 8), true, sample.Reduction{}, "argmax 50"},
		{"count over the capacity", smpResult(sample.Reduction{N: 50, Best: 4, Z: 2, Complete: true}, 9, 8), false, sample.Reduction{}, "9 candidates"},
		{"no candidates", smpResult(sample.Reduction{N: 50, Best: 4, Z: 2, Complete: true}, 0, 8), false, sample.Reduction{}, "0 candidates"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got sample.Reduction
			err := decodeReduction(c.b, 50, c.greedy, &got)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func FuzzDecodeReduction(f *testing.F) {
	f.Add(smpResult(sample.Reduction{N: 50, Best: 4, Z: 1.75, IDs: []int32{4, 9}, E: []float64{1, 0.75}, Complete: true}, 2, 8), false)
	f.Add(make([]byte, smpIDsOff), true)
	f.Fuzz(func(t *testing.T, b []byte, greedy bool) {
		var r sample.Reduction
		if err := decodeReduction(b, 50, greedy, &r); err != nil {
			return
		}
		if r.Best < -1 || r.Best >= 50 || len(r.IDs) != len(r.E) || len(r.IDs) > (len(b)-smpIDsOff)/12+1 {
			t.Fatalf("accepted an impossible result %+v", r)
		}
	})
}

// BenchmarkSampleReduce times one decode step's sampling from logits in
// device memory (V4's vocabulary): "device" reduces them there (Enqueue,
// Sync, Read) and draws with SampleReduced, or with Draw on the device when
// the candidates did not fit; "host" downloads the row into registered
// memory and calls Sample, as a step without a reducer does.
func BenchmarkSampleReduce(b *testing.B) {
	const V = 129280
	var x uint64 = 1
	peaked, wide, flat := make([]float32, V), make([]float32, V), make([]float32, V)
	for i := range peaked {
		x = x*6364136223846793005 + 1442695040888963407
		u := float32(x>>40) / float32(1<<24)
		peaked[i], wide[i], flat[i] = u*8-4, u*4-30, u*0.5
		if i%997 == 0 {
			peaked[i] += 8
		}
		if i%25 == 0 {
			wide[i] = u * 3 // 5,172 ids within 3 of each other, the rest far below
		}
	}
	dev := testDevice(b)
	for _, c := range []struct {
		name   string
		logits []float32
		p      sample.Params
	}{
		{"greedy", peaked, sample.Params{}},
		{"peaked-top-p", peaked, sample.Params{Temperature: 0.6, TopP: 0.95}},
		{"wide-top-p", wide, sample.Params{Temperature: 0.6, TopP: 0.95}},
		{"flat-top-p", flat, sample.Params{Temperature: 0.6, TopP: 0.95}},
	} {
		for _, where := range []string{"device", "host"} {
			b.Run(c.name+"/"+where, func(b *testing.B) {
				err := dev.Do(func(ctx *Ctx) error {
					d, err := ctx.MemAlloc(4 * V)
					if err != nil {
						return err
					}
					defer ctx.MemFree(d)
					if err := ctx.CopyFloatsToDevice(d, c.logits); err != nil {
						return err
					}
					r, err := ctx.NewSampleReducer(V)
					if err != nil {
						return err
					}
					defer r.Close(ctx)
					dst := make([]float32, V)
					h, err := ctx.RegisterHost(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*V))
					if err != nil {
						return err
					}
					defer ctx.FreeHost(h)
					s, _ := sample.New(c.p)
					var red sample.Reduction
					st := ctx.Stream()
					b.ResetTimer()
					for range b.N {
						full := true
						if where == "device" {
							if err := r.Enqueue(ctx, d, s.Reduce(), st); err != nil {
								return err
							}
							if err := ctx.Sync(st); err != nil {
								return err
							}
							if err := r.Read(ctx, st, &red); err != nil {
								return err
							}
							if _, full, err = s.SampleReduced(&red); err != nil {
								return err
							}
							if d, ok := s.PrepareDeviceDraw(&red); full && ok {
								if _, err := r.Draw(ctx, d, st); err != nil {
									return err
								}
								full = false
							}
						}
						if full {
							if err := ctx.DownloadAsync(h, 0, d, 4*V, st); err != nil {
								return err
							}
							if err := ctx.Sync(st); err != nil {
								return err
							}
							if _, err := s.Sample(dst, nil); err != nil {
								return err
							}
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}

func TestSampleReducerDevice(t *testing.T) {
	// The reducer on the GPU against the float64 reduction, around the
	// first download's 2,048 candidates and the capacity: the second copy
	// must bring exactly the rest.
	const n = 3*smpChunk + 1000
	dev := testDevice(t)
	for _, count := range []int{1, 700, sampleFirst, sampleFirst + 1, 5172, SampleKeep, SampleKeep + 1} {
		var x uint64 = uint64(count)
		l := make([]float32, n)
		for i := range l {
			l[i] = -1000 // e = 0: never a candidate
		}
		for k := range count { // spread over the chunks, values within 1 of each other
			x = x*6364136223846793005 + 1442695040888963407
			l[(k*7919)%n] = float32(x>>40) / float32(1<<24)
		}
		for _, greedy := range []bool{false, true} {
			c := smpCase{logits: l, greedy: greedy, invT: 1, thr: 1e-4, keep: SampleKeep}
			want, wantCount := smpWant(c)
			spec := sample.ReduceSpec{OK: true, Greedy: greedy, InvT: c.invT, Threshold: c.thr}
			var got sample.Reduction
			draws := []smpCase{{k: 0, topP: 0.9}, {k: 500}, {k: 3000, topP: 0.5}}
			drawn := make([][2]int, 0, 2*len(draws)) // got, want
			err := dev.Do(func(ctx *Ctx) error {
				d, err := ctx.MemAlloc(4 * n)
				if err != nil {
					return err
				}
				defer ctx.MemFree(d)
				if err := ctx.CopyFloatsToDevice(d, l); err != nil {
					return err
				}
				r, err := ctx.NewSampleReducer(n)
				if err != nil {
					return err
				}
				defer r.Close(ctx)
				for range 2 { // twice: a second Read must not see the first's leftovers
					if err := r.Enqueue(ctx, d, spec, ctx.Stream()); err != nil {
						return err
					}
					if err := ctx.Sync(ctx.Stream()); err != nil {
						return err
					}
					if err := r.Read(ctx, ctx.Stream(), &got); err != nil {
						return err
					}
				}
				if got.Complete || greedy {
					return nil
				}
				for _, dc := range draws { // the draw on the device, after an incomplete reduction
					for _, u := range []float64{0.1, 0.6} {
						id, err := r.Draw(ctx, sample.DeviceDraw{TopK: dc.k, TopP: dc.topP, Z: got.Z, U: u}, ctx.Stream())
						if err != nil {
							return err
						}
						w := smpCase{logits: l, invT: c.invT, thr: c.thr, k: dc.k, topP: dc.topP}
						drawn = append(drawn, [2]int{id, smpDrawWant(w, u)})
					}
				}
				return nil
			})
			if err != nil {
				t.Fatalf("%d candidates, greedy %v: %v", count, greedy, err)
			}
			if got.Best != want.Best || got.Bad || got.Complete != want.Complete || len(got.IDs) != len(want.IDs) {
				t.Fatalf("%d candidates (want count %d), greedy %v: best %d complete %v, %d ids; want %d %v %d", count, wantCount, greedy, got.Best, got.Complete, len(got.IDs), want.Best, want.Complete, len(want.IDs))
			}
			if greedy {
				continue
			}
			for i, d := range drawn {
				if d[0] != d[1] {
					t.Errorf("%d candidates: draw %d drew %d, want %d", count, i, d[0], d[1])
				}
			}
			if !want.Complete && len(drawn) != 2*len(draws) {
				t.Errorf("%d candidates: %d draws made, want %d", count, len(drawn), 2*len(draws))
			}
			if math.Abs(got.Z-want.Z) > 1e-12*want.Z {
				t.Errorf("%d candidates: z %v, want %v", count, got.Z, want.Z)
			}
			for i := range want.IDs {
				if got.IDs[i] != want.IDs[i] || math.Abs(got.E[i]-want.E[i]) > 1e-14*want.E[i] {
					t.Fatalf("%d candidates: candidate %d is %d:%v, want %d:%v", count, i, got.IDs[i], got.E[i], want.IDs[i], want.E[i])
				}
			}
		}
	}
}

// smpDrawWant is smp_draw's contract in float64 for case c and draw u: the
// candidates (e >= thr) ranked by e, larger first, the lower id on ties;
// the top c.k of them (their mass the normaliser; without top-k the row's
// Z); then the fewest ranked first whose mass reaches c.topP of it (all
// when they do not); then u times the kept mass walked in id order.
func smpDrawWant(c smpCase, u float64) int {
	r, _ := smpWant(smpCase{logits: c.logits, invT: c.invT, thr: c.thr, keep: math.MaxInt})
	type ce struct {
		id int32
		e  float64
	}
	kept := make([]ce, len(r.IDs))
	for i := range r.IDs {
		kept[i] = ce{r.IDs[i], r.E[i]}
	}
	slices.SortFunc(kept, func(a, b ce) int {
		if a.e != b.e {
			return cmp.Compare(b.e, a.e)
		}
		return cmp.Compare(a.id, b.id)
	})
	zk := r.Z
	if c.k > 0 && c.k <= len(kept) {
		kept = kept[:c.k]
		zk = 0
		for _, x := range kept {
			zk += x.e
		}
	}
	if c.topP > 0 {
		var cum float64
		for i, x := range kept {
			if cum += x.e; cum >= c.topP*zk {
				kept = kept[:i+1]
				break
			}
		}
	}
	slices.SortFunc(kept, func(a, b ce) int { return cmp.Compare(a.id, b.id) })
	var total float64
	for _, x := range kept {
		total += x.e
	}
	v := u * total
	for _, x := range kept {
		if v -= x.e; v < 0 {
			return int(x.id)
		}
	}
	return int(kept[len(kept)-1].id)
}

func TestSampleReducerGreedySlots(t *testing.T) {
	// EnqueueGreedy on the GPU: two rows reduced into the two host slots
	// before either is read, each slot holding its own row's argmax (from
	// a float64-free count: the rows' largest values are placed), and the
	// hand-off writing the second row's argmax and the position one on.
	// A row of -Inf hands off token 0 and says it has no argmax.
	const n = 2*smpChunk + 77
	rows := [][]float32{make([]float32, n), make([]float32, n), make([]float32, n)}
	for i := range n {
		rows[0][i] = float32(i%1000) / 1000
		rows[1][i] = -float32(i%313) / 313
		rows[2][i] = float32(math.Inf(-1))
	}
	rows[0][n-5] = 3  // the last chunk
	rows[1][9000] = 2 // the second chunk, a tie after it
	rows[1][9001] = 2
	want := []int{n - 5, 9000, -1}
	dev := testDevice(t)
	for k := 1; k < len(rows); k++ {
		var got [2]sample.Reduction
		var fed [2]int32
		err := dev.Do(func(ctx *Ctx) error {
			d, err := ctx.MemAlloc(4*2*n + 8)
			if err != nil {
				return err
			}
			defer ctx.MemFree(d)
			tok, pos := d+DevicePtr(8*n), d+DevicePtr(8*n+4)
			if err := ctx.CopyFloatsToDevice(d, rows[0]); err != nil {
				return err
			}
			if err := ctx.CopyFloatsToDevice(d+DevicePtr(4*n), rows[k]); err != nil {
				return err
			}
			if err := ctx.CopyToDevice(tok, []byte{7, 0, 0, 0, 41, 0, 0, 0}); err != nil {
				return err
			}
			r, err := ctx.NewSampleReducer(n)
			if err != nil {
				return err
			}
			defer r.Close(ctx)
			st := ctx.Stream()
			if err := r.EnqueueGreedy(ctx, d, 0, 0, 0, st); err != nil {
				return err
			}
			if err := r.EnqueueGreedy(ctx, d+DevicePtr(4*n), 1, tok, pos, st); err != nil {
				return err
			}
			if err := ctx.Sync(st); err != nil {
				return err
			}
			for i := range got {
				if err := r.ReadGreedy(i, &got[i]); err != nil {
					return err
				}
			}
			b := make([]byte, 8)
			if err := ctx.CopyFromDevice(b, tok); err != nil {
				return err
			}
			fed = [2]int32{int32(binary.LittleEndian.Uint32(b)), int32(binary.LittleEndian.Uint32(b[4:]))}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if got[0].Best != want[0] || got[0].Bad || got[0].N != n {
			t.Errorf("slot 0: best %d bad %v n %d, want %d false %d", got[0].Best, got[0].Bad, got[0].N, want[0], n)
		}
		if got[1].Best != want[k] || got[1].Bad {
			t.Errorf("row %d in slot 1: best %d bad %v, want %d false", k, got[1].Best, got[1].Bad, want[k])
		}
		if fed != [2]int32{int32(max(want[k], 0)), 42} {
			t.Errorf("row %d: handed off token %d at position %d, want %d at 42", k, fed[0], fed[1], max(want[k], 0))
		}
	}
}
