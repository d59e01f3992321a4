// Kernels of the device-resident DeepSeek-V4 forward pass (package dsv4's
// device session): the stateful per-layer steps (window ring attention with
// compressed entries, compressor store and close, batched indexer scores),
// the device-side expert selection for the MoE, and small gathers.
// All float buffers are float32, row-major. Positions are read from device
// memory (pos, int32 [T]: the absolute position of each of the chunk's T
// tokens, consecutive), never from kernel arguments, so that a decode step's
// launches can be captured once in a CUDA graph and replayed at every
// position; grids are sized by the host for the largest case. No headers:
// NVRTC needs none.
//@pdl

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum; every thread gets the result. red holds >= 32 floats.
__device__ float block_sum(float v, float *red) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  float t = 0.f;
  for (int i = 0; i < nw; i++) t += red[i];
  return t;
}

__device__ float block_max(float v, float *red) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  float t = red[0];
  for (int i = 1; i < nw; i++) t = fmaxf(t, red[i]);
  return t;
}

// ---------------------------------------------------------------------------
// Attention of T queries over the window ring plus compressed entries.
//
// Query i (absolute position t = pos[i]) of head h attends to
//   - the window positions max(0, t-window+1) .. t, stored in ring slot
//     p mod ring_rows (ring [ring_rows, dim]);
//   - if comp != 0: n = (t+1)/ratio compressed entries comp [*, dim]: all of
//     them (idx == 0, HCA), or the first min(topk, n) indices of the row
//     idx[i*idx_stride ...] (CSA, the indexer's selection).
// o = sum_j e^(s_j-M) k_j / (sum_j e^(s_j-M) + e^(sink_h-M)), s_j = scale q.k_j,
// M = max(sink_h, max_j s_j); K = V. Grid (heads, T); dynamic shared memory
// holds max_keys floats (the host bounds the key count).
struct AttnArgs {
  float *o;             // [T, heads, dim]
  const float *q;       // [T, heads, dim]
  const float *ring;    // [ring_rows, dim]
  const float *comp;    // [entries, dim] or 0
  const int *idx;       // [T, idx_stride] or 0
  const float *sinks;   // [heads]
  const int *pos;       // [T]
  int ring_rows, window, ratio, idx_stride, topk, heads, dim, max_keys;
  float scale;
};
static_assert(sizeof(AttnArgs) == 96, "AttnArgs must match attnArgs in fwd.go");

extern "C" __global__ void __launch_bounds__(256) fwd_attention(AttnArgs a) { MOXIE_PDL();
  extern __shared__ float sc[];
  __shared__ float red[32];
  const int h = blockIdx.x, i = blockIdx.y;
  const int t = a.pos[i];
  const int nw = min(t + 1, a.window);
  int nc = 0;
  if (a.comp != 0) {
    nc = (t + 1) / a.ratio;
    if (a.idx != 0) nc = min(nc, a.topk);
  }
  const int nk = min(nw + nc, a.max_keys);
  const float *qh = a.q + ((long long)i * a.heads + h) * a.dim;
  const int first = t - nw + 1;
  auto key = [&](int j) -> const float * {
    if (j < nw) return a.ring + (long long)((first + j) % a.ring_rows) * a.dim;
    j -= nw;
    const int e = a.idx != 0 ? a.idx[(long long)i * a.idx_stride + j] : j;
    return a.comp + (long long)e * a.dim;
  };
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
  for (int j = warp; j < nk; j += nwarp) {
    const float *k = key(j);
    float d = 0.f;
    for (int c = lane; c < a.dim; c += 32) d = fmaf(qh[c], k[c], d);
    d = warp_sum(d);
    if (lane == 0) sc[j] = d * a.scale;
  }
  __syncthreads();
  const float sink = a.sinks[h];
  float m = sink;
  for (int j = threadIdx.x; j < nk; j += blockDim.x) m = fmaxf(m, sc[j]);
  m = block_max(m, red);
  float den = 0.f;
  for (int j = threadIdx.x; j < nk; j += blockDim.x) {
    const float e = expf(sc[j] - m);
    sc[j] = e;
    den += e;
  }
  den = block_sum(den, red) + expf(sink - m);  // block_sum synchronises: sc is visible
  float *oh = a.o + ((long long)i * a.heads + h) * a.dim;
  for (int c = threadIdx.x; c < a.dim; c += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < nk; j++) acc = fmaf(sc[j] / den, key(j)[c], acc);
    oh[c] = acc;
  }
}

// The same attention with G heads per block (grid (heads/G, T), 256
// threads), for prefill: each key is read once per G heads instead of once
// per head. Keys stream through shared memory in tiles of ATT_KT with an
// online softmax (running max m and denominator l per head, starting from
// the sink: m = sink, l = 1), so the key count is unbounded; each thread
// accumulates its dims (d = tid + 256 r) for all G heads in registers.
// Dynamic shared memory: 4 * (G*dim + ATT_KT*dim + G*ATT_KT) bytes.
#define ATT_KT 8
#define ATT_MAXG 8
#define ATT_MAXR 4  // dim <= 256 * ATT_MAXR

