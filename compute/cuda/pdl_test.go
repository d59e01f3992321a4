package cuda

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// kernelSources is every embedded kernel source, by module file name.
func kernelSources(t *testing.T) map[string]string {
	t.Helper()
	return map[string]string{
		"attn.cu": AttnSource(), "attndec.cu": AttnDecSource(), "fuse.cu": FuseSource(), "fwd.cu": FwdSource(),
		"gemv.cu": GemvSource(), "idxdec.cu": IdxDecSource(), "linear.cu": LinearSource(), "moe.cu": MoESource(),
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
// free of reads through pointers: no ->, __ldg or asm).
func pdlViolations(src string) []string {
	var bad []string
	for _, m := range globalFn.FindAllStringIndex(src, -1) {
		body := strings.TrimLeft(src[m[1]:], " \t\r\n\\")
		if strings.HasPrefix(body, "MOXIE_PDL();") || pdlPFStatement(body) {
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

// pdlPFStatement reports whether body starts with a whole MOXIE_PDL_PF(...);
// statement whose arguments read no memory through a pointer as far as a
// text check can tell (no ->, __ldg or asm: the contract in module.go
// allows only arithmetic on the kernel's arguments before the wait).
func pdlPFStatement(body string) bool {
	const pre = "MOXIE_PDL_PF("
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
				for _, bad := range []string{"->", "__ldg", "asm", "{"} {
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
// it on the stream).
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
			"extern \"C\" __global__ void h(const float *w, int n) { MOXIE_PDL_PF(w, n; }\n"
		if got := pdlViolations(src); !slices.Equal(got, []string{"b", "d", "f", "g", "h"}) {
			t.Fatalf("violations %q, want [b d f g h]", got)
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
			t.Errorf("%s carries %s but these kernels do not start with MOXIE_PDL(); or MOXIE_PDL_PF(...);: %v", name, pdlMarker, bad)
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
		if err := c.Memset(y, 0, 4*n, st); err != nil {
			return err
		}
		if err := enqueue(); err != nil {
			return err
		}
		if err := check("plain launches", 1); err != nil {
			return err
		}
		if err := c.Memset(y, 0, 4*n, st); err != nil {
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
	})
	for _, l := range log {
		t.Log(l)
	}
	if err != nil {
		t.Fatal(err)
	}
}
