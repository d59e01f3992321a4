// CPU emulation harness for kernels/attndec.cu (TestAttnDecEmulated):
// every CUDA thread of a block is a std::thread, __syncthreads a block
// barrier, __shfl_xor_sync an exchange between two warp barriers,
// __shared__ variables statics (one block runs at a time), dynamic shared
// memory a poisoned static buffer. It runs the partial and combine kernels
// on small problems and prints, per case and variant, the max relative
// error against a float64 evaluation of dsv4-flash.md section 4.4 written
// here (FAIL above 1e-5), then "worst <max>".
#include <barrier>
#include <thread>
#include <vector>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <random>
#include <algorithm>
#include <functional>
#include <string>
using std::min; using std::max;
struct float4 { float x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
#include "cuda_emu.h"  // threadIdx, blockIdx, the barriers, __syncthreads, the CUDA keywords
float g_shfl[32][32];
alignas(16) static unsigned char g_dyn[256 << 10];
inline float __shfl_xor_sync(unsigned, float v, int o) {
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  g_warp_bar[w]->arrive_and_wait();
  g_shfl[w][l] = v;
  g_warp_bar[w]->arrive_and_wait();
  return g_shfl[w][l ^ o];
}
inline float __int_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
template <class T> inline T __ldg(const T *p) { return *p; }

#define AD_EMULATE
inline void ad_cp16(void *dst, const void *src, bool ok) {
  if (ok) memcpy(dst, src, 16); else memset(dst, 0, 16);
}
inline void ad_cp_commit() {}
template <int N> inline void ad_cp_wait() {}
#include "kern.inc"  // kernels/attndec.cu with its extern __shared__ arrays mapped to g_dyn

void launch(void (*k)(ADArgs), U3 grid, unsigned threads, ADArgs a) {
  gridDim = grid; blockDim = {threads, 1, 1};
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        memset(g_dyn, 0xff, sizeof g_dyn);  // poison shared memory
        std::barrier<> bb(threads);
        g_block_bar = &bb;
        std::vector<std::barrier<> *> wb;
        for (unsigned w = 0; w < (threads + 31) / 32; w++) { g_warp_bar[w] = new std::barrier<>(min(32u, threads - 32 * w)); }
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < threads; t++)
          ts.emplace_back([=] { threadIdx = {t, 0, 0}; blockIdx = {x, y, z}; k(a); });
        for (auto &t : ts) t.join();
        for (unsigned w = 0; w < (threads + 31) / 32; w++) delete g_warp_bar[w];
      }
}

struct Var { const char *name; int G, KT, maxS; std::vector<int> dims; };
// gen.inc (written by TestAttnDecEmulated from attndec.go) defines
// std::vector<Var> vars, kernel(name, D) and combine_threads(D).
#include "gen.inc"

struct Case { const char *name; int window, ringRows, p0, T, H, D; const char *kind; int ratio, topk, maxKeys; bool pad; float sinkShift; };

