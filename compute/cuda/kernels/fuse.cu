// Fused small-kernel chains of a decode step (compute/cuda/fuse.go). This
// file is compiled after kernels/ops.cu in one module (the "fuse" module):
// it uses ops.cu's helpers (block_sum, hc_gates_sinkhorn,
// hc_split_dots_body, HC_MAXNM, HCS_*) and launches ops.cu's hc_split_dots
// for the boundary without an expand. Every fused kernel computes what the
// chain of unfused ops computes, in the same float32 order where the
// comments say so.
//@pdl

// ---------------------------------------------------------------------------
// Sublayer boundary: HCExpand → HCMix (split-K) → HCCollapse → RMSNorm in two
// kernels (below) or in one (fuse_hc_one, further down).
//
// fuse_hc_dots: hc_split_dots over the expanded streams x' = post·o + combᵀ·x
// (HCExpand's order: fma(comb[hc−1, k], x[hc−1], … fma(comb[0, k], x[0],
// post[k]·o))), formed per quad as the dots read them; blocks of row group 0
// also store x' into xout (each quad of each token exactly once). Same grid,
// shape and summation order as hc_split_dots, so the partials are the bits
// that HCExpand followed by hc_split_dots gives. Needs dim % 4 == 0, x, o
// and xout 16-byte aligned; xout must not overlap x, o, post or comb. Each
// block first asks L2 for its own hc_fn slice (hcd_pf, MOXIE_PDL_PF), so
// that with a programmatic launch the weight streams in while the kernel
// before the boundary still runs.
//
// fuse_hc_finish: grid (T, 2) for a mix, (T, 1) for the head; blockDim =
// the rmsnorm kernel's for dim (ops.go rmsThreads; at most 1024). Each
// block sums the token's partials (dynamic shared memory [(nm+1)·S]) as
// hc_split_finish sums them and forms ρ. Block (b, 0) then writes the
// gates and the Sinkhorn result (hc_gates_sinkhorn: pre, post, comb); block
// (b, 1) forms pre itself (hc_pre_gate, the same bits) and writes
// a = Σ_j pre_j·xs_j (HCCollapse's order) and a ← RMS(a; w) with the
// rmsnorm kernel's order (thread-strided Σa², block_sum, w·(a·inv)), so
// the serial Sinkhorn and the collapse run side by side. With one block per
// token (the head: no Sinkhorn) it does both. xs is x' (or x without
// expand); a must not overlap xs, pre, post or comb. fuse_hc_finish4 (hc =
// 4, further down) is the same finish on a shorter critical path.

// MOXIE_PDL() (programmatic dependent launch: wait for the previous kernel
// on the stream) comes from the module preamble where there is one; every
// kernel below starts with it, and without a preamble it does nothing.
#ifndef MOXIE_PDL
#define MOXIE_PDL() \
  do {              \
  } while (0)
#endif

// hc_x_expand is hc_split_dots_body's stream loader for the fused expand:
// quad q (flat index over [hc, dim] / 4) of token b0 + t is
// x'[k, i..i+3] with k = 4q / dim, i = 4q mod dim.
template <int HCC>
struct hc_x_expand {
  const float *__restrict__ x;     // [batch, hc, dim]
  const float *__restrict__ o;     // [batch, dim]
  const float *__restrict__ post;  // [batch, hc]
  const float *__restrict__ comb;  // [batch, hc, hc]
  float *__restrict__ xout;        // [batch, hc, dim], or null: not stored by this block
  int hc, dim, b0;
  __device__ __forceinline__ float4 operator()(int t, int q) const {
    const int H = HCC > 0 ? HCC : hc;
    const size_t b = (size_t)b0 + t;
    const int c = q << 2;
    const int k = c / dim, i = c - k * dim;
    const float4 ov = __ldg((const float4 *)(o + b * dim + i));
    const float pk = __ldg(post + b * H + k);
    const float *cb = comb + b * H * H + k;
    const float *xb = x + b * H * dim + i;
    float4 s = make_float4(__fmul_rn(pk, ov.x), __fmul_rn(pk, ov.y), __fmul_rn(pk, ov.z), __fmul_rn(pk, ov.w));
    if (HCC > 0) {
      float4 xj[HCC > 0 ? HCC : 1];
      float cj[HCC > 0 ? HCC : 1];
#pragma unroll
      for (int j = 0; j < HCC; j++) {
        xj[j] = __ldg((const float4 *)(xb + (size_t)j * dim));
        cj[j] = __ldg(cb + j * H);
      }
#pragma unroll
      for (int j = 0; j < HCC; j++) {
        s.x = __fmaf_rn(cj[j], xj[j].x, s.x);
        s.y = __fmaf_rn(cj[j], xj[j].y, s.y);
        s.z = __fmaf_rn(cj[j], xj[j].z, s.z);
        s.w = __fmaf_rn(cj[j], xj[j].w, s.w);
      }
    } else {
#pragma unroll 2
      for (int j = 0; j < H; j++) {
        const float4 xv = __ldg((const float4 *)(xb + (size_t)j * dim));
        const float cv = __ldg(cb + j * H);
        s.x = __fmaf_rn(cv, xv.x, s.x);
        s.y = __fmaf_rn(cv, xv.y, s.y);
        s.z = __fmaf_rn(cv, xv.z, s.z);
        s.w = __fmaf_rn(cv, xv.w, s.w);
      }
    }
    if (xout) *(float4 *)(xout + b * H * dim + c) = s;
    return s;
  }
};

template <int HCC>
__device__ __forceinline__ void fuse_hc_dots_hc(float *__restrict__ part, const float *__restrict__ x,
                                                const float *__restrict__ o, const float *__restrict__ post,
                                                const float *__restrict__ comb, float *__restrict__ xout,
                                                const void *__restrict__ fn, int fmt, int n, int nm, int cq, int rb,
                                                int batch, int hc, int dim, float (*red)[32]) {
  const hc_x_expand<HCC> xl{x, o, post, comb, blockIdx.x == 0 ? xout : nullptr, hc, dim, (int)blockIdx.z * HCS_TB};
  if (fmt == 3)
    hc_split_dots_body<true>(part, xl, fn, n, nm, cq, rb, batch, red);
  else
    hc_split_dots_body<false>(part, xl, fn, n, nm, cq, rb, batch, red);
}

// hcd_pf is fuse_hc_dots's L2 request (MOXIE_PDL_PF): the block's own
// hc_fn slice (its rows below nm, its quads [s·cq, min((s+1)·cq, n/4))),
// from the kernel's arguments and blockIdx alone; hc_fn is a weight, so it
// streams in while the kernel before the boundary still runs.
__device__ __forceinline__ MoxiePF hcd_pf(const void *fn, int fmt, int n, int nm, int cq, int rb) {
  const long long es = fmt == 3 ? 2 : 4;
  const int r0 = blockIdx.x * rb, q0 = blockIdx.y * cq;
  const int rows = max(0, min(rb, nm - r0)), quads = max(0, min(cq, (n >> 2) - q0));
  if (rows == 0 || quads == 0) return MoxiePF{nullptr, nullptr, 0, 0, 0};
  return MoxiePF{(const char *)fn + ((long long)r0 * n + 4LL * q0) * es, nullptr, 4LL * quads * es, (long long)n * es,
                 rows};
}

extern "C" __global__ void fuse_hc_dots(float *__restrict__ part, const float *__restrict__ x,
                                        const float *__restrict__ o, const float *__restrict__ post,
                                        const float *__restrict__ comb, float *__restrict__ xout,
                                        const void *__restrict__ fn, int fmt, int n, int nm, int cq, int rb, int batch,
                                        int hc, int dim) {
  MOXIE_PDL_PF(hcd_pf(fn, fmt, n, nm, cq, rb));
  __shared__ float red[HCS_RB * HCS_TB][32];
  if (hc == 4)
    fuse_hc_dots_hc<4>(part, x, o, post, comb, xout, fn, fmt, n, nm, cq, rb, batch, hc, dim, red);
  else
    fuse_hc_dots_hc<0>(part, x, o, post, comb, xout, fn, fmt, n, nm, cq, rb, batch, hc, dim, red);
}

