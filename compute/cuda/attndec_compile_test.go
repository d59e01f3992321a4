package cuda

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// TestAttnDecCompiles compiles kernels/attndec.cu for sm_90
// (compileModuleForTest: no GPU needed, skipped without NVRTC), checks that
// every kernel AttentionDecode launches is in the image and that each fits
// the H200's opt-in shared memory.
func TestAttnDecCompiles(t *testing.T) {
	// kernels/attndec.cu static_asserts sizeof(ADArgs) == 144.
	if n := unsafe.Sizeof(attnDecArgs{}); n != 144 {
		t.Errorf("attnDecArgs is %d bytes, struct ADArgs 144", n)
	}
	img := compileModuleForTest(t, "attndec", AttnDecSource())
	requireKernels(t, img, "attndec_combine")
	for _, v := range attnDecVariants {
		for _, dim := range v.dims {
			requireKernels(t, img, v.kernel(dim))
			requireSharedFits(t, v.kernel(dim), v.shared(dim))
		}
	}
}

// TestAttnDecEmulated runs kernels/attndec.cu's partial and combine kernels
// on the CPU (no GPU needed): testdata/attndec_emu.cpp turns every CUDA
// thread into a std::thread with barriers for __syncthreads and the warp
// shuffles, runs window, HCA and CSA problems (padding, multi-tile splits,
// MaxKeys truncation, T up to 4, dims 128/256/512, every variant; the
// default variant also with AttentionDecodeNormQ's query preparation) and
// compares with its own float64 attention; the default variant and g8k16db
// also with the early promises (AttnDecChoice.Early), which must give the
// same bits. Skipped with -short or without
// g++ (C++20).
func TestAttnDecEmulated(t *testing.T) {
	src := AttnDecSource()
	for _, m := range []string{"extern __shared__ float4 ad_sm[];", "extern __shared__ float4 cpart[];"} {
		if !strings.Contains(src, m) {
			t.Fatalf("attndec.cu no longer declares %q; update the emulation", m)
		}
		name := strings.Fields(m)[3]
		name = strings.TrimSuffix(name, "[];")
		src = strings.Replace(src, m, "float4 *"+name+" = (float4 *)g_dyn;", 1)
	}
	// The harness predates the combine's rotation (ad_rope): give it
	// the one intrinsic that uses beyond the harness's own.
	src = "inline float __fmul_rn(float a, float b) { return a * b; }\n" + src
	var gen strings.Builder
	gen.WriteString("static std::vector<Var> vars = {\n")
	for _, v := range attnDecVariants {
		ds := make([]string, len(v.dims))
		for i, d := range v.dims {
			ds[i] = strconv.Itoa(d)
		}
		fmt.Fprintf(&gen, "  {%q, %d, %d, %d, {%s}},\n", v.Name, v.G, v.KT, v.MaxSplits, strings.Join(ds, ", "))
	}
	gen.WriteString("};\nstatic void (*kernel(std::string n, int D))(ADArgs) {\n")
	for _, v := range attnDecVariants {
		for _, d := range v.dims {
			fmt.Fprintf(&gen, "  if (n == %q && D == %d) return %s;\n", v.Name, d, v.kernel(d))
		}
	}
	gen.WriteString("  return nullptr;\n}\nstatic unsigned combine_threads(int D) {\n")
	for _, d := range []int{128, 256, 512} {
		fmt.Fprintf(&gen, "  if (D == %d) return %d;\n", d, d/4*attnDecCombineParts(d))
	}
	gen.WriteString("  return 0;\n}\n")
	harness, err := os.ReadFile("testdata/attndec_emu.cpp")
	if err != nil {
		t.Fatal(err)
	}
	lines := runHostEmulation(t, map[string]string{"kern.inc": src, "gen.inc": gen.String(), "emu.cpp": string(harness)})
	if len(lines) < 20 {
		t.Fatalf("emulation printed %d lines, want a result per case and variant:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	last := lines[len(lines)-1]
	worst, err := strconv.ParseFloat(strings.TrimPrefix(last, "worst "), 64)
	if err != nil || !(worst <= attnDecTol) {
		t.Errorf("emulation's last line %q: want worst <= %g", last, attnDecTol)
	}
	qprep, early := 0, 0
	for _, l := range lines {
		switch {
		case strings.Contains(l, " early-promises "):
			early++
		case strings.Contains(l, " qprep "):
			qprep++
		}
	}
	if early < 12 { // one per case at least: the default variant with the early promises
		t.Errorf("emulation printed %d results with the early promises, want at least one per case (12)", early)
	}
	if qprep < 12 { // one per case: the default variant with AttentionDecodeNormQ's query preparation
		t.Errorf("emulation printed %d results with the query preparation, want one per case (12)", qprep)
	}
	t.Logf("%d results (%d with the query preparation, %d with the early promises, each the same bits), max relative error %.3g vs float64", len(lines)-1, qprep, early, worst)
}

// TestAttnDecRoPEEmulated runs kernels/attndec.cu's combine kernel on the
// CPU (no GPU needed; attnDecRoPEHarness) over synthetic split partials,
// with and without its inverse rotation, and ops.cu's rope kernel (inverse)
// on the unrotated output: it fails unless the fused output is the chain's,
// bit for bit, and within attnDecTol of the harness's float64 combine and
// rotation, for V4's shape (64 heads of 512, 32 frequencies), odd frequency
// counts (the rotated part starting inside a float4 column), a fully
// rotated head, T up to 3 and splits without keys. Skipped with -short or
// without g++ (C++20).
func TestAttnDecRoPEEmulated(t *testing.T) {
	src := AttnDecSource()
	for _, m := range []string{"extern __shared__ float4 ad_sm[];", "extern __shared__ float4 cpart[];"} {
		if !strings.Contains(src, m) {
			t.Fatalf("attndec.cu no longer declares %q; update the emulation", m)
		}
		name := strings.TrimSuffix(strings.Fields(m)[3], "[];")
		src = strings.Replace(src, m, "float4 *"+name+" = (float4 *)g_dyn;", 1)
	}
	rope, err := cuDefinition(OpsSource(), `extern "C" __global__ void rope(`)
	if err != nil {
		t.Fatalf("ops.cu: %v; update the emulation", err)
	}
	cases := []struct {
		name                         string
		heads, dim, T, nf            int
		window, p0, splits, kt, keys int // keys: max keys (the combine's split count comes from the positions)
	}{
		{"v4 T1", 64, 512, 1, 32, 128, 4000, 40, 16, 640},
		{"v4 T2 early (splits without keys)", 64, 512, 2, 32, 128, 20, 40, 16, 640},
		{"d512 3 frequencies", 8, 512, 1, 3, 128, 1000, 8, 16, 128},
		{"d256 1 frequency T3", 8, 256, 3, 1, 64, 300, 4, 16, 64},
		{"d128 5 frequencies", 8, 128, 2, 5, 16, 8191, 1, 16, 16},
		{"d128 all rotated", 8, 128, 1, 64, 32, 777, 2, 16, 32},
	}
	var gen strings.Builder
	gen.WriteString("static std::vector<Case> cases = {\n")
	for _, c := range cases {
		fmt.Fprintf(&gen, "  {%q, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d},\n", c.name, c.heads, c.dim, c.T, c.nf, c.window, c.p0, c.splits, c.kt, c.keys,
			c.dim/4*attnDecCombineParts(c.dim))
	}
	gen.WriteString("};\n")
	lines := runHostEmulation(t, map[string]string{"kern.inc": src, "rope.inc": rope, "gen.inc": gen.String(), "emu.cpp": attnDecRoPEHarness}, "-ffp-contract=off")
	if len(lines) != len(cases)+1 {
		t.Fatalf("emulation printed %d lines, want one per case and a last one:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for _, l := range lines {
		t.Log(l)
	}
	last := lines[len(lines)-1]
	worst, err := strconv.ParseFloat(strings.TrimPrefix(last, "worst "), 64)
	if err != nil || !(worst <= attnDecTol) {
		t.Errorf("emulation's last line %q: want worst <= %g", last, attnDecTol)
	}
}

// attnDecRoPEHarness is TestAttnDecRoPEEmulated's C++ program: it includes
// kern.inc (kernels/attndec.cu), rope.inc (ops.cu's rope kernel) and
// gen.inc (the cases).
const attnDecRoPEHarness = `// CPU emulation of attndec_combine's inverse rotation (kernels/attndec.cu)
// against attndec_combine followed by ops.cu's rope kernel: every CUDA
// thread of a block is a std::thread, __syncthreads a block barrier,
// __shared__ variables statics (one block runs at a time). Per case it
// prints "<name> ok rel <error>" when the fused output is the chain's bits
// and within 1e-5 of a float64 evaluation written here, else "<name> FAIL
// ...", then "worst <max error>".
#include <barrier>
#include <thread>
#include <vector>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <random>
#include <algorithm>
#include <string>
using std::min; using std::max;
struct float4 { float x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
#include "cuda_emu.h"
alignas(16) static unsigned char g_dyn[64 << 10];
inline float __shfl_xor_sync(unsigned, float v, int) { return v; }  // only the partial kernel (not run) shuffles
inline float __int_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline float __fmul_rn(float a, float b) { return a * b; }
#define AD_EMULATE
inline void ad_cp16(void *dst, const void *src, bool ok) {}
inline void ad_cp_commit() {}
template <int N> inline void ad_cp_wait() {}
#include "kern.inc"
#include "rope.inc"

template <class K>
void launch(K k, U3 grid, unsigned threads) {
  gridDim = grid; blockDim = {threads, 1, 1};
  for (unsigned y = 0; y < grid.y; y++)
    for (unsigned x = 0; x < grid.x; x++) {
      memset(g_dyn, 0xff, sizeof g_dyn);
      std::barrier<> bb(threads);
      g_block_bar = &bb;
      std::vector<std::thread> ts;
      for (unsigned t = 0; t < threads; t++)
        ts.emplace_back([=] { threadIdx = {t, 0, 0}; blockIdx = {x, y, 0}; k(); });
      for (auto &t : ts) t.join();
    }
}

struct Case { const char *name; int H, D, T, nf, window, p0, S, KT, maxKeys; unsigned threads; };
#include "gen.inc"

int main() {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  double worstAll = 0;
  for (const Case &c : cases) {
    const int H = c.H, D = c.D, T = c.T, S = c.S, nf = c.nf;
    std::vector<float> part((size_t)T * S * H * (D + 2)), sinks(H), freq(nf);
    for (auto &v : part) v = nd(rng);
    float *ml = part.data() + (size_t)T * S * H * D;
    for (size_t r = 0; r < (size_t)T * S * H; r++) { ml[2 * r] = 3 * nd(rng); ml[2 * r + 1] = 1 + std::fabs(nd(rng)) * 16; }
    for (auto &v : sinks) v = nd(rng);
    for (int k = 0; k < nf; k++) freq[k] = std::pow(10000.f, -2.f * k / (2 * nf)) * (k % 2 ? 1.f : 1.3f);
    std::vector<int> pos(T);
    for (int i = 0; i < T; i++) pos[i] = c.p0 + i;
    ADArgs a{};
    a.sinks = sinks.data(); a.pos = pos.data(); a.part = part.data(); a.ring_rows = c.window + T; a.window = c.window; a.ratio = 1;
    a.heads = H; a.dim = D; a.max_keys = c.maxKeys; a.splits = S; a.nq = T; a.kt = c.KT; a.scale = 1;
    std::vector<float> chain((size_t)T * H * D, NAN), fused((size_t)T * H * D, NAN);
    a.o = chain.data();
    launch([&] { attndec_combine(a); }, {(unsigned)H, (unsigned)T, 1}, c.threads);
    launch([&] { rope(chain.data(), pos.data(), freq.data(), T, H * D, D, nf, 1); }, {3, 1, 1}, 256);
    a.o = fused.data(); a.rope_nf = nf; a.rope_freq = freq.data();
    launch([&] { attndec_combine(a); }, {(unsigned)H, (unsigned)T, 1}, c.threads);
    std::string bad;
    if (memcmp(chain.data(), fused.data(), 4 * chain.size()) != 0) bad += " not-the-chain's-bits";
    // float64: merge the splits that hold keys, then rotate back.
    double e = 0, m = 0;
    for (int i = 0; i < T; i++) {
      const int t = pos[i], nk = min(min(t + 1, c.window), c.maxKeys);
      const int chunk = (nk + S * c.KT - 1) / (S * c.KT) * c.KT, sa = chunk > 0 ? min(S, (nk + chunk - 1) / chunk) : 0;
      for (int h = 0; h < H; h++) {
        double M = sinks[h];
        for (int s = 0; s < sa; s++) M = max(M, (double)ml[2 * (((size_t)i * S + s) * H + h)]);
        double L = std::exp(sinks[h] - M);
        std::vector<double> o(D, 0.0);
        for (int s = 0; s < sa; s++) {
          const size_t r = ((size_t)i * S + s) * H + h;
          const double w = std::exp(ml[2 * r] - M);
          L += w * ml[2 * r + 1];
          for (int x = 0; x < D; x++) o[x] += w * part[r * D + x];
        }
        for (int x = 0; x < D; x++) o[x] /= L;
        for (int k = 0; k < nf; k++) {
          const double ang = -(double)(float)((float)t * freq[k]);
          double *p = &o[D - 2 * nf + 2 * k];
          const double re = p[0], im = p[1];
          p[0] = re * std::cos(ang) - im * std::sin(ang);
          p[1] = re * std::sin(ang) + im * std::cos(ang);
        }
        for (int x = 0; x < D; x++) {
          const float g = fused[((size_t)i * H + h) * D + x];
          if (std::isnan(g)) e = INFINITY;
          e = max(e, std::fabs(g - o[x]));
          m = max(m, std::fabs(o[x]));
        }
      }
    }
    const double r = e / m;
    worstAll = max(worstAll, r);
    if (!(r <= 1e-5)) bad += " float64-error";
    if (bad.empty()) printf("%s ok rel %.3g\n", c.name, r);
    else printf("%s FAIL%s rel %.3g\n", c.name, bad.c_str(), r);
  }
  printf("worst %.3g\n", worstAll);
}
`
