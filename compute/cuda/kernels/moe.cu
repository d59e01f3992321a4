// Fused MoE decode kernels for moxie (one token, batch 1): the K routed
// experts selected on the device (MXFP4 w1/w3/w2, records of an ExpertTable)
// plus an optional shared expert (FP8 block w1/w3/w2), in two launches:
//
//   moe1_*: h[k] = SwiGLU(w1_k·x, w3_k·x) · rw[k] (clamped by limit) for the
//           K routed experts and h[K] = SwiGLU(w1_s·x, w3_s·x) for the shared
//           one; one block per 16-row tile of (w1, w3) of one expert.
//   moe2_*: out[d] = Σ_k (w2_k·h[k])[d] + (w2_s·h[K])[d], written (not
//           accumulated); one block per 16 output rows, the sum in a fixed
//           order (deterministic).
//
// Both use tensor cores (mma.sync m16n8k16, f16 inputs, f32 accumulation).
// The weights are the A operand, exact in f16: an E2M1 code becomes the
// f16 value v·2^-14 by bit placement (sign to bit 15, exponent and mantissa
// bits to bits 11..9; code 0.5 lands on the f16 subnormal 2^-15), built with
// two shift/mask steps per 32-bit word and one PRMT per f16 pair (decoder 0),
// or becomes the E4M3 byte of v·2^-6 the same way and then the f16 of it by
// the hardware cvt.rn.f16x2.e4m3x2 (decoder 1, no f16 subnormals); FP8
// weights use that conversion directly. The activation vector v (x in stage
// 1, h in stage 2) is the B operand as two f16 columns: hi = f16(v) and
// lo = f16((v - hi)·2^11), so a product carries about 22 significant bits of
// v (|v| must stay below 65504); the result is d_hi + d_lo·2^-11.
//
// Fragment layout (m16n8k16): thread (g = lane/4, t = lane%4) holds rows g
// and g+8 of a 16-row tile. MXFP4: a 16-byte span of a row is one 32-column
// scale group; thread t takes its 4-byte word t (8 codes, columns 8t..8t+7)
// of rows g and g+8, which feed two mmas; the decoder pairs codes (j, j+4),
// so the B vectors are stored with each 8 columns permuted as
// [0,4,1,5,2,6,3,7] ("routed layout") and one 16-byte load gives a thread
// its four B registers of a span. FP8: a span is 64 columns (one FP8 block
// scale covers it and the 16 rows); thread t takes the 16 bytes at 16t of
// rows g and g+8 (four mmas), B in natural column order ("natural layout").
// Lanes with g = 0 supply the hi column, g = 1 the lo column, the others
// zeros; so lanes with t = 0 receive row g's (hi, lo) sums in d[0], d[1]
// and row g+8's in d[2], d[3].
//
// E8M0 scales are read as 2^(s-127) through the bits s << 23 (s = 0 reads as
// 0 and s = 255 as infinity rather than 2^-127 and NaN: no sane quantizer
// emits either), applied per span to the mma result.
//
// Programmatic dependent launch: every kernel starts with MOXIE_PDL()
// (waits for the previous kernel on the stream, then lets the next one
// launch), so stage 2's blocks are resident and waiting while stage 1's
// last wave runs, and stage 1's while the kernel before it finishes; the
// one-tile-a-block kernels with MOXIE_PDL_PF (moe1_pf, moe2_pf: the shared
// expert's weights asked into L2 while they wait).
//
// The file has three sections, split by the "//@module" lines
// (compute/cuda/moe.go, MoEModuleSources): "common" (types, decoders,
// templates, the kernel-defining macros; no kernels) is part of both
// modules; "moe" is the default module, the kernels a decode session
// launches by default, compiled on a user's first run; "bench" holds every
// other variant, compiled only when one of its kernels is first asked for.
// nvcc can compile the whole file as one unit.

//@module common
//@pdl

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// LinRec mirrors struct LinArgs of kernels/linear.cu (the ExpertTable
// records); only W and S are read here.
struct LinRec {
  const u8 *W;
  const u8 *S;
  const float *x;
  float *y;
  int rows, cols, sdivr, sdivc, srshift, scshift, sstride, rpg, xstride, ystride, batch;
};
static_assert(sizeof(LinRec) == 80, "LinRec must mirror LinArgs (80 bytes)");

// HcEpi is the sublayer boundary that a producer of a model-width output
// o [D] begins in its epilogue (moe2lh, gemvmh_*; see hc_epi_finish).
struct HcEpi {
  const float *x;     // [4, D] the boundary's streams
  const float *post;  // [4] the previous boundary's post
  const float *comb;  // [4, 4] and comb
  const float *fn;    // [nm, 4·D] F32: the boundary's hc_fn
  float *xout;        // [4, D] x'
  float *part;        // [nm + 1 (+ 10 with gram), D/16] the partials
  int nm;             // MOE_HC_NM (0: no epilogue)
  int gram;           // non-zero: also the streams' Gram partials (rows nm + 1 ..; see hc_epi_finish)
};
static_assert(sizeof(HcEpi) == 56, "HcEpi must mirror hcEpiArgs (56 bytes)");

// MOE_HC_NM is the epilogue's hc_fn rows (a mix site of 4 streams: (2 + 4)·4).
#define MOE_HC_NM 24

// MoeArgs mirrors moeArgs in compute/cuda/moe.go (E at byte 104, limit at 128).
struct MoeArgs {
  const LinRec *t13;  // table: expert e's w1 record at 2e, w3 at 2e+1
  const LinRec *t2;   // table: expert e's w2 record at e
  const int *ids;     // [K] expert ids
  const float *rw;    // [K] route weights, or null (weight 1)
  const float *x;     // [D]
  u16 *h;             // K rows of 2*I halves (routed layout), then 2*Is (natural)
  float *out;         // [D]
  const u8 *s1, *s3, *s2;  // shared expert FP8 data (null when none)
  const u8 *c1, *c3, *c2;  // their block scales
  int E, K, D, I, Is;      // Is = 0: no shared expert
  int bshift;              // log2 of the shared expert's FP8 block edge
  float limit;             // routed clamp (0: none)
  float *part;             // split stage 2 (moe2s): SP·D partial sums, then D/16 tickets (u32, zero between runs); moe1lxh: the shared halves' sums and tickets (stage1_finish_half); else unused
  HcEpi hc;                // the boundary after the MoE, begun by stage 2 (moe2lh); hc.nm 0 elsewhere
};
static_assert(sizeof(MoeArgs) == 200, "MoeArgs must mirror moeArgs (200 bytes)");

#define MOE_WARPS 8
#define MOE_THREADS (32 * MOE_WARPS)
#define MOE_MAXK 64  // moeMaxK in compute/cuda/moe.go

__device__ __forceinline__ void moe_prefetch(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

__device__ __forceinline__ void mma16816(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Eight E2M1 codes (nibble i = column i) to four f16x2 of value·2^-14:
// h0 = (c0, c4), h1 = (c1, c5), h2 = (c2, c6), h3 = (c3, c7) (low half
// first). ev holds the even codes one per byte as f16 high bytes (sign at
// bit 7, exponent and mantissa at bits 3..1), od the odd ones; a PRMT then
// puts two of those bytes into the high bytes of an f16 pair (low bytes
// zero: every E2M1 value has at most one mantissa bit).
__device__ __forceinline__ void e2m1_f16x4(u32 w, u32 &h0, u32 &h1, u32 &h2, u32 &h3) {
  const u32 ev = ((w << 1) & 0x0E0E0E0Eu) | ((w << 4) & 0x80808080u);
  const u32 od = ((w >> 3) & 0x0E0E0E0Eu) | (w & 0x80808080u);
  h0 = __byte_perm(ev, 0u, 0x2404);
  h2 = __byte_perm(ev, 0u, 0x3414);
  h1 = __byte_perm(od, 0u, 0x2404);
  h3 = __byte_perm(od, 0u, 0x3414);
}

__device__ __forceinline__ u32 e4m3x2_f16x2(u32 w16) {
  u32 h;
  asm("{ .reg .b16 lo; cvt.u16.u32 lo, %1; cvt.rn.f16x2.e4m3x2 %0, lo; }" : "=r"(h) : "r"(w16));
  return h;
}

// The E4M3 codes of v·inv (round to nearest even, saturating at ±448), x
// in the lowest byte.
__device__ __forceinline__ u32 q8x4(float4 v, float inv) {
  u32 r;
  asm("{ .reg .b16 l, h; cvt.rn.satfinite.e4m3x2.f32 l, %2, %1; cvt.rn.satfinite.e4m3x2.f32 h, %4, %3; mov.b32 %0, {l, h}; }"
      : "=r"(r) : "f"(v.x * inv), "f"(v.y * inv), "f"(v.z * inv), "f"(v.w * inv));
  return r;
}

// The same codes (same pairing) placed into E4M3 bytes instead (sign to bit
// 7, exponent and mantissa bits to bits 4..2: value·2^-6, code 0.5 the E4M3
// subnormal 2^-7), then converted by the hardware cvt.rn.f16x2.e4m3x2: the
// f16 values v·2^-6 are all normal (no f16 subnormals reach the mma).
__device__ __forceinline__ void e2m1_f16x4_cvt(u32 w, u32 &h0, u32 &h1, u32 &h2, u32 &h3) {
  const u32 ev = ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u);
  const u32 od = ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u);
  h0 = e4m3x2_f16x2(__byte_perm(ev, 0u, 0x20));
  h2 = e4m3x2_f16x2(__byte_perm(ev, 0u, 0x31));
  h1 = e4m3x2_f16x2(__byte_perm(od, 0u, 0x20));
  h3 = e4m3x2_f16x2(__byte_perm(od, 0u, 0x31));
}

// MoeDec<DEC>: DEC 0 f16 bit placement (values ·2^-14), 1 E4M3 bit
// placement and cvt (values ·2^-6); post() undoes the factor.
template <int DEC> struct MoeDec;
template <> struct MoeDec<0> {
  static __device__ __forceinline__ void run(u32 w, u32 &a, u32 &b, u32 &c, u32 &d) { e2m1_f16x4(w, a, b, c, d); }
  static __device__ __forceinline__ float post() { return 16384.f; }
};
template <> struct MoeDec<1> {
  static __device__ __forceinline__ void run(u32 w, u32 &a, u32 &b, u32 &c, u32 &d) { e2m1_f16x4_cvt(w, a, b, c, d); }
  static __device__ __forceinline__ float post() { return 64.f; }
};

// Byte j (compile-time) of a word of four E8M0 scales, as the float 2^(s-127).
template <int J> __device__ __forceinline__ float e8m0_byte(u32 w) {
  return __int_as_float(J == 3 ? (w >> 1) & 0x7F800000u : (w << (23 - 8 * J)) & 0x7F800000u);
}
__device__ __forceinline__ float e8m0_at(u32 w, int j) {
  return j == 0 ? e8m0_byte<0>(w) : j == 1 ? e8m0_byte<1>(w) : j == 2 ? e8m0_byte<2>(w) : e8m0_byte<3>(w);
}

__device__ __forceinline__ u32 quarter(const uint4 &w, int q) {
  return q == 0 ? w.x : (q == 1 ? w.y : (q == 2 ? w.z : w.w));
}

template <bool GLOBAL> __device__ __forceinline__ uint4 ldb(const u16 *p) {
  if (GLOBAL) return __ldg(reinterpret_cast<const uint4 *>(p));
  return *reinterpret_cast<const uint4 *>(p);
}

// Weight loads: read-only path, and L2 asked to fetch the surrounding 256
// bytes (a warp's next spans of the row), so a warp's later chunks of a row
// hit L2.
// (Session 19: L1::no_allocate added to these made stage 1 and the pair
// slower in the moe-mb harness; not kept.)
__device__ __forceinline__ u32 ldw(const u32 *p) {
  u32 v;
  asm("ld.global.nc.L2::256B.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint4 ldw(const uint4 *p) {
  uint4 v;
  asm("ld.global.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// One chunk of U MXFP4 spans (32 columns each) of NM matrices' 16-row
// tiles, in registers: load() issues every word and scale load (and, with
// GB 1, the B vectors from global memory), compute() uses them (GB 0
// reads B from shared memory there, GB 2 from global memory). wr[m][r] are
// the u32 words of rows g (r = 0) and g+8 (r = 1) of matrix m, sr[m][r]
// those rows' scale bytes as u32 words. xb is this lane's B row (hi or lo,
// routed layout), bl whether the lane supplies B. U is a multiple of 4 and
// spans of 4 (scale words never straddle). GUARD: the chunk may pass the
// last span.
template <int NM, int U, int GB>
struct Fp4Chunk {
  u32 w[U][NM][2];
  u32 sc[U / 4][NM][2];
  uint4 b[GB == 1 ? U : 1];

  template <bool GUARD>
  __device__ __forceinline__ void load(const u32 *const (&wr)[NM][2], const u32 *const (&sr)[NM][2], const u16 *xb, bool bl,
                                       int s0, int spans, int t) {
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int s = s0 + u;
#pragma unroll
      for (int m = 0; m < NM; m++)
#pragma unroll
        for (int r = 0; r < 2; r++) w[u][m][r] = (!GUARD || s < spans) ? ldw(wr[m][r] + s * 4 + t) : 0u;
    }
#pragma unroll
    for (int q = 0; q < U / 4; q++) {
      const int s = s0 + 4 * q;
#pragma unroll
      for (int m = 0; m < NM; m++)
#pragma unroll
        for (int r = 0; r < 2; r++) sc[q][m][r] = (!GUARD || s < spans) ? __ldg(sr[m][r] + (s >> 2)) : 0u;
    }
    if (GB == 1) {
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int s = s0 + u;
        b[u] = make_uint4(0u, 0u, 0u, 0u);
        if (bl && (!GUARD || s < spans)) b[u] = ldb<true>(xb + s * 32 + 8 * t);
      }
    }
  }

  template <int DEC, bool GUARD>
  __device__ __forceinline__ void compute(const u16 *xb, bool bl, int s0, int spans, int t, float (&acc)[NM][4]) {
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int s = s0 + u;
      if (GUARD && s >= spans) break;
      uint4 bq = make_uint4(0u, 0u, 0u, 0u);
      if (GB == 1) bq = b[u];
      else if (bl) bq = ldb<GB == 2>(xb + s * 32 + 8 * t);
#pragma unroll
      for (int m = 0; m < NM; m++) {
        u32 a0, a1, a2, a3, b0, b1, b2, b3;
        MoeDec<DEC>::run(w[u][m][0], a0, a1, a2, a3);
        MoeDec<DEC>::run(w[u][m][1], b0, b1, b2, b3);
        float d[4] = {0.f, 0.f, 0.f, 0.f};
        mma16816(d, a0, b0, a1, b1, bq.x, bq.y);
        mma16816(d, a2, b2, a3, b3, bq.z, bq.w);
        const float fa = e8m0_at(sc[u / 4][m][0], u & 3), fb = e8m0_at(sc[u / 4][m][1], u & 3);
        acc[m][0] = fmaf(d[0], fa, acc[m][0]);
        acc[m][1] = fmaf(d[1], fa, acc[m][1]);
        acc[m][2] = fmaf(d[2], fb, acc[m][2]);
        acc[m][3] = fmaf(d[3], fb, acc[m][3]);
      }
    }
  }
};

// One chunk of U FP8 spans (64 columns each) of NM matrices' 16-row tiles
// (rows g and g+8 as 16-byte words wr[m][r]); sr[m] is the tile's row of
// block scales, bshift log2 of the block edge (>= 6). B in natural layout
// (from global memory in load() with GB, from shared memory otherwise).
template <int NM, int U, bool GB>
struct Fp8Chunk {
  uint4 w[U][NM][2];
  u32 sc[U][NM];
  uint4 b[GB ? U : 1][2];

  template <bool GUARD>
  __device__ __forceinline__ void load(const uint4 *const (&wr)[NM][2], const u8 *const (&sr)[NM], int bshift, const u16 *xb, bool bl,
                                       int s0, int spans, int t) {
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int s = s0 + u;
#pragma unroll
      for (int m = 0; m < NM; m++) {
#pragma unroll
        for (int r = 0; r < 2; r++) w[u][m][r] = (!GUARD || s < spans) ? ldw(wr[m][r] + s * 4 + t) : make_uint4(0u, 0u, 0u, 0u);
        sc[u][m] = (!GUARD || s < spans) ? (u32)__ldg(sr[m] + ((s * 64) >> bshift)) : 0u;
      }
      if (GB) {
        b[u][0] = b[u][1] = make_uint4(0u, 0u, 0u, 0u);
        if (bl && (!GUARD || s < spans)) {
          b[u][0] = ldb<true>(xb + s * 64 + 16 * t);
          b[u][1] = ldb<true>(xb + s * 64 + 16 * t + 8);
        }
      }
    }
  }

  template <bool GUARD>
  __device__ __forceinline__ void compute(const u16 *xb, bool bl, int s0, int spans, int t, float (&acc)[NM][4]) {
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int s = s0 + u;
      if (GUARD && s >= spans) break;
      uint4 p = make_uint4(0u, 0u, 0u, 0u), q = p;
      if (GB) {
        p = b[u][0];
        q = b[u][1];
      } else if (bl) {
        p = ldb<false>(xb + s * 64 + 16 * t);
        q = ldb<false>(xb + s * 64 + 16 * t + 8);
      }
      const u32 bq[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
#pragma unroll
      for (int m = 0; m < NM; m++) {
        float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int k = 0; k < 4; k++) {
          const u32 ra = quarter(w[u][m][0], k), rb = quarter(w[u][m][1], k);
          mma16816(d, e4m3x2_f16x2(ra), e4m3x2_f16x2(rb), e4m3x2_f16x2(ra >> 16), e4m3x2_f16x2(rb >> 16), bq[2 * k], bq[2 * k + 1]);
        }
        const float f = __int_as_float(sc[u][m] << 23);
#pragma unroll
        for (int i = 0; i < 4; i++) acc[m][i] = fmaf(d[i], f, acc[m][i]);
      }
    }
  }
};

// hi/lo f16 split of v: hi = f16(v), lo = f16((v - hi)·2^11).
__device__ __forceinline__ void hilo(float v, u16 &hi, u16 &lo) {
  float back;
  asm("{ .reg .b16 h; cvt.rn.f16.f32 h, %2; mov.b16 %0, h; cvt.f32.f16 %1, h; }" : "=h"(hi), "=f"(back) : "f"(v));
  const float r = (v - back) * 2048.f;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(lo) : "f"(r));
}

