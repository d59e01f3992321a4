// Sampler reduction kernels (sample.go, SampleReducer): the first two passes
// of the host sampler (package sample) over one row of n logits that stay on
// the device, so that only a small result is downloaded.
//
//   smp_max  one block per SMP_CHUNK ids: the chunk's largest logit, its id
//            (the lowest on ties; -1 when every logit is -Inf) and whether a
//            logit is NaN or +Inf, into part[block].
//   smp_exp  the same grid: every block first reduces all the parts (the
//            row's best id and logit m, the NaN flag), then for its chunk
//            e(id) = exp((l[id] - m)·invT) in double precision, their sum
//            and the candidates e >= thr (and > 0) in id order: ids and e
//            into the block's SMP_CHUNK slots of cid and ce, their count and
//            sum into part[block].
//   smp_fin  one block: the head (best, bad, Z as the blocks' sums added in
//            block order, the candidates' count, complete = count <= cap)
//            and, when complete, the candidates in id order after it. With
//            greedy set smp_exp is not launched and only best and bad are
//            written (count 0).
//
// Each thread of smp_exp takes SMP_CHUNK/SMP_THREADS consecutive ids, so a
// block's candidates are placed in id order by one exclusive scan of the
// threads' counts. Only __syncthreads and shared memory are used.

#define SMP_CHUNK 8192
#define SMP_THREADS 256
#define SMP_PER (SMP_CHUNK / SMP_THREADS)

struct SmpPart {
  double z;     // sum of the chunk's e (smp_exp)
  float v;      // the chunk's largest logit (-Inf when every one is -Inf)
  int best;     // its id, the lowest on ties; -1 with v = -Inf
  int bad;      // 1 when a logit of the chunk is NaN or +Inf
  int count;    // the chunk's candidates (smp_exp)
};

// The result smp_fin writes: the head, then at SMP_IDS_OFF cap int ids, then
// at SMP_IDS_OFF + 4*cap (cap even: 8-byte aligned) cap double e.
struct SmpHead {
  double z;
  int best;
  int bad;
  int count;
  int complete;
};
#define SMP_IDS_OFF 32

// smp_better reports whether (v2, i2) ranks before (v1, i1): a larger logit,
// or the same one at a lower id; i = -1 (nothing) never ranks first.
__device__ __forceinline__ bool smp_better(float v1, int i1, float v2, int i2) {
  if (i2 < 0) return false;
  if (i1 < 0) return true;
  return v2 > v1 || (v2 == v1 && i2 < i1);
}

// smp_reduce_parts reduces the nb parts into (m, best, bad): every thread
// gets the same answer (read after the __syncthreads the caller makes).
__device__ void smp_reduce_parts(const SmpPart* part, int nb, float* m, int* best, int* bad) {
  float bv = -__int_as_float(0x7f800000);
  int bi = -1, b = 0;
  for (int k = 0; k < nb; k++) {
    if (part[k].bad) b = 1;
    if (smp_better(bv, bi, part[k].v, part[k].best)) {
      bv = part[k].v;
      bi = part[k].best;
    }
  }
  *m = bv;
  *best = bi;
  *bad = b;
}

extern "C" __global__ void __launch_bounds__(SMP_THREADS) smp_max(const float* __restrict__ l, int n, SmpPart* part) {
  __shared__ float sv[SMP_THREADS];
  __shared__ int si[SMP_THREADS];
  __shared__ int sb[SMP_THREADS];
  const int t = threadIdx.x;
  const int lo = blockIdx.x * SMP_CHUNK;
  const int hi = min(n, lo + SMP_CHUNK);
  float bv = -__int_as_float(0x7f800000);
  int bi = -1, bad = 0;
  for (int i = lo + t; i < hi; i += SMP_THREADS) {  // a thread's ids ascend: ties keep the first
    const float v = l[i];
    if (v != v || v > 3.402823466e38f) bad = 1;
    if (v > bv) {
      bv = v;
      bi = i;
    }
  }
  sv[t] = bv;
  si[t] = bi;
  sb[t] = bad;
  __syncthreads();
  for (int s = SMP_THREADS / 2; s > 0; s >>= 1) {
    if (t < s) {
      if (smp_better(sv[t], si[t], sv[t + s], si[t + s])) {
        sv[t] = sv[t + s];
        si[t] = si[t + s];
      }
      sb[t] |= sb[t + s];
    }
    __syncthreads();
  }
  if (t == 0) {
    part[blockIdx.x].v = sv[0];
    part[blockIdx.x].best = si[0];
    part[blockIdx.x].bad = sb[0];
  }
}

