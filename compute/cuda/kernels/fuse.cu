// Fused small-kernel chains of a decode step (compute/cuda/fuse.go). This
// file is compiled after kernels/ops.cu in one module (the "fuse" module):
// it uses ops.cu's helpers (block_sum, hc_gates_sinkhorn,
// hc_split_dots_body, HC_MAXNM, HCS_*) and launches ops.cu's hc_split_dots
// for the boundary without an expand. Every fused kernel computes what the
// chain of unfused ops computes, in the same float32 order where the
// comments say so.

// ---------------------------------------------------------------------------
// Sublayer boundary: HCExpand → HCMix (split-K) → HCCollapse → RMSNorm in two
// kernels.
//
// fuse_hc_dots: hc_split_dots over the expanded streams x' = post·o + combᵀ·x
// (HCExpand's order: fma(comb[hc−1, k], x[hc−1], … fma(comb[0, k], x[0],
// post[k]·o))), formed per quad as the dots read them; blocks of row group 0
// also store x' into xout (each quad of each token exactly once). Same grid,
// shape and summation order as hc_split_dots, so the partials are the bits
// that HCExpand followed by hc_split_dots gives. Needs dim % 4 == 0, x, o
// and xout 16-byte aligned; xout must not overlap x, o, post or comb.
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
// expand); a must not overlap xs, pre, post or comb.

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

extern "C" __global__ void fuse_hc_dots(float *__restrict__ part, const float *__restrict__ x,
                                        const float *__restrict__ o, const float *__restrict__ post,
                                        const float *__restrict__ comb, float *__restrict__ xout,
                                        const void *__restrict__ fn, int fmt, int n, int nm, int cq, int rb, int batch,
                                        int hc, int dim) {
  __shared__ float red[HCS_RB * HCS_TB][32];
  if (hc == 4)
    fuse_hc_dots_hc<4>(part, x, o, post, comb, xout, fn, fmt, n, nm, cq, rb, batch, hc, dim, red);
  else
    fuse_hc_dots_hc<0>(part, x, o, post, comb, xout, fn, fmt, n, nm, cq, rb, batch, hc, dim, red);
}

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
    for (int i = threadIdx.x; i < r0; i += bd) {
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
