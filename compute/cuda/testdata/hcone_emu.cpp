// CPU emulation harness for fuse_hc_one / fuse_hc_one4 of kernels/fuse.cu
// (TestHCOneEmulated): every CUDA thread of a block is a std::thread,
// __syncthreads a block barrier, the collapse warps' named barrier another,
// each shuffle an exchange between two warp barriers, __shared__ variables
// statics (one block runs at a time, in launch order, so the last block of
// a token group finishes it). gen.inc (written by the test from fuse.go's
// launch shapes) lists the cases. Each case runs the kernel twice on the
// same counters and prints the max relative error of x', pre, post, comb
// and a against a float64 evaluation of dsv4-flash.md section 4.3 written
// here (FAIL above 1e-4, or when the two launches differ or a counter is
// not zero afterwards), then "worst <max>".
#include <atomic>
#include <barrier>
#include <thread>
#include <vector>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <cstdint>
#include <random>
#include <algorithm>
using std::min; using std::max;
typedef uint16_t u16;
struct float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct U3 { unsigned x, y, z; };
thread_local U3 threadIdx, blockIdx;
U3 blockDim, gridDim;
std::barrier<> *g_block_bar, *g_named_bar;
std::barrier<> *g_warp_bar[32];
float g_shfl[32][32];
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static
#define FULL 0xffffffffu
inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
inline void hco_emu_bar(int) { g_named_bar->arrive_and_wait(); }
inline float __shfl_sync(unsigned, float v, int src) {
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  g_warp_bar[w]->arrive_and_wait();
  g_shfl[w][l] = v;
  g_warp_bar[w]->arrive_and_wait();
  return g_shfl[w][src & 31];
}
inline float __shfl_xor_sync(unsigned m, float v, int o) { return __shfl_sync(m, v, (threadIdx.x % 32) ^ o); }
inline float __int_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
template <class T> inline T __ldg(const T *p) { return *p; }
template <class T> inline T __ldcg(const T *p) { return *p; }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline int atomicExch(int *p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
#include "kern.inc"  // ops.cu's helpers and fuse.cu's fuse_hc_one section

void launch(void (*k)(const HCOneArgs), U3 grid, unsigned threads, HCOneArgs a, unsigned named) {
  gridDim = grid; blockDim = {threads, 1, 1};
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        std::barrier<> bb(threads), nb(named);
        g_block_bar = &bb; g_named_bar = &nb;
        for (unsigned w = 0; w < threads / 32; w++) g_warp_bar[w] = new std::barrier<>(32);
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < threads; t++)
          ts.emplace_back([=] { threadIdx = {t, 0, 0}; blockIdx = {x, y, z}; k(a); });
        for (auto &t : ts) t.join();
        for (unsigned w = 0; w < threads / 32; w++) delete g_warp_bar[w];
      }
}

struct Case { const char *name; int hc, D, T, head, expand, bf16, weighted, rb, groups, S, cq, vthreads, V, blocks, vt; };
// gen.inc defines std::vector<Case> cases.
#include "gen.inc"

static double maxrel(const std::vector<float> &got, const std::vector<double> &want) {
  double e = 0, m = 0;
  for (size_t i = 0; i < got.size(); i++) {
    if (!std::isfinite(got[i])) return INFINITY;
    e = max(e, std::fabs(got[i] - want[i])); m = max(m, std::fabs(want[i]));
  }
  return m > 0 ? e / m : e;
}

