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
// programmatic launch overlaps those fetches with the previous kernel
// (the GemvPair kernels at the end of the file: MOXIE_PDL_WAIT, see there).
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
  const float *nw[GEMV_MAX];  // product i's x RMS-normalized first (gemvm kernels only; null here)
  float eps[GEMV_MAX];
};
static_assert(sizeof(GemvArgs) == 616, "gemvArgs in gemv.go mirrors this layout");

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

// ---------------------------------------------------------------------------
// GemvPair: two dependent FP8-block products in one persistent launch,
// y1 = A·x1 then y2 = B·y1 (either grouped: row group g of a matrix reads
// slice g of its input), as wo_a then wo_b of a decode step.
//
// The grid is at most as many blocks as the device holds at once (the host
// sizes it from the occupancy), so every block is resident and they can
// wait for each other. Block b owns rows [b·rows/G, (b+1)·rows/G) of each
// matrix. Phase 1: its A rows, each warp of a row group one 512-column
// segment (16 bytes a lane) of U rows at a time, x slices in registers;
// the partial sums meet in shared memory and the block writes its y1
// rows. Before the grid-wide barrier (or before phase 1: fill 0) the block
// starts copying the first ns of its B rows into shared memory (cp.async,
// 16 bytes a thread) and asks L2 for the rest (l2pf: after phase 1, or
// before it; optionally all its A rows first, so phase 1's loads, at most
// U·16 bytes a lane in flight, find them in L2), so HBM keeps
// streaming B while the slowest blocks finish phase 1. After the barrier
// it computes its B rows from shared memory and the rest from global
// memory, with y1 read from L2 (ld.global.cg: written in this launch).
//
// The barrier (gp_grid_sync) is a counter and a generation word at bar:
// every block adds 1 to the counter; the last one zeroes it and bumps the
// generation, which the others wait for, so it needs no host reset between
// launches or graph replays (launches of one pair must not overlap). Sums
// are in a fixed order (lane order within 16 columns, shuffle tree, row
// group warps in index order, segments in order): results do not depend on
// timing or on the grid size's effect on anything but which block owns a
// row.

#define GP_WARPS 16

struct GemvPairArgs {
  GemvMat a, b;    // fmt 1 (FP8 blocks), blk0 unused, wpr a power of two <= GP_WARPS
  unsigned *bar;   // [4]: arrivals, generation, timeouts, unused
  int ns;          // most rows of b a block keeps in shared memory
  int redoff;      // byte offset of the partial sums in dynamic shared memory
  int fill;        // 0: start the shared-memory copies before phase 1, 1: after it
  int l2pf;        // ask L2 for the block's b rows beyond ns: 0 no, 1 after phase 1, 2 before
                   // it; +4: first ask L2 for the block's a rows (all of phase 1's bytes)
};
static_assert(sizeof(GemvMat) == 64 && sizeof(GemvPairArgs) == 152, "gemvMat/gemvPairArgs in gemv.go mirror these layouts");

extern __shared__ __align__(128) u8 gp_sm[];

// The rows [r0, r1) of a rows-row matrix that this block owns.
__device__ __forceinline__ void gp_own(int rows, int &r0, int &r1) {
  r0 = (int)((long long)blockIdx.x * rows / gridDim.x);
  r1 = (int)((long long)(blockIdx.x + 1) * rows / gridDim.x);
}

__device__ __forceinline__ u32 gp_saddr(const void *p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// A float4 written in this launch by another block (L2, not L1).
__device__ __forceinline__ float4 gp_ldcg(const float *p) {
  float4 v;
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p) : "memory");
  return v;
}

