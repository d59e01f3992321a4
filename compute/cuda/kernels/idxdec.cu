// Decode-speed lightning-indexer kernels (compute/cuda/idxdec.go): the same
// results as fwd_index_scores and fwd_topk of kernels/fwd.cu, bit for bit,
// with the work spread so that one query (a decode token) is not serial.
// Positions come from device memory (pos, int32 [T]) so the launches can be
// captured in a CUDA graph. No headers: NVRTC needs none.
//@pdl

typedef unsigned int u32;
typedef unsigned long long u64;

#define FULL 0xffffffffu

// ---------------------------------------------------------------------------
// Indexer scores. For query i and entry s < n_i = min((pos[i]+1)/ratio,
// stride): sc[i*stride + s] = Σ_h w[i,h]·ReLU(q[i,h]·keys[s]), in
// fwd_index_scores' float32 order: lane l of a warp forms
// d_l = fma(q[c_m], k[c_m], … fma(q[c_0], k[c_0], 0)) over c = l, l+32, …
// < dim, the 32 lanes' values are summed by the xor tree 16, 8, 4, 2, 1
// (warp_sum), and acc = fma(d_h, w_h, acc) over h = 0, 1, … for d_h > 0
// (NaN and non-positive d skipped), from acc = 0.
//
// idx_scores_h<HPW>: grid (tiles, T), IDX_WARPS warps. A block takes tiles
// of IDX_TE entries (grid-stride); warp w owns heads [w·HPW, (w+1)·HPW)
// with its q slices in registers (dim <= 32·IDX_DPL), reads each entry of
// the tile from shared memory and reduces its HPW dot products at once by a
// reduce-scatter over the same xor tree (each add is the one warp_sum makes,
// so the sums are its bits); then one thread per entry sums the heads in
// order. heads <= IDX_WARPS·HPW, HPW a power of two <= 8.
#define IDX_TE 16
#define IDX_WARPS 8
#define IDX_DPL 4
#define IDX_MAXH 64

// IdxPrep: idx_scores_p_h<HPW> first prepares the queries and weights as
// the row-op kernel (fuse.cu fuse_rows) would have stored them: each
// head's last 2·nf dims rotated forward by the angle float(pos[i])·freq[k]
// (fuse_rows' float32 and float64 operations; a pair's two columns sit on
// lanes l and l^1, exchanged by a shuffle) and each weight times wscale
// (its Scale op's product). q and w are not written. nf 0: no rotation.
struct IdxPrep {
  const float *freq;
  int nf;
  float wscale;
};

