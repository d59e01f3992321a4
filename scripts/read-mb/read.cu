// read.cu: how fast a decode step's weight kernel could stream its bytes at
// best, for deciding how much of the gap between moxie's weight kernels
// (FP8 projections ~3.2 TB/s, MoE stages ~2.5-2.9 TB/s) and the device's
// read ceiling (~4.59 TB/s on an H200 over 1 GiB) is the kernels' own and
// how much any one-kernel-a-matrix design pays at its boundaries. Written
// for scripts/read-mb/run.sh (nvcc on the GPU machine; not part of moxie's
// build).
//
// A chain of REP = 16 steps, captured in a graph with programmatic
// dependent launch on every kernel, each step reading a region of S bytes
// that no other step reads (so every byte comes from HBM), timed by CUDA
// events over 25 replays (median, per step). The read kernel is read_bw4's
// pattern (moxie's probe): 256 threads, CH uint4 loads a thread, the grid
// covering the region once; it also reads a word the step before wrote, so
// the chain carries a data dependency. Cases:
//   rd CH      the loads after griddepcontrol.wait (a kernel whose weight
//              addresses depend on the previous kernel)
//   early CH   the loads issued before the wait, used after it (weights
//              known from the arguments: moxie's gemvm and stage-2 design)
//   lat        a one-block kernel of 8 dependent L2 round trips (a stand-in
//              for the small latency-bound kernels between weight kernels)
//   lat+rd, lat+early: a lat kernel before each read
// for S of 6, 32, 35, 40 and 70 MB (wq_a+wkv, wo_a/wo_b, stage 2,
// wq_b+indexer, stage 1 at V4-Flash shapes); and rd 4 with the loads'
// other cache flavours (nc: no hint; 256B: moxie's ldw; na+256B: both). Prints microseconds a step
// and, for the reads, TB/s of S over (step - lat alone) where a lat runs.
#include "mb.cuh"

// The load's cache flavour FL: 0 ld.global.nc.L1::no_allocate, 1 plain
// ld.global.nc, 2 ld.global.nc.L2::256B (moxie's ldw), 3 both hints.
template <int FL>
__device__ __forceinline__ uint4 ldnc(const uint4 *p) {
  uint4 v;
  if (FL == 0) asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  if (FL == 1) asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  if (FL == 2) asm volatile("ld.global.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  if (FL == 3) asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// rd: block b reads uint4 (b·CH + k)·256 + tid for k < CH; EARLY issues
// them before griddepcontrol.wait. dep[0] is the step before's word.
template <int CH, bool EARLY, int FL = 0>
__global__ void __launch_bounds__(256) rd(const uint4 *p, long long n, const u32 *dep, u32 *out) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  uint4 v[CH];
  if (!EARLY) asm volatile("griddepcontrol.wait;" ::: "memory");
#pragma unroll
  for (int k = 0; k < CH; k++) {
    const long long i = ((long long)blockIdx.x * CH + k) * 256 + threadIdx.x;
    v[k] = i < n ? ldnc<FL>(p + i) : make_uint4(0, 0, 0, 0);
  }
  if (EARLY) asm volatile("griddepcontrol.wait;" ::: "memory");
  u32 f = __ldcg(dep);
#pragma unroll
  for (int k = 0; k < CH; k++) f ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = f | 1u;  // the next step's dependency
  else if (f == 0x9e3779b9u) out[1] = f;
}

// lat: one block; 8 dependent round trips through a small L2-resident
// ring (ring[i] holds the next index), then the dependency word.
__global__ void lat(const u32 *ring, const u32 *dep, u32 *out) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (threadIdx.x != 0) return;
  u32 j = __ldcg(dep) & 1023u;
  for (int r = 0; r < 8; r++) j = __ldcg(ring + j);
  out[0] = j | 1u;
}

int main() {
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int REP = 16;
  const long long sizes[] = {6000000, 32000000, 35000000, 40000000, 70000000};
  const long long maxS = 70000000;
  uint4 *buf;
  CK(cudaMalloc(&buf, maxS * REP + 4096));
  CK(cudaMemset(buf, 1, maxS * REP + 4096));
  u32 *ring, *words;
  CK(cudaMalloc(&ring, 1024 * 4));
  std::vector<u32> h(1024);
  for (int i = 0; i < 1024; i++) h[i] = (i * 389 + 1) & 1023;
  CK(cudaMemcpy(ring, h.data(), 4096, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&words, (2 * REP + 2) * 2 * 4));
  CK(cudaMemset(words, 0, (2 * REP + 2) * 2 * 4));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  printf("device SMs %d\n", sms);
  auto launch = [&](void *fn, dim3 g, dim3 b, void **args) { pdl_launch(st, fn, g, b, args); };
  struct Case {
    const char *name;
    void *fn;  // read kernel or nullptr
    int ch;
    bool withLat;
  };
  const Case cases[] = {
      {"lat", nullptr, 0, true},
      {"rd 4", (void *)rd<4, false>, 4, false},
      {"early 4", (void *)rd<4, true>, 4, false},
      {"rd 8", (void *)rd<8, false>, 8, false},
      {"early 8", (void *)rd<8, true>, 8, false},
      {"lat+rd 4", (void *)rd<4, false>, 4, true},
      {"lat+early 4", (void *)rd<4, true>, 4, true},
      {"lat+early 8", (void *)rd<8, true>, 8, true},
      {"rd 4 nc", (void *)rd<4, false, 1>, 4, false},
      {"rd 4 256B", (void *)rd<4, false, 2>, 4, false},
      {"rd 4 na+256B", (void *)rd<4, false, 3>, 4, false},
  };
  for (long long S : sizes) {
    float latAlone = 0.f;
    for (const Case &c : cases) {
      const float med = graph_median_us(st, REP, [&] {
        u32 *w = words;
        for (int r = 0; r < REP; r++) {
          if (c.withLat) {
            u32 *o = w + 2;
            void *a[3] = {&ring, &w, &o};
            launch((void *)lat, dim3(1), dim3(32), a);
            w = o;
          }
          if (c.fn) {
            const uint4 *p = buf + (S / 16) * r;
            long long n = S / 16;
            u32 *o = w + 2;
            void *a[4] = {&p, &n, &w, &o};
            const long long per = (long long)c.ch * 256;
            launch(c.fn, dim3((unsigned)((n + per - 1) / per)), dim3(256), a);
            w = o;
          }
        }
      });
      if (!c.fn) latAlone = med;
      const float readUs = c.withLat && c.fn ? med - latAlone : med;
      if (c.fn)
        printf("S %5.1f MB  %-12s %7.2f us a step  (read %6.2f us, %5.2f TB/s)\n", S / 1e6, c.name, med, readUs, S / readUs / 1e6);
      else
        printf("S %5.1f MB  %-12s %7.2f us a step\n", S / 1e6, c.name, med);
    }
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
