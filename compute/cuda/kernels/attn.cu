// Prefill attention on tensor cores (module "attn", compiled on its own; no
// headers: NVRTC needs none).
//
// Same contract as fwd_attention / fwd_attention_hg in fwd.cu (AttentionRing):
// query i (absolute position t = pos[i]) of head h attends to
//   - the window positions max(0, t-window+1) .. t, ring slot p mod ring_rows;
//   - if comp != 0: n = (t+1)/ratio compressed entries comp [*, dim]: all of
//     them (idx == 0, HCA), or the first min(topk, n) indices of the row
//     idx[i*idx_stride ...] (CSA); a negative index is a padding entry and
//     is skipped (it gets probability 0);
// o = sum_j e^(s_j-M) k_j / (sum_j e^(s_j-M) + e^(sink_h-M)), s_j = scale q.k_j,
// K = V; the online softmax starts from the sink (m = sink, l = 1).
//
// Layout. One block per (query, group of AP_HB = 32 heads): grid
// (heads/32, T), 256 threads = 8 warps. The head dimension is cut into 8
// slices of DW = dim/8; warp w owns dims [w*DW, (w+1)*DW) of Q, K and O for
// all 32 heads:
//   - its Q slice lives in registers as mma A fragments (f16 hi and lo parts);
//   - keys stream in tiles of AP_KT = 32 (window first, then the compressed
//     entries); each warp copies only its dim slice of the tile into its own
//     shared-memory buffer (cp.async, the next tile's copy in flight while
//     the current one is used), so no block barrier guards the keys;
//   - S = Q K^T: each warp computes the partial scores of its dim slice
//     (32 heads x 32 keys, m16n8k16), the 8 partials meet in shared memory;
//   - the online softmax (8 threads per head, 4 keys each) writes P in f16
//     parts and the per-head rescale factor;
//   - O += P V: each warp updates its 32 x DW slice of O (registers) from P
//     and its own key buffer (V = K).
// Two variants: attn_prefill_d* (default; keys split into f16 parts once per
// tile, fragments read with ldmatrix) and attn_prefill_split_d* (keys kept
// f32, split at every fragment load). Both compute the same products.
//
// Precision. Every f32 operand x is split into f16 parts hi = f16(x) and
// lo = f16((x - hi) * 2^11) (x - hi is exact, the scaling keeps lo out of
// the f16 subnormals); products hi*hi + 2^-11 (hi*lo + lo*hi) give about 22
// significant bits, accumulated in f32 by the tensor cores. Scores use a main
// and a correction accumulator; P V uses one accumulator scaled by 2^11
// (P's hi part is stored pre-multiplied by 2^11, exact for P <= 1). Inputs
// must stay below the f16 range (|q|, |k| < 65504); both are RMS-normalised
// vectors in the model.
//@pdl
typedef unsigned int u32;
typedef unsigned short u16;

#define AP_HB 32   // heads per block
#define AP_KT 32   // keys per tile
#define AP_NW 8    // warps per block
#define AP_SS (AP_KT + 8)  // row stride of the partial-score and P buffers
#define AP_NINF __int_as_float(0xff800000)

struct APArgs {
  float *o;             // [T, heads, dim]
  const float *q;       // [T, heads, dim]
  const float *ring;    // [ring_rows, dim]
  const float *comp;    // [entries, dim] or 0
  const int *idx;       // [T, idx_stride] or 0
  const float *sinks;   // [heads]
  const int *pos;       // [T]
  int ring_rows, window, ratio, idx_stride, topk, heads, dim, pad;
  float scale;
};
static_assert(sizeof(APArgs) == 96, "APArgs must match attnPrefillArgs in attn.go");

__device__ __forceinline__ u32 ap_smem(const void *p) {
  u32 r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}

