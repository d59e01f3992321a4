// The MoE decode knock-out microbenchmark (session 14; scripts/moe-mb/run.sh
// builds it with nvcc on the GPU machine against kernels/moe.cu's common
// section and module.go's preamble). moe_stage2k is the lean stage 2
// (moe_stage2l with G 1, UF 1, one block a row group) as it stood at the
// start of session 14, with knock-out and experiment switches (KO, below);
// k2repo is the repository's moe_stage2l as built now, k1 its moe1lx.
// HOTREC=1: every launch reads the same expert tables (else one copy a
// launch, cold in L2 as in a decode step).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <string>
#include <cuda_runtime.h>
#include "prelude.h"
#include "common.cu"
#include "mb.cuh"  // scripts/read-mb: CK, the timing loops

template <> struct MoeDec<9> {
  static __device__ __forceinline__ void run(u32 w, u32 &a, u32 &b, u32 &c, u32 &d) { a = w; b = w; c = w; d = w; }
  static __device__ __forceinline__ float post() { return 1.f; }
};

template <int DEC, int JS>
__device__ __forceinline__ void lean_group_js(const uint4 &w0, const uint4 &w1, float fa, float fb, const u16 *xq, bool bl, float (&acc)[4]) {
  float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const uint4 b = bl ? *reinterpret_cast<const uint4 *>(xq + JS * j) : make_uint4(0u, 0u, 0u, 0u);
    u32 a0, a1, a2, a3, b0, b1, b2, b3;
    MoeDec<DEC>::run(quarter(w0, j), a0, a1, a2, a3);
    MoeDec<DEC>::run(quarter(w1, j), b0, b1, b2, b3);
    mma16816(d, a0, b0, a1, b1, b.x, b.y);
    mma16816(d, a2, b2, a3, b3, b.z, b.w);
  }
  acc[0] = fmaf(d[0], fa, acc[0]);
  acc[1] = fmaf(d[1], fa, acc[1]);
  acc[2] = fmaf(d[2], fb, acc[2]);
  acc[3] = fmaf(d[3], fb, acc[3]);
}

// KO 32: a routed unit's h kept in its ring slot as piece 8j + 2t + hl
// (lane (g, t)'s piece j of hi (hl 0) or lo), so that the 8 lanes reading
// piece j read 128 contiguous bytes.
// lean_ring_walk, but with EARLY the first two chunks' weights (mode 1)
// are issued before the PDL wait and their h copies (mode 2) after it.
template <typename Chunk, bool EARLY, typename Ld, typename Cp>
__device__ __forceinline__ void walk_early(int q, int end, int step, int &mode, Ld ld, Cp cp) {
  if (!EARLY) {
    lean_ring_walk<Chunk>(q, end, step, ld, cp);
    return;
  }
  Chunk A, B;
  mode = 1;
  if (q < end) ld(A, q, 0);
  if (q + step < end) ld(B, q + step, 1);
  MOXIE_PDL();
  mode = 2;
  if (q < end) ld(A, q, 0);
  cp_async_commit();
  if (q + step < end) ld(B, q + step, 1);
  cp_async_commit();
  mode = 0;
  while (q < end) {
    cp_async_wait1();
    __syncwarp();
    cp(A, q, 0);
    __syncwarp();
    if (q + 2 * step < end) ld(A, q + 2 * step, 0);
    cp_async_commit();
    if (q + step < end) {
      cp_async_wait1();
      __syncwarp();
      cp(B, q + step, 1);
      __syncwarp();
      if (q + 3 * step < end) ld(B, q + 3 * step, 1);
      cp_async_commit();
    }
    q += 2 * step;
  }
}

// KO bits: 1 no h copies (B from whatever the ring holds), 2 no decode/mma
// (the weight words folded by XOR), 4 no ids load (expert slot k reads
// record k), 16 the shared expert's spans skipped, 32 h kept contiguous per
// B read (above), 64 no L2 hints (moe2_pf), 128 the ids and records read
// before the PDL wait, 256 and the first two chunks' weights (h after the
// wait), 512 the expert slot by umulhi instead of a division. DEC 9: no
// E2M1 decode (the words go to the mma as they are).
template <int G, int UF, int DEC, int KO>
__device__ __forceinline__ void moe_stage2k(const MoeArgs &a) {
  constexpr int NW = LEAN2_WARPS;
  __shared__ uint4 ring[NW][2][G * 32];
  __shared__ float red[NW][8][2];
  __shared__ const u8 *recW[MOE_MAXK], *recS[MOE_MAXK];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int r0 = blockIdx.x * 16;
  for (int k = threadIdx.x; k < a.K; k += blockDim.x) {
    const int id = (KO & 4) ? k : (KO & 128) ? __ldcg(a.ids + k) : __ldg(a.ids + k);
    const bool ok = (unsigned)id < (unsigned)a.E;
    recW[k] = ok ? a.t2[id].W : nullptr;
    recS[k] = ok ? a.t2[id].S : nullptr;
  }
  __syncthreads();
  if ((KO & 128) && !(KO & 256)) MOXIE_PDL();
  const int gpe = a.I >> 7, R = a.K * gpe, S = (KO & 16) ? 0 : a.Is >> 6, total = R + S;
  const int per = (total + NW - 1) / NW;
  const int u0 = min(total, warp * per), u1 = min(total, u0 + per);
  const long long rb = a.I >> 1, sb = a.I >> 5;
  u16 *slots = reinterpret_cast<u16 *>(&ring[warp][0][0]);
  float accR[4] = {0.f, 0.f, 0.f, 0.f}, accS[1][4] = {{0.f, 0.f, 0.f, 0.f}};
  u32 fold = 0;
  const bool blR = (g >> 1) == t;
  if (u0 < R) {
    const int uend = min(u1, R);
    using Ch = Lean2Fp4<G>;
    const u32 magic = (0x80000000u + (u32)gpe - 1u) / (u32)gpe;  // KO 512: k = umulhi(2·ui, magic), exact for ui < 2^31 / gpe
    int mode = (KO & 256) ? 1 : 0;  // 0: weights and h; 1: weights only; 2: h only
    walk_early<Ch, (KO & 256) != 0>(
        u0, uend, G, mode,
        [&](Ch &c, int u, int slot) {
          const bool early = mode == 1, honly = mode == 2;
#pragma unroll
          for (int i = 0; i < G; i++) {
            const int ui = u + i, k = (KO & 512) ? (int)__umulhi(2u * ui, magic) : ui / gpe, q = ui - k * gpe;
            const u8 *Wk = ui < uend ? recW[k] : nullptr;
            if (Wk) {
              const u8 *Sk = recS[k];
#pragma unroll
              for (int r = 0; r < 2; r++) {
                if (honly) break;
                c.w[i][r] = ldw(reinterpret_cast<const uint4 *>(Wk + (r0 + g + 8 * r) * rb) + 4 * q + t);
                c.sc[i][r] = __ldg(Sk + (r0 + g + 8 * r) * sb + 4 * q + t);
              }
              if (early) {
              } else if ((KO & 32) && !(KO & 1)) {
                const int jj = lane >> 3, tt = (lane >> 1) & 3, hl = lane & 1;
                const u16 *src = a.h + (long long)k * 2 * a.I + hl * a.I + 128 * q + 8 * (4 * tt + jj);
                cp_async16(slots + (slot * G + i) * 256 + 8 * lane, src);
              } else if (!(KO & 1)) {
                const u16 *src = a.h + (long long)k * 2 * a.I + (lane >> 4) * a.I + 128 * q + 8 * (lane & 15);
                cp_async16(slots + (slot * G + i) * 256 + (lane >> 4) * 128 + 8 * (lane & 15), src);
              }
            } else if (!honly) {
#pragma unroll
              for (int r = 0; r < 2; r++) {
                c.w[i][r] = make_uint4(0u, 0u, 0u, 0u);
                c.sc[i][r] = 0u;
              }
            }
          }
        },
        [&](const Ch &c, int u, int slot) {
#pragma unroll
          for (int i = 0; i < G; i++) {
            const int ui = u + i;
            if (ui >= uend) break;
            if (KO & 2) {
              fold ^= c.w[i][0].x ^ c.w[i][0].y ^ c.w[i][0].z ^ c.w[i][0].w ^ c.w[i][1].x ^ c.w[i][1].y ^ c.w[i][1].z ^ c.w[i][1].w ^ c.sc[i][0] ^
                      c.sc[i][1];
            } else if (KO & 32) {
              lean_group_js<DEC, 64>(c.w[i][0], c.w[i][1], __int_as_float(c.sc[i][0] << 23), __int_as_float(c.sc[i][1] << 23),
                                     slots + (slot * G + i) * 256 + 16 * t + 8 * (g & 1), blR, accR);
            } else {
              lean_group<DEC>(c.w[i][0], c.w[i][1], __int_as_float(c.sc[i][0] << 23), __int_as_float(c.sc[i][1] << 23),
                              slots + (slot * G + i) * 256 + (g & 1) * 128 + t * 32, blR, accR);
            }
          }
        });
  }
  float accQ[1][4] = {{accR[0], accR[1], accR[2], accR[3]}};
  quad_sum<1>(accQ);
  if ((KO & 256) && !(u0 < R)) MOXIE_PDL();
  if (u1 > R) {
    const int sa = max(u0, R) - R, send = u1 - R;
    const u8 *pw[1] = {a.s2 + (long long)(r0 + g) * a.Is + 16 * t};
    const u8 *ps[1] = {a.c2 + (long long)(r0 >> a.bshift) * (a.Is >> a.bshift)};
    const u16 *hs = a.h + (long long)a.K * 2 * a.I;
    const bool bs = g < 2;
    using Ch = LeanFp8<1, UF>;
    lean_ring_walk<Ch>(
        sa, send, UF,
        [&](Ch &c, int s, int slot) {
          if (s + UF <= send) c.template load<false>(pw, 8LL * a.Is, ps, a.bshift, s, send);
          else c.template load<true>(pw, 8LL * a.Is, ps, a.bshift, s, send);
          if (!(KO & 1) && lane < 16) {
            const int hl = lane >> 3, off = 8 * (lane & 7);
#pragma unroll
            for (int i = 0; i < UF; i++)
              if (s + i < send) cp_async16(slots + slot * G * 256 + hl * UF * 64 + i * 64 + off, hs + hl * a.Is + 64 * (s + i) + off);
          }
        },
        [&](const Ch &c, int s, int slot) {
          if (KO & 2) {
#pragma unroll
            for (int u = 0; u < UF; u++) fold ^= c.w[u][0][0].x ^ c.w[u][0][0].y ^ c.w[u][0][0].z ^ c.w[u][0][0].w ^ c.w[u][0][1].x ^ c.w[u][0][1].w ^ c.sc[u][0];
          } else {
            const u16 *xb = slots + slot * G * 256 + (g & 1) * UF * 64 - s * 64;
            if (s + UF <= send) c.template compute<false>(xb, bs, s, send, t, accS);
            else c.template compute<true>(xb, bs, s, send, t, accS);
          }
        });
  }
  if (t == 0) {
    const float post = MoeDec<DEC>::post();
    const float r0v = fmaf(accQ[0][1], 1.f / 2048.f, accQ[0][0]) * post + fmaf(accS[0][1], 1.f / 2048.f, accS[0][0]) + __int_as_float(fold & 0x007fffffu);
    const float r8v = fmaf(accQ[0][3], 1.f / 2048.f, accQ[0][2]) * post + fmaf(accS[0][3], 1.f / 2048.f, accS[0][2]);
    red[warp][g][0] = r0v;
    red[warp][g][1] = r8v;
  }
  __syncthreads();
  if (threadIdx.x < 16) {
    const int i = threadIdx.x;
    float s = 0.f;
    for (int w = 0; w < NW; w++) s += red[w][i & 7][i >> 3];
    a.out[r0 + i] = s;
  }
}

