// splitk.cu: could the MoE stream as one kernel with no hand-over, by
// splitting stage 2 along the intermediate dimension? A feasibility read
// for scripts/read-mb/run.sh (nvcc on the GPU machine; not part of moxie's
// build). Session 19 found the hand-over between the MoE's two launches
// (every stage-2 block needs all of stage 1's output h) to be its limit:
// after stage 1, stage 2 costs ~16 us whatever it does alone, and a work
// queue that lets stage 2 start per expert lost with the math.
//
// Split-K: y = Σ_e W2_e h_e = Σ_e Σ_tiles W2_e[:, tile] h_e[tile]. A block
// that makes R rows of h_e (its stage-1 tile: R rows of w1 and w3) can at
// once multiply them into the R columns of W2_e that they meet (a slice of
// 4096 × R, contiguous if W2 is repacked column-slice-major at load) and
// store a 4096-float partial; a second, small kernel sums the partials in
// tile order (the same bits every run). No block waits for another; the
// cost is the partials' write and read (448 × 16 KB = 7.3 MB at R = 32).
//
// Bytes only (no scales, no math; V4-Flash shapes: 6 routed MXFP4 experts
// and the shared FP8 one, D 4096, I 2048; 100.7 MB a step), each a PDL
// graph of REP = 16 steps over disjoint copies, median µs a step of 25
// replays:
//   two:        stage 1 (a block a 16-row tile), then stage 2 (a block a
//               16-row group of y, reading all 7 experts' rows): moxie's
//               order;
//   splitk R:   one kernel, a block a tile of R rows of one expert, reading
//               its w1/w3 rows then its W2 slice and storing its partial;
//               then the reduce kernel;
//   splitk R, no reduce: the first kernel alone (the reduce's cost);
//   splitk R, W2 natural: W2 read in place, row-major (16-32 bytes of
//               each 1-2 KB row), not repacked;
//   one:        a plain read of the same bytes (the floor).
// Session 20 added, for why queue.cu's two-kernel order of the same bytes
// is slower (33.4 us against 28.7): stage 2 an expert at a time (k_s2x),
// stage 1 held to 32 registers (k_s1o8: 8 blocks an SM, as queue.cu's
// k_s1 compiles; k_s1 has 37: 6 blocks), and each stage alone. ONLY_TWO=1
// stops after those.
#include "mb.cuh"

#define NE 7  // experts; NE-1 is the shared one
#define DD 4096
#define II 2048

__host__ __device__ inline size_t row1(int e) { return e == NE - 1 ? DD : DD / 2; }  // a w1/w3 row's bytes
__host__ __device__ inline size_t s1_bytes(int e) { return (size_t)II * 2 * row1(e); }
__host__ __device__ inline size_t s2_bytes(int e) { return (size_t)DD * (e == NE - 1 ? II : II / 2); }

struct Step {
  const u8 *s1[NE];  // expert e's w1 and w3 rows, tile-contiguous
  const u8 *s2[NE];  // expert e's w2
  float *part;       // [tiles][DD]
  float *y;          // [DD]
  u32 *out;
};

// Stage 1 of the two-kernel order: block i a 16-row tile, the shared expert's first.
__device__ __forceinline__ void s1_tile(const Step &s) {
  const int t = II / 16, i = blockIdx.x;
  const int e = i < t ? NE - 1 : (i - t) / t, j = i < t ? i : (i - t) % t;
  const size_t tb = 16 * 2 * row1(e);
  const u32 f = block_read(s.s1[e] + j * tb, tb);
  if (f == 0x9e3779b9u) s.out[0] = f;
}
__global__ void __launch_bounds__(256) k_s1(Step s) {
  pdl_wait_launch();
  s1_tile(s);
}
// k_s1 held to 32 registers (8 blocks an SM; k_s1 has 37: 6 blocks): queue.cu's
// k_s1 compiles to 32.
__global__ void __launch_bounds__(256, 8) k_s1o8(Step s) {
  pdl_wait_launch();
  s1_tile(s);
}

