// Decode attention (flash-decoding): the attention of AttentionRing
// (kernels/fwd.cu fwd_attention) for a few queries, split over the keys so
// that one query's work fills the device. Two kernels:
//
//   attndec_<variant>_d<D> (grid (heads/G, splits, T), 256 threads): block
//     (hg, s, i) takes heads h0 = hg*G .. h0+G-1 of query i and the s-th
//     chunk of that query's key list. The chunk streams through shared
//     memory in tiles of KT keys; per tile the block computes the G x KT
//     scores, updates each head's running max m and sum l (online softmax,
//     no sink) and accumulates the unnormalised P.V for its G heads. It
//     writes m, l and the partial output to the scratch buffer.
//   attndec_combine (grid (heads, T), D/4 x SP threads): merges the splits
//     of one (head, query) in a fixed order with the sink:
//     M = max(sink, m_s), o = sum_s e^(m_s-M) O_s / (sum_s e^(m_s-M) l_s + e^(sink-M)).
//     With rope_nf > 0 it then applies the inverse rotary embedding to the
//     last 2*rope_nf dims of o, as ops.cu's rope kernel (inverse mode) does
//     to a stored o: pair k (dims D-2*rope_nf+2k, +1) is rotated by the angle
//     -(float(pos[i]) * rope_freq[k]) (the product rounded to float32, its
//     sine and cosine in double, rounded to float, the rotation in float32
//     with the same expressions), so the results are those of the two-kernel
//     chain. A float4 column holds whole pairs (D - 2*rope_nf is even).
//
// The key list of query i (t = pos[i]) is AttentionRing's: the window
// positions max(0, t-window+1)..t from ring slot p mod ring_rows, then, if
// comp != 0, the compressed entries w < (t+1)/ratio (all, idx == 0) or the
// first min(topk, (t+1)/ratio) entries of idx's row i; at most max_keys keys.
// A negative idx entry is padding and is skipped. Positions are read on the
// device; the grid depends only on max_keys (graph-capturable). The chunk
// length is ceil(nk / (splits*KT)) tiles, so splits past the keys are empty
// (m = -inf, l = 0, partial output not written and not read); a split of
// padding entries only writes m = -inf, l = 0 and a zero output.
//
// Scratch (float32): O partials [T][splits][heads][D], then m,l
// [T][splits][heads][2]. All math is float32 (expf, fmaf); every sum runs in
// a fixed order, so results are deterministic. No headers: NVRTC needs none.
//@pdl

struct ADArgs {
  float *o;            // [T, heads, dim]
  const float *q;      // [T, heads, dim]
  const float *ring;   // [ring_rows, dim]
  const float *comp;   // [entries, dim] or 0
  const int *idx;      // [T, idx_stride] or 0
  const float *sinks;  // [heads]
  const int *pos;      // [T]
  float *part;         // scratch, see above
  int ring_rows, window, ratio, idx_stride, topk, heads, dim, max_keys;
  int splits, nq;
  int kt;       // the partial kernel's KT (read by the combine kernel)
  int rope_nf;  // > 0: the combine rotates the last 2*rope_nf dims of each head back (see below)
  float scale, pad2;
  const float *rope_freq;  // [rope_nf] when rope_nf > 0
  int qprep;               // AD_QNORM | AD_QROPE: the partial kernel prepares q as it stages it (below)
  float qeps;              // the RMS norm's epsilon with AD_QNORM
  int early;               // AD_EARLY_KEYS | AD_EARLY_COMP: the caller's promises (below)
  int pad3;
};
static_assert(sizeof(ADArgs) == 144, "ADArgs must match attnDecArgs in attndec.go");

// early: the caller promises that pos and the window ring (AD_EARLY_KEYS),
// and the compressed entries (AD_EARLY_COMP), were written two or more
// launches back on the stream, or before a dependency that is not
// programmatic: the partial kernel then reads the position and copies its
// first tile's keys, where they are all ring rows (or, with AD_EARLY_COMP
// and no idx, entries), before it waits for the launch before it
// (MOXIE_PDL_UNLESS's contract: that launch's blocks have all passed their
// own wait when this one starts, so everything before it has finished).
// q and idx are read after the wait. Results do not depend on it.
#define AD_EARLY_KEYS 1
#define AD_EARLY_COMP 2

