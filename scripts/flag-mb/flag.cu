// flag.cu: what a dependency costs on the GPU, for deciding whether a
// persistent decode-layer kernel (blocks that stay resident and wait on
// flags in global memory) could beat a chain of launches with programmatic
// dependent launch (PDL). Written for scripts/flag-mb/run.sh (nvcc on the
// GPU machine; not part of moxie's build).
//
// Every case runs a chain of N dependent steps; each step's blocks read one
// word the previous step wrote and write one word, so the chain carries a
// real data dependency. Reported: device microseconds a step (CUDA events,
// median of REPS replays), for
//   launch:   N launches of a G-block kernel in a graph, plain stream order
//   pdl:      the same with programmatic dependent launch (each kernel
//             triggers its dependents first, then waits)
//   barrier:  one persistent kernel of G blocks, N phases separated by a
//             counter barrier (each block's red.release.gpu.add, then every
//             block polls with ld.acquire.gpu until all G have arrived)
//   p2p:      one persistent kernel of G blocks, N phases, each block
//             waiting only for one other block's flag of the phase before
//             (a point-to-point dependency, the least a phase can cost)
//   pingpong: two blocks (different SMs) passing a token back and forth
//             N times; a one-way hop
// for G = 132 (one block an SM on an H200) and G = 528 where it fits.
#include "../read-mb/mb.cuh"  // CK, the timing loops

__device__ __forceinline__ u32 ld_acquire(const u32 *p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(u32 *p, u32 v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void red_release_add(u32 *p, u32 v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// step: one link of a launched chain. Block b reads src[b ^ 1] (another
// block's word of the step before) and writes dst[b].
__global__ void step(const u32 *src, u32 *dst, int pdl) {
  if (pdl) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
  }
  if (threadIdx.x == 0) {
    const int b = blockIdx.x;
    const int o = (b ^ 1) < (int)gridDim.x ? (b ^ 1) : b;
    dst[b] = src[o] + 1;
  }
}

// barrier_chain: n phases in one launch; buf[phase & 1][block] carries the
// data; cnt counts arrivals over all phases.
__global__ void barrier_chain(u32 *buf, u32 *cnt, int n) {
  const int G = gridDim.x, b = blockIdx.x;
  for (int p = 0; p < n; p++) {
    if (threadIdx.x == 0) {
      const u32 *src = buf + (p & 1) * G;
      u32 *dst = buf + ((p + 1) & 1) * G;
      const int o = (b ^ 1) < G ? (b ^ 1) : b;
      dst[b] = src[o] + 1;
      red_release_add(cnt, 1);
      const u32 want = (u32)(p + 1) * G;
      while (ld_acquire(cnt) < want) {
      }
    }
    __syncthreads();
  }
}

// p2p_chain: n phases; block b publishes flag[b] = phase+1 after writing
// its word, and waits for flag[partner] >= phase+1 before the next phase.
__global__ void p2p_chain(u32 *buf, u32 *flag, int n) {
  const int G = gridDim.x, b = blockIdx.x;
  const int o = (b + G / 2) % G;  // a block on another SM
  for (int p = 0; p < n; p++) {
    if (threadIdx.x == 0) {
      const u32 *src = buf + (p & 1) * G;
      u32 *dst = buf + ((p + 1) & 1) * G;
      dst[b] = src[o] + 1;
      st_release(flag + b, (u32)(p + 1));
      while (ld_acquire(flag + o) < (u32)(p + 1)) {
      }
    }
    __syncthreads();
  }
}

// pingpong: block 0 and block 1 hand a token back and forth n times.
__global__ void pingpong(u32 *tok, int n) {
  if (threadIdx.x != 0) return;
  const int b = blockIdx.x;
  for (int i = 0; i < n; i++) {
    const u32 want = 2 * i + b;  // block 0 moves on even values, block 1 on odd
    while (ld_acquire(tok) != want) {
    }
    st_release(tok, want + 1);
  }
}

int main() {
  const int N = 64, REPS = 21;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device %s, %d SMs\n", prop.name, sms);
  u32 *buf, *cnt;
  CK(cudaMalloc(&buf, 2 * 4096 * sizeof(u32)));
  CK(cudaMalloc(&cnt, 4096 * sizeof(u32)));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto timed = [&](const std::function<void()> &run) {
    const std::vector<float> ts = times_us(s, REPS, 1.f, run);
    return ts[ts.size() / 2];
  };

  for (int G : {sms, 4 * sms}) {
    for (int pdl = 0; pdl < 2; pdl++) {
      cudaGraph_t g;
      cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
      for (int i = 0; i < N; i++) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(G);
        cfg.blockDim = dim3(128);
        cfg.stream = s;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at;
        cfg.numAttrs = pdl ? 1 : 0;
        const u32 *src = buf + (i & 1) * 4096;
        u32 *dst = buf + ((i + 1) & 1) * 4096;
        CK(cudaLaunchKernelEx(&cfg, step, src, dst, pdl));
      }
      CK(cudaStreamEndCapture(s, &g));
      CK(cudaGraphInstantiate(&ge, g, 0));
      CK(cudaGraphLaunch(ge, s));
      CK(cudaStreamSynchronize(s));
      const float us = timed([&] { CK(cudaGraphLaunch(ge, s)); });
      printf("%-8s G=%4d  %7.3f us a step (%d steps, graph %.1f us)\n", pdl ? "pdl" : "launch", G, us / N, N, us);
      CK(cudaGraphExecDestroy(ge));
      CK(cudaGraphDestroy(g));
    }
    // Persistent kernels need every block resident at once.
    int per = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, barrier_chain, 128, 0));
    if (per * sms < G) {
      printf("barrier  G=%4d  skipped: %d blocks an SM fit\n", G, per);
      continue;
    }
    {
      const float base = timed([&] {
        CK(cudaMemsetAsync(cnt, 0, sizeof(u32), s));
        barrier_chain<<<G, 128, 0, s>>>(buf, cnt, 1);
      });
      const float us = timed([&] {
        CK(cudaMemsetAsync(cnt, 0, sizeof(u32), s));
        barrier_chain<<<G, 128, 0, s>>>(buf, cnt, N + 1);
      });
      printf("barrier  G=%4d  %7.3f us a phase (%d phases beyond one: %.1f against %.1f us)\n", G, (us - base) / N, N, us, base);
    }
    {
      const float base = timed([&] {
        CK(cudaMemsetAsync(cnt, 0, 4096 * sizeof(u32), s));
        p2p_chain<<<G, 128, 0, s>>>(buf, cnt, 1);
      });
      const float us = timed([&] {
        CK(cudaMemsetAsync(cnt, 0, 4096 * sizeof(u32), s));
        p2p_chain<<<G, 128, 0, s>>>(buf, cnt, N + 1);
      });
      printf("p2p      G=%4d  %7.3f us a phase (%d phases beyond one: %.1f against %.1f us)\n", G, (us - base) / N, N, us, base);
    }
  }
  {
    const int H = 1000;
    const float base = timed([&] {
      CK(cudaMemsetAsync(cnt, 0, sizeof(u32), s));
      pingpong<<<2, 32, 0, s>>>(cnt, 1);
    });
    const float us = timed([&] {
      CK(cudaMemsetAsync(cnt, 0, sizeof(u32), s));
      pingpong<<<2, 32, 0, s>>>(cnt, H + 1);
    });
    printf("pingpong          %7.3f us a one-way hop (%d round trips: %.1f against %.1f us)\n", (us - base) / (2 * H), H, us, base);
  }
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  return 0;
}