// The same for a pair: a in the low halves of hi and lo, b in the high.
__device__ __forceinline__ void hilo2(float a, float b, u32 &hi, u32 &lo) {
  asm("{ .reg .b16 ha, hb; .reg .f32 fa, fb;\n"
      "  cvt.rn.f16x2.f32 %0, %3, %2; mov.b32 {ha, hb}, %0; cvt.f32.f16 fa, ha; cvt.f32.f16 fb, hb;\n"
      "  sub.f32 fa, %2, fa; sub.f32 fb, %3, fb; mul.f32 fa, fa, 0f45000000; mul.f32 fb, fb, 0f45000000;\n"
      "  cvt.rn.f16x2.f32 %1, fb, fa; }"
      : "=r"(hi), "=r"(lo) : "f"(a), "f"(b));
}

// Position of column j of an 8-column block in the routed layout.
__device__ __forceinline__ int perm8(int j) { return ((j & 3) << 1) | (j >> 2); }

// Eight values (p then q) as hi/lo f16 pairs H and L, in the routed (perm:
// columns [0,4,1,5,2,6,3,7]) or natural order.
__device__ __forceinline__ void hilo8(const float4 &p, const float4 &q, bool perm, uint4 &H, uint4 &L) {
  if (perm) {
    hilo2(p.x, q.x, H.x, L.x);
    hilo2(p.y, q.y, H.y, L.y);
    hilo2(p.z, q.z, H.z, L.z);
    hilo2(p.w, q.w, H.w, L.w);
  } else {
    hilo2(p.x, p.y, H.x, L.x);
    hilo2(p.z, p.w, H.y, L.y);
    hilo2(q.x, q.y, H.z, L.z);
    hilo2(q.z, q.w, H.w, L.w);
  }
}

// Stages v [n] (n a multiple of 8) as hi (xs[0..n)) and lo (xs[n..2n)),
// in the routed (perm) or natural layout; all threads of the block.
__device__ __forceinline__ void stage_hilo(const float *__restrict__ v, u16 *xs, int n, bool perm) {
  const float4 *v4 = reinterpret_cast<const float4 *>(v);
  for (int i = threadIdx.x; i < n / 8; i += blockDim.x) {
    const float4 p = __ldg(v4 + 2 * i), q = __ldg(v4 + 2 * i + 1);
    uint4 H, L;
    hilo8(p, q, perm, H, L);
    *reinterpret_cast<uint4 *>(xs + 8 * i) = H;
    *reinterpret_cast<uint4 *>(xs + n + 8 * i) = L;
  }
}

// The existing swiglu op's arithmetic (kernels/ops.cu), for one element.
__device__ __forceinline__ float moe_sigmoid(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }
__device__ __forceinline__ float moe_swiglu(float g, float u, float limit) {
  if (limit > 0.f) {
    g = fminf(g, limit);
    u = fmaxf(fminf(u, limit), -limit);
  }
  return g * moe_sigmoid(g) * u;
}

// One stage-1 tile: rows r0..r0+15 of the shared expert's w1/w3 (FP8) or of
// a routed expert's (MXFP4, weights W1/S1 and W3/S3; valid false: no
// products), into acc (per lane as fp4/fp8 chunks leave them). Each warp
// issues its first chunk of loads, then calls mid() (all threads, once:
// e.g. the staging of x, whose latency the loads then overlap), then walks
// its contiguous span range. xsR and xsN are x's staged hi/lo rows in the
// routed and the natural layout.
template <int U, int UF, int DEC, typename Mid>
__device__ __forceinline__ void stage1_tile(const MoeArgs &a, bool shared, int r0, const u8 *W1, const u8 *S1, const u8 *W3,
                                            const u8 *S3, bool valid, const u16 *xsR, const u16 *xsN, float (&acc)[2][4], Mid mid) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const bool bl = g < 2;
#pragma unroll
  for (int m = 0; m < 2; m++)
#pragma unroll
    for (int i = 0; i < 4; i++) acc[m][i] = 0.f;
  if (shared) {
    const u16 *xb = xsN + (g & 1) * a.D;
    const uint4 *wr[2][2] = {
        {reinterpret_cast<const uint4 *>(a.s1 + (long long)(r0 + g) * a.D), reinterpret_cast<const uint4 *>(a.s1 + (long long)(r0 + g + 8) * a.D)},
        {reinterpret_cast<const uint4 *>(a.s3 + (long long)(r0 + g) * a.D), reinterpret_cast<const uint4 *>(a.s3 + (long long)(r0 + g + 8) * a.D)}};
    const int sstride = a.D >> a.bshift;
    const u8 *sr[2] = {a.c1 + (long long)(r0 >> a.bshift) * sstride, a.c3 + (long long)(r0 >> a.bshift) * sstride};
    // Warp w: spans [s0, end), contiguous (one chunk's 256-byte L2 fetch
    // serves the next).
    const int per = ((a.D >> 6) + MOE_WARPS - 1) / MOE_WARPS;
    int s0 = warp * per;
    const int end = min(a.D >> 6, s0 + per);
    // Ask L2 for the warp's whole range (16 rows x 2 matrices x per·64 bytes)
    // up front: lane i takes the 128-byte lines i, i+32, ...
    for (int l = lane; l < 32 * ((per * 64 + 127) >> 7); l += 32) {
      const int line = l >> 5, row = l & 15, m = (l >> 4) & 1;
      if ((s0 * 64 + line * 128) < end * 64) moe_prefetch((m ? a.s3 : a.s1) + (long long)(r0 + row) * a.D + s0 * 64 + line * 128);
    }
    Fp8Chunk<2, UF, false> ch;
    if (s0 + UF <= end) ch.template load<false>(wr, sr, a.bshift, xb, bl, s0, end, t);
    else if (s0 < end) ch.template load<true>(wr, sr, a.bshift, xb, bl, s0, end, t);
    mid();
    while (s0 < end) {
      if (s0 + UF <= end) ch.template compute<false>(xb, bl, s0, end, t, acc);
      else ch.template compute<true>(xb, bl, s0, end, t, acc);
      s0 += UF;
      if (s0 + UF <= end) ch.template load<false>(wr, sr, a.bshift, xb, bl, s0, end, t);
      else if (s0 < end) ch.template load<true>(wr, sr, a.bshift, xb, bl, s0, end, t);
    }
  } else {
    const u16 *xb = xsR + (g & 1) * a.D;
    // Warp w: spans [s0, end), contiguous, a multiple of 4 (scale words).
    const int per = (((a.D >> 5) + MOE_WARPS - 1) / MOE_WARPS + 3) & ~3;
    int s0 = warp * per;
    const int end = valid ? min(a.D >> 5, s0 + per) : 0;
    const long long rb = a.D >> 1, sb = a.D >> 5;
    const u32 *wr[2][2] = {{reinterpret_cast<const u32 *>(W1 + (r0 + g) * rb), reinterpret_cast<const u32 *>(W1 + (r0 + g + 8) * rb)},
                           {reinterpret_cast<const u32 *>(W3 + (r0 + g) * rb), reinterpret_cast<const u32 *>(W3 + (r0 + g + 8) * rb)}};
    const u32 *sr[2][2] = {{reinterpret_cast<const u32 *>(S1 + (r0 + g) * sb), reinterpret_cast<const u32 *>(S1 + (r0 + g + 8) * sb)},
                           {reinterpret_cast<const u32 *>(S3 + (r0 + g) * sb), reinterpret_cast<const u32 *>(S3 + (r0 + g + 8) * sb)}};
    Fp4Chunk<2, U, 0> ch;
    if (s0 + U <= end) ch.template load<false>(wr, sr, xb, bl, s0, end, t);
    else if (s0 < end) ch.template load<true>(wr, sr, xb, bl, s0, end, t);
    mid();
    while (s0 < end) {
      if (s0 + U <= end) ch.template compute<DEC, false>(xb, bl, s0, end, t, acc);
      else ch.template compute<DEC, true>(xb, bl, s0, end, t, acc);
      s0 += U;
      if (s0 + U <= end) ch.template load<false>(wr, sr, xb, bl, s0, end, t);
      else if (s0 < end) ch.template load<true>(wr, sr, xb, bl, s0, end, t);
    }
  }
}

// The end of a stage-1 tile: the warps' sums added in warp order through
// red (one barrier), SwiGLU, and the 16 h values stored as hi/lo. k is the
// routed tile's expert slot.
// stage1_sums: the tile's 16 rows of w1·x (gv) and w3·x (uv), the warps'
// sums (hi + lo/2048 of each) added in warp order through red (one
// barrier, which every thread of the block reaches); threads 0..15 get row
// threadIdx.x's sums, the others zeros.
template <int NW>
__device__ __forceinline__ void stage1_sums(const float (&acc)[2][4], float (&red)[NW][8][4], float &gv, float &uv) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  if (t == 0) {
#pragma unroll
    for (int m = 0; m < 2; m++) {
      red[warp][g][2 * m] = fmaf(acc[m][1], 1.f / 2048.f, acc[m][0]);
      red[warp][g][2 * m + 1] = fmaf(acc[m][3], 1.f / 2048.f, acc[m][2]);
    }
  }
  __syncthreads();
  gv = 0.f;
  uv = 0.f;
  if (threadIdx.x < 16) {
    const int i = threadIdx.x, gi = i & 7, hf = i >> 3;
    for (int w = 0; w < NW; w++) {
      gv += red[w][gi][hf];
      uv += red[w][gi][2 + hf];
    }
  }
}

template <int DEC, int NW = MOE_WARPS>
__device__ __forceinline__ void stage1_finish(const MoeArgs &a, bool shared, bool valid, int k, int r0, const float (&acc)[2][4],
                                              float (&red)[NW][8][4]) {
  float gv, uv;
  stage1_sums(acc, red, gv, uv);
  if (threadIdx.x < 16) {
    const int i = threadIdx.x;
    const int row = r0 + i;
    if (shared) {
      const float v = moe_swiglu(gv, uv, 0.f);
      u16 *hrow = a.h + (long long)a.K * 2 * a.I;
      hilo(v, hrow[row], hrow[a.Is + row]);
    } else {
      const float post = MoeDec<DEC>::post();
      float v = moe_swiglu(gv * post, uv * post, a.limit);
      if (a.rw) v *= __ldg(a.rw + k);
      if (!valid) v = __int_as_float(0x7fc00000);
      u16 *hrow = a.h + (long long)k * 2 * a.I;
      const int at = (row & ~7) | perm8(row & 7);
      hilo(v, hrow[at], hrow[a.I + at]);
    }
  }
}

// Stage 1, one tile per block. Blocks [0, Is/16) are the shared expert's
// tiles (the heavier ones first), then K·I/16 routed tiles (expert slot k =
// tile / (I/16)). Dynamic shared memory: 4·D bytes (x as hi/lo f16, in the
// layout the tile needs).
template <int U, int UF, int DEC>
__device__ __forceinline__ void moe_stage1(const MoeArgs &a) {
  extern __shared__ uint4 moe_smem[];
  u16 *xs = reinterpret_cast<u16 *>(moe_smem);
  __shared__ float red[MOE_WARPS][8][4];
  const int nsh = a.Is >> 4;
  const bool shared = (int)blockIdx.x < nsh;  // block-uniform
  float acc[2][4];
  if (shared) {
    stage1_tile<U, UF, DEC>(a, true, blockIdx.x * 16, nullptr, nullptr, nullptr, nullptr, true, xs, xs, acc,
                            [&] { stage_hilo(a.x, xs, a.D, false); __syncthreads(); });
    stage1_finish<DEC>(a, true, true, 0, blockIdx.x * 16, acc, red);
    return;
  }
  const int tile = blockIdx.x - nsh, tpe = a.I >> 4;
  const int k = tile / tpe, r0 = (tile - k * tpe) * 16;
  const int id = __ldg(a.ids + k);
  const bool valid = (unsigned)id < (unsigned)a.E;
  const LinRec *r1 = a.t13 + 2 * (valid ? id : 0), *r3 = r1 + 1;
  stage1_tile<U, UF, DEC>(a, false, r0, r1->W, r1->S, r3->W, r3->S, valid, xs, xs, acc,
                          [&] { stage_hilo(a.x, xs, a.D, true); __syncthreads(); });
  stage1_finish<DEC>(a, false, valid, k, r0, acc, red);
}

// ---- The wide family (moe1w_*, moe2w_*) ----
//
// Same tensor-core arithmetic as above, a different fragment assignment for
// the MXFP4 weights: a "group" is 4 spans (128 columns, 64 bytes a row,
// one 4-byte word of scales a row), and lane (g, t) loads the 16 bytes of
// span 4q+t of rows g and g+8 (one whole span: 4 words) with one 16-byte
// load each, so a warp's load covers 8 rows x 64 contiguous bytes (the
// narrow chunks above cover 8 rows x 16 bytes with 4-byte loads: 4x the
// load instructions and L1 wavefronts per byte). The mma's k slots of lane
// t (2t, 2t+1, 2t+8, 2t+9) then carry span 4q+t's codes, so one mma mixes
// the 4 spans of a group, which have different scales; the spans are kept
// apart in the mma's N dimension instead: B column n = 2·(span slot) +
// (hi 0, lo 1) is x's hi or lo part on that span's k slots and zero on the
// others, so lane (g, t) supplies B exactly when g>>1 == t (hi for even g,
// lo for odd), and D's columns 2t, 2t+1, which lane (g, t) receives, are
// span 4q+t's hi and lo sums of rows g and g+8: the lane applies its own
// span's scales (one byte each for rows g and g+8) once per group, after
// the group's 8 mmas (4 words x 2), and the four lanes of a quad add their
// sums (fixed order: xor 1, then xor 2) at the end.

// G groups of NM matrices' 16-row tiles (words wr[m][r] as uint4 rows g
// and g+8, scale bytes sr[m][r]), in registers: load() issues every load,
// compute() uses them with B (routed layout, hi/lo rows; xb this lane's,
// bl whether it supplies B) from shared memory. GUARD: the chunk may pass
// the last group.
//
// SS: the scales come from the block's transposed copy in shared memory
// (ss) instead: load() issues the weight loads only, and compute() reads
// one 4-byte word with the four scale bytes this lane needs: with NM 2
// (stage 1, stage_scales_t) one word per group (w1 row g, w1 row g+8, w3
// row g, w3 row g+8), with NM 1 (stage 2, stage_scales2_t; G even and q0
// a multiple of G) one word per pair of groups (row g, row g+8 of the
// even group, then of the odd one).
template <int NM, int G, bool SS = false>
struct Fp4Wide {
  uint4 w[G][NM][2];
  u32 sc[SS ? 1 : G][NM][2];

  template <bool GUARD>
  __device__ __forceinline__ void load(const uint4 *const (&wr)[NM][2], const u8 *const (&sr)[NM][2], int q0, int groups, int t) {
#pragma unroll
    for (int i = 0; i < G; i++) {
      const int q = q0 + i;
      const bool ok = !GUARD || q < groups;
#pragma unroll
      for (int m = 0; m < NM; m++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
          w[i][m][r] = ok ? ldw(wr[m][r] + 4 * q + t) : make_uint4(0u, 0u, 0u, 0u);
          if (!SS) sc[i][m][r] = ok ? (u32)__ldg(sr[m][r] + 4 * q + t) : 0u;
        }
    }
  }

  template <int DEC, bool GUARD>
  __device__ __forceinline__ void compute(const u16 *xb, bool bl, int q0, int groups, int t, float (&acc)[NM][4],
                                          const u32 *ss = nullptr) const {
    static_assert(!SS || NM == 2 || G % 2 == 0, "staged stage-2 scales come in pairs of groups");
    const int g = (threadIdx.x & 31) >> 2;
    u32 sw = 0u;
#pragma unroll
    for (int i = 0; i < G; i++) {
      const int q = q0 + i;
      if (GUARD && q >= groups) break;
      if (SS && NM == 2) sw = ss[q * 32 + (((t ^ (q & 3)) << 3) | g)];
      if (SS && NM == 1 && (i & 1) == 0) sw = ss[(q >> 1) * 32 + (((t ^ ((q >> 1) & 3)) << 3) | g)];
      const u16 *xq = xb + (4 * q + t) * 32;
      uint4 bq[4];
#pragma unroll
      for (int j = 0; j < 4; j++) bq[j] = bl ? ldb<false>(xq + 8 * j) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
      for (int m = 0; m < NM; m++) {
        float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int j = 0; j < 4; j++) {
          u32 a0, a1, a2, a3, b0, b1, b2, b3;
          MoeDec<DEC>::run(quarter(w[i][m][0], j), a0, a1, a2, a3);
          MoeDec<DEC>::run(quarter(w[i][m][1], j), b0, b1, b2, b3);
          mma16816(d, a0, b0, a1, b1, bq[j].x, bq[j].y);
          mma16816(d, a2, b2, a3, b3, bq[j].z, bq[j].w);
        }
        float fa, fb;
        if (SS && NM == 2) {
          fa = m == 0 ? e8m0_byte<0>(sw) : e8m0_byte<2>(sw);
          fb = m == 0 ? e8m0_byte<1>(sw) : e8m0_byte<3>(sw);
        } else if (SS) {  // the pair's group i & 1 (q0 even)
          fa = (i & 1) == 0 ? e8m0_byte<0>(sw) : e8m0_byte<2>(sw);
          fb = (i & 1) == 0 ? e8m0_byte<1>(sw) : e8m0_byte<3>(sw);
        } else {
          fa = __int_as_float(sc[i][m][0] << 23);
          fb = __int_as_float(sc[i][m][1] << 23);
        }
        acc[m][0] = fmaf(d[0], fa, acc[m][0]);
        acc[m][1] = fmaf(d[1], fa, acc[m][1]);
        acc[m][2] = fmaf(d[2], fb, acc[m][2]);
        acc[m][3] = fmaf(d[3], fb, acc[m][3]);
      }
    }
  }
};

// Adds the four lanes of each quad (xor 1, then xor 2): afterwards every
// lane holds its quad's sums (lanes t = 0 are the ones read).
template <int NM> __device__ __forceinline__ void quad_sum(float (&acc)[NM][4]) {
#pragma unroll
  for (int m = 0; m < NM; m++)
#pragma unroll
    for (int i = 0; i < 4; i++) {
      acc[m][i] += __shfl_xor_sync(0xffffffffu, acc[m][i], 1);
      acc[m][i] += __shfl_xor_sync(0xffffffffu, acc[m][i], 2);
    }
}