// Stage 1 (moe_stage1l<0, false> as of session 14) with knock-out switches
// (KO1): 1 no x staging, 2 no scale staging, 4 no ids load (slot k reads
// record k), 8 no decode/mma (the weight words folded by XOR), 16 the
// shared tiles do nothing, 32 the routed tiles do nothing.
template <int KO>
__device__ __forceinline__ void moe_stage1k(const MoeArgs &a) {
  extern __shared__ uint4 moe_smem[];
  __shared__ float red[LEAN1_WARPS][8][4];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int W = lean1_width(a.D), P = lean1_groups(a.D);
  u16 *xw = reinterpret_cast<u16 *>(reinterpret_cast<u8 *>(moe_smem) + warp * (4 * W + 128 * P));
  u32 *ssw = reinterpret_cast<u32 *>(xw + 2 * W);
  const int nsh = a.Is >> 4;
  float acc[2][4];
#pragma unroll
  for (int m = 0; m < 2; m++)
#pragma unroll
    for (int i = 0; i < 4; i++) acc[m][i] = 0.f;
  u32 fold = 0;
  if ((int)blockIdx.x < nsh) {
    if (KO & 16) return;
    const int r0 = blockIdx.x * 16;
    const int spans = a.D >> 6, per = (spans + LEAN1_WARPS - 1) / LEAN1_WARPS;
    const int s0 = warp * per, end = min(spans, s0 + per);
    const u8 *pw[2] = {a.s1 + (long long)(r0 + g) * a.D + 16 * t, a.s3 + (long long)(r0 + g) * a.D + 16 * t};
    const int sstride = a.D >> a.bshift;
    const u8 *ps[2] = {a.c1 + (long long)(r0 >> a.bshift) * sstride, a.c3 + (long long)(r0 >> a.bshift) * sstride};
    const bool bl = g < 2;
    const u16 *xb = xw + (g & 1) * W - s0 * 64;
    using Ch = LeanFp8<2, 1>;
    wide_walk<Ch>(
        s0, end, 1, [&](Ch &c, int s) { c.template load<false>(pw, 8LL * a.D, ps, a.bshift, s, end); },
        [&](const Ch &c, int s) {
          if (KO & 8) fold ^= c.w[0][0][0].x ^ c.w[0][0][1].y ^ c.w[0][1][0].z ^ c.w[0][1][1].w ^ c.sc[0][0] ^ c.sc[0][1];
          else c.template compute<false>(xb, bl, s, end, t, acc);
        },
        [&] {
          if (!(KO & 1) && s0 < end) lean_stage_x(a.x, xw, s0 * 64, (end - s0) * 64, W, false);
        });
    acc[0][0] += __int_as_float(fold & 0x007fffffu);
    stage1_finish<0>(a, true, true, 0, r0, acc, red);
    return;
  }
  if (KO & 32) return;
  const int tile = blockIdx.x - nsh, tpe = a.I >> 4;
  const int k = tile / tpe, r0 = (tile - k * tpe) * 16;
  const int id = (KO & 4) ? k : __ldg(a.ids + k);
  const bool valid = (unsigned)id < (unsigned)a.E;
  const LinRec *r1 = a.t13 + 2 * (valid ? id : 0), *r3 = r1 + 1;
  const u8 *W1 = r1->W, *S1 = r1->S, *W3 = r3->W, *S3 = r3->S;
  const int groups = a.D >> 7, per = (groups + LEAN1_WARPS - 1) / LEAN1_WARPS;
  const int q0 = warp * per, end = valid ? min(groups, q0 + per) : 0;
  const int rb = a.D >> 1;
  const u8 *p1 = W1 + (r0 + g) * rb + 16 * t, *p3 = W3 + (r0 + g) * rb + 16 * t;
  const bool bl = (g >> 1) == t;
  const u16 *xb = xw + (g & 1) * W - q0 * 128 + t * 32;
  const u32 *sw = ssw - 32 * q0 + g;
  using Ch4 = Lean1Fp4<1>;
  wide_walk<Ch4>(
      q0, end, 1, [&](Ch4 &c, int q) { c.load(p1, p3, 8 * rb, q, end); },
      [&](const Ch4 &c, int q) {
        if (KO & 8) {
          fold ^= c.w[0][0][0].x ^ c.w[0][0][1].y ^ c.w[0][1][0].z ^ c.w[0][1][1].w;
        } else {
          const u32 s4 = (KO & 2) ? 0x7f7f7f7fu : sw[32 * q + ((t ^ ((q - q0) & 3)) << 3)];
          lean_group<0>(c.w[0][0][0], c.w[0][0][1], e8m0_byte<0>(s4), e8m0_byte<1>(s4), xb + 128 * q, bl, acc[0]);
          lean_group<0>(c.w[0][1][0], c.w[0][1][1], e8m0_byte<2>(s4), e8m0_byte<3>(s4), xb + 128 * q, bl, acc[1]);
        }
      },
      [&] {
        if (q0 < end) {
          if (!(KO & 2)) lean_stage_scales(S1, S3, r0, a.D >> 5, q0, end - q0, ssw);
          if (!(KO & 1)) lean_stage_x(a.x, xw, q0 * 128, (end - q0) * 128, W, true);
        }
      });
  acc[0][0] += __int_as_float(fold & 0x007fffffu);
  quad_sum<2>(acc);
  stage1_finish<0>(a, false, valid, k, r0, acc, red);
}
template <int KO>
__global__ void __launch_bounds__(128, 7) k1k(MoeArgs a) {
  MOXIE_PDL_UNLESS((int)blockIdx.x < (a.Is >> 4));
  moe_stage1k<KO>(a);
}

