// queue.cu: could the MoE's two stages stream as one? A feasibility read
// for scripts/read-mb/run.sh (nvcc on the GPU machine; not part of moxie's
// build). The MoE decode is two launches today (stage 1: w1/w3 tiles of 6
// routed experts and the shared one; stage 2: w2, whose every block needs
// all of stage 1's output h); after stage 1, stage 2 costs ~16 us of a ~41
// us pair, while 105 MB at the read floor of one kernel would take ~25.
//
// Here the MoE's bytes (V4-Flash shapes: routed w1+w3 tiles of 16 rows ×
// 4096 columns MXFP4, 64 KB each, 128 an expert; shared FP8 tiles 128 KB;
// w2 row groups of 16 rows × 1 KB an expert, 2 KB shared; no scales, no
// math) are read three ways, each a PDL graph of REP = 16 steps over
// disjoint copies (every byte from HBM), median µs a step of 25 replays:
//   two:    a stage-1 read kernel (a block a tile) then a stage-2 read
//           kernel (a block a row group reading all 7 experts' w2 rows),
//           the second waiting for the first (griddepcontrol.wait);
//   queue:  one persistent kernel (every block resident) taking items from
//           an atomic counter: first every stage-1 tile (shared expert's
//           first, then expert-major), each adding one to its expert's
//           ready count when read; then (row group, expert) items of
//           stage 2, expert-major, each loading its rows first and then
//           waiting (ld.acquire spin) for its expert's tiles to be ready
//           before it "uses" them: stage 2 of the first experts streams
//           while stage 1 of the last still runs. No deadlock: every
//           stage-1 item is taken before any stage-2 item, by a resident
//           block that finishes it without waiting.
//   one:    a plain read of the same total bytes (the floor).
// Counters live per step; each queue kernel zeroes the next step's (the
// last step the first's, for the next replay; a memset before the first).
// The fold of the bytes is written so nothing is optimised away.
#include "mb.cuh"
#include <string>