// Walks the groups [q, end) of a warp in chunks of G, two chunks in
// flight: both first chunks are issued, then mid() runs (all threads,
// once), then each chunk is computed and the chunk two ahead issued in its
// registers. ld(ch, q) / cp(ch, q) issue and use chunk q (GUARD chosen by
// the caller's lambdas).
template <typename Chunk, typename Ld, typename Cp, typename Mid>
__device__ __forceinline__ void wide_walk(int q, int end, int G, Ld ld, Cp cp, Mid mid) {
  Chunk A, B;
  if (q < end) ld(A, q);
  if (q + G < end) ld(B, q + G);
  mid();
  while (q < end) {
    cp(A, q);
    if (q + 2 * G < end) ld(A, q + 2 * G);
    if (q + G < end) {
      cp(B, q + G);
      if (q + 3 * G < end) ld(B, q + 3 * G);
    }
    q += 2 * G;
  }
}

// Stage 2's weights asked into L2 by the last blocks of stage 1 (those with
// blockIdx.x >= gridDim.x - 2·SMs, the last wave of two blocks an SM), each
// an even share of the 128-byte lines of the K experts' w2 (data, then
// scales) and the shared w2 (data, then scales), so HBM keeps streaming
// through stage 1's tail and stage 2 reads from L2 (35 MB at V4 shapes).
__device__ __forceinline__ void moe_prefetch_w2(const MoeArgs &a) {
  u32 nsm;
  asm("mov.u32 %0, %%nsmid;" : "=r"(nsm));
  const int nb = min((int)gridDim.x, 2 * (int)nsm), b = (int)blockIdx.x - ((int)gridDim.x - nb);
  if (b < 0) return;
  const long long dl = (long long)a.D * (a.I >> 8), sl = ((long long)a.D * (a.I >> 5) + 127) >> 7;  // per expert: data, scale lines
  const long long hl = a.Is > 0 ? (long long)a.D * (a.Is >> 7) : 0, hs = a.Is > 0 ? ((long long)(a.D >> a.bshift) * (a.Is >> a.bshift) + 127) >> 7 : 0;
  const long long per = dl + sl, n = a.K * per + hl + hs;
  for (long long l = (long long)b * blockDim.x + threadIdx.x; l < n; l += (long long)nb * blockDim.x) {
    if (l < a.K * per) {
      const int k = (int)(l / per);
      const long long r = l - k * per;
      const int id = __ldg(a.ids + k);
      if ((unsigned)id >= (unsigned)a.E) continue;
      const LinRec *rec = a.t2 + id;
      moe_prefetch(r < dl ? rec->W + r * 128 : rec->S + (r - dl) * 128);
    } else {
      const long long r = l - a.K * per;
      moe_prefetch(r < hl ? a.s2 + r * 128 : a.c2 + (r - hl) * 128);
    }
  }
}

// Stages the E8M0 scales of a routed stage-1 tile (rows r0..r0+15 of w1's
// S1 and w3's S3, D/32 bytes a row) into ss (D bytes, all threads of the
// block), transposed for Fp4Wide<2, G, true>: the word of group q that lane
// (g, t) reads, ss[32q + ((t ^ (q & 3)) << 3 | g)], holds the scale bytes
// of span 4q+t of w1 row g, w1 row g+8, w3 row g, w3 row g+8 (bytes 0..3).
// The XOR by q & 3 keeps both the stores (a warp's lanes take 4 groups x 8
// rows) and the loads (32 lanes of one group) free of bank conflicts. Each
// thread loads four 4-byte words (one group's scales of its four rows) and
// transposes them with six PRMTs.
__device__ __forceinline__ void stage_scales_t(const MoeArgs &a, int r0, const u8 *S1, const u8 *S3, u32 *ss) {
  const int groups = a.D >> 7;
  const long long sb = a.D >> 5;
  for (int i = threadIdx.x; i < 8 * groups; i += blockDim.x) {
    const int g = i & 7, q = i >> 3;
    const u32 w0 = __ldg(reinterpret_cast<const u32 *>(S1 + (r0 + g) * sb) + q);
    const u32 w1 = __ldg(reinterpret_cast<const u32 *>(S1 + (r0 + g + 8) * sb) + q);
    const u32 w2 = __ldg(reinterpret_cast<const u32 *>(S3 + (r0 + g) * sb) + q);
    const u32 w3 = __ldg(reinterpret_cast<const u32 *>(S3 + (r0 + g + 8) * sb) + q);
    const u32 lo01 = __byte_perm(w0, w1, 0x5140), hi01 = __byte_perm(w0, w1, 0x7362);  // (w0.b0, w1.b0, w0.b1, w1.b1), (.b2, .b3)
    const u32 lo23 = __byte_perm(w2, w3, 0x5140), hi23 = __byte_perm(w2, w3, 0x7362);
    u32 *d = ss + 32 * q + g;
    const int x = q & 3;
    d[(0 ^ x) << 3] = __byte_perm(lo01, lo23, 0x5410);  // byte t = 0 of each word
    d[(1 ^ x) << 3] = __byte_perm(lo01, lo23, 0x7632);
    d[(2 ^ x) << 3] = __byte_perm(hi01, hi23, 0x5410);
    d[(3 ^ x) << 3] = __byte_perm(hi01, hi23, 0x7632);
  }
}

// One routed stage-1 tile of the wide family: rows r0..r0+15 of w1 (W1,
// S1) and w3 (W3, S3), valid false: no products; the warps take contiguous
// group ranges in chunks of G groups (Fp4Wide<2, G>), mid() as in
// stage1_tile; acc as the quads' sums (lanes t = 0 read).
//
// SS: the scales from ss (the tile's, staged by mid() with stage_scales_t)
// instead of per-lane byte loads. PFR: the warp first asks L2 for its
// whole range (16 rows of w1 and w3: 64 lines of 128 bytes at D 4096).
template <int G, int DEC, bool SS = false, bool PFR = false, typename Mid>
__device__ __forceinline__ void stage1w_routed(const MoeArgs &a, int r0, const u8 *W1, const u8 *S1, const u8 *W3, const u8 *S3,
                                               bool valid, const u16 *xs, float (&acc)[2][4], Mid mid, const u32 *ss = nullptr) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int m = 0; m < 2; m++)
#pragma unroll
    for (int i = 0; i < 4; i++) acc[m][i] = 0.f;
  const bool bl = (g >> 1) == t;
  const u16 *xb = xs + (g & 1) * a.D;
  const int groups = a.D >> 7, per = (groups + MOE_WARPS - 1) / MOE_WARPS;
  const int q0 = warp * per, end = valid ? min(groups, q0 + per) : 0;
  const long long rb = a.D >> 1, sb = a.D >> 5;
  const uint4 *wr[2][2] = {{reinterpret_cast<const uint4 *>(W1 + (r0 + g) * rb), reinterpret_cast<const uint4 *>(W1 + (r0 + g + 8) * rb)},
                           {reinterpret_cast<const uint4 *>(W3 + (r0 + g) * rb), reinterpret_cast<const uint4 *>(W3 + (r0 + g + 8) * rb)}};
  const u8 *sr[2][2] = {{S1 + (r0 + g) * sb, S1 + (r0 + g + 8) * sb}, {S3 + (r0 + g) * sb, S3 + (r0 + g + 8) * sb}};
  if (PFR) {  // lane i: row i & 15, matrix (i >> 4) & 1, line i >> 5 of the range
    const int lpr = ((end - q0) * 64 + 127) >> 7;
    for (int i = lane; i < 32 * lpr; i += 32)
      moe_prefetch(((i >> 4) & 1 ? W3 : W1) + (r0 + (i & 15)) * rb + q0 * 64 + (i >> 5) * 128);
  }
  using Ch = Fp4Wide<2, G, SS>;
  wide_walk<Ch>(
      q0, end, G,
      [&](Ch &c, int q) {
        if (q + G <= end) c.template load<false>(wr, sr, q, end, t);
        else c.template load<true>(wr, sr, q, end, t);
      },
      [&](const Ch &c, int q) {
        if (q + G <= end) c.template compute<DEC, false>(xb, bl, q, end, t, acc, ss);
        else c.template compute<DEC, true>(xb, bl, q, end, t, acc, ss);
      },
      mid);
  quad_sum<2>(acc);
}

// cp.async.wait_group with a run-time count: waits until at most n of this
// thread's committed groups are pending (n above 7 waits as for 7).
__device__ __forceinline__ void cp_async_wait_pending(int n) {
  switch (n) {
    case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;" ::: "memory"); break;
  }
}

// One routed stage-1 tile of the wide family with the weights copied into
// shared memory by cp.async (no registers held while they fly): each lane
// issues, group by group (one commit group each), the 16-byte copies of
// exactly the spans it later reads (w1 and w3, rows g and g+8: four a
// group) into its warp's region of wsm ([group][4][32 lanes] of uint4,
// 2 KB a group, per group of the warp's range), so a warp's whole range
// (4 groups, 8 KB, at D 4096; the block's whole 64 KB tile) is in flight
// at once; then mid() (which must stage the scales into ss, as
// stage_scales_t, and x); then each group is computed once its copies
// landed (the lane's own copies: no barrier). Scales as Fp4Wide<2, 1,
// true>. acc as stage1w_routed.
template <int DEC, typename Mid>
__device__ __forceinline__ void stage1w_routed_async(const MoeArgs &a, int r0, const u8 *W1, const u8 *W3, bool valid, const u16 *xs,
                                                     uint4 *wsm, const u32 *ss, float (&acc)[2][4], Mid mid) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int m = 0; m < 2; m++)
#pragma unroll
    for (int i = 0; i < 4; i++) acc[m][i] = 0.f;
  const bool bl = (g >> 1) == t;
  const u16 *xb = xs + (g & 1) * a.D;
  const int groups = a.D >> 7, per = (groups + MOE_WARPS - 1) / MOE_WARPS;
  const int q0 = warp * per, end = valid ? min(groups, q0 + per) : 0;
  const long long rb = a.D >> 1;
  const uint4 *wr[2][2] = {{reinterpret_cast<const uint4 *>(W1 + (r0 + g) * rb), reinterpret_cast<const uint4 *>(W1 + (r0 + g + 8) * rb)},
                           {reinterpret_cast<const uint4 *>(W3 + (r0 + g) * rb), reinterpret_cast<const uint4 *>(W3 + (r0 + g + 8) * rb)}};
  uint4 *mine = wsm + (long long)warp * per * 4 * 32 + lane;
  for (int q = q0; q < end; q++) {
#pragma unroll
    for (int mr = 0; mr < 4; mr++) {
      const u32 dst = (u32)__cvta_generic_to_shared(mine + ((q - q0) * 4 + mr) * 32);
      asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(dst), "l"(wr[mr >> 1][mr & 1] + 4 * q + t) : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  mid();
  for (int q = q0; q < end; q++) {
    cp_async_wait_pending(end - 1 - q);
    Fp4Wide<2, 1, true> c;
#pragma unroll
    for (int mr = 0; mr < 4; mr++) c.w[0][mr >> 1][mr & 1] = mine[((q - q0) * 4 + mr) * 32];
    c.template compute<DEC, false>(xb, bl, q, end, t, acc, ss);
  }
  quad_sum<2>(acc);
}

// Stage 1, persistent: gridDim.x blocks (those that fit at once) take tiles
// (numbered as in moe_stage1) from the counter ctr[0] in order; x is staged
// once per block in both layouts (dynamic shared memory 4·D, or 8·D with a
// shared expert) and the K experts' records are read once into shared
// memory. A block holds its next tile's number while it works on the
// current one and asks L2 for that tile's weights first, so the next
// tile's bytes stream in meanwhile. The last block to finish resets ctr
// (two ints, zero before the first launch) for the next launch.
//
// PF: a block that finds no tile left asks L2 for its share (1/gridDim.x)
// of stage 2's weights (the K experts' w2 and the shared w2), so HBM keeps
// streaming through stage 1's tail and stage 2 starts on L2-resident bytes.
//
// WIDE: the routed tiles by the wide family's stage1w_routed (U is then its
// G, groups per chunk).
template <int U, int UF, int DEC, bool PF, bool WIDE = false>
__device__ __forceinline__ void moe_stage1p(const MoeArgs &a, int *ctr) {
  extern __shared__ uint4 moe_smem[];
  u16 *xsR = reinterpret_cast<u16 *>(moe_smem), *xsN = xsR + 2 * a.D;
  __shared__ float red[MOE_WARPS][8][4];
  __shared__ const u8 *rec[MOE_MAXK][5];  // W1, S1, W3, S3, w2's W (null W1: id outside the table)
  __shared__ int ring[3];
  const int nsh = a.Is >> 4, tpe = a.I >> 4, total = nsh + a.K * tpe;
  if (threadIdx.x == 0) {
    ring[0] = atomicAdd(ctr, 1);
    ring[1] = atomicAdd(ctr, 1);
  }
  for (int k = threadIdx.x; k < a.K; k += blockDim.x) {
    const int id = __ldg(a.ids + k);
    const bool ok = (unsigned)id < (unsigned)a.E;
    const LinRec *r1 = a.t13 + 2 * (ok ? id : 0);
    rec[k][0] = ok ? r1[0].W : nullptr;
    rec[k][1] = r1[0].S;
    rec[k][2] = r1[1].W;
    rec[k][3] = r1[1].S;
    rec[k][4] = ok ? a.t2[id].W : nullptr;
  }
  stage_hilo(a.x, xsR, a.D, true);
  if (nsh > 0) stage_hilo(a.x, xsN, a.D, false);
  const long long rb = a.D >> 1;
  for (int i = 0;; i++) {
    __syncthreads();  // ring, rec and x are visible; red is free
    const int cur = ring[i % 3], nxt = ring[(i + 1) % 3];
    if (cur >= total) break;
    if (threadIdx.x == 0) ring[(i + 2) % 3] = atomicAdd(ctr, 1);
    // L2 prefetch of the next tile: 16 rows x 2 matrices, 128-byte lines.
    if (nxt < total) {
      if (nxt < nsh) {
        const int lines = a.D >> 7;
        for (int l = threadIdx.x; l < 32 * lines; l += blockDim.x) {
          const int row = l & 15, m = (l >> 4) & 1, line = l >> 5;
          moe_prefetch((m ? a.s3 : a.s1) + (long long)(nxt * 16 + row) * a.D + line * 128);
        }
      } else {
        const int tk = (nxt - nsh) / tpe, tr = ((nxt - nsh) - tk * tpe) * 16;
        const u8 *W1 = rec[tk][0], *W3 = rec[tk][2];
        const int lines = (a.D >> 1) >> 7;
        if (W1)
          for (int l = threadIdx.x; l < 32 * lines; l += blockDim.x) {
            const int row = l & 15, m = (l >> 4) & 1, line = l >> 5;
            moe_prefetch((m ? W3 : W1) + (tr + row) * rb + line * 128);
          }
      }
    }
    float acc[2][4];
    constexpr int UT = WIDE ? 4 : U;  // stage1_tile's spans per chunk
    if (cur < nsh) {
      stage1_tile<UT, UF, DEC>(a, true, cur * 16, nullptr, nullptr, nullptr, nullptr, true, xsR, xsN, acc, [] {});
      stage1_finish<DEC>(a, true, true, 0, cur * 16, acc, red);
    } else {
      const int k = (cur - nsh) / tpe, r0 = ((cur - nsh) - k * tpe) * 16;
      const bool valid = rec[k][0] != nullptr;
      if (WIDE) stage1w_routed<U, DEC>(a, r0, rec[k][0], rec[k][1], rec[k][2], rec[k][3], valid, xsR, acc, [] {});
      else stage1_tile<UT, UF, DEC>(a, false, r0, rec[k][0], rec[k][1], rec[k][2], rec[k][3], valid, xsR, xsN, acc, [] {});
      stage1_finish<DEC>(a, false, valid, k, r0, acc, red);
    }
  }
  if (PF) {
    const int lr = a.I >> 8, ls = a.Is >> 7;  // 128-byte lines per routed and shared w2 row
    const long long nr = (long long)a.K * a.D * lr, n = nr + (long long)a.D * ls;
    for (long long l = (long long)blockIdx.x * blockDim.x + threadIdx.x; l < n; l += (long long)gridDim.x * blockDim.x) {
      if (l < nr) {
        const int k = (int)(l / ((long long)a.D * lr)), rem = (int)(l - (long long)k * a.D * lr);
        const u8 *W = rec[k][4];
        if (W) moe_prefetch(W + (long long)(rem / lr) * (a.I >> 1) + (rem % lr) * 128);
      } else {
        const int rem = (int)(l - nr);
        moe_prefetch(a.s2 + (long long)(rem / ls) * a.Is + (rem % ls) * 128);
      }
    }
  }
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(ctr + 1, 1) == (int)gridDim.x - 1) {
      atomicExch(ctr, 0);
      atomicExch(ctr + 1, 0);
    }
  }
}