// Stage 2 as moe2lw (EW, umulhi), but each warp copies all of its h (its
// routed units' and shared spans') into its own region of dynamic shared
// memory once, after the PDL wait and the first two chunks' weight loads,
// and then walks with plain register double-buffering: no per-chunk
// cp.async groups, waits or warp barriers. Dynamic shared memory: 16 ·
// per · 512 bytes.
template <int DEC>
__device__ __forceinline__ void moe_stage2s(const MoeArgs &a) {
  constexpr int NW = LEAN2_WARPS;
  extern __shared__ uint4 hst[];
  __shared__ float red[NW][8][2];
  __shared__ const u8 *recW[MOE_MAXK], *recS[MOE_MAXK];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int r0 = blockIdx.x * 16;
  for (int k = threadIdx.x; k < a.K; k += blockDim.x) {
    const int id = __ldcg(a.ids + k);
    const bool ok = (unsigned)id < (unsigned)a.E;
    recW[k] = ok ? a.t2[id].W : nullptr;
    recS[k] = ok ? a.t2[id].S : nullptr;
  }
  __syncthreads();
  const int gpe = a.I >> 7, R = a.K * gpe, S = a.Is >> 6, total = R + S;
  const int per = (total + NW - 1) / NW;
  const int u0 = min(total, warp * per), u1 = min(total, u0 + per);
  const long long rb = a.I >> 1, sb = a.I >> 5;
  const u32 gmul = (0x80000000u + (u32)gpe - 1u) / (u32)gpe;
  u16 *st = reinterpret_cast<u16 *>(hst) + warp * per * 256;
  const int uend = min(u1, R), nR = max(0, uend - u0);
  const int sa = max(u0, R) - R, send = u1 - R, nS = max(0, send - sa);
  u16 *sst = st + 256 * nR;  // shared spans: hi of 64·nS columns, then lo
  const u16 *hs = a.h + (long long)a.K * 2 * a.I;
  float accR[4] = {0.f, 0.f, 0.f, 0.f}, accS[1][4] = {{0.f, 0.f, 0.f, 0.f}};
  const bool blR = (g >> 1) == t;
  auto stage = [&] {
    MOXIE_PDL();
    for (int j = 0; j < nR; j++) {
      const int ui = u0 + j, k = (int)__umulhi(2u * ui, gmul), q = ui - k * gpe;
      if (!recW[k]) continue;
      const u16 *src = a.h + (long long)k * 2 * a.I + (lane >> 4) * a.I + 128 * q + 8 * (lane & 15);
      cp_async16(st + 256 * j + (lane >> 4) * 128 + 8 * (lane & 15), src);
    }
    if (lane < 16) {
      const int hl = lane >> 3, off = 8 * (lane & 7);
      for (int i = 0; i < nS; i++) cp_async16(sst + hl * 64 * nS + 64 * i + off, hs + hl * a.Is + 64 * (sa + i) + off);
    }
    cp_async_commit();
    cp_async_wait_all();
    __syncwarp();
  };
  if (nR > 0) {
    using Ch = Lean2Fp4<1>;
    wide_walk<Ch>(
        u0, uend, 1,
        [&](Ch &c, int ui) {
          const int k = (int)__umulhi(2u * ui, gmul), q = ui - k * gpe;
          const u8 *Wk = recW[k];
          if (Wk) {
            const u8 *Sk = recS[k];
#pragma unroll
            for (int r = 0; r < 2; r++) {
              c.w[0][r] = ldw(reinterpret_cast<const uint4 *>(Wk + (r0 + g + 8 * r) * rb) + 4 * q + t);
              c.sc[0][r] = __ldg(Sk + (r0 + g + 8 * r) * sb + 4 * q + t);
            }
          } else {
#pragma unroll
            for (int r = 0; r < 2; r++) {
              c.w[0][r] = make_uint4(0u, 0u, 0u, 0u);
              c.sc[0][r] = 0u;
            }
          }
        },
        [&](const Ch &c, int ui) {
          lean_group<DEC>(c.w[0][0], c.w[0][1], __int_as_float(c.sc[0][0] << 23), __int_as_float(c.sc[0][1] << 23),
                          st + 256 * (ui - u0) + (g & 1) * 128 + t * 32, blR, accR);
        },
        stage);
  } else {
    stage();
  }
  float accQ[1][4] = {{accR[0], accR[1], accR[2], accR[3]}};
  quad_sum<1>(accQ);
  if (nS > 0) {
    const u8 *pw[1] = {a.s2 + (long long)(r0 + g) * a.Is + 16 * t};
    const u8 *ps[1] = {a.c2 + (long long)(r0 >> a.bshift) * (a.Is >> a.bshift)};
    const bool bs = g < 2;
    const u16 *xb = sst + (g & 1) * 64 * nS - sa * 64;
    using Ch = LeanFp8<1, 1>;
    wide_walk<Ch>(
        sa, send, 1, [&](Ch &c, int s) { c.template load<false>(pw, 8LL * a.Is, ps, a.bshift, s, send); },
        [&](const Ch &c, int s) { c.template compute<false>(xb, bs, s, send, t, accS); }, [] {});
  }
  if (t == 0) {
    const float post = MoeDec<DEC>::post();
    red[warp][g][0] = fmaf(accQ[0][1], 1.f / 2048.f, accQ[0][0]) * post + fmaf(accS[0][1], 1.f / 2048.f, accS[0][0]);
    red[warp][g][1] = fmaf(accQ[0][3], 1.f / 2048.f, accQ[0][2]) * post + fmaf(accS[0][3], 1.f / 2048.f, accS[0][2]);
  }
  __syncthreads();
  if (threadIdx.x < 16) {
    const int i = threadIdx.x;
    float s = 0.f;
    for (int w = 0; w < NW; w++) s += red[w][i & 7][i >> 3];
    a.out[r0 + i] = s;
  }
}
__global__ void __launch_bounds__(512, 2) k2s(MoeArgs a) {
  MOXIE_PDL_INSIDE();
  MOXIE_PF(moe2_pf(a));
  moe_stage2s<0>(a);
}

template <int KO, int DEC>
__global__ void __launch_bounds__(512, 2) k2(MoeArgs a) {
  if (KO & 64) {
    if (!(KO & 384)) MOXIE_PDL();
  } else if (KO & 384) {
    moxie_pdl_pf(moe2_pf(a));
  } else {
    MOXIE_PDL_PF(moe2_pf(a));
  }
  moe_stage2k<1, 1, DEC, KO>(a);
}
// K1_MINB: k1's launch bounds' blocks an SM (7: moe1lx's 72 registers; 8
// holds it to 64, so that one 512-thread stage-2 block of 64 registers fits
// beside four stage-1 blocks: session 20's co-residency test).
#ifndef K1_MINB
#define K1_MINB 7
#endif
template <int DEC>
__global__ void __launch_bounds__(128, K1_MINB) k1(MoeArgs a) {
  MOXIE_PDL_UNLESS((int)blockIdx.x < (a.Is >> 4));
  moe_stage1l<DEC, false>(a, (int)blockIdx.x);
}
template <int DEC>
__global__ void __launch_bounds__(128, 7) k1h(MoeArgs a) {
  if ((int)blockIdx.x >= (a.Is >> 4) && threadIdx.x < 2) {
    const int tile = blockIdx.x - (a.Is >> 4);
    const int l13 = (2 * a.E * (int)sizeof(LinRec) + 127) >> 7, l2 = (a.E * (int)sizeof(LinRec) + 127) >> 7;
    if (threadIdx.x == 0 && tile < l13) moe_prefetch(reinterpret_cast<const u8 *>(a.t13) + 128 * tile);
    if (threadIdx.x == 1 && tile < l2) moe_prefetch(reinterpret_cast<const u8 *>(a.t2) + 128 * tile);
  }
  MOXIE_PDL_UNLESS((int)blockIdx.x < (a.Is >> 4));
  moe_stage1l<DEC, false>(a, (int)blockIdx.x);
}
// The repository's stage 2 as compiled there.
__global__ void __launch_bounds__(512, 2) k2repo(MoeArgs a) {
  MOXIE_PDL_PF(moe2_pf(a));
  moe_stage2l<1, 1, 0, false>(a);
}

// Session 19: stage 2 whose routed units' weights, scale words and h go by
// cp.async into a ring of D slots a warp in shared memory (dynamic, D·1600
// bytes a warp), so that D units (D KB of weights) are in flight a warp
// without holding registers; a lane copies the 2 × 16 bytes of w2 it reads
// itself (rows g and g+8), lanes t = 0 the 4-byte scale words of rows g and
// g+8 (byte t is lane t's scale), all lanes the unit's h as moe2l does. EW:
// the ids and records before the PDL wait (from L2), and the first D units'
// weights and scales, h after it (moe2lw's order). The shared expert's
// spans are moe_stage2l's register walk (ring in the same shared memory).
#define K2A_SLOT 1600
__device__ __forceinline__ void cp_async16_256(void *dst, const void *src) {
  const u32 d = (u32)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(void *dst, const void *src) {
  const u32 d = (u32)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src) : "memory");
}
template <int N> __device__ __forceinline__ void cp_async_waitn() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

template <int D, bool EW>
__device__ __forceinline__ void moe_stage2a(const MoeArgs &a) {
  constexpr int NW = LEAN2_WARPS;
  extern __shared__ uint4 moe_smem[];
  __shared__ float red[NW][8][2];
  __shared__ const u8 *recW[MOE_MAXK], *recS[MOE_MAXK];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int r0 = blockIdx.x * 16;
  u8 *wr = reinterpret_cast<u8 *>(moe_smem) + warp * D * K2A_SLOT;
  if (!EW) MOXIE_PDL();
  for (int k = threadIdx.x; k < a.K; k += blockDim.x) {
    const int id = EW ? __ldcg(a.ids + k) : __ldg(a.ids + k);
    const bool ok = (unsigned)id < (unsigned)a.E;
    recW[k] = ok ? a.t2[id].W : nullptr;
    recS[k] = ok ? a.t2[id].S : nullptr;
  }
  __syncthreads();
  const int gpe = a.I >> 7, R = a.K * gpe, S = a.Is >> 6, total = R + S;
  const int per = (total + NW - 1) / NW;
  const int u0 = min(total, warp * per), u1 = min(total, u0 + per);
  const long long rb = a.I >> 1, sb = a.I >> 5;
  const u32 gmul = (0x80000000u + (u32)gpe - 1u) / (u32)gpe;
  float accR[4] = {0.f, 0.f, 0.f, 0.f}, accS[1][4] = {{0.f, 0.f, 0.f, 0.f}};
  const bool blR = (g >> 1) == t;
  if (u0 < R) {
    const int uend = min(u1, R);
    auto issue = [&](int ui, int slot, int what) {
      if (ui >= uend) return;
      const int k = (int)__umulhi(2u * ui, gmul), q = ui - k * gpe;
      const u8 *Wk = recW[k];
      u8 *sl = wr + slot * K2A_SLOT;
      if (what & 1) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
          if (Wk) {
            cp_async16_256(sl + r * 512 + lane * 16, Wk + (r0 + g + 8 * r) * rb + 64 * q + 16 * t);
            if (t == 0) cp_async4(sl + 1024 + r * 32 + g * 4, recS[k] + (r0 + g + 8 * r) * sb + 4 * q);
          } else {
            *reinterpret_cast<uint4 *>(sl + r * 512 + lane * 16) = make_uint4(0u, 0u, 0u, 0u);
            if (t == 0) *reinterpret_cast<u32 *>(sl + 1024 + r * 32 + g * 4) = 0u;
          }
        }
      }
      if ((what & 2) && Wk) {
        const u16 *src = a.h + (long long)k * 2 * a.I + (lane >> 4) * a.I + 128 * q + 8 * (lane & 15);
        cp_async16(reinterpret_cast<u16 *>(sl + 1088) + (lane >> 4) * 128 + 8 * (lane & 15), src);
      }
    };