// idx_cp16 copies 16 bytes from global src to shared dst (cp.async on sm_80
// and later: the copy is in flight until idx_cp_wait); idx_cp_wait waits for
// the thread's copies.
__device__ __forceinline__ void idx_cp16(void *dst, const void *src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned d;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(d) : "l"(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
#else
  *reinterpret_cast<float4 *>(dst) = *reinterpret_cast<const float4 *>(src);
#endif
}
__device__ __forceinline__ void idx_cp_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

template <int HPW, bool PREP = false>
__device__ __forceinline__ void idx_scores_body(float *sc, const float *q, const float *w, const float *keys,
                                                const int *pos, int ratio, int heads, int dim, int stride,
                                                IdxPrep pp = IdxPrep{nullptr, 0, 1.f}) {
  __shared__ __align__(16) float kt[IDX_TE * 32 * IDX_DPL];
  __shared__ float dsm[IDX_TE][IDX_MAXH + 1];
  __shared__ float ws[IDX_MAXH];
  const int i = blockIdx.y;
  const int n = min((pos[i] + 1) / ratio, stride);
  if ((int)blockIdx.x * IDX_TE >= n) return;  // uniform over the block
  const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
  const float *qi = q + (size_t)i * heads * dim;
  float qr[HPW][IDX_DPL];
#pragma unroll
  for (int j = 0; j < HPW; j++) {
    const int h = wp * HPW + j;
#pragma unroll
    for (int d = 0; d < IDX_DPL; d++) {
      const int c = lane + 32 * d;
      qr[j][d] = h < heads && c < dim ? qi[(size_t)h * dim + c] : 0.f;
    }
  }
  if (PREP && pp.nf > 0) {  // uniform over the block: every lane shuffles
    const int r0 = dim - 2 * pp.nf;
    const float fp = (float)pos[i];
#pragma unroll
    for (int d = 0; d < IDX_DPL; d++) {
      const int c = lane + 32 * d;
      const bool rot = c >= r0 && c < dim;
      float cs = 1.f, sn = 0.f;
      if (rot) {
        const float ang = __fmul_rn(fp, pp.freq[(c - r0) >> 1]);
        double sd, cd;
        sincos((double)ang, &sd, &cd);
        cs = (float)cd;
        sn = (float)sd;
      }
#pragma unroll
      for (int j = 0; j < HPW; j++) {
        const float own = qr[j][d], other = __shfl_xor_sync(FULL, own, 1);
        if (rot) qr[j][d] = (c & 1) == 0 ? own * cs - other * sn : other * sn + own * cs;  // (re, im) = (c even, c odd)
      }
    }
  }
  if (threadIdx.x < heads) ws[threadIdx.x] = PREP ? w[(size_t)i * heads + threadIdx.x] * pp.wscale : w[(size_t)i * heads + threadIdx.x];
  constexpr int LG = HPW == 1 ? 0 : HPW == 2 ? 1 : HPW == 4 ? 2 : 3;
  const bool writer = (lane & ((32 >> LG) - 1)) == 0;
  const int hw = wp * HPW + (lane >> (5 - LG));  // the head this lane holds after the reduction
  // vec: the key tile is staged as float4s (rows of whole float4s, keys
  // 16-byte aligned; blockDim is 32·IDX_WARPS).
  const bool vec = (dim & 3) == 0 && ((size_t)keys & 15) == 0 && blockDim.x == 32 * IDX_WARPS;
  for (int t0 = blockIdx.x * IDX_TE; t0 < n; t0 += gridDim.x * IDX_TE) {
    const int ne = min(IDX_TE, n - t0);
    __syncthreads();  // the previous tile's kt and dsm are read
    const float *kg = keys + (size_t)t0 * dim;
    if (vec) {
      // Every copy of the tile in flight at once (a loop of load, store
      // waits for memory once per element; so did two loads then two
      // stores, as ptxas ordered them).
      constexpr int V = IDX_TE * 32 * IDX_DPL / 4 / (32 * IDX_WARPS);  // float4s a thread
#pragma unroll
      for (int u = 0; u < V; u++) {
        const int x = threadIdx.x + u * 32 * IDX_WARPS;
        if (4 * x < ne * dim) idx_cp16(reinterpret_cast<float4 *>(kt) + x, reinterpret_cast<const float4 *>(kg) + x);
      }
      idx_cp_wait();
    } else {
      for (int x = threadIdx.x; x < ne * dim; x += blockDim.x) kt[x] = kg[x];
    }
    __syncthreads();
#pragma unroll 2
    for (int e = 0; e < ne; e++) {
      float kv[IDX_DPL];
#pragma unroll
      for (int d = 0; d < IDX_DPL; d++) {
        const int c = lane + 32 * d;
        kv[d] = c < dim ? kt[e * dim + c] : 0.f;
      }
      float v[HPW];
#pragma unroll
      for (int j = 0; j < HPW; j++) {
        float acc = 0.f;
#pragma unroll
        for (int d = 0; d < IDX_DPL; d++)
          if (lane + 32 * d < dim) acc = __fmaf_rn(qr[j][d], kv[d], acc);
        v[j] = acc;
      }
      // Reduce-scatter: at xor distance o a lane keeps the half of its
      // heads selected by its bit o and adds the partner's values of them.
      int m = HPW;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        if (m > 1) {
          const int hm = m >> 1;
          const bool up = (lane & o) != 0;
#pragma unroll
          for (int j = 0; j < HPW / 2; j++) {
            if (j < hm) {
              const float send = up ? v[j] : v[j + hm];
              const float keep = up ? v[j + hm] : v[j];
              v[j] = keep + __shfl_xor_sync(FULL, send, o);
            }
          }
          m = hm;
        } else {
          v[0] += __shfl_xor_sync(FULL, v[0], o);
        }
      }
      if (writer && hw < heads) dsm[e][hw] = v[0];
    }
    __syncthreads();
    if ((int)threadIdx.x < ne) {
      const int e = threadIdx.x;
      float acc = 0.f;
      for (int h = 0; h < heads; h++) {
        const float d = dsm[e][h];
        if (d > 0.f) acc = __fmaf_rn(d, ws[h], acc);
      }
      sc[(size_t)i * stride + t0 + e] = acc;
    }
  }
}