// fuse_hc_dots4: fuse_hc_dots for hc == 4 (the same grid, arguments and
// results, bit for bit) on a shorter latency chain. With fuse_hc_dots's
// loader (hc_x_expand called from hc_split_dots_body) ptxas (sm_90) issues
// a quad's loads in three waves, each waiting for the one before: half the
// Fn rows with post, comb, o and two x streams; the other two x streams
// only once post·o is formed (their registers are reused); the other Fn
// rows only after the x' store, which it does not move them past. Here
// every load of a quad (the block's Fn rows, then post, comb, o and the
// four x streams of up to TG tokens) is issued before the first product
// and x' is stored after the products, so a thread waits for memory once
// per quad and TG tokens: TG 4 in fuse_hc_dots4 (254 registers a thread
// with NVRTC 11.8), TG 1 in fuse_hc_dots4_t1 (168 registers; the same
// single wait for one token, a wait per further token). x' is formed as HCExpand forms
// it (fma(comb[3, k], x[3], … fma(comb[0, k], x[0], post[k]·o))), each
// partial accumulated and reduced as hc_split_dots_body does (dot4 per row
// and token over the thread's quads in order, warp shuffles, the warps in
// index order), so the partials and x' are fuse_hc_dots's bits.
template <bool BF, int TG>
__device__ __forceinline__ void hcd4_body(float *__restrict__ part, const float *__restrict__ x,
                                          const float *__restrict__ o, const float *__restrict__ post,
                                          const float *__restrict__ comb, float *__restrict__ xout,
                                          const void *__restrict__ fn, int n, int nm, int cq, int rb, int batch,
                                          int dim, float (*red)[32]) {
  const int r0 = blockIdx.x * rb, s = blockIdx.y, S = gridDim.y, b0 = blockIdx.z * HCS_TB;
  const int nr = min(rb, nm + 1 - r0), nt = min(HCS_TB, batch - b0);
  const int nq = n >> 2;
  const int q0 = s * cq, q1 = min(q0 + cq, nq);
  const bool store = blockIdx.x == 0;  // row group 0 stores x'
  float acc[HCS_RB][HCS_TB];
#pragma unroll
  for (int j = 0; j < HCS_RB; j++)
#pragma unroll
    for (int t = 0; t < HCS_TB; t++) acc[j][t] = 0.f;
  for (int q = q0 + threadIdx.x; q < q1; q += blockDim.x) {
    const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
    const int c = q << 2, k = c / dim, i = c - k * dim;  // stream k, column i
    float4 f[HCS_RB];
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
    float4 xs[HCS_TB];
#pragma unroll
    for (int t0 = 0; t0 < HCS_TB; t0 += TG) {
      float4 ov[TG], xj[TG][4];
      float pk[TG], cj[TG][4];
#pragma unroll
      for (int u = 0; u < TG; u++) {
        const int t = t0 + u;
        if (t < nt) {
          const size_t b = (size_t)b0 + t;
          ov[u] = __ldg((const float4 *)(o + b * dim + i));
          pk[u] = __ldg(post + b * 4 + k);
#pragma unroll
          for (int j = 0; j < 4; j++) cj[u][j] = __ldg(comb + b * 16 + j * 4 + k);
#pragma unroll
          for (int j = 0; j < 4; j++) xj[u][j] = __ldg((const float4 *)(x + (b * 4 + j) * dim + i));
        }
      }
#pragma unroll
      for (int u = 0; u < TG; u++) {
        const int t = t0 + u;
        if (t < nt) {
          float4 v = make_float4(__fmul_rn(pk[u], ov[u].x), __fmul_rn(pk[u], ov[u].y), __fmul_rn(pk[u], ov[u].z),
                                 __fmul_rn(pk[u], ov[u].w));
#pragma unroll
          for (int j = 0; j < 4; j++) {
            v.x = __fmaf_rn(cj[u][j], xj[u][j].x, v.x);
            v.y = __fmaf_rn(cj[u][j], xj[u][j].y, v.y);
            v.z = __fmaf_rn(cj[u][j], xj[u][j].z, v.z);
            v.w = __fmaf_rn(cj[u][j], xj[u][j].w, v.w);
          }
          xs[t] = v;
#pragma unroll
          for (int j = 0; j < HCS_RB; j++)
            if (j < nr) acc[j][t] = dot4(r0 + j == nm ? v : f[j], v, acc[j][t]);  // row nm: Σx'²
        }
      }
    }
    if (store) {
#pragma unroll
      for (int t = 0; t < HCS_TB; t++)
        if (t < nt) *(float4 *)(xout + (size_t)(b0 + t) * 4 * dim + c) = xs[t];
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
  for (int e = threadIdx.x; e < HCS_RB * HCS_TB; e += blockDim.x) {
    const int j = e / HCS_TB, t = e % HCS_TB;
    if (j < nr && t < nt) {
      float v = 0.f;
      for (int kk = 0; kk < nw; kk++) v += red[e][kk];
      part[((size_t)(b0 + t) * (nm + 1) + r0 + j) * S + s] = v;
    }
  }
}

#define HCD4_KERNEL(NAME, TG)                                                                                       \
  extern "C" __global__ void NAME(float *__restrict__ part, const float *__restrict__ x, const float *__restrict__ o, \
                                  const float *__restrict__ post, const float *__restrict__ comb,                    \
                                  float *__restrict__ xout, const void *__restrict__ fn, int fmt, int n, int nm,     \
                                  int cq, int rb, int batch, int hc, int dim) {                                      \
    MOXIE_PDL_PF(hcd_pf(fn, fmt, n, nm, cq, rb));                                                                    \
    __shared__ float red[HCS_RB * HCS_TB][32];                                                                       \
    if (fmt == 3)                                                                                                    \
      hcd4_body<true, TG>(part, x, o, post, comb, xout, fn, n, nm, cq, rb, batch, dim, red);                         \
    else                                                                                                             \
      hcd4_body<false, TG>(part, x, o, post, comb, xout, fn, n, nm, cq, rb, batch, dim, red);                        \
  }

HCD4_KERNEL(fuse_hc_dots4, 4)
HCD4_KERNEL(fuse_hc_dots4_t1, 1)

// FUSE_KEEP: collapse values a thread keeps in registers between the Σa²
// pass and the scaling pass (dim <= FUSE_KEEP·blockDim needs no re-read).
#define FUSE_KEEP 8

template <int HCC>
__device__ __forceinline__ void fuse_collapse_norm(float *__restrict__ ab, const float *__restrict__ xb,
                                                   const float *pw, const float *__restrict__ w, int hc, int dim,
                                                   float eps, float *red) {
  const int H = HCC > 0 ? HCC : hc;
  float p[HCC > 0 ? HCC : 1];
  if (HCC > 0) {
#pragma unroll
    for (int j = 0; j < (HCC > 0 ? HCC : 1); j++) p[j] = pw[j];
  }
  const int bd = blockDim.x;
  float keep[FUSE_KEEP];
  float ss = 0.f;
#pragma unroll
  for (int u = 0; u < FUSE_KEEP; u++) {
    const int i = threadIdx.x + u * bd;
    keep[u] = 0.f;
    if (i < dim) {
      float v = 0.f;
      if (HCC > 0) {
#pragma unroll
        for (int j = 0; j < (HCC > 0 ? HCC : 1); j++) v = __fmaf_rn(p[j], xb[(size_t)j * dim + i], v);
      } else {
        for (int j = 0; j < H; j++) v = __fmaf_rn(pw[j], xb[(size_t)j * dim + i], v);
      }
      keep[u] = v;
      ss += v * v;
    }
  }
  for (int i = threadIdx.x + FUSE_KEEP * bd; i < dim; i += bd) {
    float v = 0.f;
    for (int j = 0; j < H; j++) v = __fmaf_rn(pw[j], xb[(size_t)j * dim + i], v);
    ab[i] = v;
    ss += v * v;
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
#pragma unroll
  for (int u = 0; u < FUSE_KEEP; u++) {
    const int i = threadIdx.x + u * bd;
    if (i < dim) {
      const float v = keep[u] * inv;
      ab[i] = w ? w[i] * v : v;
    }
  }
  for (int i = threadIdx.x + FUSE_KEEP * bd; i < dim; i += bd) {
    const float v = ab[i] * inv;  // this thread's own store above
    ab[i] = w ? w[i] * v : v;
  }
}

extern "C" __global__ void __launch_bounds__(1024)
    fuse_hc_finish(float *pre, float *post, float *comb, float *__restrict__ a, const float *__restrict__ xs,
                   const float *__restrict__ w, const float *__restrict__ part, const float *base, const float *scale,
                   int hc, int dim, int nm, int S, int iters, float eps, float normEps, int head, float rmsEps) {
  MOXIE_PDL();
  extern __shared__ float4 ps4[];  // [(nm+1)·S] floats: this token's partials
  float *ps = (float *)ps4;
  __shared__ float dot[HC_MAXNM + 1];
  __shared__ float cm[HC_MAXNM];
  __shared__ float pw[HC_MAXNM];
  __shared__ float red[32];
  const size_t b = blockIdx.x;
  const int np = (nm + 1) * S;
  const float *pb = part + b * np;
  for (int i = threadIdx.x; i < np; i += blockDim.x) ps[i] = pb[i];  // every load in flight at once
  __syncthreads();
  for (int r = threadIdx.x; r <= nm; r += blockDim.x) {
    float s = 0.f;  // hc_split_finish's order: i = 0, 1, …, S−1
    if ((S & 3) == 0) {
      const float4 *p4 = ps4 + r * (S >> 2);
#pragma unroll 4
      for (int i = 0; i < (S >> 2); i++) {
        const float4 q = p4[i];
        s += q.x;
        s += q.y;
        s += q.z;
        s += q.w;
      }
    } else {
      for (int i = 0; i < S; i++) s += ps[r * S + i];
    }
    dot[r] = s;
  }
  __syncthreads();
  const float ss = dot[nm];
  const float rho = 1.0f / sqrtf(ss / (float)(hc * dim) + normEps);
  if (gridDim.y == 1 || blockIdx.y == 0) {
    hc_gates_sinkhorn(pre, post, comb, dot, dot + hc, dot + 2 * hc, rho, base, scale, hc, iters, eps, head, b, cm);
    if (gridDim.y == 2) return;
  }
  if (threadIdx.x < hc) pw[threadIdx.x] = hc_pre_gate(dot[threadIdx.x], rho, scale, base, threadIdx.x, eps);
  __syncthreads();
  const float *xb = xs + b * hc * dim;
  float *ab = a + b * dim;
  if (hc == 4)
    fuse_collapse_norm<4>(ab, xb, pw, w, hc, dim, rmsEps, red);
  else
    fuse_collapse_norm<0>(ab, xb, pw, w, hc, dim, rmsEps, red);
}

// ---------------------------------------------------------------------------
// fuse_hc_finish4: fuse_hc_finish for hc = 4 with a short critical path (the
// same grid, block size, outputs and float32 operations in the same order,
// so the same bits; $MOXIE_CUDA_HCFIN=new selects it, see fuse.go). Needs
// S % 4 == 0, S <= HCS_MAXS, part 16-byte aligned and dim <= 4·blockDim.
// fuse_hc_finish waits on memory twice in a row (the partials, then, after
// the sums, the gates and three barriers, x') and on six barriers; here:
//   - every load is issued at once after MOXIE_PDL(): the partials the block
//     needs (into shared memory, rows padded to S + 4 floats) and, in the
//     collapse block, its x' values and norm weights (into registers, the
//     rmsnorm kernel's element i = threadIdx.x + u·blockDim);
//   - Sinkhorn block (b, 0): one barrier, then warps 2.. leave and every
//     thread of warps 0 and 1 sums the rows it reads itself (its own dot
//     slots, and the Σx² row for ρ), so hc_gates_sinkhorn follows with no
//     barrier (warp 0: comb, warp 1: pre and post, as in fuse_hc_finish;
//     a block of 32 threads does both on warp 0);
//   - collapse block (b, 1), or the head's only block: one barrier, then
//     lanes 0–3 of every warp form the four pre gates (rows 0–3 and ρ from
//     row nm; the head's warp 0 writes them to pre) and shuffle them to the
//     warp; the collapse from registers, Σa² per thread, warp_sum, and
//     block_sum's ordered sum of the warps after one barrier (its guard
//     barriers are not needed: red is written once).

#define HCF4_SP(S) ((S) + 4)  // a staged row's stride in floats

// hcf4_row_sum is the sum of a staged row of S partials in index order
// (hc_split_finish's and fuse_hc_finish's order).
__device__ __forceinline__ float hcf4_row_sum(const float4 *r4, int S4) {
  float s = 0.f;
#pragma unroll 4
  for (int i = 0; i < S4; i++) {
    const float4 q = r4[i];
    s += q.x;
    s += q.y;
    s += q.z;
    s += q.w;
  }
  return s;
}

// hcf4_load_x issues a collapse block's loads of token b's x' values and
// norm weights into registers (the rmsnorm kernel's element i = threadIdx.x
// + u·blockDim; zeros past dim): the first thing the finish4 kernels'
// collapse blocks do.
__device__ __forceinline__ void hcf4_load_x(const float *__restrict__ xs, const float *__restrict__ w, size_t b, int dim,
                                            float (&xv)[4][4], float (&wv)[4]) {
  const float *xb = xs + b * 4 * dim;
#pragma unroll
  for (int u = 0; u < 4; u++) {
    const int i = threadIdx.x + u * blockDim.x;
    wv[u] = 0.f;
#pragma unroll
    for (int j = 0; j < 4; j++) xv[u][j] = 0.f;
    if (i < dim) {
#pragma unroll
      for (int j = 0; j < 4; j++) xv[u][j] = __ldcg(xb + (size_t)j * dim + i);
      if (w) wv[u] = __ldg(w + i);
    }
  }
}

// hcf4_collapse is the finish4 kernels' collapse after the gates: lane j <
// 4 of every warp holds pre_j in g; a = Σ_j pre_j·x'_j (HCCollapse's order)
// and a ← RMS(a; w) in the rmsnorm kernel's order (thread-strided Σa²,
// warp_sum, the warps in order through red [32]), stored to token b's row.
__device__ __forceinline__ void hcf4_collapse(float g, const float (&xv)[4][4], const float (&wv)[4], float *a,
                                              const float *__restrict__ w, size_t b, int dim, float rmsEps, float *red) {
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, bd = blockDim.x;
  float p[4];
#pragma unroll
  for (int j = 0; j < 4; j++) p[j] = __shfl_sync(FULL, g, j);
  float keep[4];
  float ss = 0.f;
#pragma unroll
  for (int u = 0; u < 4; u++) {
    const int i = tid + u * bd;
    keep[u] = 0.f;
    if (i < dim) {
      float v = 0.f;
#pragma unroll
      for (int j = 0; j < 4; j++) v = __fmaf_rn(p[j], xv[u][j], v);
      keep[u] = v;
      ss += v * v;
    }
  }
  ss = warp_sum(ss);
  if (lane == 0) red[wid] = ss;
  __syncthreads();
  float tot = 0.f;
#pragma unroll 8
  for (int i = 0; i < (bd >> 5); i++) tot += red[i];  // block_sum's order
  const float inv = 1.0f / sqrtf(tot / (float)dim + rmsEps);
  float *ab = a + b * dim;
#pragma unroll
  for (int u = 0; u < 4; u++) {
    const int i = tid + u * bd;
    if (i < dim) {
      const float v = keep[u] * inv;
      ab[i] = w ? wv[u] * v : v;
    }
  }
}

extern "C" __global__ void __launch_bounds__(1024)
    fuse_hc_finish4(float *pre, float *post, float *comb, float *__restrict__ a, const float *__restrict__ xs,
                    const float *__restrict__ w, const float *__restrict__ part, const float *base, const float *scale,
                    int dim, int nm, int S, int iters, float eps, float normEps, int head, float rmsEps) {
  MOXIE_PDL_PF(w, w ? 4LL * dim : 0LL);  // the norm weight (a weight: no kernel writes it)
  __shared__ float4 ps4[(2 + 4) * 4 + 1][HCF4_SP(HCS_MAXS) / 4];  // staged partial rows
  __shared__ float dot[HC_MAXNM + 1];
  __shared__ float cm[HC_MAXNM];
  __shared__ float red[32];
  const size_t b = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, bd = blockDim.x;
  const int S4 = S >> 2;
  const float4 *pb4 = (const float4 *)(part + b * (nm + 1) * S);
  if (!head && blockIdx.y == 0) {
    for (int i = tid; i < (nm + 1) * S4; i += bd) {
      const int r = i / S4, c = i - r * S4;
      ps4[r][c] = __ldg(pb4 + i);
    }
    __syncthreads();
    if (tid >= 64) return;
    const float rho = 1.0f / sqrtf(hcf4_row_sum(ps4[nm], S4) / (float)(4 * dim) + normEps);
    // Each dot slot is read back only by the thread that writes it: comb's
    // by warp 0's lanes, pre's and post's by hc_gates_sinkhorn's gate lane
    // (warp 1, or warp 0 itself in a block of 32 threads).
    if (tid < 16) dot[8 + tid] = hcf4_row_sum(ps4[8 + tid], S4);
    const int gl = bd >= 64 ? tid - 32 : tid;
    if (gl >= 0 && gl < 4) {
      dot[gl] = hcf4_row_sum(ps4[gl], S4);
      dot[4 + gl] = hcf4_row_sum(ps4[4 + gl], S4);
    }
    hc_gates_sinkhorn(pre, post, comb, dot, dot + 4, dot + 8, rho, base, scale, 4, iters, eps, 0, b, cm);
    return;
  }
  // The collapse block: x' and the norm weights first, then rows 0–3 and nm.
  float xv[4][4], wv[4];
  hcf4_load_x(xs, w, b, dim, xv, wv);
  for (int i = tid; i < 5 * S4; i += bd) {
    const int k = i / S4, c = i - k * S4;
    ps4[k][c] = __ldg(pb4 + (k < 4 ? k : nm) * S4 + c);
  }
  __syncthreads();
  float g = 0.f;
  if (lane < 4) {
    const float rho = 1.0f / sqrtf(hcf4_row_sum(ps4[4], S4) / (float)(4 * dim) + normEps);
    g = hc_pre_gate(hcf4_row_sum(ps4[lane], S4), rho, scale, base, lane, eps);
    if (head && wid == 0) pre[b * 4 + lane] = g;
  }
  hcf4_collapse(g, xv, wv, a, w, b, dim, rmsEps, red);
}

// ---------------------------------------------------------------------------
// fuse_hc_finish4s: fuse_hc_finish4 (the same grid, block size, arguments,
// outputs and float32 operations in the same order, so fuse_hc_finish's
// bits; $MOXIE_CUDA_HCFIN=short selects it, see fuse.go) with a shorter
// Sinkhorn path, the boundary's longest chain at one token (the row sums,
// then 20 Sinkhorn iterations of shuffles and divisions). Needs what
// fuse_hc_finish4 needs and blockDim >= 64. Against fuse_hc_finish4:
//   - Sinkhorn block (b, 0): only warps 0 and 1 work, each on its own:
//     warp 0 stages comb's 16 partial rows and the Σx² row, warp 1 pre's
//     and post's 8 rows and the Σx² row (every load of a lane issued before
//     the first store), each into its own shared area, then __syncwarp (no
//     block barrier); each lane sums its row and the Σx² row in one loop
//     (two independent chains, each in index order) and keeps its dot in a
//     register: warp 0's lanes run the Sinkhorn (hc_sinkhorn_warp<4>'s
//     operations on a register operand: no shared round trip), lanes 0–7
//     of warp 1 the pre and post gates (hc_gates_sinkhorn's operations);
//   - collapse block: fuse_hc_finish4's, but the gate lanes sum their row
//     and the Σx² row in one loop.
// The collapse stays on one block: the RMSNorm's Σa² order (the rmsnorm
// kernel's threads, then its warps in order) spans all of D, so more
// blocks would each re-read all of x' or need a cross-block pass, and by
// a cycle count the collapse block's chain (loads, the 64-add row sums,
// a float64 sigmoid, two barriers) is about a third of the Sinkhorn
// block's (40 dependent shuffle, add and divide steps after the same
// loads and sums), which no float32-order-preserving change can shorten.

// hcf4_row_sum2 is hcf4_row_sum of two staged rows (S4 >= 1 float4s
// each), interleaved: two independent chains, each the sum of its row in
// index order. Each step's shared loads are issued a step ahead.
__device__ __forceinline__ void hcf4_row_sum2(const float4 *ra, const float4 *rb, int S4, float &sa, float &sb) {
  float x = 0.f, y = 0.f;
  float4 pn = ra[0], qn = rb[0];
#pragma unroll 4
  for (int i = 0; i < S4; i++) {
    const float4 p = pn, q = qn;
    const int nx = min(i + 1, S4 - 1);
    pn = ra[nx];
    qn = rb[nx];
    x += p.x;
    y += q.x;
    x += p.y;
    y += q.y;
    x += p.z;
    y += q.z;
    x += p.w;
    y += q.w;
  }
  sa = x;
  sb = y;
}

// hcf4s_stage stages, by the 32 lanes of one warp, nr partial rows of
// token b into st (row k: part row k < nr − 1 ? r0 + k : nm), lane l
// taking column l mod S4 of rows l / S4, l / S4 + 32 / S4, … (S4 <= 16:
// at most 9 rows a lane); every load is issued before the first store.
// The caller runs __syncwarp before reading st.
template <int NR>
__device__ __forceinline__ void hcf4s_stage(float4 (*st)[HCF4_SP(HCS_MAXS) / 4], const float4 *pb4, int r0, int nm,
                                            int S4) {
  const int lane = threadIdx.x & 31, rp = 32 / S4, c = lane % S4, k0 = lane / S4;
  constexpr int NL = (NR + 1) / 2;  // rows a lane stages at most (rp >= 2)
  float4 v[NL];
#pragma unroll
  for (int u = 0; u < NL; u++) {
    const int k = k0 + u * rp;
    if (k0 < rp && k < NR) v[u] = __ldg(pb4 + (k < NR - 1 ? r0 + k : nm) * S4 + c);
  }
#pragma unroll
  for (int u = 0; u < NL; u++) {
    const int k = k0 + u * rp;
    if (k0 < rp && k < NR) st[k][c] = v[u];
  }
}

// hcf4s_sinkhorn is hc_sinkhorn_warp<4> (the same operations in the same
// order) with lane l's dot product d in a register rather than dcomb[l].
__device__ __forceinline__ void hcf4s_sinkhorn(float *cb, float d, float rho, const float *base, const float *scale,
                                               int its, float eps) {
  const int lane = threadIdx.x & 31;
  const bool own = lane < 16;
  const int j = lane / 4, k = lane % 4;
  const float L = own ? __fadd_rn(__fmul_rn(d * rho, scale[2]), base[8 + lane]) : 0.f;
  float g[4];
#pragma unroll
  for (int kk = 0; kk < 4; kk++) g[kk] = __shfl_sync(FULL, L, j * 4 + kk);
  float mx = -__int_as_float(0x7f800000);
#pragma unroll
  for (int kk = 0; kk < 4; kk++) mx = fmaxf(mx, g[kk]);
  const float e = (float)exp((double)(L - mx));
#pragma unroll
  for (int kk = 0; kk < 4; kk++) g[kk] = __shfl_sync(FULL, e, j * 4 + kk);
  float s = 0.f;
#pragma unroll
  for (int kk = 0; kk < 4; kk++) s += g[kk];
  float v = e / s + eps;
  for (int it = 0; it < its; it++) {
    if (it > 0) {
#pragma unroll
      for (int kk = 0; kk < 4; kk++) g[kk] = __shfl_sync(FULL, v, j * 4 + kk);
      s = 0.f;
#pragma unroll
      for (int kk = 0; kk < 4; kk++) s += g[kk];
      v = v / (s + eps);
    }
#pragma unroll
    for (int jj = 0; jj < 4; jj++) g[jj] = __shfl_sync(FULL, v, jj * 4 + k);
    s = 0.f;
#pragma unroll
    for (int jj = 0; jj < 4; jj++) s += g[jj];
    v = v / (s + eps);
  }
  if (own) cb[lane] = v;
}

extern "C" __global__ void __launch_bounds__(1024)
    fuse_hc_finish4s(float *pre, float *post, float *comb, float *__restrict__ a, const float *__restrict__ xs,
                     const float *__restrict__ w, const float *__restrict__ part, const float *base,
                     const float *scale, int dim, int nm, int S, int iters, float eps, float normEps, int head,
                     float rmsEps) {
  MOXIE_PDL_PF(w, w ? 4LL * dim : 0LL);  // the norm weight (a weight: no kernel writes it)
  __shared__ float4 ps4[17 + 9][HCF4_SP(HCS_MAXS) / 4];  // staged partial rows (two warps' areas)
  __shared__ float red[32];
  const size_t b = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, bd = blockDim.x;
  const int S4 = S >> 2;
  const float4 *pb4 = (const float4 *)(part + b * (nm + 1) * S);
  if (!head && blockIdx.y == 0) {
    if (tid >= 64) return;
    float d, snm;
    // Warp 0's area: ps4[0..16] (comb's rows 8..23, then Σx²); warp 1's:
    // ps4[17..25] (pre's rows 0..3, post's 4..7, then Σx²).
    if (wid == 0) {
      hcf4s_stage<17>(ps4, pb4, 8, nm, S4);
      __syncwarp();
      hcf4_row_sum2(ps4[lane & 15], ps4[16], S4, d, snm);
    } else {
      hcf4s_stage<9>(ps4 + 17, pb4, 0, nm, S4);
      __syncwarp();
      hcf4_row_sum2(ps4[17 + (lane & 7)], ps4[17 + 8], S4, d, snm);
    }
    const float rho = 1.0f / sqrtf(snm / (float)(4 * dim) + normEps);
    if (wid == 0) {
      const int its = iters < 1 ? 1 : iters;  // the host always makes the first column pass
      hcf4s_sinkhorn(comb + b * 16, d, rho, base, scale, its, eps);
    } else if (lane < 4) {
      pre[b * 4 + lane] = hc_pre_gate(d, rho, scale, base, lane, eps);
    } else if (lane < 8) {
      const int gl = lane - 4;
      const float m2 = d * rho;
      post[b * 4 + gl] = 2.0f * sigmoidf_(m2 * scale[1] + base[4 + gl]);
    }
    return;
  }
  // The collapse block: x' and the norm weights first, then rows 0–3 and nm.
  float xv[4][4], wv[4];
  hcf4_load_x(xs, w, b, dim, xv, wv);
  for (int i = tid; i < 5 * S4; i += bd) {
    const int k = i / S4, c = i - k * S4;
    ps4[k][c] = __ldg(pb4 + (k < 4 ? k : nm) * S4 + c);
  }
  __syncthreads();
  float g = 0.f;
  if (lane < 4) {
    float dl, snm;
    hcf4_row_sum2(ps4[lane], ps4[4], S4, dl, snm);
    const float rho = 1.0f / sqrtf(snm / (float)(4 * dim) + normEps);
    g = hc_pre_gate(dl, rho, scale, base, lane, eps);
    if (head && wid == 0) pre[b * 4 + lane] = g;
  }
  hcf4_collapse(g, xv, wv, a, w, b, dim, rmsEps, red);
}

// ---------------------------------------------------------------------------
// fuse_hc_finish4w: fuse_hc_finish4 (the same grid, block size, arguments
// and outputs) for partials formed by a boundary's producer rather than by
// fuse_hc_dots: a fused MoE stage 2 (moe2lh, kernels/moe.cu) leaves one
// partial per 16-row tile, so S is D/16 (256 at V4's width) where the dots
// kernel leaves at most HCS_MAXS. Each partial row (the nm dot rows and the
// Σx² row nm) is summed by one warp: lane l adds elements l, l + 32, … in
// order, then warp_sum's xor tree; so the sums, and everything after them,
// are not fuse_hc_finish4's bits (its rows add in index order), but the
// float32 operations after the sums are its own (hc_gates_sinkhorn,
// hc_pre_gate, hcf4_collapse). Needs hc = 4, dim <= 4·blockDim, blockDim a
// multiple of 32; any S >= 1.
__device__ __forceinline__ float hcf4w_row_sum(const float *__restrict__ row, int S) {
  float s = 0.f;
  for (int i = threadIdx.x & 31; i < S; i += 32) s += __ldg(row + i);
  return warp_sum(s);
}

extern "C" __global__ void __launch_bounds__(1024)
    fuse_hc_finish4w(float *pre, float *post, float *comb, float *__restrict__ a, const float *__restrict__ xs,
                     const float *__restrict__ w, const float *__restrict__ part, const float *base,
                     const float *scale, int dim, int nm, int S, int iters, float eps, float normEps, int head,
                     float rmsEps) {
  MOXIE_PDL_PF(w, w ? 4LL * dim : 0LL);  // the norm weight (a weight: no kernel writes it)
  __shared__ float dot[HC_MAXNM + 1];
  __shared__ float cm[HC_MAXNM];
  __shared__ float red[32];
  const size_t b = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, nw = blockDim.x >> 5;
  const float *pb = part + b * (nm + 1) * S;
  if (!head && blockIdx.y == 0) {
    for (int r = wid; r <= nm; r += nw) {
      const float v = hcf4w_row_sum(pb + (size_t)r * S, S);
      if (lane == 0) dot[r] = v;
    }
    __syncthreads();
    if (tid >= 64) return;
    const float rho = 1.0f / sqrtf(dot[nm] / (float)(4 * dim) + normEps);
    hc_gates_sinkhorn(pre, post, comb, dot, dot + 4, dot + 8, rho, base, scale, 4, iters, eps, 0, b, cm);
    return;
  }
  float xv[4][4], wv[4];
  hcf4_load_x(xs, w, b, dim, xv, wv);
  for (int r = wid; r < 5; r += nw) {  // rows 0–3, then nm into dot[4]
    const float v = hcf4w_row_sum(pb + (size_t)(r < 4 ? r : nm) * S, S);
    if (lane == 0) dot[r] = v;
  }
  __syncthreads();
  float g = 0.f;
  if (lane < 4) {
    const float rho = 1.0f / sqrtf(dot[4] / (float)(4 * dim) + normEps);
    g = hc_pre_gate(dot[lane], rho, scale, base, lane, eps);
    if (head && wid == 0) pre[b * 4 + lane] = g;
  }
  hcf4_collapse(g, xv, wv, a, w, b, dim, rmsEps, red);
}

// ---------------------------------------------------------------------------
// fuse_hc_one: the whole sublayer boundary of fuse_hc_dots + fuse_hc_finish
// (or hc_split_dots + fuse_hc_finish without the expand) in one kernel, with
// the same float32 operations in the same order, so the same bits.
//
// Grid (ceil(groups·S / V), 1, ceil(batch / HCS_TB)), blockDim V·vthreads +
// 32 (V·vthreads <= HCO_MAXDOTS). Each block runs V "virtual" blocks of
// hc_split_dots (vthreads threads each, the launch shape of hcSplitShape):
// virtual block vb = blockIdx.x·V + sub is hc_split_dots's block (g, s) =
// (vb / S, vb mod S) of token group blockIdx.z, reducing its partials exactly
// as hc_split_dots_body does (per thread over its quads, warp shuffles, the
// virtual block's warps in order); the streams are x' (formed as
// hc_x_expand forms them; virtual blocks of row group 0 store it in xout) or
// x. The last warp idles through this phase. Each block then adds one to
// ctr[blockIdx.z]; the block that brings it to gridDim.x (the last one to
// finish its partials) resets it to zero (so the kernel replays in a CUDA
// graph) and finishes the token group alone:
//   - all threads sum the partials as hc_split_finish does (index order);
//   - the last warp runs the Sinkhorn of every token of the group (hc = 4:
//     two tokens per pass, 16 lanes each, hc_sinkhorn_warp's operations;
//     other hc: one lane per token, hc_gates_sinkhorn's serial operations,
//     which are the warp path's too);
//   - meanwhile the other warps (the "collapse warps", C = V·vthreads / 32)
//     form the gates (hc_pre_gate; post as hc_gates_sinkhorn), collapse
//     (HCCollapse's order) and RMS-normalise each token in the rmsnorm
//     kernel's order for its block of vt threads: collapse warp c plays the
//     rmsnorm block's warps c, c + C, …, each lane its thread.
// ctr must be zero before the first launch. Old post/comb are read before
// any block arrives at the counter and the new ones written after all have,
// so PostOut/CombOut may be Post/Comb; A may be O for the same reason.

#define HCO_MAXDOTS 256  // V·vthreads at most (HCO_MAXTHREADS − the Sinkhorn warp)
#define HCO_MAXTHREADS (HCO_MAXDOTS + 32)

struct HCOneArgs {
  float *part;  // [batch, nm+1, S]
  int *ctr;     // [ceil(batch / HCS_TB)], zero between launches
  const float *x, *o, *post0, *comb0;  // o null: no expand (post0, comb0, xout unused)
  float *xout;
  const void *fn;
  float *pre, *post, *comb, *a;
  const float *w, *base, *scale;
  int fmt, n, nm, cq, rb, batch, hc, dim, S, groups, V, vthreads, iters, head, vt;
  float eps, normEps, rmsEps;
};
static_assert(sizeof(HCOneArgs) == 192, "hcOneArgs in fuse.go mirrors this layout");

// hco_x: quad q of token b's streams: x' = post·o + combᵀ·x (hc_x_expand's
// operations) or x. Plain (coherent) loads: the last block writes post and
// comb, which may be post0 and comb0.
template <int HCC>
__device__ __forceinline__ float4 hco_x(const HCOneArgs &p, size_t b, int q) {
  if (!p.o) return __ldcg((const float4 *)(p.x + b * p.n) + q);
  const int H = HCC > 0 ? HCC : p.hc;
  const int dim = p.dim;
  const int c = q << 2;
  const int k = c / dim, i = c - k * dim;
  const float4 ov = __ldcg((const float4 *)(p.o + b * dim + i));
  const float pk = __ldcg(p.post0 + b * H + k);
  const float *cb = p.comb0 + b * H * H + k;
  const float *xb = p.x + b * H * dim + i;
  float4 s = make_float4(__fmul_rn(pk, ov.x), __fmul_rn(pk, ov.y), __fmul_rn(pk, ov.z), __fmul_rn(pk, ov.w));
  if (HCC > 0) {
    float4 xj[HCC > 0 ? HCC : 1];
    float cj[HCC > 0 ? HCC : 1];
#pragma unroll
    for (int j = 0; j < HCC; j++) {
      xj[j] = __ldcg((const float4 *)(xb + (size_t)j * dim));
      cj[j] = __ldcg(cb + j * H);
    }
#pragma unroll
    for (int j = 0; j < HCC; j++) {
      s.x = __fmaf_rn(cj[j], xj[j].x, s.x);
      s.y = __fmaf_rn(cj[j], xj[j].y, s.y);
      s.z = __fmaf_rn(cj[j], xj[j].z, s.z);
      s.w = __fmaf_rn(cj[j], xj[j].w, s.w);
    }
  } else {
    for (int j = 0; j < H; j++) {
      const float4 xv = __ldcg((const float4 *)(xb + (size_t)j * dim));
      const float cv = __ldcg(cb + j * H);
      s.x = __fmaf_rn(cv, xv.x, s.x);
      s.y = __fmaf_rn(cv, xv.y, s.y);
      s.z = __fmaf_rn(cv, xv.z, s.z);
      s.w = __fmaf_rn(cv, xv.w, s.w);
    }
  }
  return s;
}

// hco_dots: the split-K partials of this block's virtual blocks (see
// fuse_hc_one); red is the block's [HCO_MAXDOTS] shared scratch.
template <int HCC, bool BF>
__device__ __forceinline__ void hco_dots(const HCOneArgs &p, float *red) {
  const int tid = threadIdx.x, vth = p.vthreads;
  const int sub = tid / vth, lt = tid - sub * vth;
  const int vb = blockIdx.x * p.V + sub;
  const int S = p.S, nm = p.nm, n = p.n;
  const bool act = sub < p.V && vb < p.groups * S;  // uniform over each warp
  const int g = act ? vb / S : 0, s = act ? vb - g * S : 0;
  const int r0 = g * p.rb, b0 = blockIdx.z * HCS_TB;
  const int nr = min(p.rb, nm + 1 - r0), nt = min(HCS_TB, p.batch - b0);
  const int nq = n >> 2, q0 = s * p.cq, q1 = act ? min(q0 + p.cq, nq) : q0;
  const bool store = p.o && g == 0;
  float acc[HCS_RB][HCS_TB];
#pragma unroll
  for (int j = 0; j < HCS_RB; j++)
#pragma unroll
    for (int t = 0; t < HCS_TB; t++) acc[j][t] = 0.f;
  for (int q = q0 + lt; q < q1; q += vth) {
    const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
    float4 xv[HCS_TB], f[HCS_RB];
#pragma unroll
    for (int t = 0; t < HCS_TB; t++) xv[t] = t < nt ? hco_x<HCC>(p, (size_t)b0 + t, q) : z;
#pragma unroll
    for (int j = 0; j < HCS_RB; j++) {
      const int r = r0 + j;
      f[j] = z;
      if (j < nr && r < nm) {
        if (BF) {
          const uint2 w = __ldg((const uint2 *)((const u16 *)p.fn + (size_t)r * n) + q);
          f[j] = make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u),
                             __uint_as_float(w.y << 16), __uint_as_float(w.y & 0xffff0000u));
        } else {
          f[j] = __ldg((const float4 *)((const float *)p.fn + (size_t)r * n) + q);
        }
      }
    }
    if (store) {
#pragma unroll
      for (int t = 0; t < HCS_TB; t++)
        if (t < nt) *((float4 *)(p.xout + ((size_t)b0 + t) * n) + q) = xv[t];
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
  const int lane = tid & 31, wl = lt >> 5, nwv = vth >> 5;
  float *rs = red + sub * (HCS_RB * HCS_TB) * nwv;  // this virtual block's [HCS_RB·HCS_TB][nwv]
  if (act) {
#pragma unroll
    for (int j = 0; j < HCS_RB; j++)
#pragma unroll
      for (int t = 0; t < HCS_TB; t++)
        if (j < nr && t < nt) {
          const float v = warp_sum(acc[j][t]);
          if (lane == 0) rs[(j * HCS_TB + t) * nwv + wl] = v;
        }
  }
  __syncthreads();
  if (act && lt < HCS_RB * HCS_TB) {
    const int j = lt / HCS_TB, t = lt % HCS_TB;
    if (j < nr && t < nt) {
      float v = 0.f;
      for (int k = 0; k < nwv; k++) v += rs[lt * nwv + k];
      p.part[((size_t)(b0 + t) * (nm + 1) + r0 + j) * S + s] = v;
    }
  }
}

// hco_sinkhorn4: the Sinkhorn of hc_sinkhorn_warp<4> for the tokens t0 and
// t0 + 1 of the group (lanes 0–15 and 16–31; a lane whose token is past nt
// computes on t0's values and stores nothing). The row and column sums add
// the gathered values left to right as hc_sinkhorn_warp does after its 0
// (every value is positive, so the 0 changes no bit).
__device__ __forceinline__ void hco_sinkhorn4(const HCOneArgs &p, const float (*dot)[HC_MAXNM + 1], int b0, int t0,
                                              int nt) {
  const int lane = threadIdx.x & 31, hb = lane & 16, e = lane & 15;
  const int j = e >> 2, k = e & 3;
  const bool ok = t0 + (lane >> 4) < nt;
  const int t = ok ? t0 + (lane >> 4) : t0;
  const float rho = 1.0f / sqrtf(dot[t][p.nm] / (float)p.n + p.normEps);
  const float L = __fadd_rn(__fmul_rn(dot[t][8 + e] * rho, p.scale[2]), p.base[8 + e]);
  float g[4];
#pragma unroll
  for (int kk = 0; kk < 4; kk++) g[kk] = __shfl_sync(FULL, L, hb + j * 4 + kk);
  float mx = -__int_as_float(0x7f800000);
#pragma unroll
  for (int kk = 0; kk < 4; kk++) mx = fmaxf(mx, g[kk]);
  const float ex = (float)exp((double)(L - mx));
#pragma unroll
  for (int kk = 0; kk < 4; kk++) g[kk] = __shfl_sync(FULL, ex, hb + j * 4 + kk);
  float v = ex / (((g[0] + g[1]) + g[2]) + g[3]) + p.eps;
  const int its = p.iters < 1 ? 1 : p.iters;
  const float eps = p.eps;
  for (int it = 0; it < its; it++) {
    if (it > 0) {
#pragma unroll
      for (int kk = 0; kk < 4; kk++) g[kk] = __shfl_sync(FULL, v, hb + j * 4 + kk);
      v = v / ((((g[0] + g[1]) + g[2]) + g[3]) + eps);
    }
#pragma unroll
    for (int jj = 0; jj < 4; jj++) g[jj] = __shfl_sync(FULL, v, hb + jj * 4 + k);
    v = v / ((((g[0] + g[1]) + g[2]) + g[3]) + eps);
  }
  if (ok) p.comb[((size_t)b0 + t) * 16 + e] = v;
}

// hco_sinkhorn_serial: hc_gates_sinkhorn's serial Sinkhorn for token t of
// the group on one thread (c: its [hc·hc] shared scratch).
__device__ __forceinline__ void hco_sinkhorn_serial(const HCOneArgs &p, const float *d, float *c, size_t b) {
  const int hc = p.hc, hh = hc * hc;
  const float rho = 1.0f / sqrtf(d[p.nm] / (float)p.n + p.normEps);
  const float eps = p.eps;
  for (int jk = 0; jk < hh; jk++) c[jk] = __fadd_rn(__fmul_rn(d[2 * hc + jk] * rho, p.scale[2]), p.base[2 * hc + jk]);
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
  const int its = p.iters < 1 ? 1 : p.iters;
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
  float *cb = p.comb + b * hh;
  for (int jk = 0; jk < hh; jk++) cb[jk] = c[jk];
}

__device__ __forceinline__ void hco_bar(int threads) { asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory"); }

// HCO_KV, HCO_KE: the register-resident collapse of hc = 4 covers up to
// HCO_KV rmsnorm warps per collapse warp and HCO_KE elements per rmsnorm
// thread (V4: 8 collapse warps, 32 rmsnorm warps, 4 elements each).
#define HCO_KV 4
#define HCO_KE 4

// hco_collapse_norm: the collapse warps' part of the finish for token t of
// the group (see fuse_hc_one). nred is the [32] shared scratch of the
// rmsnorm warps' sums.
template <int HCC>
__device__ __forceinline__ void hco_collapse_norm(const HCOneArgs &p, const float *d, size_t b, float *nred) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int C = (p.V * p.vthreads) >> 5;
  const int hc = HCC > 0 ? HCC : p.hc, dim = p.dim, VT = p.vt, NVW = VT >> 5;
  const float rho = 1.0f / sqrtf(d[p.nm] / (float)p.n + p.normEps);
  float gv = 0.f;
  if (lane < hc) {
    gv = hc_pre_gate(d[lane], rho, p.scale, p.base, lane, p.eps);
  } else if (!p.head && lane < 2 * hc) {
    const float m2 = d[lane] * rho;
    gv = 2.0f * sigmoidf_(m2 * p.scale[1] + p.base[lane]);
  }
  if (warp == 0) {
    if (lane < hc)
      p.pre[b * hc + lane] = gv;
    else if (!p.head && lane < 2 * hc)
      p.post[b * hc + lane - hc] = gv;
  }
  const float *xb = (p.o ? p.xout : p.x) + b * hc * dim;
  float *ab = p.a + b * dim;
  const float *w = p.w;
  if (HCC > 0 && C * HCO_KV >= NVW && dim <= HCO_KE * VT) {
    float pw[HCC > 0 ? HCC : 1];
#pragma unroll
    for (int j = 0; j < (HCC > 0 ? HCC : 1); j++) pw[j] = __shfl_sync(FULL, gv, j);
    float keep[HCO_KV][HCO_KE], ssw[HCO_KV];
#pragma unroll
    for (int k = 0; k < HCO_KV; k++) {
      const int vw = warp + k * C;
      float ss = 0.f;
#pragma unroll
      for (int u = 0; u < HCO_KE; u++) {
        const int i = vw * 32 + lane + u * VT;
        keep[k][u] = 0.f;
        if (vw < NVW && i < dim) {
          float v = 0.f;
#pragma unroll
          for (int j = 0; j < (HCC > 0 ? HCC : 1); j++) v = __fmaf_rn(pw[j], __ldcg(xb + (size_t)j * dim + i), v);
          keep[k][u] = v;
          ss += v * v;
        }
      }
      ssw[k] = ss;
    }
#pragma unroll
    for (int k = 0; k < HCO_KV; k++) {
      const int vw = warp + k * C;
      if (vw < NVW) {  // uniform over the warp
        const float r = warp_sum(ssw[k]);
        if (lane == 0) nred[vw] = r;
      }
    }
    hco_bar(C * 32);
    float ss = 0.f;
    for (int i = 0; i < NVW; i++) ss += nred[i];  // block_sum's order
    const float inv = 1.0f / sqrtf(ss / (float)dim + p.rmsEps);
#pragma unroll
    for (int k = 0; k < HCO_KV; k++) {
      const int vw = warp + k * C;
#pragma unroll
      for (int u = 0; u < HCO_KE; u++) {
        const int i = vw * 32 + lane + u * VT;
        if (vw < NVW && i < dim) {
          const float v = keep[k][u] * inv;
          ab[i] = w ? w[i] * v : v;
        }
      }
    }
  } else {
    float pw[HC_MAXNM / 8];  // hc <= 10 (OpsMaxHCRows)
    for (int j = 0; j < hc && j < HC_MAXNM / 8; j++) pw[j] = __shfl_sync(FULL, gv, j);
    for (int vw = warp; vw < NVW; vw += C) {
      float ss = 0.f;
      for (int i = vw * 32 + lane; i < dim; i += VT) {
        float v = 0.f;
        for (int j = 0; j < hc; j++) v = __fmaf_rn(pw[j], __ldcg(xb + (size_t)j * dim + i), v);
        ab[i] = v;
        ss += v * v;
      }
      const float r = warp_sum(ss);
      if (lane == 0) nred[vw] = r;
    }
    hco_bar(C * 32);
    float ss = 0.f;
    for (int i = 0; i < NVW; i++) ss += nred[i];
    const float inv = 1.0f / sqrtf(ss / (float)dim + p.rmsEps);
    for (int vw = warp; vw < NVW; vw += C)
      for (int i = vw * 32 + lane; i < dim; i += VT) {
        const float v = ab[i] * inv;  // this thread's own store above
        ab[i] = w ? w[i] * v : v;
      }
  }
  hco_bar(C * 32);  // nred is free for the next token
}

// hco_finish: the finish of token group blockIdx.z from its partials (see
// fuse_hc_one; also fuse_hcp_finish's whole work): every thread of the
// block calls it; dot, cm and nred are the block's shared scratch.
template <int HCC>
__device__ __forceinline__ void hco_finish(const HCOneArgs &p, float (*dot)[HC_MAXNM + 1], float (*cm)[HC_MAXNM],
                                           float *nred) {
  const int b0 = blockIdx.z * HCS_TB, nt = min(HCS_TB, p.batch - b0);
  const int S = p.S, np1 = p.nm + 1;
  for (int i = threadIdx.x; i < nt * np1; i += blockDim.x) {
    const int t = i / np1, r = i - t * np1;
    const float *pp = p.part + ((size_t)(b0 + t) * np1 + r) * S;
    float v[HCS_MAXS];
#pragma unroll
    for (int k = 0; k < HCS_MAXS; k++) v[k] = k < S ? __ldcg(pp + k) : 0.f;  // every load in flight at once
    float s = 0.f;  // hc_split_finish's order
#pragma unroll
    for (int k = 0; k < HCS_MAXS; k++)
      if (k < S) s += v[k];
    dot[t][r] = s;
  }
  __syncthreads();
  const int C = (p.V * p.vthreads) >> 5;
  if ((int)(threadIdx.x >> 5) >= C) {  // the Sinkhorn warp
    if (p.head) return;
    if (HCC == 4) {
      for (int t0 = 0; t0 < nt; t0 += 2) hco_sinkhorn4(p, dot, b0, t0, nt);
    } else {
      const int t = threadIdx.x & 31;
      if (t < nt) hco_sinkhorn_serial(p, dot[t], cm[t], (size_t)b0 + t);
    }
    return;
  }
  for (int t = 0; t < nt; t++) hco_collapse_norm<HCC>(p, dot[t], (size_t)b0 + t, nred);
}

template <int HCC>
__device__ __forceinline__ void fuse_hc_one_hc(const HCOneArgs &p) {
  __shared__ float red[HCO_MAXDOTS];
  __shared__ float dot[HCS_TB][HC_MAXNM + 1];
  __shared__ float cm[HCS_TB][HC_MAXNM];
  __shared__ float nred[32];
  __shared__ int last;
  if (p.fmt == 3)
    hco_dots<HCC, true>(p, red);
  else
    hco_dots<HCC, false>(p, red);
  // The block's arrival, as a grid barrier arrives (cooperative groups):
  // the block's partials and x' quads are ordered before thread 0's fence
  // by the barrier, and the last block's reads after its own fence.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const bool l = atomicAdd(p.ctr + blockIdx.z, 1) == (int)gridDim.x - 1;
    if (l) {
      __threadfence();
      atomicExch(p.ctr + blockIdx.z, 0);  // every block has arrived: zero for the next launch
    }
    last = l;
  }
  __syncthreads();
  if (!last) return;
  hco_finish<HCC>(p, dot, cm, nred);
}

// fuse_hc_one4: hc = 4 (DeepSeek-V4); fuse_hc_one: any hc.
extern "C" __global__ void __launch_bounds__(HCO_MAXTHREADS) fuse_hc_one4(const HCOneArgs p) {
  MOXIE_PDL();
  fuse_hc_one_hc<4>(p);
}
extern "C" __global__ void __launch_bounds__(HCO_MAXTHREADS) fuse_hc_one(const HCOneArgs p) {
  MOXIE_PDL();
  fuse_hc_one_hc<0>(p);
}

// ---------------------------------------------------------------------------
// Prefill boundary (many tokens): fuse_hcp_dots writes the partials that
// fuse_hc_dots (or hc_split_dots without the expand) writes, bit for bit,
// with far fewer re-reads; fuse_hcp_finish4 / fuse_hcp_finish then run
// fuse_hc_one's finish (hco_finish) once per token group.
//
// The partial of (token b, row r, split s) is, in hc_split_dots's launch
// shape (splits of cq quads, vthreads = max(32, cq rounded up to 32) <= 256
// threads, so one quad per thread): per quad a leaf dot4(f, x', 0) (0 past
// the split's end), the butterfly sum of warp_sum over the 32 leaves of each
// warp chunk (lane l: quad 32·w + l of the split), then (0 + W_0) + W_1 + …
// over the chunks. fuse_hcp_dots computes exactly that tree on one thread
// per (token, row): the leaves in bit-reversed lane order make warp_sum's
// xor steps (16, 8, 4, 2, 1) an ordinary binary tree over consecutive
// leaves, summed with a 5-level stack (float addition commutes bit for
// bit, so a + b = b + a).
//
// Grid (ceil(S / spb), ceil(batch / HCP_TM)); blockDim nw·32 with nw warps
// each owning rows warp, warp + nw, … (at most HCP_RPW; rpw = p.rb, spb =
// p.groups). Block (g, z) covers tokens [z·HCP_TM, …) and the splits
// [g·spb, min(S, (g+1)·spb)); per warp chunk it stages x' [HCP_TM tokens][32
// quads] (formed as hc_x_expand forms it and stored to xout: each (token,
// quad) by one block; hco_x's operations, which are hc_x_expand's) and Fn
// [nm][32 quads] in shared memory, then each lane reduces tokens lane and
// lane + 32 against its warp's rows. Needs nm <= HCP_MAXNM, cq <= 256,
// n % 4 == 0, 16-byte aligned x, o, xout, Fn (8-byte BF16). Known cost: x'
// at any column reads all hc streams of x there, and a block forms one
// stream's x' per split: x and o pass through L2 hc times (once from HBM
// when one token tile's blocks, which run side by side as the grid orders
// them, keep them in L2).

#define HCP_TM 64     // tokens per block
#define HCP_RPW 5     // rows per warp at most
#define HCP_MAXNM 24  // Fn rows at most (the Σx² row is extra)
#define HCP_XS 33     // staged x' row stride in quads (conflict-free LDS.128 per quarter warp)

// hcp_chunk: the 32 leaves of one warp chunk for rpw rows and the two
// tokens of this lane, folded into the chunk sums w[j][t] (bit-reversed
// lane order, stack st).
__device__ __forceinline__ void hcp_chunk(float4 (*xs)[HCP_XS], float4 (*fs)[32], int lane, int warp,
                                          int nw, int rpw, int nm, float (&w)[HCP_RPW][2]) {
  float st[HCP_RPW][2][5];
#pragma unroll
  for (int m = 0; m < 32; m++) {
    const int l = ((m & 1) << 4) | ((m & 2) << 2) | (m & 4) | ((m & 8) >> 2) | ((m & 16) >> 4);
    const float4 xa = xs[lane][l], xb = xs[lane + 32][l];
#pragma unroll
    for (int j = 0; j < HCP_RPW; j++) {
      const int r = warp + j * nw;
      if (j < rpw && r <= nm) {  // uniform over the warp
        float v[2];
        if (r == nm) {  // the Σx² row
          v[0] = dot4(xa, xa, 0.f);
          v[1] = dot4(xb, xb, 0.f);
        } else {
          const float4 f = fs[r][l];
          v[0] = dot4(f, xa, 0.f);
          v[1] = dot4(f, xb, 0.f);
        }
#pragma unroll
        for (int t = 0; t < 2; t++) {
          float a = v[t];
#pragma unroll
          for (int k = 0; k < 5; k++) {
            if (m & (1 << k)) {
              a = st[j][t][k] + a;
            } else {
              st[j][t][k] = a;
              break;
            }
          }
          if (m == 31) w[j][t] = a;
        }
      }
    }
  }
}

template <int HCC, bool BF>
__device__ __forceinline__ void hcp_dots(const HCOneArgs &p, float4 (*xs)[HCP_XS], float4 (*fs)[32]) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int bs = blockDim.x, nw = bs >> 5;
  const int nm = p.nm, n = p.n, nq = n >> 2, cq = p.cq, S = p.S, rpw = p.rb;
  const int cw = (p.vthreads + 31) >> 5;  // warp chunks per split
  const int b0 = blockIdx.y * HCP_TM;
  const int s0 = blockIdx.x * p.groups, s1 = min(S, s0 + p.groups);
  const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s = s0; s < s1; s++) {
    const int q1 = min(s * cq + cq, nq);
    float P[HCP_RPW][2];
#pragma unroll
    for (int j = 0; j < HCP_RPW; j++) P[j][0] = P[j][1] = 0.f;
    for (int c = 0; c < cw; c++) {
      const int qc = s * cq + 32 * c;                    // the chunk's first quad
      const int lim = min(min(32, cq - 32 * c), q1 - qc);  // its quads (<= 0: none)
      // Stage x' (or x) of HCP_TM tokens and the Fn rows; zeros past lim
      // and past the batch.
#pragma unroll 4
      for (int i = tid; i < HCP_TM * 32; i += bs) {
        const int t = i >> 5, l = i & 31;
        float4 v = z;
        if (l < lim && b0 + t < p.batch) {
          const size_t b = (size_t)b0 + t;
          v = hco_x<HCC>(p, b, qc + l);
          if (p.o) *((float4 *)(p.xout + b * n) + qc + l) = v;
        }
        xs[t][l] = v;
      }
#pragma unroll 2
      for (int i = tid; i < nm * 32; i += bs) {
        const int r = i >> 5, l = i & 31;
        float4 f = z;
        if (l < lim) {
          if (BF) {
            const uint2 w = __ldg((const uint2 *)((const u16 *)p.fn + (size_t)r * n) + qc + l);
            f = make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u),
                            __uint_as_float(w.y << 16), __uint_as_float(w.y & 0xffff0000u));
          } else {
            f = __ldg((const float4 *)((const float *)p.fn + (size_t)r * n) + qc + l);
          }
        }
        fs[r][l] = f;
      }
      __syncthreads();
      float w[HCP_RPW][2];
      hcp_chunk(xs, fs, lane, warp, nw, rpw, nm, w);
#pragma unroll
      for (int j = 0; j < HCP_RPW; j++) {
        P[j][0] += w[j][0];  // hc_split_dots_body's order over the warps: 0 + W_0 + W_1 + …
        P[j][1] += w[j][1];
      }
      __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < HCP_RPW; j++) {
      const int r = warp + j * nw;
      if (j < rpw && r <= nm) {
#pragma unroll
        for (int t = 0; t < 2; t++) {
          const int b = b0 + lane + 32 * t;
          if (b < p.batch) p.part[((size_t)b * (nm + 1) + r) * S + s] = P[j][t];
        }
      }
    }
  }
}

