package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
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
	return []smpCase{
		{"peaked top-p", peaked, false, 1 / 0.6, 1e-4, SampleKeep},
		{"peaked greedy", peaked, true, 0, 0, SampleKeep},
		{"peaked min-p", peaked, false, 1.25, 0.05, SampleKeep},
		{"ties", ties, false, 1, 1e-4, 64},
		{"ties greedy", ties, true, 0, 0, 64},
		{"masked ids", masked, false, 1, 1e-3, SampleKeep},
		{"flat over the capacity", flat, false, 1 / 0.6, 1e-4, 64},
		{"flat at the capacity", flat, false, 1 / 0.6, 1e-4, len(nFlat.IDs)},
		{"all masked", allMasked, false, 1, 1e-4, 64},
		{"NaN", withNaN, false, 1, 1e-4, 64},
		{"NaN greedy", withNaN, true, 0, 0, 64},
		{"+Inf", withInf, false, 1, 1e-4, 64},
		{"small row", small, false, 0.5, 1e-4, 64},
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
#include "kern.inc"

template <class F> void launch(unsigned grid, F k) {
  gridDim = {grid, 1, 1}; blockDim = {SMP_THREADS, 1, 1};
  for (unsigned b = 0; b < grid; b++) {
    std::barrier<> bb(SMP_THREADS);
    g_block_bar = &bb;
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < SMP_THREADS; t++)
      ts.emplace_back([=] { threadIdx = {t, 0, 0}; blockIdx = {b, 0, 0}; k(); });
    for (auto &t : ts) t.join();
  }
}

struct Case { std::vector<float> l; int greedy; double invT, thr; int keep; };
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
    launch(1, [&] { smp_fin(p, nb, c.greedy, cid.data(), ce.data(), c.keep, out.data()); });
    SmpHead h; memcpy(&h, out.data(), sizeof h);
    printf("case %zu best %d bad %d count %d complete %d z %.17g\n", ci, h.best, h.bad, h.count, h.complete, h.z);
    printf("ids");
    if (!c.greedy && !h.bad && h.best >= 0 && h.complete)
      for (int i = 0; i < h.count; i++) {
        int id; double e;
        memcpy(&id, out.data() + SMP_IDS_OFF + 4 * i, 4);
        memcpy(&e, out.data() + SMP_IDS_OFF + 4 * c.keep + 8 * i, 8);
        printf(" %d:%.17g", id, e);
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
		fmt.Fprintf(&gen, "}, %d, %s, %s, %d},\n", g, strconv.FormatFloat(c.invT, 'g', -1, 64), strconv.FormatFloat(c.thr, 'g', -1, 64), c.keep)
	}
	gen.WriteString("};\n")
	lines := runHostEmulation(t, map[string]string{"kern.inc": sampleSrc, "gen.inc": gen.String(), "emu.cpp": smpEmuHarness})
	if len(lines) != 2*len(cases) {
		t.Fatalf("emulation printed %d lines, want two per case:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want, count := smpWant(c)
			var ci, best, bad, gotCount, complete int
			var z float64
			if _, err := fmt.Sscanf(lines[2*i], "case %d best %d bad %d count %d complete %d z %g", &ci, &best, &bad, &gotCount, &complete, &z); err != nil || ci != i {
				t.Fatalf("line %q: %v", lines[2*i], err)
			}
			if best != want.Best || (bad != 0) != want.Bad {
				t.Fatalf("best %d bad %d, want %d %v", best, bad, want.Best, want.Bad)
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
			f := strings.Fields(lines[2*i+1])
			if len(f) == 0 || f[0] != "ids" {
				t.Fatalf("line %q: want ids", lines[2*i+1])
			}
			if !want.Complete {
				if len(f) != 1 {
					t.Errorf("an incomplete result listed %d candidates", len(f)-1)
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
	for i := range r.IDs {
		le.PutUint32(b[smpIDsOff+4*i:], uint32(r.IDs[i]))
		le.PutUint64(b[smpIDsOff+4*keep+8*i:], math.Float64bits(r.E[i]))
	}
	return b
}

func TestDecodeReduction(t *testing.T) {
	good := sample.Reduction{N: 50, Best: 4, Z: 1.75, IDs: []int32{4, 9}, E: []float64{1, 0.75}, Complete: true}
	for _, c := range []struct {
		name    string
		b       []byte
		greedy  bool
		want    sample.Reduction
		wantErr string
	}{
		{"complete", smpResult(good, 2, 8), false, good, ""},
		{"greedy reads the head only", smpResult(good, 2, 8)[:smpIDsOff], true, sample.Reduction{N: 50, Best: 4, Z: 1.75}, ""},
		{"incomplete", smpResult(sample.Reduction{N: 50, Best: 4, Z: 30}, 40, 8), false, sample.Reduction{N: 50, Best: 4, Z: 30}, ""},
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
// Sync, Read) and draws with SampleReduced, falling back to the logits
// when it must; "host" downloads the row into registered memory and calls
// Sample, as a step without a reducer does.
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