// 16 bytes from src to shared dst, or 16 zero bytes when !ok.
__device__ __forceinline__ void ap_cp16(void *dst, const void *src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(ap_smem(dst)), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void ap_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void ap_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ void ap_mma(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// f16x2 of (x, y): x in the low half.
__device__ __forceinline__ u32 ap_h2(float x, float y) {
  u32 h;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(y), "f"(x));
  return h;
}

__device__ __forceinline__ void ap_unh2(u32 h, float &x, float &y) {
  asm("{ .reg .b16 l, u; mov.b32 {l, u}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, u; }" : "=f"(x), "=f"(y) : "r"(h));
}

// Splits (x, y) into f16x2 parts: hi = f16(x, y), lo = f16((x, y) - hi) * 2^11.
__device__ __forceinline__ void ap_split(float x, float y, u32 &hi, u32 &lo) {
  hi = ap_h2(x, y);
  float hx, hy;
  ap_unh2(hi, hx, hy);
  lo = ap_h2((x - hx) * 2048.f, (y - hy) * 2048.f);
}

__device__ __forceinline__ u16 ap_h1(float x) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
}

__device__ __forceinline__ float ap_f1(u16 h) {
  float x;
  asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(h));
  return x;
}

// Key j of query i (0 <= j < nk: window first, then compressed entries), or
// 0 for a padding entry (negative index).
__device__ __forceinline__ const float *ap_key(const APArgs &a, int i, int j, int nw, int first) {
  if (j < nw) return a.ring + (long long)((first + j) % a.ring_rows) * a.dim;
  int e = j - nw;
  if (a.idx != 0) e = a.idx[(long long)i * a.idx_stride + e];
  return e < 0 ? (const float *)0 : a.comp + (long long)e * a.dim;
}

// Shared memory of attn_prefill_split_d<8*DW>, in bytes: key buffers [2][8][KT][DW+8]
// f32, partial scores [8][32][SS] f32, P parts [3][32][SS] f16, the rescale
// factors and final denominators [2][32] f32.
#define AP_SHARED_SPLIT(DW) (4 * 2 * AP_NW * AP_KT * ((DW) + 8) + 4 * AP_NW * AP_HB * AP_SS + 2 * 3 * AP_HB * AP_SS + 4 * 2 * AP_HB)

template <int DW>
__device__ __forceinline__ void ap_load_tile(const APArgs &a, float *kb, int i, int j0, int nk, int nw, int first, int d0, int lane) {
  constexpr int CPR = DW / 4;  // 16-byte chunks per key row of the slice
  constexpr int RPP = 32 / CPR;
  const int c = lane % CPR;
#pragma unroll
  for (int r = lane / CPR; r < AP_KT; r += RPP) {
    const int j = j0 + r;
    const float *k = j < nk ? ap_key(a, i, j, nw, first) : (const float *)0;
    ap_cp16(kb + r * (DW + 8) + 4 * c, k != 0 ? k + d0 + 4 * c : a.ring, k != 0);
  }
}

