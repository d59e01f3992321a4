// Quantized linear kernels for moxie: y[b, r] = sum_c W[r, c] * x[b, c].
// Weights are read in their stored formats straight from device memory and
// decoded in registers; accumulation is float32. No headers: NVRTC needs none.
//
// The file has four sections, split by the "//@module" lines (compute/cuda
// /linear.go): "common" (types, decoders, templates, macros; no kernels) is
// part of every module; "linear" is the default module, every kernel the
// default variant (LinearVariant{}) can launch, compiled on a user's first
// run; "bench" holds the CUDA-core and mma variants only benchmarks and
// explicit LinearWith variants use, and "tc" the tensor-core GEMM tiles the
// automatic choice does not use, each compiled only when one of its kernels
// is first asked for.
// nvcc can compile the whole file as one unit.
//
// Narrow family (linear_*): a block of KW warps owns RB consecutive rows;
// the row's words (4 or 8 columns each) are split over the KW warps in chunks
// of 32*U words; every lane issues U*RB weight loads before using any (bytes
// in flight), then reads x (float4, coalesced across the warp, L1-resident)
// and accumulates. Partial sums are reduced by shuffles and shared memory.

//@module common
//@pdl

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define FMT_FP8 1
#define FMT_MXFP4 2
#define FMT_BF16 3
#define FMT_F32 4
#define FMT_MXFP8 5

__device__ __forceinline__ float e8m0(u32 s) {
  return s == 0u ? __int_as_float(0x00400000) : (s == 255u ? __int_as_float(0x7fc00000) : __int_as_float(s << 23));
}

__device__ __forceinline__ void h2x2(u32 h, float &a, float &b) {
  asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }" : "=f"(a), "=f"(b) : "r"(h));
}

// Four E4M3 bytes (byte i = element i) to floats, via the sm_89+ hardware
// conversion to f16 (exact: every E4M3 value is an f16 value).
__device__ __forceinline__ void e4m3x4(u32 w, float *f) {
  u32 h01, h23;
  asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %2; cvt.rn.f16x2.e4m3x2 %0, lo; cvt.rn.f16x2.e4m3x2 %1, hi; }"
      : "=r"(h01), "=r"(h23) : "r"(w));
  h2x2(h01, f[0], f[1]);
  h2x2(h23, f[2], f[3]);
}

// Eight E2M1 codes (nibble i = element i) to floats: each magnitude is looked
// up as an E4M3 byte (0, .5, 1, 1.5, 2, 3, 4, 6 are exact in E4M3) with PRMT,
// the sign bit is moved to bit 7 by a second PRMT, then e4m3x4.
__device__ __forceinline__ void e2m1x8(u32 w, float *f) {
  const u32 lutLo = 0x3C383000u, lutHi = 0x4C484440u;
  u32 m = w & 0x77777777u;
  u32 sg = (w >> 3) & 0x11111111u;
  u32 e0 = __byte_perm(lutLo, lutHi, m) | __byte_perm(0x8000u, 0u, sg);
  u32 e1 = __byte_perm(lutLo, lutHi, m >> 16) | __byte_perm(0x8000u, 0u, sg >> 16);
  e4m3x4(e0, f);
  e4m3x4(e1, f + 4);
}

// The same with integer operations only: each byte moved to the top, shifted
// arithmetically so that E4M3's exponent and mantissa land in f32's (value ×
// 2^-120, subnormals included, as f32 bits), then scaled back exactly.
__device__ __forceinline__ void e4m3x4_bits(u32 w, float *f) {
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int t = (int)(w << (24 - 8 * i));
    f[i] = __int_as_float((u32)(t >> 4) & 0x87F00000u) * 1.329227995784916e+36f;  // 2^120
  }
}

__device__ __forceinline__ void e2m1x8_bits(u32 w, float *f) {
  const u32 lutLo = 0x3C383000u, lutHi = 0x4C484440u;
  u32 m = w & 0x77777777u;
  u32 sg = (w >> 3) & 0x11111111u;
  u32 e0 = __byte_perm(lutLo, lutHi, m) | __byte_perm(0x8000u, 0u, sg);
  u32 e1 = __byte_perm(lutLo, lutHi, m >> 16) | __byte_perm(0x8000u, 0u, sg >> 16);
  e4m3x4_bits(e0, f);
  e4m3x4_bits(e1, f + 4);
}

template <int FMT> struct Fmt;
template <> struct Fmt<FMT_FP8>   { typedef u32 W; enum { CPW = 4, SCALED = 1 }; };
template <> struct Fmt<FMT_MXFP8> { typedef u32 W; enum { CPW = 4, SCALED = 1 }; };
template <> struct Fmt<FMT_MXFP4> { typedef u32 W; enum { CPW = 8, SCALED = 1 }; };
template <> struct Fmt<FMT_BF16>  { typedef uint2 W; enum { CPW = 4, SCALED = 0 }; };
template <> struct Fmt<FMT_F32>   { typedef uint4 W; enum { CPW = 4, SCALED = 0 }; };

template <int FMT, int DEC> struct Dec;
template <int DEC> struct Dec<FMT_FP8, DEC> {
  static __device__ __forceinline__ void run(u32 w, float *f) { if (DEC) e4m3x4_bits(w, f); else e4m3x4(w, f); }
};
template <int DEC> struct Dec<FMT_MXFP8, DEC> {
  static __device__ __forceinline__ void run(u32 w, float *f) { if (DEC) e4m3x4_bits(w, f); else e4m3x4(w, f); }
};
template <int DEC> struct Dec<FMT_MXFP4, DEC> {
  static __device__ __forceinline__ void run(u32 w, float *f) { if (DEC) e2m1x8_bits(w, f); else e2m1x8(w, f); }
};
template <int DEC> struct Dec<FMT_BF16, DEC> {
  static __device__ __forceinline__ void run(uint2 w, float *f) {
    f[0] = __int_as_float(w.x << 16); f[1] = __int_as_float(w.x & 0xffff0000u);
    f[2] = __int_as_float(w.y << 16); f[3] = __int_as_float(w.y & 0xffff0000u);
  }
};
template <int DEC> struct Dec<FMT_F32, DEC> {
  static __device__ __forceinline__ void run(uint4 w, float *f) {
    f[0] = __int_as_float(w.x); f[1] = __int_as_float(w.y); f[2] = __int_as_float(w.z); f[3] = __int_as_float(w.w);
  }
};

template <typename W> __device__ __forceinline__ W zero();
template <> __device__ __forceinline__ u32 zero<u32>() { return 0u; }
template <> __device__ __forceinline__ uint2 zero<uint2>() { uint2 z; z.x = z.y = 0u; return z; }
template <> __device__ __forceinline__ uint4 zero<uint4>() { uint4 z; z.x = z.y = z.z = z.w = 0u; return z; }

#define MAXW 8

// Parameters shared by every linear kernel.
struct LinArgs {
  const u8 *W;      // weight data, rows x rowBytes
  const u8 *S;      // scales (unused for BF16/F32)
  const float *x;   // [batch, xstride]
  float *y;         // [batch, ystride]
  int rows, cols;
  int sdivr;        // scale row divisor (block edge for FP8Block, 1 for MX)
  int sdivc;        // scale column divisor (block edge or 32)
  int srshift;      // log2(sdivr) (fast kernels: power-of-two blocks only)
  int scshift;      // log2(sdivc)
  int sstride;      // scale bytes per scale row
  int rpg;          // rows per group (GroupedLinear); x offset = (r / rpg) * cols
  int xstride;      // floats between batch rows of x
  int ystride;      // floats between batch rows of y
  int batch;        // <= NB
};

template <int FMT, int NB, int RB, int U, int DEC>
__device__ __forceinline__ void linear_fast(const LinArgs &a) {
  typedef typename Fmt<FMT>::W WT;
  const int CPW = Fmt<FMT>::CPW;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int r0 = blockIdx.x * RB;
  const int nw = a.cols / CPW;
  const WT *Wp = reinterpret_cast<const WT *>(a.W);
  const float *xg = a.x + (long long)(r0 / a.rpg) * a.cols;
  int rowc[RB];
  const u8 *srow[RB];  // this row's scales (hoisted: no division in the loop)
#pragma unroll
  for (int r = 0; r < RB; r++) {
    rowc[r] = min(r0 + r, a.rows - 1);
    srow[r] = a.S + (long long)(rowc[r] >> a.srshift) * a.sstride;
  }

  float acc[RB][NB];
#pragma unroll
  for (int r = 0; r < RB; r++)
#pragma unroll
    for (int b = 0; b < NB; b++) acc[r][b] = 0.f;

  for (int k0 = warp * 32 * U; k0 < nw; k0 += nwarps * 32 * U) {
    WT w[U][RB];
    float sc[U][RB];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int kw = k0 + u * 32 + lane;
#pragma unroll
      for (int r = 0; r < RB; r++) {
        if (kw < nw) {
          w[u][r] = __ldg(Wp + (long long)rowc[r] * nw + kw);
          if (Fmt<FMT>::SCALED)
            sc[u][r] = e8m0(__ldg(srow[r] + ((kw * CPW) >> a.scshift)));
        } else {
          w[u][r] = zero<WT>();
          sc[u][r] = 0.f;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int kw = k0 + u * 32 + lane;
      if (kw < nw) {
        float f[RB][CPW];
#pragma unroll
        for (int r = 0; r < RB; r++) Dec<FMT, DEC>::run(w[u][r], f[r]);
#pragma unroll
        for (int b = 0; b < NB; b++) {
          if (b < a.batch) {
            const float4 *xp = reinterpret_cast<const float4 *>(xg + (long long)b * a.xstride + kw * CPW);
            float xv[CPW];
#pragma unroll
            for (int q = 0; q < CPW / 4; q++) {
              float4 t = __ldg(xp + q);
              xv[4 * q] = t.x; xv[4 * q + 1] = t.y; xv[4 * q + 2] = t.z; xv[4 * q + 3] = t.w;
            }
#pragma unroll
            for (int r = 0; r < RB; r++) {
              float p = 0.f;
#pragma unroll
              for (int c = 0; c < CPW; c++) p = fmaf(f[r][c], xv[c], p);
              if (Fmt<FMT>::SCALED) acc[r][b] = fmaf(p, sc[u][r], acc[r][b]);
              else acc[r][b] += p;
            }
          }
        }
      }
    }
  }

  __shared__ float red[MAXW][RB * NB];
#pragma unroll
  for (int r = 0; r < RB; r++)
#pragma unroll
    for (int b = 0; b < NB; b++) {
      float v = acc[r][b];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) red[warp][r * NB + b] = v;
    }
  __syncthreads();
  for (int i = threadIdx.x; i < RB * NB; i += blockDim.x) {
    const int r = i / NB, b = i % NB;
    if (b < a.batch && r0 + r < a.rows) {
      float s = 0.f;
      for (int q = 0; q < nwarps; q++) s += red[q][i];
      a.y[(long long)b * a.ystride + r0 + r] = s;
    }
  }
}

