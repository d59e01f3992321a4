// Fused one-token router (compute/cuda/route.go): the BF16 gate projection
// and the expert choice of ops.cu's route in one kernel. No headers: NVRTC
// needs none.
//@pdl

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define FULL 0xffffffffu
#define GR_RB 2       // gate rows per block (linear.cu's narrow kernel: RB 2)
#define GR_U 4        // 32-word chunks per row a lane loads ahead (U 4)
#define GR_MAXW 8     // warps per block at most
#define GR_EPL 8      // experts per lane in the selection
#define GR_MAXE 256   // 32·GR_EPL

// gr_arrivals counts the blocks of the running gate_route launch that have
// stored their logits; the last one to arrive wraps it back to 0 (atomicInc),
// so every launch (and every graph replay) starts from 0. One counter per
// loaded module: launches must not overlap (the device's one compute stream
// and programmatic dependent launch's wait at MOXIE_PDL() keep them apart).
__device__ u32 gr_arrivals;
// gr_pg holds p_e = sqrt(softplus(logit_e)) of the running gate_route
// launch, stored by the block that forms logit e (so the last block's
// serial tail has no double-precision math); read only by the last block.
__device__ float gr_pg[GR_MAXE];

// ops.cu's rank_key, route_word and route_p, unchanged.
__device__ __forceinline__ u32 gr_rank_key(float f) {
  if (f != f) return 0u;
  u32 b = __float_as_uint(f);
  if (b == 0x80000000u) b = 0u;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ u64 gr_word(float pe, const float *bias, int e) {
  const float key = bias ? pe + bias[e] : pe;
  return ((u64)gr_rank_key(key) << 32) | (u64)(0xffffffffu - (u32)e);
}

__device__ __forceinline__ float gr_p(float g) {
  const double sp = g > 20.f ? (double)g : log1p(exp((double)g));
  return (float)sqrt(sp);
}

// gate_route: logits[e] = Σ_c gate[e, c]·x[c] for e < experts, then ids [k]
// and weights [k] as ops.cu's route for one token. Grid ceil(experts/GR_RB)
// blocks of 32·KW threads (KW <= GR_MAXW); experts <= GR_MAXE, cols a
// multiple of 4, gate rows of cols BF16 values, x 16-byte aligned.
//
// The logits are linear_fast<FMT_BF16, 1, 2, 4> of linear.cu with the same
// KW, operation for operation: lane l of warp w forms, for each 4-column
// word kw = k0 + 32u + l (k0 = 128w, 128w + 128·KW, ...; u = 0..3), the fma
// chain p over its 4 columns from 0 and adds it to its row sum; the lanes'
// sums meet in the xor tree 16, 8, 4, 2, 1 and the warps' in order 0..KW-1
// from 0. So they are Linear's bits. Each block also stores p_e =
// sqrt(softplus(logit_e)) of its rows (gr_pg); the last block to store its
// logits reads every p_e (one per thread), and warp 0 picks the experts as route's register path does. Before the
// PDL wait each block asks L2 for its own gate rows (MOXIE_PDL_PF: the
// gate is a weight, no kernel writes it), so that they stream in while the
// kernel before it still runs.
extern "C" __global__ void __launch_bounds__(256) gate_route(int *ids, float *weights, float *logits, const uint2 *W,
                                                             const float *x, const float *bias, const int *hash,
                                                             int experts, int cols, int k, float scale) {
  MOXIE_PDL_PF(W + (long long)blockIdx.x * GR_RB * (cols >> 2), (long long)min(GR_RB, experts - (int)blockIdx.x * GR_RB) * cols * 2);
  __shared__ float red[GR_MAXW][GR_RB];
  __shared__ float p[GR_MAXE];
  __shared__ u64 wsm[GR_MAXE];
  __shared__ int sid[GR_MAXE];
  __shared__ u32 s_last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int r0 = blockIdx.x * GR_RB;
  const int nw = cols >> 2;
  int rowc[GR_RB];
#pragma unroll
  for (int r = 0; r < GR_RB; r++) rowc[r] = min(r0 + r, experts - 1);
  float acc[GR_RB];
#pragma unroll
  for (int r = 0; r < GR_RB; r++) acc[r] = 0.f;

  for (int k0 = warp * 32 * GR_U; k0 < nw; k0 += nwarps * 32 * GR_U) {
    uint2 w[GR_U][GR_RB];
#pragma unroll
    for (int u = 0; u < GR_U; u++) {
      const int kw = k0 + u * 32 + lane;
#pragma unroll
      for (int r = 0; r < GR_RB; r++) {
        if (kw < nw) {
          w[u][r] = __ldg(W + (long long)rowc[r] * nw + kw);
        } else {
          w[u][r].x = 0u;
          w[u][r].y = 0u;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < GR_U; u++) {
      const int kw = k0 + u * 32 + lane;
      if (kw < nw) {
        float f[GR_RB][4];
#pragma unroll
        for (int r = 0; r < GR_RB; r++) {
          f[r][0] = __int_as_float(w[u][r].x << 16);
          f[r][1] = __int_as_float(w[u][r].x & 0xffff0000u);
          f[r][2] = __int_as_float(w[u][r].y << 16);
          f[r][3] = __int_as_float(w[u][r].y & 0xffff0000u);
        }
        const float4 t = __ldg(reinterpret_cast<const float4 *>(x + kw * 4));
        const float xv[4] = {t.x, t.y, t.z, t.w};
#pragma unroll
        for (int r = 0; r < GR_RB; r++) {
          float pp = 0.f;
#pragma unroll
          for (int c = 0; c < 4; c++) pp = fmaf(f[r][c], xv[c], pp);
          acc[r] += pp;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < GR_RB; r++) {
    float v = acc[r];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    if (lane == 0) red[warp][r] = v;
  }
  __syncthreads();
  if (threadIdx.x < GR_RB && r0 + (int)threadIdx.x < experts) {
    float s = 0.f;
    for (int q = 0; q < nwarps; q++) s += red[q][threadIdx.x];
    logits[r0 + threadIdx.x] = s;
    gr_pg[r0 + threadIdx.x] = gr_p(s);
    __threadfence();  // the stores are visible device-wide before this block arrives
  }
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicInc(&gr_arrivals, gridDim.x - 1) == gridDim.x - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();

  // The last block: every logit is stored. p and the ranking words.
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    const float pe = __ldcg(gr_pg + e);  // gr_p of the stored logit, by the block that stored it
    p[e] = pe;
    wsm[e] = hash ? 0ull : gr_word(pe, bias, e);
  }
  if (hash)
    for (int j = threadIdx.x; j < k; j += blockDim.x) sid[j] = hash[j];
  __syncthreads();
  if (warp != 0) return;
  if (!hash) {
    u64 wr[GR_EPL];
#pragma unroll
    for (int u = 0; u < GR_EPL; u++) {
      const int e = lane + 32 * u;
      wr[u] = e < experts ? wsm[e] : 0ull;
    }
    for (int j = 0; j < k; j++) {
      u64 best = wr[0];
#pragma unroll
      for (int u = 1; u < GR_EPL; u++) best = wr[u] > best ? wr[u] : best;
      const u32 hi = __reduce_max_sync(FULL, (u32)(best >> 32));
      const u32 lo = __reduce_max_sync(FULL, (u32)(best >> 32) == hi ? (u32)best : 0u);
      const u64 win = ((u64)hi << 32) | lo;
#pragma unroll
      for (int u = 0; u < GR_EPL; u++)
        if (wr[u] == win) wr[u] = 0ull;
      if (lane == 0) sid[j] = (int)(0xffffffffu - lo);
    }
    __syncwarp();
  }
  float sum = 0.f;
  bool bad = false;
  for (int j = 0; j < k; j++) {  // every lane, route's order
    const int e = sid[j];
    if (e < 0 || e >= experts) {
      bad = true;
      break;
    }
    sum += p[e];
  }
  for (int j = lane; j < k; j += 32) {
    const int e = sid[j];
    ids[j] = e;
    weights[j] = bad ? __int_as_float(0x7fc00000) : p[e] / sum * scale;
  }
}

// grw_arrivals is gate_route_w's ticket counter (as gr_arrivals is
// gate_route's: the last block wraps it back to 0, so graph replays need no
// reset); grw_part holds gate_route_w's per-warp partial sums when a row's
// warps are spread over several blocks ([experts][kw], written before the
// ticket, read by the last block). Launches must not overlap (as above).
__device__ u32 grw_arrivals;
__device__ float grw_part[GR_MAXE * GR_MAXW];

__device__ __forceinline__ u64 gr_max64(u64 a, u64 b) { return a > b ? a : b; }
// GrwPF is the gate bytes a gate_route_w block reads, as MOXIE_PDL_PF's
// (ptr, bytes, stride, count) ranges: whole rows, or (a row's warps spread
// over blocks) the block's warp slices of each full pass over the row,
// every range inside the row. off counts uint2 words from W.
struct GrwPF {
  long long off, bytes, stride;
  int count;
};
__device__ __forceinline__ GrwPF grw_pf(int experts, int cols, int kw) {
  const int wb = blockDim.x >> 5, u0 = blockIdx.x * wb, nw = cols >> 2, r0 = u0 / kw;
  if (wb >= kw) {
    const int r1 = (min(u0 + wb, experts * kw) - 1) / kw;
    return GrwPF{(long long)r0 * nw, (long long)(r1 - r0 + 1) * cols * 2, 0, 1};
  }
  const int w0 = (u0 - r0 * kw) * 32 * GR_U;  // the block's first word of the row
  return GrwPF{(long long)r0 * nw + w0, (long long)wb * 32 * GR_U * 8, (long long)kw * 32 * GR_U * 8,
               (nw - w0) / (kw * 32 * GR_U)};
}
static_assert(GR_EPL == 8, "gate_route_w's selection takes the maximum of 8 words a lane as a tree");

// gate_route_w: gate_route's results, bit for bit, from a wider grid. The
// gate's work is experts·kw units (row e, warp slice q < kw), kw being
// gate_route's warps per block: unit (e, q) is what warp q of gate_route's
// block does for row e (lane l adds, for each 4-column word kw' = k0 + 32u
// + l, k0 = 128q, 128q + 128·kw, ..., the fma chain over its 4 columns from
// 0 to its sum; the lanes meet in the xor tree 16, 8, 4, 2, 1). Each warp of
// this kernel does one unit (blockIdx.x·wb + warp, wb = blockDim.x/32), so
// the units' sums are gate_route's red[q][r] values bit for bit, and the
// logit is their sum in order q = 0..kw-1 from 0, as there:
//   - wb a multiple of kw: a block holds wb/kw whole rows and stores their
//     logits itself;
//   - kw a multiple of wb: a row's units span kw/wb blocks; they store
//     their sums in grw_part and the last block adds them up and stores
//     the logits.
// Every load a lane makes (its gate words and x quads; the bias and hash
// entries the last block will need, whichever block that is) is issued
// before its first product, so that one memory round trip covers them. The
// last block to take a ticket (atomicInc on grw_arrivals after a
// __threadfence) computes p_e = sqrt(softplus(logit_e)) as gate_route
// does, and warp 0 selects the top k with route's rules (the per-lane
// maximum taken as a tree: max is exact, so any order gives the same word).
// Grid ceil(experts·kw / wb) blocks of 32·wb threads, wb <= GR_MAXW, kw <=
// GR_MAXW, wb % kw == 0 or kw % wb == 0; experts <= GR_MAXE, k <= experts,
// cols a multiple of 4.
extern "C" __global__ void __launch_bounds__(256) gate_route_w(int *ids, float *weights, float *logits, const uint2 *W,
                                                               const float *x, const float *bias, const int *hash,
                                                               int experts, int cols, int k, float scale, int kw) {
  MOXIE_PDL_PF(W + grw_pf(experts, cols, kw).off, grw_pf(experts, cols, kw).bytes, grw_pf(experts, cols, kw).stride,
               grw_pf(experts, cols, kw).count);
  __shared__ float red[GR_MAXW];
  __shared__ float p[GR_MAXE];
  __shared__ u64 wsm[GR_MAXE];
  __shared__ int sid[GR_MAXE];
  __shared__ u32 s_last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wb = blockDim.x >> 5, nt = blockDim.x;
  const int nw = cols >> 2;
  const int unit = blockIdx.x * wb + warp;
  const bool live = unit < experts * kw;
  const int row = live ? unit / kw : 0, q = unit - row * kw;

  // The last block's inputs, whichever block that turns out to be: thread t
  // holds the bias of experts t, t + nt, ... and the hash ids of slots t,
  // t + nt, ... (nt >= 32, so GR_EPL entries cover GR_MAXE).
  float bv[GR_EPL];
  int hv[GR_EPL];
#pragma unroll
  for (int u = 0; u < GR_EPL; u++) {
    const int e = threadIdx.x + u * nt;
    bv[u] = bias && e < experts ? __ldg(bias + e) : 0.f;
    hv[u] = hash && e < k ? hash[e] : 0;
  }

  float acc = 0.f;
  if (live) {
    const uint2 *Wr = W + (long long)row * nw;
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    for (int k0 = q * 32 * GR_U; k0 < nw; k0 += kw * 32 * GR_U) {
      uint2 w[GR_U];
      float4 t[GR_U];
#pragma unroll
      for (int u = 0; u < GR_U; u++) {
        const int kq = k0 + u * 32 + lane;
        if (kq < nw) {
          w[u] = __ldg(Wr + kq);
          t[u] = __ldg(x4 + kq);
        } else {
          w[u].x = 0u;
          w[u].y = 0u;
          t[u].x = t[u].y = t[u].z = t[u].w = 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < GR_U; u++) {
        const int kq = k0 + u * 32 + lane;
        if (kq < nw) {
          const float f[4] = {__int_as_float(w[u].x << 16), __int_as_float(w[u].x & 0xffff0000u),
                              __int_as_float(w[u].y << 16), __int_as_float(w[u].y & 0xffff0000u)};
          const float xv[4] = {t[u].x, t[u].y, t[u].z, t[u].w};
          float pp = 0.f;
#pragma unroll
          for (int c = 0; c < 4; c++) pp = fmaf(f[c], xv[c], pp);
          acc += pp;
        }
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(FULL, acc, o);
  const bool whole = wb >= kw;  // this block holds whole rows
  if (whole) {
    if (lane == 0) red[warp] = acc;
    __syncthreads();
    const int r = blockIdx.x * (wb / kw) + threadIdx.x;
    if (threadIdx.x < wb / kw && r < experts) {
      float s = 0.f;
      for (int j = 0; j < kw; j++) s += red[threadIdx.x * kw + j];
      logits[r] = s;
      __threadfence();  // visible device-wide before this block arrives
    }
  } else if (live && lane == 0) {
    grw_part[unit] = acc;
    __threadfence();
  }
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicInc(&grw_arrivals, gridDim.x - 1) == gridDim.x - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();

  // The last block: every logit (or every unit's sum) is stored.
#pragma unroll
  for (int u = 0; u < GR_EPL; u++) {
    const int e = threadIdx.x + u * nt;
    if (e < experts) {
      float lg;
      if (whole) {
        lg = __ldcg(logits + e);
      } else {
        lg = 0.f;
        for (int j = 0; j < kw; j++) lg += __ldcg(grw_part + e * kw + j);
        logits[e] = lg;
      }
      const float pe = gr_p(lg);
      p[e] = pe;
      wsm[e] = hash ? 0ull : ((u64)gr_rank_key(bias ? pe + bv[u] : pe) << 32) | (u64)(0xffffffffu - (u32)e);
    }
    if (hash && threadIdx.x + u * nt < k) sid[threadIdx.x + u * nt] = hv[u];
  }
  __syncthreads();
  if (warp != 0) return;
  if (!hash) {
    u64 wr[GR_EPL];
#pragma unroll
    for (int u = 0; u < GR_EPL; u++) {
      const int e = lane + 32 * u;
      wr[u] = e < experts ? wsm[e] : 0ull;
    }
    for (int j = 0; j < k; j++) {
      const u64 best = gr_max64(gr_max64(gr_max64(wr[0], wr[1]), gr_max64(wr[2], wr[3])),
                                gr_max64(gr_max64(wr[4], wr[5]), gr_max64(wr[6], wr[7])));
      const u32 hi = __reduce_max_sync(FULL, (u32)(best >> 32));
      const u32 lo = __reduce_max_sync(FULL, (u32)(best >> 32) == hi ? (u32)best : 0u);
      const u64 win = ((u64)hi << 32) | lo;
#pragma unroll
      for (int u = 0; u < GR_EPL; u++)
        if (wr[u] == win) wr[u] = 0ull;
      if (lane == 0) sid[j] = (int)(0xffffffffu - lo);
    }
    __syncwarp();
  }
  float sum = 0.f;
  bool bad = false;
  for (int j = 0; j < k; j++) {  // every lane, route's order
    const int e = sid[j];
    if (e < 0 || e >= experts) {
      bad = true;
      break;
    }
    sum += p[e];
  }
  for (int j = lane; j < k; j += 32) {
    const int e = sid[j];
    ids[j] = e;
    weights[j] = bad ? __int_as_float(0x7fc00000) : p[e] / sum * scale;
  }
}