// Variant "split" (attn_prefill_split_d*): each warp's keys stay f32 in
// its two-stage buffer and are split into f16 parts at every fragment load
// (once for the scores, once for P V; P stored in a permuted key order so
// that the V reads are conflict-free).
template <int DW>
__device__ __forceinline__ void ap_body_split(const APArgs &a) {
  constexpr int KS = DW + 8;   // key buffer row stride (floats)
  constexpr int NK = DW / 16;  // k-steps of the score product per warp
  constexpr int NN = DW / 8;   // n-tiles of the output slice per warp
  extern __shared__ __align__(16) float ap_sm[];
  float *kbuf = ap_sm;                                  // [2][8][KT][KS]
  float *sp = kbuf + 2 * AP_NW * AP_KT * KS;            // [8][32][SS]
  u16 *ph = (u16 *)(sp + AP_NW * AP_HB * AP_SS);        // [3][32][SS]: hi*2^11, hi, lo
  float *alpha = (float *)(ph + 3 * AP_HB * AP_SS);     // [32]
  float *lfin = alpha + AP_HB;                          // [32]

  const int h0 = blockIdx.x * AP_HB, i = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t4 = lane & 3;
  const int t = a.pos[i];
  const int nw = min(t + 1, a.window);
  int nc = 0;
  if (a.comp != 0) {
    nc = (t + 1) / a.ratio;
    if (a.idx != 0) nc = min(nc, a.topk);
  }
  const int nk = nw + nc;
  const int first = t - nw + 1;
  const int d0 = w * DW;
  const int ntiles = (nk + AP_KT - 1) / AP_KT;

  ap_load_tile<DW>(a, kbuf + w * AP_KT * KS, i, 0, nk, nw, first, d0, lane);
  ap_commit();

  // Q fragments of this warp's dim slice: [m-tile][k-step][a0..a3].
  u32 qh[2][NK][4], ql[2][NK][4];
  {
    const float *qb = a.q + ((long long)i * a.heads + h0) * a.dim + d0;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
      for (int ks = 0; ks < NK; ks++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
          const int row = 16 * mt + g + 8 * (r & 1), col = 16 * ks + 2 * t4 + 8 * (r >> 1);
          const float2 v = *(const float2 *)(qb + (long long)row * a.dim + col);
          ap_split(v.x, v.y, qh[mt][ks][r], ql[mt][ks][r]);
        }
  }

  float o[2][NN][4];
#pragma unroll
  for (int mt = 0; mt < 2; mt++)
#pragma unroll
    for (int nt = 0; nt < NN; nt++)
#pragma unroll
      for (int r = 0; r < 4; r++) o[mt][nt][r] = 0.f;

  // Softmax state: thread tid serves head sh = tid / 8, keys 4*(tid % 8) .. +3
  // of each tile; the 8 threads of a head keep identical copies.
  const int sh = tid >> 3, sq = tid & 7;
  float mrun = a.sinks[h0 + sh], lrun = 1.f;
  const float scale = a.scale;

  for (int it = 0; it < ntiles; it++) {
    const int j0 = it * AP_KT;
    float *kw = kbuf + ((it & 1) * AP_NW + w) * AP_KT * KS;
    if (it + 1 < ntiles) {
      __syncwarp();  // every lane is done with the buffer the next tile overwrites
      ap_load_tile<DW>(a, kbuf + (((it + 1) & 1) * AP_NW + w) * AP_KT * KS, i, j0 + AP_KT, nk, nw, first, d0, lane);
      ap_commit();
      ap_wait<1>();
    } else {
      ap_wait<0>();
    }
    __syncwarp();  // the tile's copies by every lane are visible

    // Partial scores of this dim slice: 32 heads x 32 keys.
    float *spw = sp + w * AP_HB * AP_SS;
#pragma unroll
    for (int nt = 0; nt < AP_KT / 8; nt++) {
      float sm[2][4], sc[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int r = 0; r < 4; r++) sm[mt][r] = sc[mt][r] = 0.f;
#pragma unroll
      for (int ks = 0; ks < NK; ks++) {
        const float *kr = kw + (8 * nt + g) * KS + 16 * ks + 2 * t4;
        const float2 x0 = *(const float2 *)kr, x1 = *(const float2 *)(kr + 8);
        u32 bh0, bl0, bh1, bl1;
        ap_split(x0.x, x0.y, bh0, bl0);
        ap_split(x1.x, x1.y, bh1, bl1);
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
          ap_mma(sm[mt], qh[mt][ks][0], qh[mt][ks][1], qh[mt][ks][2], qh[mt][ks][3], bh0, bh1);
          ap_mma(sc[mt], qh[mt][ks][0], qh[mt][ks][1], qh[mt][ks][2], qh[mt][ks][3], bl0, bl1);
          ap_mma(sc[mt], ql[mt][ks][0], ql[mt][ks][1], ql[mt][ks][2], ql[mt][ks][3], bh0, bh1);
        }
      }
#pragma unroll
      for (int mt = 0; mt < 2; mt++) {
        float *s0 = spw + (16 * mt + g) * AP_SS + 8 * nt + 2 * t4;
        *(float2 *)s0 = make_float2(fmaf(sc[mt][0], 1.f / 2048.f, sm[mt][0]), fmaf(sc[mt][1], 1.f / 2048.f, sm[mt][1]));
        *(float2 *)(s0 + 8 * AP_SS) = make_float2(fmaf(sc[mt][2], 1.f / 2048.f, sm[mt][2]), fmaf(sc[mt][3], 1.f / 2048.f, sm[mt][3]));
      }
    }
    __syncthreads();  // all partial scores written; the previous tile's P and alpha consumed

    // Online softmax over the tile: head sh, keys 4*sq .. 4*sq+3.
    {
      float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int ww = 0; ww < AP_NW; ww++) {
        const float4 v = *(const float4 *)(sp + (ww * AP_HB + sh) * AP_SS + 4 * sq);
        s[0] += v.x;
        s[1] += v.y;
        s[2] += v.z;
        s[3] += v.w;
      }
      float mx = AP_NINF;
#pragma unroll
      for (int u = 0; u < 4; u++) {
        const int j = j0 + 4 * sq + u;
        bool ok = j < nk;
        if (ok && j >= nw && a.idx != 0) ok = a.idx[(long long)i * a.idx_stride + (j - nw)] >= 0;
        s[u] = ok ? s[u] * scale : AP_NINF;
        mx = fmaxf(mx, s[u]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      const float mnew = fmaxf(mrun, mx);
      const float al = mnew == AP_NINF ? 1.f : expf(mrun - mnew);
      float sum = 0.f;
#pragma unroll
      for (int u = 0; u < 4; u++) {
        const float p = s[u] == AP_NINF ? 0.f : expf(s[u] - mnew);
        sum += p;
        // P is stored in the mma k order: key r of a 16-key half sits at
        // position 2*(r&3) + (r>>2 & 1) (+8 for r >= 8), so that a lane's B
        // fragment of V reads keys t, t+4, t+8, t+12 (conflict-free rows).
        const int kk = 4 * sq + u, r = kk & 15;
        const int pp = (kk & 16) + (r & 8) + 2 * (r & 3) + ((r >> 2) & 1);
        const u16 hi = ap_h1(p);
        const float hf = ap_f1(hi);
        ph[sh * AP_SS + pp] = ap_h1(hf * 2048.f);
        ph[(AP_HB + sh) * AP_SS + pp] = hi;
        ph[(2 * AP_HB + sh) * AP_SS + pp] = ap_h1((p - hf) * 2048.f);
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      sum += __shfl_xor_sync(0xffffffffu, sum, 4);
      lrun = lrun * al + sum;
      mrun = mnew;
      if (sq == 0) alpha[sh] = al;
    }
    __syncthreads();  // P and alpha written

    // O slice (scaled by 2^11) = O * alpha + P V.
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
      const float a0 = alpha[16 * mt + g], a1 = alpha[16 * mt + g + 8];
#pragma unroll
      for (int nt = 0; nt < NN; nt++) {
        o[mt][nt][0] *= a0;
        o[mt][nt][1] *= a0;
        o[mt][nt][2] *= a1;
        o[mt][nt][3] *= a1;
      }
    }
    const u32 *pw = (const u32 *)ph;
#pragma unroll
    for (int ks = 0; ks < AP_KT / 16; ks++) {
      u32 pa[3][2][4];
#pragma unroll
      for (int v = 0; v < 3; v++)
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
          for (int r = 0; r < 4; r++)
            pa[v][mt][r] = pw[((v * AP_HB + 16 * mt + g + 8 * (r & 1)) * AP_SS + 16 * ks + 2 * t4 + 8 * (r >> 1)) / 2];
      const float *kr = kw + (16 * ks + t4) * KS + g;
#pragma unroll
      for (int nt = 0; nt < NN; nt++) {
        const float *kc = kr + 8 * nt;
        u32 bh0, bl0, bh1, bl1;
        ap_split(kc[0], kc[4 * KS], bh0, bl0);
        ap_split(kc[8 * KS], kc[12 * KS], bh1, bl1);
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
          ap_mma(o[mt][nt], pa[0][mt][0], pa[0][mt][1], pa[0][mt][2], pa[0][mt][3], bh0, bh1);
          ap_mma(o[mt][nt], pa[1][mt][0], pa[1][mt][1], pa[1][mt][2], pa[1][mt][3], bl0, bl1);
          ap_mma(o[mt][nt], pa[2][mt][0], pa[2][mt][1], pa[2][mt][2], pa[2][mt][3], bh0, bh1);
        }
      }
    }
  }

  if (sq == 0) lfin[sh] = lrun;
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < 2; mt++) {
    const float l0 = lfin[16 * mt + g] * 2048.f, l1 = lfin[16 * mt + g + 8] * 2048.f;
    float *ob = a.o + ((long long)i * a.heads + h0 + 16 * mt + g) * a.dim + d0 + 2 * t4;
#pragma unroll
    for (int nt = 0; nt < NN; nt++) {
      *(float2 *)(ob + 8 * nt) = make_float2(o[mt][nt][0] / l0, o[mt][nt][1] / l0);
      *(float2 *)(ob + 8 * a.dim + 8 * nt) = make_float2(o[mt][nt][2] / l1, o[mt][nt][3] / l1);
    }
  }
}