#define LIN(FMTN, FMT, NB, RB, U, DEC, SUF) \
  extern "C" __global__ void __launch_bounds__(256) linear_##FMTN##_b##NB##_r##RB##_u##U##SUF(LinArgs a) { MOXIE_PDL(); \
    linear_fast<FMT, NB, RB, U, DEC>(a); }

#define LIN_NB(FMTN, FMT, RB, U, DEC, SUF) \
  LIN(FMTN, FMT, 1, RB, U, DEC, SUF) LIN(FMTN, FMT, 2, RB, U, DEC, SUF) LIN(FMTN, FMT, 4, RB, U, DEC, SUF) \
  LIN(FMTN, FMT, 8, RB, U, DEC, SUF) LIN(FMTN, FMT, 16, RB, U, DEC, SUF)

// Several projections of one format in one launch (blockIdx.y picks the
// LinArgs from a device array), e.g. the active experts' w1 and w3 of a token.
// Blocks past a matrix's rows exit before any barrier.
#define LINM(FMTN, FMT, NB, RB, U, DEC, SUF) \
  extern "C" __global__ void __launch_bounds__(256) linmulti_##FMTN##_b##NB##_r##RB##_u##U##SUF(const LinArgs *__restrict__ all) { MOXIE_PDL(); \
    const LinArgs a = all[blockIdx.y]; \
    if ((int)blockIdx.x * RB >= a.rows) return; \
    linear_fast<FMT, NB, RB, U, DEC>(a); }

#define LINM_NB(FMTN, FMT, RB, U, DEC, SUF) \
  LINM(FMTN, FMT, 1, RB, U, DEC, SUF) LINM(FMTN, FMT, 2, RB, U, DEC, SUF) LINM(FMTN, FMT, 4, RB, U, DEC, SUF) \
  LINM(FMTN, FMT, 8, RB, U, DEC, SUF) LINM(FMTN, FMT, 16, RB, U, DEC, SUF)

// Wide variant: every lane loads 16-byte words (16 FP8 or 32 FP4 values; an
// MXFP4 word is exactly one scale group), U per row ahead of use; full chunks
// run without bounds checks, one guarded tail chunk follows. Each 32-bit
// quarter of a word is decoded and consumed in turn, so few registers are live.
template <int FMT> struct Wide;
template <> struct Wide<FMT_FP8>   { enum { CPW = 16 }; };
template <> struct Wide<FMT_MXFP8> { enum { CPW = 16 }; };
template <> struct Wide<FMT_MXFP4> { enum { CPW = 32 }; };

__device__ __forceinline__ u32 quarter(const uint4 &w, int q) {
  return q == 0 ? w.x : (q == 1 ? w.y : (q == 2 ? w.z : w.w));
}

template <int FMT, int NB, int RB, int U, int DEC, bool GUARD>
__device__ __forceinline__ void wide_chunk(const LinArgs &a, const uint4 *const *wrow, const u8 *const *srow,
                                           const float *xg, int k0, int nw, int lane, float (&acc)[RB][NB]) {
  const int CPW = Wide<FMT>::CPW;
  const int QC = CPW / 4;  // columns per 32-bit quarter: 4 (FP8) or 8 (FP4)
  uint4 w[U][RB];
  float sc[U][RB];
#pragma unroll
  for (int u = 0; u < U; u++) {
    const int kw = k0 + u * 32 + lane;
#pragma unroll
    for (int r = 0; r < RB; r++) {
      if (!GUARD || kw < nw) {
        w[u][r] = __ldg(wrow[r] + kw);
        sc[u][r] = e8m0(__ldg(srow[r] + ((kw * CPW) >> a.scshift)));
      } else {
        w[u][r] = zero<uint4>();
        sc[u][r] = 0.f;
      }
    }
  }
#pragma unroll
  for (int u = 0; u < U; u++) {
    const int kw = k0 + u * 32 + lane;
    if (GUARD && kw >= nw) continue;
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
        if (b < a.batch) {
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
            for (int c = 0; c < QC; c++) part[r][b] = fmaf(f[r][c], xv[c], part[r][b]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < RB; r++)
#pragma unroll
      for (int b = 0; b < NB; b++) acc[r][b] = fmaf(part[r][b], sc[u][r], acc[r][b]);
  }
}

template <int FMT, int NB, int RB, int U, int DEC>
__device__ __forceinline__ void linear_wide(const LinArgs &a) {
  const int CPW = Wide<FMT>::CPW;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int r0 = blockIdx.x * RB;
  const int nw = a.cols / CPW;
  const float *xg = a.x + (long long)(r0 / a.rpg) * a.cols;
  const uint4 *wrow[RB];
  const u8 *srow[RB];
#pragma unroll
  for (int r = 0; r < RB; r++) {
    const int row = min(r0 + r, a.rows - 1);
    wrow[r] = reinterpret_cast<const uint4 *>(a.W) + (long long)row * nw;
    srow[r] = a.S + (long long)(row >> a.srshift) * a.sstride;
  }
  float acc[RB][NB];
#pragma unroll
  for (int r = 0; r < RB; r++)
#pragma unroll
    for (int b = 0; b < NB; b++) acc[r][b] = 0.f;
  const int step = nwarps * 32 * U;
  int k0 = warp * 32 * U;
  for (; k0 + 32 * U <= nw; k0 += step) wide_chunk<FMT, NB, RB, U, DEC, false>(a, wrow, srow, xg, k0, nw, lane, acc);
  if (k0 < nw) wide_chunk<FMT, NB, RB, U, DEC, true>(a, wrow, srow, xg, k0, nw, lane, acc);

  __shared__ float red[MAXW][RB * NB];
#pragma unroll
  for (int r = 0; r < RB; r++)
#pragma unroll
    for (int b = 0; b < NB; b++) {
      float v = acc[r][b];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) red[warp][r * NB + b] = v;
    }
  __syncthreads();
  for (int i = threadIdx.x; i < RB * NB; i += blockDim.x) {
    const int r = i / NB, b = i % NB;
    if (b < a.batch && r0 + r < a.rows) {
      float s = 0.f;
      for (int q = 0; q < nwarps; q++) s += red[q][i];
      a.y[(long long)b * a.ystride + r0 + r] = s;
    }
  }
}

#define LINW(FMTN, FMT, NB, RB, U, DEC) \
  extern "C" __global__ void __launch_bounds__(256) linw_##FMTN##_b##NB##_r##RB##_u##U##_d##DEC(LinArgs a) { MOXIE_PDL(); \
    linear_wide<FMT, NB, RB, U, DEC>(a); }
#define LINW_NB(FMTN, FMT, RB, U, DEC) \
  LINW(FMTN, FMT, 1, RB, U, DEC) LINW(FMTN, FMT, 2, RB, U, DEC) LINW(FMTN, FMT, 4, RB, U, DEC) \
  LINW(FMTN, FMT, 8, RB, U, DEC) LINW(FMTN, FMT, 16, RB, U, DEC)

// Vec family (persistent warps): a warp owns a tile of RB whole rows and
// walks them in chunks of 32*U 16-byte words per row, issuing all U*RB word
// loads (and their scale bytes) of a chunk before decoding any; it reduces its
// own accumulators with shuffles, writes, and moves on to the tile
// gridDim*warps further (grid-stride), so blocks live for the whole launch and
// there is no shared memory or barrier. The grid is sized on the host to the
// blocks that fit on the chip at once. E8M0 scales are applied once per word
// (a word never straddles a scale group) as an exponent built with integer
// operations. Rows of a tile share one x group: RB divides the rows per group
// or there is one group.
//   FMT: FMT_FP8, FMT_MXFP8 or FMT_MXFP4; NB: batch tile (<= 4 here);
//   DEC: 0 hardware E4M3 conversion (E2M1 via an E4M3 lookup), 1 integer
//        E4M3 decoder / E2M1 placed straight into f16 bits;
//   HINT: 0 __ldg, 1 ld.global.nc.L1::no_allocate.L2::256B (weights stream
//         past L1, which then holds x only).
__device__ __forceinline__ float e8m0_exp(u32 s) {
  // 2^(s-127) as bits s<<23; s = 0 gives 2^-127 (0x00400000) and s = 255 NaN
  // (0x7fc00000), as e8m0 defines them, without branches: ((s+1)&0xfe) == 0
  // exactly for s in {0, 255}.
  return __int_as_float((s << 23) | ((((s + 1u) & 0xfeu) == 0u) ? 0x00400000u : 0u));
}

