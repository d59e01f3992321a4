// Element-wise, normalisation, hyper-connection, attention, routing and top-k
// kernels of moxie's forward pass (the compute.Backend ops other than the
// linear products). Float32 math unless a comment says otherwise; every
// kernel's semantics are those of the same-named compute.Backend method (see
// compute/compute.go and the host implementation in compute/cpu). No headers:
// NVRTC needs none. All kernels are extern "C" so the host looks them up by
// name (compute/cuda/ops.go).
//@pdl

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define FULL 0xffffffffu

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
  return v;
}

// block_sum returns the sum of v over the block (blockDim.x a multiple of 32,
// at most 1024) to every thread. red must hold 32 floats; the call ends with
// a barrier, so red may be reused right after.
__device__ __forceinline__ float block_sum(float v, float *red) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();  // red may still be read by a previous call
  if (lane == 0) red[w] = v;
  __syncthreads();
  float s = 0.f;
  for (int i = 0; i < nw; i++) s += red[i];  // same order in every thread
  __syncthreads();
  return s;
}

__device__ __forceinline__ float sigmoidf_(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }

__device__ __forceinline__ float bf16f(u16 h) { return __uint_as_float((u32)h << 16); }

// ---------------------------------------------------------------------------
// RMSNorm: one block per row. y may alias x (every thread reads its elements
// before the reduction's barriers and writes only its own elements after).

extern "C" __global__ void rmsnorm(float *y, const float *x, const float *w, int dim, float eps) { MOXIE_PDL();
  __shared__ float red[32];
  const float *xr = x + (size_t)blockIdx.x * dim;
  float *yr = y + (size_t)blockIdx.x * dim;
  float ss = 0.f;
#pragma unroll 4
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = xr[i];
    ss += v * v;
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = xr[i] * inv;
    yr[i] = w ? w[i] * v : v;
  }
}

// ---------------------------------------------------------------------------
// Hyper-connection mixing (dsv4-flash.md §4.3), in two kernels that use the
// outputs as their scratch: the nm = (2+hc)·hc mix logits of a token map one
// to one onto its pre [hc], post [hc] and comb [hc·hc] slots.
//
// hc_dots<RB, TB>: block (row group, token group) computes the raw dot
// products Fn[r]·x[b] for RB rows × TB tokens (Fn F32, fmt 4, or BF16, fmt
// 3) and stores each in its slot. RB = TB = 1 for decode (nm·batch blocks),
// 8 × 8 for prefill batches (Fn and x each read once per tile).
//
// hc_finish: block per token: ρ = 1/sqrt(mean(x²) + normEps), m = ρ·dot,
// the sigmoids, and the Sinkhorn iterations in exactly the host's order
// (compute/cpu HCMix: row softmax + eps, one column pass, then iters−1 ×
// (row pass, column pass); every sum left to right from 0, eps added after
// each sum). With hc·hc <= 32 lane l of warp 0 holds comb[l / hc, l % hc]
// and gathers its row or column by shuffles in index order; larger hc runs
// on thread 0 over shared memory. head != 0: HCHeadPre (nm = hc, pre only).

#define HC_MAXNM 128

__device__ __forceinline__ float *hc_slot(float *pre, float *post, float *comb, int hc, int head, size_t b, int r) {
  if (r < hc) return pre + b * hc + r;
  if (r < 2 * hc) return post + b * hc + (r - hc);
  return comb + b * hc * hc + (r - 2 * hc);
}

template <int RB, int TB, int U>
__device__ __forceinline__ void hc_dots_body(float *pre, float *post, float *comb, const float *x, const void *fn, int fmt,
                                             int hc, int n, int nm, int batch, int head) {
  __shared__ float part[32][RB * TB];
  const int r0 = blockIdx.x * RB, b0 = blockIdx.y * TB;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  float acc[RB][TB];
#pragma unroll
  for (int j = 0; j < RB; j++)
#pragma unroll
    for (int t = 0; t < TB; t++) acc[j][t] = 0.f;
#pragma unroll U
  for (int c = threadIdx.x; c < n; c += blockDim.x) {  // U iterations' loads in flight together
    float fv[RB], xv[TB];
#pragma unroll
    for (int j = 0; j < RB; j++) {
      const int r = r0 + j;
      fv[j] = r >= nm ? 0.f
              : fmt == 3 ? bf16f(((const u16 *)fn)[(size_t)r * n + c])
                         : ((const float *)fn)[(size_t)r * n + c];
    }
#pragma unroll
    for (int t = 0; t < TB; t++) xv[t] = b0 + t < batch ? x[(size_t)(b0 + t) * n + c] : 0.f;
#pragma unroll
    for (int j = 0; j < RB; j++)
#pragma unroll
      for (int t = 0; t < TB; t++) acc[j][t] += fv[j] * xv[t];
  }
#pragma unroll
  for (int j = 0; j < RB; j++)
#pragma unroll
    for (int t = 0; t < TB; t++) {
      const float s = warp_sum(acc[j][t]);
      if (lane == 0) part[w][j * TB + t] = s;
    }
  __syncthreads();
  for (int q = threadIdx.x; q < RB * TB; q += blockDim.x) {
    const int r = r0 + q / TB, b = b0 + q % TB;
    if (r < nm && b < batch) {
      float s = 0.f;
      for (int i = 0; i < nw; i++) s += part[i][q];
      *hc_slot(pre, post, comb, hc, head, b, r) = s;
    }
  }
}

