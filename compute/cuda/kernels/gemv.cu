// Matrix-vector products for one token (decode): y = W·x for up to
// GEMV_MAX matrices per launch, FP8 blocks (E4M3 codes, E8M0 scales per
// block x block tile) or BF16, optionally grouped (row group g reads the g-th
// slice of x, as GroupedLinear). No headers: NVRTC needs none.
//
// Layout of the work: a block of 8 warps owns whole rows; the warps of a
// row group split its columns (WPR warps per R rows), each lane reading 16
// bytes per row per step, with U steps of all R rows loaded before any is
// used (R·U·16 bytes in flight per lane), x read as float4 through L1 and
// shared by the R rows. A row's sum is the lanes' partial sums reduced by
// shuffles, then the WPR warps' in a fixed order: results do not depend on
// timing.
//
// Each kernel starts with MOXIE_PDL_PF (gemv_pf): before waiting for the
// previous kernel it asks L2 for the first chunk of each warp's rows, so a
// programmatic launch overlaps those fetches with the previous kernel.
//@pdl

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

#define GEMV_MAX 8
#define GEMV_R 2
#define GEMV_WARPS 8

struct GemvMat {
  const u8 *w;      // codes (FP8) or BF16 values, row-major [rows, cols]
  const u8 *s;      // FP8: E8M0 scales [ceil(rows/block), ceil(cols/block)]
  const float *x;   // [groups, cols]
  float *y;         // [rows]
  int rows, cols;   // this matrix's shape
  int rpg;          // rows per group (rows for one group)
  int bshift;       // FP8: log2(block)
  int sstride;      // FP8: scale columns
  int fmt;          // 1 FP8 blocks, 3 BF16
  int wpr;          // warps per row group (1, 2, 4, 8)
  int blk0;         // first block of this matrix in the grid
};

struct GemvArgs {
  GemvMat m[GEMV_MAX];
  int n;
};

__device__ __forceinline__ float gemv_e8m0(u32 s) {
  // 2^(s-127): s = 0 gives 2^-127 and s = 255 NaN, as E8M0 defines them.
  return __int_as_float((s << 23) | ((((s + 1u) & 0xfeu) == 0u) ? 0x00400000u : 0u));
}

__device__ __forceinline__ void gemv_h2(u32 h, float &a, float &b) {
  asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }" : "=f"(a), "=f"(b) : "r"(h));
}

// Four E4M3 bytes to floats (exact: every E4M3 value is an f16 value).
__device__ __forceinline__ void gemv_e4m3x4(u32 w, float *f) {
  u32 h01, h23;
  asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %2; cvt.rn.f16x2.e4m3x2 %0, lo; cvt.rn.f16x2.e4m3x2 %1, hi; }"
      : "=r"(h01), "=r"(h23) : "r"(w));
  gemv_h2(h01, f[0], f[1]);
  gemv_h2(h23, f[2], f[3]);
}