extern "C" __global__ void __launch_bounds__(256) idx_scores_h1(float *sc, const float *q, const float *w,
                                                                const float *keys, const int *pos, int ratio, int heads,
                                                                int dim, int stride) { MOXIE_PDL();
  idx_scores_body<1>(sc, q, w, keys, pos, ratio, heads, dim, stride);
}
extern "C" __global__ void __launch_bounds__(256) idx_scores_h2(float *sc, const float *q, const float *w,
                                                                const float *keys, const int *pos, int ratio, int heads,
                                                                int dim, int stride) { MOXIE_PDL();
  idx_scores_body<2>(sc, q, w, keys, pos, ratio, heads, dim, stride);
}
extern "C" __global__ void __launch_bounds__(256) idx_scores_h4(float *sc, const float *q, const float *w,
                                                                const float *keys, const int *pos, int ratio, int heads,
                                                                int dim, int stride) { MOXIE_PDL();
  idx_scores_body<4>(sc, q, w, keys, pos, ratio, heads, dim, stride);
}
extern "C" __global__ void __launch_bounds__(256) idx_scores_h8(float *sc, const float *q, const float *w,
                                                                const float *keys, const int *pos, int ratio, int heads,
                                                                int dim, int stride) { MOXIE_PDL();
  idx_scores_body<8>(sc, q, w, keys, pos, ratio, heads, dim, stride);
}

// idx_scores_p_h<HPW>: idx_scores_h<HPW> on queries and weights prepared
// in the kernel (IdxPrep). The rotated pairs must start at an even column
// (dim - 2·nf even).
#define IDX_SCORES_P(HPW)                                                                                               \
  extern "C" __global__ void __launch_bounds__(256) idx_scores_p_h##HPW(float *sc, const float *q, const float *w,   \
                                                                       const float *keys, const int *pos, int ratio, \
                                                                       int heads, int dim, int stride, IdxPrep pp) { \
    MOXIE_PDL();                                                                                                      \
    idx_scores_body<HPW, true>(sc, q, w, keys, pos, ratio, heads, dim, stride, pp);                                   \
  }
IDX_SCORES_P(1)
IDX_SCORES_P(2)
IDX_SCORES_P(4)
IDX_SCORES_P(8)

__device__ __forceinline__ float idx_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
  return v;
}

// idx_scores_generic: any heads and dim (the shapes idx_scores_h* do not
// take), one warp per (query, entry), the heads in order: fwd_index_scores'
// scheme. Grid (any, T), 256 threads.
extern "C" __global__ void __launch_bounds__(256) idx_scores_generic(float *sc, const float *q, const float *w,
                                                                     const float *keys, const int *pos, int ratio,
                                                                     int heads, int dim, int stride) { MOXIE_PDL();
  const int i = blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int n = min((pos[i] + 1) / ratio, stride);
  const float *qi = q + (size_t)i * heads * dim;
  for (int s = blockIdx.x * 8 + (threadIdx.x >> 5); s < n; s += gridDim.x * 8) {
    const float *k = keys + (size_t)s * dim;
    float acc = 0.f;
    for (int h = 0; h < heads; h++) {
      float d = 0.f;
      for (int c = lane; c < dim; c += 32) d = __fmaf_rn(qi[(size_t)h * dim + c], k[c], d);
      d = idx_warp_sum(d);
      if (d > 0.f) acc = __fmaf_rn(d, w[(size_t)i * heads + h], acc);
    }
    if (lane == 0) sc[(size_t)i * stride + s] = acc;
  }
}

