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
//            block order, the candidates' count and their mass, complete =
//            count <= cap) and, when complete, the candidates in id order
//            after it. With greedy set smp_exp is not launched and only best
//            and bad are written (count 0). With feed_tok set (not null) it
//            also hands the argmax to the next decode step, which reads its
//            token and position from device memory: feed_tok[0] = best (0
//            when there is none: that step's result is then discarded) and
//            feed_pos[0] += 1.
//   smp_draw one block, after the others, for a row whose candidates did
//            not fit (the host asks for it): the sampler's own selection
//            over every candidate (the top k by rank, then the fewest ranked
//            first whose mass reaches top_p of the kept mass) and the draw:
//            u times the kept mass, walked in id order. Rank: larger e
//            first, the lower id on ties. Thresholds are found by bisection
//            over the keys (e's bits; e > 0, so they order as e), each step
//            a count or a mass over every candidate in a fixed order, so the
//            result does not depend on timing.
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
  double cm;    // their mass (smp_exp)
};

// The result smp_fin writes: the head, then at SMP_IDS_OFF cap int ids, then
// at SMP_IDS_OFF + 4*cap (cap even: 8-byte aligned) cap double e.
struct SmpHead {
  double z;
  int best;
  int bad;
  int count;
  int complete;
  double cmass;  // the candidates' mass
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
  __shared__ double sz[SMP_THREADS], scm[SMP_THREADS];
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
  double z = 0, cm = 0;
  int count = 0;
  if (!skip) {
    for (int i = lo; i < hi; i++) {
      const double x = exp(((double)l[i] - m) * invT);
      z += x;
      if (x > 0 && x >= thr) {
        count++;
        cm += x;
      }
    }
  }
  scm[t] = cm;
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
    if (t < s) {
      sz[t] += sz[t + s];
      scm[t] += scm[t + s];
    }
    __syncthreads();
  }
  if (t == 0) {
    part[blockIdx.x].z = sz[0];
    part[blockIdx.x].cm = scm[0];
    part[blockIdx.x].count = total;
  }
}