template <int HINT> __device__ __forceinline__ uint4 ldw(const uint4 *p) {
  if (HINT == 0) return __ldg(p);
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// Eight E2M1 codes (nibble i = element i) to floats times 2^-14: nibbles k
// and k+4 become the two halves of one f16x2 (exponent and mantissa bits at
// f16 bits 11..9, the sign at bit 15: E2M1's subnormal 0.5 lands on the f16
// subnormal 2^-15), so every E2M1 value v decodes to v * 2^-14 exactly.
__device__ __forceinline__ void e2m1x8_h(u32 w, float *f) {
  u32 h0 = ((w << 9) & 0x0E000E00u) | ((w << 12) & 0x80008000u);
  u32 h1 = ((w << 5) & 0x0E000E00u) | ((w << 8) & 0x80008000u);
  u32 h2 = ((w << 1) & 0x0E000E00u) | ((w << 4) & 0x80008000u);
  u32 h3 = ((w >> 3) & 0x0E000E00u) | (w & 0x80008000u);
  h2x2(h0, f[0], f[4]);
  h2x2(h1, f[1], f[5]);
  h2x2(h2, f[2], f[6]);
  h2x2(h3, f[3], f[7]);
}

template <int FMT, int DEC> struct VecDec;
template <int DEC> struct VecDec<FMT_FP8, DEC> {
  enum { CPW = 16, QC = 4 };
  static __device__ __forceinline__ float post() { return 1.f; }
  static __device__ __forceinline__ void run(u32 w, float *f) { if (DEC) e4m3x4_bits(w, f); else e4m3x4(w, f); }
};
template <int DEC> struct VecDec<FMT_MXFP8, DEC> {
  enum { CPW = 16, QC = 4 };
  static __device__ __forceinline__ float post() { return 1.f; }
  static __device__ __forceinline__ void run(u32 w, float *f) { if (DEC) e4m3x4_bits(w, f); else e4m3x4(w, f); }
};
template <int DEC> struct VecDec<FMT_MXFP4, DEC> {
  enum { CPW = 32, QC = 8 };
  static __device__ __forceinline__ float post() { return DEC ? 16384.f : 1.f; }
  static __device__ __forceinline__ void run(u32 w, float *f) { if (DEC) e2m1x8_h(w, f); else e2m1x8(w, f); }
};

// One chunk of a vec tile: U words per row per lane, loaded (with their
// scale bytes) before any is decoded. GUARD: the chunk may pass the row end.
template <int FMT, int NB, int RB, int U, int DEC, int HINT, bool GUARD>
__device__ __forceinline__ void vec_chunk(const LinArgs &a, const uint4 *const (&wrow)[RB], const u8 *const (&srow)[RB],
                                          const float *xg, int k0, int nw, int lane, float (&acc)[RB][NB]) {
  typedef VecDec<FMT, DEC> D;
  const int CPW = D::CPW, QC = D::QC;
  uint4 w[U][RB];
  u32 s[U][RB];
#pragma unroll
  for (int u = 0; u < U; u++) {
    const int kw = k0 + u * 32 + lane;
#pragma unroll
    for (int r = 0; r < RB; r++) {
      if (!GUARD || kw < nw) {
        w[u][r] = ldw<HINT>(wrow[r] + kw);
        s[u][r] = __ldg(srow[r] + ((kw * CPW) >> a.scshift));
      } else {
        w[u][r] = zero<uint4>();
        s[u][r] = 127u;
      }
    }
  }
#pragma unroll
  for (int u = 0; u < U; u++) {
    const int kw = k0 + u * 32 + lane;
    if (GUARD && kw >= nw) break;
    float p[RB][NB];
#pragma unroll
    for (int q = 0; q < 4; q++) {
      float f[RB][QC];
#pragma unroll
      for (int r = 0; r < RB; r++) D::run(quarter(w[u][r], q), f[r]);
#pragma unroll
      for (int b = 0; b < NB; b++) {
        if (NB == 1 || b < a.batch) {
          const float4 *xp = reinterpret_cast<const float4 *>(xg + (long long)b * a.xstride + kw * CPW + q * QC);
          float xv[QC];
#pragma unroll
          for (int h = 0; h < QC / 4; h++) {
            const float4 t = __ldg(xp + h);
            xv[4 * h] = t.x; xv[4 * h + 1] = t.y; xv[4 * h + 2] = t.z; xv[4 * h + 3] = t.w;
          }
#pragma unroll
          for (int r = 0; r < RB; r++) {
            float v = q == 0 ? f[r][0] * xv[0] : fmaf(f[r][0], xv[0], p[r][b]);
#pragma unroll
            for (int c = 1; c < QC; c++) v = fmaf(f[r][c], xv[c], v);
            p[r][b] = v;
          }
        } else if (q == 0) {
#pragma unroll
          for (int r = 0; r < RB; r++) p[r][b] = 0.f;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < RB; r++) {
      const float sc = e8m0_exp(s[u][r]);
#pragma unroll
      for (int b = 0; b < NB; b++) acc[r][b] = fmaf(D::post() == 1.f ? p[r][b] : p[r][b] * D::post(), sc, acc[r][b]);
    }
  }
}

// One tile: rows r0 .. r0+RB-1 (the last ones clamped to the final row and
// not stored), all columns, every batch row; lane 0 stores the sums.
template <int FMT, int NB, int RB, int U, int DEC, int HINT>
__device__ __forceinline__ void vec_tile(const LinArgs &a, int r0, int lane) {
  const int nw = a.cols / VecDec<FMT, DEC>::CPW;
  const float *xg = a.x + (long long)(r0 / a.rpg) * a.cols;
  const uint4 *wrow[RB];
  const u8 *srow[RB];
#pragma unroll
  for (int r = 0; r < RB; r++) {
    const int row = min(r0 + r, a.rows - 1);
    wrow[r] = reinterpret_cast<const uint4 *>(a.W) + (long long)row * nw;
    srow[r] = a.S + (long long)(row >> a.srshift) * a.sstride;
  }
  float acc[RB][NB];
#pragma unroll
  for (int r = 0; r < RB; r++)
#pragma unroll
    for (int b = 0; b < NB; b++) acc[r][b] = 0.f;
  int k0 = 0;
  for (; k0 + 32 * U <= nw; k0 += 32 * U) vec_chunk<FMT, NB, RB, U, DEC, HINT, false>(a, wrow, srow, xg, k0, nw, lane, acc);
  if (k0 < nw) vec_chunk<FMT, NB, RB, U, DEC, HINT, true>(a, wrow, srow, xg, k0, nw, lane, acc);
#pragma unroll
  for (int r = 0; r < RB; r++)
#pragma unroll
    for (int b = 0; b < NB; b++) {
      float v = acc[r][b];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0 && b < a.batch && r0 + r < a.rows) a.y[(long long)b * a.ystride + r0 + r] = v;
    }
}

template <int FMT, int NB, int RB, int U, int DEC, int HINT>
__device__ __forceinline__ void linear_vec(const LinArgs &a) {
  const int lane = threadIdx.x & 31;
  const int wpb = blockDim.x >> 5;
  const int total = gridDim.x * wpb;
  const int tiles = (a.rows + RB - 1) / RB;
  for (int t = blockIdx.x * wpb + (threadIdx.x >> 5); t < tiles; t += total)
    vec_tile<FMT, NB, RB, U, DEC, HINT>(a, t * RB, lane);
}

// The same over n projections (all[0..n)): the tiles of all matrices form one
// sequence, matrix i's after matrix i-1's, walked grid-stride.
template <int FMT, int NB, int RB, int U, int DEC, int HINT>
__device__ __forceinline__ void linear_vec_multi(const LinArgs *__restrict__ all, int n) {
  const int lane = threadIdx.x & 31;
  const int wpb = blockDim.x >> 5;
  const int total = gridDim.x * wpb;
  int mi = 0, base = 0, tiles = (all[0].rows + RB - 1) / RB;
  for (int t = blockIdx.x * wpb + (threadIdx.x >> 5);; t += total) {
    while (t >= base + tiles) {
      base += tiles;
      if (++mi >= n) return;
      tiles = (all[mi].rows + RB - 1) / RB;
    }
    vec_tile<FMT, NB, RB, U, DEC, HINT>(all[mi], (t - base) * RB, lane);
  }
}

// The weight bytes a linv block loads first, for MOXIE_PDL_PF (from the
// arguments alone): the first chunk (U words a lane, at most
// MOXIE_PF_BYTES) of each row of the block's first tiles (warp w's first
// tile is blockIdx.x·warps + w, so they are consecutive rows).
template <int FMT, int RB, int U, int DEC>
__device__ __forceinline__ MoxiePF vec_pf(const LinArgs &a) {
  const int per = (blockDim.x >> 5) * RB, row0 = blockIdx.x * per;
  const long long rowBytes = (long long)(a.cols / VecDec<FMT, DEC>::CPW) * 16;
  const long long first = min(rowBytes, (long long)min(32 * 16 * U, MOXIE_PF_BYTES));
  return MoxiePF{a.W + (long long)row0 * rowBytes, nullptr, first, rowBytes, max(0, min(per, a.rows - row0))};
}

// Kernel names: linv_<fmt>_b<NB>_r<RB>_u<U>_d<DEC>_h<HINT> and
// linvmulti_<fmt>_b<NB>_r<RB>_u<U>_d<DEC>_h<HINT>. Two blocks of 256 threads
// per SM are guaranteed to fit (at most 128 registers a thread). linv asks
// L2 for its first tiles' first chunks before the wait (vec_pf); linvmulti
// does not: its weight pointers are in device records (some written by
// kernels, e.g. fwd_moe_args), which nothing may read before the wait.
#define LINV(FMTN, FMT, NB, RB, U, DEC, HINT) \
  extern "C" __global__ void __launch_bounds__(256, 2) linv_##FMTN##_b##NB##_r##RB##_u##U##_d##DEC##_h##HINT(LinArgs a) { \
    MOXIE_PDL_PF(vec_pf<FMT, RB, U, DEC>(a)); \
    linear_vec<FMT, NB, RB, U, DEC, HINT>(a); }
#define LINVM(FMTN, FMT, NB, RB, U, DEC, HINT) \
  extern "C" __global__ void __launch_bounds__(256, 2) linvmulti_##FMTN##_b##NB##_r##RB##_u##U##_d##DEC##_h##HINT(const LinArgs *__restrict__ all, int n) { MOXIE_PDL(); \
    linear_vec_multi<FMT, NB, RB, U, DEC, HINT>(all, n); }