#pragma unroll
    for (int j = 0; j < D; j++) issue(u0 + j, j, 1);
    if (EW) MOXIE_PDL();
#pragma unroll
    for (int j = 0; j < D; j++) {
      issue(u0 + j, j, 2);
      cp_async_commit();
    }
    for (int j = 0; j < uend - u0; j++) {
      cp_async_waitn<D - 1>();
      __syncwarp();
      const int slot = j % D;
      const u8 *sl = wr + slot * K2A_SLOT;
      const uint4 w0 = *reinterpret_cast<const uint4 *>(sl + lane * 16), w1 = *reinterpret_cast<const uint4 *>(sl + 512 + lane * 16);
      const u32 s0 = *reinterpret_cast<const u32 *>(sl + 1024 + g * 4), s1 = *reinterpret_cast<const u32 *>(sl + 1024 + 32 + g * 4);
      lean_group<0>(w0, w1, __int_as_float(((s0 >> (8 * t)) & 255u) << 23), __int_as_float(((s1 >> (8 * t)) & 255u) << 23),
                    reinterpret_cast<const u16 *>(sl + 1088) + (g & 1) * 128 + t * 32, blR, accR);
      __syncwarp();
      issue(u0 + j + D, slot, 3);
      cp_async_commit();
    }
    cp_async_wait_all();
    __syncwarp();
  } else if (EW) {
    MOXIE_PDL();
  }
  float accQ[1][4] = {{accR[0], accR[1], accR[2], accR[3]}};
  quad_sum<1>(accQ);
  if (u1 > R) {
    const int sa = max(u0, R) - R, send = u1 - R;
    const u8 *pw[1] = {a.s2 + (long long)(r0 + g) * a.Is + 16 * t};
    const u8 *ps[1] = {a.c2 + (long long)(r0 >> a.bshift) * (a.Is >> a.bshift)};
    const u16 *hs = a.h + (long long)a.K * 2 * a.I;
    const bool bs = g < 2;
    u16 *slots = reinterpret_cast<u16 *>(wr);
    using Ch = LeanFp8<1, 1>;
    lean_ring_walk<Ch>(
        sa, send, 1,
        [&](Ch &c, int s, int slot) {
          c.template load<true>(pw, 8LL * a.Is, ps, a.bshift, s, send);
          if (lane < 16) {
            const int hl = lane >> 3, off = 8 * (lane & 7);
            if (s < send) cp_async16(slots + slot * 256 + hl * 64 + off, hs + hl * a.Is + 64 * s + off);
          }
        },
        [&](const Ch &c, int s, int slot) {
          const u16 *xb = slots + slot * 256 + (g & 1) * 64 - s * 64;
          c.template compute<true>(xb, bs, s, send, t, accS);
        });
  }
  if (t == 0) {
    const float post = MoeDec<0>::post();
    red[warp][g][0] = fmaf(accQ[0][1], 1.f / 2048.f, accQ[0][0]) * post + fmaf(accS[0][1], 1.f / 2048.f, accS[0][0]);
    red[warp][g][1] = fmaf(accQ[0][3], 1.f / 2048.f, accQ[0][2]) * post + fmaf(accS[0][3], 1.f / 2048.f, accS[0][2]);
  }
  __syncthreads();
  if (threadIdx.x < 16) {
    const int i = threadIdx.x;
    float s = 0.f;
    for (int w = 0; w < NW; w++) s += red[w][i & 7][i >> 3];
    a.out[r0 + i] = s;
  }
}
template <int D, bool EW>
__global__ void __launch_bounds__(512, (D <= 4 ? 2 : 1)) k2a(MoeArgs a) {
  MOXIE_PDL_INSIDE();
  MOXIE_PF(moe2_pf(a));
  moe_stage2a<D, EW>(a);
}
// The repository's default stage 2 (moe2lw) as compiled there.
__global__ void __launch_bounds__(512, 2) k2repow(MoeArgs a) {
  MOXIE_PDL_INSIDE();
  MOXIE_PF(moe2_pf(a));
  moe_stage2l<1, 1, 0, false, LEAN2_WARPS, 1, false, false, true>(a);
}

// ---------------------------------------------------------------------------
// Session 19: the MoE as one persistent work queue, with its math (after
// scripts/read-mb/queue.cu's bytes-only read): kfused2. Blocks of 4 warps
// (moe1lx's) take items from an atomic counter, asking for the next index
// while the current item runs: first the 896 stage-1 tiles in moe1lx's
// block order (moe_stage1l, the tile index passed), each then adding one to
// its expert's ready count (release); then the stage-2 items, 32 rows of
// one expert (the shared expert's first, then the routed experts'; warps
// 0-1 the first 16 rows, 2-3 the next, 8 routed units or 16 shared spans a
// warp), whose routed weights' first two chunks go out before the
// ready-count wait (acquire; lean_ring_walk_early), h after it, summing
// moe2l's arithmetic into part[k][rows]; the last item of a 32-row group
// (a ticket) adds the K+1 partials in expert order into out. ctr: [0]
// items, [1 + k] expert k's ready tiles (the shared one at K), [16 + rg]
// row group rg's ticket; next: the next step's, zeroed here. (Session 19's
// first cut, kfused, one item at a time with 16-row stage-2 items, ran
// 60.2 us against this one's 74.6-90.5 and the pair's 41; it was dropped
// from the harness in session 20.)
template <int DEC>
__device__ __forceinline__ void moe_fused2_s2(const MoeArgs &a, int k, int rg, u32 *ctr, float *part) {
  __shared__ float red2[LEAN1_WARPS][8][2];
  __shared__ int last;
  extern __shared__ uint4 moe_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int r0 = rg * 32 + 16 * (warp >> 1);  // this warp's 16 rows
  const bool sh = k == a.K;
  const int K = a.K;
  const u32 need = (sh ? a.Is : a.I) >> 4;
  auto wait = [&] {
    if (threadIdx.x == 0) {
      u32 v;
      for (;;) {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(ctr + 1 + k) : "memory");
        if (v >= need) break;
        __nanosleep(20);
      }
    }
    __syncthreads();
  };
  u16 *slots = reinterpret_cast<u16 *>(moe_smem) + warp * 512;
  float acc[4] = {0.f, 0.f, 0.f, 0.f}, accS[1][4] = {{0.f, 0.f, 0.f, 0.f}};
  if (!sh) {
    const int id = __ldg(a.ids + k);
    const u8 *Wk = a.t2[id].W, *Sk = a.t2[id].S;
    const int gpe = a.I >> 7, half = gpe >> 1;
    const int q0 = (warp & 1) * half, q1 = q0 + half;
    const long long rb = a.I >> 1, sb = a.I >> 5;
    const bool blR = (g >> 1) == t;
    using Ch = Lean2Fp4<1>;
    lean_ring_walk_early<Ch>(
        q0, q1, 1,
        [&](Ch &c, int q, int slot, int what) {
          if (what & 1)
#pragma unroll
            for (int r = 0; r < 2; r++) {
              c.w[0][r] = ldw(reinterpret_cast<const uint4 *>(Wk + (r0 + g + 8 * r) * rb) + 4 * q + t);
              c.sc[0][r] = __ldg(Sk + (r0 + g + 8 * r) * sb + 4 * q + t);
            }
          if (what & 2) {
            const u16 *src = a.h + (long long)k * 2 * a.I + (lane >> 4) * a.I + 128 * q + 8 * (lane & 15);
            cp_async16(slots + slot * 256 + (lane >> 4) * 128 + 8 * (lane & 15), src);
          }
        },
        [&](const Ch &c, int q, int slot) {
          lean_group<DEC>(c.w[0][0], c.w[0][1], __int_as_float(c.sc[0][0] << 23), __int_as_float(c.sc[0][1] << 23), slots + slot * 256 + (g & 1) * 128 + t * 32,
                          blR, acc);
        },
        wait);
    float accQ[1][4] = {{acc[0], acc[1], acc[2], acc[3]}};
    quad_sum<1>(accQ);
    if (t == 0) {
      const float post = MoeDec<DEC>::post();
      red2[warp][g][0] = fmaf(accQ[0][1], 1.f / 2048.f, accQ[0][0]) * post;
      red2[warp][g][1] = fmaf(accQ[0][3], 1.f / 2048.f, accQ[0][2]) * post;
    }
  } else {
    for (int i = threadIdx.x; i < 32 * (a.Is >> 7); i += blockDim.x) moe_prefetch(a.s2 + (long long)(rg * 32 + (i & 31)) * a.Is + 128 * (i >> 5));
    wait();
    const int S = a.Is >> 6, half = S >> 1;
    const int sa = (warp & 1) * half, send = sa + half;
    const u8 *pw[1] = {a.s2 + (long long)(r0 + g) * a.Is + 16 * t};
    const u8 *ps[1] = {a.c2 + (long long)(r0 >> a.bshift) * (a.Is >> a.bshift)};
    const u16 *hs = a.h + (long long)K * 2 * a.I;
    const bool bs = g < 2;
    using Ch = LeanFp8<1, 1>;
    lean_ring_walk<Ch>(
        sa, send, 1,
        [&](Ch &c, int s, int slot) {
          c.template load<true>(pw, 8LL * a.Is, ps, a.bshift, s, send);
          if (lane < 16) {
            const int hl = lane >> 3, off = 8 * (lane & 7);
            if (s < send) cp_async16(slots + slot * 256 + hl * 64 + off, hs + hl * a.Is + 64 * s + off);
          }
        },
        [&](const Ch &c, int s, int slot) {
          const u16 *xb = slots + slot * 256 + (g & 1) * 64 - s * 64;
          c.template compute<true>(xb, bs, s, send, t, accS);
        });
    if (t == 0) {
      red2[warp][g][0] = fmaf(accS[0][1], 1.f / 2048.f, accS[0][0]);
      red2[warp][g][1] = fmaf(accS[0][3], 1.f / 2048.f, accS[0][2]);
    }
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const int T = threadIdx.x >> 4, i = threadIdx.x & 15;
    const float v = red2[2 * T][i & 7][i >> 3] + red2[2 * T + 1][i & 7][i >> 3];
    part[(long long)k * a.D + rg * 32 + threadIdx.x] = v;
    __threadfence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const bool l = atomicAdd(ctr + 16 + rg, 1u) == (u32)K;
    if (l) atomicExch(ctr + 16 + rg, 0u);
    last = l;
  }
  __syncthreads();
  if (last && threadIdx.x < 32) {
    __threadfence();
    float v = 0.f;
    for (int kk = 0; kk <= K; kk++) v += __ldcg(part + (long long)kk * a.D + rg * 32 + threadIdx.x);
    a.out[rg * 32 + threadIdx.x] = v;
  }
  __syncthreads();
}

