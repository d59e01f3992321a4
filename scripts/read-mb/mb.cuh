// mb.cuh: what the read microbenchmarks (scripts/read-mb/*.cu, nvcc on the
// GPU machine; not part of moxie's build) share: the error check, the
// streaming load, the PDL launch and the graph timing loop.
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
// kernel's griddepcontrol.wait orders it after the one before).
inline void pdl_launch(cudaStream_t st, const void *fn, dim3 grid, dim3 block, void **args) {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  cfg.stream = st;
  cfg.gridDim = grid;
  cfg.blockDim = block;
  CK(cudaLaunchKernelExC(&cfg, fn, args));
}

// graph_median_us captures body (which launches rep steps on st) into a
// graph, replays it 3 times to warm, then 25 times timed by events, and
// returns the median microseconds a step.
inline float graph_median_us(cudaStream_t st, int rep, const std::function<void()> &body) {
  cudaGraph_t gr;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  body();
  CK(cudaStreamEndCapture(st, &gr));
  cudaGraphExec_t ge;
  CK(cudaGraphInstantiate(&ge, gr, 0));
  for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(ge, st));
  CK(cudaStreamSynchronize(st));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ts;
  for (int it = 0; it < 25; it++) {
    CK(cudaEventRecord(e0, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ts.push_back(ms * 1000.f / rep);
  }
  std::sort(ts.begin(), ts.end());
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(gr));
  return ts[ts.size() / 2];
}