// Stage 2 of the two-kernel order: block rg the 16 rows of y it makes, all
// 7 experts' w2 rows. BAR (k_s2x): a barrier after each expert's fold, so
// the next expert's loads are not issued before the last expert's arrive
// (for why queue.cu's two-kernel order, 33.4 us, is slower than this
// file's, 28.7, on the same bytes).
template <bool BAR>
__device__ __forceinline__ void s2_rows(const Step &s) {
  u32 f = 0;
  for (int e = 0; e < NE; e++) {
    const size_t wb = s2_bytes(e) / (DD / 16);
    f ^= block_read(s.s2[e] + blockIdx.x * wb, wb);
    if (BAR) {
      if (f == 0x9e3779b9u) s.out[1] = f;
      __syncthreads();
    }
  }
  if (f == 0x9e3779b9u) s.out[0] = f;
}
__global__ void __launch_bounds__(256) k_s2(Step s) {
  pdl_wait_launch();
  s2_rows<false>(s);
}
__global__ void __launch_bounds__(256) k_s2x(Step s) {
  pdl_wait_launch();
  s2_rows<true>(s);
}

// Split-K, R rows a tile: block i reads tile j of expert e's w1/w3 and its
// W2 slice, then stores a 4096-float partial (from the fold, so nothing is
// optimised away).
template <int R>
__global__ void __launch_bounds__(256) k_sk(Step s) {
  pdl_wait_launch();
  const int t = II / R, i = blockIdx.x;
  const int e = i < t ? NE - 1 : (i - t) / t, j = i < t ? i : (i - t) % t;
  const size_t tb = R * 2 * row1(e), wb = s2_bytes(e) / t;
  u32 f = block_read(s.s1[e] + j * tb, tb);
  f ^= block_read(s.s2[e] + j * wb, wb);
  float *p = s.part + (size_t)i * DD;
#pragma unroll
  for (int k = 0; k < DD / 256; k++) p[k * 256 + threadIdx.x] = __uint_as_float((f & 0x007fffffu) | 0x3f800000u);
}

// Split-K with W2 in its natural layout (row-major [4096][I] MXFP4 or FP8):
// a tile's slice is R/2 (routed) or R (shared) bytes of every row, so its
// reads are 16-32 bytes a row at a 1-2 KB stride.
template <int R>
__global__ void __launch_bounds__(256) k_skn(Step s) {
  pdl_wait_launch();
  const int t = II / R, i = blockIdx.x;
  const int e = i < t ? NE - 1 : (i - t) / t, j = i < t ? i : (i - t) % t;
  const size_t tb = R * 2 * row1(e);
  u32 f = block_read(s.s1[e] + j * tb, tb);
  const int rowb = e == NE - 1 ? II : II / 2, sl = e == NE - 1 ? R : R / 2, P = sl / 16;
  const u8 *w2 = s.s2[e] + (size_t)j * sl;
  for (int o = 0; o < DD * P; o += 4 * 256) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const int idx = o + k * 256 + threadIdx.x, row = idx / P, q = idx - row * P;
      v[k] = ldnc(w2 + (size_t)row * rowb + q * 16);
    }
#pragma unroll
    for (int k = 0; k < 4; k++) f ^= fold4(v[k]);
  }
  float *p = s.part + (size_t)i * DD;
#pragma unroll
  for (int k = 0; k < DD / 256; k++) p[k * 256 + threadIdx.x] = __uint_as_float((f & 0x007fffffu) | 0x3f800000u);
}

// The reduce: block b sums y[32b, 32b + 32) over n partials in a fixed
// order (warp w the tiles w, w + 8, …; then the 8 warps in order).
__global__ void __launch_bounds__(256) k_red(Step s, int n) {
  pdl_wait_launch();
  __shared__ float red[8][32];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, c = blockIdx.x * 32 + lane;
  float a = 0.f;
  int t = w;
  for (; t + 56 < n; t += 64) {
    float v[8];
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = __ldcg(s.part + (size_t)(t + 8 * k) * DD + c);
#pragma unroll
    for (int k = 0; k < 8; k++) a += v[k];
  }
  for (; t < n; t += 8) a += __ldcg(s.part + (size_t)t * DD + c);
  red[w][lane] = a;
  __syncthreads();
  if (w == 0) {
    float y = 0.f;
#pragma unroll
    for (int k = 0; k < 8; k++) y += red[k][lane];
    s.y[c] = y;
  }
}