// ---------------------------------------------------------------------------
// Indexer top-k: row i of sc [T, stride] has n = min((pos[i]+1)/ratio,
// stride) scores; idx[i*topk .. +min(topk, n)) receives the indices of the
// min(topk, n) largest in compute.TopK's order (descending score, ties to
// the lower index, NaN last, −0 == +0); rows with n <= 0 are not written.
// One block of TK_THREADS per row. Every candidate becomes the 64-bit word
// (~key << 32) | index, whose ascending order is exactly that order, and a
// bitonic sort in shared memory orders them (block barriers only where a
// compare distance crosses a warp's 64 words). Rows of at most TK_SORT
// entries are sorted whole; longer rows first select their k survivors: a
// radix select of the k-th largest key (8-bit digits, warp-aggregated
// shared histograms, the digit found by a parallel scan; it stops early once
// a digit's bin is taken whole), every larger key, and the lowest-index keys
// equal to it (an index-ordered scan).
#define TK_THREADS 1024
#define TK_SORT 2048

// Orderable key of a score: a larger float gives a larger key; −0 is +0;
// NaN gives 0, below every number (−inf gives 0x007fffff). fwd.cu's order_key.
__device__ __forceinline__ u32 tk_key(float f) {
  if (f != f) return 0u;
  if (f == 0.f) return 0x80000000u;
  const u32 u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ u64 tk_word(u32 key, int j) { return ((u64)(~key) << 32) | (u64)(u32)j; }

__device__ __forceinline__ u32 tk_lanemask_lt() {
  u32 m;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
  return m;
}

// tk_bitonic sorts s[0 .. P) ascending (P a power of two, 2 <= P <= 2·blockDim).
// Called by every thread of the block; ends with a block barrier.
__device__ __forceinline__ void tk_bitonic(u64 *s, int P) {
  const int t = threadIdx.x;
  const bool act = t < (P >> 1);
  bool prevWide = true;  // the caller's stores came from every warp
  for (int size = 2; size <= P; size <<= 1) {
    for (int st = size >> 1; st > 0; st >>= 1) {
      const bool wide = st >= 64;  // pairs at distance < 64 stay in a warp's 64 words
      if (wide || prevWide)
        __syncthreads();
      else
        __syncwarp();
      prevWide = wide;
      if (act) {
        const int a = ((t & ~(st - 1)) << 1) | (t & (st - 1)), b = a + st;
        const u64 x = s[a], y = s[b];
        const bool asc = (a & size) == 0;
        if ((x > y) == asc) {
          s[a] = y;
          s[b] = x;
        }
      }
    }
  }
  __syncthreads();
}

extern "C" __global__ void __launch_bounds__(TK_THREADS) idx_topk(int *idx, const float *sc, const int *pos, int ratio,
                                                                  int topk, int stride) { MOXIE_PDL();
  __shared__ u64 s[TK_SORT];
  __shared__ u32 hist[256];
  __shared__ u32 wsum[32];
  __shared__ u32 s_prefix, s_need, s_whole, s_ngt;
  const int i = blockIdx.x;
  const int n = min((pos[i] + 1) / ratio, stride);
  const int k = min(topk, n);
  if (k <= 0) return;
  const float *row = sc + (size_t)i * stride;
  int *out = idx + (size_t)i * topk;
  const int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5, nw = blockDim.x >> 5;
  int P = 2;
  if (n <= TK_SORT) {
    while (P < n) P <<= 1;
    for (int j = tid; j < P; j += blockDim.x) s[j] = j < n ? tk_word(tk_key(row[j]), j) : ~0ull;
  } else {
    // Radix select: prefix (under mask) is the k-th largest key's leading
    // digits; need keys matching it are still to be taken.
    u32 prefix = 0u, mask = 0u, need = (u32)k;
    for (int shift = 24; shift >= 0; shift -= 8) {
      if (tid < 256) hist[tid] = 0u;
      __syncthreads();
      for (int j0 = tid - lane; j0 < n; j0 += blockDim.x) {  // warp-uniform trips
        const int j = j0 + lane;
        const u32 key = j < n ? tk_key(row[j]) : 0u;
        const bool in = j < n && (key & mask) == prefix;
        const u32 bin = in ? (key >> shift) & 255u : 0xffffffffu;
        const u32 peers = __match_any_sync(FULL, bin);
        if (in && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (u32)__popc(peers));
      }
      __syncthreads();
      if (tid < 256) {
        // Thread t holds bin 255 − t: an inclusive scan from the top bin down.
        const u32 c = hist[255 - tid];
        u32 x = c;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const u32 y = __shfl_up_sync(FULL, x, o);
          if (lane >= o) x += y;
        }
        if (lane == 31) wsum[wp] = x;
        __syncwarp();
        asm volatile("bar.sync 1, 256;");  // the 8 scanning warps only
        u32 before = 0u;
        for (int q = 0; q < wp; q++) before += wsum[q];
        const u32 incl = before + x, excl = incl - c;
        if (excl < need && need <= incl) {
          s_prefix = prefix | ((u32)(255 - tid) << shift);
          s_need = need - excl;
          s_whole = c == need - excl;
        }
      }
      __syncthreads();
      prefix = s_prefix;
      need = s_need;
      mask |= 255u << shift;
      const bool whole = s_whole;
      __syncthreads();  // s_* and hist are rewritten by the next pass
      if (whole) break;  // every key of the bin is taken: no ties to break
    }
    // Survivors: keys whose masked value is above prefix (k − need of them,
    // in any order) and the first `need` (by index) equal to it.
    if (tid == 0) s_ngt = 0u;
    __syncthreads();
    const u32 below = tk_lanemask_lt();
    u32 eqBase = 0u;
    for (int j0 = 0; j0 < n; j0 += blockDim.x) {
      const int j = j0 + tid;
      const u32 key = j < n ? tk_key(row[j]) : 0u;
      const u32 km = key & mask;
      const bool gt = j < n && km > prefix, eq = j < n && km == prefix;
      if (gt) s[atomicAdd(&s_ngt, 1u)] = tk_word(key, j);
      const u32 be = __ballot_sync(FULL, eq);
      if (lane == 0) wsum[wp] = __popc(be);
      __syncthreads();
      u32 pre = 0u, tot = 0u;
      for (int q = 0; q < nw; q++) {
        const u32 c = wsum[q];
        pre += q < wp ? c : 0u;
        tot += c;
      }
      if (eq) {
        const u32 e = eqBase + pre + __popc(be & below);
        if (e < need) s[(u32)k - need + e] = tk_word(key, j);
      }
      eqBase += tot;
      __syncthreads();  // wsum is rewritten next round
    }
    while (P < k) P <<= 1;
    for (int j = k + tid; j < P; j += blockDim.x) s[j] = ~0ull;
  }
  tk_bitonic(s, P);
  for (int j = tid; j < k; j += blockDim.x) out[j] = (int)(u32)s[j];
}