// The three tile shapes: U 2, 4, 8 with RB 4, 2, 1 (eight 16-byte loads per lane in flight).
#define LINV_U(M, FMTN, FMT, NB, DEC, HINT) \
  M(FMTN, FMT, NB, 4, 2, DEC, HINT) M(FMTN, FMT, NB, 2, 4, DEC, HINT) M(FMTN, FMT, NB, 1, 8, DEC, HINT)
#define LINV_NB(M, FMTN, FMT, DEC, HINT) \
  LINV_U(M, FMTN, FMT, 1, DEC, HINT) LINV_U(M, FMTN, FMT, 2, DEC, HINT) LINV_U(M, FMTN, FMT, 4, DEC, HINT)

// MMA family (`linm_*`, `linmmulti_*`; tensor cores): a warp owns tiles of 16
// rows (all columns) and multiplies them by x with mma.sync m16n8k16 (f16
// inputs, f32 accumulation): the weights, exact in f16 (every E4M3 and E2M1
// value is), are the A operand; x is the B operand as eight f16 columns, for
// batch row b the pair hi = x with its f32 mantissa cut to 11 bits and lo =
// x - hi (together 22 significant bits), so the weights meet x in full float32
// precision and one mma serves four batch rows. Each block first converts x
// into shared memory (f16 hi/lo per batch row); the A fragments come straight
// from the stored words: thread (g = lane/4, t = lane%4) takes rows g and
// g+8 of the tile and, per mma, four columns of its own (FP8: a 16-byte word
// per row covers four mmas; MXFP4: a 4-byte word per row of one 32-column
// scale group covers two), so the k order of A and B is the word order and
// the B fragment of thread (n, t) is eight or sixteen consecutive f16 of
// column n. D's columns 2b and 2b+1 (thread t = b) are batch row b's hi and lo
// parts: their sum is y. Scales are applied to each group's (MXFP4) or
// span's (FP8 block) mma result. One x group (groups = 1).
__device__ __forceinline__ void mma16816(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 e4m3x2_h(u32 w16) {  // two E4M3 bytes (low 16 bits) to f16x2
  u32 h;
  asm("{ .reg .b16 lo; cvt.u16.u32 lo, %1; cvt.rn.f16x2.e4m3x2 %0, lo; }" : "=r"(h) : "r"(w16));
  return h;
}

__device__ __forceinline__ u16 f16_of(float x) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
}

// Converts x [batch, cols] (batch <= NB; rows past batch are zeros; cols a
// multiple of 4) into xs: row 2b = hi(x[b]), row 2b+1 = lo(x[b]), each row
// `stride` halves (a multiple of 8). Four columns a thread and step.
__device__ __forceinline__ u32 f16x2_of(float lo, float hi) {
  u32 h;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(hi), "f"(lo));
  return h;
}

template <int NB>
__device__ __forceinline__ void mma_stage_x(const LinArgs &a, u16 *xs, int stride) {
  const int n4 = a.cols >> 2;
#pragma unroll
  for (int b = 0; b < NB; b++) {
    const float4 *xp = reinterpret_cast<const float4 *>(a.x + (long long)b * a.xstride);
    uint2 *hp = reinterpret_cast<uint2 *>(xs + (2 * b) * stride);
    uint2 *lp = reinterpret_cast<uint2 *>(xs + (2 * b + 1) * stride);
#pragma unroll 4
    for (int i = threadIdx.x; i < n4; i += blockDim.x) {
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (b < a.batch) v = __ldg(xp + i);
      float h[4] = {v.x, v.y, v.z, v.w}, l[4];
#pragma unroll
      for (int k = 0; k < 4; k++) {
        const float x = h[k];
        h[k] = __int_as_float(__float_as_int(x) & 0xFFFFE000u);
        l[k] = x - h[k];
      }
      hp[i] = make_uint2(f16x2_of(h[0], h[1]), f16x2_of(h[2], h[3]));
      lp[i] = make_uint2(f16x2_of(l[0], l[1]), f16x2_of(l[2], l[3]));
    }
  }
}

// Asks L2 for the first chunk of this warp's first tile (issued before the
// x staging, so the weights' HBM latency overlaps it).
template <int FMT, int U>
__device__ __forceinline__ void mma_prefetch(const LinArgs &a, int ks) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wpb = blockDim.x >> 5;
  const int tile = blockIdx.x * (wpb / ks) + warp / ks;
  const int s0 = (warp % ks) * U;  // this warp's first span
  const int spans = FMT == FMT_FP8 ? a.cols / 64 : a.cols / 32;
  if (tile * 16 >= a.rows) return;
  const int g = lane >> 2, t = lane & 3;
  const long long rowBytes = FMT == FMT_FP8 ? a.cols : a.cols / 2;
  const int span = FMT == FMT_FP8 ? 64 : 16;  // bytes of a span in a row
  const int unit = FMT == FMT_FP8 ? 16 : 4;   // bytes of a thread's word
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int row = min(tile * 16 + g + 8 * h, a.rows - 1);
    const u8 *p = a.W + row * rowBytes + t * unit;
#pragma unroll
    for (int u = 0; u < U; u++)
      if (s0 + u < spans) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + (s0 + u) * span));
  }
}

template <int FMT> struct Mma;
// FP8 block: a span is 64 columns (one 16-byte word per thread and row, four
// mmas); U spans are loaded before use.
template <> struct Mma<FMT_FP8> { enum { SPAN = 64 }; };
// MXFP4: a span is one 32-column scale group (one 4-byte word per thread and
// row, two mmas).
template <> struct Mma<FMT_MXFP4> { enum { SPAN = 32 }; };

template <int FMT, int NB, int U, bool GUARD>
__device__ __forceinline__ void mma_chunk(const LinArgs &a, const u8 *wa, const u8 *wb, const u8 *sa, const u8 *sb,
                                          const u16 *xs, int stride, int s0, int spans, int lane, float (&acc)[4]) {
  const int g = lane >> 2, t = lane & 3;
  const bool bl = g < 2 * NB;  // this thread supplies a B column
  const u16 *xr = xs + g * stride;
  if (FMT == FMT_FP8) {
    uint4 wA[U], wB[U];
    u32 sc[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int s = s0 + u;
      if (!GUARD || s < spans) {
        wA[u] = __ldg(reinterpret_cast<const uint4 *>(wa) + s * 4 + t);
        wB[u] = __ldg(reinterpret_cast<const uint4 *>(wb) + s * 4 + t);
        sc[u] = __ldg(sa + ((s * 64) >> a.scshift));
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int s = s0 + u;
      if (GUARD && s >= spans) break;
      u32 bq[8];
      if (bl) {
        const uint4 p = *reinterpret_cast<const uint4 *>(xr + s * 64 + 16 * t);
        const uint4 q = *reinterpret_cast<const uint4 *>(xr + s * 64 + 16 * t + 8);
        bq[0] = p.x; bq[1] = p.y; bq[2] = p.z; bq[3] = p.w; bq[4] = q.x; bq[5] = q.y; bq[6] = q.z; bq[7] = q.w;
      } else {
#pragma unroll
        for (int i = 0; i < 8; i++) bq[i] = 0u;
      }
      float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int q = 0; q < 4; q++) {
        const u32 ra = quarter(wA[u], q), rb = quarter(wB[u], q);
        mma16816(d, e4m3x2_h(ra), e4m3x2_h(rb), e4m3x2_h(ra >> 16), e4m3x2_h(rb >> 16), bq[2 * q], bq[2 * q + 1]);
      }
      const float f = e8m0_exp(sc[u]);
#pragma unroll
      for (int i = 0; i < 4; i++) acc[i] = fmaf(d[i], f, acc[i]);
    }
  } else {
    u32 wA[U], wB[U], sA[U], sB[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int s = s0 + u;
      if (!GUARD || s < spans) {
        wA[u] = __ldg(reinterpret_cast<const u32 *>(wa) + s * 4 + t);
        wB[u] = __ldg(reinterpret_cast<const u32 *>(wb) + s * 4 + t);
        sA[u] = __ldg(sa + s);
        sB[u] = __ldg(sb + s);
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int s = s0 + u;
      if (GUARD && s >= spans) break;
      uint4 bq = {0u, 0u, 0u, 0u};
      if (bl) bq = *reinterpret_cast<const uint4 *>(xr + s * 32 + 8 * t);
      // E2M1 codes to E4M3 bytes (as e2m1x8), then pairs to f16x2.
      const u32 lutLo = 0x3C383000u, lutHi = 0x4C484440u;
      u32 e[2][2];
      const u32 ws[2] = {wA[u], wB[u]};
#pragma unroll
      for (int r = 0; r < 2; r++) {
        const u32 m = ws[r] & 0x77777777u, sg = (ws[r] >> 3) & 0x11111111u;
        e[r][0] = __byte_perm(lutLo, lutHi, m) | __byte_perm(0x8000u, 0u, sg);
        e[r][1] = __byte_perm(lutLo, lutHi, m >> 16) | __byte_perm(0x8000u, 0u, sg >> 16);
      }
      float d[4] = {0.f, 0.f, 0.f, 0.f};
      mma16816(d, e4m3x2_h(e[0][0]), e4m3x2_h(e[1][0]), e4m3x2_h(e[0][0] >> 16), e4m3x2_h(e[1][0] >> 16), bq.x, bq.y);
      mma16816(d, e4m3x2_h(e[0][1]), e4m3x2_h(e[1][1]), e4m3x2_h(e[0][1] >> 16), e4m3x2_h(e[1][1] >> 16), bq.z, bq.w);
      const float fa = e8m0_exp(sA[u]), fb = e8m0_exp(sB[u]);
      acc[0] = fmaf(d[0], fa, acc[0]);
      acc[1] = fmaf(d[1], fa, acc[1]);
      acc[2] = fmaf(d[2], fb, acc[2]);
      acc[3] = fmaf(d[3], fb, acc[3]);
    }
  }
}

// The tiles of one matrix (x already staged in xs). The block's warps form
// groups of ks (1, 2, 4 or 8, dividing the warps): a group owns one 16-row
// tile at a time, its warps taking every ks-th chunk of U spans, and adds
// their sums through shared memory; the groups walk the tiles grid-stride
// over the blocks of gridDim.x. ks > 1 keeps short matrices (few tiles) on
// many SMs.
template <int FMT, int NB, int U>
__device__ __forceinline__ void mma_tiles(const LinArgs &a, const u16 *xs, int stride, int ks) {
  __shared__ float red[8][4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wpb = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int tpb = wpb / ks, kp = warp % ks;
  const int tiles = (a.rows + 15) >> 4;
  const int spans = a.cols / Mma<FMT>::SPAN;
  const long long rowBytes = FMT == FMT_FP8 ? a.cols : a.cols / 2;
  for (int base = blockIdx.x * tpb; base < tiles; base += gridDim.x * tpb) {
    const int tile = base + warp / ks;
    const int r0 = tile * 16;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    if (tile < tiles) {
      const int ra = min(r0 + g, a.rows - 1), rb = min(r0 + g + 8, a.rows - 1);
      const u8 *wa = a.W + ra * rowBytes, *wb = a.W + rb * rowBytes;
      const u8 *sa = a.S + (long long)(ra >> a.srshift) * a.sstride, *sb = a.S + (long long)(rb >> a.srshift) * a.sstride;
      int s0 = kp * U;
      for (; s0 + U <= spans; s0 += ks * U) mma_chunk<FMT, NB, U, false>(a, wa, wb, sa, sb, xs, stride, s0, spans, lane, acc);
      if (s0 < spans) mma_chunk<FMT, NB, U, true>(a, wa, wb, sa, sb, xs, stride, s0, spans, lane, acc);
    }
    if (ks > 1) {
#pragma unroll
      for (int i = 0; i < 4; i++) red[warp][i][lane] = acc[i];
      __syncthreads();
      if (kp == 0) {
        for (int w = 1; w < ks; w++)
#pragma unroll
          for (int i = 0; i < 4; i++) acc[i] += red[warp + w][i][lane];
      }
      __syncthreads();
    }
    if (kp == 0 && tile < tiles && t < a.batch) {
      if (r0 + g < a.rows) a.y[(long long)t * a.ystride + r0 + g] = acc[0] + acc[1];
      if (r0 + g + 8 < a.rows) a.y[(long long)t * a.ystride + r0 + g + 8] = acc[2] + acc[3];
    }
  }
}

// Dynamic shared memory: 2*NB rows of cols+8 halves (the 16-byte pad spreads
// the rows over the banks). ks: see mma_tiles.
#define LINMMA(FMTN, FMT, NB, U) \
  extern "C" __global__ void __launch_bounds__(256, 2) linm_##FMTN##_b##NB##_u##U(LinArgs a, int ks) { MOXIE_PDL(); \
    extern __shared__ uint4 smem_m[]; \
    u16 *xs = reinterpret_cast<u16 *>(smem_m); \
    mma_prefetch<FMT, U>(a, ks); \
    mma_stage_x<NB>(a, xs, a.cols + 8); \
    __syncthreads(); \
    mma_tiles<FMT, NB, U>(a, xs, a.cols + 8, ks); } \
  extern "C" __global__ void __launch_bounds__(256, 2) linmmulti_##FMTN##_b##NB##_u##U(const LinArgs *__restrict__ all, int ks) { MOXIE_PDL(); \
    extern __shared__ uint4 smem_m[]; \
    u16 *xs = reinterpret_cast<u16 *>(smem_m); \
    const LinArgs &a = all[blockIdx.y]; \
    mma_prefetch<FMT, U>(a, ks); \
    mma_stage_x<NB>(a, xs, a.cols + 8); \
    __syncthreads(); \
    mma_tiles<FMT, NB, U>(a, xs, a.cols + 8, ks); }

