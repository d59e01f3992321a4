package cuda

import (
	"strings"
	"testing"
)

// idxTopKSelStatic is idx_topk_sel's static shared memory in bytes: s
// (TK_SORT words), sb (TK_SMALL words), hist (256), wsum (32) and five
// counters of 4 bytes.
const idxTopKSelStatic = 2048*8 + 1024*8 + 256*4 + 32*4 + 5*4

// TestIdxDecCompiles compiles kernels/idxdec.cu for sm_90
// (compileModuleForTest: no GPU needed, skipped without NVRTC) and checks
// that every kernel Ctx.IdxDec looks up is in the image and that
// idx_topk_sel's key cache fits beside its static shared memory.
func TestIdxDecCompiles(t *testing.T) {
	requireKernels(t, compileModuleForTest(t, "idxdec", IdxDecSource()),
		"idx_scores_h1", "idx_scores_h2", "idx_scores_h4", "idx_scores_h8", "idx_scores_p_h1", "idx_scores_p_h2", "idx_scores_p_h4",
		"idx_scores_p_h8", "idx_scores_generic", "idx_topk", "idx_topk_sel")
	requireSharedFits(t, "idx_topk_sel", 4*idxTopKCache+idxTopKSelStatic)
}

// emuHarness is the C++ prelude of the host-thread emulations of
// TestIdxTopKSelEmulated and TestGateRouteEmulated: every CUDA thread of a
// block is a std::thread, __syncthreads and named barriers are
// std::barriers, and each warp primitive (shuffles, ballot, match_any,
// redux) exchanges the lanes' values through a per-warp slot array between
// two warp barriers. Blocks of a grid run one after another. g_dyn and
// g_rsm stand for dynamic shared memory.
const emuHarness = `#include <atomic>
#include <barrier>
#include <thread>
#include <vector>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <random>
#include <cstdint>
typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned short u16;
typedef unsigned char u8;
#include "cuda_emu.h"  // threadIdx, blockIdx, the barriers, __syncthreads, the CUDA keywords
u64 g_x[32][32];
u32 *g_dyn;
u64 *g_rsm;
#define FULL 0xffffffffu
inline void __syncwarp() { g_warp_bar[threadIdx.x / 32]->arrive_and_wait(); }
inline void emu_named_bar() { g_named_bar->arrive_and_wait(); }
inline void wput(u64 v) { int w = threadIdx.x / 32; g_warp_bar[w]->arrive_and_wait(); g_x[w][threadIdx.x % 32] = v; g_warp_bar[w]->arrive_and_wait(); }
inline void wdone() { g_warp_bar[threadIdx.x / 32]->arrive_and_wait(); }
template <class T> inline T __shfl_sync(unsigned, T v, int src) { u64 b = 0; memcpy(&b, &v, sizeof(T)); wput(b); u64 r = g_x[threadIdx.x / 32][src & 31]; wdone(); T o; memcpy(&o, &r, sizeof(T)); return o; }
template <class T> inline T __shfl_xor_sync(unsigned m, T v, int o) { return __shfl_sync(m, v, (threadIdx.x % 32) ^ o); }
template <class T> inline T __shfl_up_sync(unsigned m, T v, int o) { int l = threadIdx.x % 32; return __shfl_sync(m, v, l >= o ? l - o : l); }
inline u32 __ballot_sync(unsigned, bool p) { wput(p); u32 m = 0; for (int l = 0; l < 32; l++) if (g_x[threadIdx.x / 32][l]) m |= 1u << l; wdone(); return m; }
inline u32 __match_any_sync(unsigned, u32 v) { wput(v); u32 m = 0; for (int l = 0; l < 32; l++) if (g_x[threadIdx.x / 32][l] == v) m |= 1u << l; wdone(); return m; }
inline u32 __reduce_max_sync(unsigned, u32 v) { wput(v); u32 m = 0; for (int l = 0; l < 32; l++) m = std::max(m, (u32)g_x[threadIdx.x / 32][l]); wdone(); return m; }
inline int __popc(u32 x) { return __builtin_popcount(x); }
inline int __ffs(u32 x) { return __builtin_ffs(x); }
inline float __int_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float fmaf(float a, float b, float c) { return std::fma(a, b, c); }
template <class T> inline T __ldg(const T *p) { return *p; }
template <class T> inline T __ldcg(const T *p) { return *p; }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline u32 atomicAdd(u32 *p, u32 v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline u32 atomicInc(u32 *p, u32 lim) { u32 o = __atomic_load_n(p, __ATOMIC_SEQ_CST); for (;;) { u32 n = o >= lim ? 0 : o + 1; if (__atomic_compare_exchange_n(p, &o, n, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) return o; } }
using std::min; using std::max; using std::log1p; using std::exp; using std::sqrt;
struct float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
template <class F>
void launch(unsigned grid, unsigned threads, F k) {
  gridDim = {grid, 1, 1}; blockDim = {threads, 1, 1};
  for (unsigned x = 0; x < grid; x++) {
    std::barrier<> bb(threads), nb(256);
    g_block_bar = &bb; g_named_bar = &nb;
    for (unsigned w = 0; w < threads / 32; w++) g_warp_bar[w] = new std::barrier<>(32);
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < threads; t++) ts.emplace_back([=] { threadIdx = {t, 0, 0}; blockIdx = {x, 0, 0}; k(); });
    for (auto &t : ts) t.join();
    for (unsigned w = 0; w < threads / 32; w++) delete g_warp_bar[w];
  }
}
`