// Stage 2: one block per 16 output rows. The routed work is K·ceil(I/32/U)
// chunks (expert slot-major), the shared expert's ceil(Is/64/UF) chunks;
// each warp takes a fixed share of each, adds them into its accumulators,
// and the block adds the warps' sums in warp order.
template <int U, int UF, int DEC>
__device__ __forceinline__ void moe_stage2(const MoeArgs &a) {
  __shared__ float red[MOE_WARPS][8][2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int r0 = blockIdx.x * 16;
  const bool bl = g < 2;
  float accR[1][4] = {{0.f, 0.f, 0.f, 0.f}}, accS[1][4] = {{0.f, 0.f, 0.f, 0.f}};
  const int spans = a.I >> 5, cpe = (spans + U - 1) / U;
  const int total = a.K * cpe, per = (total + MOE_WARPS - 1) / MOE_WARPS;
  // The K experts' w2 records (null for an id outside the table), read once.
  __shared__ const u8 *recW[MOE_MAXK], *recS[MOE_MAXK];
  for (int k = threadIdx.x; k < a.K; k += blockDim.x) {
    const int id = __ldg(a.ids + k);
    const bool ok = (unsigned)id < (unsigned)a.E;
    recW[k] = ok ? a.t2[id].W : nullptr;
    recS[k] = ok ? a.t2[id].S : nullptr;
  }
  __syncthreads();
  const long long rb = a.I >> 1;
  // Lane i asks L2 for a 128-byte line of a chunk: row i & 15, line i >> 4.
  auto prefetch = [&](int c) {
    const int k = c / cpe, s0 = (c - k * cpe) * U;
    const u8 *W = recW[k];
    const int off = s0 * 16 + (lane >> 4) * 128;
    if (W && off < min(s0 + U, spans) * 16) moe_prefetch(W + (r0 + (lane & 15)) * rb + off);
  };
  if (a.Is > 0) {  // this warp's shared-expert chunks, wanted after the routed ones
    const int sspans = a.Is >> 6, scs = (sspans + UF - 1) / UF;
    for (int c = warp; c < scs; c += MOE_WARPS)
      for (int off = (lane >> 4) * 128; off < min(UF, sspans - c * UF) * 64; off += 256)
        moe_prefetch(a.s2 + (long long)(r0 + (lane & 15)) * a.Is + c * UF * 64 + off);
  }
  bool bad = false;
  // Warp w takes chunks [w·per, (w+1)·per) of the expert-slot-major
  // sequence (consecutive chunks of a row), asking L2 for chunk c+1 while
  // loading chunk c.
  const int cend = min(total, (warp + 1) * per);
  for (int c = warp * per; c < cend; c++) {
    if (c + 1 < cend) prefetch(c + 1);
    const int k = c / cpe, s0 = (c - k * cpe) * U;
    const u8 *W = recW[k], *S = recS[k];
    if (!W) {
      bad = true;
      continue;
    }
    const long long sb = a.I >> 5;
    const u32 *wr[1][2] = {{reinterpret_cast<const u32 *>(W + (r0 + g) * rb), reinterpret_cast<const u32 *>(W + (r0 + g + 8) * rb)}};
    const u32 *sr[1][2] = {{reinterpret_cast<const u32 *>(S + (r0 + g) * sb), reinterpret_cast<const u32 *>(S + (r0 + g + 8) * sb)}};
    const u16 *xb = a.h + (long long)k * 2 * a.I + (g & 1) * a.I;
    Fp4Chunk<1, U, (U <= 8 ? 1 : 2)> ch;
    if (s0 + U <= spans) {
      ch.template load<false>(wr, sr, xb, bl, s0, spans, t);
      ch.template compute<DEC, false>(xb, bl, s0, spans, t, accR);
    } else {
      ch.template load<true>(wr, sr, xb, bl, s0, spans, t);
      ch.template compute<DEC, true>(xb, bl, s0, spans, t, accR);
    }
  }
  if (a.Is > 0) {
    const int sspans = a.Is >> 6, scs = (sspans + UF - 1) / UF;
    const uint4 *wr[1][2] = {{reinterpret_cast<const uint4 *>(a.s2 + (long long)(r0 + g) * a.Is),
                              reinterpret_cast<const uint4 *>(a.s2 + (long long)(r0 + g + 8) * a.Is)}};
    const u8 *sr[1] = {a.c2 + (long long)(r0 >> a.bshift) * (a.Is >> a.bshift)};
    const u16 *xb = a.h + (long long)a.K * 2 * a.I + (g & 1) * a.Is;
    for (int c = warp; c < scs; c += MOE_WARPS) {
      const int s0 = c * UF;
      Fp8Chunk<1, UF, true> ch;
      if (s0 + UF <= sspans) {
        ch.template load<false>(wr, sr, a.bshift, xb, bl, s0, sspans, t);
        ch.template compute<false>(xb, bl, s0, sspans, t, accS);
      } else {
        ch.template load<true>(wr, sr, a.bshift, xb, bl, s0, sspans, t);
        ch.template compute<true>(xb, bl, s0, sspans, t, accS);
      }
    }
  }
  if (t == 0) {
    const float post = MoeDec<DEC>::post();
    const float nan = __int_as_float(0x7fc00000);
    const float r0v = fmaf(accR[0][1], 1.f / 2048.f, accR[0][0]) * post + fmaf(accS[0][1], 1.f / 2048.f, accS[0][0]);
    const float r8v = fmaf(accR[0][3], 1.f / 2048.f, accR[0][2]) * post + fmaf(accS[0][3], 1.f / 2048.f, accS[0][2]);
    red[warp][g][0] = bad ? nan : r0v;
    red[warp][g][1] = bad ? nan : r8v;
  }
  __syncthreads();
  if (threadIdx.x < 16) {
    const int i = threadIdx.x;
    float s = 0.f;
    for (int w = 0; w < MOE_WARPS; w++) s += red[w][i & 7][i >> 3];
    a.out[r0 + i] = s;
  }
}

// Stage 1, wide: one block per tile as moe_stage1 (the shared expert's FP8
// tiles as there, UF spans a chunk); a routed tile's warps take contiguous
// group ranges in chunks of G groups (Fp4Wide<2, G>: w1 and w3). PF: the
// last wave asks L2 for stage 2's weights (moe_prefetch_w2) after its tile.
//
// SS: the routed tile's scales staged in shared memory (stage_scales_t).
// ASYNC (with SS): the routed tile's weights copied into shared memory by
// cp.async (stage1w_routed_async; G unused); dynamic shared memory then
// 5·D + MOE_WARPS·ceil(D/128/MOE_WARPS)·2048 bytes.
// PFR (with SS): stage1w_routed's warps ask L2 for their whole range first.
template <int G, int UF, int DEC, bool PF, bool SS = false, bool ASYNC = false, bool PFR = false>
__device__ __forceinline__ void moe_stage1w(const MoeArgs &a) {
  extern __shared__ uint4 moe_smem[];
  u16 *xs = reinterpret_cast<u16 *>(moe_smem);
  u32 *ss = reinterpret_cast<u32 *>(xs + 2 * a.D);  // SS: the routed tile's scales (D bytes)
  __shared__ float red[MOE_WARPS][8][4];
  const int nsh = a.Is >> 4;
  float acc[2][4];
  if ((int)blockIdx.x < nsh) {  // block-uniform
    stage1_tile<4, UF, DEC>(a, true, blockIdx.x * 16, nullptr, nullptr, nullptr, nullptr, true, xs, xs, acc,
                            [&] { stage_hilo(a.x, xs, a.D, false); __syncthreads(); });
    stage1_finish<DEC>(a, true, true, 0, blockIdx.x * 16, acc, red);
    if (PF) moe_prefetch_w2(a);
    return;
  }
  const int tile = blockIdx.x - nsh, tpe = a.I >> 4;
  const int k = tile / tpe, r0 = (tile - k * tpe) * 16;
  const int id = __ldg(a.ids + k);
  const bool valid = (unsigned)id < (unsigned)a.E;
  const LinRec *r1 = a.t13 + 2 * (valid ? id : 0), *r3 = r1 + 1;
  if (ASYNC) {
    const u8 *S1 = r1->S, *S3 = r3->S;
    uint4 *wsm = reinterpret_cast<uint4 *>(reinterpret_cast<u8 *>(moe_smem) + 5 * a.D);
    stage1w_routed_async<DEC>(
        a, r0, r1->W, r3->W, valid, xs, wsm, ss, acc, [&] {
          if (valid) stage_scales_t(a, r0, S1, S3, ss);
          stage_hilo(a.x, xs, a.D, true);
          __syncthreads();
        });
  } else if (SS) {
    const u8 *S1 = r1->S, *S3 = r3->S;
    stage1w_routed<G, DEC, true, PFR>(
        a, r0, r1->W, S1, r3->W, S3, valid, xs, acc,
        [&] {
          if (valid) stage_scales_t(a, r0, S1, S3, ss);
          stage_hilo(a.x, xs, a.D, true);
          __syncthreads();
        },
        ss);
  } else {
    stage1w_routed<G, DEC>(a, r0, r1->W, r1->S, r3->W, r3->S, valid, xs, acc, [&] { stage_hilo(a.x, xs, a.D, true); __syncthreads(); });
  }
  stage1_finish<DEC>(a, false, valid, k, r0, acc, red);
  if (PF) moe_prefetch_w2(a);
}

// Stages the E8M0 scales of stage 2's K experts' w2 rows r0..r0+15 (I/32
// bytes a row; records recS, null W: skipped) into ss (K·ceil(I/256)·128
// bytes), transposed for Fp4Wide<1, G, true>: expert k's word of group pair
// p that lane (g, t) reads, ss[k·P·32 + 32p + ((t ^ (p & 3)) << 3 | g)]
// with P = ceil(groups/2), holds the scale bytes of span 4q+t (q = 2p, then
// 2p+1: zeros past the last group) of rows g and g+8. All threads of the
// block; the same transposition as stage_scales_t.
__device__ __forceinline__ void stage_scales2_t(const MoeArgs &a, int r0, const u8 *const *recW, const u8 *const *recS, u32 *ss) {
  const int groups = a.I >> 7, P = (groups + 1) >> 1;
  const long long sb = a.I >> 5;
  for (int i = threadIdx.x; i < 8 * P * a.K; i += blockDim.x) {
    const int g = i & 7, kp = i >> 3, k = kp / P, p = kp - k * P;
    if (!recW[k]) continue;
    const u32 *ra = reinterpret_cast<const u32 *>(recS[k] + (r0 + g) * sb) + 2 * p;
    const u32 *rb = reinterpret_cast<const u32 *>(recS[k] + (r0 + g + 8) * sb) + 2 * p;
    const bool two = 2 * p + 1 < groups;
    const u32 w0 = __ldg(ra), w1 = __ldg(rb), w2 = two ? __ldg(ra + 1) : 0u, w3 = two ? __ldg(rb + 1) : 0u;
    const u32 lo01 = __byte_perm(w0, w1, 0x5140), hi01 = __byte_perm(w0, w1, 0x7362);
    const u32 lo23 = __byte_perm(w2, w3, 0x5140), hi23 = __byte_perm(w2, w3, 0x7362);
    u32 *d = ss + 32 * kp + g;
    const int x = p & 3;
    d[(0 ^ x) << 3] = __byte_perm(lo01, lo23, 0x5410);
    d[(1 ^ x) << 3] = __byte_perm(lo01, lo23, 0x7632);
    d[(2 ^ x) << 3] = __byte_perm(hi01, hi23, 0x5410);
    d[(3 ^ x) << 3] = __byte_perm(hi01, hi23, 0x7632);
  }
}

// Stage 2, wide: one block per 16 output rows as moe_stage2, h (all K rows
// and the shared row, 4·(K·I + Is) bytes) copied into dynamic shared
// memory once per block while the warps' first chunks load. The routed
// work is K·ceil(I/128/G) chunks of G groups (expert slot-major), warp w
// taking a contiguous share; the shared expert's FP8 chunks as in
// moe_stage2 (asked into L2 first, B from shared memory).
//
// SS: the experts' scales staged too (stage_scales2_t, after h in dynamic
// shared memory: K·ceil(I/256)·128 bytes more), while h's copies fly.
// PFR: each warp first asks L2 for its whole routed range (16 rows of each
// chunk's bytes: 96 lines of 128 bytes a warp at V4 shapes), so the
// block's 96 KB of routed w2 are requested at once rather than two chunks
// a warp at a time.
template <int G, int UF, int DEC, bool SS = false, bool PFR = false>
__device__ __forceinline__ void moe_stage2w(const MoeArgs &a) {
  extern __shared__ uint4 moe_smem[];
  u16 *hs = reinterpret_cast<u16 *>(moe_smem);
  u32 *ss = reinterpret_cast<u32 *>(hs + 2 * (a.K * a.I + a.Is));
  __shared__ float red[MOE_WARPS][8][2];
  __shared__ const u8 *recW[MOE_MAXK], *recS[MOE_MAXK];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int r0 = blockIdx.x * 16;
  for (int k = threadIdx.x; k < a.K; k += blockDim.x) {
    const int id = __ldg(a.ids + k);
    const bool ok = (unsigned)id < (unsigned)a.E;
    recW[k] = ok ? a.t2[id].W : nullptr;
    recS[k] = ok ? a.t2[id].S : nullptr;
  }
  if (a.Is > 0) {  // the shared expert's rows of this block, asked into L2 (used last)
    const int lines = a.Is >> 7;
    for (int l = threadIdx.x; l < 16 * lines; l += blockDim.x)
      moe_prefetch(a.s2 + (long long)(r0 + (l & 15)) * a.Is + (l >> 4) * 128);
  }
  __syncthreads();
  float accR[1][4] = {{0.f, 0.f, 0.f, 0.f}}, accS[1][4] = {{0.f, 0.f, 0.f, 0.f}};
  const int groups = a.I >> 7, cpe = (groups + G - 1) / G;
  const int total = a.K * cpe, per = (total + MOE_WARPS - 1) / MOE_WARPS;
  const int c0 = warp * per, cend = min(total, c0 + per);
  const long long rb = a.I >> 1, sb = a.I >> 5;
  const bool bl = (g >> 1) == t;
  bool bad = false;
  if (PFR) {  // chunk c0 + i / lines of the warp, row i % 16, 128-byte line (i / 16) % (lines / 16)
    const int lines = 16 * ((G * 64 + 127) >> 7);  // per chunk
    for (int i = lane; i < lines * (cend - c0); i += 32) {
      const int ci = c0 + i / lines, l = i - (i / lines) * lines, k = ci / cpe, q = (ci - k * cpe) * G;
      const int off = q * 64 + (l >> 4) * 128;
      if (recW[k] && off < groups * 64) moe_prefetch(recW[k] + (r0 + (l & 15)) * rb + off);
    }
  }
  using Ch = Fp4Wide<1, G, SS>;
  const int P = (groups + 1) >> 1;  // SS: group pairs an expert
  // Chunk c of the sequence: expert slot c / cpe, groups from (c % cpe)·G.
  wide_walk<Ch>(
      c0, cend, 1,
      [&](Ch &c, int ci) {
        const int k = ci / cpe, q = (ci - k * cpe) * G;
        const u8 *W = recW[k], *S = recS[k];
        if (!W) return;
        const uint4 *wr[1][2] = {{reinterpret_cast<const uint4 *>(W + (r0 + g) * rb), reinterpret_cast<const uint4 *>(W + (r0 + g + 8) * rb)}};
        const u8 *sr[1][2] = {{S + (r0 + g) * sb, S + (r0 + g + 8) * sb}};
        if (q + G <= groups) c.template load<false>(wr, sr, q, groups, t);
        else c.template load<true>(wr, sr, q, groups, t);
      },
      [&](const Ch &c, int ci) {
        const int k = ci / cpe, q = (ci - k * cpe) * G;
        if (!recW[k]) {
          bad = true;
          return;
        }
        const u16 *xb = hs + (long long)k * 2 * a.I + (g & 1) * a.I;
        const u32 *sk = ss + k * P * 32;
        if (q + G <= groups) c.template compute<DEC, false>(xb, bl, q, groups, t, accR, sk);
        else c.template compute<DEC, true>(xb, bl, q, groups, t, accR, sk);
      },
      [&] {
        // h by asynchronous copies (all in flight at once, no registers).
        const int n = (a.K * 2 * a.I + 2 * a.Is) >> 3;  // uint4 of h
        const uint4 *src = reinterpret_cast<const uint4 *>(a.h);
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
          const u32 dst = (u32)__cvta_generic_to_shared(moe_smem + i);
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src + i) : "memory");
        }
        if (SS) stage_scales2_t(a, r0, recW, recS, ss);
        asm volatile("cp.async.wait_all;" ::: "memory");
        __syncthreads();
      });
  quad_sum<1>(accR);
  if (a.Is > 0) {
    const int sspans = a.Is >> 6, scs = (sspans + UF - 1) / UF;
    const uint4 *wr[1][2] = {{reinterpret_cast<const uint4 *>(a.s2 + (long long)(r0 + g) * a.Is),
                              reinterpret_cast<const uint4 *>(a.s2 + (long long)(r0 + g + 8) * a.Is)}};
    const u8 *sr[1] = {a.c2 + (long long)(r0 >> a.bshift) * (a.Is >> a.bshift)};
    const u16 *xb = hs + (long long)a.K * 2 * a.I + (g & 1) * a.Is;
    const bool bs = g < 2;
    for (int c = warp; c < scs; c += MOE_WARPS) {
      const int s0 = c * UF;
      Fp8Chunk<1, UF, false> ch;
      if (s0 + UF <= sspans) {
        ch.template load<false>(wr, sr, a.bshift, xb, bs, s0, sspans, t);
        ch.template compute<false>(xb, bs, s0, sspans, t, accS);
      } else {
        ch.template load<true>(wr, sr, a.bshift, xb, bs, s0, sspans, t);
        ch.template compute<true>(xb, bs, s0, sspans, t, accS);
      }
    }
  }
  if (t == 0) {
    const float post = MoeDec<DEC>::post();
    const float nan = __int_as_float(0x7fc00000);
    const float r0v = fmaf(accR[0][1], 1.f / 2048.f, accR[0][0]) * post + fmaf(accS[0][1], 1.f / 2048.f, accS[0][0]);
    const float r8v = fmaf(accR[0][3], 1.f / 2048.f, accR[0][2]) * post + fmaf(accS[0][3], 1.f / 2048.f, accS[0][2]);
    red[warp][g][0] = bad ? nan : r0v;
    red[warp][g][1] = bad ? nan : r8v;
  }
  __syncthreads();
  if (threadIdx.x < 16) {
    const int i = threadIdx.x;
    float s = 0.f;
    for (int w = 0; w < MOE_WARPS; w++) s += red[w][i & 7][i >> 3];
    a.out[r0 + i] = s;
  }
}

// What a stage's block asks L2 for before the wait (MOXIE_PDL_PF), from the
// arguments alone: the routed experts' weights depend on ids, which the
// route kernel writes, so only the shared expert's. Stage 1: a shared
// tile's 16 rows of w1 and w3, as its warps' shares of each row (at most
// MOXIE_PF_BYTES of each; the whole tile at V4 shapes, where the tile then
// asks for it all again right after the wait); routed tiles nothing.
// Stage 2: the block's 16 rows of the shared w2 (each warp's share of a
// row is Is/8 bytes: whole rows at V4 shapes), which it reads last.
__device__ __forceinline__ MoxiePF moe1_pf(const MoeArgs &a) {
  const int spans = a.D >> 6, per = max(1, (spans + MOE_WARPS - 1) / MOE_WARPS);
  const int share = spans % per == 0 ? per * 64 : a.D;
  const long long r0 = (long long)blockIdx.x * 16;
  const bool sh = (int)blockIdx.x < (a.Is >> 4) && share > 0;
  return MoxiePF{sh ? a.s1 + r0 * a.D : nullptr, sh ? a.s3 + r0 * a.D : nullptr, min(share, MOXIE_PF_BYTES), share,
                 sh ? 16 * (a.D / share) : 0};
}
__device__ __forceinline__ MoxiePF moe2_pf(const MoeArgs &a) {
  const int share = a.Is / MOE_WARPS;
  const bool sh = a.Is > 0 && a.Is % MOE_WARPS == 0;
  return MoxiePF{sh ? a.s2 + (long long)blockIdx.x * 16 * a.Is : nullptr, nullptr, min(share, MOXIE_PF_BYTES), share,
                 sh ? 16 * MOE_WARPS : 0};
}
// moe2h_pf: moe2_pf's hints, then (returned, for MOXIE_PDL_PF) the
// block's slice of the boundary's fn (moe2lh, hc_epi_stage): 4·nm
// segments of 64 bytes, one a stream row, D floats apart.
__device__ __forceinline__ MoxiePF moe2h_pf(const MoeArgs &a) {
  moxie_pdl_pf(moe2_pf(a));
  return MoxiePF{a.hc.fn ? a.hc.fn + (long long)blockIdx.x * 16 : nullptr, nullptr, 64, 4LL * a.D, a.hc.fn ? 4 * MOE_HC_NM : 0};
}