extern "C" __global__ void hc_dots_r1_t1(float *pre, float *post, float *comb, const float *x, const void *fn, int fmt,
                                         int hc, int n, int nm, int batch, int head) { MOXIE_PDL();
  hc_dots_body<1, 1, 8>(pre, post, comb, x, fn, fmt, hc, n, nm, batch, head);
}
extern "C" __global__ void hc_dots_r8_t8(float *pre, float *post, float *comb, const float *x, const void *fn, int fmt,
                                         int hc, int n, int nm, int batch, int head) { MOXIE_PDL();
  hc_dots_body<8, 8, 1>(pre, post, comb, x, fn, fmt, hc, n, nm, batch, head);
}

// hc_pre_gate is pre[j] from its raw dot product d and ρ:
// sigmoid(d·ρ·scale[0] + base[j]) + eps (hc_gates_sinkhorn's, shared with
// the fused kernels of kernels/fuse.cu so that they give the same bits).
__device__ __forceinline__ float hc_pre_gate(float d, float rho, const float *scale, const float *base, int j,
                                             float eps) {
  const float m = d * rho;
  return sigmoidf_(m * scale[0] + base[j]) + eps;
}

// hc_sinkhorn_warp<HC>: the Sinkhorn part of hc_gates_sinkhorn for a
// compile-time HC (HC·HC <= 32), run by the 32 lanes of one warp: lane l
// holds comb[l / HC, l % HC]; every gather of a row or column is HC
// independent shuffles issued together, then summed in index order.
template <int HC>
__device__ __forceinline__ void hc_sinkhorn_warp(float *cb, const float *dcomb, float rho, const float *base,
                                                 const float *scale, int its, float eps) {
  const int lane = threadIdx.x & 31;
  constexpr int HH = HC * HC;
  const bool own = lane < HH;
  const int j = lane / HC, k = lane % HC;
  const float L = own ? __fadd_rn(__fmul_rn(dcomb[lane] * rho, scale[2]), base[2 * HC + lane]) : 0.f;
  float g[HC];
#pragma unroll
  for (int kk = 0; kk < HC; kk++) g[kk] = __shfl_sync(FULL, L, j * HC + kk);
  float mx = -__int_as_float(0x7f800000);
#pragma unroll
  for (int kk = 0; kk < HC; kk++) mx = fmaxf(mx, g[kk]);
  const float e = (float)exp((double)(L - mx));
#pragma unroll
  for (int kk = 0; kk < HC; kk++) g[kk] = __shfl_sync(FULL, e, j * HC + kk);
  float s = 0.f;
#pragma unroll
  for (int kk = 0; kk < HC; kk++) s += g[kk];
  float v = e / s + eps;
  for (int it = 0; it < its; it++) {
    if (it > 0) {
#pragma unroll
      for (int kk = 0; kk < HC; kk++) g[kk] = __shfl_sync(FULL, v, j * HC + kk);
      s = 0.f;
#pragma unroll
      for (int kk = 0; kk < HC; kk++) s += g[kk];
      v = v / (s + eps);
    }
#pragma unroll
    for (int jj = 0; jj < HC; jj++) g[jj] = __shfl_sync(FULL, v, jj * HC + k);
    s = 0.f;
#pragma unroll
    for (int jj = 0; jj < HC; jj++) s += g[jj];
    v = v / (s + eps);
  }
  if (own) cb[lane] = v;
}

// hc_gates_sinkhorn is the per-token tail of hc_finish and hc_split_finish:
// from token b's raw dot products (dpre [hc], dpost [hc], dcomb [hc·hc]; they
// may alias the token's pre, post and comb slots, each value is read before
// its slot is written) and ρ, the sigmoids and the Sinkhorn iterations in the
// host's order (see hc_finish). Called by every thread of the block; cm is
// the block's [HC_MAXNM] shared scratch. With at least 64 threads the gates
// are warp 1's while warp 0 runs the Sinkhorn (hc = 4 unrolled:
// hc_sinkhorn_warp<4>); with 32 the warp does both in turn.
__device__ __forceinline__ void hc_gates_sinkhorn(float *pre, float *post, float *comb, const float *dpre,
                                                  const float *dpost, const float *dcomb, float rho,
                                                  const float *base, const float *scale, int hc, int iters,
                                                  float eps, int head, size_t b, float *cm) {
  const int gl = blockDim.x >= 64 ? (int)threadIdx.x - 32 : (int)threadIdx.x;  // gate lane
  if (gl >= 0 && gl < hc) {
    pre[b * hc + gl] = hc_pre_gate(dpre[gl], rho, scale, base, gl, eps);
    if (!head) {
      const float m2 = dpost[gl] * rho;
      post[b * hc + gl] = 2.0f * sigmoidf_(m2 * scale[1] + base[hc + gl]);
    }
  }
  if (head) return;
  const int its = iters < 1 ? 1 : iters;  // the host always makes the first column pass
  float *cb = comb + b * hc * hc;
  const int hh = hc * hc;
  if (hh <= 32) {
    if (threadIdx.x >= 32) return;
    if (hc == 4) {
      hc_sinkhorn_warp<4>(cb, dcomb, rho, base, scale, its, eps);
      return;
    }
    const int lane = threadIdx.x;
    const bool own = lane < hh;
    const int j = lane / hc, k = lane % hc;
    float L = own ? __fadd_rn(__fmul_rn(dcomb[lane] * rho, scale[2]), base[2 * hc + lane]) : 0.f;
    float mx = -__int_as_float(0x7f800000);
    for (int kk = 0; kk < hc; kk++) mx = fmaxf(mx, __shfl_sync(FULL, L, j * hc + kk));
    const float e = (float)exp((double)(L - mx));
    float s = 0.f;
    for (int kk = 0; kk < hc; kk++) s += __shfl_sync(FULL, e, j * hc + kk);
    float v = e / s + eps;
    for (int it = 0; it < its; it++) {
      if (it > 0) {
        s = 0.f;
        for (int kk = 0; kk < hc; kk++) s += __shfl_sync(FULL, v, j * hc + kk);
        v = v / (s + eps);
      }
      s = 0.f;
      for (int jj = 0; jj < hc; jj++) s += __shfl_sync(FULL, v, jj * hc + k);
      v = v / (s + eps);
    }
    if (own) cb[lane] = v;
    return;
  }
  if (threadIdx.x != 0) return;
  float *c = cm;
  for (int jk = 0; jk < hh; jk++) c[jk] = __fadd_rn(__fmul_rn(dcomb[jk] * rho, scale[2]), base[2 * hc + jk]);
  for (int j = 0; j < hc; j++) {
    float *row = c + j * hc;
    float mx = -__int_as_float(0x7f800000);
    for (int k = 0; k < hc; k++) mx = fmaxf(mx, row[k]);
    float s = 0.f;
    for (int k = 0; k < hc; k++) {
      row[k] = (float)exp((double)(row[k] - mx));
      s += row[k];
    }
    for (int k = 0; k < hc; k++) row[k] = row[k] / s + eps;
  }
  for (int it = 0; it < its; it++) {
    if (it > 0) {
      for (int j = 0; j < hc; j++) {
        float s = 0.f;
        for (int k = 0; k < hc; k++) s += c[j * hc + k];
        for (int k = 0; k < hc; k++) c[j * hc + k] /= s + eps;
      }
    }
    for (int k = 0; k < hc; k++) {
      float s = 0.f;
      for (int j = 0; j < hc; j++) s += c[j * hc + k];
      for (int j = 0; j < hc; j++) c[j * hc + k] /= s + eps;
    }
  }
  for (int jk = 0; jk < hh; jk++) cb[jk] = c[jk];
}