// Starts copying bytes (a multiple of 16) from src to the start of the
// dynamic shared memory, 16 bytes a thread at a time (one commit group).
__device__ __forceinline__ void gp_fill(const u8 *src, int bytes) {
  const u32 s0 = gp_saddr(gp_sm);
  for (int i = threadIdx.x * 16; i < bytes; i += blockDim.x * 16)
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(s0 + (u32)i), "l"(src + i) : "memory");
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// One L2 prefetch hint per 128-byte line of [p, p+bytes) (p 128-byte aligned).
__device__ __forceinline__ void gp_l2(const u8 *p, long long bytes) {
  for (long long i = threadIdx.x * 128ll; i < bytes; i += blockDim.x * 128ll) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + i));
}

// Local rows [l0, l1) of the block's range of m (row r0 + l, all in one
// group, x that group's slice), the weights of local row l at wb + l·cols
// (shared memory when SM, else global): each warp's partial sum of each of
// its rows to red[l·wpr + part]. XL2: x was written in this launch.
template <int U, bool SM, bool XL2>
__device__ __forceinline__ void gp_rows(const GemvMat &m, const u8 *wb, int r0, int l0, int l1, const float *x, float *red) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wpr = m.wpr, slots = GP_WARPS / wpr, slot = warp / wpr, part = warp - slot * wpr;
  const int segs = m.cols >> 9;
  const long long cols = m.cols;
  float4 xv[4];
  int xseg = -1;
  for (int l = l0 + slot * U; l < l1; l += slots * U) {
    float acc[U];
#pragma unroll
    for (int u = 0; u < U; u++) acc[u] = 0.f;
    for (int sg = part; sg < segs; sg += wpr) {
      const int c = (sg << 9) + lane * 16;
      uint4 v[U];
#pragma unroll
      for (int u = 0; u < U; u++) {
        if (l + u < l1) {
          const u8 *p = wb + (long long)(l + u) * cols + c;
          v[u] = SM ? *(const uint4 *)p : gemv_ld((const uint4 *)p);
        } else {
          v[u] = make_uint4(0u, 0u, 0u, 0u);
        }
      }
      // U <= 16 <= block: the U rows span at most two scale rows.
      const int s0 = (r0 + l) >> m.bshift, s1 = (r0 + min(l + U, l1) - 1) >> m.bshift;
      const float sc0 = gemv_e8m0(__ldg(m.s + (long long)s0 * m.sstride + (c >> m.bshift)));
      const float sc1 = gemv_e8m0(__ldg(m.s + (long long)s1 * m.sstride + (c >> m.bshift)));
      if (sg != xseg) {
#pragma unroll
        for (int q = 0; q < 4; q++) xv[q] = XL2 ? gp_ldcg(x + c + 4 * q) : __ldg((const float4 *)(x + c) + q);
        xseg = sg;
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        if (l + u < l1) acc[u] = fmaf(gemv_dot_fp8(v[u], xv), ((r0 + l + u) >> m.bshift) == s0 ? sc0 : sc1, acc[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[u] += __shfl_xor_sync(0xffffffffu, acc[u], o);
    }
    if (lane == 0) {
#pragma unroll
      for (int u = 0; u < U; u++)
        if (l + u < l1) red[(l + u) * wpr + part] = acc[u];
    }
  }
}

// gp_rows over local rows [l0, l1), split where the row group changes.
template <int U, bool SM, bool XL2>
__device__ __forceinline__ void gp_range(const GemvMat &m, const u8 *wb, int r0, int l0, int l1, float *red) {
  while (l0 < l1) {
    const int g = (r0 + l0) / m.rpg;
    const int e = min(l1, (g + 1) * m.rpg - r0);
    gp_rows<U, SM, XL2>(m, wb, r0, l0, e, m.x + (long long)g * m.cols, red);
    l0 = e;
  }
}

// y[r0 + t] = Σ_p red[t·wpr + p] (p in order) for t < n; after a __syncthreads.
__device__ __forceinline__ void gp_store(const GemvMat &m, int r0, int n, const float *red) {
  for (int t = threadIdx.x; t < n; t += blockDim.x) {
    float s = 0.f;
    for (int p = 0; p < m.wpr; p++) s += red[t * m.wpr + p];
    m.y[r0 + t] = s;
  }
}

#ifndef GP_TIMEOUT_NS
#define GP_TIMEOUT_NS 1000000000ull
#endif

// Grid-wide barrier on bar (arrivals, generation, timeouts); the y1 stores
// of every block before it are visible to every block after it. A block
// that waits longer than GP_TIMEOUT_NS adds 1 to bar[2] and goes on (a
// late block still zeroes the count and bumps the generation when it
// arrives, so later launches are unaffected).
__device__ __forceinline__ void gp_grid_sync(unsigned *bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned gen, old;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(gen) : "l"(bar + 1) : "memory");
    __threadfence();
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(bar) : "memory");
    if (old == gridDim.x - 1) {
      // Every block has arrived (and read gen): zero the count for the
      // next launch, then release the others.
      asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(bar), "r"(0u) : "memory");
      asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(bar + 1), "r"(gen + 1u) : "memory");
    } else {
      unsigned g;
      unsigned long long t0, t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
      do {
        asm volatile("nanosleep.u32 32;" ::: "memory");
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(g) : "l"(bar + 1) : "memory");
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (g == gen && t - t0 > GP_TIMEOUT_NS) {
          // Not every block arrived within a second (not all resident?):
          // count it and go on rather than hang (results are then wrong).
          atomicAdd(bar + 2, 1u);
          break;
        }
      } while (g == gen);
    }
    __threadfence();
  }
  __syncthreads();
}