template <int DEC>
__global__ void __launch_bounds__(128, 6) kfused2(MoeArgs a, u32 *ctr, u32 *next, float *part) {
  MOXIE_PDL();
  __shared__ int item;
  const int nsh = a.Is >> 4, n1 = nsh + a.K * (a.I >> 4), rgs = a.D >> 5, n2 = (a.K + 1) * rgs;
  if (blockIdx.x == 0)
    for (int i = threadIdx.x; i < 16 + rgs; i += blockDim.x) next[i] = 0u;
  if (threadIdx.x == 0) item = atomicAdd(ctr, 1u);
  __syncthreads();
  int cur = item;
  __syncthreads();
  while (cur < n1 + n2) {
    u32 nxt = 0;
    if (threadIdx.x == 0) nxt = atomicAdd(ctr, 1u);  // the next item, while this one runs
    if (cur < n1) {
      moe_stage1l<DEC, false>(a, cur);
      __syncthreads();
      if (threadIdx.x == 0) {
        const int k = cur < nsh ? a.K : (cur - nsh) / (a.I >> 4);
        __threadfence();
        asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(ctr + 1 + k), "r"(1u) : "memory");
      }
    } else {
      const int j = cur - n1, kk = j / rgs, rg = j - kk * rgs;
      moe_fused2_s2<DEC>(a, kk == 0 ? a.K : kk - 1, rg, ctr, part);
    }
    if (threadIdx.x == 0) item = (int)nxt;
    __syncthreads();
    cur = item;
    __syncthreads();
  }
}
// A plain read of n uint4 from p (grid-stride), folded into out.
__global__ void __launch_bounds__(512, 2) pread(const uint4 *p, long long n, u32 *out) {
  MOXIE_PDL();
  u32 f = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    uint4 v = ldw(p + i);
    f ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (f == 0x12345678u) out[0] = f;
}

// Stage 1's routed tiles read without math (session 16): how the lane
// mapping of the weight loads shapes the read. moe1lx's grid and blocks
// (the shared tiles' blocks return at once); each of a block's 4 warps
// reads 8 KB of its tile's w1 rows and 8 KB of its w3 rows (16 rows of 2
// KB, one contiguous 32 KB block each) in 32 loads of 16 bytes a lane,
// DEPTH loads in flight, folded by XOR. MODE 0: moe1lx's mapping (lane (g,
// t) reads rows g and g + 8 at byte 64q + 16t of the warp's 512-byte
// column band: a load is 8 rows × 64 bytes); MODE 1: a load is 512
// contiguous bytes of one row (the warp takes rows 4w .. 4w + 3 whole).
template <int MODE, int DEPTH>
__global__ void __launch_bounds__(128, 7) k1read(MoeArgs a) {
  const int nsh = a.Is >> 4;
  MOXIE_PDL_UNLESS((int)blockIdx.x < nsh);
  if ((int)blockIdx.x < nsh) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x - nsh, tpe = a.I >> 4;
  const int k = tile / tpe, r0 = (tile - k * tpe) * 16;
  const LinRec *r1 = a.t13 + 2 * __ldg(a.ids + k);
  const long long rb = a.D >> 1;
  const u8 *m0 = r1[0].W + r0 * rb, *m1 = r1[1].W + r0 * rb;
  auto addr = [&](int i) -> const uint4 * {
    if (MODE == 0) {
      const int q = i >> 2, m = (i >> 1) & 1, r = i & 1;
      return reinterpret_cast<const uint4 *>((m ? m1 : m0) + (g + 8 * r) * rb + 512 * warp + 64 * q + 16 * t);
    }
    const int m = i & 1, j = i >> 1;
    return reinterpret_cast<const uint4 *>((m ? m1 : m0) + (4 * warp + (j >> 2)) * rb + 512 * (j & 3) + 16 * lane);
  };
  uint4 v[DEPTH];
#pragma unroll
  for (int i = 0; i < DEPTH; i++) v[i] = ldw(addr(i));
  u32 f = 0;
#pragma unroll
  for (int i = 0; i < 32; i++) {
    const uint4 w = v[i % DEPTH];
    f ^= w.x ^ w.y ^ w.z ^ w.w;
    if (i + DEPTH < 32) v[i % DEPTH] = ldw(addr(i + DEPTH));
  }
  if (f == 0x12345678u) a.out[0] = (float)f;
}