extern "C" __global__ void hc_finish(float *pre, float *post, float *comb, const float *x, const float *base,
                                     const float *scale, int hc, int n, int iters, float eps, float normEps, int head) { MOXIE_PDL();
  __shared__ float red[32];
  __shared__ float cm[HC_MAXNM];
  const size_t b = blockIdx.x;
  const float *xb = x + b * n;
  float ss = 0.f;
#pragma unroll 8
  for (int c = threadIdx.x; c < n; c += blockDim.x) {
    const float v = xb[c];
    ss += v * v;
  }
  ss = block_sum(ss, red);
  const float rho = 1.0f / sqrtf(ss / (float)n + normEps);
  hc_gates_sinkhorn(pre, post, comb, pre + b * hc, post + b * hc, comb + b * hc * hc, rho, base, scale, hc, iters, eps,
                    head, b, cm);
}

// ---------------------------------------------------------------------------
// Split-K hyper-connection mixing for small batches (opt-in, see ops.go
// hcMix): the same results as hc_dots + hc_finish up to the float32 order of
// the dot-product and Σx² sums, computed by many blocks instead of one per
// (row, token) and one per token.
//
// hc_split_dots: grid (ceil((nm+1)/rb), S, ceil(batch/HCS_TB)). Block
// (g, s, z) reduces the quads (4 floats) [s·cq, min((s+1)·cq, n/4)) for the
// "rows" r in [g·rb, min((g+1)·rb, nm+1)) and the tokens b in [z·HCS_TB,
// min((z+1)·HCS_TB, batch)): Σ Fn[r, c]·x[b, c] for r < nm, Σ x[b, c]² for
// r == nm, written to part[(b·(nm+1) + r)·S + s]. Each partial is summed in
// a fixed order that depends only on (n, cq, blockDim): each thread over its
// quads, then warp shuffles, then the warps in index order. No atomics: the
// same inputs give the same bits on every run, whatever the batch or rb.
// Needs rb <= HCS_RB, n % 4 == 0, x 16-byte aligned, Fn 16-byte (F32, fmt 4)
// or 8-byte (BF16, fmt 3) aligned, blockDim a multiple of 32 (at most 1024).
//
// hc_split_finish: block per token (blockDim a multiple of 32, at least 32;
// with 64 the gates run beside the Sinkhorn):
// sums the S (at most HCS_MAXS) partials of every row in index order, ρ = 1/sqrt(Σx²/n +
// normEps) from row nm, then hc_finish's own sigmoids and Sinkhorn
// iterations (hc_gates_sinkhorn), reading the dots from shared memory.

#define HCS_RB 8
#define HCS_TB 4
#define HCS_MAXS 64

