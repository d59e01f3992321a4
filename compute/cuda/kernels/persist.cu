// Persistent linear kernels: each warp owns a contiguous range of row groups
// (RB rows each) and walks all their 16-byte-word chunks in order, loading the
// next chunk (of the same or the next group) before decoding the current one,
// so a warp keeps loads in flight across row boundaries and blocks never end
// after a few kilobytes. No shared memory: a warp reduces its own rows.
// This module's source is the definitions part of linear.cu (everything
// before linear_fast: types, LinArgs, decoders) followed by this file.
//
// Status: written after the last GPU session of its author; not yet compiled
// by NVRTC nor run on a GPU (TestLinearShapes and TestMultiLinear cover it).

template <int FMT> struct Wide;
template <> struct Wide<FMT_FP8>   { enum { CPW = 16 }; };
template <> struct Wide<FMT_MXFP8> { enum { CPW = 16 }; };
template <> struct Wide<FMT_MXFP4> { enum { CPW = 32 }; };

__device__ __forceinline__ u32 quarter(const uint4 &w, int q) {
  return q == 0 ? w.x : (q == 1 ? w.y : (q == 2 ? w.z : w.w));
}

template <int FMT, int RB, int U>
__device__ __forceinline__ void p_load(const LinArgs &a, int g, int c, int nw, int lane,
                                       uint4 (&w)[U][RB], float (&sc)[U][RB]) {
  const int CPW = Wide<FMT>::CPW;
#pragma unroll
  for (int r = 0; r < RB; r++) {
    const int row = min(g * RB + r, a.rows - 1);
    const uint4 *wr = reinterpret_cast<const uint4 *>(a.W) + (long long)row * nw;
    const u8 *sr = a.S + (long long)(row >> a.srshift) * a.sstride;
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int kw = c * 32 * U + u * 32 + lane;
      if (kw < nw) {
        w[u][r] = __ldg(wr + kw);
        sc[u][r] = e8m0(__ldg(sr + ((kw * CPW) >> a.scshift)));
      } else {
        w[u][r] = zero<uint4>();
        sc[u][r] = 0.f;
      }
    }
  }
}