extern "C" __global__ void __launch_bounds__(SMP_THREADS) smp_fin(const SmpPart* part, int nb, int greedy, const int* __restrict__ cid,
                                                                  const double* __restrict__ ce, int cap, unsigned char* out,
                                                                  int* feed_tok, int* feed_pos) {
  __shared__ int off[SMP_THREADS + 1];
  __shared__ int scomplete;
  const int t = threadIdx.x;
  SmpHead* h = (SmpHead*)out;
  if (t == 0) {
    float m;
    int best, bad;
    smp_reduce_parts(part, nb, &m, &best, &bad);
    double z = 0, cm = 0;
    int count = 0;
    if (!greedy && !bad && best >= 0) {
      for (int k = 0; k < nb; k++) {
        off[k] = count;
        z += part[k].z;
        cm += part[k].cm;
        count += part[k].count;
      }
    }
    h->z = z;
    h->cmass = cm;
    h->best = best;
    h->bad = bad;
    h->count = count;
    h->complete = count <= cap;
    scomplete = !greedy && !bad && best >= 0 && count <= cap;
    if (feed_tok) {
      feed_tok[0] = best >= 0 ? best : 0;
      feed_pos[0] += 1;
    }
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

#ifndef SMP_DRAW_THREADS  // the host emulation runs a smaller block
#define SMP_DRAW_THREADS 1024
#endif

// SmpDrawArgs is smp_draw's input: k keeps the k first ranked candidates (k
// above the candidates' count: no top-k), top_p (0: off) the fewest ranked
// first whose mass reaches top_p times the kept mass (the top-k set's, or
// without top-k the row's Z, passed as z), u in [0, 1) the draw.
struct SmpDrawArgs {
  const SmpPart* part;
  const int* cid;
  const double* ce;
  int* drawn;  // the drawn id; -1 when nothing was kept
  double z, top_p, u;
  int nb, k;
};

// smp_key is the ranking key of e > 0: its bits, which order as e does.
__device__ __forceinline__ unsigned long long smp_key(double e) { return (unsigned long long)__double_as_longlong(e); }

// The kept set so far: key above kt, or key kt with id <= kid (a cut inside
// a run of equal e); kt = 0 keeps every candidate.
struct SmpCut {
  unsigned long long kt;
  int kid;
};

__device__ __forceinline__ bool smp_in(const SmpCut& c, unsigned long long key, int id) {
  return key > c.kt || (key == c.kt && id <= c.kid);
}

// smp_scan sums, over the candidates in cut a, [0] how many have key >=
// ge and (key > ge or id <= gid) and [1] their mass, and [2] the smallest
// key >= ge and [3] the largest key < ge among them (as doubles' bits in
// unsigned long long; 0 / ~0 when none). Each thread walks a fixed stride of
// every block's candidates in id order; the sums are combined in a fixed
// tree, so equal inputs give equal results. All threads get the results.
__device__ void smp_scan(const SmpDrawArgs& a, SmpCut in, unsigned long long ge, int gid, int* cnt, double* mass,
                         unsigned long long* kmin, unsigned long long* kmax) {
  __shared__ int sc[SMP_DRAW_THREADS];
  __shared__ double sm[SMP_DRAW_THREADS];
  __shared__ unsigned long long slo[SMP_DRAW_THREADS], shi[SMP_DRAW_THREADS];
  const int t = threadIdx.x;
  int c = 0;
  double m = 0;
  unsigned long long lo = ~0ull, hi = 0;
  for (int b = 0; b < a.nb; b++) {
    const int n = a.part[b].count;
    for (int j = t; j < n; j += SMP_DRAW_THREADS) {
      const double e = a.ce[b * SMP_CHUNK + j];
      const unsigned long long key = smp_key(e);
      // The id only decides at a cut's own key (a run of equal e).
      const int id = key == in.kt || key == ge ? a.cid[b * SMP_CHUNK + j] : 0;
      if (!smp_in(in, key, id)) continue;
      if (key > ge || (key == ge && id <= gid)) {
        c++;
        m += e;
        if (key < lo) lo = key;
      } else if (key > hi) {
        hi = key;
      }
    }
  }
  sc[t] = c;
  sm[t] = m;
  slo[t] = lo;
  shi[t] = hi;
  __syncthreads();
  for (int s = SMP_DRAW_THREADS / 2; s > 0; s >>= 1) {
    if (t < s) {
      sc[t] += sc[t + s];
      sm[t] += sm[t + s];
      if (slo[t + s] < slo[t]) slo[t] = slo[t + s];
      if (shi[t + s] > shi[t]) shi[t] = shi[t + s];
    }
    __syncthreads();
  }
  *cnt = sc[0];
  *mass = sm[0];
  *kmin = slo[0];
  *kmax = shi[0];
  __syncthreads();  // the shared sums are reused by the next scan
}

// smp_cut returns the cut that keeps, of the candidates in `in` (a cut
// itself), the first ranked up to `want` of them (by count, or with by_mass
// the fewest whose mass reaches want), which must be at most all of them: a
// key threshold by bisection over the keys present, then, inside the run of
// equal keys at it, an id bound by bisection over the ids. A prefix of a
// prefix by rank is one cut over every candidate. All threads return it.
__device__ SmpCut smp_cut(const SmpDrawArgs& a, SmpCut in, double want, bool by_mass, int n_ids) {
  int c;
  double m;
  unsigned long long kmin, kmax;
  // Invariant: the candidates of `in` with key >= lo reach want, those with
  // key >= hi do not; lo is a key present.
  smp_scan(a, in, 0, 0x7fffffff, &c, &m, &kmin, &kmax);
  unsigned long long lo = kmin, hi = ~0ull;
  while (hi - lo > 1) {
    const unsigned long long mid = lo + (hi - lo) / 2;
    smp_scan(a, in, mid, 0x7fffffff, &c, &m, &kmin, &kmax);
    if (by_mass ? m >= want : c >= want) {
      lo = kmin;  // no key present in [mid, kmin): the same set
    } else {
      hi = kmax + 1;  // no key present in [kmax+1, mid); kmax >= lo
    }
  }
  // The run at lo reaches want with everything above it, which alone does
  // not: the smallest id bound inside the run that reaches it (a run of one
  // candidate, the common case, needs no search).
  int ilo = -1, ihi = n_ids - 1;  // ilo falls short, ihi reaches
  smp_scan(a, in, lo, 0x7fffffff, &c, &m, &kmin, &kmax);
  const int through = c;
  smp_scan(a, in, lo, -1, &c, &m, &kmin, &kmax);
  if (through - c == 1) return SmpCut{lo, ihi};
  while (ihi - ilo > 1) {
    const int mid = ilo + (ihi - ilo) / 2;
    smp_scan(a, in, lo, mid, &c, &m, &kmin, &kmax);
    if (by_mass ? m >= want : c >= want) ihi = mid;
    else ilo = mid;
  }
  return SmpCut{lo, ihi};
}

extern "C" __global__ void __launch_bounds__(SMP_DRAW_THREADS) smp_draw(const SmpDrawArgs a, int n_ids) {
  __shared__ double seg[SMP_DRAW_THREADS];
  __shared__ int soff[SMP_THREADS + 1];
  const int t = threadIdx.x;
  SmpCut cut{0, 0x7fffffff};  // every candidate (e > 0: key > 0)
  int c;
  double m, zk = a.z;
  unsigned long long kmin, kmax;
  smp_scan(a, cut, 0, 0x7fffffff, &c, &m, &kmin, &kmax);
  if (a.k <= c) {  // top-k: its mass is the normaliser, even when it keeps every candidate
    if (a.k < c) {
      cut = smp_cut(a, cut, (double)a.k, false, n_ids);
      smp_scan(a, cut, 0, 0x7fffffff, &c, &m, &kmin, &kmax);
    }
    zk = m;
  }
  if (a.top_p > 0 && m >= a.top_p * zk) {
    cut = smp_cut(a, cut, a.top_p * zk, true, n_ids);
    smp_scan(a, cut, 0, 0x7fffffff, &c, &m, &kmin, &kmax);
  }
  // The draw: u·m walked over the kept candidates in id order. Thread t sums
  // the t-th contiguous segment of the candidates' positions.
  if (t == 0) {
    int o = 0;
    for (int b = 0; b < a.nb; b++) {
      soff[b] = o;
      o += a.part[b].count;
    }
    soff[a.nb] = o;
  }
  __syncthreads();
  const int n = soff[a.nb], per = (n + SMP_DRAW_THREADS - 1) / SMP_DRAW_THREADS;
  double sum = 0;
  for (int g = min(n, t * per), b = 0; g < min(n, (t + 1) * per); g++) {
    while (g >= soff[b + 1]) b++;
    const int j = b * SMP_CHUNK + g - soff[b];
    if (smp_in(cut, smp_key(a.ce[j]), a.cid[j])) sum += a.ce[j];
  }
  seg[t] = sum;
  __syncthreads();
  if (t != 0) return;
  // The segment where u·m falls, then the id inside it. Rounding that
  // carries the point past a segment's (or the last segment's) end takes
  // that segment's last kept id. The best id is always kept: m > 0.
  double x = a.u * m;
  int s = 0;
  while (s < SMP_DRAW_THREADS && !(seg[s] > 0 && x < seg[s])) x -= seg[s++];
  if (s == SMP_DRAW_THREADS) {
    for (s = SMP_DRAW_THREADS - 1; s > 0 && seg[s] == 0; s--) {
    }
    x = 1e300;  // past the end: walk to its last kept id
  }
  int drawn = -1, last = -1;
  for (int g = min(n, s * per), b = 0; g < min(n, (s + 1) * per); g++) {
    while (g >= soff[b + 1]) b++;
    const int j = b * SMP_CHUNK + g - soff[b];
    if (!smp_in(cut, smp_key(a.ce[j]), a.cid[j])) continue;
    last = a.cid[j];
    if ((x -= a.ce[j]) < 0) {
      drawn = last;
      break;
    }
  }
  *a.drawn = drawn < 0 ? last : drawn;
}