// Generic element-wise path for shapes the fast kernels do not take (columns
// not a multiple of the word width). One warp per row, scalar decode.
__device__ __forceinline__ float e4m3f(u32 b) {
  const u32 s = b >> 7, e = (b >> 3) & 15u, m = b & 7u;
  float v;
  if (e == 15u && m == 7u) v = __int_as_float(0x7fc00000);
  else if (e == 0u) v = (float)m * 0.001953125f;  // m/8 * 2^-6
  else v = __int_as_float(((e + 120u) << 23) | (m << 20));
  return s ? -v : v;
}

__device__ __forceinline__ float e2m1f(u32 c) {
  const u32 e = (c >> 1) & 3u, m = c & 1u;
  float v = e == 0u ? 0.5f * (float)m : __int_as_float(((e + 126u) << 23) | (m << 22));
  return (c & 8u) ? -v : v;
}

__device__ __forceinline__ float weight_at(int fmt, const LinArgs &a, int r, int c) {
  switch (fmt) {
  case FMT_FP8:
  case FMT_MXFP8:
    return e4m3f(a.W[(long long)r * a.cols + c]) * e8m0(a.S[(long long)(r / a.sdivr) * a.sstride + c / a.sdivc]);
  case FMT_MXFP4: {
    const u32 byte = a.W[(long long)r * (a.cols / 2) + c / 2];
    return e2m1f((c & 1) ? byte >> 4 : byte & 15u) * e8m0(a.S[(long long)r * a.sstride + c / 32]);
  }
  case FMT_BF16: {
    const u16 h = reinterpret_cast<const u16 *>(a.W)[(long long)r * a.cols + c];
    return __int_as_float((u32)h << 16);
  }
  default:
    return reinterpret_cast<const float *>(a.W)[(long long)r * a.cols + c];
  }
}

__device__ __forceinline__ void linear_generic_body(const LinArgs &a, int fmt) {
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (r >= a.rows) return;
  const float *xg = a.x + (long long)(r / a.rpg) * a.cols;
  for (int b = 0; b < a.batch; b++) {
    float s = 0.f;
    for (int c = lane; c < a.cols; c += 32) s = fmaf(weight_at(fmt, a, r, c), xg[(long long)b * a.xstride + c], s);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) a.y[(long long)b * a.ystride + r] = s;
  }
}

// ---------------------------------------------------------------------------
// Tensor-core GEMM family (`lint_*`, `lintmulti_*`; LinearVariant{Width:
// WidthTC}): y[b, r] = sum_c W[r, c] x[b, c] for many batch rows (prefill),
// FP8Block, MXFP4 and BF16 weights. A block owns a tile of BM weight rows x
// BN batch rows and walks the columns in stages of TC_BK = 64; WM x WN warps
// each own (BM/WM) x (BN/WN) of the tile as MI x NI mma.sync m16n8k16
// fragments. Weights are the A operand, x the B operand.
//  - Loads: every stage's raw weight bytes and x (float32) go to shared
//    memory by cp.async (16 bytes each), ST stages in flight.
//  - k order: within a stage, thread (g = lane/4, t = lane%4) of a warp
//    takes, in k-step kk (0..3), the four columns 16t+4kk .. 16t+4kk+3 as
//    the mma's k indices 2t, 2t+1, 2t+8, 2t+9 (A and B agree, so the sum
//    is the same); its weight bytes of a stage are then one contiguous
//    16-byte (FP8), 8-byte (MXFP4) or 32-byte (BF16) run per row, and its
//    x values of a k-step one float4. x rows in shared memory are swizzled
//    (16-byte chunk c of row n at c ^ ((c >> 2) & 2) ^ (n & 1)), BF16
//    weight rows too (chunk c at c ^ (row & 1)), so those loads are free of
//    bank conflicts.
//  - FP8Block and MXFP4: weights are decoded to f16 (exact: every E4M3 and
//    E2M1 value is an f16 value) and multiplied by 2^(s - smax), s the
//    element's E8M0 scale and smax the largest scale of its row (FP8: of
//    its 128-row block), so that they stay within f16's range; the row's
//    sums are multiplied by 2^(smax - 127) at the end. That is exact while
//    a row's scales lie within 2^15 (FP8) or 2^23 (MXFP4) of its largest;
//    smaller ones lose low bits (f16 subnormals). x is split into hi =
//    f16(x) and lo = f16(2^11 (x - hi)), each with its own f32 accumulator
//    (y = acc_hi + 2^-11 acc_lo), so products carry about 22 bits of x
//    whatever its magnitude in f16's range (|x| < 65504).
//  - The tensor cores add into their f32 accumulator rounding toward zero
//    (a bias of up to an ulp per mma over a long chain), so the hi
//    products (BF16: all three parts) of each stage are chained from zero
//    and then added to the float32 sums with round-to-nearest; the lo chain
//    (weighted 2^-11) runs over all columns.
//  - BF16: weights are bf16 already (the bf16 mma, no decode); x is split
//    exactly into three bf16 parts (8 + 8 + 8 significant bits), all three
//    products accumulate in one f32 accumulator.
//  - Variants (template parameters): ST stages, OB the blocks per SM the
//    registers are capped for, SK split-K (column ranges over grid z, sums
//    added with atomics), XC the x split done once per block and stage in
//    shared memory instead of in every warp.
// Shapes: columns a multiple of 64 (MXFP4: of 128), FP8 blocks a power of
// two of at least 64; grouped weights need BM to divide the rows per group.
// Rows past the last and batch rows past a.batch are clamped on load and
// not stored.
#define TC_BK 64

template <int FMT> struct TC;
template <> struct TC<FMT_FP8>   { enum { AB = 64 }; };   // weight bytes of a row per stage
template <> struct TC<FMT_MXFP4> { enum { AB = 32 }; };
template <> struct TC<FMT_BF16>  { enum { AB = 128 }; };

__device__ __forceinline__ u32 smem_u32(const void *p) {
  u32 r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}

__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ void mma16816bf(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// d = A B (no addend: the chain starts from zero).
__device__ __forceinline__ void mma16816_0(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.f));
}
__device__ __forceinline__ void mma16816bf_0(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.f));
}

__device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
  u32 d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ u32 bf16x2_of(float lo, float hi) {
  u32 h;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(hi), "f"(lo));
  return h;
}