__device__ __forceinline__ u32 ld_acquire(const u32 *p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_add(u32 *p, u32 v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Shapes: NE experts (expert NE-1 is the shared one), T tiles an expert,
// RG row groups.
#define NE 7
#define T 128
#define RG 256
#define TB_R (64 << 10)   // a routed w1+w3 tile
#define TB_S (128 << 10)  // a shared one
#define W2_R (16 << 10)   // a routed expert's w2 rows of one row group
#define W2_S (32 << 10)   // the shared expert's

struct Step {
  const u8 *s1[NE];  // expert e's T tiles, contiguous
  const u8 *s2[NE];  // expert e's w2, RG row groups contiguous
  u32 *ctr;          // [0] the item counter, [1 + e] expert e's ready tiles
  u32 *next;         // the next step's counters (zeroed here: that step starts after this one ends)
  u32 *out;
};

__device__ __forceinline__ void s1_item(const Step &s, int i, u32 &f) {
  // items: shared expert's tiles first, then routed expert-major
  const int e = i < T ? NE - 1 : (i - T) / T, j = i < T ? i : (i - T) % T;
  const int tb = e == NE - 1 ? TB_S : TB_R;
  f ^= block_read(s.s1[e] + (size_t)j * tb, tb);
}

__global__ void __launch_bounds__(256) k_s1(Step s) {
  pdl_wait_launch();
  u32 f = 0;
  s1_item(s, blockIdx.x, f);
  if (f == 0x9e3779b9u) s.out[0] = f;
}

__global__ void __launch_bounds__(256) k_s2(Step s) {
  pdl_wait_launch();
  u32 f = 0;
  const int rg = blockIdx.x;
  for (int e = 0; e < NE; e++) {
    const int wb = e == NE - 1 ? W2_S : W2_R;
    f ^= block_read(s.s2[e] + (size_t)rg * wb, wb);
  }
  if (f == 0x9e3779b9u) s.out[0] = f;
}

__global__ void __launch_bounds__(256) k_queue(Step s) {
  pdl_wait_launch();
  __shared__ int item;
  const int n1 = NE * T, n2 = NE * RG;
  if (blockIdx.x == 0 && threadIdx.x < 1 + NE) s.next[threadIdx.x] = 0u;
  u32 f = 0;
  for (;;) {
    if (threadIdx.x == 0) item = atomicAdd(s.ctr, 1u);
    __syncthreads();
    const int i = item;
    __syncthreads();
    if (i >= n1 + n2) break;
    if (i < n1) {
      s1_item(s, i, f);
      __syncthreads();  // the block's reads are done
      if (threadIdx.x == 0) {
        const int e = i < T ? NE - 1 : (i - T) / T;
        red_release_add(s.ctr + 1 + e, 1u);
      }
      continue;
    }
    // stage 2: (expert, row group), the shared expert last
    const int k = i - n1, e = k / RG, rg = k % RG;
    const int wb = e == NE - 1 ? W2_S : W2_R;
    const u8 *p = s.s2[e] + (size_t)rg * wb;
    // the rows first (they do not depend on h), then the wait, then "use"
    uint4 v[4];
    const int rounds = wb / 16384;
    u32 g = 0;
    for (int o = 0; o < rounds; o++) {
#pragma unroll
      for (int q = 0; q < 4; q++) v[q] = ldnc(p + o * 16384 + (q * 256 + threadIdx.x) * 16);
      if (o == 0 && threadIdx.x == 0)
        while (ld_acquire(s.ctr + 1 + e) < (u32)T) __nanosleep(32);
      if (o == 0) __syncthreads();
#pragma unroll
      for (int q = 0; q < 4; q++) g ^= fold4(v[q]);
    }
    f ^= g;
  }
  if (f == 0x9e3779b9u) s.out[0] = f;
}

int main() {
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int REP = 16;
  size_t s1b = 0, s2b = 0;
  for (int e = 0; e < NE; e++) {
    s1b += (size_t)T * (e == NE - 1 ? TB_S : TB_R);
    s2b += (size_t)RG * (e == NE - 1 ? W2_S : W2_R);
  }
  const size_t stepB = s1b + s2b;
  u8 *buf;
  CK(cudaMalloc(&buf, stepB * REP));
  CK(cudaMemset(buf, 1, stepB * REP));
  u32 *ctr, *out;
  CK(cudaMalloc(&ctr, REP * 16 * 4));
  CK(cudaMalloc(&out, 64));
  std::vector<Step> steps(REP);
  // LAYOUT=interleaved: each expert's w1/w3 then its w2 (moxie's arena and
  // the moe-mb harness); otherwise every expert's w1/w3, then every w2.
  const char *lay = getenv("LAYOUT");
  const bool inter = lay && std::string(lay) == "interleaved";
  printf("layout: %s\n", inter ? "interleaved (expert by expert)" : "grouped (all w1/w3, then all w2)");
  for (int r = 0; r < REP; r++) {
    u8 *p = buf + stepB * r;
    for (int e = 0; e < NE; e++) {
      steps[r].s1[e] = p;
      p += (size_t)T * (e == NE - 1 ? TB_S : TB_R);
      if (inter) {
        steps[r].s2[e] = p;
        p += (size_t)RG * (e == NE - 1 ? W2_S : W2_R);
      }
    }
    for (int e = 0; !inter && e < NE; e++) {
      steps[r].s2[e] = p;
      p += (size_t)RG * (e == NE - 1 ? W2_S : W2_R);
    }
    steps[r].ctr = ctr + r * 16;
    steps[r].next = ctr + ((r + 1) % REP) * 16;
    steps[r].out = out;
  }
  int occ;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k_queue, 256, 0));
  printf("device SMs %d, stage 1 %.1f MB, stage 2 %.1f MB a step; queue kernel %d blocks an SM\n", sms, s1b / 1e6, s2b / 1e6, occ);
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  auto launch = [&](const void *fn, dim3 g, void **args) { pdl_launch(st, fn, g, dim3(256), args); };
  for (int mode = 0; mode < 4; mode++) {
    CK(cudaMemsetAsync(ctr, 0, REP * 16 * 4, st));
    CK(cudaStreamSynchronize(st));
    const float med = graph_median_us(st, REP, [&] {
      for (int r = 0; r < REP; r++) {
        void *a[1] = {&steps[r]};
        if (mode == 0) {
          launch((const void *)k_s1, dim3(NE * T), a);
          launch((const void *)k_s2, dim3(RG), a);
        } else if (mode == 1 || mode == 2) {
          launch((const void *)k_queue, dim3(sms * (mode == 1 ? occ : std::max(1, occ / 2))), a);
        } else {
          const u8 *p = steps[r].s1[0];
          long long n = (long long)stepB;
          void *b[3] = {&p, &n, &out};
          launch((const void *)k_one, dim3(sms * 8), b);
        }
      }
    });
    const char *nm[] = {"two kernels (stage 1, then stage 2)", "queue, all blocks an SM", "queue, half the blocks an SM", "one plain read (the floor)"};
    printf("%-40s %7.2f us a step (%.2f TB/s)\n", nm[mode], med, stepB / (med * 1e6));
    if (mode == 1 || mode == 2) {  // step 1's counters after the last replay (zeroed by step 0, then used)
      u32 h[16];
      CK(cudaMemcpy(h, ctr + 16, sizeof h, cudaMemcpyDeviceToHost));
      printf("  counters: items taken %u (of %d, plus one a block at the end), ready tiles", h[0], NE * T + NE * RG);
      for (int e = 0; e < NE; e++) printf(" %u", h[1 + e]);
      printf("\n");
    }
  }
  return 0;
}