extern "C" __global__ void __launch_bounds__(256) fwd_attention_hg(AttnArgs a, int G) { MOXIE_PDL();
  extern __shared__ float sm[];
  float *qs = sm;                       // [G, dim]
  float *ks = qs + G * a.dim;           // [ATT_KT, dim]
  float *ps = ks + ATT_KT * a.dim;      // [G, ATT_KT]
  __shared__ float mrun[ATT_MAXG], lrun[ATT_MAXG], alpha[ATT_MAXG];
  const int h0 = blockIdx.x * G, i = blockIdx.y;
  const int t = a.pos[i];
  const int nw = min(t + 1, a.window);
  int nc = 0;
  if (a.comp != 0) {
    nc = (t + 1) / a.ratio;
    if (a.idx != 0) nc = min(nc, a.topk);
  }
  const int nk = nw + nc;
  const int first = t - nw + 1;
  for (int e = threadIdx.x; e < G * a.dim; e += blockDim.x)
    qs[e] = a.q[((long long)i * a.heads + h0) * a.dim + e];
  if (threadIdx.x < G) {
    mrun[threadIdx.x] = a.sinks[h0 + threadIdx.x];
    lrun[threadIdx.x] = 1.f;
  }
  float acc[ATT_MAXG][ATT_MAXR];
#pragma unroll
  for (int g = 0; g < ATT_MAXG; g++)
#pragma unroll
    for (int r = 0; r < ATT_MAXR; r++) acc[g][r] = 0.f;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
  for (int j0 = 0; j0 < nk; j0 += ATT_KT) {
    const int nt = min(ATT_KT, nk - j0);
    __syncthreads();  // previous tile fully consumed (and qs/mrun written)
    for (int e = threadIdx.x; e < nt * a.dim; e += blockDim.x) {
      const int j = j0 + e / a.dim, c = e % a.dim;
      const float *k;
      if (j < nw) {
        k = a.ring + (long long)((first + j) % a.ring_rows) * a.dim;
      } else {
        const int jj = j - nw;
        const int en = a.idx != 0 ? a.idx[(long long)i * a.idx_stride + jj] : jj;
        k = a.comp + (long long)en * a.dim;
      }
      ks[e] = k[c];
    }
    __syncthreads();
    for (int pr = warp; pr < G * nt; pr += nwarp) {
      const int g = pr / nt, j = pr % nt;
      const float *qg = qs + g * a.dim, *kj = ks + j * a.dim;
      float d = 0.f;
      for (int c = lane; c < a.dim; c += 32) d = fmaf(qg[c], kj[c], d);
      d = warp_sum(d);
      if (lane == 0) ps[g * ATT_KT + j] = d * a.scale;
    }
    __syncthreads();
    if (threadIdx.x < G) {
      const int g = threadIdx.x;
      float mx = mrun[g];
      for (int j = 0; j < nt; j++) mx = fmaxf(mx, ps[g * ATT_KT + j]);
      const float al = expf(mrun[g] - mx);
      float l = lrun[g] * al;
      for (int j = 0; j < nt; j++) {
        const float p = expf(ps[g * ATT_KT + j] - mx);
        ps[g * ATT_KT + j] = p;
        l += p;
      }
      mrun[g] = mx;
      lrun[g] = l;
      alpha[g] = al;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < ATT_MAXR; r++) {
      const int c = threadIdx.x + r * blockDim.x;
      if (c < a.dim) {
#pragma unroll
        for (int g = 0; g < ATT_MAXG; g++) {
          if (g < G) {
            float v = acc[g][r] * alpha[g];
            for (int j = 0; j < nt; j++) v = fmaf(ps[g * ATT_KT + j], ks[j * a.dim + c], v);
            acc[g][r] = v;
          }
        }
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < ATT_MAXR; r++) {
    const int c = threadIdx.x + r * blockDim.x;
    if (c < a.dim) {
#pragma unroll
      for (int g = 0; g < ATT_MAXG; g++)
        if (g < G) a.o[((long long)i * a.heads + h0 + g) * a.dim + c] = acc[g][r] / lrun[g];
    }
  }
}

// ---------------------------------------------------------------------------
// Window ring store: ring[pos[i] mod ring_rows] = kv[i] (rows of dim). Grid T.
extern "C" __global__ void fwd_ring_store(float *ring, const float *kv, const int *pos, int ring_rows, int dim) { MOXIE_PDL();
  const int i = blockIdx.x;
  const long long dst = (long long)(pos[i] % ring_rows) * dim;
  for (int c = threadIdx.x; c < dim; c += blockDim.x) ring[dst + c] = kv[(long long)i * dim + c];
}

// Compressor store: token i of the chunk (position p = pos[i]) writes its
// kv row and z row + ape[p mod ratio] into slot p mod ring_rows of the
// compressor rings [ring_rows, width]. Grid T.
extern "C" __global__ void fwd_comp_store(float *ring_kv, float *ring_z, const float *kv, const float *z,
                                          const float *ape, const int *pos, int ratio, int ring_rows, int width) { MOXIE_PDL();
  const int i = blockIdx.x;
  const int p = pos[i];
  const long long dst = (long long)(p % ring_rows) * width;
  const float *ap = ape + (long long)(p % ratio) * width;
  for (int c = threadIdx.x; c < width; c += blockDim.x) {
    ring_kv[dst + c] = kv[(long long)i * width + c];
    ring_z[dst + c] = z[(long long)i * width + c] + ap[c];
  }
}

// comp_close_entry pools compressed entry e into out[e, dw]: per channel a
// softmax over the window's slots of z weighting its kv, RMS-normalised with
// norm [dw], the last 2*nfreq dims rotated at position e*ratio. overlap
// (CSA): the slots are the A halves (channels 0..dw-1) of the previous
// window's rows (when e > 0), then the B halves (dw..2dw-1) of this window's
// rows; otherwise (HCA) this window's rows, channels 0..dw-1. Called by
// every thread of the block; buf holds dw floats (shared), red 32.
__device__ void comp_close_entry(float *out, const float *ring_kv, const float *ring_z, int ring_rows, int ratio,
                                 int width, int dw, int overlap, int e, const float *norm, float eps, const float *freq,
                                 int nfreq, float *buf, float *red) {
  float ss = 0.f;
  for (int ch = threadIdx.x; ch < dw; ch += blockDim.x) {
    float m = __int_as_float(0xff800000u);
    // pass 1: max
    if (overlap && e > 0)
      for (int r = 0; r < ratio; r++) {
        const long long row = (long long)(((e - 1) * ratio + r) % ring_rows) * width;
        m = fmaxf(m, ring_z[row + ch]);
      }
    for (int r = 0; r < ratio; r++) {
      const long long row = (long long)((e * ratio + r) % ring_rows) * width;
      m = fmaxf(m, ring_z[row + (overlap ? dw : 0) + ch]);
    }
    float den = 0.f, num = 0.f;
    if (overlap && e > 0)
      for (int r = 0; r < ratio; r++) {
        const long long row = (long long)(((e - 1) * ratio + r) % ring_rows) * width;
        const float x = expf(ring_z[row + ch] - m);
        den += x;
        num += x * ring_kv[row + ch];
      }
    for (int r = 0; r < ratio; r++) {
      const long long row = (long long)((e * ratio + r) % ring_rows) * width + (overlap ? dw : 0);
      const float x = expf(ring_z[row + ch] - m);
      den += x;
      num += x * ring_kv[row + ch];
    }
    const float v = num / den;
    buf[ch] = v;
    ss += v * v;
  }
  ss = block_sum(ss, red);
  const float inv = (float)(1.0 / sqrt((double)(ss / (float)dw + eps)));
  for (int ch = threadIdx.x; ch < dw; ch += blockDim.x) buf[ch] = norm[ch] * (buf[ch] * inv);
  __syncthreads();
  const int r0 = dw - 2 * nfreq;
  const float epos = (float)(e * ratio);
  float *dst = out + (long long)e * dw;
  for (int ch = threadIdx.x; ch < dw; ch += blockDim.x) {
    if (ch < r0) {
      dst[ch] = buf[ch];
      continue;
    }
    const int f = (ch - r0) >> 1;
    const double ang = (double)(epos * freq[f]);
    const float c = (float)cos(ang), s = (float)sin(ang);
    const float re = buf[r0 + 2 * f], im = buf[r0 + 2 * f + 1];
    dst[ch] = ((ch - r0) & 1) == 0 ? re * c - im * s : re * s + im * c;
  }
}

// Compressor close: the T tokens at positions pos[0] .. pos[0]+T-1 close
// entries e0 = pos[0]/ratio .. (pos[0]+T)/ratio - 1; block b handles entry
// e0 + b (blocks past the last exit) with comp_close_entry. Dynamic shared
// memory: dw floats.
extern "C" __global__ void __launch_bounds__(256) fwd_comp_close(float *out, const float *ring_kv, const float *ring_z,
                                                               int ring_rows, int ratio, int width, int dw, int overlap,
                                                               const int *pos, int T, const float *norm, float eps,
                                                               const float *freq, int nfreq) { MOXIE_PDL();
  extern __shared__ float buf[];
  __shared__ float red[32];
  const int e0 = pos[0] / ratio, e1 = (pos[0] + T) / ratio;
  const int e = e0 + blockIdx.x;
  if (e >= e1) return;
  comp_close_entry(out, ring_kv, ring_z, ring_rows, ratio, width, dw, overlap, e, norm, eps, freq, nfreq, buf, red);
}

// Compressor step of one token (a decode step) for up to COMP_MAXJ
// compressors in one launch: block j is compressor a.j[j]. At position p =
// pos[0] it does fwd_comp_store's store (ring_kv[p mod ring_rows] = kv,
// ring_z[p mod ring_rows] = z + ape[p mod ratio], the same float adds) with
// 16-byte accesses, then, when p closes an entry ((p+1) mod ratio == 0),
// a block barrier and fwd_comp_close's pooling of entry p/ratio: the bits
// of fwd_comp_store followed by fwd_comp_close at T = 1. Needs width % 4 ==
// 0 and kv, z, ape, ring_kv, ring_z 16-byte aligned (CompStep checks).
// Dynamic shared memory: the largest dw floats.
#define COMP_MAXJ 2
struct CompJob {
  float *ring_kv, *ring_z, *out;
  const float *kv, *z, *ape, *norm;
  int ring_rows, ratio, width, dw, overlap, pad;
};
struct CompStepArgs {
  CompJob j[COMP_MAXJ];
  const int *pos;
  const float *freq;
  float eps;
  int nfreq, n, pad;
};
static_assert(sizeof(CompJob) == 80, "CompJob must mirror compJob (compute/cuda/fwd.go)");
static_assert(sizeof(CompStepArgs) == 192, "CompStepArgs must mirror compStepArgs (compute/cuda/fwd.go)");
extern "C" __global__ void __launch_bounds__(256) fwd_comp_step1(const CompStepArgs a) { MOXIE_PDL();
  extern __shared__ float buf[];
  __shared__ float red[32];
  const CompJob &j = a.j[blockIdx.x];
  const int p = a.pos[0];
  const long long dst = (long long)(p % j.ring_rows) * j.width;
  const float *ap = j.ape + (long long)(p % j.ratio) * j.width;
  for (int c = 4 * threadIdx.x; c < j.width; c += 4 * blockDim.x) {
    const float4 k = *reinterpret_cast<const float4 *>(j.kv + c);
    float4 z = *reinterpret_cast<const float4 *>(j.z + c);
    const float4 q = *reinterpret_cast<const float4 *>(ap + c);
    z.x = z.x + q.x;
    z.y = z.y + q.y;
    z.z = z.z + q.z;
    z.w = z.w + q.w;
    *reinterpret_cast<float4 *>(j.ring_kv + dst + c) = k;
    *reinterpret_cast<float4 *>(j.ring_z + dst + c) = z;
  }
  if ((p + 1) % j.ratio != 0) return;  // the same for the whole block
  __syncthreads();                     // the row just stored is visible to the block
  comp_close_entry(j.out, j.ring_kv, j.ring_z, j.ring_rows, j.ratio, j.width, j.dw, j.overlap, p / j.ratio, j.norm, a.eps,
                   a.freq, a.nfreq, buf, red);
}

// ---------------------------------------------------------------------------
// Indexer scores of T queries: for query i (position pos[i]) and entry
// s < (pos[i]+1)/ratio, sc[i*stride + s] = sum_h w[i,h] * ReLU(q[i,h] . keys[s]).
// Entries past a query's count are not written. Grid (any, T), 256 threads:
// one warp per (query, entry), striding over the entries.
extern "C" __global__ void __launch_bounds__(256) fwd_index_scores(float *sc, const float *q, const float *w,
                                                                 const float *keys, const int *pos, int ratio, int heads,
                                                                 int dim, int stride) { MOXIE_PDL();
  const int i = blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int n = min((pos[i] + 1) / ratio, stride);
  const float *qi = q + (long long)i * heads * dim;
  for (int s = blockIdx.x * 8 + (threadIdx.x >> 5); s < n; s += gridDim.x * 8) {
    const float *k = keys + (long long)s * dim;
    float acc = 0.f;
    for (int h = 0; h < heads; h++) {
      float d = 0.f;
      for (int c = lane; c < dim; c += 32) d = fmaf(qi[h * dim + c], k[c], d);
      d = warp_sum(d);
      if (d > 0.f) acc += w[(long long)i * heads + h] * d;
    }
    if (lane == 0) sc[(long long)i * stride + s] = acc;
  }
}

// Orderable key of a score: a larger float gives a larger key; -0 is +0;
// NaN gives 0, below every number (-inf gives 0x007fffff).
__device__ __forceinline__ u32 order_key(float f) {
  if (f != f) return 0u;
  if (f == 0.f) return 0x80000000u;
  const u32 u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive block scan of two counters (blockDim a multiple of 32, <= 1024):
// ea/eb are the sums over lower threads, ta/tb the block totals.
__device__ __forceinline__ void block_scan2(int a, int b, int &ea, int &eb, int &ta, int &tb, int *sa, int *sb) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  int xa = a, xb = b;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int ya = __shfl_up_sync(0xffffffffu, xa, o), yb = __shfl_up_sync(0xffffffffu, xb, o);
    if (lane >= o) {
      xa += ya;
      xb += yb;
    }
  }
  __syncthreads();
  if (lane == 31) {
    sa[w] = xa;
    sb[w] = xb;
  }
  __syncthreads();
  int pa = 0, pb = 0, sumA = 0, sumB = 0;
  for (int q = 0; q < nw; q++) {
    if (q < w) {
      pa += sa[q];
      pb += sb[q];
    }
    sumA += sa[q];
    sumB += sb[q];
  }
  ea = pa + xa - a;
  eb = pb + xb - b;
  ta = sumA;
  tb = sumB;
}

#define TOPK_MAX 2048

// Indexer top-k of T queries: row i of sc [T, stride] has n = (pos[i]+1)/ratio
// scores; idx[i*topk .. +min(topk, n)) receives the indices of the
// min(topk, n) largest, ordered like compute.TopK (descending score, ties to
// the lower index, NaN last, -0 == +0). One block (a multiple of 32 threads)
// per query: a 4-pass radix select finds the k-th largest key, an ordered
// compaction takes every larger key and the lowest-index ties, then each
// selected entry's rank gives its place.
extern "C" __global__ void __launch_bounds__(1024) fwd_topk(int *idx, const float *sc, const int *pos, int ratio,
                                                          int topk, int stride) { MOXIE_PDL();
  __shared__ u32 hist[256];
  __shared__ u32 s_prefix, s_need;
  __shared__ int sa[32], sb[32];
  __shared__ u32 skey[TOPK_MAX];
  __shared__ int sidx[TOPK_MAX];
  const int i = blockIdx.x;
  const int n = min((pos[i] + 1) / ratio, stride);
  const int k = min(min(topk, n), TOPK_MAX);
  if (k <= 0) return;
  const float *row = sc + (long long)i * stride;
  int *out = idx + (long long)i * topk;
  u32 prefix = 0u, mask = 0u, need = (u32)k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0u;
    __syncthreads();
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      const u32 key = order_key(row[j]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      u32 cum = 0u;
      int b = 255;
      for (; b > 0; b--) {
        if (cum + hist[b] >= need) break;
        cum += hist[b];
      }
      s_prefix = prefix | ((u32)b << shift);
      s_need = need - cum;
    }
    __syncthreads();
    prefix = s_prefix;
    need = s_need;
    mask |= 255u << shift;
    __syncthreads();
  }
  // prefix is the k-th largest key; the k - need larger keys are all taken,
  // and the `need` lowest-index keys equal to it.
  const int ngt = k - (int)need;
  int gtBase = 0, eqBase = 0;
  for (int base = 0; base < n; base += blockDim.x) {
    const int j = base + threadIdx.x;
    const u32 key = j < n ? order_key(row[j]) : 0u;
    const int gt = j < n && key > prefix, eq = j < n && key == prefix;
    int ea, eb, ta, tb;
    block_scan2(gt, eq, ea, eb, ta, tb, sa, sb);
    if (gt) sidx[gtBase + ea] = j;
    if (eq && eqBase + eb < (int)need) sidx[ngt + eqBase + eb] = j;
    gtBase += ta;
    eqBase += tb;
  }
  __syncthreads();
  for (int m = threadIdx.x; m < k; m += blockDim.x) skey[m] = order_key(row[sidx[m]]);
  __syncthreads();
  for (int m = threadIdx.x; m < k; m += blockDim.x) {
    const u32 km = skey[m];
    const int im = sidx[m];
    int r = 0;
    for (int q = 0; q < k; q++) {
      const u32 kq = skey[q];
      r += (kq > km) || (kq == km && sidx[q] < im);
    }
    out[r] = im;
  }
}