// ---------------------------------------------------------------------------
// idx_topk_sel: idx_topk's results (the same indices in the same slots)
// with less sorting. One block of TK_THREADS per row; the row's first
// min(n, cache) keys are kept in dynamic shared memory (4·cache bytes), the
// rest read again from sc. A radix select over 8-bit digits (idx_topk's
// passes) narrows the candidates to the keys whose leading digits are at
// least the k-th largest key's, and stops as soon as their count M is at
// most max(TK_SMALL, k rounded up to a power of two) (or a bin is taken
// whole, or the key is resolved): one pass at n = 2048, two at 32768 for
// typical scores. Then every candidate becomes its word and the M words are
// sorted (ascending word order is compute.TopK's order, so the first k are
// the answer whatever the candidates past them are). Only when more than
// TK_SORT keys tie with the k-th largest are the survivors taken exactly as
// idx_topk takes them (ties in index order). Sizes up to TK_SMALL sort in
// registers (one word per thread, shuffles inside a warp, shared memory
// across warps); larger ones with tk_bitonic.
#define TK_SMALL 1024

__device__ __forceinline__ u32 tk_get(const u32 *kc, const float *row, int j, int cached) {
  return j < cached ? kc[j] : tk_key(row[j]);
}

__device__ __forceinline__ int tk_pow2(int x) {
  int p = 32;
  while (p < x) p <<= 1;
  return p;
}

