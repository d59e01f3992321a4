// Shared definitions of moxie's CUDA kernels (prepended to each module's source).
// Quantized linear kernels for moxie: y[b, r] = sum_c W[r, c] * x[b, c].
// Weights are read in their stored formats straight from device memory and
// decoded in registers; accumulation is float32. No headers: NVRTC needs none.
//
// Layout of the fast kernels: a block of KW warps owns RB consecutive rows;
// the row's words (4 or 8 columns each) are split over the KW warps in chunks
// of 32*U words; every lane issues U*RB weight loads before using any (bytes
// in flight), then reads x (float4, coalesced across the warp, L1-resident)
// and accumulates. Partial sums are reduced by shuffles and shared memory.

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
  u32 b = s << 23;                  // 2^(s-127) for s in 1..254
  b = s == 0u ? 0x00400000u : b;    // 2^-127 (subnormal)
  b = s == 255u ? 0x7fc00000u : b;  // NaN
  return __int_as_float(b);
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

template <int FMT> struct Wide;
template <> struct Wide<FMT_FP8>   { enum { CPW = 16 }; };
template <> struct Wide<FMT_MXFP8> { enum { CPW = 16 }; };
template <> struct Wide<FMT_MXFP4> { enum { CPW = 32 }; };

__device__ __forceinline__ u32 quarter(const uint4 &w, int q) {
  return q == 0 ? w.x : (q == 1 ? w.y : (q == 2 ? w.z : w.w));
}