// ---------------------------------------------------------------------------
// Expert selection without a host round trip. LinArgs mirrors struct LinArgs
// of linear.cu (the multi-linear kernels' argument table).
struct LinArgs {
  const u8 *W;
  const u8 *S;
  const float *x;
  float *y;
  int rows, cols, sdivr, sdivc, srshift, scshift, sstride, rpg, xstride, ystride, batch;
};
static_assert(sizeof(LinArgs) == 80, "LinArgs must match linArgs in linear.go");

// For k < K: e = ids[k]; run13[2k] = all13[2e] (w1) with x -> g + k*inter,
// run13[2k+1] = all13[2e+1] (w3) with x -> u + k*inter, run2[k] = all2[e]
// with h + k*inter -> y + k*dim. ids outside [0, experts) select expert 0
// (Route never produces them). One thread per k.
extern "C" __global__ void fwd_moe_args(LinArgs *run13, LinArgs *run2, const LinArgs *all13, const LinArgs *all2,
                                        const int *ids, int K, int experts, const float *x, float *g, float *u,
                                        const float *h, float *y, int inter, int dim) { MOXIE_PDL();
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= K) return;
  int e = ids[k];
  if (e < 0 || e >= experts) e = 0;
  LinArgs a = all13[2 * e];
  a.x = x;
  a.y = g + (long long)k * inter;
  run13[2 * k] = a;
  a = all13[2 * e + 1];
  a.x = x;
  a.y = u + (long long)k * inter;
  run13[2 * k + 1] = a;
  a = all2[e];
  a.x = h + (long long)k * inter;
  a.y = y + (long long)k * dim;
  run2[k] = a;
}