extern "C" __global__ void __launch_bounds__(256, 1) attn_prefill_split_d128(APArgs a) { MOXIE_PDL(); ap_body_split<16>(a); }
extern "C" __global__ void __launch_bounds__(256, 1) attn_prefill_split_d256(APArgs a) { MOXIE_PDL(); ap_body_split<32>(a); }
extern "C" __global__ void __launch_bounds__(256, 1) attn_prefill_split_d512(APArgs a) { MOXIE_PDL(); ap_body_split<64>(a); }

// ---------------------------------------------------------------------------
// Default variant (attn_prefill_d*): each warp's f32 key slice lands in a
// one-stage staging buffer (cp.async), is split once per tile into f16 hi
// and lo copies, and the next tile's copy starts at once; the mma fragments
// are read with ldmatrix (scores: K rows as B; P V: V through .trans), P is
// stored in natural key order.
__device__ __forceinline__ void ap_ldsm_x2(u32 &r0, u32 &r1, const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(ap_smem(p)) : "memory");
}
__device__ __forceinline__ void ap_ldsm_x4(u32 &r0, u32 &r1, u32 &r2, u32 &r3, const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];" : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(ap_smem(p)) : "memory");
}
__device__ __forceinline__ void ap_ldsm_x4t(u32 &r0, u32 &r1, u32 &r2, u32 &r3, const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];" : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(ap_smem(p)) : "memory");
}