int main(int argc, char **argv) {
  std::vector<Case> cases = {
    {"window first", 16, 16, 0, 1, 8, 128, "window", 0, 0, 0, false, 0},
    {"window early T4", 16, 19, 3, 4, 8, 128, "window", 0, 0, 0, false, 0},
    {"window wraps", 16, 19, 100, 4, 16, 256, "window", 0, 0, 0, false, 0},
    {"hca", 16, 18, 70, 3, 8, 128, "hca", 8, 0, 0, false, 0},
    {"hca none yet, big max", 16, 17, 5, 1, 8, 128, "hca", 8, 0, 300, false, 0},
    {"csa few", 16, 20, 9, 4, 8, 128, "csa", 4, 40, 0, false, 0},
    {"csa full", 16, 17, 400, 1, 8, 512, "csa", 4, 40, 0, false, 0},
    {"csa pad T2", 16, 18, 400, 2, 16, 128, "csa", 4, 40, 0, true, 0},
    {"csa trunc", 16, 17, 400, 1, 8, 256, "csa", 4, 40, 16 + 7, false, 0},
    {"csa big sink", 16, 17, 400, 1, 8, 128, "csa", 4, 40, 0, false, 6},
    {"hca multi-tile splits", 16, 17, 1500, 1, 8, 128, "hca", 1, 0, 0, false, 0},
    {"csa mostly padding", 16, 18, 1300, 2, 8, 128, "csa", 1, 1200, 0, true, 0},
  };
  double worstAll = 0;
  for (size_t ci = 0; ci < cases.size(); ci++) {
    Case c = cases[ci];
    std::mt19937 rng(ci + 1);
    std::normal_distribution<float> nd(0.f, 1.f);
    int last = c.p0 + c.T - 1, D = c.D, H = c.H;
    std::vector<float> keys((last + 1) * D); for (auto &v : keys) v = nd(rng);
    std::vector<float> ring(c.ringRows * D, NAN);
    for (int p = max(0, c.p0 - c.window + 1); p <= last; p++) memcpy(&ring[(p % c.ringRows) * D], &keys[p * D], 4 * D);
    int nEnt = c.ratio ? (last + 1) / c.ratio : 0;
    std::vector<float> ent(max(nEnt, 1) * D); for (auto &v : ent) v = nd(rng);
    std::vector<float> q(c.T * H * D); for (auto &v : q) v = nd(rng);
    std::vector<float> sinks(H); for (auto &v : sinks) v = nd(rng) + c.sinkShift;
    int stride = max(c.topk, 1) + 3;
    std::vector<int> idx(c.T * stride, 1 << 30);
    for (int qi = 0; qi < c.T; qi++) {
      int n = (c.p0 + qi + 1) / max(c.ratio, 1);
      std::vector<int> perm(max(n, 1)); for (int i = 0; i < (int)perm.size(); i++) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int j = 0; j < min(n, c.topk); j++) idx[qi * stride + j] = (c.pad && (c.topk > 100 ? j % 50 != 0 : j % 3 == 1)) ? -1 : perm[j];
    }
    int maxKeys = c.maxKeys ? c.maxKeys : c.window + (!strcmp(c.kind, "csa") ? c.topk : !strcmp(c.kind, "hca") ? nEnt : 0);
    std::vector<int> pos(c.T); for (int i = 0; i < c.T; i++) pos[i] = c.p0 + i;
    double scale = 1 / std::sqrt((double)D);
    // The query preparation of AttentionDecodeNormQ (qprep, mode 1): per
    // head RMS with eps, then the last 2·nf dims rotated forward; the
    // combine rotates the output back with the same table.
    const int nf = D / 8;
    const float qeps = 1e-6f;
    std::vector<float> freq(nf);
    for (int k = 0; k < nf; k++) freq[k] = std::pow(10000.f, -2.f * k / (2 * nf)) * (k % 2 ? 1.f : 1.3f);
    for (int mode = 0; mode < 2; mode++) {
    std::vector<double> qd(q.begin(), q.end());
    if (mode == 1)
      for (int qi = 0; qi < c.T; qi++)
        for (int h = 0; h < H; h++) {
          double *v = &qd[(qi * H + h) * D], ss = 0;
          for (int x = 0; x < D; x++) ss += v[x] * v[x];
          const double inv = 1 / std::sqrt(ss / D + qeps);
          for (int x = 0; x < D; x++) v[x] *= inv;
          for (int k = 0; k < nf; k++) {
            const double ang = (double)(float)((float)(c.p0 + qi) * freq[k]);
            double *e = &v[D - 2 * nf + 2 * k];
            const double re = e[0], im = e[1];
            e[0] = re * std::cos(ang) - im * std::sin(ang);
            e[1] = re * std::sin(ang) + im * std::cos(ang);
          }
        }
    // reference
    std::vector<double> want(c.T * H * D, 0);
    for (int qi = 0; qi < c.T; qi++) {
      int t = c.p0 + qi;
      std::vector<const float *> list;
      for (int p = max(0, t - c.window + 1); p <= t; p++) list.push_back(&keys[p * D]);
      if (!strcmp(c.kind, "hca")) for (int e = 0; e < (t + 1) / c.ratio; e++) list.push_back(&ent[e * D]);
      if (!strcmp(c.kind, "csa")) for (int j = 0; j < min((t + 1) / c.ratio, c.topk); j++) { int e = idx[qi * stride + j]; list.push_back(e < 0 ? nullptr : &ent[e * D]); }
      if ((int)list.size() > maxKeys) list.resize(maxKeys);
      std::vector<const float *> kl; for (auto p : list) if (p) kl.push_back(p);
      for (int h = 0; h < H; h++) {
        std::vector<double> s(kl.size()); double M = -INFINITY;
        for (size_t i = 0; i < kl.size(); i++) { double d = 0; for (int x = 0; x < D; x++) d += qd[(qi * H + h) * D + x] * kl[i][x]; s[i] = d * scale; M = std::max(M, s[i]); }
        double den = std::exp(sinks[h] - M);
        for (auto &v : s) { v = std::exp(v - M); den += v; }
        for (size_t i = 0; i < kl.size(); i++) for (int x = 0; x < D; x++) want[(qi * H + h) * D + x] += s[i] / den * kl[i][x];
        if (mode == 1)
          for (int k = 0; k < nf; k++) {
            const double ang = -(double)(float)((float)t * freq[k]);
            double *e = &want[(qi * H + h) * D + D - 2 * nf + 2 * k];
            const double re = e[0], im = e[1];
            e[0] = re * std::cos(ang) - im * std::sin(ang);
            e[1] = re * std::sin(ang) + im * std::cos(ang);
          }
      }
    }
    for (auto &v : vars) {
      if (std::find(v.dims.begin(), v.dims.end(), D) == v.dims.end() || H % v.G) continue;
      if (mode == 1 && &v != &vars[0]) continue;  // the query preparation: the default variant
      int S = max(1, min(v.maxS, (maxKeys + v.KT - 1) / v.KT));
      std::vector<float> part(c.T * S * H * (D + 2), NAN), out(c.T * H * D, NAN);
      ADArgs a{};
      a.o = out.data(); a.q = q.data(); a.ring = ring.data(); a.comp = strcmp(c.kind, "window") ? ent.data() : nullptr;
      a.idx = !strcmp(c.kind, "csa") ? idx.data() : nullptr; a.sinks = sinks.data(); a.pos = pos.data(); a.part = part.data();
      a.ring_rows = c.ringRows; a.window = c.window; a.ratio = max(c.ratio, 1); a.idx_stride = stride; a.topk = c.topk;
      a.heads = H; a.dim = D; a.max_keys = maxKeys; a.splits = S; a.nq = c.T; a.kt = v.KT; a.scale = (float)scale;
      if (mode == 1) { a.qprep = AD_QNORM | AD_QROPE; a.qeps = qeps; a.rope_nf = nf; a.rope_freq = freq.data(); }
      auto k = kernel(v.name, D);
      if (!k) { printf("no kernel %s d%d  FAIL\n", v.name, D); return 1; }
      launch(k, {(unsigned)(H / v.G), (unsigned)S, (unsigned)c.T}, 256, a);
      launch(attndec_combine, {(unsigned)H, (unsigned)c.T, 1}, combine_threads(D), a);
      double e = 0, m = 0;
      for (size_t i = 0; i < out.size(); i++) { if (std::isnan(out[i])) { e = INFINITY; break; } e = std::max(e, std::fabs(out[i] - want[i])); m = std::max(m, std::fabs(want[i])); }
      double r = e / m; worstAll = std::max(worstAll, r);
      printf("%-24s %-7s%s S=%-3d maxKeys=%-4d rel %.3g%s\n", c.name, v.name, mode ? " qprep" : "", S, maxKeys, r, r > 1e-5 ? "  FAIL" : "");
      // The early promises (AD_EARLY_KEYS | AD_EARLY_COMP: the position and
      // the first tile's keys read before the wait) change no bit: the
      // default variant (one key buffer) and g8k16db (two).
      if (mode == 0 && (&v == &vars[0] || !strcmp(v.name, "g8k16db"))) {
        std::vector<float> p2(part.size(), NAN), o2(out.size(), NAN);
        ADArgs b = a;
        b.part = p2.data(); b.o = o2.data(); b.early = AD_EARLY_KEYS | AD_EARLY_COMP;
        launch(k, {(unsigned)(H / v.G), (unsigned)S, (unsigned)c.T}, 256, b);
        launch(attndec_combine, {(unsigned)H, (unsigned)c.T, 1}, combine_threads(D), b);
        const bool same = memcmp(o2.data(), out.data(), 4 * out.size()) == 0;
        printf("%-24s %-7s early-promises %s%s\n", c.name, v.name, same ? "same bits" : "other bits", same ? "" : "  FAIL");
      }
    }
    }
  }
  printf("worst %.3g\n", worstAll);
}