// moe2_pf of a split stage 2 (SP blocks a row group): the group's last
// part (the one whose units reach the shared expert's spans when SP
// divides the units evenly enough; a hint either way) asks for its rows.
template <int SP>
__device__ __forceinline__ MoxiePF moe2s_pf(const MoeArgs &a) {
  const int share = a.Is / MOE_WARPS;
  const bool sh = a.Is > 0 && a.Is % MOE_WARPS == 0 && (int)blockIdx.x % SP == SP - 1;
  return MoxiePF{sh ? a.s2 + (long long)(blockIdx.x / SP) * 16 * a.Is : nullptr, nullptr, min(share, MOXIE_PF_BYTES), share,
                 sh ? 16 * MOE_WARPS : 0};
}

// Kernel names: moe1_u<U>_f<UF>_d<DEC>_b<B> (stage 1), moe1p_... (stage 1,
// persistent), moe1pf_... (persistent, w2 asked into L2 at the end),
// moe2_u<U>_f<UF>_d<DEC>_b<B> (stage 2), compiled for B blocks
// of 256 threads per SM (B 3: at most 80 registers); the variants of
// compute/cuda/moe.go's moeVariants.
#define MOE1(U, UF, DEC, B) \
  extern "C" __global__ void __launch_bounds__(MOE_THREADS, B) moe1_u##U##_f##UF##_d##DEC##_b##B(MoeArgs a) { MOXIE_PDL_PF(moe1_pf(a)); moe_stage1<U, UF, DEC>(a); }
#define MOE1P(U, UF, DEC, B) \
  extern "C" __global__ void __launch_bounds__(MOE_THREADS, B) moe1p_u##U##_f##UF##_d##DEC##_b##B(MoeArgs a, int *ctr) { MOXIE_PDL(); moe_stage1p<U, UF, DEC, false>(a, ctr); } \
  extern "C" __global__ void __launch_bounds__(MOE_THREADS, B) moe1pf_u##U##_f##UF##_d##DEC##_b##B(MoeArgs a, int *ctr) { MOXIE_PDL(); moe_stage1p<U, UF, DEC, true>(a, ctr); }
#define MOE2(U, UF, DEC, B) \
  extern "C" __global__ void __launch_bounds__(MOE_THREADS, B) moe2_u##U##_f##UF##_d##DEC##_b##B(MoeArgs a) { MOXIE_PDL_PF(moe2_pf(a)); moe_stage2<U, UF, DEC>(a); }

// The wide family: moe1w_g<G>_f<UF>_d<DEC>_b<B> (moe1wpf_...: with
// moe_prefetch_w2), moe2w_g<G>_f<UF>_d<DEC>_b<B>.
#define MOE1W(G, UF, DEC, B) \
  extern "C" __global__ void __launch_bounds__(MOE_THREADS, B) moe1w_g##G##_f##UF##_d##DEC##_b##B(MoeArgs a) { MOXIE_PDL_PF(moe1_pf(a)); moe_stage1w<G, UF, DEC, false>(a); }
#define MOE1WPF(G, UF, DEC, B) \
  extern "C" __global__ void __launch_bounds__(MOE_THREADS, B) moe1wpf_g##G##_f##UF##_d##DEC##_b##B(MoeArgs a) { MOXIE_PDL_PF(moe1_pf(a)); moe_stage1w<G, UF, DEC, true>(a); }
#define MOE2W(G, UF, DEC, B) \
  extern "C" __global__ void __launch_bounds__(MOE_THREADS, B) moe2w_g##G##_f##UF##_d##DEC##_b##B(MoeArgs a) { MOXIE_PDL_PF(moe2_pf(a)); moe_stage2w<G, UF, DEC>(a); }

// moe1ws_g<G>_f<UF>_d<DEC>_b<B>: the routed tiles' scales staged in shared
// memory (stage_scales_t).
#define MOE1WS(G, UF, DEC, B) \
  extern "C" __global__ void __launch_bounds__(MOE_THREADS, B) moe1ws_g##G##_f##UF##_d##DEC##_b##B(MoeArgs a) { MOXIE_PDL_PF(moe1_pf(a)); moe_stage1w<G, UF, DEC, false, true>(a); }

// moe2ws_g<G>_f<UF>_d<DEC>_b<B>: the experts' scales staged in shared
// memory (stage_scales2_t; G even).
#define MOE2WS(G, UF, DEC, B) \
  extern "C" __global__ void __launch_bounds__(MOE_THREADS, B) moe2ws_g##G##_f##UF##_d##DEC##_b##B(MoeArgs a) { MOXIE_PDL_PF(moe2_pf(a)); moe_stage2w<G, UF, DEC, true>(a); }

// moe1wa_f<UF>_d<DEC>_b<B>: the routed tiles' weights copied into shared
// memory by cp.async, their scales staged (stage1w_routed_async).
#define MOE1WA(UF, DEC, B) \
  extern "C" __global__ void __launch_bounds__(MOE_THREADS, B) moe1wa_f##UF##_d##DEC##_b##B(MoeArgs a) { MOXIE_PDL_PF(moe1_pf(a)); moe_stage1w<1, UF, DEC, false, true, true>(a); }

// moe2wsp_g<G>_f<UF>_d<DEC>_b<B>: moe2ws_... whose warps first ask L2 for
// their whole routed range.
#define MOE2WSP(G, UF, DEC, B) \
  extern "C" __global__ void __launch_bounds__(MOE_THREADS, B) moe2wsp_g##G##_f##UF##_d##DEC##_b##B(MoeArgs a) { MOXIE_PDL_PF(moe2_pf(a)); moe_stage2w<G, UF, DEC, true, true>(a); }

// moe1wsp_g<G>_f<UF>_d<DEC>_b<B>: moe1ws_... whose warps first ask L2 for
// their whole routed range.
#define MOE1WSP(G, UF, DEC, B) \
  extern "C" __global__ void __launch_bounds__(MOE_THREADS, B) moe1wsp_g##G##_f##UF##_d##DEC##_b##B(MoeArgs a) { MOXIE_PDL_PF(moe1_pf(a)); moe_stage1w<G, UF, DEC, false, true, false, true>(a); }

// The wide family's routed tiles in moe_stage1p's persistent blocks:
// moe1wp_g<G>_f<UF>_d<DEC>_b<B>.
#define MOE1WP(G, UF, DEC, B) \
  extern "C" __global__ void __launch_bounds__(MOE_THREADS, B) moe1wp_g##G##_f##UF##_d##DEC##_b##B(MoeArgs a, int *ctr) { MOXIE_PDL(); moe_stage1p<G, UF, DEC, false, true>(a, ctr); }

// ---- The lean family (moe1l_*, moe2l_*) ----
//
// The wide family's fragments and arithmetic (Fp4Wide's per-group mma
// sequence, Fp8Chunk for the shared expert), with no block-wide setup
// before the weights stream: every warp works alone until the block's one
// final reduction.
//
// Stage 1 (moe1l): blocks of LEAN1_WARPS = 4 warps, one per 16-row tile
// (896 blocks at V4 shapes, which fit the H200's 132 SMs at once with
// at most 72 registers: 7 blocks an SM), warp w taking a contiguous quarter
// of the tile's columns. A warp issues its first two chunks of weight loads
// (one 128-column group each: w1 and w3, rows g and g+8, 64 bytes a lane),
// then converts just its own columns of x to hi/lo f16 into its own region
// of shared memory (no barrier: __syncwarp), then walks its range with two
// chunks in flight. Dynamic shared memory 16·W bytes (W = lean1_width(D)
// columns a warp: 16 KB at D 4096).
//
// Stage 2 (moe2l): blocks of LEAN2_WARPS = 16 warps, one per 16 output
// rows. The block's work is a sequence of units of 16 rows x 1 KB of
// weights (the K experts' 128-column MXFP4 groups, expert-major, then the
// shared expert's 64-column FP8 spans), warp w taking a contiguous share.
// B (h, written by stage 1 as hi/lo f16) is not staged per block: each
// chunk's h columns are copied by cp.async into the warp's ring slot when
// the chunk's weight loads are issued (L2-hot, so they land before the
// weights), two chunks in flight.
//
// Split stage 2 (moe2s): moe2l's body with the units of each 16-row group
// spread over SP blocks of NW warps (block b: row group b / SP, part
// b % SP; the group's NW·SP warps take contiguous shares in part-major
// order), so that more, smaller blocks fill the SMs (at V4 shapes SP 3,
// NW 4: 768 blocks, all resident at 6 an SM) with G 2 units a chunk (four
// units, 4 KB, in flight a warp). Each block writes its 16 partial sums
// to a.part; the last block of a row group to arrive (an atomic ticket
// per group, reset by that block, so a run, or a graph replay, needs no
// host reset) adds the SP partials in part order: the sum's order is
// fixed, so results are bitwise reproducible.

#define LEAN1_WARPS 4
#define LEAN2_WARPS 16

// A stage-1 lean routed warp's groups at most.
__device__ __forceinline__ int lean1_groups(int D) { return ((D >> 7) + LEAN1_WARPS - 1) / LEAN1_WARPS; }

// Columns of x a stage-1 lean warp stages (the larger of a routed warp's
// 128-column groups and a shared warp's 64-column spans).
__device__ __forceinline__ int lean1_width(int D) {
  return max(((D >> 7) + LEAN1_WARPS - 1) / LEAN1_WARPS * 128, ((D >> 6) + LEAN1_WARPS - 1) / LEAN1_WARPS * 64);
}

// One warp: x columns [c0, c0 + n) (n a multiple of 8) as hi (xw[0..n))
// and lo (xw[W..W + n)), routed (perm) or natural layout; then __syncwarp.
// With nw (gemvm_stage_xn's use) each value is first (v·inv)·nw[c],
// RMSNorm's order.
__device__ __forceinline__ void lean_stage_x(const float *__restrict__ v, u16 *xw, int c0, int n, int W, bool perm,
                                             const float *__restrict__ nw = nullptr, float inv = 1.f) {
  const int lane = threadIdx.x & 31;
  const float4 *v4 = reinterpret_cast<const float4 *>(v + c0);
#pragma unroll 2
  for (int i = lane; i < n / 8; i += 32) {
    float4 p = __ldg(v4 + 2 * i), q = __ldg(v4 + 2 * i + 1);
    if (nw) {
      const float4 *w4 = reinterpret_cast<const float4 *>(nw + c0);
      const float4 a = __ldg(w4 + 2 * i), b = __ldg(w4 + 2 * i + 1);
      p = make_float4(p.x * inv * a.x, p.y * inv * a.y, p.z * inv * a.z, p.w * inv * a.w);
      q = make_float4(q.x * inv * b.x, q.y * inv * b.y, q.z * inv * b.z, q.w * inv * b.w);
    }
    uint4 H, L;
    hilo8(p, q, perm, H, L);
    *reinterpret_cast<uint4 *>(xw + 8 * i) = H;
    *reinterpret_cast<uint4 *>(xw + W + 8 * i) = L;
  }
  __syncwarp();
}

// The products of one 128-column group of an MXFP4 16-row tile (the lane's
// words w0, w1 of rows g and g+8, span 4q+t) with B from xq (this lane's
// 32 columns of span 4q+t, hi or lo, routed layout; bl: the lane supplies
// B), scaled by the rows' scales fa, fb into acc: Fp4Wide's sequence for
// one matrix and group.
template <int DEC>
__device__ __forceinline__ void lean_group(const uint4 &w0, const uint4 &w1, float fa, float fb, const u16 *xq, bool bl, float (&acc)[4]) {
  float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const uint4 b = bl ? *reinterpret_cast<const uint4 *>(xq + 8 * j) : make_uint4(0u, 0u, 0u, 0u);
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

// Stage 1's routed chunk: NG groups of w1 and w3 (rows g and g+8) from
// group q on, those below end. p1, p3: this lane's first word of row g of
// w1 and w3 (+ rs: row g+8).
template <int NG = 1>
struct Lean1Fp4 {
  uint4 w[NG][2][2];
  __device__ __forceinline__ void load(const u8 *p1, const u8 *p3, int rs, int q, int end) {
#pragma unroll
    for (int i = 0; i < NG; i++) {
      if (NG > 1 && q + i >= end) break;
      const int o = 64 * (q + i);
      w[i][0][0] = ldw(reinterpret_cast<const uint4 *>(p1 + o));
      w[i][0][1] = ldw(reinterpret_cast<const uint4 *>(p1 + rs + o));
      w[i][1][0] = ldw(reinterpret_cast<const uint4 *>(p3 + o));
      w[i][1][1] = ldw(reinterpret_cast<const uint4 *>(p3 + rs + o));
    }
  }
};

// lean_stage_scales's item i (row g = i & 7 of group q0 + (i >> 3)): its
// four scale words (w1 row g, g+8, w3 row g, g+8), and their transposed
// store.
__device__ __forceinline__ void lean_scales_load(const u8 *S1, const u8 *S3, int r0, int sb, int q0, int i, u32 (&w)[4]) {
  const int g = i & 7, q = q0 + (i >> 3);
  w[0] = __ldg(reinterpret_cast<const u32 *>(S1 + (r0 + g) * sb) + q);
  w[1] = __ldg(reinterpret_cast<const u32 *>(S1 + (r0 + g + 8) * sb) + q);
  w[2] = __ldg(reinterpret_cast<const u32 *>(S3 + (r0 + g) * sb) + q);
  w[3] = __ldg(reinterpret_cast<const u32 *>(S3 + (r0 + g + 8) * sb) + q);
}
__device__ __forceinline__ void lean_scales_store(const u32 (&w)[4], int i, u32 *ssw) {
  const int g = i & 7, qi = i >> 3, x = qi & 3;
  const u32 lo01 = __byte_perm(w[0], w[1], 0x5140), hi01 = __byte_perm(w[0], w[1], 0x7362);
  const u32 lo23 = __byte_perm(w[2], w[3], 0x5140), hi23 = __byte_perm(w[2], w[3], 0x7362);
  u32 *d = ssw + 32 * qi + g;
  d[(0 ^ x) << 3] = __byte_perm(lo01, lo23, 0x5410);
  d[(1 ^ x) << 3] = __byte_perm(lo01, lo23, 0x7632);
  d[(2 ^ x) << 3] = __byte_perm(hi01, hi23, 0x5410);
  d[(3 ^ x) << 3] = __byte_perm(hi01, hi23, 0x7632);
}

// One warp: the E8M0 scales of groups [q0, q0 + n) of a routed stage-1
// tile (rows r0..r0+15 of S1 and S3, sb bytes a row) into ssw (32 words a
// group), transposed as stage_scales_t does: group q0 + i's word that lane
// (g, t) reads, ssw[32i + ((t ^ (i & 3)) << 3 | g)], holds the scale bytes
// of span 4(q0 + i) + t of w1 row g, w1 row g+8, w3 row g, w3 row g+8.
__device__ __forceinline__ void lean_stage_scales(const u8 *S1, const u8 *S3, int r0, int sb, int q0, int n, u32 *ssw) {
  const int lane = threadIdx.x & 31;
#pragma unroll 2
  for (int i = lane; i < 8 * n; i += 32) {
    u32 w[4];
    lean_scales_load(S1, S3, r0, sb, q0, i, w);
    lean_scales_store(w, i, ssw);
  }
}

// lean_stage_scales and lean_stage_x (routed layout) for a warp's groups
// [q0, q0 + n): with SR the first 64 items' scale words are loaded into
// registers before x is staged and stored after, so that their memory
// latency and x's overlap (without, the warp waits for the scales, then
// for x).
template <bool SR>
__device__ __forceinline__ void lean_stage_routed(const float *__restrict__ x, u16 *xw, int W, const u8 *S1, const u8 *S3, int r0, int sb, int q0,
                                                  int n, u32 *ssw) {
  if (!SR) {
    lean_stage_scales(S1, S3, r0, sb, q0, n, ssw);
    lean_stage_x(x, xw, q0 * 128, n * 128, W, true);
    return;
  }
  const int lane = threadIdx.x & 31, m = 8 * n;
  u32 wa[4], wb[4];
  if (lane < m) lean_scales_load(S1, S3, r0, sb, q0, lane, wa);
  if (lane + 32 < m) lean_scales_load(S1, S3, r0, sb, q0, lane + 32, wb);
  lean_stage_x(x, xw, q0 * 128, n * 128, W, true);
  if (lane < m) lean_scales_store(wa, lane, ssw);
  if (lane + 32 < m) lean_scales_store(wb, lane + 32, ssw);
  for (int i = lane + 64; i < m; i += 32) {
    u32 w[4];
    lean_scales_load(S1, S3, r0, sb, q0, i, w);
    lean_scales_store(w, i, ssw);
  }
  __syncwarp();
}

// A lean chunk of UF FP8 spans (64 columns each) of NM matrices' 16-row
// tiles: pw[m] is this lane's first 16-byte word of row g of matrix m (+
// rs: row g+8), ps[m] the tile's row of block scales, bshift log2 of the
// block edge. compute() is Fp8Chunk's arithmetic with B (natural layout)
// at xb + 64s + 16t (s the absolute span); with xs, each span's sums are
// also scaled by xs[s/2] (x's scale of the 128-column block: gemvq_*).
template <int NM, int UF>
struct LeanFp8 {
  uint4 w[UF][NM][2];
  u32 sc[UF][NM];

  template <bool GUARD>
  __device__ __forceinline__ void load(const u8 *const (&pw)[NM], long long rs, const u8 *const (&ps)[NM], int bshift, int s0, int spans) {
#pragma unroll
    for (int u = 0; u < UF; u++) {
      const int s = s0 + u;
      const bool ok = !GUARD || s < spans;
#pragma unroll
      for (int m = 0; m < NM; m++) {
        w[u][m][0] = ok ? ldw(reinterpret_cast<const uint4 *>(pw[m] + 64 * s)) : make_uint4(0u, 0u, 0u, 0u);
        w[u][m][1] = ok ? ldw(reinterpret_cast<const uint4 *>(pw[m] + rs + 64 * s)) : make_uint4(0u, 0u, 0u, 0u);
        sc[u][m] = ok ? (u32)__ldg(ps[m] + ((s * 64) >> bshift)) : 0u;
      }
    }
  }

  template <bool GUARD>
  __device__ __forceinline__ void compute(const u16 *xb, bool bl, int s0, int spans, int t, float (&acc)[NM][4], const float *xs = nullptr) const {
#pragma unroll
    for (int u = 0; u < UF; u++) {
      const int s = s0 + u;
      if (GUARD && s >= spans) break;
      const u16 *xq = xb + s * 64 + 16 * t;
      float d[NM][4];
#pragma unroll
      for (int m = 0; m < NM; m++)
#pragma unroll
        for (int i = 0; i < 4; i++) d[m][i] = 0.f;
#pragma unroll
      for (int h = 0; h < 2; h++) {  // k steps 2h, 2h+1: B words of xq[8h..8h+7]
        const uint4 b = bl ? *reinterpret_cast<const uint4 *>(xq + 8 * h) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int m = 0; m < NM; m++) {
          const u32 ra0 = quarter(w[u][m][0], 2 * h), rb0 = quarter(w[u][m][1], 2 * h);
          const u32 ra1 = quarter(w[u][m][0], 2 * h + 1), rb1 = quarter(w[u][m][1], 2 * h + 1);
          mma16816(d[m], e4m3x2_f16x2(ra0), e4m3x2_f16x2(rb0), e4m3x2_f16x2(ra0 >> 16), e4m3x2_f16x2(rb0 >> 16), b.x, b.y);
          mma16816(d[m], e4m3x2_f16x2(ra1), e4m3x2_f16x2(rb1), e4m3x2_f16x2(ra1 >> 16), e4m3x2_f16x2(rb1 >> 16), b.z, b.w);
        }
      }
#pragma unroll
      for (int m = 0; m < NM; m++) {
        const float f = xs ? __int_as_float(sc[u][m] << 23) * xs[s >> 1] : __int_as_float(sc[u][m] << 23);
#pragma unroll
        for (int i = 0; i < 4; i++) acc[m][i] = fmaf(d[m][i], f, acc[m][i]);
      }
    }
  }
};