int main() {
  double worst = 0;
  for (size_t ci = 0; ci < cases.size(); ci++) {
    const Case c = cases[ci];
    std::mt19937 rng(ci + 7);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::uniform_real_distribution<float> ud(0.f, 1.f);
    const int hc = c.hc, D = c.D, T = c.T, n = hc * D, nm = c.head ? hc : (2 + hc) * hc;
    std::vector<float> fn(nm * n), base(nm), scale(3), x(T * n), o(T * D), post0(T * hc), comb0(T * hc * hc), w(D);
    std::vector<u16> fnb(nm * n);
    for (size_t i = 0; i < fn.size(); i++) {
      float v = nd(rng) * 0.3f / std::sqrt((float)n);
      if (c.bf16) { unsigned u; memcpy(&u, &v, 4); fnb[i] = (u16)(u >> 16); u &= 0xffff0000u; memcpy(&v, &u, 4); }
      fn[i] = v;
    }
    for (auto &v : base) v = nd(rng);
    for (auto &v : scale) v = nd(rng);
    scale[2] = 4;
    for (auto &v : x) v = nd(rng);
    for (auto &v : o) v = nd(rng);
    for (auto &v : post0) v = 2 * ud(rng);
    for (auto &v : comb0) v = ud(rng) / hc;
    for (auto &v : w) v = nd(rng);
    // float64 reference
    std::vector<double> wx(T * n), wpre(T * hc), wpost(T * hc), wcomb(T * hc * hc), wa(T * D);
    for (int b = 0; b < T; b++) {
      double *xs = &wx[b * n];
      for (int k = 0; k < hc; k++)
        for (int i = 0; i < D; i++) {
          double s = x[(b * hc + k) * D + i];
          if (c.expand) {  // x'[k] = post[k]·o + Σ_j comb[j, k]·x[j]
            s = (double)post0[b * hc + k] * o[b * D + i];
            for (int j = 0; j < hc; j++) s += (double)comb0[(b * hc + j) * hc + k] * x[(b * hc + j) * D + i];
          }
          xs[k * D + i] = s;
        }
      double ss = 0; for (int i = 0; i < n; i++) ss += xs[i] * xs[i];
      const double rho = 1 / std::sqrt(ss / n + 1e-6);
      std::vector<double> m(nm);
      for (int r = 0; r < nm; r++) { double d = 0; for (int i = 0; i < n; i++) d += (double)fn[r * n + i] * xs[i]; m[r] = d * rho; }
      auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
      for (int j = 0; j < hc; j++) wpre[b * hc + j] = sig(m[j] * scale[0] + base[j]) + 1e-6;
      if (!c.head) {
        for (int j = 0; j < hc; j++) wpost[b * hc + j] = 2 * sig(m[hc + j] * scale[1] + base[hc + j]);
        std::vector<double> C(hc * hc);
        for (int j = 0; j < hc; j++) {
          double mx = -INFINITY; for (int k = 0; k < hc; k++) mx = max(mx, m[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k]);
          double s = 0; for (int k = 0; k < hc; k++) { C[j * hc + k] = std::exp(m[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k] - mx); s += C[j * hc + k]; }
          for (int k = 0; k < hc; k++) C[j * hc + k] = C[j * hc + k] / s + 1e-6;
        }
        for (int it = 0; it < 20; it++) {
          if (it > 0) for (int j = 0; j < hc; j++) { double s = 0; for (int k = 0; k < hc; k++) s += C[j * hc + k]; for (int k = 0; k < hc; k++) C[j * hc + k] /= s + 1e-6; }
          for (int k = 0; k < hc; k++) { double s = 0; for (int j = 0; j < hc; j++) s += C[j * hc + k]; for (int j = 0; j < hc; j++) C[j * hc + k] /= s + 1e-6; }
        }
        for (int i = 0; i < hc * hc; i++) wcomb[b * hc * hc + i] = C[i];
      }
      std::vector<double> a(D); double sa = 0;
      for (int i = 0; i < D; i++) { double v = 0; for (int j = 0; j < hc; j++) v += wpre[b * hc + j] * xs[j * D + i]; a[i] = v; sa += v * v; }
      const double inv = 1 / std::sqrt(sa / D + 1e-6);
      for (int i = 0; i < D; i++) wa[b * D + i] = a[i] * inv * (c.weighted ? w[i] : 1.0);
    }
    const int groupsT = (T + 3) / 4;
    std::vector<int> ctr(groupsT, 0);
    std::vector<float> part(T * (nm + 1) * c.S, NAN);
    std::vector<float> res[2][5];
    bool same = true;
    for (int run = 0; run < 2; run++) {
      std::vector<float> post(post0), comb(comb0), xout(T * n, NAN), pre(T * hc, NAN), a(T * D, NAN);
      HCOneArgs p{};
      p.part = part.data(); p.ctr = ctr.data(); p.x = x.data();
      if (c.expand) { p.o = o.data(); p.post0 = post.data(); p.comb0 = comb.data(); p.xout = xout.data(); }
      p.fn = c.bf16 ? (const void *)fnb.data() : (const void *)fn.data();
      p.pre = pre.data(); p.post = c.head ? nullptr : post.data(); p.comb = c.head ? nullptr : comb.data(); p.a = a.data();
      p.w = c.weighted ? w.data() : nullptr; p.base = base.data(); p.scale = scale.data();
      p.fmt = c.bf16 ? 3 : 4; p.n = n; p.nm = nm; p.cq = c.cq; p.rb = c.rb; p.batch = T; p.hc = hc; p.dim = D; p.S = c.S;
      p.groups = c.groups; p.V = c.V; p.vthreads = c.vthreads; p.iters = 20; p.head = c.head; p.vt = c.vt;
      p.eps = 1e-6f; p.normEps = 1e-6f; p.rmsEps = 1e-6f;
      launch(hc == 4 ? fuse_hc_one4 : fuse_hc_one, {(unsigned)c.blocks, 1, (unsigned)groupsT}, c.V * c.vthreads + 32, p, c.V * c.vthreads);
      res[run][0] = xout; res[run][1] = pre; res[run][2] = post; res[run][3] = comb; res[run][4] = a;
      if (run == 1) for (int k = 0; k < 5; k++) same = same && !memcmp(res[0][k].data(), res[1][k].data(), 4 * res[0][k].size());
    }
    bool zero = true; for (int v : ctr) zero = zero && v == 0;
    double e[5] = {c.expand ? maxrel(res[1][0], wx) : 0, maxrel(res[1][1], wpre), c.head ? 0 : maxrel(res[1][2], wpost),
                   c.head ? 0 : maxrel(res[1][3], wcomb), maxrel(res[1][4], wa)};
    if (c.head && (memcmp(res[1][2].data(), post0.data(), 4 * post0.size()) || memcmp(res[1][3].data(), comb0.data(), 4 * comb0.size()))) same = false;
    double r = 0; for (double v : e) r = max(r, v);
    worst = max(worst, r);
    printf("%-28s x' %.3g pre %.3g post %.3g comb %.3g a %.3g%s%s%s\n", c.name, e[0], e[1], e[2], e[3], e[4],
           r > 1e-4 ? "  FAIL" : "", same ? "" : "  FAIL (launches differ or head changed post/comb)", zero ? "" : "  FAIL (counter not zero)");
  }
  printf("worst %.3g\n", worst);
}