// ---------------------------------------------------------------------------
// MoE of a chunk without a host round trip (prefill).
//
// fwd_moe_plan (one block): from the routing ids [n = T*K] (entry j is token
// j / K's k-th choice), lay the entries out expert-major: slot
// off[e] + (rank of j among expert e's entries, in entry order). Writes
// row_tok[slot] = token, row_w[slot] = weight, inv[j] = slot, and the tiles
// (expert, first slot, rows <= tile) of every expert's rows, in expert
// order, into tiles [max_tiles, 3]; tiles past the last get rows 0. ids
// outside [0, experts) count as expert 0 (Route never produces them).
// Dynamic shared memory: 12 * experts bytes.
extern "C" __global__ void __launch_bounds__(1024) fwd_moe_plan(int *row_tok, float *row_w, int *inv, int *tiles,
                                                              const int *ids, const float *w, int n, int K,
                                                              int experts, int max_tiles, int tile) { MOXIE_PDL();
  extern __shared__ int sh[];
  int *cnt = sh, *off = sh + experts, *toff = sh + 2 * experts;
  __shared__ int s_total;
  for (int e = threadIdx.x; e < experts; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    int e = ids[j];
    if (e < 0 || e >= experts) e = 0;
    atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int o = 0, to = 0;
    for (int e = 0; e < experts; e++) {
      off[e] = o;
      toff[e] = to;
      o += cnt[e];
      to += (cnt[e] + tile - 1) / tile;
    }
    s_total = to;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    int r = 0;
    for (int j = 0; j < n; j++) {
      int ej = ids[j];
      if (ej < 0 || ej >= experts) ej = 0;
      if (ej != e) continue;
      const int slot = off[e] + r;
      row_tok[slot] = j / K;
      row_w[slot] = w[j];
      inv[j] = slot;
      r++;
    }
    for (int q = 0; q * tile < cnt[e]; q++) {
      const int ti = toff[e] + q;
      if (ti < max_tiles) {
        tiles[3 * ti] = e;
        tiles[3 * ti + 1] = off[e] + q * tile;
        tiles[3 * ti + 2] = min(tile, cnt[e] - q * tile);
      }
    }
  }
  for (int ti = s_total + threadIdx.x; ti < max_tiles; ti += blockDim.x) {
    tiles[3 * ti] = 0;
    tiles[3 * ti + 1] = 0;
    tiles[3 * ti + 2] = 0;
  }
}