// stage1_finish_half: the end of one column half of a shared-expert tile
// (moe_stage1l's SH2; tile r0/16, half hf): the half's warps' sums added
// in warp order (stage1_sums), stored to a.part
// (sh1HalfBytes in moe.go: 32 floats a half, [tile][half][g or u][row]);
// the second half of the tile to arrive (an atomic ticket a tile after the
// partials, reset by that block, so runs and graph replays need no host
// reset) adds half 0's sums and half 1's, in that order, and stores the
// SwiGLU of the tile's 16 rows as stage1_finish does.
template <int NW>
__device__ __forceinline__ void stage1_finish_half(const MoeArgs &a, int r0, int hf, const float (&acc)[2][4], float (&red)[NW][8][4]) {
  float gv, uv;
  stage1_sums(acc, red, gv, uv);
  const int tile = r0 >> 4, tiles = a.Is >> 4;
  float *mine = a.part + (long long)(2 * tile + hf) * 32;
  __shared__ bool last;
  if (threadIdx.x < 16) {
    mine[threadIdx.x] = gv;
    mine[16 + threadIdx.x] = uv;
    __threadfence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned *ticket = reinterpret_cast<unsigned *>(a.part + (long long)tiles * 64) + tile;
    last = atomicAdd(ticket, 1u) == 1u;
    if (last) atomicExch(ticket, 0u);  // both halves are in: ready for the next run
  }
  __syncthreads();
  if (!last || threadIdx.x >= 16) return;
  __threadfence();
  const int i = threadIdx.x;
  const float *p0 = a.part + (long long)(2 * tile) * 32, *p1 = p0 + 32;
  const float v = moe_swiglu(__ldcg(p0 + i) + __ldcg(p1 + i), __ldcg(p0 + 16 + i) + __ldcg(p1 + 16 + i), 0.f);
  u16 *hrow = a.h + (long long)a.K * 2 * a.I;
  hilo(v, hrow[r0 + i], hrow[a.Is + r0 + i]);
}

// Stage 1, lean: see the family's comment; bid is the tile (the kernels
// pass blockIdx.x). Tiles [0, Is/16) are the shared expert's, then the
// K·I/16 routed ones (as moe_stage1).
// PFR: a routed warp, once its first chunks are issued, asks L2 for the
// rest of its range (prefetch hints: 16 rows of w1 and w3, 8 KB at D 4096
// beyond the first 256-byte fetch of each row), so its whole range is in
// flight at once. (The shared tiles' rows were asked for before the PDL
// wait: moe1_pf.)
// SH2: the shared expert's tiles are split into two column halves, one a
// block (blocks [0, Is/8): tile b/2, half b%2; stage1_finish_half), so that
// a shared warp's range is as long as a routed warp's (FP8 rows are twice
// the bytes of MXFP4 ones).
template <int DEC, bool PFR, int NG = 1, bool SR = false, bool SH2 = false>
__device__ __forceinline__ void moe_stage1l(const MoeArgs &a, const int bid) {
  extern __shared__ uint4 moe_smem[];
  __shared__ float red[LEAN1_WARPS][8][4];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int W = lean1_width(a.D), P = lean1_groups(a.D);
  u16 *xw = reinterpret_cast<u16 *>(reinterpret_cast<u8 *>(moe_smem) + warp * (4 * W + 128 * P));  // x: 4W bytes
  u32 *ssw = reinterpret_cast<u32 *>(xw + 2 * W);                                                 // routed scales: 128P bytes
  const int nsh = SH2 ? a.Is >> 3 : a.Is >> 4;
  float acc[2][4];
#pragma unroll
  for (int m = 0; m < 2; m++)
#pragma unroll
    for (int i = 0; i < 4; i++) acc[m][i] = 0.f;
  if (bid < nsh) {  // block-uniform: a shared-expert tile (FP8, natural layout)
    const int hf = SH2 ? bid & 1 : 0;
    const int r0 = (SH2 ? bid >> 1 : bid) * 16;
    const int spans = SH2 ? a.D >> 7 : a.D >> 6, per = (spans + LEAN1_WARPS - 1) / LEAN1_WARPS;
    const int s0 = hf * spans + warp * per, end = min((hf + 1) * spans, s0 + per);
    const u8 *pw[2] = {a.s1 + (long long)(r0 + g) * a.D + 16 * t, a.s3 + (long long)(r0 + g) * a.D + 16 * t};
    const int sstride = a.D >> a.bshift;
    const u8 *ps[2] = {a.c1 + (long long)(r0 >> a.bshift) * sstride, a.c3 + (long long)(r0 >> a.bshift) * sstride};
    const bool bl = g < 2;
    const u16 *xb = xw + (g & 1) * W - s0 * 64;  // column c's hi/lo at xb[c]
    using Ch = LeanFp8<2, NG>;
    wide_walk<Ch>(
        s0, end, NG, [&](Ch &c, int s) { c.template load<(NG > 1)>(pw, 8LL * a.D, ps, a.bshift, s, end); },
        [&](const Ch &c, int s) { c.template compute<(NG > 1)>(xb, bl, s, end, t, acc); },
        [&] {
          if (s0 < end) lean_stage_x(a.x, xw, s0 * 64, (end - s0) * 64, W, false);
        });
    if (SH2) stage1_finish_half(a, r0, hf, acc, red);
    else stage1_finish<DEC>(a, true, true, 0, r0, acc, red);
    return;
  }
  const int tile = bid - nsh, tpe = a.I >> 4;
  const int k = tile / tpe, r0 = (tile - k * tpe) * 16;
  const int id = __ldg(a.ids + k);
  const bool valid = (unsigned)id < (unsigned)a.E;
  const LinRec *r1 = a.t13 + 2 * (valid ? id : 0), *r3 = r1 + 1;
  const u8 *W1 = r1->W, *S1 = r1->S, *W3 = r3->W, *S3 = r3->S;
  const int groups = a.D >> 7, per = (groups + LEAN1_WARPS - 1) / LEAN1_WARPS;
  const int q0 = warp * per, end = valid ? min(groups, q0 + per) : 0;
  const int rb = a.D >> 1;
  const u8 *p1 = W1 + (r0 + g) * rb + 16 * t, *p3 = W3 + (r0 + g) * rb + 16 * t;
  const bool bl = (g >> 1) == t;
  const u16 *xb = xw + (g & 1) * W - q0 * 128 + t * 32;  // + 128q: this lane's B of group q
  const u32 *sw = ssw - 32 * q0 + g;                     // + 32q + ((t ^ (q - q0) & 3) << 3): group q's scales
  using Ch4 = Lean1Fp4<NG>;
  wide_walk<Ch4>(
      q0, end, NG, [&](Ch4 &c, int q) { c.load(p1, p3, 8 * rb, q, end); },
      [&](const Ch4 &c, int q0c) {
#pragma unroll
        for (int i = 0; i < NG; i++) {
          const int q = q0c + i;
          if (NG > 1 && q >= end) break;
          const u32 s4 = sw[32 * q + ((t ^ ((q - q0) & 3)) << 3)];
          lean_group<DEC>(c.w[i][0][0], c.w[i][0][1], e8m0_byte<0>(s4), e8m0_byte<1>(s4), xb + 128 * q, bl, acc[0]);
          lean_group<DEC>(c.w[i][1][0], c.w[i][1][1], e8m0_byte<2>(s4), e8m0_byte<3>(s4), xb + 128 * q, bl, acc[1]);
        }
      },
      [&] {
        if (PFR && q0 < end) {  // lane i: row i & 15, matrix (i >> 4) & 1, 128-byte line i >> 5 of the range
          const int lines = ((end - q0) * 64 + 127) >> 7;
          for (int i = lane; i < 32 * lines; i += 32)
            moe_prefetch(((i >> 4) & 1 ? W3 : W1) + (r0 + (i & 15)) * rb + q0 * 64 + (i >> 5) * 128);
        }
        if (q0 < end) lean_stage_routed<SR>(a.x, xw, W, S1, S3, r0, a.D >> 5, q0, end - q0, ssw);
      });
  quad_sum<2>(acc);
  stage1_finish<DEC>(a, false, valid, k, r0, acc, red);
}

__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
  const u32 d = (u32)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait1() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// moe_warp_sum: v summed over the warp by the xor butterfly 16, 8, 4, 2, 1
// (every lane gets the same bits).
__device__ __forceinline__ float moe_warp_sum(float v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}

// The sublayer boundary after a producer of a model-width output o [D]
// (MoE stage 2: moe2lh; a one-token FP8 product: gemvmh_*), begun in its
// epilogue: each block, once its 16 output rows o[r0, r0 + 16) are summed,
// forms the expanded streams of those rows, x'[k][i] = post[k]·o[i] + Σ_j
// comb[j, k]·x[j][i] (HCExpand's operations in its order: fma(comb[3, k],
// x[3], … fma(comb[0, k], x[0], post[k]·o))), stores them to xout and
// leaves the tile's partials of the boundary's split-K mix in part[m,
// r0/16]: for m < nm, Σ over its 64 (k, i) of fn[m, k·D + i]·x'[k][i], for
// m = nm, Σ x'²; fuse_hc_finish4w then sums the D/16 tiles. So the
// boundary's first kernel (fuse_hc_dots4) is not launched: x' is its bits,
// the partials add in another order. hc_epi_stage asks for the block's fn
// slice, x rows, post and comb (cp.async into shared memory, one commit
// group; every thread of the block calls it once, after the PDL wait);
// hc_epi_finish (every thread, once ho holds o's 16 rows) waits for them.
__device__ __forceinline__ void hc_epi_stage(const HcEpi &h, int D, int r0, float *sfn, float *sx, float *spc) {
  for (int i = threadIdx.x; i < 16 * MOE_HC_NM + 21; i += blockDim.x) {
    if (i < 16 * MOE_HC_NM) {  // fn[m, k·D + r0 + 4q .. +4) → sfn[m·64 + 16k + 4q]
      const int m = i >> 4, k = (i >> 2) & 3, q = i & 3;
      cp_async16(sfn + m * 64 + k * 16 + q * 4, h.fn + (long long)m * 4 * D + (long long)k * D + r0 + q * 4);
    } else if (i < 16 * MOE_HC_NM + 16) {  // x[k][r0 + 4q .. +4) → sx[16k + 4q]
      const int j = i - 16 * MOE_HC_NM, k = j >> 2, q = j & 3;
      cp_async16(sx + k * 16 + q * 4, h.x + (long long)k * D + r0 + q * 4);
    } else {  // post → spc[0..4), comb → spc[4..20)
      const int j = i - 16 * MOE_HC_NM - 16;
      cp_async16(spc + 4 * j, j == 0 ? h.post : h.comb + 4 * (j - 1));
    }
  }
  cp_async_commit();
}

__device__ __forceinline__ void hc_epi_finish(const HcEpi &h, int D, int r0, const float *ho, const float *sfn, const float *sx,
                                              const float *spc) {
  cp_async_wait_all();
  __syncthreads();  // ho, and every thread's staged slices
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  // Lane l forms x' of rows i = l mod 16 of streams k0 = l / 16 and k1 = k0 + 2.
  const int i = lane & 15, k0 = lane >> 4, k1 = k0 + 2;
  const float o = ho[i];
  float x0 = __fmul_rn(spc[k0], o), x1 = __fmul_rn(spc[k1], o);
#pragma unroll
  for (int j = 0; j < 4; j++) {
    x0 = __fmaf_rn(spc[4 + 4 * j + k0], sx[16 * j + i], x0);
    x1 = __fmaf_rn(spc[4 + 4 * j + k1], sx[16 * j + i], x1);
  }
  if (warp == 0) {
    h.xout[(long long)k0 * D + r0 + i] = x0;
    h.xout[(long long)k1 * D + r0 + i] = x1;
  }
  // With gram: lanes 0-15 gather row i's four streams (the other half-warp
  // holds streams 1 and 3) for the Gram rows nm + 1 + p, pair p of (j, k)
  // in (0,0), (0,1), (0,2), (0,3), (1,1), (1,2), (1,3), (2,2), (2,3), (3,3).
  const float y0 = __shfl_xor_sync(0xffffffffu, x0, 16), y1 = __shfl_xor_sync(0xffffffffu, x1, 16);
  const float xk[4] = {x0, y0, x1, y1};  // lanes 0-15: streams 0, 1, 2, 3 of row i
  const int rows = h.nm + 1 + (h.gram ? 10 : 0);
  for (int m = warp; m < rows; m += nw) {
    float v;
    if (m < h.nm) {
      v = __fmaf_rn(sfn[m * 64 + 16 * k1 + i], x1, __fmul_rn(sfn[m * 64 + 16 * k0 + i], x0));
    } else if (m == h.nm) {
      v = __fmaf_rn(x1, x1, __fmul_rn(x0, x0));
    } else {
      const int p = m - h.nm - 1, j = p < 4 ? 0 : p < 7 ? 1 : p < 9 ? 2 : 3, k = p - (j == 0 ? 0 : j == 1 ? 3 : j == 2 ? 5 : 6);
      v = lane < 16 ? __fmul_rn(xk[j], xk[k]) : 0.f;
    }
    v = moe_warp_sum(v);
    if (lane == 0) h.part[(long long)m * (D >> 4) + (r0 >> 4)] = v;
  }
}