// tk_sort_small sorts s[0 .. P) ascending (P a power of two, 32 <= P <=
// min(blockDim, TK_SMALL)), using buf [TK_SMALL] as a second exchange
// buffer. Called by every thread of the block; ends with a block barrier.
__device__ __forceinline__ void tk_sort_small(u64 *s, u64 *buf, int P) {
  const int t = threadIdx.x;
  const bool act = t < P;  // whole warps
  __syncthreads();         // the caller's stores to s
  u64 v = act ? s[t] : ~0ull;
  bool par = false;
  for (int size = 2; size <= P; size <<= 1) {
    for (int st = size >> 1; st > 0; st >>= 1) {
      u64 o = 0ull;
      if (st >= 32) {
        // Alternate buffers: a buffer is rewritten only two exchanges
        // later, after a barrier that every read of it precedes.
        u64 *b = par ? buf : s;
        par = !par;
        if (act) b[t] = v;
        __syncthreads();
        if (act) o = b[t ^ st];
      } else if (act) {
        o = __shfl_xor_sync(FULL, v, st);
      }
      if (act) {
        const bool asc = (t & size) == 0, lower = (t & st) == 0;
        const bool takeMin = lower == asc;
        v = takeMin ? (o < v ? o : v) : (o > v ? o : v);
      }
    }
  }
  __syncthreads();  // every read of s is done
  if (act) s[t] = v;
  __syncthreads();
}

