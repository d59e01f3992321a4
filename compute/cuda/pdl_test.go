package cuda

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"moxie/compute"
	"moxie/compute/computetest"
	"moxie/compute/ref"
)

// kernelSources is every embedded kernel source, by module file name, and
// the moe modules' sources as split from moe.cu (each must carry the
// marker itself: Module reads it from the source it compiles).
func kernelSources(t *testing.T) map[string]string {
	t.Helper()
	moeDef, moeBench, err := MoEModuleSources()
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{
		"attn.cu": AttnSource(), "attndec.cu": AttnDecSource(), "fuse.cu": FuseSource(), "fwd.cu": FwdSource(),
		"gemv.cu": GemvSource(), "idxdec.cu": IdxDecSource(), "linear.cu": LinearSource(), "moe.cu": MoESource(),
		"moe.cu (module moe)": moeDef, "moe.cu (module moe_bench)": moeBench,
		"ops.cu": OpsSource(), "prefetch.cu": PrefetchSource(), "route.cu": RouteSource(),
	}
}

var (
	globalFn = regexp.MustCompile(`__global__[^{;]*\{`)
	calledFn = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)\s*\(`)
)

// pdlViolations returns the __global__ functions of src whose body does not
// start with MOXIE_PDL(); or MOXIE_PDL_PF(...); (line continuations and
// blanks skipped; the parentheses of MOXIE_PDL_PF balanced, its arguments
// free of reads through pointers: no ->, __ldg or asm), nor with
// MOXIE_PDL_WAIT(); in a body (to its matching brace) that also contains
// MOXIE_PDL_TRIGGER() (a kernel with a grid-wide barrier).
func pdlViolations(src string) []string {
	var bad []string
	for _, m := range globalFn.FindAllStringIndex(src, -1) {
		body := strings.TrimLeft(src[m[1]:], " \t\r\n\\")
		if strings.HasPrefix(body, "MOXIE_PDL();") || strings.HasPrefix(body, "MOXIE_PDL_INSIDE();") || pdlArgStatement(body, "MOXIE_PDL_PF(") || pdlArgStatement(body, "MOXIE_PDL_UNLESS(") {
			continue
		}
		if strings.HasPrefix(body, "MOXIE_PDL_WAIT();") && strings.Contains(braceBody(src[m[1]:]), "MOXIE_PDL_TRIGGER()") {
			continue
		}
		name := "?"
		for _, c := range calledFn.FindAllStringSubmatch(src[m[0]:m[1]], -1) {
			if c[1] != "__launch_bounds__" {
				name = c[1]
			}
		}
		bad = append(bad, name)
	}
	return bad
}

// braceBody returns s up to the brace that closes the one just before it
// (all of s when none does).
func braceBody(s string) string {
	depth := 1
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '{':
			depth++
		case '}':
			depth--
			if depth == 0 {
				return s[:i]
			}
		}
	}
	return s
}

// pdlArgStatement reports whether body starts with a whole pre...);
// statement (pre: MOXIE_PDL_PF( or MOXIE_PDL_UNLESS() whose arguments read
// no memory through a pointer as far as a text check can tell (no ->,
// __ldg, asm or [: the contract in module.go allows only arithmetic on the
// kernel's arguments before the wait).
func pdlArgStatement(body, pre string) bool {
	if !strings.HasPrefix(body, pre) {
		return false
	}
	depth := 1
	for i := len(pre); i < len(body); i++ {
		switch body[i] {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				args := body[len(pre):i]
				for _, bad := range []string{"->", "__ldg", "asm", "{", "["} {
					if strings.Contains(args, bad) && !(bad == "{" && strings.HasPrefix(strings.TrimSpace(args), "MoxiePF{")) {
						return false
					}
				}
				return strings.HasPrefix(strings.TrimLeft(body[i+1:], " \t\r\n\\"), ";")
			}
		case ';':
			return false
		}
	}
	return false
}

// TestPDLMarkers checks the contract of pdlMarker: a source that opts in to
// programmatic dependent launch starts every kernel with MOXIE_PDL(); (a
// kernel that read its inputs before it would race with the kernel before
// it on the stream), MOXIE_PDL_PF(...); or, for a kernel that triggers its
// dependents itself later (MOXIE_PDL_TRIGGER() in its body: a grid-wide
// barrier), MOXIE_PDL_WAIT();.
func TestPDLMarkers(t *testing.T) {
	t.Run("checker", func(t *testing.T) {
		src := "extern \"C\" __global__ void __launch_bounds__(256) a(int *x) { MOXIE_PDL(); x[0] = 1; }\n" +
			"#define K(N) extern \"C\" __global__ void N(int *x) { \\\n  MOXIE_PDL(); x[0] = 2; }\n" +
			"template <int U> __global__ void b(const float *x,\n  int n) {\n  x += n;\n}\n" +
			"extern \"C\" __global__ void c(const float *w, int n) { MOXIE_PDL_PF(w + 2 * (n + 1), n * 4); }\n" +
			"#define L(N) extern \"C\" __global__ void N(A a) { \\\n  MOXIE_PDL_PF(pf<1, 2>(a)) ; f(a); }\n" +
			"extern \"C\" __global__ void e(A a) { MOXIE_PDL_PF(MoxiePF{a.w, a.v, 128, 0, 1}); }\n" +
			"extern \"C\" __global__ void d(const A *a) { MOXIE_PDL_PF(a->w, 64); }\n" +
			"extern \"C\" __global__ void f(const float *w, const int *ids) { MOXIE_PDL_PF(w + __ldg(ids), 64); }\n" +
			"extern \"C\" __global__ void g(const float *w, int n) { MOXIE_PDL_PF(w, n) x = 1; }\n" +
			"extern \"C\" __global__ void h(const float *w, int n) { MOXIE_PDL_PF(w, n; }\n" +
			"extern \"C\" __global__ void i(A a) { MOXIE_PDL_WAIT(); p1(a); if (a.n) { sync(a); } MOXIE_PDL_TRIGGER(); p2(a); }\n" +
			"#define M(N) extern \"C\" __global__ void N(A a) { \\\n  MOXIE_PDL_WAIT(); \\\n  p1(a); \\\n  MOXIE_PDL_TRIGGER(); \\\n  }\n" +
			"extern \"C\" __global__ void j(A a) { MOXIE_PDL_WAIT(); p1(a); }\n" +
			"extern \"C\" __global__ void k(A a) { MOXIE_PDL_WAIT(); p1(a); }\nvoid later() { MOXIE_PDL_TRIGGER(); }\n" +
			"extern \"C\" __global__ void l(A a) { p1(a); MOXIE_PDL_WAIT(); MOXIE_PDL_TRIGGER(); }\n" +
			"extern \"C\" __global__ void m(A a) { MOXIE_PDL_UNLESS((int)blockIdx.x < (a.n >> 4)); p1(a); }\n" +
			"extern \"C\" __global__ void n(A a) { MOXIE_PDL_UNLESS(a.ids[0] > 0); p1(a); }\n" +
			"extern \"C\" __global__ void o(A a) { MOXIE_PDL_UNLESS(__ldg(a.ids) > 0); p1(a); }\n" +
			"extern \"C\" __global__ void p(A a) { p1(a); MOXIE_PDL_UNLESS(1); }\n" +
			"extern \"C\" __global__ void q(A a) { MOXIE_PDL_INSIDE(); body(a); }\n" +
			"extern \"C\" __global__ void r(A a) { body(a); MOXIE_PDL_INSIDE(); }\n"
		if got := pdlViolations(src); !slices.Equal(got, []string{"b", "d", "f", "g", "h", "j", "k", "l", "n", "o", "p", "r"}) {
			t.Fatalf("violations %q, want [b d f g h j k l n o p r]", got)
		}
	})
	opted := 0
	for name, src := range kernelSources(t) {
		if !hasPDLMarker(src) {
			t.Logf("%s: no %s (its kernels launch without programmatic dependencies)", name, pdlMarker)
			continue
		}
		opted++
		if bad := pdlViolations(src); len(bad) > 0 {
			t.Errorf("%s carries %s but these kernels do not start with MOXIE_PDL(); or MOXIE_PDL_PF(...); (or MOXIE_PDL_WAIT(); with a MOXIE_PDL_TRIGGER() later): %v", name, pdlMarker, bad)
		}
	}
	if opted == 0 {
		t.Errorf("no kernel source opts in to programmatic dependent launch")
	}
}

// pdlTestSrc: a producer that spins before writing (so that a consumer not
// waiting for it would read stale values) and a consumer, both opting in.
const pdlTestSrc = pdlMarker + `
extern "C" __global__ void pdl_produce(float *x, int n, float seed, long long spin) {
    MOXIE_PDL();
    long long t0 = clock64();
    while (clock64() - t0 < spin) {}
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = seed + i;
}
extern "C" __global__ void pdl_consume(float *y, const float *x, int n) {
    MOXIE_PDL();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] += 2 * x[i];
}
`

// pdlUnlessSrc: pdlTestSrc's producer, a middle kernel that reads x into
// y2, and a kernel whose blocks skip the wait (MOXIE_PDL_UNLESS(1)) and
// read x, written two kernels back.
const pdlUnlessSrc = pdlTestSrc + `
extern "C" __global__ void pdl_early(float *y, const float *x, int n) {
    MOXIE_PDL_UNLESS(1);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] += 3 * x[i];
}
`

// TestPDLUnless checks MOXIE_PDL_UNLESS's contract (module.go) on the
// device: rounds of [producer (spins, then writes x), consumer (y2 +=
// 2x, waits), early (y += 3x, its blocks skip the wait)] on one stream, as
// plain launches and replayed as a captured graph; early must see every
// round's x although it does not wait (y accumulates 3·(seed+i), y2
// 2·(seed+i); exact in float32).
func TestPDLUnless(t *testing.T) {
	dev := testDevice(t)
	const n, rounds = 1 << 16, 20
	err := dev.Do(func(c *Ctx) error {
		m, err := c.Module("pdl_unless_test", pdlUnlessSrc)
		if err != nil {
			return err
		}
		var prod, cons, early *Kernel
		for _, k := range []struct {
			name string
			k    **Kernel
		}{{"pdl_produce", &prod}, {"pdl_consume", &cons}, {"pdl_early", &early}} {
			if *k.k, err = m.Kernel(k.name); err != nil {
				return err
			}
		}
		a, err := c.NewArena(12 * n)
		if err != nil {
			return err
		}
		defer c.ReleaseArena(a)
		x, _ := a.Alloc(4 * n)
		y, _ := a.Alloc(4 * n)
		y2, _ := a.Alloc(4 * n)
		st := c.Stream()
		enqueue := func() error {
			nn := int32(n)
			spin := int64(20000)
			for r := range rounds {
				seed := float32(r)
				if err := c.Launch(prod, Dim3{X: 64}, Dim3{X: 256}, 0, st, unsafe.Pointer(&x), unsafe.Pointer(&nn), unsafe.Pointer(&seed), unsafe.Pointer(&spin)); err != nil {
					return err
				}
				if err := c.Launch(cons, Dim3{X: 132}, Dim3{X: 256}, 0, st, unsafe.Pointer(&y2), unsafe.Pointer(&x), unsafe.Pointer(&nn)); err != nil {
					return err
				}
				if err := c.Launch(early, Dim3{X: 132}, Dim3{X: 256}, 0, st, unsafe.Pointer(&y), unsafe.Pointer(&x), unsafe.Pointer(&nn)); err != nil {
					return err
				}
			}
			return nil
		}
		check := func(what string, times int) error {
			sumSeeds := float32(rounds * (rounds - 1) / 2)
			for _, b := range []struct {
				p DevicePtr
				f float32
			}{{y, 3}, {y2, 2}} {
				got := make([]float32, n)
				if err := c.CopyFloatsFromDevice(got, b.p); err != nil {
					return err
				}
				for i, v := range got {
					if want := float32(times) * b.f * (sumSeeds + float32(rounds*i)); v != want {
						return fmt.Errorf("%s: %vx sum [%d] = %v, want %v (a kernel read x before its producer finished?)", what, b.f, i, v, want)
					}
				}
			}
			return nil
		}
		zero := func() error { return errors.Join(c.Memset(y, 0, 4*n, st), c.Memset(y2, 0, 4*n, st)) }
		return plainThenGraph(c, st, zero, enqueue, check)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestPDLChain runs producer/consumer pairs back to back on one stream, as
// plain launches and replayed as a captured graph: with programmatic
// dependent launch on, each consumer must still see its producer's values
// (y accumulates 2·(seed+i) over the seeds; exact in float32).
func TestPDLChain(t *testing.T) {
	dev := testDevice(t)
	const n, rounds = 1 << 16, 20
	var log []string
	err := dev.Do(func(c *Ctx) error {
		log = append(log, fmt.Sprintf("programmatic dependent launch on this device: %v", c.d.pdl))
		m, err := c.Module("pdl_test", pdlTestSrc)
		if err != nil {
			return err
		}
		prod, err := m.Kernel("pdl_produce")
		if err != nil {
			return err
		}
		cons, err := m.Kernel("pdl_consume")
		if err != nil {
			return err
		}
		if !prod.pdl || !cons.pdl {
			return fmt.Errorf("kernels of a source with %s not flagged for programmatic launch", pdlMarker)
		}
		a, err := c.NewArena(8 * n)
		if err != nil {
			return err
		}
		defer c.ReleaseArena(a)
		x, _ := a.Alloc(4 * n)
		y, _ := a.Alloc(4 * n)
		st := c.Stream()
		enqueue := func() error {
			nn := int32(n)
			spin := int64(20000)
			for r := range rounds {
				seed := float32(r)
				if err := c.Launch(prod, Dim3{X: 64}, Dim3{X: 256}, 0, st, unsafe.Pointer(&x), unsafe.Pointer(&nn), unsafe.Pointer(&seed), unsafe.Pointer(&spin)); err != nil {
					return err
				}
				if err := c.Launch(cons, Dim3{X: 132}, Dim3{X: 256}, 0, st, unsafe.Pointer(&y), unsafe.Pointer(&x), unsafe.Pointer(&nn)); err != nil {
					return err
				}
			}
			return nil
		}
		check := func(what string, times int) error {
			got := make([]float32, n)
			if err := c.CopyFloatsFromDevice(got, y); err != nil {
				return err
			}
			sumSeeds := float32(rounds * (rounds - 1) / 2)
			for i, v := range got {
				want := float32(times) * 2 * (sumSeeds + float32(rounds*i))
				if v != want {
					return fmt.Errorf("%s: y[%d] = %v, want %v (a consumer read its producer's input early?)", what, i, v, want)
				}
			}
			return nil
		}
		zero := func() error { return c.Memset(y, 0, 4*n, st) }
		return plainThenGraph(c, st, zero, enqueue, check)
	})
	for _, l := range log {
		t.Log(l)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// plainThenGraph runs a chain test's two passes on st: zero, enqueue as
// plain launches, check(what, 1); then zero, enqueue captured as a graph
// replayed 3 times, check(what, 3).
func plainThenGraph(c *Ctx, st Stream, zero, enqueue func() error, check func(what string, times int) error) error {
	if err := zero(); err != nil {
		return err
	}
	if err := enqueue(); err != nil {
		return err
	}
	if err := check("plain launches", 1); err != nil {
		return err
	}
	if err := zero(); err != nil {
		return err
	}
	if err := c.BeginCapture(st); err != nil {
		return err
	}
	if err := enqueue(); err != nil {
		return err
	}
	g, err := c.EndCapture(st)
	if err != nil {
		return err
	}
	defer c.DestroyGraph(g)
	for range 3 {
		if err := c.LaunchGraph(g, st); err != nil {
			return err
		}
	}
	return check("graph replays", 3)
}

// pfEmuHarness runs pdlPreamble's moxie_pdl_pf on the CPU: every thread of
// a block of NT threads in turn, MOXIE_PF_HINT recording the hint
// addresses. Input: lines "p q bytes stride count nt"; output: per case the
// addresses, one a line, then "end".
const pfEmuHarness = `#include <cstdio>
#include <vector>
struct MoxieDim3 { unsigned x, y, z; };
static MoxieDim3 threadIdx, blockDim;
static std::vector<unsigned long long> hits;
#define __device__
#define __forceinline__ inline
#define MOXIE_PF_HINT(a) hits.push_back(a)
#include "preamble.inc"
int main() {
  unsigned long long p, q;
  long long bytes, stride;
  int count, nt;
  while (scanf("%llu %llu %lld %lld %d %d", &p, &q, &bytes, &stride, &count, &nt) == 6) {
    hits.clear();
    blockDim = MoxieDim3{(unsigned)nt, 1, 1};
    for (int t = 0; t < nt; t++) {
      threadIdx = MoxieDim3{(unsigned)t, 0, 0};
      moxie_pdl_pf(MoxiePF{(const void *)p, (const void *)q, bytes, stride, count});
    }
    for (unsigned long long a : hits) printf("%llu\n", a);
    printf("end\n");
  }
  return 0;
}
`

// TestPDLPrefetchLines runs moxie_pdl_pf (pdlPreamble) on the CPU (g++,
// see pfEmuHarness) over aligned and unaligned ranges, strides, one and two
// arrays, and block sizes, and checks its hints against the ranges worked
// out here: every hint address lies inside a range, every 128-byte line
// that meets a range gets a hint, no (range, line) gets two; empty
// descriptors and -DMOXIE_NO_PDLPF give none. The pieces of a case do not
// overlap (as in every kernel's use). Skipped without g++.
func TestPDLPrefetchLines(t *testing.T) {
	type pfCase struct {
		p, q          uint64
		bytes, stride int64
		count, nt     int
	}
	const base = uint64(1) << 40
	cases := []pfCase{
		{base, 0, 1024, 0, 1, 256},                   // one aligned range
		{base, 0, 1024, 4096, 16, 256},               // gemv wo_b: 16 pieces of 1 KB
		{base + 64, 0, 1000, 0, 1, 32},               // unaligned start and end
		{base, 0, 100, 8192 + 40, 7, 64},             // unaligned stride
		{base, base + (1 << 30), 512, 512, 128, 256}, // moe stage 1: two arrays, contiguous pieces
		{base + 3, base + 1<<30 + 77, 300, 1000, 5, 96},
		{base, 0, 1, 0, 1, 256},          // one byte
		{base, 0, 128 * 1000, 0, 1, 256}, // more lines than threads
		{base, 0, 0, 0, 1, 256},          // nothing asked
		{base, 0, 4096, 4096, 0, 256},
		{0, 0, 4096, 4096, 4, 256}, // null pointer: nothing
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 40 {
		// Pieces do not overlap (stride >= bytes), nor do the arrays.
		c := pfCase{p: base + uint64(rng.IntN(4096)), bytes: int64(1 + rng.IntN(3000)), count: 1 + rng.IntN(20), nt: 32 * (1 + rng.IntN(8))}
		c.stride = c.bytes + int64(rng.IntN(5000))
		if rng.IntN(2) == 0 {
			c.q = base + 1<<32 + uint64(rng.IntN(4096))
		}
		if rng.IntN(3) == 0 {
			c.p &^= 127
			c.stride &^= 127
		}
		cases = append(cases, c)
	}
	var in strings.Builder
	for _, c := range cases {
		fmt.Fprintf(&in, "%d %d %d %d %d %d\n", c.p, c.q, c.bytes, c.stride, c.count, c.nt)
	}
	run := func(def string) [][]uint64 {
		flags := []string{"-std=c++17"}
		if def != "" {
			flags = append(flags, "-D"+def)
		}
		bin := buildHostEmulation(t, map[string]string{"preamble.inc": pdlPreamble, "emu.cpp": pfEmuHarness}, flags...)
		cmd := exec.Command(bin)
		cmd.Stdin = strings.NewReader(in.String())
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("emulation: %v", err)
		}
		var res [][]uint64
		var cur []uint64
		for _, l := range strings.Fields(string(out)) {
			if l == "end" {
				res = append(res, cur)
				cur = nil
				continue
			}
			v, err := strconv.ParseUint(l, 10, 64)
			if err != nil {
				t.Fatalf("emulation printed %q", l)
			}
			cur = append(cur, v)
		}
		if len(res) != len(cases) {
			t.Fatalf("emulation answered %d cases, want %d", len(res), len(cases))
		}
		return res
	}
	for i, hits := range run("") {
		c := cases[i]
		t.Run(fmt.Sprintf("case%d", i), func(t *testing.T) {
			type rl struct {
				r    int
				line uint64
			}
			want := map[rl]bool{} // (range, line) pairs that must get one hint
			var ranges [][2]uint64
			if c.p != 0 && c.bytes > 0 {
				for _, arr := range []uint64{c.p, c.q} {
					if arr == 0 {
						continue
					}
					for k := range c.count {
						lo := arr + uint64(int64(k)*c.stride)
						ranges = append(ranges, [2]uint64{lo, lo + uint64(c.bytes)})
					}
				}
			}
			for r, rg := range ranges {
				for l := rg[0] / 128; l <= (rg[1]-1)/128; l++ {
					want[rl{r, l}] = false
				}
			}
			for _, a := range hits {
				// The hint serves the first range (in the order above) that holds it
				// and is not yet served on that line.
				served := false
				for r, rg := range ranges {
					if a >= rg[0] && a < rg[1] {
						if done, ok := want[rl{r, a / 128}]; ok && !done {
							want[rl{r, a / 128}] = true
							served = true
							break
						}
					}
				}
				if !served {
					t.Fatalf("%+v: hint %#x outside every range or a second one for its line (ranges %d)", c, a, len(ranges))
				}
			}
			for k, done := range want {
				if !done {
					t.Fatalf("%+v: no hint for line %#x of range %d %#x", c, k.line*128, k.r, ranges[k.r])
				}
			}
		})
	}
	for i, hits := range run("MOXIE_NO_PDLPF") {
		if len(hits) != 0 {
			t.Errorf("-DMOXIE_NO_PDLPF: case %d (%+v) still issued %d hints", i, cases[i], len(hits))
		}
	}
}

// pdlPFTestSrc: pdl_fill spins, then writes x[i] = ((7i + seed) mod 13) - 6
// (small integers, exact), so a consumer that read x before waiting would
// see the previous round's values; pdl_rms is a one-block, latency-bound
// step (x[i] = y[i mod ny]·rsqrt(mean(y²) + 1e-6)), the benchmark's stand-in
// for a decode layer's small kernels between weight-bound ones.
const pdlPFTestSrc = pdlMarker + `
extern "C" __global__ void pdl_fill(float *x, int n, int seed, long long spin) {
    MOXIE_PDL();
    long long t0 = clock64();
    while (clock64() - t0 < spin) {}
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = (float)((i * 7 + seed) % 13) - 6.f;
}
extern "C" __global__ void pdl_rms(float *x, const float *y, int nx, int ny) {
    MOXIE_PDL();
    __shared__ float part[32];
    float s = 0.f;
    for (int i = threadIdx.x; i < ny; i += blockDim.x) s = fmaf(y[i], y[i], s);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    float tot = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) tot += part[w];
    const float r = rsqrtf(tot / ny + 1e-6f);
    for (int i = threadIdx.x; i < nx; i += blockDim.x) x[i] = y[i % ny] * r;
}
`

// pdlFillX is pdl_fill's x on the host.
func pdlFillX(n, seed int) []float64 {
	x := make([]float64, n)
	for i := range x {
		x[i] = float64((i*7+seed)%13) - 6
	}
	return x
}

// TestPDLPrefetchChain runs the kernels that start with MOXIE_PDL_PF
// (Gemv at U 2 and 4, FP8 and BF16; the vec linear kernel of wq_b) right
// after a producer of their input (pdl_fill, spinning first) on one
// stream, as plain launches and replayed as a captured graph, and checks
// every round's output against the float64 reference of that round's
// input: the prefetch before the wait must not let a consumer read x
// early, nor change its result.
func TestPDLPrefetchChain(t *testing.T) {
	dev := testDevice(t)
	type consumer struct {
		name       string
		f          compute.Format
		rows, cols int
		gemvU      int // 0: Linear (the automatic choice: vec at one token)
	}
	cons := []consumer{
		{"gemv wo_b fp8 u2", compute.FP8Block, 4096, 8192, 2},
		{"gemv bf16 u4", compute.BF16, 256, 4096, 4},
		{"linear wq_b fp8", compute.FP8Block, 32768, 1024, 0},
	}
	const rounds = 3
	wants := make([][][]float64, len(cons)) // [consumer][round]
	datas := make([]compute.WeightData, len(cons))
	for j, cs := range cons {
		datas[j] = randomWeightPar(uint64(40+j), cs.f, cs.rows, cs.cols, 0.05)
		w := ref.ParallelDequant(datas[j])
		for r := range rounds {
			wants[j] = append(wants[j], ref.ParallelGroupedLinear(w, cs.rows, cs.cols, pdlFillX(cs.cols, r), 1, 1))
		}
	}
	var errs []string
	err := dev.Do(func(c *Ctx) error {
		d := &devBufs{c: c}
		defer d.free()
		m, err := c.Module("pdl_pf_test", pdlPFTestSrc)
		if err != nil {
			return err
		}
		fill, err := m.Kernel("pdl_fill")
		if err != nil {
			return err
		}
		var launches []func(y DevicePtr) error
		var xs []DevicePtr
		for j, cs := range cons {
			w := d.weight(datas[j])
			x := d.alloc(4 * cs.cols)
			xs = append(xs, x)
			if d.err != nil {
				return d.err
			}
			if cs.gemvU == 0 {
				launches = append(launches, func(y DevicePtr) error { return c.Linear(w, y, x, 1, c.Stream()) })
				continue
			}
			u := cs.gemvU
			launches = append(launches, func(y DevicePtr) error {
				g, err := c.PrepareGemv([]GemvProj{{W: w, Y: y, X: x}}, GemvVariant{U: u})
				if err != nil {
					return err
				}
				return c.LaunchGemv(g, c.Stream())
			})
		}
		ys := make([][]DevicePtr, len(cons))
		for j, cs := range cons {
			for range rounds {
				ys[j] = append(ys[j], d.alloc(4*cs.rows))
			}
		}
		if d.err != nil {
			return d.err
		}
		st := c.Stream()
		enqueue := func() error {
			for r := range rounds {
				for j, cs := range cons {
					n, seed, spin := int32(cs.cols), int32(r), int64(20000)
					if err := c.Launch(fill, Dim3{X: 8}, Dim3{X: 256}, 0, st, unsafe.Pointer(&xs[j]), unsafe.Pointer(&n), unsafe.Pointer(&seed), unsafe.Pointer(&spin)); err != nil {
						return err
					}
					if err := launches[j](ys[j][r]); err != nil {
						return err
					}
				}
			}
			return nil
		}
		poison := func() error {
			for j, cs := range cons {
				for r := range rounds {
					if err := c.Memset(ys[j][r], 0xff, 4*cs.rows, st); err != nil {
						return err
					}
				}
			}
			return nil
		}
		check := func(what string) error {
			for j, cs := range cons {
				for r := range rounds {
					got := make([]float32, cs.rows)
					if err := c.CopyFloatsFromDevice(got, ys[j][r]); err != nil {
						return err
					}
					if e := computetest.MaxRel(got, wants[j][r]); !(e <= computetest.TolLinear) {
						errs = append(errs, fmt.Sprintf("%s, %s, round %d: max relative error %.3g > %.3g (x read before its producer finished?)", what, cs.name, r, e, computetest.TolLinear))
					}
				}
			}
			return nil
		}
		if err := poison(); err != nil {
			return err
		}
		if err := enqueue(); err != nil {
			return err
		}
		if err := check("plain launches"); err != nil {
			return err
		}
		if err := poison(); err != nil {
			return err
		}
		if err := c.BeginCapture(st); err != nil {
			return err
		}
		if err := enqueue(); err != nil {
			_, _ = c.EndCapture(st)
			return err
		}
		g, err := c.EndCapture(st)
		if err != nil {
			return err
		}
		defer c.DestroyGraph(g)
		for range 2 {
			if err := c.LaunchGraph(g, st); err != nil {
				return err
			}
		}
		return check("graph replays")
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range errs {
		t.Error(e)
	}
}

// BenchmarkPDLChain times decode-like pairs [pdl_rms, Gemv wo_b FP8
// 4096x8192 at U 2] in a captured graph of 32 pairs, each Gemv reading the
// next of 8 copies of the weight (256 MB: cold L2), so every Gemv starts on
// HBM: with programmatic dependent launch off and on, and the Gemv's
// MOXIE_PDL_PF hints left out (-DMOXIE_NO_PDLPF) or asking for the first
// 512..4096 bytes (MOXIE_PF_BYTES; 1024 is the default) of each warp's
// share of its rows. Also the pdl_rms chain alone and the Gemv chain alone
// (PDL on, default hints). Reports device µs per pair (per kernel for the
// chains alone). Environment: MOXIE_CUDA_PDLPF=off turns the default
// module's hints off too.
func BenchmarkPDLChain(b *testing.B) {
	dev := testDevice(b)
	const copies, calls, rows, cols = 8, 32, 4096, 8192
	type result struct {
		name string
		us   float64
		err  error
	}
	var results []result
	err := dev.Do(func(c *Ctx) error {
		if !c.d.pdl {
			b.Logf("programmatic dependent launch is off on this device (sm_%d%d, or MOXIE_CUDA_PDL=off): the pdl_on rows launch plainly", c.d.info.Major, c.d.info.Minor)
		}
		if os.Getenv("MOXIE_CUDA_PDLPF") == "off" {
			b.Logf("MOXIE_CUDA_PDLPF=off: every row's Gemv is compiled without hints")
		}
		d := &devBufs{c: c}
		defer d.free()
		data := computetest.RandomWeight(rand.New(rand.NewPCG(7, 8)), compute.FP8Block, rows, cols, 0.05)
		ws := make([]*DeviceWeight, copies)
		for k := range ws {
			ws[k] = d.weight(data)
		}
		x, y := d.alloc(4*cols), d.floats(make([]float32, rows))
		d.synced()
		if d.err != nil {
			return d.err
		}
		m, err := c.Module("pdl_pf_test", pdlPFTestSrc)
		if err != nil {
			return err
		}
		rms, err := m.Kernel("pdl_rms")
		if err != nil {
			return err
		}
		gs := make([]*Gemv, copies)
		for k, w := range ws {
			if gs[k], err = c.PrepareGemv([]GemvProj{{W: w, Y: y, X: x}}, GemvVariant{U: 2}); err != nil {
				return err
			}
		}
		plain := func(k *Kernel) *Kernel { p := *k; p.pdl = false; return &p }
		st := c.Stream()
		runRMS := func(k *Kernel) error {
			nx, ny := int32(cols), int32(rows)
			return c.Launch(k, Dim3{X: 1}, Dim3{X: 1024}, 0, st, unsafe.Pointer(&x), unsafe.Pointer(&y), unsafe.Pointer(&nx), unsafe.Pointer(&ny))
		}
		runGemv := func(k *Kernel, i int) error {
			g := *gs[i%copies]
			g.kernel = k
			return c.LaunchGemv(&g, st)
		}
		gemvKernel := func(pf string) (*Kernel, error) {
			var extra []string
			switch pf {
			case "off":
				extra = []string{"-DMOXIE_NO_PDLPF"}
			case "1024":
			default:
				extra = []string{"-DMOXIE_PF_BYTES=" + pf}
			}
			m, err := c.moduleWith("gemv_pf"+pf, gemvSrc, extra)
			if err != nil {
				return nil, err
			}
			return m.Kernel("gemv_u2")
		}
		for _, cfg := range []struct{ pdl, pf string }{
			{"off", "off"}, {"off", "1024"}, {"on", "off"}, {"on", "512"}, {"on", "1024"}, {"on", "2048"}, {"on", "4096"},
		} {
			gk, err := gemvKernel(cfg.pf)
			if err != nil {
				return err
			}
			rk := rms
			if cfg.pdl == "off" {
				gk, rk = plain(gk), plain(rms)
			}
			i := 0
			us, err := graphTime(b, c, calls, func() error {
				i++
				if err := runRMS(rk); err != nil {
					return err
				}
				return runGemv(gk, i)
			})
			results = append(results, result{fmt.Sprintf("pair/pdl_%s/pf_%s", cfg.pdl, cfg.pf), us, err})
		}
		us, err := graphTime(b, c, calls, func() error { return runRMS(rms) })
		results = append(results, result{"rms_alone", us, err})
		gk, err := gemvKernel("1024")
		if err != nil {
			return err
		}
		i := 0
		us, err = graphTime(b, c, calls, func() error { i++; return runGemv(gk, i) })
		results = append(results, result{"gemv_alone", us, err})
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	for _, r := range results {
		b.Run(r.name, func(b *testing.B) {
			if r.err != nil {
				b.Fatal(r.err)
			}
			b.ReportMetric(r.us, "device-us/op")
		})
	}
}