__device__ __forceinline__ float dot4(float4 a, float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

// hc_x_plain is hc_split_dots_body's stream loader for streams read as
// they are: quad q of token b0 + t of x [batch, n].
struct hc_x_plain {
  const float4 *__restrict__ xq;  // x + b0·n
  int nq;            // n / 4
  __device__ __forceinline__ float4 operator()(int t, int q) const { return __ldg(xq + (size_t)t * nq + q); }
};

// hc_split_dots_body: hc_split_dots for Fn in BF16 (BF) or F32, with red the
// kernel's [HCS_RB·HCS_TB][32] shared scratch; xl(t, q) returns quad q of
// the tile's token t (hc_x_plain, or the fused expand of kernels/fuse.cu),
// called exactly once per (t < nt, q) by each block. Every load of a quad
// (the tile's x quads, then its Fn quads) is issued before the first
// product, so a thread waits for memory once per quad.
template <bool BF, class XL>
__device__ __forceinline__ void hc_split_dots_body(float *__restrict__ part, const XL &xl,
                                                   const void *__restrict__ fn, int n, int nm, int cq, int rb,
                                                   int batch, float (*red)[32]) {
  const int r0 = blockIdx.x * rb, s = blockIdx.y, S = gridDim.y, b0 = blockIdx.z * HCS_TB;
  const int nr = min(rb, nm + 1 - r0), nt = min(HCS_TB, batch - b0);
  const int nq = n >> 2;
  const int q0 = s * cq, q1 = min(q0 + cq, nq);
  float acc[HCS_RB][HCS_TB];
#pragma unroll
  for (int j = 0; j < HCS_RB; j++)
#pragma unroll
    for (int t = 0; t < HCS_TB; t++) acc[j][t] = 0.f;
  for (int q = q0 + threadIdx.x; q < q1; q += blockDim.x) {
    const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
    float4 xv[HCS_TB], f[HCS_RB];
#pragma unroll
    for (int t = 0; t < HCS_TB; t++) xv[t] = t < nt ? xl(t, q) : z;
#pragma unroll
    for (int j = 0; j < HCS_RB; j++) {
      const int r = r0 + j;
      f[j] = z;
      if (j < nr && r < nm) {
        if (BF) {
          const uint2 w = __ldg((const uint2 *)((const u16 *)fn + (size_t)r * n) + q);
          f[j] = make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u),
                             __uint_as_float(w.y << 16), __uint_as_float(w.y & 0xffff0000u));
        } else {
          f[j] = __ldg((const float4 *)((const float *)fn + (size_t)r * n) + q);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < HCS_RB; j++) {
      if (j < nr) {
        const bool sq = r0 + j == nm;  // the Σx² row
#pragma unroll
        for (int t = 0; t < HCS_TB; t++) acc[j][t] = dot4(sq ? xv[t] : f[j], xv[t], acc[j][t]);
      }
    }
  }
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
  for (int j = 0; j < HCS_RB; j++)
#pragma unroll
    for (int t = 0; t < HCS_TB; t++)
      if (j < nr && t < nt) {  // uniform over the block: the shuffles see full warps
        const float v = warp_sum(acc[j][t]);
        if (lane == 0) red[j * HCS_TB + t][w] = v;
      }
  __syncthreads();
  for (int i = threadIdx.x; i < HCS_RB * HCS_TB; i += blockDim.x) {
    const int j = i / HCS_TB, t = i % HCS_TB;
    if (j < nr && t < nt) {
      float v = 0.f;
      for (int k = 0; k < nw; k++) v += red[i][k];
      part[((size_t)(b0 + t) * (nm + 1) + r0 + j) * S + s] = v;
    }
  }
}

extern "C" __global__ void hc_split_dots(float *__restrict__ part, const float *__restrict__ x,
                                         const void *__restrict__ fn, int fmt, int n, int nm, int cq, int rb,
                                         int batch) { MOXIE_PDL();
  __shared__ float red[HCS_RB * HCS_TB][32];
  const hc_x_plain xl{(const float4 *)(x + (size_t)blockIdx.z * HCS_TB * n), n >> 2};
  if (fmt == 3)
    hc_split_dots_body<true>(part, xl, fn, n, nm, cq, rb, batch, red);
  else
    hc_split_dots_body<false>(part, xl, fn, n, nm, cq, rb, batch, red);
}

extern "C" __global__ void hc_split_finish(float *pre, float *post, float *comb, const float *__restrict__ part,
                                           const float *base, const float *scale, int hc, int n, int nm, int S,
                                           int iters, float eps, float normEps, int head) { MOXIE_PDL();
  __shared__ float dot[HC_MAXNM + 1];
  __shared__ float cm[HC_MAXNM];
  const size_t b = blockIdx.x;
  for (int r = threadIdx.x; r <= nm; r += blockDim.x) {
    const float *p = part + (b * (nm + 1) + r) * S;
    float v[HCS_MAXS];
#pragma unroll
    for (int i = 0; i < HCS_MAXS; i++) v[i] = i < S ? p[i] : 0.f;  // every load in flight at once
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < HCS_MAXS; i++)
      if (i < S) s += v[i];
    dot[r] = s;
  }
  __syncthreads();
  const float ss = dot[nm];
  const float rho = 1.0f / sqrtf(ss / (float)n + normEps);
  hc_gates_sinkhorn(pre, post, comb, dot, dot + hc, dot + 2 * hc, rho, base, scale, hc, iters, eps, head, b, cm);
}

// The collapse and the expand pin their float32 order with explicit
// intrinsics, so that the fused kernels of kernels/fuse.cu give the same bits:
// collapse y = fma(pre[hc−1], x[hc−1], … fma(pre[0], x[0], 0)); expand
// out[k] = fma(comb[hc−1, k], x[hc−1], … fma(comb[0, k], x[0], post[k]·o)).

// HCCollapse: y[b, i] = Σ_j pre[b, j]·x[b, j, i]; grid (ceil(dim/blockDim), batch).
extern "C" __global__ void hc_collapse(float *y, const float *x, const float *pre, int hc, int dim) { MOXIE_PDL();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const size_t b = blockIdx.y;
  if (i >= dim) return;
  float s = 0.f;
  for (int j = 0; j < hc; j++) s = __fmaf_rn(pre[b * hc + j], x[(b * hc + j) * dim + i], s);
  y[b * dim + i] = s;
}

// HCExpand: out[b, k, i] = post[b, k]·o[b, i] + Σ_j comb[b, j, k]·x[b, j, i];
// grid (ceil(dim/blockDim), batch).
extern "C" __global__ void hc_expand(float *out, const float *x, const float *o, const float *post, const float *comb,
                                     int hc, int dim) { MOXIE_PDL();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const size_t b = blockIdx.y;
  if (i >= dim) return;
  const float ov = o[b * dim + i];
  const float *c = comb + b * hc * hc;
  for (int k = 0; k < hc; k++) {
    float s = __fmul_rn(post[b * hc + k], ov);
    for (int j = 0; j < hc; j++) s = __fmaf_rn(c[j * hc + k], x[(b * hc + j) * dim + i], s);
    out[(b * hc + k) * dim + i] = s;
  }
}

