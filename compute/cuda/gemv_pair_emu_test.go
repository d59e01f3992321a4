package cuda

import (
	"fmt"
	"strings"
	"testing"
)

// gemvPairEmuSource returns what TestGemvPairEmulated compiles: gemv.cu's
// GemvMat, gemv_e8m0 and gemv_dot_fp8, then the GemvPair section (from
// GP_WARPS to the end) with each inline PTX statement replaced by its
// host equivalent (gpEmuHarness defines them): the barrier's loads,
// stores and atomics as std::atomic_ref operations, cp.async as a copy
// deferred to cp.async.wait_all, L2 hints as a bounds check, the dynamic
// shared memory as the emulated block's buffer.
func gemvPairEmuSource() (string, error) {
	src := GemvSource()
	var b strings.Builder
	for _, h := range []string{"struct GemvMat {", "__device__ __forceinline__ float gemv_e8m0(", "__device__ __forceinline__ float gemv_dot_fp8("} {
		def, err := cuDefinition(src, h)
		if err != nil {
			return "", err
		}
		b.WriteString(def)
		if strings.HasPrefix(h, "struct") {
			b.WriteString(";")
		}
		b.WriteString("\n")
	}
	i := strings.Index(src, "#define GP_WARPS")
	if i < 0 {
		return "", fmt.Errorf("gemv.cu: no GP_WARPS; update the emulation")
	}
	sec := src[i:]
	for _, r := range [][2]string{
		{`extern __shared__ __align__(128) u8 gp_sm[];`, `#define gp_sm (g_blk->smem.data())`},
		{`asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));`, `a = (u32)((const u8 *)p - g_blk->smem.data());`},
		{`asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p) : "memory");`, `memcpy(&v, p, 16);`},
		{`asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(s0 + (u32)i), "l"(src + i) : "memory");`, `emu_cp_async(s0 + (u32)i, src + i);`},
		{`asm volatile("cp.async.commit_group;" ::: "memory");`, `;`},
		{`asm volatile("prefetch.global.L2 [%0];" ::"l"(p + i));`, `emu_prefetch(p + i);`},
		{`asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(gen) : "l"(bar + 1) : "memory");`, `gen = emu_ld(bar + 1);`},
		{`asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(bar) : "memory");`, `old = emu_add(bar, 1u);`},
		{`asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(bar), "r"(0u) : "memory");`, `emu_st(bar, 0u);`},
		{`asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(bar + 1), "r"(gen + 1u) : "memory");`, `emu_st(bar + 1, gen + 1u);`},
		{`asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));`, `t0 = emu_ns();`},
		{`asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));`, `t = emu_ns();`},
		{`asm volatile("nanosleep.u32 32;" ::: "memory");`, `std::this_thread::yield();`},
		{`asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(g) : "l"(bar + 1) : "memory");`, `g = emu_ld(bar + 1);`},
		{`asm volatile("cp.async.wait_all;" ::: "memory");`, `emu_cp_wait();`},
	} {
		if !strings.Contains(sec, r[0]) {
			return "", fmt.Errorf("gemv.cu's GemvPair section no longer has %s; update the emulation", r[0])
		}
		sec = strings.ReplaceAll(sec, r[0], r[1])
	}
	if strings.Contains(sec, "asm") {
		return "", fmt.Errorf("gemv.cu's GemvPair section has inline PTX the emulation does not replace")
	}
	b.WriteString(sec)
	return b.String(), nil
}

