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
// from 0. So they are Linear's bits. The last block to store its logits
// computes p_e = sqrt(softplus(logit_e)) for every expert (one per thread),
// and warp 0 picks the experts as route's register path does. Before the
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
    __threadfence();  // the store is visible device-wide before this block arrives
  }
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicInc(&gr_arrivals, gridDim.x - 1) == gridDim.x - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();

  // The last block: every logit is stored. p and the ranking words.
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    const float pe = gr_p(__ldcg(logits + e));
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