extern "C" __global__ void __launch_bounds__(256, 1) fuse_hcp_dots(const HCOneArgs p) {
  MOXIE_PDL();
  __shared__ float4 xs[HCP_TM][HCP_XS];  // 33 KiB
  __shared__ float4 fs[HCP_MAXNM][32];   // 12 KiB
  if (p.hc == 4) {
    if (p.fmt == 3)
      hcp_dots<4, true>(p, xs, fs);
    else
      hcp_dots<4, false>(p, xs, fs);
  } else if (p.fmt == 3) {
    hcp_dots<0, true>(p, xs, fs);
  } else {
    hcp_dots<0, false>(p, xs, fs);
  }
}

// fuse_hcp_finish4 (hc = 4) / fuse_hcp_finish: fuse_hc_one's finish
// (hco_finish) of token group blockIdx.z from fuse_hcp_dots's partials;
// grid (1, 1, ceil(batch / HCS_TB)), blockDim V·vthreads + 32.
template <int HCC>
__device__ __forceinline__ void fuse_hcp_finish_hc(const HCOneArgs &p) {
  __shared__ float dot[HCS_TB][HC_MAXNM + 1];
  __shared__ float cm[HCS_TB][HC_MAXNM];
  __shared__ float nred[32];
  hco_finish<HCC>(p, dot, cm, nred);
}
extern "C" __global__ void __launch_bounds__(HCO_MAXTHREADS, 3) fuse_hcp_finish4(const HCOneArgs p) {
  MOXIE_PDL();
  fuse_hcp_finish_hc<4>(p);
}
extern "C" __global__ void __launch_bounds__(HCO_MAXTHREADS, 3) fuse_hcp_finish(const HCOneArgs p) {
  MOXIE_PDL();
  fuse_hcp_finish_hc<0>(p);
}