// Stage 1's bytes read by bulk copies (TMA, cp.async.bulk; session 16):
// the question is how fast a stage 1 fed through shared memory by the copy
// engine could read, against moe1lx (s1 base) and the plain reads. A
// persistent grid (one block of 256 threads an SM) takes tiles b, b + G, …
// of stage 1's Is/16 shared tiles (w1 and w3 rows [16t, 16t + 16), FP8:
// 2 × 64 KB) and K·I/16 routed ones (expert ids[k]'s w1 and w3 rows: 2 ×
// 32 KB of E2M1 and 2 × 2 KB of scales), each cut into pieces of at most
// 16 KB. Thread 0 keeps NST pieces in flight in a ring of NST 16 KB
// stages (one mbarrier a stage, complete_tx); every thread folds its share
// of each arrived piece from shared memory (XOR), the block syncs, and the
// stage is refilled. No math: the read side of such a design only.
struct BulkPiece { const u8 *p; u32 bytes; };
__device__ __forceinline__ BulkPiece bulk_piece(const MoeArgs &a, int tile, int j, bool &more) {
  const int st = a.Is >> 4;
  if (tile < st) {  // 8 pieces: w1 then w3, four 16 KB pieces of 64 KB each
    const u8 *m = j < 4 ? a.s1 : a.s3;
    more = j < 7;
    return {m + (long long)tile * 16 * a.D + (j & 3) * 16384, 16384};
  }
  const int t = tile - st, per = a.I >> 4, k = t / per, r = t % per;
  const LinRec &rec = a.t13[2 * a.ids[k] + (j >= 3)];
  const int q = j % 3;  // two 16 KB pieces of the 32 KB rows, then the 2 KB of scales
  more = j < 5;
  if (q < 2) return {rec.W + (long long)r * 16 * (a.D / 2) + q * 16384, 16384};
  return {rec.S + (long long)r * 16 * (a.D / 32), (u32)(16 * (a.D / 32))};
}
template <int NST>
__global__ void __launch_bounds__(256, 1) k1bulk(MoeArgs a) {
  extern __shared__ __align__(128) uint4 ring[];  // [NST][1024]
  __shared__ __align__(8) unsigned long long bar[NST];
  MOXIE_PDL();
  const int tid = threadIdx.x, tiles = (a.Is >> 4) + a.K * (a.I >> 4);
  if (tid == 0) {
    for (int i = 0; i < NST; i++) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"((u32)__cvta_generic_to_shared(&bar[i])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  // The producer's cursor (thread 0): tile, piece.
  int pt = blockIdx.x, pj = 0;
  auto issue = [&](int slot) {
    if (pt >= tiles) return;
    bool more;
    const BulkPiece pc = bulk_piece(a, pt, pj, more);
    const u32 b = (u32)__cvta_generic_to_shared(&bar[slot]), d = (u32)__cvta_generic_to_shared(ring + slot * 1024);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the stage's generic reads before the copy's writes
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(pc.bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(d), "l"(pc.p), "r"(pc.bytes), "r"(b)
                 : "memory");
    if (more) pj++;
    else { pj = 0; pt += gridDim.x; }
  };
  if (tid == 0)
    for (int i = 0; i < NST; i++) issue(i);
  // The consumers' cursor (every thread): the same walk.
  int ct = blockIdx.x, cj = 0;
  u32 f = 0;
  for (int n = 0; ct < tiles; n++) {
    const int slot = n % NST;
    const u32 b = (u32)__cvta_generic_to_shared(&bar[slot]), par = (n / NST) & 1;
    u32 done = 0;
    while (!done)
      asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }" : "=r"(done) : "r"(b), "r"(par) : "memory");
    bool more;
    const BulkPiece pc = bulk_piece(a, ct, cj, more);
    for (u32 i = tid; i < pc.bytes / 16; i += 256) {
      const uint4 v = ring[slot * 1024 + i];
      f ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (more) cj++;
    else { cj = 0; ct += gridDim.x; }
    __syncthreads();
    if (tid == 0) issue(slot);
  }
  if (f == 0x12345678u) a.out[0] = (float)f;
}

static void *dalloc(size_t n, int fill) {
  void *p;
  CK(cudaMalloc(&p, n));
  if (fill >= 0) CK(cudaMemset(p, fill, n));
  return p;
}
static void drand(void *p, size_t n, unsigned seed, unsigned mask) {
  std::vector<unsigned> h((n + 3) / 4);
  unsigned s = seed * 2654435761u + 1;
  for (auto &v : h) {
    s ^= s << 13; s ^= s >> 17; s ^= s << 5;
    v = s & mask;
  }
  CK(cudaMemcpy(p, h.data(), n, cudaMemcpyHostToDevice));
}

struct Launch {
  const void *fn;
  dim3 grid, block;
  size_t smem;
  void *arg;  // pointer to the kernel's argument(s)
  bool pread;
};

int main(int argc, char **argv) {
  const int D = 4096, I = 2048, Is = 2048, K = 6, E = 64, NS = 8, REP = 16;
  std::vector<LinRec> t13(2 * E), t2(E);
  for (int e = 0; e < E; e++) {
    for (int m = 0; m < 2; m++) {
      LinRec &r = t13[2 * e + m];
      memset(&r, 0, sizeof r);
      r.W = (const u8 *)dalloc((size_t)I * D / 2, -1);
      r.S = (const u8 *)dalloc((size_t)I * D / 32, 125);
      drand((void *)r.W, (size_t)I * D / 2, 2 * e + m + 1, 0x77777777u);
    }
    LinRec &r = t2[e];
    memset(&r, 0, sizeof r);
    r.W = (const u8 *)dalloc((size_t)D * I / 2, -1);
    r.S = (const u8 *)dalloc((size_t)D * I / 32, 125);
    drand((void *)r.W, (size_t)D * I / 2, 1000 + e, 0x77777777u);
  }
  LinRec *dt13 = (LinRec *)dalloc(sizeof(LinRec) * 2 * E, -1), *dt2 = (LinRec *)dalloc(sizeof(LinRec) * E, -1);
  CK(cudaMemcpy(dt13, t13.data(), sizeof(LinRec) * 2 * E, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dt2, t2.data(), sizeof(LinRec) * E, cudaMemcpyHostToDevice));
  std::vector<u8 *> s1(NS), s3(NS), s2(NS), c1(NS), c3(NS), c2(NS);
  for (int i = 0; i < NS; i++) {
    s1[i] = (u8 *)dalloc((size_t)Is * D, -1); drand(s1[i], (size_t)Is * D, 5000 + i, 0x37373737u);
    s3[i] = (u8 *)dalloc((size_t)Is * D, -1); drand(s3[i], (size_t)Is * D, 6000 + i, 0x37373737u);
    s2[i] = (u8 *)dalloc((size_t)Is * D, -1); drand(s2[i], (size_t)Is * D, 7000 + i, 0x37373737u);
    c1[i] = (u8 *)dalloc((size_t)(Is / 128) * (D / 128), 120);
    c3[i] = (u8 *)dalloc((size_t)(Is / 128) * (D / 128), 120);
    c2[i] = (u8 *)dalloc((size_t)(Is / 128) * (D / 128), 120);
  }
  int *ids = (int *)dalloc(sizeof(int) * K * REP, -1);
  {
    std::vector<int> h(K * REP);
    for (int r = 0; r < REP; r++)
      for (int k = 0; k < K; k++) h[r * K + k] = (r * K + k) % E;
    CK(cudaMemcpy(ids, h.data(), sizeof(int) * K * REP, cudaMemcpyHostToDevice));
  }
  float *x = (float *)dalloc(sizeof(float) * D, 0);
  drand(x, sizeof(float) * D, 77, 0x3DFFFFFFu);  // session 19: a real x, so that the fused kernel's check compares non-zero h
  u16 *h = (u16 *)dalloc(sizeof(u16) * (K + 1) * 2 * I, 0);
  drand(h, sizeof(u16) * (K + 1) * 2 * I, 99, 0x3BFF3BFFu);
  float *out = (float *)dalloc(sizeof(float) * D, 0);
  std::vector<LinRec *> rt13(REP), rt2(REP);
  for (int r = 0; r < REP; r++) {
    rt13[r] = (LinRec *)dalloc(sizeof(LinRec) * 2 * E, -1);
    rt2[r] = (LinRec *)dalloc(sizeof(LinRec) * E, -1);
    CK(cudaMemcpy(rt13[r], t13.data(), sizeof(LinRec) * 2 * E, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(rt2[r], t2.data(), sizeof(LinRec) * E, cudaMemcpyHostToDevice));
  }
  std::vector<MoeArgs> args(REP);
  for (int r = 0; r < REP; r++) {
    MoeArgs &a = args[r];
    memset(&a, 0, sizeof a);
    a.t13 = getenv("HOTREC") ? dt13 : rt13[r]; a.t2 = getenv("HOTREC") ? dt2 : rt2[r]; a.ids = ids + r * K; a.rw = nullptr; a.x = x; a.h = h; a.out = out;
    a.s1 = s1[r % NS]; a.s3 = s3[r % NS]; a.s2 = s2[r % NS]; a.c1 = c1[r % NS]; a.c3 = c3[r % NS]; a.c2 = c2[r % NS];
    a.E = E; a.K = K; a.D = D; a.I = I; a.Is = Is; a.bshift = 7; a.limit = 10.f;
  }
  // Plain-read buffers: 16 disjoint regions of 35.2 MB and of 70.5 MB.
  const long long n2 = (35LL << 20) / 16, n1 = (70LL << 20) / 16;
  uint4 *rb2 = (uint4 *)dalloc((size_t)n2 * 16 * REP, 1), *rb1 = (uint4 *)dalloc((size_t)n1 * 16 * REP, 1);
  u32 *sink = (u32 *)dalloc(64, 0);
  struct PR { const uint4 *p; long long n; u32 *o; };
  std::vector<PR> pr2(REP), pr1(REP);
  for (int r = 0; r < REP; r++) { pr2[r] = {rb2 + r * n2, n2, sink}; pr1[r] = {rb1 + r * n1, n1, sink}; }

  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  u32 *fctr = (u32 *)dalloc(sizeof(u32) * REP * 272, 0);
  float *fpart = (float *)dalloc(sizeof(float) * (K + 1) * D, 0);
  std::vector<u32 *> fctrs(REP), fnext(REP);
  for (int r = 0; r < REP; r++) { fctrs[r] = fctr + r * 272; fnext[r] = fctr + ((r + 1) % REP) * 272; }
  const int smem1 = 4 * (4 * std::max((D / 128 + 3) / 4 * 128, (D / 64 + 3) / 4 * 64) + 128 * ((D / 128 + 3) / 4));
  // S1PAD: bytes of dynamic shared memory added to k1's timed launches (to
  // hold it to fewer blocks an SM at a larger carveout).
  const int s1pad = getenv("S1PAD") ? atoi(getenv("S1PAD")) : 0;
  CK(cudaFuncSetAttribute((const void *)k1<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem1 + s1pad));
  CK(cudaFuncSetAttribute((const void *)k1<9>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem1));
  CK(cudaFuncSetAttribute((const void *)k1h<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem1));
  const void *k1ks[] = {(const void *)k1k<0>, (const void *)k1k<1>, (const void *)k1k<2>, (const void *)k1k<4>, (const void *)k1k<8>,
                        (const void *)k1k<9>, (const void *)k1k<11>, (const void *)k1k<15>, (const void *)k1k<16>, (const void *)k1k<32>,
                        (const void *)k1k<27>, (const void *)k1k<40>};
  for (const void *f : k1ks) CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem1));
  const int smem2s = 16 * ((K * (I >> 7) + (Is >> 6) + 15) / 16) * 512;
  CK(cudaFuncSetAttribute((const void *)k2s, cudaFuncAttributeMaxDynamicSharedMemorySize, smem2s));
  const dim3 g1((Is >> 4) + K * (I >> 4)), b1(128), g2(D / 16), b2(512), gp(2 * sms), bp(512);
  if (const char *cv = getenv("CARVE"); cv && *cv) {  // the stage-1 kernels' preferred shared-memory carveout, percent of the most
    const int pc = atoi(cv);
    const void *fs[] = {(const void *)k1<0>, (const void *)k1<9>, (const void *)k1k<0>, (const void *)k1k<27>, (const void *)k1read<0, 8>};
    for (const void *f : fs) CK(cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, pc));
    printf("carveout %d%%\n", pc);
  }
  CK(cudaFuncSetAttribute((const void *)k1read<0, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem1));
  CK(cudaFuncSetAttribute((const void *)k1bulk<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * 16384));
  CK(cudaFuncSetAttribute((const void *)k1bulk<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * 16384));
  CK(cudaFuncSetAttribute((const void *)k1bulk<12>, cudaFuncAttributeMaxDynamicSharedMemorySize, 12 * 16384));
  CK(cudaFuncSetAttribute((const void *)kfused2<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem1));
  if (const char *cv = getenv("CARVE"); cv && *cv) CK(cudaFuncSetAttribute((const void *)kfused2<0>, cudaFuncAttributePreferredSharedMemoryCarveout, atoi(cv)));
  int focc2 = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&focc2, kfused2<0>, 128, smem1));
  printf("fused queue kernel 2: %d blocks an SM\n", focc2);
  const void *k2as[] = {(const void *)k2a<2, false>, (const void *)k2a<3, false>, (const void *)k2a<4, false>, (const void *)k2a<6, false>,
                        (const void *)k2a<4, true>, (const void *)k2a<6, true>, (const void *)k2a<8, true>, (const void *)k2a<2, true>,
                        (const void *)k2a<3, true>};
  const int k2ad[] = {2, 3, 4, 6, 4, 6, 8, 2, 3};
  for (int i = 0; i < 9; i++) {
    CK(cudaFuncSetAttribute(k2as[i], cudaFuncAttributeMaxDynamicSharedMemorySize, LEAN2_WARPS * k2ad[i] * K2A_SLOT));
    CK(cudaFuncSetAttribute(k2as[i], cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  }

  struct Seq { const char *name; std::vector<std::pair<const void *, int>> ks; };  // kernel, kind: 1 stage1, 2 stage2, 3 pread35, 4 pread70, 6 k1read, 7 k1read with stage 1's dynamic shared memory, 10 + NST k1bulk<NST>
  std::vector<Seq> seqs = {
      {"s2 repo (moe2l_g1_f1_d0_b2)", {{(const void *)k2repo, 2}}},
      {"s2 base (KO 0)", {{(const void *)k2<0, 0>, 2}}},
      {"s2 no decode (DEC 9)", {{(const void *)k2<0, 9>, 2}}},
      {"s2 no h copies (KO 1)", {{(const void *)k2<1, 0>, 2}}},
      {"s2 no decode/mma (KO 2)", {{(const void *)k2<2, 0>, 2}}},
      {"s2 no h, no math (KO 3)", {{(const void *)k2<3, 0>, 2}}},
      {"s2 contiguous B (KO 32)", {{(const void *)k2<32, 0>, 2}}},
      {"s2 contiguous B, no ids (KO 36)", {{(const void *)k2<36, 0>, 2}}},
      {"s2 contiguous B, no decode (KO 32 DEC 9)", {{(const void *)k2<32, 9>, 2}}},
      {"s2 no L2 hints (KO 64)", {{(const void *)k2<64, 0>, 2}}},
      {"s2 prologue before wait (KO 128)", {{(const void *)k2<128, 0>, 2}}},
      {"s2 + first weights before wait (KO 384)", {{(const void *)k2<384, 0>, 2}}},
      {"s2 KO 384, no hints (KO 448)", {{(const void *)k2<448, 0>, 2}}},
      {"s2 KO 128, no hints (KO 192)", {{(const void *)k2<192, 0>, 2}}},
      {"pair s1 + KO 128", {{(const void *)k1<0>, 1}, {(const void *)k2<128, 0>, 2}}},
      {"pair s1 + KO 384", {{(const void *)k1<0>, 1}, {(const void *)k2<384, 0>, 2}}},
      {"pair s1 + KO 448", {{(const void *)k1<0>, 1}, {(const void *)k2<448, 0>, 2}}},
      {"pair s1 + KO 64", {{(const void *)k1<0>, 1}, {(const void *)k2<64, 0>, 2}}},
      {"pair s1 + KO 0", {{(const void *)k1<0>, 1}, {(const void *)k2<0, 0>, 2}}},
      {"s2 magic division (KO 512)", {{(const void *)k2<512, 0>, 2}}},
      {"s2 h staged once a warp (k2s)", {{(const void *)k2s, 5}}},
      {"pair s1 + k2s", {{(const void *)k1<0>, 1}, {(const void *)k2s, 5}}},
      {"pair s1 + k2repo", {{(const void *)k1<0>, 1}, {(const void *)k2repo, 2}}},
      {"pair s1 + KO 896", {{(const void *)k1<0>, 1}, {(const void *)k2<896, 0>, 2}}},
      {"pair s1h + KO 896", {{(const void *)k1h<0>, 1}, {(const void *)k2<896, 0>, 2}}},
      {"pair s1h + repo", {{(const void *)k1h<0>, 1}, {(const void *)k2repo, 2}}},
      {"s1h (record hints)", {{(const void *)k1h<0>, 1}}},
      {"s2 no ids load (KO 4)", {{(const void *)k2<4, 0>, 2}}},
      {"s2 no h/math/ids (KO 7)", {{(const void *)k2<7, 0>, 2}}},
      {"s2 routed only (KO 16)", {{(const void *)k2<16, 0>, 2}}},
      {"s2 routed only, no math (KO 18)", {{(const void *)k2<18, 0>, 2}}},
      {"pread 35 MB", {{(const void *)pread, 3}}},
      {"s1 base (moe1lx_d0_b7)", {{(const void *)k1<0>, 1}}},
      {"s1 copy (KO1 0)", {{(const void *)k1k<0>, 1}}},
      {"s1 no x staging (KO1 1)", {{(const void *)k1k<1>, 1}}},
      {"s1 no scale staging (KO1 2)", {{(const void *)k1k<2>, 1}}},
      {"s1 no ids (KO1 4)", {{(const void *)k1k<4>, 1}}},
      {"s1 no math (KO1 8)", {{(const void *)k1k<8>, 1}}},
      {"s1 no x, no math (KO1 9)", {{(const void *)k1k<9>, 1}}},
      {"s1 no x/scales/math (KO1 11)", {{(const void *)k1k<11>, 1}}},
      {"s1 no x/scales/ids/math (KO1 15)", {{(const void *)k1k<15>, 1}}},
      {"s1 routed only (KO1 16)", {{(const void *)k1k<16>, 1}}},
      {"s1 shared only (KO1 32)", {{(const void *)k1k<32>, 1}}},
      {"s1 routed only, no x/scales/math (KO1 27)", {{(const void *)k1k<27>, 1}}},
      {"s1 shared only, no math (KO1 40)", {{(const void *)k1k<40>, 1}}},
      {"s1 no decode (DEC 9)", {{(const void *)k1<9>, 1}}},
      {"pread 70 MB", {{(const void *)pread, 4}}},
      {"s1 routed read, moe1lx mapping, 8 in flight", {{(const void *)k1read<0, 8>, 6}}},
      {"s1 routed read, row-contiguous, 8 in flight", {{(const void *)k1read<1, 8>, 6}}},
      {"s1 routed read, moe1lx mapping, 16 in flight", {{(const void *)k1read<0, 16>, 6}}},
      {"s1 routed read, row-contiguous, 16 in flight", {{(const void *)k1read<1, 16>, 6}}},
      {"s1 routed read, moe1lx mapping, 4 in flight", {{(const void *)k1read<0, 4>, 6}}},
      {"s1 routed read, moe1lx mapping, 8 in flight, moe1lx's shared memory", {{(const void *)k1read<0, 8>, 7}}},
      {"s1 routed read, row-contiguous, 4 in flight", {{(const void *)k1read<1, 4>, 6}}},
      {"s1 bytes by bulk copies, 4 stages", {{(const void *)k1bulk<4>, 14}}},
      {"s1 bytes by bulk copies, 8 stages", {{(const void *)k1bulk<8>, 18}}},
      {"s1 bytes by bulk copies, 12 stages", {{(const void *)k1bulk<12>, 22}}},
      {"pair s1+s2 repo", {{(const void *)k1<0>, 1}, {(const void *)k2repo, 2}}},
      {"s2 repow (moe2lw)", {{(const void *)k2repow, 2}}},
      {"s2 async ring D2", {{(const void *)k2a<2, false>, 32}}},
      {"s2 async ring D3", {{(const void *)k2a<3, false>, 33}}},
      {"s2 async ring D4", {{(const void *)k2a<4, false>, 34}}},
      {"s2 async ring D6", {{(const void *)k2a<6, false>, 36}}},
      {"s2 async ring D4 EW", {{(const void *)k2a<4, true>, 34}}},
      {"s2 async ring D6 EW", {{(const void *)k2a<6, true>, 36}}},
      {"s2 async ring D8 EW", {{(const void *)k2a<8, true>, 38}}},
      {"pair s1+s2 repow", {{(const void *)k1<0>, 1}, {(const void *)k2repow, 2}}},
      {"pair s1+s2 async D4 EW", {{(const void *)k1<0>, 1}, {(const void *)k2a<4, true>, 34}}},
      {"pair s1+s2 async D6 EW", {{(const void *)k1<0>, 1}, {(const void *)k2a<6, true>, 36}}},
      {"fused2 queue, all blocks", {{(const void *)kfused2<0>, 42}}},
      {"fused2 queue, half the blocks", {{(const void *)kfused2<0>, 43}}},
      {"s2 async ring D2 EW", {{(const void *)k2a<2, true>, 32}}},
      {"s2 async ring D3 EW", {{(const void *)k2a<3, true>, 33}}},
      {"pair s1+s2 async D2 EW", {{(const void *)k1<0>, 1}, {(const void *)k2a<2, true>, 32}}},
      {"pair s1+s2 async D3 EW", {{(const void *)k1<0>, 1}, {(const void *)k2a<3, true>, 33}}},
  };
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  printf("sms %d smem1 %d\n", sms, smem1);
  {
    int o1 = 0, o2 = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o1, k1<0>, 128, smem1 + s1pad));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o2, k2repow, 512, 0));
    printf("k1 (K1_MINB %d, S1PAD %d): %d blocks an SM; k2repow: %d blocks an SM\n", K1_MINB, s1pad, o1, o2);
  }
  {  // the variants that must give the repository kernel's bits
    std::vector<float> ref(D), got(D);
    const void *fs[] = {(const void *)k2repo, (const void *)k2<0, 0>, (const void *)k2<32, 0>, (const void *)k2<4, 0>,
                        (const void *)k2<128, 0>, (const void *)k2<384, 0>, (const void *)k2<448, 0>, (const void *)k2<64, 0>, (const void *)k2<896, 0>};
    const char *nm[] = {"k2repo", "k2<0,0>", "k2<32,0>", "k2<4,0> (ids 0..5: run 0's)", "k2<128,0>", "k2<384,0>", "k2<448,0>", "k2<64,0>", "k2<896,0>"};
    for (int f = 0; f < 9; f++) {
      CK(cudaMemset(out, 0, sizeof(float) * D));
      void *kargs[1] = {&args[0]};
      CK(cudaLaunchKernel(fs[f], g2, b2, kargs, 0, st));
      CK(cudaStreamSynchronize(st));
      CK(cudaMemcpy(f == 0 ? ref.data() : got.data(), out, sizeof(float) * D, cudaMemcpyDeviceToHost));
      if (f == 0) { printf("check: out[0..3] %g %g %g %g\n", ref[0], ref[1], ref[2], ref[3]); continue; }
      int diff = 0;
      for (int i = 0; i < D; i++) diff += memcmp(&ref[i], &got[i], 4) != 0;
      printf("check: %s differs from k2repo in %d of %d outputs\n", nm[f], diff, D);
    }
    {
      CK(cudaMemset(out, 0, sizeof(float) * D));
      void *kargs[1] = {&args[0]};
      CK(cudaLaunchKernel((const void *)k2s, g2, b2, kargs, smem2s, st));
      CK(cudaStreamSynchronize(st));
      CK(cudaMemcpy(got.data(), out, sizeof(float) * D, cudaMemcpyDeviceToHost));
      int diff = 0;
      for (int i = 0; i < D; i++) diff += memcmp(&ref[i], &got[i], 4) != 0;
      printf("check: k2s differs from k2repo in %d of %d outputs\n", diff, D);
    }
    for (int f = 0; f < 9; f++) {  // session 19's async ring (k2a<D, EW>) and the repository's moe2lw
      CK(cudaMemset(out, 0, sizeof(float) * D));
      void *kargs[1] = {&args[0]};
      CK(cudaLaunchKernel(k2as[f], g2, b2, kargs, LEAN2_WARPS * k2ad[f] * K2A_SLOT, st));
      CK(cudaStreamSynchronize(st));
      CK(cudaMemcpy(got.data(), out, sizeof(float) * D, cudaMemcpyDeviceToHost));
      int diff = 0;
      for (int i = 0; i < D; i++) diff += memcmp(&ref[i], &got[i], 4) != 0;
      printf("check: k2a D%d%s differs from k2repo in %d of %d outputs\n", k2ad[f], f >= 4 ? " EW" : "", diff, D);
    }
    {
      CK(cudaMemset(out, 0, sizeof(float) * D));
      void *kargs[1] = {&args[0]};
      CK(cudaLaunchKernel((const void *)k2repow, g2, b2, kargs, 0, st));
      CK(cudaStreamSynchronize(st));
      CK(cudaMemcpy(got.data(), out, sizeof(float) * D, cudaMemcpyDeviceToHost));
      int diff = 0;
      for (int i = 0; i < D; i++) diff += memcmp(&ref[i], &got[i], 4) != 0;
      printf("check: k2repow differs from k2repo in %d of %d outputs\n", diff, D);
    }
    {  // session 19: stage 1 then moe2l against the fused queue, on h from a real x
      std::vector<float> r2(D), f2(D);
      void *ka[1] = {&args[0]};
      CK(cudaLaunchKernel((const void *)k1<0>, g1, b1, ka, smem1, st));
      CK(cudaLaunchKernel((const void *)k2repo, g2, b2, ka, 0, st));
      CK(cudaStreamSynchronize(st));
      CK(cudaMemcpy(r2.data(), out, sizeof(float) * D, cudaMemcpyDeviceToHost));
      for (int rep = 0; rep < 2; rep++) {
        CK(cudaMemset(fctr, 0, sizeof(u32) * REP * 272));
        CK(cudaMemset(out, 0, sizeof(float) * D));
        void *kf[4] = {&args[0], &fctrs[0], &fnext[0], &fpart};
        CK(cudaLaunchKernel((const void *)kfused2<0>, dim3(sms * focc2), dim3(128), kf, smem1, st));
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpy(f2.data(), out, sizeof(float) * D, cudaMemcpyDeviceToHost));
        int same = 0;
        double md = 0, mr = 0;
        for (int i = 0; i < D; i++) {
          same += memcmp(&r2[i], &f2[i], 4) == 0;
          md = std::max(md, (double)std::fabs(r2[i] - f2[i]));
          mr = std::max(mr, (double)std::fabs(r2[i]));
        }
        u32 c[8];
        CK(cudaMemcpy(c, fctr, sizeof c, cudaMemcpyDeviceToHost));
        printf("check: fused queue 2 (run %d) against stage 1 + k2repo: %d of %d bits equal, max |diff| %.3g of max |out| %.3g (out[0] %g / %g); items %u, ready %u %u %u %u %u %u %u\n",
               rep, same, D, md, mr, r2[0], f2[0], c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]);
      }
      CK(cudaMemset(fctr, 0, sizeof(u32) * REP * 272));  // the timed graphs start from zeroed counters
    }
  }
  const char *only = getenv("SEQ");  // run only the sequences whose name contains one of its '|'-separated parts
  for (auto &sq : seqs) {
    if (only && *only) {
      bool hit = false;
      for (const char *p = only; *p;) {
        const char *e = strchr(p, '|');
        const std::string part(p, e ? e - p : strlen(p));
        hit = hit || strstr(sq.name, part.c_str()) != nullptr;
        p = e ? e + 1 : p + strlen(p);
      }
      if (!hit) continue;
    }
    const std::vector<float> ts = graph_times_us(st, REP, [&] {
      for (int r = 0; r < REP; r++) {
        for (auto &kk : sq.ks) {
          struct {
            dim3 gridDim, blockDim;
            size_t dynamicSmemBytes = 0;
          } cfg;
          void *kargs[4];
          if (kk.second == 1) { cfg.gridDim = g1; cfg.blockDim = b1; cfg.dynamicSmemBytes = smem1 + s1pad; kargs[0] = &args[r]; }
          else if (kk.second == 2) { cfg.gridDim = g2; cfg.blockDim = b2; kargs[0] = &args[r]; }
          else if (kk.second == 5) { cfg.gridDim = g2; cfg.blockDim = b2; cfg.dynamicSmemBytes = smem2s; kargs[0] = &args[r]; }
          else if (kk.second == 6) { cfg.gridDim = g1; cfg.blockDim = b1; kargs[0] = &args[r]; }
          else if (kk.second == 7) { cfg.gridDim = g1; cfg.blockDim = b1; cfg.dynamicSmemBytes = smem1; kargs[0] = &args[r]; }
          else if (kk.second == 42 || kk.second == 43) {
            cfg.gridDim = dim3(sms * (kk.second == 42 ? focc2 : std::max(1, focc2 / 2))); cfg.blockDim = dim3(128); cfg.dynamicSmemBytes = smem1;
            kargs[0] = &args[r]; kargs[1] = &fctrs[r]; kargs[2] = &fnext[r]; kargs[3] = &fpart;
          }
          else if (kk.second >= 32) { cfg.gridDim = g2; cfg.blockDim = b2; cfg.dynamicSmemBytes = LEAN2_WARPS * (kk.second - 30) * K2A_SLOT; kargs[0] = &args[r]; }
          else if (kk.second >= 10) { cfg.gridDim = dim3(sms); cfg.blockDim = dim3(256); cfg.dynamicSmemBytes = (kk.second - 10) * 16384; kargs[0] = &args[r]; }
          else {
            PR &p = kk.second == 3 ? pr2[r] : pr1[r];
            cfg.gridDim = gp; cfg.blockDim = bp; kargs[0] = &p.p; kargs[1] = &p.n; kargs[2] = &p.o;
          }
          pdl_launch(st, kk.first, cfg.gridDim, cfg.blockDim, kargs, cfg.dynamicSmemBytes);
        }
      }
    });
    printf("%-36s median %7.2f us  min %7.2f  max %7.2f (per step of %zu kernel(s))\n", sq.name, ts[ts.size() / 2], ts[0], ts.back(), sq.ks.size());
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