template <int U>
__device__ __forceinline__ void gp_phase1(const GemvPairArgs &a) {
  float *red = (float *)(gp_sm + a.redoff);
  int r0, r1, q0, q1;
  gp_own(a.a.rows, r0, r1);
  gp_own(a.b.rows, q0, q1);
  const int ns = max(0, min(a.ns, q1 - q0));
  const u8 *wb = a.b.w + (long long)q0 * a.b.cols;
  if (a.l2pf & 4) gp_l2(a.a.w + (long long)r0 * a.a.cols, (long long)(r1 - r0) * a.a.cols);
  if (a.fill == 0) gp_fill(wb, ns * a.b.cols);
  if ((a.l2pf & 3) == 2) gp_l2(wb + (long long)ns * a.b.cols, (long long)(q1 - q0 - ns) * a.b.cols);
  gp_range<U, false, false>(a.a, a.a.w + (long long)r0 * a.a.cols, r0, 0, r1 - r0, red);
  if (a.fill != 0) gp_fill(wb, ns * a.b.cols);
  if ((a.l2pf & 3) == 1) gp_l2(wb + (long long)ns * a.b.cols, (long long)(q1 - q0 - ns) * a.b.cols);
  __syncthreads();
  gp_store(a.a, r0, r1 - r0, red);
}

template <int U>
__device__ __forceinline__ void gp_phase2(const GemvPairArgs &a) {
  float *red = (float *)(gp_sm + a.redoff);
  int q0, q1;
  gp_own(a.b.rows, q0, q1);
  const int ns = max(0, min(a.ns, q1 - q0));
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
  gp_range<U, true, true>(a.b, gp_sm, q0, 0, ns, red);
  gp_range<U, false, true>(a.b, a.b.w + (long long)q0 * a.b.cols, q0, ns, q1 - q0, red);
  __syncthreads();
  gp_store(a.b, q0, q1 - q0, red);
}

// Each kernel waits for the previous one (MOXIE_PDL_WAIT) and lets the next
// launch only after the barrier, when all its blocks are resident.
#define GEMV_PAIR(U)                                                                          \
  extern "C" __global__ void __launch_bounds__(32 * GP_WARPS, 1) gemv_pair_u##U(const GemvPairArgs a) { \
    MOXIE_PDL_WAIT();                                                                         \
    gp_phase1<U>(a);                                                                          \
    gp_grid_sync(a.bar);                                                                      \
    MOXIE_PDL_TRIGGER();                                                                      \
    gp_phase2<U>(a);                                                                          \
  }
GEMV_PAIR(4)
GEMV_PAIR(8)