// gpEmuHarness is TestGemvPairEmulated's C++ program (it includes
// kern.inc, gemvPairEmuSource's output): every CUDA thread of every block
// is a thread of its own, all blocks at once (the grid-wide barrier needs
// them), __syncthreads a barrier of the block's 512 threads, each shuffle
// an exchange between two barriers of the warp's 32. Each case fills A, B
// (FP8 codes, no NaN; E8M0 scales 2^-9..2^3), x, and poisons y1, y2 and
// the shared memory (NaN bytes), runs the kernel twice on the same
// counters and checks y1 = A·x and y2 = B·y1 against float64 sums written
// here (relative to the largest magnitude, FAIL above 2e-5), that the two
// launches give the same bits, that the counters end at 0 arrivals,
// generation 2 and no timeouts, that every L2 hint lies in B's rows a
// block does not copy (or, with l2pf's 4, in the block's A rows), and
// that every copy stays in the block's shared memory.
const gpEmuHarness = `#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <pthread.h>
#include <thread>
#include <vector>
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
using std::max;
using std::min;
struct U3 { unsigned x, y, z; };
thread_local U3 threadIdx, blockIdx;
U3 blockDim, gridDim;
struct uint4 { unsigned x, y, z, w; };
struct float4 { float x, y, z, w; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
inline float __int_as_float(unsigned v) { float f; memcpy(&f, &v, 4); return f; }
template <class T> inline T __ldg(const T *p) { return *p; }
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define MOXIE_PDL_WAIT() do {} while (0)
#define MOXIE_PDL_TRIGGER() do {} while (0)
#define GP_TIMEOUT_NS 600000000000ull

struct EmuBlock {
  std::barrier<> *bar;
  std::barrier<> *warp[16];
  float shfl[16][32];
  std::vector<u8> smem;
};
thread_local EmuBlock *g_blk;
inline void __syncthreads() { g_blk->bar->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int o) {
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  g_blk->shfl[w][l] = v;
  g_blk->warp[w]->arrive_and_wait();
  const float r = g_blk->shfl[w][l ^ o];
  g_blk->warp[w]->arrive_and_wait();
  return r;
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline unsigned emu_ld(unsigned *p) { return std::atomic_ref<unsigned>(*p).load(); }
inline void emu_st(unsigned *p, unsigned v) { std::atomic_ref<unsigned>(*p).store(v); }
inline unsigned emu_add(unsigned *p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline unsigned atomicAdd(unsigned *p, unsigned v) { return emu_add(p, v); }
inline unsigned long long emu_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
std::atomic<int> g_bad_copy{0}, g_bad_hint{0};
const u8 *g_hint_lo, *g_hint_hi; // the block's B rows beyond ns are checked per block below
struct Pending { u32 dst; const u8 *src; };
thread_local std::vector<Pending> g_cp;
inline void emu_cp_async(u32 dst, const u8 *src) { g_cp.push_back({dst, src}); }
inline void emu_cp_wait() {
  for (auto &p : g_cp) {
    if (p.dst + 16 > g_blk->smem.size()) { g_bad_copy++; continue; }
    memcpy(g_blk->smem.data() + p.dst, p.src, 16);
  }
  g_cp.clear();
}
thread_local const u8 *t_hint_lo, *t_hint_hi, *t_hinta_lo, *t_hinta_hi;
inline void emu_prefetch(const u8 *p) {
  if ((p < t_hint_lo || p >= t_hint_hi) && (p < t_hinta_lo || p >= t_hinta_hi)) g_bad_hint++;
}

// E4M3 (no infinities; S.1111.111 is NaN) as a float: exact.
inline float emu_e4m3(unsigned b) {
  const unsigned e = (b >> 3) & 15u, m = b & 7u;
  float v = (e == 15u && m == 7u) ? NAN : e == 0u ? std::ldexp((float)m, -9) : std::ldexp(1.f + (float)m / 8.f, (int)e - 7);
  return (b & 128u) ? -v : v;
}
inline void gemv_e4m3x4(u32 w, float *f) {
  for (int i = 0; i < 4; i++) f[i] = emu_e4m3((w >> (8 * i)) & 255u);
}
inline uint4 gemv_ld(const uint4 *p) { return *p; }
#include "kern.inc"

struct Case { int r1, c1, g1, blk1, r2, c2, g2, blk2, G, ns, fill, l2pf, U; };
static const Case cases[] = {
  {1024, 1024, 2, 128, 300, 512, 2, 128, 3, 40, 0, 1, 8},  // grouped both; 40 of 100 B rows a block in shared memory
  {1024, 2560, 1, 64, 37, 1024, 1, 128, 5, 3, 1, 2, 4},    // five segments (warp 0 of a row takes two); late fill, early hints
  {512, 9216, 1, 16, 2, 512, 1, 16, 3, 8, 0, 0, 8},        // eighteen segments, scale rows inside a batch, blocks without B rows
  {1536, 512, 3, 32, 64, 1536, 1, 32, 2, 0, 1, 5, 8},      // a block's A rows cross a group; every B row from global memory; A hinted
};

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rnd() { rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17; return rng_state; }

static int wpr_of(int cols) { int segs = cols / 512, w = 1; while (2 * w <= std::min(segs, GP_WARPS)) w *= 2; return w; }

struct Mat { int rows, cols, blk, groups; std::vector<u8> w, s; };
static Mat make_mat(int rows, int cols, int blk, int groups) {
  Mat m{rows, cols, blk, groups};
  m.w.resize((size_t)rows * cols);
  for (auto &b : m.w) { b = (u8)rnd(); if ((b & 0x7f) == 0x7f) b ^= 1; }
  m.s.resize((size_t)((rows + blk - 1) / blk) * ((cols + blk - 1) / blk));
  for (auto &b : m.s) b = (u8)(118 + rnd() % 13);
  return m;
}
static std::vector<double> ref(const Mat &m, const std::vector<double> &x) {
  std::vector<double> y(m.rows);
  const int rpg = m.rows / m.groups, sc = (m.cols + m.blk - 1) / m.blk;
  for (int r = 0; r < m.rows; r++) {
    double s = 0;
    for (int c = 0; c < m.cols; c++)
      s += (double)emu_e4m3(m.w[(size_t)r * m.cols + c]) * std::ldexp(1.0, (int)m.s[(size_t)(r / m.blk) * sc + c / m.blk] - 127) * x[(size_t)(r / rpg) * m.cols + c];
    y[r] = s;
  }
  return y;
}
static double maxrel(const std::vector<float> &got, const std::vector<double> &want) {
  double e = 0, mx = 0;
  for (size_t i = 0; i < got.size(); i++) {
    if (std::isnan(got[i])) return INFINITY;
    e = std::max(e, std::fabs(got[i] - want[i]));
    mx = std::max(mx, std::fabs(want[i]));
  }
  return mx > 0 ? e / mx : e;
}

struct ThreadArg { EmuBlock *blk; unsigned b, t; const GemvPairArgs *a; int U; const u8 *hlo, *hhi, *alo, *ahi; };
static void *run_thread(void *p) {
  auto *ta = (ThreadArg *)p;
  g_blk = ta->blk;
  blockIdx = U3{ta->b, 0, 0};
  threadIdx = U3{ta->t, 0, 0};
  t_hint_lo = ta->hlo;
  t_hint_hi = ta->hhi;
  t_hinta_lo = (ta->a->l2pf & 4) ? ta->alo : nullptr;
  t_hinta_hi = (ta->a->l2pf & 4) ? ta->ahi : nullptr;
  if (ta->U == 4) gemv_pair_u4(*ta->a); else gemv_pair_u8(*ta->a);
  return nullptr;
}

int main() {
  for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
    const Case &k = cases[ci];
    Mat A = make_mat(k.r1, k.c1, k.blk1, k.g1), B = make_mat(k.r2, k.c2, k.blk2, k.g2);
    std::vector<float> x((size_t)k.g1 * k.c1);
    for (auto &v : x) v = (float)((double)(rnd() % 2000001) / 1e6 - 1.0);
    std::vector<double> xd(x.begin(), x.end());
    const std::vector<double> want1 = ref(A, xd), want2 = ref(B, want1);
    std::vector<float> y1(k.r1, NAN), y2(k.r2, NAN);
    unsigned bar[4] = {0, 0, 0, 0};
    const int wpr1 = wpr_of(k.c1), wpr2 = wpr_of(k.c2);
    const int rpb1 = (k.r1 + k.G - 1) / k.G, rpb2 = (k.r2 + k.G - 1) / k.G;
    const int red = 4 * std::max(rpb1 * wpr1, rpb2 * wpr2);
    GemvPairArgs a{};
    a.a = GemvMat{A.w.data(), A.s.data(), x.data(), y1.data(), k.r1, k.c1, k.r1 / k.g1, __builtin_ctz(k.blk1), (k.c1 + k.blk1 - 1) / k.blk1, 1, wpr1, 0};
    a.b = GemvMat{B.w.data(), B.s.data(), y1.data(), y2.data(), k.r2, k.c2, k.r2 / k.g2, __builtin_ctz(k.blk2), (k.c2 + k.blk2 - 1) / k.blk2, 1, wpr2, 0};
    a.bar = bar;
    a.ns = k.ns;
    a.redoff = k.ns * k.c2;
    a.fill = k.fill;
    a.l2pf = k.l2pf;
    gridDim = U3{(unsigned)k.G, 1, 1};
    blockDim = U3{32u * GP_WARPS, 1, 1};
    std::vector<float> first1, first2;
    for (int run = 0; run < 2; run++) {
      std::fill(y1.begin(), y1.end(), NAN);
      std::fill(y2.begin(), y2.end(), NAN);
      std::vector<EmuBlock> blocks(k.G);
      std::vector<ThreadArg> args;
      args.reserve((size_t)k.G * blockDim.x);
      for (int b = 0; b < k.G; b++) {
        blocks[b].bar = new std::barrier<>(blockDim.x);
        for (int w = 0; w < GP_WARPS; w++) blocks[b].warp[w] = new std::barrier<>(32);
        blocks[b].smem.assign((size_t)a.redoff + red, 0xff);
        const int q0 = (int)((long long)b * k.r2 / k.G), q1 = (int)((long long)(b + 1) * k.r2 / k.G);
        const int ns = std::max(0, std::min(k.ns, q1 - q0));
        const int r0 = (int)((long long)b * k.r1 / k.G), r1 = (int)((long long)(b + 1) * k.r1 / k.G);
        for (unsigned t = 0; t < blockDim.x; t++)
          args.push_back(ThreadArg{&blocks[b], (unsigned)b, t, &a, k.U, B.w.data() + (size_t)(q0 + ns) * k.c2, B.w.data() + (size_t)q1 * k.c2,
                                   A.w.data() + (size_t)r0 * k.c1, A.w.data() + (size_t)r1 * k.c1});
      }
      pthread_attr_t attr;
      pthread_attr_init(&attr);
      pthread_attr_setstacksize(&attr, 256 << 10);
      std::vector<pthread_t> th(args.size());
      for (size_t i = 0; i < args.size(); i++)
        if (pthread_create(&th[i], &attr, run_thread, &args[i]) != 0) { printf("FAIL case %zu: pthread_create\n", ci); return 1; }
      for (auto &h : th) pthread_join(h, nullptr);
      for (auto &b : blocks) { delete b.bar; for (auto *w : b.warp) delete w; }
      if (run == 0) {
        first1 = y1, first2 = y2;
        const double e1 = maxrel(y1, want1), e2 = maxrel(y2, want2);
        printf("%scase %zu: max relative error y1 %.3g, y2 %.3g\n", (e1 <= 2e-5 && e2 <= 2e-5) ? "" : "FAIL ", ci, e1, e2);
      } else if (memcmp(first1.data(), y1.data(), 4 * y1.size()) != 0 || memcmp(first2.data(), y2.data(), 4 * y2.size()) != 0) {
        printf("FAIL case %zu: the second launch differs from the first\n", ci);
      }
    }
    if (bar[0] != 0 || bar[1] != 2 || bar[2] != 0)
      printf("FAIL case %zu: counters %u arrivals, generation %u, %u timeouts; want 0, 2, 0\n", ci, bar[0], bar[1], bar[2]);
  }
  if (g_bad_copy || g_bad_hint) printf("FAIL %d copies past shared memory, %d L2 hints outside the rows not copied\n", g_bad_copy.load(), g_bad_hint.load());
  printf("done\n");
  return 0;
}
`

// TestGemvPairEmulated runs the GemvPair kernels of kernels/gemv.cu on the
// CPU (gpEmuHarness, g++ C++20: no GPU needed) at odd shapes and
// variants: grouped products, warps with two segments, rows of a batch in
// two scale rows, blocks without rows, rows crossing a group, every
// second-product row from shared or from global memory, early and late
// copies and L2 hints, U 4 and 8; against float64 sums, twice on the same
// barrier counters. Skipped with -short or without g++.
func TestGemvPairEmulated(t *testing.T) {
	kern, err := gemvPairEmuSource()
	if err != nil {
		t.Fatal(err)
	}
	lines := runHostEmulation(t, map[string]string{"emu.cpp": gpEmuHarness, "kern.inc": kern})
	for _, l := range lines {
		t.Log(l)
	}
	if len(lines) == 0 || lines[len(lines)-1] != "done" {
		t.Errorf("the emulation did not finish its cases")
	}
}