// 2^d (d <= 0) as an f16x2 pair; 0 below 2^-24.
__device__ __forceinline__ u32 f16pow2x2(int d) {
  const int e = d + 15;
  const u32 h = e > 0 ? (u32)e << 10 : (e > -10 ? 1u << (e + 9) : 0u);
  return h | (h << 16);
}

// Position of 16-byte chunk c (0..15) in x row n of a stage.
__device__ __forceinline__ int tc_xpos(int c, int n) { return c ^ ((c >> 2) & 2) ^ (n & 1); }

// Four E2M1 codes (bits 0..15, nibble i = element i) to four E4M3 bytes.
__device__ __forceinline__ u32 e2m1x4_e4m3(u32 w) {
  const u32 lutLo = 0x3C383000u, lutHi = 0x4C484440u;
  return __byte_perm(lutLo, lutHi, w & 0x7777u) | __byte_perm(0x8000u, 0u, (w >> 3) & 0x1111u);
}

// f16 hi/lo split of four x values as the mma's B halves: {hi(x0, x1),
// hi(x2, x3), lo(x0, x1), lo(x2, x3)}, lo = f16(2^11 (x - hi)).
__device__ __forceinline__ uint4 tc_split(const float4 v) {
  const u32 h0 = f16x2_of(v.x, v.y), h1 = f16x2_of(v.z, v.w);
  float f0, f1, f2, f3;
  h2x2(h0, f0, f1);
  h2x2(h1, f2, f3);
  return make_uint4(h0, h1, f16x2_of((v.x - f0) * 2048.f, (v.y - f1) * 2048.f), f16x2_of((v.z - f2) * 2048.f, (v.w - f3) * 2048.f));
}

// SK: split-K: block z of gridDim.z takes the z-th of gridDim.z equal
// column ranges and adds its sums into y with atomics (y zeroed before).
// XC (FP8/MXFP4): the block splits each stage's x into hi/lo once, in place
// (one stage ahead, so one stage less of loads is in flight), instead of
// every warp splitting the x values it reads.
template <int FMT, int BM, int BN, int WM, int WN, int ST, int SK, int XC>
__device__ __forceinline__ void tc_gemm(const LinArgs &a, u8 *smem) {
  constexpr int NT = WM * WN * 32;
  constexpr int MI = BM / WM / 16, NI = BN / WN / 8;
  constexpr int AB = TC<FMT>::AB;
  constexpr int ASZ = BM * AB;      // weight bytes of a stage
  constexpr int XSZ = BN * TC_BK;   // x floats of a stage
  constexpr bool F16 = FMT != FMT_BF16;
  constexpr bool XCV = XC && F16;
  static_assert(!XCV || ST >= 3, "the in-place split needs three stages");
  constexpr int NF = FMT == FMT_FP8 ? BM / 16 : BM;  // scale rows kept (FP8: one per 16-row fragment)
  static_assert(MI >= 1 && NI >= 1 && BM == MI * WM * 16 && BN == NI * WN * 8, "tile shape");
  __shared__ int smx[NF];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp % WM, wn = warp / WM;
  const int g = lane >> 2, t = lane & 3;
  const int r0 = blockIdx.x * BM, b0 = blockIdx.y * BN;
  if (r0 >= a.rows || b0 >= a.batch) return;  // uniform over the block
  int KT = a.cols / TC_BK, k0 = 0;  // stages [k0, k0 + KT)
  if (SK) {
    const int all = KT;
    k0 = (int)((long long)all * blockIdx.z / gridDim.z);
    KT = (int)((long long)all * (blockIdx.z + 1) / gridDim.z) - k0;
    if (KT <= 0) return;
  }
  const long long rowBytes = (long long)a.cols * AB / TC_BK;
  const float *xg = a.x + (long long)(r0 / a.rpg) * a.cols;
  u8 *As = smem;
  float *Xs = reinterpret_cast<float *>(smem + ST * ASZ);
  u8 *Ss = smem + ST * (ASZ + 4 * XSZ);
  const int ss = a.sstride;

  auto load = [&](int kt, int slot) {
    u8 *ad = As + slot * ASZ;
    constexpr int CA = AB / 16;  // 16-byte chunks of a weight row
#pragma unroll
    for (int i = tid; i < BM * CA; i += NT) {
      const int rr = i / CA, c = i % CA;
      const int row = min(r0 + rr, a.rows - 1);
      const int pc = FMT == FMT_BF16 ? c ^ (rr & 1) : c;
      cp_async16(ad + rr * AB + 16 * pc, a.W + row * rowBytes + (long long)kt * AB + 16 * c);
    }
    float *xd = Xs + slot * XSZ;
#pragma unroll
    for (int i = tid; i < BN * 16; i += NT) {
      const int n = i >> 4, c = i & 15;
      const int bn = min(b0 + n, a.batch - 1);
      cp_async16(xd + n * TC_BK + 4 * tc_xpos(c, n), xg + (long long)bn * a.xstride + kt * TC_BK + 4 * c);
    }
  };
  // In-place hi/lo split of a stage's x (XC): each 16-byte chunk of four
  // floats becomes tc_split's four f16x2 words.
  auto split = [&](int slot) {
    float *xd = Xs + slot * XSZ;
#pragma unroll
    for (int i = tid; i < BN * 16; i += NT) {
      uint4 *p = reinterpret_cast<uint4 *>(xd + 4 * i);
      *p = tc_split(*reinterpret_cast<const float4 *>(p));
    }
  };

#pragma unroll
  for (int s = 0; s < ST - 1; s++) {
    if (s < KT) load(k0 + s, s);
    cp_commit();
  }

  // Scales of the tile's rows (FP8: of each 16-row fragment's block) and
  // their maxima.
  if (FMT == FMT_FP8) {
    for (int i = tid; i < NF * ss; i += NT) {
      const int f = i / ss, j = i - f * ss;
      const int row = min(r0 + 16 * f, a.rows - 1);
      Ss[i] = a.S[(long long)(row >> a.srshift) * ss + j];
    }
  } else if (FMT == FMT_MXFP4) {
    const int ws = ss >> 2;  // ss is a multiple of 4 (columns a multiple of 128)
    for (int i = tid; i < NF * ws; i += NT) {
      const int rr = i / ws, j = i - rr * ws;
      const int row = min(r0 + rr, a.rows - 1);
      reinterpret_cast<u32 *>(Ss)[i] = __ldg(reinterpret_cast<const u32 *>(a.S + (long long)row * ss) + j);
    }
  }
  if (F16) {
    __syncthreads();
    for (int f = tid; f < NF; f += NT) {
      u32 m = 0;
      const u8 *p = Ss + f * ss;
      for (int j = 0; j < ss; j++) m = max(m, (u32)p[j]);
      smx[f] = (int)m;
    }
  }

  float acc[MI][NI][F16 ? 2 : 1][4];
#pragma unroll
  for (int mi = 0; mi < MI; mi++)
#pragma unroll
    for (int ni = 0; ni < NI; ni++)
#pragma unroll
      for (int h = 0; h < (F16 ? 2 : 1); h++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[mi][ni][h][i] = 0.f;

  float dh[MI][NI][4];  // this stage's hi (BF16: all) products, chained from zero
  const int wr = wm * MI * 16;  // the warp's first row in the tile
  const int wb = wn * NI * 8;   // its first batch row in the tile
  if constexpr (XCV) {
    cp_wait<ST - 2>();
    __syncthreads();
    split(0);
  }
  int slot = 0;
  for (int kt = 0; kt < KT; kt++) {
    if constexpr (XCV) cp_wait<ST - 3>();  // stages kt and kt+1 have landed
    else cp_wait<ST - 2>();
    __syncthreads();
    {
      const int nk = kt + ST - 1;
      int ns = slot + ST - 1;
      if (ns >= ST) ns -= ST;
      if (nk < KT) load(k0 + nk, ns);
      cp_commit();
    }
    if constexpr (XCV) {
      if (kt + 1 < KT) split(slot + 1 == ST ? 0 : slot + 1);
    }
    const u8 *Ab = As + slot * ASZ;
    const float *Xb = Xs + slot * XSZ;
    // The warp's weight words of this stage (rows g and g+8 of each
    // fragment) and, for FP8/MXFP4, their scale factors 2^(s - smax).
    uint4 wv[MI][2][FMT == FMT_BF16 ? 2 : 1];
    u32 fac[MI][2];
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int rr = wr + mi * 16 + g + 8 * h;
        if constexpr (FMT == FMT_FP8) {
          wv[mi][h][0] = *reinterpret_cast<const uint4 *>(Ab + rr * 64 + 16 * t);
          const int f = (wr >> 4) + mi;
          fac[mi][h] = f16pow2x2((int)Ss[f * ss + (((k0 + kt) * TC_BK) >> a.scshift)] - smx[f]);
        } else if constexpr (FMT == FMT_MXFP4) {
          const uint2 q = *reinterpret_cast<const uint2 *>(Ab + rr * 32 + 8 * t);
          wv[mi][h][0] = make_uint4(q.x, q.y, 0u, 0u);
          fac[mi][h] = f16pow2x2((int)Ss[rr * ss + (k0 + kt) * 2 + (t >> 1)] - smx[rr]);
        } else {
#pragma unroll
          for (int j = 0; j < 2; j++)
            wv[mi][h][j] = *reinterpret_cast<const uint4 *>(Ab + rr * 128 + 16 * ((2 * t + j) ^ (g & 1)));
          fac[mi][h] = 0u;
        }
      }
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      u32 bq[NI][F16 ? 2 : 3][2];
#pragma unroll
      for (int ni = 0; ni < NI; ni++) {
        const int n = wb + ni * 8 + g;
        const float4 v = *reinterpret_cast<const float4 *>(Xb + n * TC_BK + 4 * tc_xpos(4 * t + kk, n));
        if constexpr (F16) {
          const uint4 q = XCV ? make_uint4(__float_as_uint(v.x), __float_as_uint(v.y), __float_as_uint(v.z), __float_as_uint(v.w)) : tc_split(v);
          bq[ni][0][0] = q.x;
          bq[ni][0][1] = q.y;
          bq[ni][1][0] = q.z;
          bq[ni][1][1] = q.w;
        } else {
          const float xs[4] = {v.x, v.y, v.z, v.w};
          float r[4], m[4], l[4];
#pragma unroll
          for (int i = 0; i < 4; i++) {
            r[i] = xs[i] - __int_as_float(__float_as_int(xs[i]) & 0xFFFF0000u);
            m[i] = __int_as_float(__float_as_int(r[i]) & 0xFFFF0000u);
            l[i] = r[i] - m[i];
          }
          bq[ni][0][0] = __byte_perm(__float_as_uint(v.x), __float_as_uint(v.y), 0x7632);
          bq[ni][0][1] = __byte_perm(__float_as_uint(v.z), __float_as_uint(v.w), 0x7632);
          bq[ni][1][0] = __byte_perm(__float_as_uint(r[0]), __float_as_uint(r[1]), 0x7632);
          bq[ni][1][1] = __byte_perm(__float_as_uint(r[2]), __float_as_uint(r[3]), 0x7632);
          bq[ni][2][0] = bf16x2_of(l[0], l[1]);
          bq[ni][2][1] = bf16x2_of(l[2], l[3]);
        }
      }
#pragma unroll
      for (int mi = 0; mi < MI; mi++) {
        u32 a0, a1, a2, a3;  // rows g, g+8 at k 2t..; rows g, g+8 at k 2t+8..
        if constexpr (FMT == FMT_FP8) {
          const u32 wa = quarter(wv[mi][0][0], kk), wb8 = quarter(wv[mi][1][0], kk);
          a0 = hmul2(e4m3x2_h(wa), fac[mi][0]);
          a2 = hmul2(e4m3x2_h(wa >> 16), fac[mi][0]);
          a1 = hmul2(e4m3x2_h(wb8), fac[mi][1]);
          a3 = hmul2(e4m3x2_h(wb8 >> 16), fac[mi][1]);
        } else if constexpr (FMT == FMT_MXFP4) {
          const int sh = 16 * (kk & 1);
          const u32 ea = e2m1x4_e4m3((kk < 2 ? wv[mi][0][0].x : wv[mi][0][0].y) >> sh);
          const u32 eb = e2m1x4_e4m3((kk < 2 ? wv[mi][1][0].x : wv[mi][1][0].y) >> sh);
          a0 = hmul2(e4m3x2_h(ea), fac[mi][0]);
          a2 = hmul2(e4m3x2_h(ea >> 16), fac[mi][0]);
          a1 = hmul2(e4m3x2_h(eb), fac[mi][1]);
          a3 = hmul2(e4m3x2_h(eb >> 16), fac[mi][1]);
        } else {
          const uint4 &qa = wv[mi][0][kk >> 1], &qb = wv[mi][1][kk >> 1];
          a0 = (kk & 1) ? qa.z : qa.x;
          a2 = (kk & 1) ? qa.w : qa.y;
          a1 = (kk & 1) ? qb.z : qb.x;
          a3 = (kk & 1) ? qb.w : qb.y;
        }
#pragma unroll
        for (int ni = 0; ni < NI; ni++) {
          if constexpr (F16) {
            if (kk == 0) mma16816_0(dh[mi][ni], a0, a1, a2, a3, bq[ni][0][0], bq[ni][0][1]);
            else mma16816(dh[mi][ni], a0, a1, a2, a3, bq[ni][0][0], bq[ni][0][1]);
            mma16816(acc[mi][ni][1], a0, a1, a2, a3, bq[ni][1][0], bq[ni][1][1]);
          } else {
            if (kk == 0) mma16816bf_0(dh[mi][ni], a0, a1, a2, a3, bq[ni][0][0], bq[ni][0][1]);
            else mma16816bf(dh[mi][ni], a0, a1, a2, a3, bq[ni][0][0], bq[ni][0][1]);
#pragma unroll
            for (int p = 1; p < 3; p++) mma16816bf(dh[mi][ni], a0, a1, a2, a3, bq[ni][p][0], bq[ni][p][1]);
          }
        }
      }
    }
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
      for (int ni = 0; ni < NI; ni++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[mi][ni][0][i] += dh[mi][ni][i];
    if (++slot == ST) slot = 0;
  }
  cp_wait<0>();

  // Thread (g, t) holds rows g, g+8 of each fragment at batch rows 2t, 2t+1.
#pragma unroll
  for (int mi = 0; mi < MI; mi++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int rr = wr + mi * 16 + g + 8 * h, row = r0 + rr;
      float sc = 1.f;
      if (F16) sc = e8m0_exp((u32)smx[FMT == FMT_FP8 ? (wr >> 4) + mi : rr]);
      if (row < a.rows) {
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
          for (int j = 0; j < 2; j++) {
            const int b = b0 + wb + ni * 8 + 2 * t + j;
            if (b < a.batch) {
              float v = acc[mi][ni][0][2 * h + j];
              if constexpr (F16) v = fmaf(acc[mi][ni][1][2 * h + j], 1.f / 2048.f, v) * sc;
              if (SK) atomicAdd(a.y + (long long)b * a.ystride + row, v);
              else a.y[(long long)b * a.ystride + row] = v;
            }
          }
      }
    }
}