// ---------------------------------------------------------------------------
// fuse_rows: up to FUSE_MAXROWOPS independent row operations in one launch
// (RowOps in fuse.go), one block per row; block r belongs to the first op
// whose rows it falls in. For row r of op g (token t = r / heads, at
// position pos[t]):
//   v = x_r;
//   FR_NORM:  v = RMS(v; w) (w null: unweighted) in the rmsnorm kernel's
//             order for a block of g.vb threads (thread-strided Σv², the
//             warps' sums in order; threads vb.. add zeros, which leave a
//             sum of squares as it is), w·(v·inv);
//   nf > 0:   the last 2·nf dims rotated as the rope kernel rotates them
//             (angle float(pos[t])·freq[p] in float32, cos/sin in double);
//   FR_SCALE: v = v·a (the scale_f32 kernel's product);
// written to y_r, or with ring_rows > 0 to row (pos[t] mod ring_rows)·heads
// + r mod heads of the ring y. y may be x (every element is read by the
// thread that writes it, after the reduction); the ops run concurrently, so
// no op may write what another reads or writes. blockDim: at least every
// normalising op's vb, a multiple of 32.
#define FUSE_MAXROWOPS 4
#define FR_KEEP 4  // elements a thread loads before its first store
#define FR_NORM 1
#define FR_SCALE 2