// The multi-block planner (the default; fwd_moe_plan stays for A/B):
// the same layout, tiles and entry order as fwd_moe_plan in three kernels.
// Block b of fwd_moe_count and fwd_moe_scatter owns the entries
// [b*PLAN_CHUNK, (b+1)*PLAN_CHUNK); cnt [nb, experts] (int32, nb =
// ceil(n / PLAN_CHUNK)) holds block b's count of each expert, which
// fwd_moe_offsets turns into block b's first slot of each expert.
#define PLAN_CHUNK 1024
#define PLAN_THREADS 256

__device__ __forceinline__ int plan_expert(const int *ids, int j, int experts) {
  const int e = ids[j];
  return (e < 0 || e >= experts) ? 0 : e;
}

// fwd_moe_count: cnt[b, e] = the entries of block b's chunk routed to e.
// Grid nb, PLAN_THREADS threads, dynamic shared memory 4 * experts bytes.
extern "C" __global__ void __launch_bounds__(PLAN_THREADS) fwd_moe_count(int *cnt, const int *ids, int n, int experts) { MOXIE_PDL();
  extern __shared__ int sh[];
  for (int e = threadIdx.x; e < experts; e += blockDim.x) sh[e] = 0;
  __syncthreads();
  const int j0 = blockIdx.x * PLAN_CHUNK, j1 = min(n, j0 + PLAN_CHUNK);
  for (int j = j0 + threadIdx.x; j < j1; j += blockDim.x) atomicAdd(&sh[plan_expert(ids, j, experts)], 1);
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) cnt[(long long)blockIdx.x * experts + e] = sh[e];
}