// qprep: the partial kernel stages q[i, h] prepared as the row ops kernel
// (fuse.cu fuse_rows) prepares it, instead of as stored: AD_QNORM divides
// each head's row by its RMS (1/sqrtf(Σv²/D + qeps), no weight; Σv² summed
// per float4, then the warp's tree, then the head's warps in order: another
// order than fuse_rows', so the products may differ in the last bits),
// AD_QROPE then rotates the last 2·rope_nf dims forward by the angle
// float(pos[i])·rope_freq[k] (fuse_rows' float32 and float64 operations).
// q itself is not written.
#define AD_QNORM 1
#define AD_QROPE 2

#define AD_NT 256      // threads of the partial kernel
#define AD_NW 8        // its warps
#define AD_MAXS 1024   // most splits the combine kernel takes
#define AD_NINF __int_as_float(0xff800000)

__device__ __forceinline__ float ad_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float ad_warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

#ifndef AD_EMULATE
// ad_cp16 copies 16 bytes from global src to shared dst asynchronously, or
// zero-fills dst when !ok (src is then not read); ad_cp_commit closes the
// thread's group of copies; ad_cp_wait<N> waits until at most N groups are
// pending.
__device__ __forceinline__ void ad_cp16(void *dst, const void *src, bool ok) {
  unsigned d;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(d) : "l"(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void ad_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void ad_cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
#endif

// ad_keys returns query i's key count (at most max_keys); nw gets its window
// key count and first its first window position.
__device__ __forceinline__ int ad_keys(const ADArgs &a, int i, int &nw, int &first) {
  const int t = a.pos[i];
  nw = max(0, min(t + 1, a.window));
  first = t - nw + 1;
  int nc = 0;
  if (a.comp != 0) {
    nc = max(0, (t + 1) / a.ratio);
    if (a.idx != 0) nc = min(nc, a.topk);
  }
  return min(nw + nc, a.max_keys);
}

// ad_key returns key j's row (j < nk), or 0 for a padding entry.
__device__ __forceinline__ const float *ad_key(const ADArgs &a, int i, int j, int nw, int first) {
  if (j < nw) return a.ring + (long long)((first + j) % a.ring_rows) * a.dim;
  j -= nw;
  const int e = a.idx != 0 ? a.idx[(long long)i * a.idx_stride + j] : j;
  return e < 0 ? (const float *)0 : a.comp + (long long)e * a.dim;
}

// ad_rope rotates the pair (re, im) by the angle pos * fr, or back by it
// (INV): fuse_rows' rotation, and ops.cu's rope kernel with inverse set,
// operation for operation (the float32 product, negated for INV; its sine
// and cosine in double).
template <bool INV>
__device__ __forceinline__ void ad_rope(float &re, float &im, float pos, float fr) {
  float ang = __fmul_rn(pos, fr);
  if (INV) ang = -ang;
  double sd, cd;
  sincos((double)ang, &sd, &cd);
  const float c = (float)cd, s = (float)sd;
  const float x0 = re, x1 = im;
  re = x0 * c - x1 * s;
  im = x0 * s + x1 * c;
}

// ad_qprep applies a.qprep to the block's staged query values: qr[r] is
// float4 column (tid + r·AD_NT) mod D/4 of head (tid + r·AD_NT) / (D/4) of
// the block's G heads (each head's D/4 columns lie in whole warps: D/4 is a
// multiple of 32). All threads of the block call it (it has a barrier).
template <int GP, int D>
__device__ __forceinline__ void ad_qprep(const ADArgs &a, float4 (&qr)[GP], int t, int tid) {
  constexpr int D4 = D / 4, WH = D4 / 32;  // warps per head
  static_assert(D4 % 32 == 0, "a head's columns fill whole warps");
  __shared__ float qss[GP][AD_NW];
  const int lane = tid & 31, w = tid >> 5;
  if (a.qprep & AD_QNORM) {
#pragma unroll
    for (int r = 0; r < GP; r++) {
      const float4 v = qr[r];
      float ss = v.x * v.x;
      ss = fmaf(v.y, v.y, ss);
      ss = fmaf(v.z, v.z, ss);
      ss = fmaf(v.w, v.w, ss);
      ss = ad_warp_sum(ss);
      if (lane == 0) qss[r][w] = ss;
    }
    __syncthreads();
    const int w0 = w / WH * WH;  // the first warp of this thread's head (the same for every r)
#pragma unroll
    for (int r = 0; r < GP; r++) {
      float tot = 0.f;
#pragma unroll
      for (int k = 0; k < WH; k++) tot += qss[r][w0 + k];
      const float inv = 1.0f / sqrtf(tot / (float)D + a.qeps);
      qr[r].x = qr[r].x * inv;
      qr[r].y = qr[r].y * inv;
      qr[r].z = qr[r].z * inv;
      qr[r].w = qr[r].w * inv;
    }
  }
  if ((a.qprep & AD_QROPE) && a.rope_nf > 0) {
    const float pf = (float)t;
    const int c = tid % D4;                  // the same column for every r (AD_NT is a multiple of D4)
    const int e0 = 4 * c - (D - 2 * a.rope_nf);  // this column's first dim within the rotated part
#pragma unroll
    for (int r = 0; r < GP; r++) {
      if (e0 >= 0) ad_rope<false>(qr[r].x, qr[r].y, pf, a.rope_freq[e0 >> 1]);
      if (e0 + 2 >= 0) ad_rope<false>(qr[r].z, qr[r].w, pf, a.rope_freq[(e0 + 2) >> 1]);
    }
  }
}

// Dynamic shared memory of ad_partial<G, D, KT, NB>, in bytes
// (attnDecVariant.shared in attndec.go must agree).
#define AD_SHARED(G, D, KT, NB) (16 * ((G) * ((D) / 4) + (NB) * (KT) * ((D) / 4 + 1)) + 4 * (AD_NW * (G) * (KT) + (KT) * (G)))

// NB key buffers: 1, or 2 (the next tile's copies in flight while the
// current tile is worked on; for splits of several tiles).
template <int G, int D, int KT, int NB>
__device__ __forceinline__ void ad_partial(const ADArgs &a) {
  constexpr int D4 = D / 4;        // float4 columns of a row
  constexpr int KS4 = D4 + 1;      // key row stride in shared memory (float4): conflict-free
  constexpr int NSUB = 32 / KT;    // lanes per key in the score phase
  constexpr int WC = D / 32;       // float4 columns per warp in the score phase
  constexpr int HP = 1024 / D;     // head parts in the P.V phase (HP * D4 == 256 threads)
  constexpr int GP = G / HP;       // heads per thread in the P.V phase
  static_assert(KT == 8 || KT == 16 || KT == 32, "KT");
  static_assert(NB == 1 || NB == 2, "NB");
  static_assert(WC % NSUB == 0, "dim too small for KT");
  static_assert(HP * D4 == AD_NT && GP >= 1 && GP * HP == G, "G, D");
  extern __shared__ float4 ad_sm[];
  float4 *qs = ad_sm;                          // [G][D4]
  float4 *ks0 = qs + G * D4;                   // [NB][KT][KS4]
  float *red = (float *)(ks0 + NB * KT * KS4); // [AD_NW][G][KT]
  float *ps = red + AD_NW * G * KT;            // [KT][G]
  __shared__ const float *kp0[NB][KT];
  __shared__ float mrun[G], lrun[G], alpha[G];

  const int h0 = blockIdx.x * G, s = blockIdx.y, i = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const bool early = a.early & AD_EARLY_KEYS;
  if (!early) MOXIE_PDL();
  // The queries' loads go out before the position's (G*D4 = GP*AD_NT),
  // unless the position and the first tile's keys go before the wait.
  float4 qr[GP];
  auto load_q = [&] {
    const float4 *qg = (const float4 *)(a.q + ((long long)i * a.heads + h0) * D);
#pragma unroll
    for (int r = 0; r < GP; r++) qr[r] = qg[tid + r * AD_NT];
  };
  if (!early) load_q();
  int nw, first;
  const int nk = ad_keys(a, i, nw, first);
  const int chunk = (nk + a.splits * KT - 1) / (a.splits * KT) * KT;
  const int j0 = s * chunk, j1 = min(nk, j0 + chunk);
  const long long row = ((long long)i * a.splits + s) * a.heads + h0;  // (query, split, head h0)
  float *ml = a.part + (long long)a.nq * a.splits * a.heads * D + 2 * row;
  // set_rows: threads < KT locate the keys of the tile at jt (0 past the
  // split) in buffer b; fetch: every thread copies its part of that tile.
  auto set_rows = [&](int jt, int b) {
    if (tid < KT) kp0[b][tid] = jt + tid < j1 ? ad_key(a, i, jt + tid, nw, first) : (const float *)0;
  };
  auto fetch = [&](int b) {
#pragma unroll
    for (int e = tid; e < KT * D4; e += AD_NT) {
      const int j = e / D4, c = e % D4;
      const float *p = kp0[b][j];
      ad_cp16(ks0 + (b * KT + j) * KS4 + c, p != 0 ? (const float4 *)p + c : (const float4 *)a.ring, p != 0);
    }
    ad_cp_commit();
  };
  // pre: the first tile's keys (ring rows, or with AD_EARLY_COMP entries
  // without idx) are on their way before the wait (block-uniform).
  const bool pre = early && NB == 1 && j0 < j1 && (min(j1, j0 + KT) <= nw || (a.idx == 0 && (a.early & AD_EARLY_COMP)));
  if (pre) {
    set_rows(j0, 0);
    __syncthreads();
    fetch(0);
  }
  if (early) {
    MOXIE_PDL();
    load_q();
  }
  if (j0 >= j1) {
    if (tid < G) {
      ml[2 * tid] = AD_NINF;
      ml[2 * tid + 1] = 0.f;
    }
    return;
  }
  if (a.qprep) ad_qprep<GP, D>(a, qr, first + nw - 1, tid);  // position t = first + nw - 1
#pragma unroll
  for (int r = 0; r < GP; r++) qs[tid + r * AD_NT] = qr[r];
  if (tid < G) {
    mrun[tid] = AD_NINF;
    lrun[tid] = 0.f;
  }
  const int c4 = tid % D4, hp = tid / D4;  // P.V phase: column, head part
  float4 acc[GP];
#pragma unroll
  for (int r = 0; r < GP; r++) acc[r] = make_float4(0.f, 0.f, 0.f, 0.f);

  if (NB == 2) {
    set_rows(j0, 0);
    __syncthreads();
    fetch(0);
  }
  for (int jt = j0, n = 0; jt < j1; jt += KT, n++) {
    const int b = NB == 2 ? (n & 1) : 0;
    __syncthreads();  // the previous tile is consumed (its rows and buffer free)
    if (NB == 1) {
      if (!(pre && n == 0)) {  // the first tile's copies may be in flight already
        set_rows(jt, 0);
        __syncthreads();
        fetch(0);
      }
      ad_cp_wait<0>();
    } else {
      const bool more = jt + KT < j1;
      if (more) set_rows(jt + KT, b ^ 1);
      __syncthreads();
      if (more) {
        fetch(b ^ 1);
        ad_cp_wait<1>();  // this tile's copies are done, the next tile's may not be
      } else {
        ad_cp_wait<0>();
      }
    }
    __syncthreads();
    const float4 *ks = ks0 + b * KT * KS4;
    const float *const *kp = kp0[b];
    // Scores: lane = sub*KT + j; warp w sums columns w*WC + sub + NSUB*it.
    {
      const int sub = lane / KT, j = lane % KT;
      float d[G];
#pragma unroll
      for (int g = 0; g < G; g++) d[g] = 0.f;
#pragma unroll
      for (int it = 0; it < WC / NSUB; it++) {
        const int c = w * WC + sub + NSUB * it;
        const float4 k = ks[j * KS4 + c];
#pragma unroll
        for (int g = 0; g < G; g++) {
          const float4 q = qs[g * D4 + c];
          d[g] = fmaf(q.x, k.x, d[g]);
          d[g] = fmaf(q.y, k.y, d[g]);
          d[g] = fmaf(q.z, k.z, d[g]);
          d[g] = fmaf(q.w, k.w, d[g]);
        }
      }
#pragma unroll
      for (int o = KT; o < 32; o <<= 1)
#pragma unroll
        for (int g = 0; g < G; g++) d[g] += __shfl_xor_sync(0xffffffffu, d[g], o);
      if (sub == 0)
#pragma unroll
        for (int g = 0; g < G; g++) red[(w * G + g) * KT + j] = d[g];
    }
    __syncthreads();
    // Online softmax: warp w takes heads w, w+8, ...; lane j key j.
    for (int g = w; g < G; g += AD_NW) {
      float sc = AD_NINF;
      if (lane < KT && kp[lane] != 0) {
        float v = 0.f;
#pragma unroll
        for (int ww = 0; ww < AD_NW; ww++) v += red[(ww * G + g) * KT + lane];
        sc = v * a.scale;
      }
      const float mo = mrun[g];
      const float mn = fmaxf(mo, ad_warp_max(sc));
      const float p = sc == AD_NINF ? 0.f : expf(sc - mn);
      const float sum = ad_warp_sum(p);
      if (lane < KT) ps[lane * G + g] = p;
      if (lane == 0) {
        const float al = mo == mn ? 1.f : expf(mo - mn);
        alpha[g] = al;
        lrun[g] = fmaf(lrun[g], al, sum);
        mrun[g] = mn;
      }
    }
    __syncthreads();
    // P.V: thread (hp, c4) owns column c4 of heads hp*GP .. hp*GP+GP-1.
#pragma unroll
    for (int r = 0; r < GP; r++) {
      const float al = alpha[hp * GP + r];
      acc[r].x *= al;
      acc[r].y *= al;
      acc[r].z *= al;
      acc[r].w *= al;
    }
#pragma unroll
    for (int j = 0; j < KT; j++) {
      const float4 k = ks[j * KS4 + c4];
      const float *pj = ps + j * G + hp * GP;  // 16-byte aligned when GP % 4 == 0
      float pr[GP];
      if constexpr (GP % 4 == 0) {
#pragma unroll
        for (int r = 0; r < GP; r += 4) {
          const float4 v = *(const float4 *)(pj + r);
          pr[r] = v.x;
          pr[r + 1] = v.y;
          pr[r + 2] = v.z;
          pr[r + 3] = v.w;
        }
      } else {
#pragma unroll
        for (int r = 0; r < GP; r++) pr[r] = pj[r];
      }
#pragma unroll
      for (int r = 0; r < GP; r++) {
        const float p = pr[r];
        acc[r].x = fmaf(p, k.x, acc[r].x);
        acc[r].y = fmaf(p, k.y, acc[r].y);
        acc[r].z = fmaf(p, k.z, acc[r].z);
        acc[r].w = fmaf(p, k.w, acc[r].w);
      }
    }
  }
  float4 *op = (float4 *)(a.part + row * D);
#pragma unroll
  for (int r = 0; r < GP; r++) op[(hp * GP + r) * D4 + c4] = acc[r];
  if (tid < G) {
    ml[2 * tid] = mrun[tid];
    ml[2 * tid + 1] = lrun[tid];
  }
}

#define AD_KERNEL(NAME, G, D, KT, NB) \
  extern "C" __global__ void __launch_bounds__(AD_NT) NAME(ADArgs a) { MOXIE_PDL_INSIDE(); ad_partial<G, D, KT, NB>(a); }

AD_KERNEL(attndec_g8k16_d128, 8, 128, 16, 1)
AD_KERNEL(attndec_g8k16_d256, 8, 256, 16, 1)
AD_KERNEL(attndec_g8k16_d512, 8, 512, 16, 1)
AD_KERNEL(attndec_g16k16_d128, 16, 128, 16, 1)
AD_KERNEL(attndec_g16k16_d256, 16, 256, 16, 1)
AD_KERNEL(attndec_g16k16_d512, 16, 512, 16, 1)
AD_KERNEL(attndec_g8k32_d128, 8, 128, 32, 1)
AD_KERNEL(attndec_g8k32_d256, 8, 256, 32, 1)
AD_KERNEL(attndec_g8k32_d512, 8, 512, 32, 1)
AD_KERNEL(attndec_g4k32_d256, 4, 256, 32, 1)
AD_KERNEL(attndec_g4k32_d512, 4, 512, 32, 1)
AD_KERNEL(attndec_g8k16db_d128, 8, 128, 16, 2)
AD_KERNEL(attndec_g8k16db_d256, 8, 256, 16, 2)
AD_KERNEL(attndec_g8k16db_d512, 8, 512, 16, 2)

// Combine: grid (heads, T), blockDim.x = D/4 * SP threads (SP split parts,
// a power of two). Only the splits that hold keys are used (the first
// ceil(nk/chunk), as the partial kernel computes them; each of them wrote
// its partial output). Thread (sp, c) sums the splits s = sp, sp+SP, ... of
// float4 column c in order; the SP part sums are then added in order sp =
// 0, 1, ... (fixed order: deterministic). The loads that do not need the
// query's position go out first, before its key count is known: the m, l
// of every split and each thread's first AD_CPRE splits' outputs (the
// splits past the keys hold stale values, loaded and never used).
#define AD_CPRE 5  // V4-Flash: 40 splits (CSA) over 8 parts
extern "C" __global__ void __launch_bounds__(1024) attndec_combine(ADArgs a) { MOXIE_PDL();
  __shared__ float sm[AD_MAXS], sl[AD_MAXS];
  extern __shared__ float4 cpart[];  // [SP - 1][D/4]
  const int h = blockIdx.x, i = blockIdx.y, S = a.splits, D = a.dim, D4 = D / 4;
  const int c = threadIdx.x % D4, sp = threadIdx.x / D4, SP = blockDim.x / D4;
  const float *ml = a.part + (long long)a.nq * S * a.heads * D;
  const long long step = (long long)a.heads * D4;  // float4s from one split to the next
  const float4 *src = (const float4 *)(a.part + ((long long)i * S * a.heads + h) * D) + c;
  float mv, lv;
  {
    const long long r = ((long long)i * S + min((int)threadIdx.x, S - 1)) * a.heads + h;  // no branch: issued with the rest
    mv = ml[2 * r];
    lv = ml[2 * r + 1];
  }
  float4 pv[AD_CPRE];
#pragma unroll
  for (int u = 0; u < AD_CPRE; u++) {
    const int s = sp + u * SP;
    pv[u] = s < S ? src[s * step] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  const float sink = a.sinks[h];
  int nw, first;
  const int nk = ad_keys(a, i, nw, first);
  const int KT = a.kt;
  const int chunk = (nk + S * KT - 1) / (S * KT) * KT;
  const int sa = chunk > 0 ? min(S, (nk + chunk - 1) / chunk) : 0;  // splits with keys
  if ((int)threadIdx.x < sa) {
    sm[threadIdx.x] = mv;
    sl[threadIdx.x] = lv;
  }
  for (int s = threadIdx.x + blockDim.x; s < sa; s += blockDim.x) {  // more splits than threads
    const long long r = ((long long)i * S + s) * a.heads + h;
    sm[s] = ml[2 * r];
    sl[s] = ml[2 * r + 1];
  }
  __syncthreads();
  float M = sink;
  for (int s = 0; s < sa; s++) M = fmaxf(M, sm[s]);
  // The denominator (part 0's threads, whole warps: D/4 is a multiple of
  // 32) now, while the outputs' loads are in flight.
  float L = 0.f;
  if (sp == 0) {
    L = expf(sink - M);
    for (int s = 0; s < sa; s++) L = fmaf(expf(sm[s] - M), sl[s], L);
  }
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int u = 0; u < AD_CPRE; u++) {
    const int s = sp + u * SP;
    if (s < sa) {
      const float wt = expf(sm[s] - M);  // 0 for a split of padding only (m = -inf, output 0)
      const float4 v = pv[u];
      acc.x = fmaf(wt, v.x, acc.x);
      acc.y = fmaf(wt, v.y, acc.y);
      acc.z = fmaf(wt, v.z, acc.z);
      acc.w = fmaf(wt, v.w, acc.w);
    }
  }
#pragma unroll 4
  for (int s = sp + AD_CPRE * SP; s < sa; s += SP) {
    const float wt = expf(sm[s] - M);
    const float4 v = src[s * step];
    acc.x = fmaf(wt, v.x, acc.x);
    acc.y = fmaf(wt, v.y, acc.y);
    acc.z = fmaf(wt, v.z, acc.z);
    acc.w = fmaf(wt, v.w, acc.w);
  }
  if (sp > 0) cpart[(sp - 1) * D4 + c] = acc;
  __syncthreads();
  if (sp == 0) {
    for (int k = 1; k < SP; k++) {
      const float4 v = cpart[(k - 1) * D4 + c];
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
    }
    acc.x /= L;
    acc.y /= L;
    acc.z /= L;
    acc.w /= L;
    if (a.rope_nf > 0) {
      const int e0 = 4 * c - (D - 2 * a.rope_nf);  // this column's first dim within the rotated part
      const float pf = (float)a.pos[i];
      if (e0 >= 0) ad_rope<true>(acc.x, acc.y, pf, a.rope_freq[e0 >> 1]);
      if (e0 + 2 >= 0) ad_rope<true>(acc.z, acc.w, pf, a.rope_freq[(e0 + 2) >> 1]);
    }
    ((float4 *)(a.o + ((long long)i * a.heads + h) * D))[c] = acc;
  }
}