// Shared memory of attn_prefill_d<8*DW>, in bytes: staging [8][KT][DW] f32,
// key parts [2][8][KT][DW+8] f16 (hi, lo), partial scores [8][32][SS] f32,
// P parts [3][32][SS] f16, the rescale factors and final denominators [2][32].
#define AP_SHARED(DW) (4 * AP_NW * AP_KT * (DW) + 2 * 2 * AP_NW * AP_KT * ((DW) + 8) + 4 * AP_NW * AP_HB * AP_SS + 2 * 3 * AP_HB * AP_SS + 4 * 2 * AP_HB)

template <int DW>
__device__ __forceinline__ void ap_body(const APArgs &a) {
  constexpr int KH = DW + 8;   // row stride of the f16 key parts (halves)
  constexpr int NK = DW / 16;  // k-steps of the score product per warp
  constexpr int NN = DW / 8;   // n-tiles of the output slice per warp
  constexpr int CPR = DW / 4;  // 16-byte staging chunks per key row
  constexpr int RPP = 32 / CPR;
  extern __shared__ __align__(16) float ap_sm[];
  float *stage = ap_sm;                                       // [8][KT][DW]
  u16 *khi = (u16 *)(stage + AP_NW * AP_KT * DW);             // [8][KT][KH]
  u16 *klo = khi + AP_NW * AP_KT * KH;                        // [8][KT][KH]
  float *sp = (float *)(klo + AP_NW * AP_KT * KH);            // [8][32][SS]
  u16 *ph = (u16 *)(sp + AP_NW * AP_HB * AP_SS);              // [3][32][SS]: hi*2^11, hi, lo
  float *alpha = (float *)(ph + 3 * AP_HB * AP_SS);           // [32]
  float *lfin = alpha + AP_HB;                                // [32]

  const int h0 = blockIdx.x * AP_HB, i = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t4 = lane & 3;
  const int t = a.pos[i];
  const int nw = min(t + 1, a.window);
  int nc = 0;
  if (a.comp != 0) {
    nc = (t + 1) / a.ratio;
    if (a.idx != 0) nc = min(nc, a.topk);
  }
  const int nk = nw + nc;
  const int first = t - nw + 1;
  const int d0 = w * DW;
  const int ntiles = (nk + AP_KT - 1) / AP_KT;
  float *stw = stage + w * AP_KT * DW;
  u16 *khw = khi + w * AP_KT * KH, *klw = klo + w * AP_KT * KH;

  // Each lane copies (and later splits) the same chunks of every tile:
  // chunk c of rows lane/CPR + k*RPP.
  // Lane l finds key j0 + l: code = its ring slot (found without a
  // division: slot0 is the first window position's slot and slot0 + j <
  // 2 ring_rows), -2 - e for compressed entry e, or -1 if absent (past nk or
  // a padding entry). The codes are shuffled to the lanes that copy each
  // row, and the ballot of the present keys is returned.
  const int slot0 = first % a.ring_rows;
  auto load = [&](int j0) -> u32 {
    const int jl = j0 + lane;
    int code = -1;
    if (jl < nw) {
      const int sl = slot0 + jl;
      code = sl < a.ring_rows ? sl : sl - a.ring_rows;
    } else if (jl < nk) {
      int e = jl - nw;
      if (a.idx != 0) e = a.idx[(long long)i * a.idx_stride + e];
      if (e >= 0) code = -2 - e;
    }
    const int c = lane % CPR;
#pragma unroll
    for (int r = lane / CPR; r < AP_KT; r += RPP) {
      const int cr = __shfl_sync(0xffffffffu, code, r);
      const float *k = cr >= 0 ? a.ring + (long long)cr * a.dim : a.comp + (long long)(-2 - cr) * a.dim;
      ap_cp16(stw + r * DW + 4 * c, cr != -1 ? k + d0 + 4 * c : a.ring, cr != -1);
    }
    ap_commit();
    return __ballot_sync(0xffffffffu, code != -1);
  };
  u32 vnext = load(0);

  u32 qh[2][NK][4], ql[2][NK][4];
  {
    const float *qb = a.q + ((long long)i * a.heads + h0) * a.dim + d0;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
      for (int ks = 0; ks < NK; ks++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
          const int row = 16 * mt + g + 8 * (r & 1), col = 16 * ks + 2 * t4 + 8 * (r >> 1);
          const float2 v = *(const float2 *)(qb + (long long)row * a.dim + col);
          ap_split(v.x, v.y, qh[mt][ks][r], ql[mt][ks][r]);
        }
  }

  float o[2][NN][4];
#pragma unroll
  for (int mt = 0; mt < 2; mt++)
#pragma unroll
    for (int nt = 0; nt < NN; nt++)
#pragma unroll
      for (int r = 0; r < 4; r++) o[mt][nt][r] = 0.f;

  const int sh = tid >> 3, sq = tid & 7;
  float mrun = a.sinks[h0 + sh], lrun = 1.f;
  const float scale = a.scale;
  // ldmatrix row addresses (lane l gives row l & 7 of matrix l >> 3).
  const int lr = lane & 7, lm = lane >> 3;

  for (int it = 0; it < ntiles; it++) {
    const int j0 = it * AP_KT;
    ap_wait<0>();  // this lane's chunks of the tile have landed
    {
      const int c = lane % CPR;
#pragma unroll
      for (int r = lane / CPR; r < AP_KT; r += RPP) {
        const float4 v = *(const float4 *)(stw + r * DW + 4 * c);
        u32 h0p, l0p, h1p, l1p;
        ap_split(v.x, v.y, h0p, l0p);
        ap_split(v.z, v.w, h1p, l1p);
        *(uint2 *)(khw + r * KH + 4 * c) = make_uint2(h0p, h1p);
        *(uint2 *)(klw + r * KH + 4 * c) = make_uint2(l0p, l1p);
      }
    }
    const u32 valid = vnext;                        // bit u: key j0 + u is present
    if (it + 1 < ntiles) vnext = load(j0 + AP_KT);  // the staging chunks are this lane's own
    __syncwarp();                           // every lane's key parts are visible

    // Partial scores of this dim slice: 32 heads x 32 keys.
    float *spw = sp + w * AP_HB * AP_SS;
#pragma unroll
    for (int nt = 0; nt < AP_KT / 8; nt++) {
      float sm[2][4], sc[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int r = 0; r < 4; r++) sm[mt][r] = sc[mt][r] = 0.f;
#pragma unroll
      for (int ks = 0; ks < NK; ks++) {
        // B = K rows 8nt.. as [key][dim]: matrices dims 16ks and 16ks+8.
        const int off = (8 * nt + lr) * KH + 16 * ks + 8 * (lm & 1);
        u32 bh0, bh1, bl0, bl1;
        ap_ldsm_x2(bh0, bh1, khw + off);
        ap_ldsm_x2(bl0, bl1, klw + off);
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
          ap_mma(sm[mt], qh[mt][ks][0], qh[mt][ks][1], qh[mt][ks][2], qh[mt][ks][3], bh0, bh1);
          ap_mma(sc[mt], qh[mt][ks][0], qh[mt][ks][1], qh[mt][ks][2], qh[mt][ks][3], bl0, bl1);
          ap_mma(sc[mt], ql[mt][ks][0], ql[mt][ks][1], ql[mt][ks][2], ql[mt][ks][3], bh0, bh1);
        }
      }
#pragma unroll
      for (int mt = 0; mt < 2; mt++) {
        float *s0 = spw + (16 * mt + g) * AP_SS + 8 * nt + 2 * t4;
        *(float2 *)s0 = make_float2(fmaf(sc[mt][0], 1.f / 2048.f, sm[mt][0]), fmaf(sc[mt][1], 1.f / 2048.f, sm[mt][1]));
        *(float2 *)(s0 + 8 * AP_SS) = make_float2(fmaf(sc[mt][2], 1.f / 2048.f, sm[mt][2]), fmaf(sc[mt][3], 1.f / 2048.f, sm[mt][3]));
      }
    }
    __syncthreads();  // all partial scores written; the previous tile's P and alpha consumed

    // Online softmax over the tile: head sh, keys 4*sq .. 4*sq+3.
    {
      float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int ww = 0; ww < AP_NW; ww++) {
        const float4 v = *(const float4 *)(sp + (ww * AP_HB + sh) * AP_SS + 4 * sq);
        s[0] += v.x;
        s[1] += v.y;
        s[2] += v.z;
        s[3] += v.w;
      }
      float mx = AP_NINF;
#pragma unroll
      for (int u = 0; u < 4; u++) {
        s[u] = (valid >> (4 * sq + u)) & 1u ? s[u] * scale : AP_NINF;
        mx = fmaxf(mx, s[u]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      const float mnew = fmaxf(mrun, mx);
      const float al = mnew == AP_NINF ? 1.f : expf(mrun - mnew);
      float p[4], sum = 0.f;
#pragma unroll
      for (int u = 0; u < 4; u++) {
        p[u] = s[u] == AP_NINF ? 0.f : expf(s[u] - mnew);
        sum += p[u];
      }
      u32 hs[2], hh[2], hl[2];
#pragma unroll
      for (int v = 0; v < 2; v++) {
        ap_split(p[2 * v], p[2 * v + 1], hh[v], hl[v]);
        float hx, hy;
        ap_unh2(hh[v], hx, hy);
        hs[v] = ap_h2(hx * 2048.f, hy * 2048.f);
      }
      u16 *pr = ph + sh * AP_SS + 4 * sq;
      *(uint2 *)pr = make_uint2(hs[0], hs[1]);
      *(uint2 *)(pr + AP_HB * AP_SS) = make_uint2(hh[0], hh[1]);
      *(uint2 *)(pr + 2 * AP_HB * AP_SS) = make_uint2(hl[0], hl[1]);
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      sum += __shfl_xor_sync(0xffffffffu, sum, 4);
      lrun = lrun * al + sum;
      mrun = mnew;
      if (sq == 0) alpha[sh] = al;
    }
    __syncthreads();  // P and alpha written

    // O slice (scaled by 2^11) = O * alpha + P V.
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
      const float a0 = alpha[16 * mt + g], a1 = alpha[16 * mt + g + 8];
#pragma unroll
      for (int nt = 0; nt < NN; nt++) {
        o[mt][nt][0] *= a0;
        o[mt][nt][1] *= a0;
        o[mt][nt][2] *= a1;
        o[mt][nt][3] *= a1;
      }
    }
#pragma unroll
    for (int ks = 0; ks < AP_KT / 16; ks++) {
      // A = P rows 16mt.., keys 16ks..: matrices (rows +0/+8) x (keys +0/+8).
      u32 pa[3][2][4];
#pragma unroll
      for (int v = 0; v < 3; v++)
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
          ap_ldsm_x4(pa[v][mt][0], pa[v][mt][1], pa[v][mt][2], pa[v][mt][3],
                     ph + (v * AP_HB + 16 * mt + lr + 8 * (lm & 1)) * AP_SS + 16 * ks + 8 * (lm >> 1));
#pragma unroll
      for (int nt = 0; nt < NN; nt += 2) {
        // B = V (keys 16ks.. x dims 8nt..) through .trans: matrices
        // (keys +0/+8) x (n-tiles nt, nt+1).
        const int off = (16 * ks + lr + 8 * (lm & 1)) * KH + 8 * (nt + (lm >> 1));
        u32 bh[4], bl[4];
        ap_ldsm_x4t(bh[0], bh[1], bh[2], bh[3], khw + off);
        ap_ldsm_x4t(bl[0], bl[1], bl[2], bl[3], klw + off);
#pragma unroll
        for (int n2 = 0; n2 < 2; n2++)
#pragma unroll
          for (int mt = 0; mt < 2; mt++) {
            ap_mma(o[mt][nt + n2], pa[0][mt][0], pa[0][mt][1], pa[0][mt][2], pa[0][mt][3], bh[2 * n2], bh[2 * n2 + 1]);
            ap_mma(o[mt][nt + n2], pa[1][mt][0], pa[1][mt][1], pa[1][mt][2], pa[1][mt][3], bl[2 * n2], bl[2 * n2 + 1]);
            ap_mma(o[mt][nt + n2], pa[2][mt][0], pa[2][mt][1], pa[2][mt][2], pa[2][mt][3], bh[2 * n2], bh[2 * n2 + 1]);
          }
      }
    }
    __syncwarp();  // every lane is done with the key parts before the next split
  }

  if (sq == 0) lfin[sh] = lrun;
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < 2; mt++) {
    const float l0 = lfin[16 * mt + g] * 2048.f, l1 = lfin[16 * mt + g + 8] * 2048.f;
    float *ob = a.o + ((long long)i * a.heads + h0 + 16 * mt + g) * a.dim + d0 + 2 * t4;
#pragma unroll
    for (int nt = 0; nt < NN; nt++) {
      *(float2 *)(ob + 8 * nt) = make_float2(o[mt][nt][0] / l0, o[mt][nt][1] / l0);
      *(float2 *)(ob + 8 * a.dim + 8 * nt) = make_float2(o[mt][nt][2] / l1, o[mt][nt][3] / l1);
    }
  }
}

extern "C" __global__ void __launch_bounds__(256, 1) attn_prefill_d128(APArgs a) { MOXIE_PDL(); ap_body<16>(a); }
extern "C" __global__ void __launch_bounds__(256, 1) attn_prefill_d256(APArgs a) { MOXIE_PDL(); ap_body<32>(a); }
extern "C" __global__ void __launch_bounds__(256, 1) attn_prefill_d512(APArgs a) { MOXIE_PDL(); ap_body<64>(a); }