// fwd_moe_offsets (one block of 1024 threads, experts <= 1024): from the
// counts cnt [nb, experts], expert e's rows start at off[e] = the rows of
// the experts before it; cnt[b, e] becomes off[e] + the rows of e in the
// blocks before b. Writes the tiles as fwd_moe_plan does: (expert, first
// slot, rows <= tile) of every expert's rows in expert order, tiles past
// the last (up to max_tiles) with 0 rows; none at or past max_tiles.
extern "C" __global__ void __launch_bounds__(1024) fwd_moe_offsets(int *cnt, int *tiles, int nb, int experts,
                                                                 int max_tiles, int tile) { MOXIE_PDL();
  __shared__ int s_off[1024], s_toff[1024], s_tot[1024], w_rows[32], w_tiles[32];
  __shared__ int s_total;
  const int e = threadIdx.x, lane = e & 31, w = e >> 5;
  int tot = 0;
  if (e < experts) {
#pragma unroll 4
    for (int b = 0; b < nb; b++) tot += cnt[(long long)b * experts + e];
  }
  const int nt = (tot + tile - 1) / tile;
  // Exclusive scans of the rows and the tiles over the experts.
  int r = tot, q = nt;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int r2 = __shfl_up_sync(0xffffffffu, r, o), q2 = __shfl_up_sync(0xffffffffu, q, o);
    if (lane >= o) {
      r += r2;
      q += q2;
    }
  }
  if (lane == 31) {
    w_rows[w] = r;
    w_tiles[w] = q;
  }
  __syncthreads();
  if (w == 0) {
    const int a0 = w_rows[lane], c0 = w_tiles[lane];
    int a = a0, c = c0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int a2 = __shfl_up_sync(0xffffffffu, a, o), c2 = __shfl_up_sync(0xffffffffu, c, o);
      if (lane >= o) {
        a += a2;
        c += c2;
      }
    }
    w_rows[lane] = a - a0;
    w_tiles[lane] = c - c0;
    if (lane == 31) s_total = c;
  }
  __syncthreads();
  const int off = w_rows[w] + r - tot, toff = w_tiles[w] + q - nt;
  s_off[e] = off;
  s_toff[e] = toff;
  s_tot[e] = tot;
  if (e < experts) {
    int run = off;
#pragma unroll 4
    for (int b = 0; b < nb; b++) {
      const long long i = (long long)b * experts + e;
      const int c = cnt[i];
      cnt[i] = run;
      run += c;
    }
  }
  __syncthreads();
  const int total = s_total;
  for (int ti = e; ti < max_tiles; ti += blockDim.x) {
    int ex = 0, r0 = 0, rows = 0;
    if (ti < total) {
      // The last expert whose tiles start at or before ti owns it (experts
      // without rows start where the next one does).
      int lo = 0, hi = experts - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (s_toff[mid] <= ti) lo = mid;
        else hi = mid - 1;
      }
      const int qq = ti - s_toff[lo];
      ex = lo;
      r0 = s_off[lo] + qq * tile;
      rows = min(tile, s_tot[lo] - qq * tile);
    }
    tiles[3 * ti] = ex;
    tiles[3 * ti + 1] = r0;
    tiles[3 * ti + 2] = rows;
  }
}