template <int FMT, int NB, int RB, int U, int DEC>
__device__ __forceinline__ void p_compute(const LinArgs &a, int g, int c, int nw, int lane,
                                          const uint4 (&w)[U][RB], const float (&sc)[U][RB], float (&acc)[RB][NB]) {
  const int CPW = Wide<FMT>::CPW;
  const int QC = CPW / 4;
  const float *xg = a.x + (long long)((g * RB) / a.rpg) * a.cols;
#pragma unroll
  for (int u = 0; u < U; u++) {
    const int kw = c * 32 * U + u * 32 + lane;
    if (kw >= nw) continue;
    float part[RB][NB];
#pragma unroll
    for (int r = 0; r < RB; r++)
#pragma unroll
      for (int b = 0; b < NB; b++) part[r][b] = 0.f;
#pragma unroll
    for (int q = 0; q < 4; q++) {
      float f[RB][QC];
#pragma unroll
      for (int r = 0; r < RB; r++) Dec<FMT, DEC>::run(quarter(w[u][r], q), f[r]);
#pragma unroll
      for (int b = 0; b < NB; b++) {
        if (NB == 1 || b < a.batch) {
          const float4 *xp = reinterpret_cast<const float4 *>(xg + (long long)b * a.xstride + kw * CPW + q * QC);
          float xv[QC];
#pragma unroll
          for (int h = 0; h < QC / 4; h++) {
            float4 t = __ldg(xp + h);
            xv[4 * h] = t.x; xv[4 * h + 1] = t.y; xv[4 * h + 2] = t.z; xv[4 * h + 3] = t.w;
          }
#pragma unroll
          for (int r = 0; r < RB; r++)
#pragma unroll
            for (int cc = 0; cc < QC; cc++) part[r][b] = fmaf(f[r][cc], xv[cc], part[r][b]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < RB; r++)
#pragma unroll
      for (int b = 0; b < NB; b++) acc[r][b] = fmaf(part[r][b], sc[u][r], acc[r][b]);
  }
}

template <int RB, int NB>
__device__ __forceinline__ void p_flush(const LinArgs &a, int g, int lane, float (&acc)[RB][NB]) {
#pragma unroll
  for (int r = 0; r < RB; r++)
#pragma unroll
    for (int b = 0; b < NB; b++) {
      float v = acc[r][b];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      const int row = g * RB + r;
      if (lane == 0 && row < a.rows && b < a.batch) a.y[(long long)b * a.ystride + row] = v;
      acc[r][b] = 0.f;
    }
}

// One step: prefetch item (gn, cn) into (wn, sn) if there is one, consume
// item (g, c) from (w, s); flush when the item ends its group. Returns false
// at the end of the warp's range.
template <int FMT, int NB, int RB, int U, int DEC>
__device__ __forceinline__ bool p_step(const LinArgs &a, int &g, int &c, int g1, int nw, int nchunks, int lane,
                                       const uint4 (&w)[U][RB], const float (&s)[U][RB],
                                       uint4 (&wn)[U][RB], float (&sn)[U][RB], float (&acc)[RB][NB]) {
  int gn = g, cn = c + 1;
  if (cn == nchunks) { gn = g + 1; cn = 0; }
  const bool more = gn < g1;
  if (more) p_load<FMT, RB, U>(a, gn, cn, nw, lane, wn, sn);
  p_compute<FMT, NB, RB, U, DEC>(a, g, c, nw, lane, w, s, acc);
  if (cn == 0) p_flush<RB, NB>(a, g, lane, acc);
  g = gn;
  c = cn;
  return more;
}

template <int FMT, int NB, int RB, int U, int DEC>
__device__ __forceinline__ void linear_persist(const LinArgs &a, int gw, int tw) {
  const int CPW = Wide<FMT>::CPW;
  const int lane = threadIdx.x & 31;
  const int nw = a.cols / CPW;
  const int nchunks = (nw + 32 * U - 1) / (32 * U);
  const int G = (a.rows + RB - 1) / RB;
  int g = (int)((long long)gw * G / tw);
  const int g1 = (int)((long long)(gw + 1) * G / tw);
  if (g >= g1) return;
  int c = 0;
  uint4 wA[U][RB], wB[U][RB];
  float sA[U][RB], sB[U][RB];
  float acc[RB][NB];
#pragma unroll
  for (int r = 0; r < RB; r++)
#pragma unroll
    for (int b = 0; b < NB; b++) acc[r][b] = 0.f;
  p_load<FMT, RB, U>(a, g, c, nw, lane, wA, sA);
  for (;;) {
    if (!p_step<FMT, NB, RB, U, DEC>(a, g, c, g1, nw, nchunks, lane, wA, sA, wB, sB, acc)) break;
    if (!p_step<FMT, NB, RB, U, DEC>(a, g, c, g1, nw, nchunks, lane, wB, sB, wA, sA, acc)) break;
  }
}

// Blocks of any number of whole warps; warp gw of tw takes row groups
// [gw·G/tw, (gw+1)·G/tw).
#define LINP(FMTN, FMT, NB, RB, U, DEC) \
  extern "C" __global__ void __launch_bounds__(256) linp_##FMTN##_b##NB##_r##RB##_u##U##_d##DEC(LinArgs a) { \
    const int wpb = blockDim.x >> 5; \
    linear_persist<FMT, NB, RB, U, DEC>(a, blockIdx.x * wpb + (threadIdx.x >> 5), gridDim.x * wpb); }
#define LINP_NB(FMTN, FMT, RB, U, DEC) \
  LINP(FMTN, FMT, 1, RB, U, DEC) LINP(FMTN, FMT, 2, RB, U, DEC) LINP(FMTN, FMT, 4, RB, U, DEC) \
  LINP(FMTN, FMT, 8, RB, U, DEC) LINP(FMTN, FMT, 16, RB, U, DEC)

LINP_NB(fp8, FMT_FP8, 1, 2, 0)
LINP_NB(fp8, FMT_FP8, 2, 2, 0)
LINP_NB(mxfp8, FMT_MXFP8, 1, 2, 0)
LINP_NB(mxfp8, FMT_MXFP8, 2, 2, 0)
LINP_NB(mxfp4, FMT_MXFP4, 1, 2, 0)
LINP_NB(mxfp4, FMT_MXFP4, 2, 2, 0)
LINP(fp8, FMT_FP8, 1, 1, 2, 1)
LINP(fp8, FMT_FP8, 1, 2, 2, 1)
LINP(mxfp8, FMT_MXFP8, 1, 1, 2, 1)
LINP(mxfp8, FMT_MXFP8, 1, 2, 2, 1)
LINP(mxfp4, FMT_MXFP4, 1, 1, 2, 1)
LINP(mxfp4, FMT_MXFP4, 1, 2, 2, 1)

// Several matrices: blockIdx.y picks the LinArgs; each gets gridDim.x blocks.
#define LINPM(FMTN, FMT, NB, RB, U, DEC) \
  extern "C" __global__ void __launch_bounds__(256) linpmulti_##FMTN##_b##NB##_r##RB##_u##U##_d##DEC(const LinArgs *__restrict__ all) { \
    const LinArgs a = all[blockIdx.y]; \
    const int wpb = blockDim.x >> 5; \
    linear_persist<FMT, NB, RB, U, DEC>(a, blockIdx.x * wpb + (threadIdx.x >> 5), gridDim.x * wpb); }
#define LINPM_NB(FMTN, FMT, RB, U, DEC) \
  LINPM(FMTN, FMT, 1, RB, U, DEC) LINPM(FMTN, FMT, 2, RB, U, DEC) LINPM(FMTN, FMT, 4, RB, U, DEC) \
  LINPM(FMTN, FMT, 8, RB, U, DEC) LINPM(FMTN, FMT, 16, RB, U, DEC)

LINPM_NB(fp8, FMT_FP8, 2, 2, 0)
LINPM_NB(mxfp4, FMT_MXFP4, 2, 2, 0)
LINPM(fp8, FMT_FP8, 1, 2, 2, 1)
LINPM(mxfp4, FMT_MXFP4, 1, 2, 2, 1)