// The ring walks' steady part: chunks q (A, slot 0) and q + step (B, slot
// 1) are issued, one commit group each; ld(ch, q, slot) issues a chunk's
// loads and copies.
template <typename Chunk, typename Ld, typename Cp>
__device__ __forceinline__ void lean_ring_steady(Chunk &A, Chunk &B, int q, int end, int step, Ld ld, Cp cp) {
  while (q < end) {
    cp_async_wait1();
    __syncwarp();
    cp(A, q, 0);
    __syncwarp();  // slot 0 read by every lane before it is refilled
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

// Walks the chunks [q, end) of a warp (step units each) with two in flight,
// A in ring slot 0 and B in slot 1: ld(ch, q, slot) issues chunk q's weight
// loads and its B copies (cp.async) into the slot, one commit group a chunk
// (empty ones too, so that wait_group 1 always means "all but the newest");
// cp(ch, q, slot) uses them once the warp's copies have landed.
template <typename Chunk, typename Ld, typename Cp>
__device__ __forceinline__ void lean_ring_walk(int q, int end, int step, Ld ld, Cp cp) {
  Chunk A, B;
  if (q < end) ld(A, q, 0);
  cp_async_commit();
  if (q + step < end) ld(B, q + step, 1);
  cp_async_commit();
  lean_ring_steady(A, B, q, end, step, ld, cp);
}

// lean_ring_walk for a walk whose first two chunks' weights are asked for
// before the kernel waits for the one before it: ld(ch, q, slot, what)
// issues chunk q's weight loads (what & 1) and its B copies (what & 2);
// the first two chunks' weights go out, then wait() (the PDL wait, and
// whatever must follow it), then their B copies, one commit group each,
// then the walk goes on as lean_ring_walk's (ld with what 3).
template <typename Chunk, typename Ld, typename Cp, typename Wait>
__device__ __forceinline__ void lean_ring_walk_early(int q, int end, int step, Ld ld, Cp cp, Wait wait) {
  Chunk A, B;
  if (q < end) ld(A, q, 0, 1);
  if (q + step < end) ld(B, q + step, 1, 1);
  wait();
  if (q < end) ld(A, q, 0, 2);
  cp_async_commit();
  if (q + step < end) ld(B, q + step, 1, 2);
  cp_async_commit();
  lean_ring_steady(A, B, q, end, step, [&](Chunk &c, int u, int slot) { ld(c, u, slot, 3); }, cp);
}

// Stage 2's routed chunk: G units (128-column groups of any expert slots)
// of w2 rows g and g+8.
template <int G>
struct Lean2Fp4 {
  uint4 w[G][2];
  u32 sc[G][2];
};

// Stage 2, lean: see the family's comment. A ring slot holds G routed
// units' h columns (512 bytes each: hi then lo of 128 columns, routed
// layout) or UF FP8 spans' (hi of the UF·64 columns, then lo). PFR: a
// warp first asks L2 for its whole routed range (one hint a unit and row:
// 16 rows x 64 bytes a unit), so it is in flight at once. (The shared
// expert's rows were asked for before the PDL wait: moe2_pf.) EW: the
// kernel waits inside (MOXIE_PDL_INSIDE): the block reads the expert ids
// and records, and each routed warp issues its first two chunks of weight
// loads, before the PDL wait; h is copied, and the boundary's slices
// (HCE) asked for, after it. The ids are the routing kernel's, two
// kernels back: the stage 1 in front must have blocks that wait for it
// (moe1lx's routed tiles do; see moe2le).
template <int G, int UF, int DEC, bool PFR, int NW = LEAN2_WARPS, int SP = 1, bool EARLY = false, bool HCE = false, bool EW = false>
__device__ __forceinline__ void moe_stage2l(const MoeArgs &a) {
  static_assert(UF <= 2 * G, "a ring slot holds 2G FP8 spans");
  static_assert(!HCE || (SP == 1 && !EARLY), "the boundary's epilogue: one block a row group");
  static_assert(!EW || (SP == 1 && !EARLY && !PFR), "early weights: one block a row group, no other early work");
  __shared__ uint4 ring[NW][2][G * 32];
  __shared__ float red[NW][8][2];
  __shared__ const u8 *recW[MOE_MAXK], *recS[MOE_MAXK];
  __shared__ int lastBlock;
  __shared__ __align__(16) float hfn[HCE ? MOE_HC_NM * 64 : 4], hxs[HCE ? 64 : 4], hpc[HCE ? 20 : 4], ho[HCE ? 16 : 4];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int rg = blockIdx.x / SP, part = blockIdx.x - rg * SP;
  const int r0 = rg * 16;
  if (HCE && !EW) hc_epi_stage(a.hc, a.D, r0, hfn, hxs, hpc);
  for (int k = threadIdx.x; k < a.K; k += blockDim.x) {
    const int id = EW ? __ldcg(a.ids + k) : __ldg(a.ids + k);  // EW: before the wait, from L2
    const bool ok = (unsigned)id < (unsigned)a.E;
    recW[k] = ok ? a.t2[id].W : nullptr;
    recS[k] = ok ? a.t2[id].S : nullptr;
  }
  __syncthreads();
  const int gpe = a.I >> 7, R = a.K * gpe, S = a.Is >> 6, total = R + S;
  const int per = (total + NW * SP - 1) / (NW * SP);
  const int u0 = min(total, (part * NW + warp) * per), u1 = min(total, u0 + per);
  const long long rb = a.I >> 1, sb = a.I >> 5;
  u16 *slots = reinterpret_cast<u16 *>(&ring[warp][0][0]);  // slot i at slots + i·G·256
  float accR[4] = {0.f, 0.f, 0.f, 0.f}, accS[1][4] = {{0.f, 0.f, 0.f, 0.f}};
  // A routed unit ui's expert slot is ui / gpe = umulhi(2·ui, gmul), gmul =
  // ceil(2^31 / gpe) (exact while ui < 2^31 / gpe: ui < K·gpe is far
  // below), not a division a unit.
  const u32 gmul = (0x80000000u + (u32)gpe - 1u) / (u32)gpe;
  // bad: an expert of this warp's routed range is outside the table (its
  // units are loaded as zeros and the block's rows become NaN).
  bool bad = false;
  if (u0 < R)
    for (int k = (int)__umulhi(2u * u0, gmul), kl = (int)__umulhi(2u * (min(u1, R) - 1), gmul); k <= kl; k++) bad |= !recW[k];
  const bool blR = (g >> 1) == t;
  auto wait = [&] {  // EW: the PDL wait, then what must follow it
    MOXIE_PDL();
    if (HCE) hc_epi_stage(a.hc, a.D, r0, hfn, hxs, hpc);
  };
  if (PFR && u0 < R) {
    const int n = min(u1, R) - u0;
    for (int i = lane; i < 16 * n; i += 32) {
      const int ui = u0 + (i >> 4), k = ui / gpe, q = ui - k * gpe;
      if (recW[k]) moe_prefetch(recW[k] + (r0 + (i & 15)) * rb + 64 * q);
    }
  }
  if (EARLY) {  // the shared expert's spans of this warp asked for too, then the wait (h is stage 1's)
    const int sa = max(u0, R) - R, n = max(0, u1 - R - sa);
    for (int i = lane; i < 16 * n; i += 32) moe_prefetch(a.s2 + (long long)(r0 + (i & 15)) * a.Is + 64 * (sa + (i >> 4)));
    MOXIE_PDL();
  }
  if (u0 < R) {
    const int uend = min(u1, R);
    using Ch = Lean2Fp4<G>;
    // what & 1: the units' weights and scales (zeros for an expert outside
    // the table); what & 2: their h (lane L copies 16 bytes: hi (L < 16) or
    // lo, columns 128q + 8(L & 15)).
    auto ld = [&](Ch &c, int u, int slot, int what) {
#pragma unroll
      for (int i = 0; i < G; i++) {
        const int ui = u + i, k = (int)__umulhi(2u * ui, gmul), q = ui - k * gpe;
        const u8 *Wk = ui < uend ? recW[k] : nullptr;
        if (Wk) {
          const u8 *Sk = recS[k];
          if (what & 1)
#pragma unroll
            for (int r = 0; r < 2; r++) {
              c.w[i][r] = ldw(reinterpret_cast<const uint4 *>(Wk + (r0 + g + 8 * r) * rb) + 4 * q + t);
              c.sc[i][r] = __ldg(Sk + (r0 + g + 8 * r) * sb + 4 * q + t);
            }
          if (what & 2) {
            const u16 *src = a.h + (long long)k * 2 * a.I + (lane >> 4) * a.I + 128 * q + 8 * (lane & 15);
            cp_async16(slots + (slot * G + i) * 256 + (lane >> 4) * 128 + 8 * (lane & 15), src);
          }
        } else if (what & 1) {
#pragma unroll
          for (int r = 0; r < 2; r++) {
            c.w[i][r] = make_uint4(0u, 0u, 0u, 0u);
            c.sc[i][r] = 0u;
          }
        }
      }
    };
    auto cp = [&](const Ch &c, int u, int slot) {
#pragma unroll
      for (int i = 0; i < G; i++) {
        if (u + i >= uend) break;
        lean_group<DEC>(c.w[i][0], c.w[i][1], __int_as_float(c.sc[i][0] << 23), __int_as_float(c.sc[i][1] << 23), slots + (slot * G + i) * 256 + (g & 1) * 128 + t * 32, blR,
                        accR);
      }
    };
    if (EW) lean_ring_walk_early<Ch>(u0, uend, G, ld, cp, wait);
    else lean_ring_walk<Ch>(u0, uend, G, [&](Ch &c, int u, int slot) { ld(c, u, slot, 3); }, cp);
  } else if (EW) {
    wait();
  }
  float accQ[1][4] = {{accR[0], accR[1], accR[2], accR[3]}};
  quad_sum<1>(accQ);
  if (u1 > R) {  // the shared expert's spans [sa, send)
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
          // h: span i's 64 columns, hi then lo: lanes L < 16 copy 16 bytes each.
          if (lane < 16) {
            const int hl = lane >> 3, off = 8 * (lane & 7);
#pragma unroll
            for (int i = 0; i < UF; i++)
              if (s + i < send) cp_async16(slots + slot * G * 256 + hl * UF * 64 + i * 64 + off, hs + hl * a.Is + 64 * (s + i) + off);
          }
        },
        [&](const Ch &c, int s, int slot) {
          const u16 *xb = slots + slot * G * 256 + (g & 1) * UF * 64 - s * 64;  // span s + i's columns at xb + 64(s + i)
          if (s + UF <= send) c.template compute<false>(xb, bs, s, send, t, accS);
          else c.template compute<true>(xb, bs, s, send, t, accS);
        });
  }
  if (t == 0) {
    const float post = MoeDec<DEC>::post();
    const float nan = __int_as_float(0x7fc00000);
    const float r0v = fmaf(accQ[0][1], 1.f / 2048.f, accQ[0][0]) * post + fmaf(accS[0][1], 1.f / 2048.f, accS[0][0]);
    const float r8v = fmaf(accQ[0][3], 1.f / 2048.f, accQ[0][2]) * post + fmaf(accS[0][3], 1.f / 2048.f, accS[0][2]);
    red[warp][g][0] = bad ? nan : r0v;
    red[warp][g][1] = bad ? nan : r8v;
  }
  __syncthreads();
  if (SP == 1) {
    if (threadIdx.x < 16) {
      const int i = threadIdx.x;
      float s = 0.f;
      for (int w = 0; w < NW; w++) s += red[w][i & 7][i >> 3];
      a.out[r0 + i] = s;
      if (HCE) ho[i] = s;
    }
    if (HCE) hc_epi_finish(a.hc, a.D, r0, ho, hfn, hxs, hpc);
    return;
  }
  // Split: this block's partials, then the group's last block sums them.
  if (threadIdx.x < 16) {
    const int i = threadIdx.x;
    float s = 0.f;
    for (int w = 0; w < NW; w++) s += red[w][i & 7][i >> 3];
    a.part[(long long)blockIdx.x * 16 + i] = s;
    __threadfence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    u32 *ticket = reinterpret_cast<u32 *>(a.part + (long long)gridDim.x * 16) + rg;
    const bool last = atomicAdd(ticket, 1u) == (u32)(SP - 1);
    if (last) atomicExch(ticket, 0u);  // every part has arrived: ready for the next run
    lastBlock = last;
  }
  __syncthreads();
  if (lastBlock && threadIdx.x < 16) {
    __threadfence();
    const int i = threadIdx.x;
    float s = 0.f;
#pragma unroll
    for (int p = 0; p < SP; p++) s += __ldcg(a.part + ((long long)rg * SP + p) * 16 + i);
    a.out[r0 + i] = s;
  }
}

// moe1l_d<DEC>_b<B>: stage 1 lean, 128 threads, B blocks an SM;
// moe2l_g<G>_f<UF>_d<DEC>_b<B>: stage 2 lean, 512 threads; moe1lp_...,
// moe2lp_...: with PFR (MOE1L defines both stage 1 kernels; MOE2L and
// MOE2LP one stage 2 kernel each, so that leanx's moe2l can sit in the
// default module without its moe2lp).
#define MOE1L(DEC, B) \
  extern "C" __global__ void __launch_bounds__(32 * LEAN1_WARPS, B) moe1l_d##DEC##_b##B(MoeArgs a) { MOXIE_PDL_PF(moe1_pf(a)); moe_stage1l<DEC, false>(a, (int)blockIdx.x); } \
  extern "C" __global__ void __launch_bounds__(32 * LEAN1_WARPS, B) moe1lp_d##DEC##_b##B(MoeArgs a) { MOXIE_PDL_PF(moe1_pf(a)); moe_stage1l<DEC, true>(a, (int)blockIdx.x); }
#define MOE2L(G, UF, DEC, B) \
  extern "C" __global__ void __launch_bounds__(32 * LEAN2_WARPS, B) moe2l_g##G##_f##UF##_d##DEC##_b##B(MoeArgs a) { MOXIE_PDL_PF(moe2_pf(a)); moe_stage2l<G, UF, DEC, false>(a); }
#define MOE2LP(G, UF, DEC, B) \
  extern "C" __global__ void __launch_bounds__(32 * LEAN2_WARPS, B) moe2lp_g##G##_f##UF##_d##DEC##_b##B(MoeArgs a) { MOXIE_PDL_PF(moe2_pf(a)); moe_stage2l<G, UF, DEC, true>(a); }

// moe2lh_g<G>_f<UF>_d<DEC>_b<B>: moe2l that also begins the sublayer
// boundary after the MoE (hc_epi_finish; HCEpilogue in moe.go).
#define MOE2LH(G, UF, DEC, B) \
  extern "C" __global__ void __launch_bounds__(32 * LEAN2_WARPS, B) moe2lh_g##G##_f##UF##_d##DEC##_b##B(MoeArgs a) { MOXIE_PDL_PF(moe2h_pf(a)); moe_stage2l<G, UF, DEC, false, LEAN2_WARPS, 1, false, true>(a); }

// moe2le_g<G>_f<UF>_d<DEC>_b<B>: moe2lp whose blocks read the expert ids and
// records, and ask L2 for every warp's routed and shared range, before they
// wait for stage 1 (MOXIE_PDL inside, before h is read or out written): the
// ids are the routing kernel's, two kernels back, visible once every block
// of stage 1 has let this kernel launch, some of them (the routed tiles)
// after waiting for the routing (the MOXIE_PDL_UNLESS rule of module.go).
#define MOE2LE(G, UF, DEC, B) \
  extern "C" __global__ void __launch_bounds__(32 * LEAN2_WARPS, B) moe2le_g##G##_f##UF##_d##DEC##_b##B(MoeArgs a) { MOXIE_PDL_INSIDE(); moe_stage2l<G, UF, DEC, true, LEAN2_WARPS, 1, true>(a); }

// moe2lw_g<G>_f<UF>_d<DEC>_b<B>: moe2l with EW (moe_stage2l): the expert
// ids and records, and each routed warp's first two chunks of weights,
// before the PDL wait (the ids as moe2le reads them); moe2lhw_...: the same
// with the boundary's epilogue (moe2lh).
#define MOE2LW(G, UF, DEC, B) \
  extern "C" __global__ void __launch_bounds__(32 * LEAN2_WARPS, B) moe2lw_g##G##_f##UF##_d##DEC##_b##B(MoeArgs a) { MOXIE_PDL_INSIDE(); MOXIE_PF(moe2_pf(a)); moe_stage2l<G, UF, DEC, false, LEAN2_WARPS, 1, false, false, true>(a); }
#define MOE2LHW(G, UF, DEC, B) \
  extern "C" __global__ void __launch_bounds__(32 * LEAN2_WARPS, B) moe2lhw_g##G##_f##UF##_d##DEC##_b##B(MoeArgs a) { MOXIE_PDL_INSIDE(); MOXIE_PF(moe2h_pf(a)); moe_stage2l<G, UF, DEC, false, LEAN2_WARPS, 1, false, true, true>(a); }

// moe2s_g<G>_f<UF>_d<DEC>_w<NW>_s<SP>_b<B>: split stage 2 (see the
// family's comment), NW warps a block, SP blocks a row group, B blocks an
// SM; moe2sp_...: with PFR. Grid: SP·D/16 blocks; a.part as MoeArgs says.
#define MOE2S(G, UF, DEC, NW, SP, B) \
  extern "C" __global__ void __launch_bounds__(32 * NW, B) moe2s_g##G##_f##UF##_d##DEC##_w##NW##_s##SP##_b##B(MoeArgs a) { MOXIE_PDL_PF(moe2s_pf<SP>(a)); moe_stage2l<G, UF, DEC, false, NW, SP>(a); } \
  extern "C" __global__ void __launch_bounds__(32 * NW, B) moe2sp_g##G##_f##UF##_d##DEC##_w##NW##_s##SP##_b##B(MoeArgs a) { MOXIE_PDL_PF(moe2s_pf<SP>(a)); moe_stage2l<G, UF, DEC, true, NW, SP>(a); }

// moe1lx_d<DEC>_b<B>: stage 1 lean whose shared-expert tiles (blocks
// [0, Is/16), block-uniform) do not wait for the previous kernel on the
// stream (MOXIE_PDL_UNLESS, module.go): they read x, the shared weights
// and scales, and write their own h rows and nothing the routing kernel
// before them touches, so they run while that kernel (gate + route) still
// does; x must have been written at least two kernels back. The routed
// tiles wait (they read the ids).
#define MOE1LX(DEC, B) \
  extern "C" __global__ void __launch_bounds__(32 * LEAN1_WARPS, B) moe1lx_d##DEC##_b##B(MoeArgs a) { MOXIE_PDL_UNLESS((int)blockIdx.x < (a.Is >> 4)); moe_stage1l<DEC, false>(a, (int)blockIdx.x); }

// moe1lxr_d<DEC>_b<B>: moe1lx whose routed warps load their first scale
// words into registers before they stage x, and store them after
// (moe_stage1l's SR: lean_stage_routed).
#define MOE1LXR(DEC, B) \
  extern "C" __global__ void __launch_bounds__(32 * LEAN1_WARPS, B) moe1lxr_d##DEC##_b##B(MoeArgs a) { MOXIE_PDL_UNLESS((int)blockIdx.x < (a.Is >> 4)); moe_stage1l<DEC, false, 1, true>(a, (int)blockIdx.x); }

// moe1lxh_d<DEC>_b<B>: moe1lx with the shared expert's tiles in two column
// halves (moe_stage1l's SH2; blocks [0, Is/8) skip the wait); a.part holds
// the halves' sums and tickets (sh1HalfBytes in moe.go).
#define MOE1LXH(DEC, B) \
  extern "C" __global__ void __launch_bounds__(32 * LEAN1_WARPS, B) moe1lxh_d##DEC##_b##B(MoeArgs a) { MOXIE_PDL_UNLESS((int)blockIdx.x < (a.Is >> 3)); moe_stage1l<DEC, false, 1, false, true>(a, (int)blockIdx.x); }

// moe1lx_g<NG>_d<DEC>_b<B>: moe1lx with NG routed groups (and NG FP8
// spans) a chunk: two chunks, 128·NG bytes a lane, in flight.
#define MOE1LXG(NG, DEC, B) \
  extern "C" __global__ void __launch_bounds__(32 * LEAN1_WARPS, B) moe1lx_g##NG##_d##DEC##_b##B(MoeArgs a) { MOXIE_PDL_UNLESS((int)blockIdx.x < (a.Is >> 4)); moe_stage1l<DEC, false, NG>(a, (int)blockIdx.x); }

// ---- One-token FP8-block products on the lean tiles (gemvm_*) ----
//
// y = W·x for the FP8-block products of a Gemv launch (GemvArgsM mirrors
// struct GemvArgs of kernels/gemv.cu and gemvArgs of gemv.go; only fmt 1
// products, 16-row tiles that never straddle a row group or a scale block,
// columns in 64-column spans inside one scale block: PrepareGemv checks),
// on LeanFp8's tensor-core arithmetic (the shared expert's in stage 1):
// a block of GEMVM_WARPS warps holds GEMVM_WARPS / wpr 16-row tiles, the
// wpr warps of a tile taking contiguous equal shares of its spans. A warp
// issues its first two chunks of weight loads (UF spans each, rows g and
// g+8, 16 bytes a lane a row) before it waits for the previous kernel
// (MOXIE_PDL: the weights are never written, x is), then stages its own
// columns of x as hi/lo f16 (lean_stage_x, natural layout) and walks its
// spans with two chunks in flight. A row's sum is d_hi + d_lo·2^-11 (lanes
// t = 0), the wpr warps' sums added in warp order through shared memory:
// the order is fixed, so results are reproducible. Dynamic shared memory:
// GEMVM_WARPS · 256·per bytes (per: the largest share, in spans).
#define GEMVM_WARPS 8

struct GemvMatM {
  const u8 *w;
  const u8 *s;
  const float *x;
  float *y;
  int rows, cols, rpg, bshift, sstride, fmt, wpr, blk0;
};
struct GemvArgsM {
  GemvMatM m[8];
  int n;
  const float *nw[8];  // non-null: product i's x is RMSNorm(x)·nw[i] (ε eps[i]) before the product
  float eps[8];
};
static_assert(sizeof(GemvArgsM) == 616, "GemvArgsM must mirror GemvArgs (616 bytes)");