// fwd_moe_scatter: the slots of block b's entries, in entry order within
// each expert (base [nb, experts]: fwd_moe_offsets' first slots): writes
// row_tok, row_w and inv as fwd_moe_plan does. Grid nb, PLAN_THREADS
// threads, dynamic shared memory 4 * experts * (1 + PLAN_THREADS/32) bytes.
extern "C" __global__ void __launch_bounds__(PLAN_THREADS) fwd_moe_scatter(int *row_tok, float *row_w, int *inv,
                                                                         const int *base, const int *ids, const float *w,
                                                                         int n, int K, int experts) { MOXIE_PDL();
  extern __shared__ int sh[];
  // run[e]: the next slot of expert e; wc[v, e]: the entries of warp v in
  // this pass routed to e (0 where none).
  int *run = sh, *wc = sh + experts;
  const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
  for (int e = threadIdx.x; e < experts; e += PLAN_THREADS) run[e] = base[(long long)blockIdx.x * experts + e];
  for (int i = threadIdx.x; i < (PLAN_THREADS / 32) * experts; i += PLAN_THREADS) wc[i] = 0;
  __syncthreads();
  const int j0 = blockIdx.x * PLAN_CHUNK;
  for (int p = 0; p < PLAN_CHUNK && j0 + p < n; p += PLAN_THREADS) {
    const int j = j0 + p + threadIdx.x;
    const bool ok = j < n;
    const int e = ok ? plan_expert(ids, j, experts) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(peers & ((1u << lane) - 1u)), cnt = __popc(peers);
    if (ok && rank == 0) wc[wi * experts + e] = cnt;
    __syncthreads();
    if (ok) {
      int slot = run[e] + rank;
      for (int v = 0; v < wi; v++) slot += wc[v * experts + e];
      row_tok[slot] = j / K;
      row_w[slot] = w[j];
      inv[j] = slot;
    }
    __syncthreads();
    if (ok && rank == 0) {
      atomicAdd(&run[e], cnt);
      wc[wi * experts + e] = 0;
    }
    __syncthreads();
  }
}