__device__ __forceinline__ uint4 gemv_ld(const uint4 *p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// Σ of the 16 FP8 values of word v times x[0..16).
__device__ __forceinline__ float gemv_dot_fp8(uint4 v, const float4 *x) {
  float f[16];
  gemv_e4m3x4(v.x, f);
  gemv_e4m3x4(v.y, f + 4);
  gemv_e4m3x4(v.z, f + 8);
  gemv_e4m3x4(v.w, f + 12);
  float acc = 0.f;
#pragma unroll
  for (int q = 0; q < 4; q++) {
    const float4 xv = x[q];
    acc = fmaf(f[4 * q], xv.x, acc);
    acc = fmaf(f[4 * q + 1], xv.y, acc);
    acc = fmaf(f[4 * q + 2], xv.z, acc);
    acc = fmaf(f[4 * q + 3], xv.w, acc);
  }
  return acc;
}

// Σ of the 8 BF16 values of word v times x[0..8).
__device__ __forceinline__ float gemv_dot_bf16(uint4 v, const float4 *x) {
  const float4 a = x[0], b = x[1];
  float acc = __int_as_float(v.x << 16) * a.x;
  acc = fmaf(__int_as_float(v.x & 0xffff0000u), a.y, acc);
  acc = fmaf(__int_as_float(v.y << 16), a.z, acc);
  acc = fmaf(__int_as_float(v.y & 0xffff0000u), a.w, acc);
  acc = fmaf(__int_as_float(v.z << 16), b.x, acc);
  acc = fmaf(__int_as_float(v.z & 0xffff0000u), b.y, acc);
  acc = fmaf(__int_as_float(v.w << 16), b.z, acc);
  acc = fmaf(__int_as_float(v.w & 0xffff0000u), b.w, acc);
  return acc;
}

// One block: GEMV_WARPS warps, (GEMV_WARPS / wpr) row groups of GEMV_R rows.
// FMT 1: FP8 blocks (16 columns per lane step); FMT 3: BF16 (8 columns).
template <int FMT, int U>
__device__ __forceinline__ void gemv_body(const GemvMat &m, int blk) {
  __shared__ float red[GEMV_WARPS][GEMV_R];
  constexpr int CPL = FMT == 1 ? 16 : 8; // columns per lane per step
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wpr = m.wpr;
  const int rg = warp / wpr, part = warp % wpr;
  const int rowsPerBlock = (GEMV_WARPS / wpr) * GEMV_R;
  const int r0 = blk * rowsPerBlock + rg * GEMV_R;
  const int seg = m.cols / wpr; // a multiple of 32·CPL (checked on the host)
  const int c0 = part * seg, c1 = c0 + seg;
  float acc[GEMV_R];
#pragma unroll
  for (int r = 0; r < GEMV_R; r++) acc[r] = 0.f;
  if (r0 < m.rows) {
    const int g = r0 / m.rpg;
    const float *xg = m.x + (long long)g * m.cols;
    const long long rowBytes = (long long)m.cols * (FMT == 1 ? 1 : 2);
    const u8 *wrow = m.w + (long long)r0 * rowBytes;
    int c = c0 + lane * CPL;
    for (; c < c1; c += 32 * CPL * U) {
      uint4 v[U][GEMV_R];
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int cu = c + u * 32 * CPL;
#pragma unroll
        for (int r = 0; r < GEMV_R; r++) {
          if (cu < c1 && r0 + r < m.rows)
            v[u][r] = gemv_ld((const uint4 *)(wrow + r * rowBytes + (long long)cu * (FMT == 1 ? 1 : 2)));
          else
            v[u][r] = make_uint4(0u, 0u, 0u, 0u);
        }
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int cu = c + u * 32 * CPL;
        if (cu < c1) {
          float4 xv[CPL / 4];
#pragma unroll
          for (int q = 0; q < CPL / 4; q++) xv[q] = __ldg((const float4 *)(xg + cu) + q);
#pragma unroll
          for (int r = 0; r < GEMV_R; r++) {
            if (FMT == 1) {
              const int row = r0 + r;
              const float sc = gemv_e8m0(__ldg(m.s + (long long)(row >> m.bshift) * m.sstride + (cu >> m.bshift)));
              acc[r] = fmaf(gemv_dot_fp8(v[u][r], xv), sc, acc[r]);
            } else {
              acc[r] += gemv_dot_bf16(v[u][r], xv);
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < GEMV_R; r++) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
  }
  if (wpr == 1) {
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < GEMV_R; r++)
        if (r0 + r < m.rows) m.y[r0 + r] = acc[r];
    }
    return;
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < GEMV_R; r++) red[warp][r] = acc[r];
  }
  __syncthreads();
  if (part == 0 && lane < GEMV_R && r0 + lane < m.rows) {
    float s = 0.f;
    for (int p = 0; p < wpr; p++) s += red[warp + p][lane];
    m.y[r0 + lane] = s;
  }
}

// The matrix of a's products that this block works on.
__device__ __forceinline__ const GemvMat &gemv_mat(const GemvArgs &a) {
  int i = 0;
#pragma unroll
  for (int k = 1; k < GEMV_MAX; k++)
    if (k < a.n && (int)blockIdx.x >= a.m[k].blk0) i = k;
  return a.m[i];
}

template <int U>
__device__ __forceinline__ void gemv_dispatch(const GemvArgs &a) {
  const GemvMat &m = gemv_mat(a);
  const int blk = blockIdx.x - m.blk0;
  if (m.fmt == 1)
    gemv_body<1, U>(m, blk);
  else
    gemv_body<3, U>(m, blk);
}

// The weight bytes this block's warps load first, for MOXIE_PDL_PF (from
// the arguments alone): each warp's first chunk of each of its rows (U
// steps of 16 bytes a lane, at most MOXIE_PF_BYTES), for the block's rows.
// A row's wpr warp shares are seg bytes apart, and a row is wpr shares, so
// the pieces are one strided sequence.
template <int U>
__device__ __forceinline__ MoxiePF gemv_pf(const GemvArgs &a) {
  const GemvMat &m = gemv_mat(a);
  const int perBlock = (GEMV_WARPS / m.wpr) * GEMV_R, row0 = (blockIdx.x - m.blk0) * perBlock;
  const long long seg = (long long)(m.cols / m.wpr) * (m.fmt == 1 ? 1 : 2);
  const long long first = min(seg, (long long)min(32 * 16 * U, MOXIE_PF_BYTES));
  return MoxiePF{m.w + (long long)row0 * m.wpr * seg, nullptr, first, seg, max(0, min(perBlock, m.rows - row0)) * m.wpr};
}

extern "C" __global__ void __launch_bounds__(256) gemv_u4(const GemvArgs a) { MOXIE_PDL_PF(gemv_pf<4>(a)); gemv_dispatch<4>(a); }
extern "C" __global__ void __launch_bounds__(256) gemv_u2(const GemvArgs a) { MOXIE_PDL_PF(gemv_pf<2>(a)); gemv_dispatch<2>(a); }
extern "C" __global__ void __launch_bounds__(256) gemv_u8(const GemvArgs a) { MOXIE_PDL_PF(gemv_pf<8>(a)); gemv_dispatch<8>(a); }