extern "C" __global__ void __launch_bounds__(TK_THREADS) idx_topk_sel(int *idx, const float *sc, const int *pos,
                                                                      int ratio, int topk, int stride, int cache) { MOXIE_PDL();
  extern __shared__ u32 kc[];
  __shared__ u64 s[TK_SORT];
  __shared__ u64 sb[TK_SMALL];
  __shared__ u32 hist[256];
  __shared__ u32 wsum[32];
  __shared__ u32 s_prefix, s_need, s_whole, s_ngt, s_cnt;
  const int i = blockIdx.x;
  const int n = min((pos[i] + 1) / ratio, stride);
  const int k = min(topk, n);
  if (k <= 0) return;
  const float *row = sc + (size_t)i * stride;
  int *out = idx + (size_t)i * topk;
  const int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5, nw = blockDim.x >> 5;
  const int cached = min(n, cache);
  for (int j = tid; j < cached; j += blockDim.x) kc[j] = tk_key(row[j]);
  // prefix (under mask) is the k-th largest key's leading digits; cnt keys
  // match it, of which need are among the k largest.
  u32 prefix = 0u, mask = 0u, need = (u32)k, cnt = (u32)n;
  const int Pk = tk_pow2(k), enough = max(Pk, TK_SMALL);
  for (int shift = 24; shift >= 0; shift -= 8) {
    if ((int)((u32)k - need + cnt) <= enough) break;  // uniform
    if (tid < 256) hist[tid] = 0u;
    __syncthreads();
    for (int j0 = tid - lane; j0 < n; j0 += blockDim.x) {  // warp-uniform trips
      const int j = j0 + lane;
      const u32 key = j < n ? tk_get(kc, row, j, cached) : 0u;
      const bool in = j < n && (key & mask) == prefix;
      const u32 bin = in ? (key >> shift) & 255u : 0xffffffffu;
      const u32 peers = __match_any_sync(FULL, bin);
      if (in && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (u32)__popc(peers));
    }
    __syncthreads();
    if (tid < 256) {
      const u32 c = hist[255 - tid];  // thread t holds bin 255 − t
      u32 x = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const u32 y = __shfl_up_sync(FULL, x, o);
        if (lane >= o) x += y;
      }
      if (lane == 31) wsum[wp] = x;
      __syncwarp();
      asm volatile("bar.sync 1, 256;");  // the 8 scanning warps only
      u32 before = 0u;
      for (int q = 0; q < wp; q++) before += wsum[q];
      const u32 incl = before + x, excl = incl - c;
      if (excl < need && need <= incl) {
        s_prefix = prefix | ((u32)(255 - tid) << shift);
        s_need = need - excl;
        s_whole = c == need - excl;
        s_cnt = c;
      }
    }
    __syncthreads();
    prefix = s_prefix;
    need = s_need;
    cnt = s_cnt;
    mask |= 255u << shift;
    const bool whole = s_whole;
    __syncthreads();  // s_* and hist are rewritten by the next pass
    if (whole) break;
  }
  const int M = (int)((u32)k - need + cnt);
  if (tid == 0) s_ngt = 0u;
  __syncthreads();
  int P;
  if (M <= TK_SORT) {
    // Every candidate (masked key >= prefix), in any order.
    for (int j0 = tid - lane; j0 < n; j0 += blockDim.x) {
      const int j = j0 + lane;
      const u32 key = j < n ? tk_get(kc, row, j, cached) : 0u;
      const bool c = j < n && (key & mask) >= prefix;
      const u32 b = __ballot_sync(FULL, c);
      u32 base = 0u;
      if (lane == 0 && b) base = atomicAdd(&s_ngt, (u32)__popc(b));
      base = __shfl_sync(FULL, base, 0);
      if (c) s[base + __popc(b & tk_lanemask_lt())] = tk_word(key, j);
    }
    P = tk_pow2(M);
  } else {
    // More than TK_SORT keys tie with the k-th: idx_topk's exact survivors
    // (the larger keys in any order, the first `need` equal ones by index).
    const u32 below = tk_lanemask_lt();
    u32 eqBase = 0u;
    for (int j0 = 0; j0 < n; j0 += blockDim.x) {
      const int j = j0 + tid;
      const u32 key = j < n ? tk_get(kc, row, j, cached) : 0u;
      const u32 km = key & mask;
      const bool gt = j < n && km > prefix, eq = j < n && km == prefix;
      if (gt) s[atomicAdd(&s_ngt, 1u)] = tk_word(key, j);
      const u32 be = __ballot_sync(FULL, eq);
      if (lane == 0) wsum[wp] = __popc(be);
      __syncthreads();
      u32 pre = 0u, tot = 0u;
      for (int q = 0; q < nw; q++) {
        const u32 c = wsum[q];
        pre += q < wp ? c : 0u;
        tot += c;
      }
      if (eq) {
        const u32 e = eqBase + pre + __popc(be & below);
        if (e < need) s[(u32)k - need + e] = tk_word(key, j);
      }
      eqBase += tot;
      __syncthreads();  // wsum is rewritten next round
    }
    P = Pk;
  }
  const int filled = M <= TK_SORT ? M : k;
  __syncthreads();
  for (int j = filled + tid; j < P; j += blockDim.x) s[j] = ~0ull;
  if (P <= TK_SMALL)
    tk_sort_small(s, sb, P);
  else
    tk_bitonic(s, P);
  for (int j = tid; j < k; j += blockDim.x) out[j] = (int)(u32)s[j];
}