// fwd_moe_tiles: the multi-linear records of every tile (grid-stride over
// max_tiles): run13[2j] / run13[2j+1] = the tile's expert w1 / w3 over rows
// xe[first .. first+rows) into g / u at the same rows, run2[j] = its w2 over
// h into y; a tile with 0 rows gets records with 0 rows (its blocks exit).
extern "C" __global__ void fwd_moe_tiles(LinArgs *run13, LinArgs *run2, const LinArgs *all13, const LinArgs *all2,
                                         const int *tiles, int max_tiles, const float *xe, float *g, float *u,
                                         const float *h, float *y, int inter, int dim) { MOXIE_PDL();
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < max_tiles; j += gridDim.x * blockDim.x) {
    const int e = tiles[3 * j], r0 = tiles[3 * j + 1], nb = tiles[3 * j + 2];
    LinArgs a = all13[2 * e];
    a.x = xe + (long long)r0 * dim;
    a.y = g + (long long)r0 * inter;
    a.batch = nb;
    if (nb == 0) a.rows = 0;
    run13[2 * j] = a;
    a = all13[2 * e + 1];
    a.x = xe + (long long)r0 * dim;
    a.y = u + (long long)r0 * inter;
    a.batch = nb;
    if (nb == 0) a.rows = 0;
    run13[2 * j + 1] = a;
    a = all2[e];
    a.x = h + (long long)r0 * inter;
    a.y = y + (long long)r0 * dim;
    a.batch = nb;
    if (nb == 0) a.rows = 0;
    run2[j] = a;
  }
}

// fwd_moe_combine: out[t, :] += sum_k y[inv[t*K + k], :] (k in order). Grid T.
// Rows of 4-float multiples at 16-byte aligned addresses go 4 floats per
// access (the same additions in the same order).
extern "C" __global__ void fwd_moe_combine(float *out, const float *y, const int *inv, int K, int dim) { MOXIE_PDL();
  const int t = blockIdx.x;
  if ((dim & 3) == 0 && ((((unsigned long long)out) | ((unsigned long long)y)) & 15) == 0) {
    float4 *o4 = (float4 *)(out + (long long)t * dim);
    for (int c = threadIdx.x; c < dim / 4; c += blockDim.x) {
      float4 s = o4[c];
      for (int k = 0; k < K; k++) {
        const float4 v = ((const float4 *)(y + (long long)inv[t * K + k] * dim))[c];
        s.x += v.x;
        s.y += v.y;
        s.z += v.z;
        s.w += v.w;
      }
      o4[c] = s;
    }
    return;
  }
  for (int c = threadIdx.x; c < dim; c += blockDim.x) {
    float s = out[(long long)t * dim + c];
    for (int k = 0; k < K; k++) s += y[(long long)inv[t * K + k] * dim + c];
    out[(long long)t * dim + c] = s;
  }
}

// out[d] += sum_k y[k, d] (k in order) for d < dim.
extern "C" __global__ void fwd_add_rows(float *out, const float *y, int K, int dim) { MOXIE_PDL();
  const int d = blockIdx.x * blockDim.x + threadIdx.x;
  if (d >= dim) return;
  float s = out[d];
  for (int k = 0; k < K; k++) s += y[(long long)k * dim + d];
  out[d] = s;
}

// dst[j, :] = src[rows[j], :] for j < n (width floats per row). Grid n.
// Rows of 4-float multiples at 16-byte aligned addresses go 4 floats per
// access.
extern "C" __global__ void fwd_gather_rows(float *dst, const float *src, const int *rows, int width) { MOXIE_PDL();
  const int j = blockIdx.x;
  const long long r = rows[j];
  if ((width & 3) == 0 && ((((unsigned long long)dst) | ((unsigned long long)src)) & 15) == 0) {
    const float4 *s4 = (const float4 *)(src + r * width);
    float4 *d4 = (float4 *)(dst + (long long)j * width);
    for (int c = threadIdx.x; c < width / 4; c += blockDim.x) d4[c] = s4[c];
    return;
  }
  for (int c = threadIdx.x; c < width; c += blockDim.x) dst[(long long)j * width + c] = src[r * width + c];
}

// dst[rows[j], :] += src[j, :] for j < n; rows must be distinct. Grid n.
extern "C" __global__ void fwd_scatter_add(float *dst, const float *src, const int *rows, int width) { MOXIE_PDL();
  const int j = blockIdx.x;
  const long long r = rows[j];
  for (int c = threadIdx.x; c < width; c += blockDim.x) dst[r * width + c] += src[(long long)j * width + c];
}

// dst[i, :] = table[tokens[i], :] for int32 rows of width k; grid T.
extern "C" __global__ void fwd_gather_i32(int *dst, const int *table, const int *tokens, int k) { MOXIE_PDL();
  const int i = blockIdx.x;
  const long long r = tokens[i];
  for (int c = threadIdx.x; c < k; c += blockDim.x) dst[(long long)i * k + c] = table[r * k + c];
}
