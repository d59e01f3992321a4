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
  extern __shared__ float ps[];  // [(nm+1)·S] this token's partials
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
    float s = 0.f;
    for (int i = 0; i < S; i++) s += ps[r * S + i];  // hc_split_finish's order
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
// fuse_rms_rope: block per row r of x [rows, dim] (rows = T·heads; token
// t = r / heads at position pos[t]), blockDim the rmsnorm kernel's for dim:
// y_r = RMS(x_r; w) (w null: unweighted) in the rmsnorm kernel's order, then
// its last 2·nf dims rotated as the rope kernel rotates them (angle
// float(pos[t])·freq[p] in float32, cos/sin in double, pairs (even, odd)).
// ringRows == 0: y [rows, dim] (may be x: every element is read by the
// thread that writes it, after the reduction); ringRows > 0: row r goes to
// y[(pos[t] mod ringRows)·heads + r mod heads] (a ring [ringRows, heads,
// dim], which must not overlap x).
extern "C" __global__ void fuse_rms_rope(float *y, const float *x, const float *w, const int *pos, const float *freq,
                                         int heads, int dim, int nf, float eps, int ringRows) {
  __shared__ float red[32];
  const size_t r = blockIdx.x;
  const size_t t = r / heads;
  const int h = (int)(r % heads);
  const float *xr = x + r * dim;
  const int p0 = pos[t];
  float *yr = ringRows > 0 ? y + ((size_t)(p0 % ringRows) * heads + h) * dim : y + r * dim;
  float ss = 0.f;
#pragma unroll 4
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = xr[i];
    ss += v * v;
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
  const int r0 = dim - 2 * nf;
  for (int i = threadIdx.x; i < r0; i += blockDim.x) {
    float v = xr[i] * inv;
    yr[i] = w ? w[i] * v : v;
  }
  const float fp = (float)p0;
  for (int p = threadIdx.x; p < nf; p += blockDim.x) {
    const int e = r0 + 2 * p;
    const float v0 = xr[e] * inv, v1 = xr[e + 1] * inv;
    const float re = w ? w[e] * v0 : v0, im = w ? w[e + 1] * v1 : v1;
    const float ang = __fmul_rn(fp, freq[p]);
    double sd, cd;
    sincos((double)ang, &sd, &cd);
    const float c = (float)cd, s = (float)sd;
    yr[e] = re * c - im * s;
    yr[e + 1] = re * s + im * c;
  }
}

// ---------------------------------------------------------------------------
// fuse_rope_scale: the rope kernel (forward, in place on x [rows, rowLen],
// segments of dim, last 2·nfreq dims of each) and the scale_f32 kernel
// (y[i] *= a, i < n) in one grid-stride launch; x and y must not overlap.
extern "C" __global__ void fuse_rope_scale(float *x, const int *pos, const float *freq, int rows, int rowLen, int dim,
                                           int nfreq, float *y, float a, long long n) {
  const int segs = rowLen / dim;
  const long long total = (long long)rows * segs * nfreq;
  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total + n;
       t += (long long)gridDim.x * blockDim.x) {
    if (t >= total) {
      y[t - total] *= a;
      continue;
    }
    const int p = (int)(t % nfreq);
    const long long rs = t / nfreq;
    const int seg = (int)(rs % segs);
    const long long row = rs / segs;
    const float ang = __fmul_rn((float)pos[row], freq[p]);
    double sd, cd;
    sincos((double)ang, &sd, &cd);
    const float c = (float)cd, s = (float)sd;
    float *e = x + row * rowLen + (long long)seg * dim + dim - 2 * nfreq + 2 * p;
    const float re = e[0], im = e[1];
    e[0] = re * c - im * s;
    e[1] = re * s + im * c;
  }
}