// ---------------------------------------------------------------------------
// RoPE, in place: one thread per (row, segment, pair). The angle is formed in
// float32 (float(pos)·freq) and its cosine and sine taken in double, like the
// host backend, then the rotation is float32.
extern "C" __global__ void rope(float *x, const int *pos, const float *freq, int rows, int rowLen, int dim, int nfreq,
                                int inverse) { MOXIE_PDL();
  const int segs = rowLen / dim;
  const long long total = (long long)rows * segs * nfreq;
  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x) {
    const int p = (int)(t % nfreq);
    const long long rs = t / nfreq;
    const int seg = (int)(rs % segs);
    const long long row = rs / segs;
    float ang = __fmul_rn((float)pos[row], freq[p]);
    if (inverse) ang = -ang;
    double sd, cd;
    sincos((double)ang, &sd, &cd);
    const float c = (float)cd, s = (float)sd;
    float *e = x + row * rowLen + (long long)seg * dim + dim - 2 * nfreq + 2 * p;
    const float re = e[0], im = e[1];
    e[0] = re * c - im * s;
    e[1] = re * s + im * c;
  }
}

// ---------------------------------------------------------------------------
// Attention for one query token: one block per head, its warps splitting the
// keys; each warp runs an online softmax over its keys (lane l holds output
// dims l, l+32, …), then the warps' states are merged with the sink:
// M = max(max_i s_i, sink), o = Σ_i e^(s_i−M)·kv_i / (Σ_i e^(s_i−M) + e^(sink−M)).
// T = ceil(dim/32) values per lane (dim <= 32·T).

template <int T>
__device__ __forceinline__ void attention_body(float *o, const float *q, const float *kv, const float *sinks, int nKeys,
                                               int dim, float scale) {
  extern __shared__ float sm[];  // [nw] m, [nw] l, [nw][dim] acc
  const int h = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  float *oh = o + (size_t)h * dim;
  if (nKeys == 0) {
    for (int c = threadIdx.x; c < dim; c += blockDim.x) oh[c] = 0.f;
    return;
  }
  float qr[T], acc[T];
#pragma unroll
  for (int t = 0; t < T; t++) {
    const int c = lane + 32 * t;
    qr[t] = c < dim ? q[(size_t)h * dim + c] : 0.f;
    acc[t] = 0.f;
  }
  float mx = -__int_as_float(0x7f800000), l = 0.f;
  // Two keys per step (i and i + nw) so that their loads are in flight together.
  for (int i = w; i < nKeys; i += 2 * nw) {
    const int i2 = i + nw;
    const bool two = i2 < nKeys;
    const float *k = kv + (size_t)i * dim;
    const float *k2 = kv + (size_t)(two ? i2 : i) * dim;
    float kr[T], kr2[T];
    float d = 0.f, d2 = 0.f;
#pragma unroll
    for (int t = 0; t < T; t++) {
      const int c = lane + 32 * t;
      kr[t] = c < dim ? k[c] : 0.f;
      kr2[t] = c < dim ? k2[c] : 0.f;
    }
#pragma unroll
    for (int t = 0; t < T; t++) {
      d += qr[t] * kr[t];
      d2 += qr[t] * kr2[t];
    }
    const float s = warp_sum(d) * scale;
    const float s2 = two ? warp_sum(d2) * scale : -__int_as_float(0x7f800000);  // two is warp-uniform
    const float mn = fmaxf(mx, fmaxf(s, s2));
    const float a = mx == mn ? 1.f : expf(mx - mn);  // mx may be -inf
    const float p = expf(s - mn);
    const float p2 = two ? expf(s2 - mn) : 0.f;
    l = l * a + p + p2;
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = acc[t] * a + p * kr[t] + p2 * kr2[t];
    mx = mn;
  }
  float *ms = sm, *ls = sm + nw, *as = sm + 2 * nw;
  if (lane == 0) {
    ms[w] = mx;
    ls[w] = l;
  }
#pragma unroll
  for (int t = 0; t < T; t++) {
    const int c = lane + 32 * t;
    if (c < dim) as[w * dim + c] = acc[t];
  }
  __syncthreads();
  const float sink = sinks[h];
  float M = sink;
  for (int i = 0; i < nw; i++) M = fmaxf(M, ms[i]);
  float den = expf(sink - M);
  for (int i = 0; i < nw; i++)
    if (ls[i] > 0.f) den += ls[i] * expf(ms[i] - M);
  const float inv = 1.f / den;
  for (int c = threadIdx.x; c < dim; c += blockDim.x) {
    float s = 0.f;
    for (int i = 0; i < nw; i++)
      if (ls[i] > 0.f) s += as[i * dim + c] * expf(ms[i] - M);
    oh[c] = s * inv;
  }
}

extern "C" __global__ void attention4(float *o, const float *q, const float *kv, const float *sinks, int nKeys, int dim,
                                      float scale) { MOXIE_PDL();
  attention_body<4>(o, q, kv, sinks, nKeys, dim, scale);
}
extern "C" __global__ void attention16(float *o, const float *q, const float *kv, const float *sinks, int nKeys, int dim,
                                       float scale) { MOXIE_PDL();
  attention_body<16>(o, q, kv, sinks, nKeys, dim, scale);
}
extern "C" __global__ void attention32(float *o, const float *q, const float *kv, const float *sinks, int nKeys, int dim,
                                       float scale) { MOXIE_PDL();
  attention_body<32>(o, q, kv, sinks, nKeys, dim, scale);
}

// ---------------------------------------------------------------------------
// CompressPool: one thread per channel, softmax over the slots.
extern "C" __global__ void compress_pool(float *out, const float *kv, const float *z, int slots, int width) { MOXIE_PDL();
  const int ch = blockIdx.x * blockDim.x + threadIdx.x;
  if (ch >= width) return;
  float mx = -__int_as_float(0x7f800000);
  for (int s = 0; s < slots; s++) mx = fmaxf(mx, z[(size_t)s * width + ch]);
  float den = 0.f, num = 0.f;
  for (int s = 0; s < slots; s++) {
    const float e = expf(z[(size_t)s * width + ch] - mx);
    den += e;
    num += e * kv[(size_t)s * width + ch];
  }
  out[ch] = num / den;
}