// Kernel names: lint_<fmt>_<BM>x<BN>_w<WM>x<WN>_s<ST>_o<OB> (OB: the blocks
// per SM the registers are capped for; one LinArgs; grid
// (row tiles, batch tiles)) and lintmulti_... (a LinArgs table; grid.z picks
// the record, blocks past a record's rows or batch exit). Dynamic shared
// memory: ST * (BM * AB + 256 * BN) bytes plus the scale rows (FP8: BM/16
// rows, MXFP4: BM rows, of a.sstride bytes).
#define LINTC(FMTN, FMT, BM, BN, WM, WN, ST, OB) LINTS(FMTN, FMT, BM, BN, WM, WN, ST, OB) LINTM(FMTN, FMT, BM, BN, WM, WN, ST, OB)
#define LINTS(FMTN, FMT, BM, BN, WM, WN, ST, OB) \
  extern "C" __global__ void __launch_bounds__(WM * WN * 32, OB) lint_##FMTN##_##BM##x##BN##_w##WM##x##WN##_s##ST##_o##OB(LinArgs a) { MOXIE_PDL(); \
    extern __shared__ uint4 smem_t[]; \
    tc_gemm<FMT, BM, BN, WM, WN, ST, 0, 0>(a, reinterpret_cast<u8 *>(smem_t)); }
// The in-place x split (XC): lint_..._o<OB>_x (LINTX) and lintmulti_..._o<OB>_x (LINTXM).
#define LINTX(FMTN, FMT, BM, BN, WM, WN, ST, OB) \
  extern "C" __global__ void __launch_bounds__(WM * WN * 32, OB) lint_##FMTN##_##BM##x##BN##_w##WM##x##WN##_s##ST##_o##OB##_x(LinArgs a) { MOXIE_PDL(); \
    extern __shared__ uint4 smem_t[]; \
    tc_gemm<FMT, BM, BN, WM, WN, ST, 0, 1>(a, reinterpret_cast<u8 *>(smem_t)); }
#define LINTXM(FMTN, FMT, BM, BN, WM, WN, ST, OB) \
  extern "C" __global__ void __launch_bounds__(WM * WN * 32, OB) lintmulti_##FMTN##_##BM##x##BN##_w##WM##x##WN##_s##ST##_o##OB##_x(const LinArgs *__restrict__ all) { MOXIE_PDL(); \
    extern __shared__ uint4 smem_t[]; \
    const LinArgs a = all[blockIdx.z]; \
    tc_gemm<FMT, BM, BN, WM, WN, ST, 0, 1>(a, reinterpret_cast<u8 *>(smem_t)); }
// Split-K single launches: lint_..._o<OB>_k (grid z: the column ranges).
#define LINTK(FMTN, FMT, BM, BN, WM, WN, ST, OB) \
  extern "C" __global__ void __launch_bounds__(WM * WN * 32, OB) lint_##FMTN##_##BM##x##BN##_w##WM##x##WN##_s##ST##_o##OB##_k(LinArgs a) { MOXIE_PDL(); \
    extern __shared__ uint4 smem_t[]; \
    tc_gemm<FMT, BM, BN, WM, WN, ST, 1, 0>(a, reinterpret_cast<u8 *>(smem_t)); }
#define LINTM(FMTN, FMT, BM, BN, WM, WN, ST, OB) \
  extern "C" __global__ void __launch_bounds__(WM * WN * 32, OB) lintmulti_##FMTN##_##BM##x##BN##_w##WM##x##WN##_s##ST##_o##OB(const LinArgs *__restrict__ all) { MOXIE_PDL(); \
    extern __shared__ uint4 smem_t[]; \
    const LinArgs a = all[blockIdx.z]; \
    tc_gemm<FMT, BM, BN, WM, WN, ST, 0, 0>(a, reinterpret_cast<u8 *>(smem_t)); }
#define LINTC3(BM, BN, WM, WN, ST, OB) \
  LINTC(fp8, FMT_FP8, BM, BN, WM, WN, ST, OB) LINTC(mxfp4, FMT_MXFP4, BM, BN, WM, WN, ST, OB) LINTC(bf16, FMT_BF16, BM, BN, WM, WN, ST, OB)
// Single launches of the three formats and the MXFP4 multi launch.
#define LINTC1(BM, BN, WM, WN, ST, OB) \
  LINTS(fp8, FMT_FP8, BM, BN, WM, WN, ST, OB) LINTS(mxfp4, FMT_MXFP4, BM, BN, WM, WN, ST, OB) LINTS(bf16, FMT_BF16, BM, BN, WM, WN, ST, OB) \
  LINTM(mxfp4, FMT_MXFP4, BM, BN, WM, WN, ST, OB)