// Stages v[c0, c0 + n) of a row of cols values (n a multiple of 8) as
// RMSNorm(v)·w, hi/lo, natural layout (lean_stage_x), computing the
// row's 1/RMS itself: Σv² over the row by the warp (float4 loads, lane
// order, then a butterfly: every lane, and every warp, gets the same
// bits), inv = rsqrt(Σ/cols + eps), each value (v·inv)·w as RMSNorm's
// kernel forms it. Then __syncwarp.
__device__ __forceinline__ void gemvm_stage_xn(const float *__restrict__ v, const float *__restrict__ w, float eps, int cols, u16 *xw, int c0, int n,
                                               int W) {
  const int lane = threadIdx.x & 31;
  const float4 *v4 = reinterpret_cast<const float4 *>(v);
  float ss = 0.f;
  for (int i = lane; i < cols / 4; i += 32) {
    const float4 p = __ldg(v4 + i);
    ss = fmaf(p.x, p.x, ss);
    ss = fmaf(p.y, p.y, ss);
    ss = fmaf(p.z, p.z, ss);
    ss = fmaf(p.w, p.w, ss);
  }
  ss = moe_warp_sum(ss);
  lean_stage_x(v, xw, c0, n, W, false, w, rsqrtf(ss / (float)cols + eps));
}

// HcCol is a sublayer boundary's output a = RMS(Σ_j pre_j·x'_j; w) that a
// one-token product (gemvmc_*) forms itself while it stages x, from x' and
// the partials a producer's epilogue left with the Gram rows (HcEpi.gram):
// row j < 4 pre's dot products, row nm the streams' Σx'², rows nm + 1 ..
// nm + 10 the Gram entries (hc_epi_finish's pair order), each S tiles.
struct HcCol {
  const float *xs;           // [4, D] x'
  const float *part;         // [nm + 11, S]
  const float *base, *scale; // the mix site's (base[0..4) and scale[0] are read)
  const float *w;            // [D] the RMSNorm weight, or null
  int S, nm, D, pad;
  float normEps, eps, rmsEps, pad2;  // the site's NormEps and Eps, the RMSNorm's ε
};
static_assert(sizeof(HcCol) == 72, "HcCol must mirror hcColArgs (72 bytes)");

// hcc_gates sums the 15 partial rows a block needs (a warp a row: lane l
// adds elements l, l + 32, … in order, then the xor tree: fuse_hc_finish4w's
// order, so pre and ρ are its bits) and returns, to every thread, the four
// pre gates (fuse_hc_finish4w's operations) and inv = 1/sqrt(Σa²/D + ε)
// with Σa² = Σ_jk pre_j·pre_k·G_jk (the Gram rows; not the finish's Σ over
// a's elements, so a differs from its a in the last bits). Every thread
// of the block calls it (one barrier); sums is [15] shared.
__device__ __forceinline__ void hcc_gates(const HcCol &c, float *sums, float (&p)[4], float &inv) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int r = warp; r < 15; r += nw) {
    const float *row = c.part + (long long)(r < 4 ? r : c.nm + r - 4) * c.S;
    float v = 0.f;
    for (int i = lane; i < c.S; i += 32) v += __ldcg(row + i);
    v = moe_warp_sum(v);
    if (lane == 0) sums[r] = v;
  }
  __syncthreads();
  const float rho = 1.0f / sqrtf(sums[4] / (float)(4 * c.D) + c.normEps);
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const float m = sums[j] * rho;
    p[j] = (float)(1.0 / (1.0 + exp(-(double)(m * c.scale[0] + c.base[j])))) + c.eps;
  }
  // G_jk at sums[5 + pair]: (0,0) (0,1) (0,2) (0,3) (1,1) (1,2) (1,3) (2,2) (2,3) (3,3).
  float ss = 0.f;
  int q = 5;
#pragma unroll
  for (int j = 0; j < 4; j++)
#pragma unroll
    for (int k = j; k < 4; k++, q++) ss = fmaf(j == k ? p[j] * p[j] : 2.f * p[j] * p[k], sums[q], ss);
  inv = 1.0f / sqrtf(ss / (float)c.D + c.rmsEps);
}

// hcc_stage_x is lean_stage_x (natural layout) of the boundary's a over
// columns [c0, c0 + n): each value Σ_j pre_j·x'_j (hcf4_collapse's fma
// order), then (v·inv)·w. Then __syncwarp.
__device__ __forceinline__ void hcc_stage_x(const HcCol &c, const float (&p)[4], float inv, u16 *xw, int c0, int n, int W) {
  const int lane = threadIdx.x & 31;
#pragma unroll 2
  for (int i = lane; i < n / 8; i += 32) {
    float4 a[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      float4 xj[4];
#pragma unroll
      for (int j = 0; j < 4; j++) xj[j] = __ldcg(reinterpret_cast<const float4 *>(c.xs + (long long)j * c.D + c0) + 2 * i + h);
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int j = 0; j < 4; j++) {
        v.x = __fmaf_rn(p[j], xj[j].x, v.x);
        v.y = __fmaf_rn(p[j], xj[j].y, v.y);
        v.z = __fmaf_rn(p[j], xj[j].z, v.z);
        v.w = __fmaf_rn(p[j], xj[j].w, v.w);
      }
      if (c.w) {
        const float4 wv = __ldg(reinterpret_cast<const float4 *>(c.w + c0) + 2 * i + h);
        v = make_float4(v.x * inv * wv.x, v.y * inv * wv.y, v.z * inv * wv.z, v.w * inv * wv.w);
      } else {
        v = make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
      }
      a[h] = v;
    }
    uint4 H, L;
    hilo8(a[0], a[1], false, H, L);
    *reinterpret_cast<uint4 *>(xw + 8 * i) = H;
    *reinterpret_cast<uint4 *>(xw + W + 8 * i) = L;
  }
  __syncwarp();
}

// The qat target's products (gemvq_*, dsv4-flash.md §3.2: act_quant and
// fp8_gemm): x quantized to E4M3 in blocks of 128 columns, each scaled by
// s = 2^ceil(log2(max(amax, 1e-4)/448)) (rounded to nearest even,
// saturating), y = Σ over 64-column spans of the weight block's scale
// times s times Σ q_w·q_x. The codes q_x are exact in f16, so the products
// run on LeanFp8's f16 tensor-core tiles with B one column of them (lanes g
// == 0) and the span's sums scaled by s too. (E4M3 mma.m16n8k32 is no
// faster on sm_90: ptxas lowers it to conversions and two HMMA.16816;
// session 22.)

// Stages columns [c0, c0 + n) of x (a row of cols values; c0, n and cols
// multiples of 64) for gemvq: the E4M3 codes as f16 values at xq[0..n),
// natural layout, and the scale of each 128-column block the columns touch
// at xs[b - c0/128].
// A block's amax is over all its columns, also those outside [c0, c0 + n),
// so every warp gets the same scale. The loads of up to four blocks are
// issued before their maxima are formed. Then __syncwarp.
__device__ __forceinline__ void gemvq_stage_x(const float *__restrict__ v, int cols, u16 *xq, float *xs, int c0, int n) {
  const int lane = threadIdx.x & 31, b1 = (c0 + n + 127) >> 7;
  for (int b0 = c0 >> 7; b0 < b1; b0 += 4) {
    float4 p[4];
    float am[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int c = ((b0 + j) << 7) + 4 * lane;
      p[j] = b0 + j < b1 && c < cols ? __ldg(reinterpret_cast<const float4 *>(v + c)) : make_float4(0.f, 0.f, 0.f, 0.f);
      am[j] = fmaxf(fmaxf(fabsf(p[j].x), fabsf(p[j].y)), fmaxf(fabsf(p[j].z), fabsf(p[j].w)));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
      for (int j = 0; j < 4; j++) am[j] = fmaxf(am[j], __shfl_xor_sync(0xffffffffu, am[j], o));
#pragma unroll
    for (int j = 0; j < 4; j++) {
      if (b0 + j >= b1) break;
      // The scale 2^e = 2^ceil(log2(amax/448)) of the float32 quotient, from
      // amax's bits (qat.ActScaleExp: above 2^(E-8) exactly when amax's
      // mantissa is above 1.75's).
      const u32 q = __float_as_uint(fmaxf(am[j], 1e-4f));
      const int e = (int)((q >> 23) & 0xffu) - 135 + ((q & 0x7fffffu) > 0x600000u);
      if (lane == 0) xs[b0 + j - (c0 >> 7)] = __int_as_float((u32)(127 + e) << 23);
      const int c = ((b0 + j) << 7) + 4 * lane;
      if (c >= c0 && c < c0 + n) {
        const u32 codes = q8x4(p[j], __int_as_float((u32)(127 - e) << 23));
        u32 *o = reinterpret_cast<u32 *>(xq + (c - c0));
        o[0] = e4m3x2_f16x2(codes & 0xffffu);
        o[1] = e4m3x2_f16x2(codes >> 16);
      }
    }
  }
  __syncwarp();
}

template <int UF, bool HCE = false, bool HCC = false, bool Q8 = false>
__device__ __forceinline__ void gemvm_body(const GemvMatM &m, int blk, const float *nw, float eps, const HcEpi *hc = nullptr,
                                           const HcCol *col = nullptr) {
  extern __shared__ uint4 moe_smem[];
  __shared__ float red[GEMVM_WARPS][16];
  __shared__ __align__(16) float hfn[HCE ? MOE_HC_NM * 64 : 4], hxs[HCE ? 64 : 4], hpc[HCE ? 20 : 4], ho[HCE ? 16 : 4];
  __shared__ float hsum[HCC ? 15 : 1];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int wpr = m.wpr, part = warp % wpr;
  const int r0 = (blk * (GEMVM_WARPS / wpr) + warp / wpr) * 16;
  const int per = (m.cols >> 6) / wpr, W = 64 * per;
  const int s0 = part * per, end = s0 + per;
  u16 *xw = reinterpret_cast<u16 *>(moe_smem) + warp * 2 * W;  // hi [W], lo [W]; Q8: the codes [W], then the block scales
  float *const xs = reinterpret_cast<float *>(xw + W);
  const bool live = r0 < m.rows;
  float acc[1][4] = {{0.f, 0.f, 0.f, 0.f}};
  if (live) {
    const float *xg = m.x + (long long)(r0 / m.rpg) * m.cols;
    const u8 *const pw[1] = {m.w + (long long)(r0 + g) * m.cols + 16 * t};
    const u8 *const ps[1] = {m.s + (long long)(r0 >> m.bshift) * m.sstride};
    const bool bl = Q8 ? g == 0 : g < 2;
    const u16 *xb = xw + (g & 1) * W - s0 * 64;  // column c's hi/lo at xb[c]
    const float *xsb = Q8 ? xs - (s0 >> 1) : nullptr;  // span s's block scale at xsb[s/2]
    using Ch = LeanFp8<1, UF>;
    wide_walk<Ch>(
        s0, end, UF, [&](Ch &c, int s) { c.template load<true>(pw, 8LL * m.cols, ps, m.bshift, s, end); },
        [&](const Ch &c, int s) { c.template compute<true>(xb, bl, s, end, t, acc, xsb); },
        [&] {
          if (HCC) {  // x' and the partials are two kernels back: no wait here (the kernel waits at its end)
            MOXIE_PDL_TRIGGER();
            float p[4], inv;
            hcc_gates(*col, hsum, p, inv);
            hcc_stage_x(*col, p, inv, xw, s0 * 64, W, W);
            return;
          }
          MOXIE_PDL();
          if (HCE) hc_epi_stage(*hc, m.rows, r0, hfn, hxs, hpc);
          if (Q8) gemvq_stage_x(xg, m.cols, xw, xs, s0 * 64, W);
          else if (nw) gemvm_stage_xn(xg, nw, eps, m.cols, xw, s0 * 64, W, W);
          else lean_stage_x(xg, xw, s0 * 64, W, W, false);
        });
  }
  // Column 0 is the sum (Q8), or columns 0 and 1 its hi and lo parts.
  const float y0 = Q8 ? acc[0][0] : fmaf(acc[0][1], 1.f / 2048.f, acc[0][0]), y1 = Q8 ? acc[0][2] : fmaf(acc[0][3], 1.f / 2048.f, acc[0][2]);
  if (wpr == 1) {  // grid-uniform for this matrix's blocks
    if (live && t == 0) {
      m.y[r0 + g] = y0;
      m.y[r0 + g + 8] = y1;
    }
    return;
  }
  if (t == 0) {
    red[warp][g] = y0;
    red[warp][g + 8] = y1;
  }
  __syncthreads();
  if (live && part == 0 && lane < 16) {
    float s = 0.f;
    for (int p = 0; p < wpr; p++) s += red[warp + p][lane];
    m.y[r0 + lane] = s;
    if (HCE) ho[lane] = s;
  }
  if (HCE) hc_epi_finish(*hc, m.rows, r0, ho, hfn, hxs, hpc);  // one tile a block (wpr GEMVM_WARPS), every row live
}

// The index of the product of a that this block works on (blocks
// [blk0, next blk0)).
__device__ __forceinline__ int gemvm_mat(const GemvArgsM &a) {
  int i = 0;
#pragma unroll
  for (int k = 1; k < 8; k++)
    if (k < a.n && (int)blockIdx.x >= a.m[k].blk0) i = k;
  return i;
}

// gemvm_f<UF>: UF spans a chunk (two chunks, 64·UF bytes a lane, in flight).
#define GEMVM(UF) \
  extern "C" __global__ void __launch_bounds__(32 * GEMVM_WARPS) gemvm_f##UF(const GemvArgsM a) { MOXIE_PDL_INSIDE(); const int i = gemvm_mat(a); gemvm_body<UF>(a.m[i], blockIdx.x - a.m[i].blk0, a.nw[i], a.eps[i]); }

// gemvmh_f<UF>: gemvm_f<UF> for one product whose 16-row tiles each take a
// whole block (wpr GEMVM_WARPS: every warp's r0 the block's) and whose
// output o = y [rows] begins the sublayer boundary h (hc_epi_finish; D =
// rows; HCEpilogue in moe.go).
#define GEMVMH(UF) \
  extern "C" __global__ void __launch_bounds__(32 * GEMVM_WARPS) gemvmh_f##UF(const GemvArgsM a, const HcEpi h) { MOXIE_PDL_INSIDE(); gemvm_body<UF, true>(a.m[0], blockIdx.x, a.nw[0], a.eps[0], &h); }

// gemvmc_f<UF>: gemvm_f<UF> whose x (every product's, one row group, one
// whole-block tile a block: every warp calls the staging) is a boundary's
// a formed in the launch (HcCol; hcc_gates, hcc_stage_x). Its inputs come
// from two or more kernels back, so its blocks do not wait for the kernel
// before them (the boundary's finish) until they end: what runs after
// this kernel may rely on that one's results.
#define GEMVMC(UF) \
  extern "C" __global__ void __launch_bounds__(32 * GEMVM_WARPS) gemvmc_f##UF(const GemvArgsM a, const HcCol c) { \
    MOXIE_PDL_INSIDE(); \
    const int i = gemvm_mat(a); \
    gemvm_body<UF, false, true>(a.m[i], blockIdx.x - a.m[i].blk0, nullptr, 0.f, nullptr, &c); \
    MOXIE_PDL_WAIT(); \
  }

// gemvq_f<UF>: gemvm_f<UF> for the qat target (x through act_quant in the
// launch, gemvq_stage_x); plain x only (no Norm).
#define GEMVQ(UF) \
  extern "C" __global__ void __launch_bounds__(32 * GEMVM_WARPS) gemvq_f##UF(const GemvArgsM a) { MOXIE_PDL_INSIDE(); const int i = gemvm_mat(a); gemvm_body<UF, false, false, true>(a.m[i], blockIdx.x - a.m[i].blk0, nullptr, 0.f); }

//@module moe
// The default module, compiled (or read from the disk cache) on first use:
// the kernels of MoEPreferred (MoELeanXW: moe1lx_d0_b7, moe2lw_g1_f1_d0_b2,
// and moe2lhw_g1_f1_d0_b2 that begins the next boundary; their names do not
// depend on the shapes) and the tensor-core Gemv kernels a decode session
// launches by default (gemvm_f4: $MOXIE_CUDA_GEMVM's default "a,q,wo,u4"
// in dsv4).
MOE1LX(0, 7) MOE2LW(1, 1, 0, 2) MOE2LHW(1, 1, 0, 2)
GEMVM(4) GEMVMH(4) GEMVMC(4)

//@module bench
// Every other variant's kernels, compiled only when a prepare asks for a
// kernel the default module lacks (moeKernels in compute/cuda/moe.go).
// u8, occ3, u8cvt; persist and persistpf (MOE1P defines both).
MOE1(8, 2, 0, 2) MOE2(8, 4, 0, 2)
MOE1(4, 1, 0, 3) MOE2(16, 4, 0, 3)
MOE1(8, 2, 1, 2) MOE2(8, 4, 1, 2)
MOE1P(8, 1, 0, 2)
// The wide family.
MOE1W(2, 2, 0, 2) MOE2W(4, 4, 0, 2)
MOE1W(1, 2, 0, 2) MOE2W(2, 4, 0, 2)
MOE1WPF(2, 2, 0, 2)
MOE1W(1, 1, 0, 3)
MOE1WS(1, 2, 0, 2) MOE2WS(2, 4, 0, 2)
MOE1WA(2, 0, 2)
MOE2WSP(2, 4, 0, 2)
MOE1WSP(1, 2, 0, 2)
MOE1WP(1, 1, 0, 2)
// The lean family but leanxw's kernels (leanx's stage 2, moe2l and moe2lh,
// the default until session 14, among them).
MOE1L(0, 7) MOE2LP(1, 1, 0, 2) MOE2L(2, 2, 0, 1) MOE2LP(2, 2, 0, 1)
MOE2L(1, 1, 0, 2) MOE2LH(1, 1, 0, 2)
MOE1LXR(0, 7) MOE1LXH(0, 7)
MOE2LE(1, 1, 0, 2)
MOE2S(2, 2, 0, 4, 3, 6)
// Not split (SP 1): 8-warp blocks, one a row group, each warp 16 units at
// V4 shapes (16 KB) with G units a chunk, two chunks in flight (G 4: 256
// bytes a lane, the tensor-core Gemv's best; G 2: 128), two blocks an SM
// (all 256 row groups resident at once on an H200).
MOE2S(4, 4, 0, 8, 1, 2) MOE2S(2, 2, 0, 8, 1, 2)
MOE1LXG(2, 0, 4) MOE1LXG(4, 0, 2)
// The other Gemv MMA chunks (GemvVariant{MMA: true} with U 1, or 0 or 2).
GEMVM(1) GEMVM(2)
GEMVQ(2) GEMVQ(4)