// runEmulation runs runHostEmulation on emuHarness (as harness.h), kern
// (as kern.inc) and main (the test's C++ driver, emu.cpp, which includes
// both).
func runEmulation(t *testing.T, kern, main string) []string {
	t.Helper()
	return runHostEmulation(t, map[string]string{"harness.h": emuHarness, "kern.inc": kern, "emu.cpp": main})
}

// cutSource returns src from the first occurrence of from up to (not
// including) the first occurrence of to after it (to "" means the end),
// with each pair of edits applied; a marker or edit that is missing fails
// t, naming it (the kernel source changed: update the emulation).
func cutSource(t *testing.T, file, src, from, to string, edits ...string) string {
	t.Helper()
	i := strings.Index(src, from)
	if i < 0 {
		t.Fatalf("%s no longer contains %q; update the emulation", file, from)
	}
	s := src[i:]
	if to != "" {
		j := strings.Index(s, to)
		if j < 0 {
			t.Fatalf("%s no longer contains %q after %q; update the emulation", file, to, from)
		}
		s = s[:j]
	}
	for k := 0; k+1 < len(edits); k += 2 {
		if !strings.Contains(s, edits[k]) {
			t.Fatalf("%s no longer contains %q; update the emulation", file, edits[k])
		}
		s = strings.ReplaceAll(s, edits[k], edits[k+1])
	}
	return strings.ReplaceAll(s, `extern "C" __global__`, "__global__")
}

// TestIdxTopKSelEmulated runs idx_topk and idx_topk_sel of
// kernels/idxdec.cu on the CPU (emuHarness; no GPU needed) on one row per
// case, drawn by the C++ driver below, and compares both with a stable sort
// by compute.TopK's key (descending, ties to the lower index, NaN last,
// −0 == +0): rows around k and the sort sizes, ties, all equal, specials,
// mostly NaN, mostly zero, k 7 and 2048, rows longer than the key cache and
// no cache. Skipped with -short or without g++.
func TestIdxTopKSelEmulated(t *testing.T) {
	kern := cutSource(t, "idxdec.cu", IdxDecSource(), "#define TK_THREADS", "",
		`asm volatile("bar.sync 1, 256;");`, "emu_named_bar();",
		`asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));`, "m = (1u << (threadIdx.x % 32)) - 1u;",
		"extern __shared__ u32 kc[];", "u32 *kc = g_dyn;")
	lines := runEmulation(t, kern, idxTopKEmuMain)
	if len(lines) != 18 {
		t.Fatalf("emulation printed %d lines, want 18:\n%s", len(lines), strings.Join(lines, "\n"))
	}
}