// ---------------------------------------------------------------------------
// IndexScores: s[i] = Σ_h w[h]·ReLU(q[h]·keys[i]). A block takes a tile of
// IDX_KT keys into shared memory with q transposed (qT[c][h]); thread (key i,
// head h) forms one dot product, then one warp per key sums its heads
// (lane-strided, then a shuffle tree).
// Shared memory: (dim·heads + IDX_KT·dim + IDX_KT·heads) floats.
#define IDX_KT 16

extern "C" __global__ void index_scores(float *sc, const float *q, const float *w, const float *keys, int nKeys,
                                        int heads, int dim) { MOXIE_PDL();
  extern __shared__ float sm[];
  float *qT = sm, *kt = sm + dim * heads, *v = kt + IDX_KT * dim;
  for (int t = threadIdx.x; t < heads * dim; t += blockDim.x) {
    const int h = t / dim, c = t % dim;
    qT[c * heads + h] = q[t];
  }
  const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int i0 = blockIdx.x * IDX_KT; i0 < nKeys; i0 += gridDim.x * IDX_KT) {
    const int nk = min(IDX_KT, nKeys - i0);
    __syncthreads();
    for (int t = threadIdx.x; t < nk * dim; t += blockDim.x) kt[t] = keys[(size_t)i0 * dim + t];
    __syncthreads();
    for (int t = threadIdx.x; t < nk * heads; t += blockDim.x) {
      const int i = t / heads, h = t % heads;
      const float *k = kt + i * dim;
      float d = 0.f;
      for (int c = 0; c < dim; c++) d += qT[c * heads + h] * k[c];
      v[t] = d > 0.f ? w[h] * d : 0.f;
    }
    __syncthreads();
    for (int i = wp; i < nk; i += nw) {
      float s = 0.f;
      for (int h = lane; h < heads; h += 32) s += v[i * heads + h];
      s = warp_sum(s);
      if (lane == 0) sc[i0 + i] = s;
    }
  }
}

// index_scores_simple: one thread per key, for shapes whose q does not fit
// index_scores' shared memory.
extern "C" __global__ void index_scores_simple(float *sc, const float *q, const float *w, const float *keys, int nKeys,
                                               int heads, int dim) { MOXIE_PDL();
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < nKeys; i += (long long)gridDim.x * blockDim.x) {
    const float *k = keys + i * dim;
    float acc = 0.f;
    for (int h = 0; h < heads; h++) {
      float d = 0.f;
      for (int c = 0; c < dim; c++) d += q[(size_t)h * dim + c] * k[c];
      if (d > 0.f) acc += w[h] * d;
    }
    sc[i] = acc;
  }
}

