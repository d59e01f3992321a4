// L2 prefetch kernels (prefetch.go): pull device memory that later kernels
// will read into the L2 cache, without reading it into registers or writing
// anything. They are hints: memory is never changed, and nothing guarantees
// the lines are still in L2 when the reader runs.
//
// Every kernel takes one PfArgs by value: up to PF_MAX ranges, each cut into
// items of `unit` bytes (the last item of a range may be shorter); end[r] is
// the running total of items up to and including range r. The threads of the
// grid share the items round-robin, so a small grid covers any size.
//
//   prefetch_l2_bulk     cp.async.bulk.prefetch.L2.global, one per item
//                        (sm_90 and PTX ISA 8.0 (NVRTC 12+); else lines)
//   prefetch_l2_bulk_el  the same with an L2::evict_last cache policy
//   prefetch_l2_lines    prefetch.global.L2, one per 128-byte line
//   prefetch_l2_lines_el prefetch.global.L2::evict_last (sm_80+; else plain)
//
// The bulk form needs a 16-byte-aligned address and a size that is a
// multiple of 16: the host checks the alignment of each range, and the last
// (bytes mod 16) bytes of a range are covered by a line prefetch of the
// range's last byte.

#define PF_MAX 16
#define PF_LINE 128

struct PfArgs {
  unsigned long long ptr[PF_MAX];
  unsigned long long bytes[PF_MAX];
  long long end[PF_MAX];
  int n;
  unsigned unit;
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDACC_VER_MAJOR__) && __CUDACC_VER_MAJOR__ >= 12
#define PF_HAVE_BULK 1
#else
#define PF_HAVE_BULK 0
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define PF_HAVE_EVICT_LAST 1
#else
#define PF_HAVE_EVICT_LAST 0
#endif

__device__ __forceinline__ void pf_line(unsigned long long a, bool evict_last) {
#if PF_HAVE_EVICT_LAST
  if (evict_last) {
    asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(a));
    return;
  }
#endif
  asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
}

// pf_lines prefetches every 128-byte line that [a, a+len) touches.
__device__ __forceinline__ void pf_lines(unsigned long long a, unsigned long long len, bool evict_last) {
  unsigned long long first = a & ~(unsigned long long)(PF_LINE - 1);
  for (unsigned long long l = first; l < a + len; l += PF_LINE) pf_line(l, evict_last);
}

// pf_find returns the range that holds item c, searching on from r (a
// thread's items only grow).
__device__ __forceinline__ int pf_find(const PfArgs &a, long long c, int r) {
  while (r < a.n - 1 && c >= a.end[r]) r++;
  return r;
}

template <bool BULK, bool EVICT_LAST>
__device__ __forceinline__ void pf_run(const PfArgs &a) {
  const long long total = a.end[a.n - 1];
  const long long stride = (long long)gridDim.x * blockDim.x;
  int r = 0;
#if PF_HAVE_BULK
  unsigned long long pol = 0;
  if (BULK && EVICT_LAST) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
#endif
  for (long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x; c < total; c += stride) {
    r = pf_find(a, c, r);
    const long long first = r ? a.end[r - 1] : 0;
    const unsigned long long off = (unsigned long long)(c - first) * a.unit;
    const unsigned long long left = a.bytes[r] - off;
    const unsigned long long len = left < a.unit ? left : a.unit;
    const unsigned long long p = a.ptr[r] + off;
#if PF_HAVE_BULK
    if (BULK) {
      const unsigned size = (unsigned)(len & ~15ull);
      if (size) {
        if (EVICT_LAST)
          asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(p), "r"(size), "l"(pol)
                       : "memory");
        else
          asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(size) : "memory");
      }
      if (len & 15ull) pf_line(p + len - 1, EVICT_LAST);
      continue;
    }
#endif
    pf_lines(p, len, EVICT_LAST);
  }
}

extern "C" __global__ void prefetch_l2_bulk(const PfArgs a) { pf_run<true, false>(a); }
extern "C" __global__ void prefetch_l2_bulk_el(const PfArgs a) { pf_run<true, true>(a); }
extern "C" __global__ void prefetch_l2_lines(const PfArgs a) { pf_run<false, false>(a); }
extern "C" __global__ void prefetch_l2_lines_el(const PfArgs a) { pf_run<false, true>(a); }