const idxTopKEmuMain = `#include "harness.h"
#include "kern.inc"
static u32 okey(float f) { if (f != f) return 0; if (f == 0.f) return 0x80000000u; u32 u; memcpy(&u, &f, 4); return (u & 0x80000000u) ? ~u : (u | 0x80000000u); }
int main() {
  struct C { const char *name; int n, k, gen, cache; };
  std::vector<C> cs = {
    {"n2048", 2048, 512, 0, 49152}, {"n600", 600, 512, 0, 49152}, {"n512", 512, 512, 0, 49152}, {"n511", 511, 512, 0, 49152},
    {"n1", 1, 512, 0, 49152}, {"k7ties", 3000, 7, 1, 49152}, {"ties3", 6000, 512, 2, 49152}, {"allequal", 3000, 16, 3, 49152},
    {"specials", 2500, 20, 4, 49152}, {"mostlynan", 2600, 512, 5, 49152}, {"k2048", 5000, 2048, 0, 49152},
    {"n8192", 8192, 512, 0, 49152}, {"n40000part", 40000, 512, 0, 32768}, {"nocache", 9000, 512, 0, 0},
    {"long5000", 20000, 2048, 6, 8192}, {"zeros", 10000, 512, 7, 49152}, {"n2049", 2049, 512, 0, 49152},
  };
  int bad = 0;
  for (int ci = 0; ci < (int)cs.size(); ci++) {
    C c = cs[ci];
    std::mt19937 rng(ci + 1);
    std::normal_distribution<float> nd;
    std::vector<float> sc(c.n);
    for (int j = 0; j < c.n; j++) {
      switch (c.gen) {
      case 0: sc[j] = nd(rng); break;
      case 1: sc[j] = (float)(rng() % 4); break;
      case 2: sc[j] = (float)(rng() % 3); break;
      case 3: sc[j] = 0.5f; break;
      case 4: { float v[] = {NAN, INFINITY, -INFINITY, 0.f, -0.f, 1.f, -1.f, nd(rng)}; sc[j] = v[rng() % 8]; } break;
      case 5: sc[j] = rng() % 10 < 9 ? NAN : nd(rng); break;
      case 6: sc[j] = (float)(rng() % 5000) / 7; break;
      case 7: sc[j] = rng() % 10 < 8 ? 0.f : std::fabs(nd(rng)); break;
      }
    }
    int pos = c.n - 1, ratio = 1, stride = c.n;
    std::vector<int> want(c.n);
    for (int j = 0; j < c.n; j++) want[j] = j;
    std::stable_sort(want.begin(), want.end(), [&](int a, int b) { return okey(sc[a]) > okey(sc[b]); });
    int k = std::min(c.k, c.n);
    std::vector<int> a(c.k, -1), b(c.k, -1);
    std::vector<u32> dyn(std::max(c.cache, 1));
    g_dyn = dyn.data();
    int *pa = a.data(), *pb = b.data(); const float *ps = sc.data(); int *pp = &pos; int topk = c.k, cache = c.cache;
    launch(1, 1024, [=] { idx_topk(pa, ps, pp, ratio, topk, stride); });
    launch(1, 1024, [=] { idx_topk_sel(pb, ps, pp, ratio, topk, stride, cache); });
    bool ok = true;
    for (int j = 0; j < c.k; j++) {
      int w = j < k ? want[j] : -1;
      if (a[j] != w || b[j] != w) { printf("%s: slot %d: idx_topk %d, idx_topk_sel %d, sort %d FAIL\n", c.name, j, a[j], b[j], w); ok = false; break; }
    }
    printf("%s (n %d, k %d): %s\n", c.name, c.n, c.k, ok ? "ok" : "FAIL");
    bad += !ok;
  }
  printf("done\n");
  return bad;
}
`

