// mb.cuh: what the nvcc microbenchmarks (scripts/read-mb/*.cu,
// scripts/moe-mb/harness.cu, scripts/flag-mb/flag.cu; built on the GPU
// machine, not part of moxie's build) share: the error check, the
// streaming load and block read, the PDL launch and the timing loops.
#pragma once
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#define CK(x)                                                                            \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

typedef unsigned int u32;
typedef unsigned char u8;

// ldnc: a 16-byte read-only load with moxie's ldw hint (L2::256B).
__device__ __forceinline__ uint4 ldnc(const void *p) {
  uint4 v;
  asm volatile("ld.global.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ u32 fold4(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

__device__ __forceinline__ void pdl_wait_launch() { asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory"); }

// pdl_launch launches fn on st with programmatic stream serialization (the
// kernel's griddepcontrol.wait orders it after the one before) and smem
// bytes of dynamic shared memory.
inline void pdl_launch(cudaStream_t st, const void *fn, dim3 grid, dim3 block, void **args, size_t smem = 0) {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  cfg.stream = st;
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  CK(cudaLaunchKernelExC(&cfg, fn, args));
}

// times_us runs run() n times on st, each between two events, and returns
// the microseconds of each divided by div, sorted.
inline std::vector<float> times_us(cudaStream_t st, int n, float div, const std::function<void()> &run) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ts;
  for (int it = 0; it < n; it++) {
    CK(cudaEventRecord(e0, st));
    run();
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ts.push_back(ms * 1000.f / div);
  }
  std::sort(ts.begin(), ts.end());
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return ts;
}

// graph_times_us captures body (which launches rep steps on st) into a
// graph, replays it 3 times to warm, then 25 times timed, and returns the
// microseconds a step of each replay, sorted.
inline std::vector<float> graph_times_us(cudaStream_t st, int rep, const std::function<void()> &body) {
  cudaGraph_t gr;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  body();
  CK(cudaStreamEndCapture(st, &gr));
  cudaGraphExec_t ge;
  CK(cudaGraphInstantiate(&ge, gr, 0));
  for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(ge, st));
  CK(cudaStreamSynchronize(st));
  std::vector<float> ts = times_us(st, 25, (float)rep, [&] { CK(cudaGraphLaunch(ge, st)); });
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(gr));
  return ts;
}

// graph_median_us is graph_times_us' median.
inline float graph_median_us(cudaStream_t st, int rep, const std::function<void()> &body) {
  const std::vector<float> ts = graph_times_us(st, rep, body);
  return ts[ts.size() / 2];
}

#ifdef __CUDACC__
// block_read: a block of 256 threads reads n bytes (a multiple of 16 KB)
// at p, 4 loads of 16 bytes a thread in flight, and returns their fold.
__device__ __forceinline__ u32 block_read(const u8 *p, size_t n) {
  u32 f = 0;
  for (size_t o = 0; o < n; o += 4 * 4096) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; k++) v[k] = ldnc(p + o + (k * 256 + threadIdx.x) * 16);
#pragma unroll
    for (int k = 0; k < 4; k++) f ^= fold4(v[k]);
  }
  return f;
}

// k_one: a plain read of n bytes at p by a grid of 256-thread blocks, 16 KB
// a block a round (the floor the other orders are measured against).
__global__ void __launch_bounds__(256) k_one(const u8 *p, long long n, u32 *out) {
  pdl_wait_launch();
  u32 f = 0;
  const long long per = 4LL * 4096;
  for (long long o = (long long)blockIdx.x * per; o < n; o += (long long)gridDim.x * per) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; k++) v[k] = ldnc(p + o + (k * 256 + threadIdx.x) * 16);
#pragma unroll
    for (int k = 0; k < 4; k++) f ^= fold4(v[k]);
  }
  if (f == 0x9e3779b9u) out[0] = f;
}
#endif