// ---------------------------------------------------------------------------
// Ranking keys shared by TopK and Route: an order-preserving map of float32
// to uint32 (larger float → larger key; −0 == +0; NaN → 0, below −inf, whose
// key is 0x007fffff).
__device__ __forceinline__ u32 rank_key(float f) {
  if (f != f) return 0u;
  u32 b = __float_as_uint(f);
  if (b == 0x80000000u) b = 0u;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// TopK: one block of TOPK_THREADS threads. Radix select of the k-th largest
// key (digits of 11, 11 and 10 bits, shared-memory histograms), then an
// index-ordered collection of the k survivors (warps own contiguous ranges;
// ballots give in-order positions, so tied keys keep their lowest indices),
// then a bitonic sort of the survivors by (key desc, index asc).
#define TOPK_THREADS 1024
#define TOPK_MAXK 2048
#define TOPK_U 8  // loads in flight per thread in the passes over the scores

__device__ __forceinline__ u32 lanemask_lt() {
  u32 m;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
  return m;
}

__device__ __forceinline__ void topk_body(int *idx, const float *scores, int n, int k) {
  __shared__ u32 hist[2048];
  __shared__ u64 surv[TOPK_MAXK];
  __shared__ u32 wgt[32], weq[32];
  __shared__ u32 sel_prefix, sel_krem;
  const int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5, nw = blockDim.x >> 5;

  // Radix select: after the passes, prefix is the k-th largest key and krem
  // is how many elements equal to it are taken.
  u32 prefix = 0, mask = 0, krem = (u32)k;
  const int shifts[3] = {21, 10, 0};
  const int widths[3] = {11, 11, 10};
  for (int pass = 0; pass < 3; pass++) {
    const int sh = shifts[pass], nb = 1 << widths[pass];
    for (int i = tid; i < nb; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    // Warp-uniform trip count; TOPK_U loads in flight per thread; lanes with
    // the same bin add once together (ties and narrow value ranges would
    // otherwise serialise the atomics).
    for (int i0 = wp * 32; i0 < n; i0 += TOPK_U * blockDim.x) {
      float v[TOPK_U];
#pragma unroll
      for (int u = 0; u < TOPK_U; u++) {
        const int i = i0 + u * blockDim.x + lane;
        v[u] = i < n ? scores[i] : 0.f;
      }
#pragma unroll
      for (int u = 0; u < TOPK_U; u++) {
        const int i = i0 + u * blockDim.x + lane;
        const u32 key = rank_key(v[u]);
        const bool in = i < n && (key & mask) == prefix;
        const u32 bin = in ? (key >> sh) & (u32)(nb - 1) : 0xffffffffu;
        const u32 peers = __match_any_sync(FULL, bin);
        if (in && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (u32)__popc(peers));
      }
    }
    __syncthreads();
    if (wp == 0) {
      // Suffix scan from the top bin down, 32 lanes over nb bins: each lane
      // sums a contiguous chunk; then find the bin where the count from the
      // top first reaches krem.
      const int per = nb / 32;
      const int lo = lane * per;
      u32 cs = 0;
      for (int i = 0; i < per; i++) cs += hist[lo + i];
      // Inclusive suffix sum over lanes (lane 31 holds the top chunk).
      u32 suf = cs;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        u32 t = __shfl_down_sync(FULL, suf, o);
        if (lane + o < 32) suf += t;
      }
      const u32 above = suf - cs;  // elements in chunks above this lane's
      const bool mine = above < krem && krem <= suf;
      if (mine) {
        u32 acc = above;
        int b = lo + per - 1;
        for (; b > lo; b--) {
          if (acc + hist[b] >= krem) break;
          acc += hist[b];
        }
        sel_prefix = prefix | ((u32)b << sh);
        sel_krem = krem - acc;
      }
    }
    __syncthreads();
    prefix = sel_prefix;
    krem = sel_krem;
    mask |= (u32)(nb - 1) << sh;
    __syncthreads();
  }
  const u32 thr = prefix;  // the k-th largest key; take every key > thr and the first krem keys == thr

  // Collection: warp wp owns [wp·seg, (wp+1)·seg) in index order.
  const int seg = ((n + nw - 1) / nw + 31) / 32 * 32;
  const int lo = wp * seg, hi = min(n, lo + seg);
  u32 cg = 0, ce = 0;
  for (int b0 = lo; b0 < hi; b0 += 32 * TOPK_U) {
    float v[TOPK_U];
#pragma unroll
    for (int u = 0; u < TOPK_U; u++) {
      const int i = b0 + 32 * u + lane;
      v[u] = i < hi ? scores[i] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < TOPK_U; u++) {
      const int i = b0 + 32 * u + lane;
      const bool ok = i < hi;
      const u32 key = rank_key(v[u]);
      cg += __popc(__ballot_sync(FULL, ok && key > thr));
      ce += __popc(__ballot_sync(FULL, ok && key == thr));
    }
  }
  if (lane == 0) {
    wgt[wp] = cg;
    weq[wp] = ce;
  }
  __syncthreads();
  u32 gbase = 0, ebase = 0;
  for (int i = 0; i < wp; i++) {
    gbase += wgt[i];
    ebase += weq[i];
  }
  u32 ngt = 0;
  for (int i = 0; i < nw; i++) ngt += wgt[i];
  const u32 below = lanemask_lt();
  for (int b0 = lo; b0 < hi; b0 += 32 * TOPK_U) {
    float v[TOPK_U];
#pragma unroll
    for (int u = 0; u < TOPK_U; u++) {
      const int i = b0 + 32 * u + lane;
      v[u] = i < hi ? scores[i] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < TOPK_U; u++) {  // in index order: ties keep their lowest indices
      const int i = b0 + 32 * u + lane;
      const bool ok = i < hi;
      const u32 key = rank_key(v[u]);
      const u32 bg = __ballot_sync(FULL, ok && key > thr);
      const u32 be = __ballot_sync(FULL, ok && key == thr);
      const u64 comp = ((u64)key << 32) | (u64)(0xffffffffu - (u32)i);
      if (ok && key > thr) surv[gbase + __popc(bg & below)] = comp;
      if (ok && key == thr) {
        const u32 e = ebase + __popc(be & below);
        if (e < krem) surv[ngt + e] = comp;
      }
      gbase += __popc(bg);
      ebase += __popc(be);
    }
  }
  // Pad to a power of two with 0 (ranks below every real entry).
  int P = 1;
  while (P < k) P <<= 1;
  for (int i = k + tid; i < P; i += blockDim.x) surv[i] = 0ull;
  __syncthreads();
  // Bitonic sort, descending.
  for (int size = 2; size <= P; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = tid; i < P; i += blockDim.x) {
        const int j = i ^ stride;
        if (j > i) {
          const bool desc = (i & size) == 0;
          const u64 a = surv[i], b = surv[j];
          if (desc ? (a < b) : (a > b)) {
            surv[i] = b;
            surv[j] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  for (int i = tid; i < k; i += blockDim.x) idx[i] = (int)(0xffffffffu - (u32)(surv[i] & 0xffffffffull));
}

extern "C" __global__ void __launch_bounds__(TOPK_THREADS) topk(int *idx, const float *scores, int n, int k) { MOXIE_PDL();
  topk_body(idx, scores, n, k);
}

// topk_rows: block r ranks row r of scores [rows, stride] over its first
// ns[r] entries: idx[r, 0:min(k, ns[r])] as topk, the rest of the row −1.
extern "C" __global__ void __launch_bounds__(TOPK_THREADS) topk_rows(int *idx, const float *scores, const int *ns,
                                                                    int stride, int k) { MOXIE_PDL();
  const size_t r = blockIdx.x;
  const int n = min(max(ns[r], 0), stride);
  const int kk = min(k, n);
  int *ir = idx + r * k;
  for (int i = kk + threadIdx.x; i < k; i += blockDim.x) ir[i] = -1;
  if (kk > 0) topk_body(ir, scores + r * stride, n, kk);
}

// ---------------------------------------------------------------------------
// Route: one warp per token (blockDim 32, grid batch). p_e = sqrt(softplus(
// logit_e)) in double (like the host); the ranking key p_e + bias_e is
// float32. Without hash, k rounds of a warp argmax over (key desc, index asc)
// pick the experts; weights are p/Σp·scale with Σ taken in pick order.
// Every expert is the 64-bit word (rank_key << 32) | (2³²−1 − e), so the
// largest word is the pick; a picked word becomes 0, below every real one.
// With experts <= 32·ROUTE_EPL each lane keeps its experts' words in
// registers and a round is two warp max-reductions (the high word, then the
// low word among the lanes holding that high word); more experts take the
// shared-memory loop. Shared memory: experts·(8 + 4 + 4) bytes (comp, p, picks). A hash id
// outside [0, experts) gives NaN weights for that token (the host cannot be
// told from here).
#define ROUTE_EPL 8

__device__ __forceinline__ u64 route_word(float pe, const float *bias, int e) {
  const float key = bias ? pe + bias[e] : pe;
  return ((u64)rank_key(key) << 32) | (u64)(0xffffffffu - (u32)e);
}

__device__ __forceinline__ float route_p(float g) {
  const double sp = g > 20.f ? (double)g : log1p(exp((double)g));
  return (float)sqrt(sp);
}

extern "C" __global__ void route(int *ids, float *weights, const float *logits, const float *bias, const int *hash,
                                 int experts, int k, float scale) { MOXIE_PDL();
  extern __shared__ u64 rsm[];
  u64 *comp = rsm;
  float *p = (float *)(rsm + experts);
  int *sid = (int *)(p + experts);  // the picks (or hash ids), in pick order
  const int lane = threadIdx.x;
  const size_t b = blockIdx.x;
  const float *lg = logits + b * experts;
  if (experts <= 32 * ROUTE_EPL) {
    float g[ROUTE_EPL];
#pragma unroll
    for (int u = 0; u < ROUTE_EPL; u++) {  // every load in flight at once
      const int e = lane + 32 * u;
      g[u] = e < experts ? lg[e] : 0.f;
    }
    u64 w[ROUTE_EPL];
#pragma unroll
    for (int u = 0; u < ROUTE_EPL; u++) {
      const int e = lane + 32 * u;
      w[u] = 0ull;
      if (e < experts) {
        const float pe = route_p(g[u]);
        p[e] = pe;
        if (!hash) w[u] = route_word(pe, bias, e);
      }
    }
    if (!hash) {
      for (int j = 0; j < k; j++) {
        u64 best = w[0];
#pragma unroll
        for (int u = 1; u < ROUTE_EPL; u++) best = w[u] > best ? w[u] : best;
        const u32 hi = __reduce_max_sync(FULL, (u32)(best >> 32));
        const u32 lo = __reduce_max_sync(FULL, (u32)(best >> 32) == hi ? (u32)best : 0u);
        const u64 win = ((u64)hi << 32) | lo;
#pragma unroll
        for (int u = 0; u < ROUTE_EPL; u++)
          if (w[u] == win) w[u] = 0ull;
        if (lane == 0) sid[j] = (int)(0xffffffffu - lo);
      }
    }
  } else {
    for (int e = lane; e < experts; e += 32) {
      const float pe = route_p(lg[e]);
      p[e] = pe;
      comp[e] = route_word(pe, bias, e);
    }
    __syncwarp();
    if (!hash) {
      for (int j = 0; j < k; j++) {
        u64 best = 0;
        int be = -1;
        for (int e = lane; e < experts; e += 32) {
          if (be < 0 || comp[e] > best) {
            best = comp[e];
            be = e;
          }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
          const u64 ob = __shfl_xor_sync(FULL, best, o);
          const int oe = __shfl_xor_sync(FULL, be, o);
          if (oe >= 0 && (be < 0 || ob > best)) {
            best = ob;
            be = oe;
          }
        }
        if (lane == 0) {
          sid[j] = be;
          comp[be] = 0;  // below every real entry, whose low word is > 0
        }
        __syncwarp();
      }
    }
  }
  __syncwarp();
  int *ib = ids + b * k;
  float *wb = weights + b * k;
  if (hash)
    for (int j = lane; j < k; j += 32) sid[j] = hash[b * k + j];
  __syncwarp();
  float sum = 0.f;
  bool bad = false;
  for (int j = 0; j < k; j++) {  // every lane, the same order
    const int e = sid[j];
    if (e < 0 || e >= experts) {
      bad = true;
      break;
    }
    sum += p[e];
  }
  for (int j = lane; j < k; j += 32) {
    const int e = sid[j];
    ib[j] = e;
    wb[j] = bad ? __int_as_float(0x7fc00000) : p[e] / sum * scale;
  }
}

// ---------------------------------------------------------------------------
// SwiGLU: h = silu(g)·u·rowScale[row], with the optional clamp. h may alias g or u.
extern "C" __global__ void swiglu(float *h, const float *g, const float *u, const float *rowScale, int rows, int width,
                                  float limit) { MOXIE_PDL();
  const long long total = (long long)rows * width;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    float gi = g[i], ui = u[i];
    if (limit > 0.f) {
      gi = fminf(gi, limit);
      ui = fmaxf(fminf(ui, limit), -limit);
    }
    float v = gi * sigmoidf_(gi) * ui;
    if (rowScale) v *= rowScale[i / width];
    h[i] = v;
  }
}

// EmbedBF16: x[i, j, :] = float(table[tokens[i], :]) for every stream j < hc.
extern "C" __global__ void embed_bf16(float *x, const u16 *table, const int *tokens, int n, int dim, int hc) { MOXIE_PDL();
  const long long total = (long long)n * dim;
  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x) {
    const long long i = t / dim;
    const int c = (int)(t % dim);
    const float v = bf16f(table[(long long)tokens[i] * dim + c]);
    for (int j = 0; j < hc; j++) x[(i * hc + j) * dim + c] = v;
  }
}

// Axpy: y += a·x; Scale: y *= a.
extern "C" __global__ void axpy(float *y, const float *x, float a, long long n) { MOXIE_PDL();
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    y[i] += a * x[i];
}

extern "C" __global__ void scale_f32(float *y, float a, long long n) { MOXIE_PDL();
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    y[i] *= a;
}