extern "C" __global__ void __launch_bounds__(SMP_THREADS) smp_exp(const float* __restrict__ l, int n, double invT, double thr,
                                                                  SmpPart* part, int* __restrict__ cid, double* __restrict__ ce) {
  __shared__ double sz[SMP_THREADS];
  __shared__ int sc[SMP_THREADS];
  __shared__ float sm;
  __shared__ int sbest, sbad;
  const int t = threadIdx.x;
  const int nb = gridDim.x;
  if (t == 0) {
    float m;
    int best, bad;
    smp_reduce_parts(part, nb, &m, &best, &bad);
    sm = m;
    sbest = best;
    sbad = bad;
  }
  __syncthreads();
  const int lo = blockIdx.x * SMP_CHUNK + t * SMP_PER;
  const int hi = min(n, lo + SMP_PER);
  const bool skip = sbad || sbest < 0;  // the host reports the error: nothing to sum
  const double m = sm;
  double z = 0;
  int count = 0;
  if (!skip) {
    for (int i = lo; i < hi; i++) {
      const double x = exp(((double)l[i] - m) * invT);
      z += x;
      if (x > 0 && x >= thr) count++;
    }
  }
  sz[t] = z;
  sc[t] = count;
  __syncthreads();
  // Exclusive scan of the counts (Hillis-Steele on an inclusive copy).
  for (int s = 1; s < SMP_THREADS; s <<= 1) {
    const int add = t >= s ? sc[t - s] : 0;
    __syncthreads();
    sc[t] += add;
    __syncthreads();
  }
  int at = blockIdx.x * SMP_CHUNK + sc[t] - count;
  if (!skip && count > 0) {
    for (int i = lo; i < hi; i++) {
      const double x = exp(((double)l[i] - m) * invT);
      if (x > 0 && x >= thr) {
        cid[at] = i;
        ce[at] = x;
        at++;
      }
    }
  }
  const int total = sc[SMP_THREADS - 1];
  __syncthreads();
  for (int s = SMP_THREADS / 2; s > 0; s >>= 1) {
    if (t < s) sz[t] += sz[t + s];
    __syncthreads();
  }
  if (t == 0) {
    part[blockIdx.x].z = sz[0];
    part[blockIdx.x].count = total;
  }
}

extern "C" __global__ void __launch_bounds__(SMP_THREADS) smp_fin(const SmpPart* part, int nb, int greedy, const int* __restrict__ cid,
                                                                  const double* __restrict__ ce, int cap, unsigned char* out) {
  __shared__ int off[SMP_THREADS + 1];
  __shared__ int scomplete;
  const int t = threadIdx.x;
  SmpHead* h = (SmpHead*)out;
  if (t == 0) {
    float m;
    int best, bad;
    smp_reduce_parts(part, nb, &m, &best, &bad);
    double z = 0;
    int count = 0;
    if (!greedy && !bad && best >= 0) {
      for (int k = 0; k < nb; k++) {
        off[k] = count;
        z += part[k].z;
        count += part[k].count;
      }
    }
    h->z = z;
    h->best = best;
    h->bad = bad;
    h->count = count;
    h->complete = count <= cap;
    scomplete = !greedy && !bad && best >= 0 && count <= cap;
  }
  __syncthreads();
  if (!scomplete) return;
  int* ids = (int*)(out + SMP_IDS_OFF);
  double* e = (double*)(out + SMP_IDS_OFF + 4 * cap);
  for (int k = 0; k < nb; k++) {
    const int c = part[k].count;
    for (int j = t; j < c; j += SMP_THREADS) {
      ids[off[k] + j] = cid[k * SMP_CHUNK + j];
      e[off[k] + j] = ce[k * SMP_CHUNK + j];
    }
  }
}