int main() {
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int REP = 16;
  size_t stepB = 0;
  for (int e = 0; e < NE; e++) stepB += s1_bytes(e) + s2_bytes(e);
  u8 *buf;
  CK(cudaMalloc(&buf, stepB * REP));
  CK(cudaMemset(buf, 1, stepB * REP));
  const int maxTiles = NE * (II / 16);
  float *part, *y;
  CK(cudaMalloc(&part, (size_t)REP * maxTiles * DD * 4));
  CK(cudaMalloc(&y, (size_t)REP * DD * 4));
  u32 *out;
  CK(cudaMalloc(&out, 64));
  std::vector<Step> steps(REP);
  for (int r = 0; r < REP; r++) {
    u8 *p = buf + stepB * r;
    for (int e = 0; e < NE; e++) {
      steps[r].s1[e] = p;
      p += s1_bytes(e);
      steps[r].s2[e] = p;
      p += s2_bytes(e);
    }
    steps[r].part = part + (size_t)r * maxTiles * DD;
    steps[r].y = y + (size_t)r * DD;
    steps[r].out = out;
  }
  printf("device SMs %d, %.1f MB a step\n", sms, stepB / 1e6);
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const dim3 b256(256);
  auto report = [&](const char *name, float us) { printf("%-48s %7.2f us a step (%.2f TB/s of the weights)\n", name, us, stepB / (us * 1e6)); };
  report("two kernels (stage 1, then stage 2)", graph_median_us(st, REP, [&] {
           for (int r = 0; r < REP; r++) {
             void *a[1] = {&steps[r]};
             pdl_launch(st, (const void *)k_s1, dim3(NE * (II / 16)), b256, a);
             pdl_launch(st, (const void *)k_s2, dim3(DD / 16), b256, a);
           }
         }));
  report("two kernels, stage 2 an expert at a time", graph_median_us(st, REP, [&] {
           for (int r = 0; r < REP; r++) {
             void *a[1] = {&steps[r]};
             pdl_launch(st, (const void *)k_s1, dim3(NE * (II / 16)), b256, a);
             pdl_launch(st, (const void *)k_s2x, dim3(DD / 16), b256, a);
           }
         }));
  report("two kernels, stage 1 at 8 blocks an SM", graph_median_us(st, REP, [&] {
           for (int r = 0; r < REP; r++) {
             void *a[1] = {&steps[r]};
             pdl_launch(st, (const void *)k_s1o8, dim3(NE * (II / 16)), b256, a);
             pdl_launch(st, (const void *)k_s2, dim3(DD / 16), b256, a);
           }
         }));
  const struct {
    const char *name;
    const void *fn;
    int grid;
  } alone[] = {{"stage 1 alone", (const void *)k_s1, NE * (II / 16)},
               {"stage 1 alone, 8 blocks an SM", (const void *)k_s1o8, NE * (II / 16)},
               {"stage 2 alone", (const void *)k_s2, DD / 16},
               {"stage 2 alone, an expert at a time", (const void *)k_s2x, DD / 16}};
  for (const auto &k : alone) {
    const float us = graph_median_us(st, REP, [&] {
      for (int r = 0; r < REP; r++) {
        void *a[1] = {&steps[r]};
        pdl_launch(st, k.fn, dim3(k.grid), b256, a);
      }
    });
    printf("%-48s %7.2f us\n", k.name, us);
  }
  if (getenv("ONLY_TWO")) return 0;
  struct SK {
    int r;
    const void *fn;
    bool natural;
  } sks[] = {{16, (const void *)k_sk<16>, false}, {32, (const void *)k_sk<32>, false}, {64, (const void *)k_sk<64>, false},
             {32, (const void *)k_skn<32>, true}, {64, (const void *)k_skn<64>, true}};
  for (const SK &k : sks) {
    const int tiles = NE * (II / k.r);
    for (int red = 1; red >= 0; red--) {
      char name[80];
      snprintf(name, sizeof name, "splitk %d rows (%d tiles)%s%s", k.r, tiles, k.natural ? ", W2 natural" : "", red ? " + reduce" : ", no reduce");
      report(name, graph_median_us(st, REP, [&] {
               for (int r = 0; r < REP; r++) {
                 void *a[1] = {&steps[r]};
                 pdl_launch(st, k.fn, dim3(tiles), b256, a);
                 if (red) {
                   int n = tiles;
                   void *b[2] = {&steps[r], &n};
                   pdl_launch(st, (const void *)k_red, dim3(DD / 32), b256, b);
                 }
               }
             }));
    }
  }
  {
    int n = NE * (II / 32);
    report("reduce alone (448 partials)", graph_median_us(st, REP, [&] {
             for (int r = 0; r < REP; r++) {
               void *b[2] = {&steps[r], &n};
               pdl_launch(st, (const void *)k_red, dim3(DD / 32), b256, b);
             }
           }));
  }
  report("one plain read (the floor)", graph_median_us(st, REP, [&] {
           for (int r = 0; r < REP; r++) {
             const u8 *p = steps[r].s1[0];
             long long n = (long long)stepB;
             void *b[3] = {&p, &n, &out};
             pdl_launch(st, (const void *)k_one, dim3(sms * 8), b256, b);
           }
         }));
  return 0;
}