struct FuseRow {
  float *y;
  const float *x, *w;
  const int *pos;
  const float *freq;
  int rows, heads, dim, nf, ring_rows, flags, vb;
  float eps, a;
  int pad_;
};

struct FuseRows {
  FuseRow op[FUSE_MAXROWOPS];
  int n;
};
static_assert(sizeof(FuseRow) == 80 && sizeof(FuseRows) == 328, "fuseRow/fuseRows in fuse.go mirror these layouts");

extern "C" __global__ void fuse_rows(const FuseRows p) {
  MOXIE_PDL();
  __shared__ float red[32];
  int r = blockIdx.x, k = 0;
  while (k + 1 < p.n && r >= p.op[k].rows) r -= p.op[k++].rows;
  FuseRow g = p.op[0];
#pragma unroll
  for (int i = 1; i < FUSE_MAXROWOPS; i++)
    if (i == k) g = p.op[i];
  const int dim = g.dim, bd = blockDim.x;
  const size_t t = (size_t)r / g.heads;
  const int h = r % g.heads;
  const float *xr = g.x + (size_t)r * dim;
  const int p0 = g.pos ? g.pos[t] : 0;
  float *yr = g.ring_rows > 0 ? g.y + ((size_t)(p0 % g.ring_rows) * g.heads + h) * dim : g.y + (size_t)r * dim;
  const bool norm = g.flags & FR_NORM, scl = g.flags & FR_SCALE;
  float inv = 1.f;
  if (norm) {
    float ss = 0.f;
    if (threadIdx.x < g.vb) {
#pragma unroll 4
      for (int i = threadIdx.x; i < dim; i += g.vb) {
        float v = xr[i];
        ss += v * v;
      }
    }
    ss = block_sum(ss, red);
    inv = 1.0f / sqrtf(ss / (float)dim + g.eps);
  }
  const int r0 = dim - 2 * g.nf;
  if (norm || scl || yr != xr) {
    // The first FR_KEEP elements of a thread: every load before the first
    // store (y may be x, so a loop of load, store waits for memory once per
    // element); the same operations.
    float xv[FR_KEEP], wv[FR_KEEP];
#pragma unroll
    for (int u = 0; u < FR_KEEP; u++) {
      const int i = threadIdx.x + u * bd;
      xv[u] = i < r0 ? xr[i] : 0.f;
      wv[u] = i < r0 && norm && g.w ? g.w[i] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < FR_KEEP; u++) {
      const int i = threadIdx.x + u * bd;
      if (i < r0) {
        float v = xv[u];
        if (norm) {
          v = v * inv;
          v = g.w ? wv[u] * v : v;
        }
        if (scl) v = v * g.a;
        yr[i] = v;
      }
    }
    for (int i = threadIdx.x + FR_KEEP * bd; i < r0; i += bd) {
      float v = xr[i];
      if (norm) {
        v = v * inv;
        v = g.w ? g.w[i] * v : v;
      }
      if (scl) v = v * g.a;
      yr[i] = v;
    }
  }
  const float fp = (float)p0;
  for (int q = threadIdx.x; q < g.nf; q += bd) {
    const int e = r0 + 2 * q;
    float re = xr[e], im = xr[e + 1];
    if (norm) {
      re = re * inv;
      im = im * inv;
      if (g.w) {
        re = g.w[e] * re;
        im = g.w[e + 1] * im;
      }
    }
    const float ang = __fmul_rn(fp, g.freq[q]);
    double sd, cd;
    sincos((double)ang, &sd, &cd);
    const float c = (float)cd, s = (float)sd;
    float o0 = re * c - im * s;
    float o1 = re * s + im * c;
    if (scl) {
      o0 = o0 * g.a;
      o1 = o1 * g.a;
    }
    yr[e] = o0;
    yr[e + 1] = o1;
  }
}