// TestIdxScoresPrepEmulated runs idx_scores_p_h<HPW> of kernels/idxdec.cu
// on the CPU (emuHarness; no GPU needed; contraction off) on raw queries
// and weights, and idx_scores_h<HPW> on the same inputs prepared by the
// driver with fuse.cu fuse_rows' float32 and float64 operations (RoPE of
// each head's last 2·nf dims, then the weights' scale): the scores must be
// the same bits, for V4's shape (64 heads of 128, 32 frequencies: h8), 30
// heads of 64 with 5 frequencies (h4) and 8 heads of 100, all rotated (h1).
func TestIdxScoresPrepEmulated(t *testing.T) {
	kern := "#define MOXIE_PDL()\ninline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }\n" +
		"inline float __fmul_rn(float a, float b) { return a * b; }\n" +
		cutSource(t, "idxdec.cu", IdxDecSource(), "#define IDX_TE", "__device__ __forceinline__ float idx_warp_sum")
	lines := runHostEmulation(t, map[string]string{"harness.h": emuHarness, "kern.inc": kern, "emu.cpp": idxPrepEmuMain}, "-ffp-contract=off")
	if len(lines) != 4 || lines[3] != "done" {
		t.Fatalf("emulation printed %d lines, want 3 cases and done:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for _, l := range lines[:3] {
		t.Log(l)
		if !strings.Contains(l, " ok") {
			t.Error(l)
		}
	}
}

const idxPrepEmuMain = `#include "harness.h"
#include "kern.inc"
int main() {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  struct Case { const char *name; int heads, dim, nf, p0; };
  Case cs[] = {{"v4 h8", 64, 128, 32, 400}, {"h4 5 frequencies", 30, 64, 5, 300}, {"h1 all rotated", 8, 100, 50, 99}};
  for (const Case &c : cs) {
    const int H = c.heads, D = c.dim, nf = c.nf, ratio = 4, n = (c.p0 + 1) / ratio, stride = n + 3;
    std::vector<float> q(H * D), w(H), keys(n * D), freq(nf);
    for (auto &v : q) v = nd(rng);
    for (auto &v : w) v = nd(rng);
    for (auto &v : keys) v = nd(rng);
    for (int k = 0; k < nf; k++) freq[k] = std::pow(10000.f, -2.f * k / (2 * nf)) * (k % 2 ? 1.f : 1.3f);
    const float wscale = 0.0110485f;
    // fuse_rows' preparation, operation for operation.
    std::vector<float> qp = q, wp = w;
    const float fp = (float)c.p0;
    for (int h = 0; h < H; h++)
      for (int k = 0; k < nf; k++) {
        const int e = D - 2 * nf + 2 * k;
        const float re = qp[h * D + e], im = qp[h * D + e + 1];
        const float ang = fp * freq[k];
        double sd, cd;
        sincos((double)ang, &sd, &cd);
        const float cs = (float)cd, sn = (float)sd;
        qp[h * D + e] = re * cs - im * sn;
        qp[h * D + e + 1] = re * sn + im * cs;
      }
    for (auto &v : wp) v = v * wscale;
    std::vector<int> pos = {c.p0};
    std::vector<float> want(stride, NAN), got(stride, NAN);
    const int blocks = (n + IDX_TE - 1) / IDX_TE;
    const float *pq = q.data(), *pw = w.data(), *pqp = qp.data(), *pwp = wp.data(), *pk = keys.data();
    const int *ppos = pos.data();
    float *pwant = want.data(), *pgot = got.data();
    IdxPrep pp{freq.data(), nf, wscale};
    auto run = [&](bool prep) {
      if (H <= 8) { if (prep) launch(blocks, 256, [=] { idx_scores_p_h1(pgot, pq, pw, pk, ppos, ratio, H, D, stride, pp); }); else launch(blocks, 256, [=] { idx_scores_h1(pwant, pqp, pwp, pk, ppos, ratio, H, D, stride); }); }
      else if (H <= 32) { if (prep) launch(blocks, 256, [=] { idx_scores_p_h4(pgot, pq, pw, pk, ppos, ratio, H, D, stride, pp); }); else launch(blocks, 256, [=] { idx_scores_h4(pwant, pqp, pwp, pk, ppos, ratio, H, D, stride); }); }
      else { if (prep) launch(blocks, 256, [=] { idx_scores_p_h8(pgot, pq, pw, pk, ppos, ratio, H, D, stride, pp); }); else launch(blocks, 256, [=] { idx_scores_h8(pwant, pqp, pwp, pk, ppos, ratio, H, D, stride); }); }
    };
    run(false);
    run(true);
    int bad = 0;
    for (int s = 0; s < n; s++) if (memcmp(&want[s], &got[s], 4)) bad++;
    for (int s = n; s < stride; s++) if (got[s] == got[s]) bad++;
    printf("%s: %d entries, %d differ%s\n", c.name, n, bad, bad ? " FAIL" : " ok");
  }
  printf("done\n");
}
`