//@module linear
// The default variant's kernels: narrow family, hardware E4M3 decoder, two
// rows per block (odd row counts are clamped; grouped shapes with odd rows per
// group use linear_generic), every batch tile; the multi-projection launch;
// and the vec family at batch tile 1 (automatic for short rows, see
// vecAutoCols in linear.go).
LINV_U(LINV, fp8, FMT_FP8, 1, 0, 0)
LINV_U(LINV, mxfp8, FMT_MXFP8, 1, 0, 0)
LINV_U(LINV, mxfp4, FMT_MXFP4, 1, 0, 0)
LINV_U(LINVM, fp8, FMT_FP8, 1, 0, 0)
LINV_U(LINVM, mxfp4, FMT_MXFP4, 1, 0, 0)
LIN_NB(fp8, FMT_FP8, 2, 4, 0, _d0)
LIN_NB(mxfp8, FMT_MXFP8, 2, 4, 0, _d0)
LIN_NB(mxfp4, FMT_MXFP4, 2, 4, 0, _d0)
LIN_NB(bf16, FMT_BF16, 2, 4, 0, _d0)
LIN_NB(f32, FMT_F32, 2, 4, 0, _d0)
LINM_NB(fp8, FMT_FP8, 2, 4, 0, _d0)
LINM_NB(mxfp4, FMT_MXFP4, 2, 4, 0, _d0)
LINM_NB(bf16, FMT_BF16, 2, 4, 0, _d0)

extern "C" __global__ void linear_generic(LinArgs a, int fmt) { MOXIE_PDL(); linear_generic_body(a, fmt); }

// Tensor-core GEMM family (batch >= tcMinBatch, see tcAutoTile,
// multiAutoTile and planMultiTC in linear.go): the automatic tile shapes,
// single launches 128x64 and 64x32, multi launches (expert tiles, shared
// expert sets) 64x32 (every format) and 128x64 (FP8 and MXFP4).
LINTS(fp8, FMT_FP8, 128, 64, 4, 2, 4, 1) LINTS(mxfp4, FMT_MXFP4, 128, 64, 4, 2, 4, 1) LINTS(bf16, FMT_BF16, 128, 64, 4, 2, 4, 1)
LINTM(fp8, FMT_FP8, 128, 64, 4, 2, 4, 1) LINTM(mxfp4, FMT_MXFP4, 128, 64, 4, 2, 4, 1)
LINTC3(64, 32, 2, 2, 4, 1)

// Launch/graph overhead probe: adds v to p[threadIdx.x].
extern "C" __global__ void tiny_add(float *p, float v) { MOXIE_PDL();
  p[threadIdx.x] += v;
}

// Busy-waits ns nanoseconds (by the global timer) so that the host can queue
// the launches to be timed behind it: the events then time back-to-back
// kernels, not the host's launch rate.
extern "C" __global__ void spin(long long ns) { MOXIE_PDL();
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while ((long long)(t - t0) < ns);
}

// Reads n float4 once each (4 per thread, coalesced): the HBM read ceiling.
extern "C" __global__ void read_bw4(const float4 *__restrict__ p, long long n, float *out) { MOXIE_PDL();
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < 4; k++) {
    long long i = ((long long)blockIdx.x * 4 + k) * blockDim.x + threadIdx.x;
    if (i < n) {
      float4 v = __ldg(p + i);
      s += v.x + v.y + v.z + v.w;
    }
  }
  if (s == 1234.5678f) out[0] = s;
}

//@module bench
// Narrow family with the integer E4M3 decoder (_d1), and four rows per block.
LIN_NB(fp8, FMT_FP8, 2, 4, 1, _d1)
LIN_NB(mxfp8, FMT_MXFP8, 2, 4, 1, _d1)
LIN_NB(mxfp4, FMT_MXFP4, 2, 4, 1, _d1)
LINM_NB(fp8, FMT_FP8, 2, 4, 1, _d1)
LINM_NB(mxfp4, FMT_MXFP4, 2, 4, 1, _d1)
LIN(fp8, FMT_FP8, 1, 4, 4, 0, _d0)
LIN(fp8, FMT_FP8, 4, 4, 4, 0, _d0)
LIN(mxfp4, FMT_MXFP4, 1, 4, 4, 0, _d0)
LIN(mxfp4, FMT_MXFP4, 4, 4, 4, 0, _d0)
LIN(bf16, FMT_BF16, 1, 4, 4, 0, _d0)
LIN(bf16, FMT_BF16, 4, 4, 4, 0, _d0)
// Wide family (16-byte words, blocks of KW warps), two or four rows per block.
LINW_NB(fp8, FMT_FP8, 2, 2, 0)
LINW_NB(mxfp8, FMT_MXFP8, 2, 2, 0)
LINW_NB(mxfp4, FMT_MXFP4, 2, 2, 0)
LINW(fp8, FMT_FP8, 1, 4, 2, 0)
LINW(fp8, FMT_FP8, 4, 4, 2, 0)
LINW(mxfp4, FMT_MXFP4, 1, 4, 2, 0)
LINW(mxfp4, FMT_MXFP4, 4, 4, 2, 0)
// Vec family: batch tiles 2 and 4 (tile 1 is in the default module), the
// three tile shapes, hardware decoder.
LINV_U(LINV, fp8, FMT_FP8, 2, 0, 0) LINV_U(LINV, fp8, FMT_FP8, 4, 0, 0)
LINV_U(LINV, mxfp8, FMT_MXFP8, 2, 0, 0) LINV_U(LINV, mxfp8, FMT_MXFP8, 4, 0, 0)
LINV_U(LINV, mxfp4, FMT_MXFP4, 2, 0, 0) LINV_U(LINV, mxfp4, FMT_MXFP4, 4, 0, 0)
LINV_U(LINVM, fp8, FMT_FP8, 2, 0, 0) LINV_U(LINVM, fp8, FMT_FP8, 4, 0, 0)
LINV_U(LINVM, mxfp4, FMT_MXFP4, 2, 0, 0) LINV_U(LINVM, mxfp4, FMT_MXFP4, 4, 0, 0)
// Vec family: the integer/f16-bit decoders and the streaming load hint.
LINV_U(LINV, fp8, FMT_FP8, 1, 1, 0)
LINV_NB(LINV, mxfp4, FMT_MXFP4, 1, 0)
LINV_NB(LINVM, mxfp4, FMT_MXFP4, 1, 0)
LINV_U(LINV, fp8, FMT_FP8, 1, 0, 1)
LINV_U(LINV, mxfp4, FMT_MXFP4, 1, 0, 1)
LINV_U(LINVM, mxfp4, FMT_MXFP4, 1, 0, 1)
// MMA family: batch tiles 1, 2, 4; FP8 four 64-column spans, MXFP4 eight
// scale groups in flight per chunk.
LINMMA(fp8, FMT_FP8, 1, 4) LINMMA(fp8, FMT_FP8, 2, 4) LINMMA(fp8, FMT_FP8, 4, 4)
LINMMA(mxfp4, FMT_MXFP4, 1, 8) LINMMA(mxfp4, FMT_MXFP4, 2, 8) LINMMA(mxfp4, FMT_MXFP4, 4, 8)
//@module tc
// Tensor-core GEMM family: the tile shapes the automatic choice does not use
// (LinearVariant.Tile 3..17; multi launches for MXFP4 only: FP8 multi
// launches take tiles 1 and 2, BF16 ones tile 2, both in the default module).
LINTC1(128, 128, 2, 4, 3, 1)
LINTC1(128, 128, 4, 2, 3, 1)
LINTC1(128, 64, 4, 2, 3, 1)
LINTC1(64, 64, 2, 2, 4, 1)
LINTC1(128, 32, 4, 2, 4, 1)
LINTC1(256, 64, 4, 2, 3, 1)
LINTC1(128, 64, 4, 2, 3, 2)
LINTC1(64, 64, 2, 2, 4, 3)
// The in-place x split (tiles 11..14; FP8 and MXFP4 single launches, MXFP4
// multi launches).
LINTX(fp8, FMT_FP8, 128, 64, 4, 2, 4, 1) LINTX(mxfp4, FMT_MXFP4, 128, 64, 4, 2, 4, 1) LINTXM(mxfp4, FMT_MXFP4, 128, 64, 4, 2, 4, 1)
LINTX(fp8, FMT_FP8, 64, 32, 2, 2, 4, 1) LINTX(mxfp4, FMT_MXFP4, 64, 32, 2, 2, 4, 1) LINTXM(mxfp4, FMT_MXFP4, 64, 32, 2, 2, 4, 1)
LINTX(fp8, FMT_FP8, 128, 128, 2, 4, 4, 1) LINTX(mxfp4, FMT_MXFP4, 128, 128, 2, 4, 4, 1) LINTXM(mxfp4, FMT_MXFP4, 128, 128, 2, 4, 4, 1)
// 16 batch rows (expert tiles of a dozen rows: tiles 14 and 15).
LINTX(fp8, FMT_FP8, 64, 16, 4, 1, 4, 1) LINTX(mxfp4, FMT_MXFP4, 64, 16, 4, 1, 4, 1) LINTXM(mxfp4, FMT_MXFP4, 64, 16, 4, 1, 4, 1)
LINTC1(64, 16, 4, 1, 4, 1)
// Tall tiles (16 and 17): warps of 32x32 as in 128x64, fewer x bytes per
// product (x: 256 bytes a batch row and stage, MXFP4 weights 32 a row).
// 256x64, 16 warps (registers capped at 128: ptxas 11.8 spills ~128 bytes);
// 256x32, 8 warps (182 registers, no spills; batch tails of 32 rows).
LINTC1(256, 64, 8, 2, 4, 1)
LINTC1(256, 32, 8, 1, 4, 1)
// Split-K versions of the two automatic tiles (LinearVariant.SplitK > 1).
LINTK(fp8, FMT_FP8, 128, 64, 4, 2, 4, 1) LINTK(mxfp4, FMT_MXFP4, 128, 64, 4, 2, 4, 1) LINTK(bf16, FMT_BF16, 128, 64, 4, 2, 4, 1)
LINTK(fp8, FMT_FP8, 64, 32, 2, 2, 4, 1) LINTK(mxfp4, FMT_MXFP4, 64, 32, 2, 2, 4, 1) LINTK(bf16, FMT_BF16, 64, 32, 2, 2, 4, 1)
