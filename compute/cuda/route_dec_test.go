package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"moxie/compute"
	"moxie/compute/computetest"
	"moxie/compute/ref"
)

// TestRouteCompiles compiles kernels/route.cu for sm_90 (compileModuleForTest:
// no GPU needed, skipped without NVRTC) and checks that gate_route and
// gate_route_w are in it.
func TestRouteCompiles(t *testing.T) {
	requireKernels(t, compileModuleForTest(t, "route", RouteSource()), "gate_route", "gate_route_w")
}

// TestGateRouteWarps checks that gate_route repeats the default Linear
// launch of V4-Flash's gate (BF16 256x4096 at batch 1: 8 warps per block)
// and of smaller gates, and refuses a shape Linear runs otherwise.
func TestGateRouteWarps(t *testing.T) {
	for _, tc := range []struct{ experts, cols, want int }{
		{256, 4096, 8}, {64, 1024, 2}, {256, 512, 1}, {8, 64, 1},
	} {
		t.Run(fmt.Sprintf("E%d_C%d", tc.experts, tc.cols), func(t *testing.T) {
			got, err := gateRouteWarps(tc.experts, tc.cols, 132, 232448)
			if err != nil || got != tc.want {
				t.Fatalf("gateRouteWarps = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
	if _, err := gateRouteWarps(256, 4098, 132, 232448); err == nil {
		t.Errorf("gateRouteWarps(256, 4098) took a shape Linear runs with linear_generic")
	}
}

// TestGateRouteArgs checks GateRoute's argument errors (no device needed:
// they come before any device call).
func TestGateRouteArgs(t *testing.T) {
	w := func(f compute.Format, rows, cols int) *DeviceWeight {
		return &DeviceWeight{Format: f, Rows: rows, Cols: cols, Data: 4096, Scale: 4096}
	}
	const p = DevicePtr(1 << 20)
	for _, tc := range []struct {
		name          string
		gate          *DeviceWeight
		x             DevicePtr
		experts, k    int
		ids, wts, lgt DevicePtr
	}{
		{"nil gate", nil, p, 256, 6, p, p, p},
		{"fp8 gate", w(compute.FP8Block, 256, 4096), p, 256, 6, p, p, p},
		{"rows", w(compute.BF16, 128, 4096), p, 256, 6, p, p, p},
		{"experts", w(compute.BF16, 512, 4096), p, 512, 6, p, p, p},
		{"k zero", w(compute.BF16, 256, 4096), p, 256, 0, p, p, p},
		{"k", w(compute.BF16, 8, 4096), p, 8, 9, p, p, p},
		{"cols", w(compute.BF16, 256, 4098), p, 256, 6, p, p, p},
		{"null ids", w(compute.BF16, 256, 4096), p, 256, 6, 0, p, p},
		{"null logits", w(compute.BF16, 256, 4096), p, 256, 6, p, p, 0},
		{"null x", w(compute.BF16, 256, 4096), 0, 256, 6, p, p, p},
		{"x align", w(compute.BF16, 256, 4096), p + 4, 256, 6, p, p, p},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Ctx
			err := c.GateRoute(tc.ids, tc.wts, tc.lgt, tc.gate, tc.x, 0, 0, tc.experts, tc.k, 1, Stream{})
			if err == nil {
				t.Fatalf("GateRoute accepted bad arguments")
			}
			t.Log(err)
		})
	}
}

// bf16Floats decodes BF16 weight bytes (little-endian) to float64.
func bf16Floats(b []byte) []float64 {
	out := make([]float64, len(b)/2)
	for i := range out {
		out[i] = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16))
	}
	return out
}

// TestGateRoute checks GateRoute at V4-Flash's router shapes (256 experts,
// 4096 columns, top 6, route scale 1.5; score layers with and without bias,
// hash layers) and smaller ones against the two-kernel path (Linear, then
// Route: the same logits, ids and weights bit for bit) and against float64
// references: the logits against the exact dot products of the BF16 gate
// and x (error at most 1e-5 of Σ|w·x|), the ids and weights against
// ref.Route of the device's logits. Each case launches three tokens in
// turn on the same buffers (the arrival counter must come back to 0), and
// a hash row with an id out of range must give NaN weights.
func TestGateRoute(t *testing.T) {
	for _, tc := range []struct {
		name             string
		experts, cols, k int
		bias, hash, ties bool
		badHash          bool
		scale            float32
	}{
		{name: "v4_bias", experts: 256, cols: 4096, k: 6, bias: true, scale: 1.5},
		{name: "v4_nobias", experts: 256, cols: 4096, k: 6, scale: 1.5},
		{name: "v4_hash", experts: 256, cols: 4096, k: 6, hash: true, scale: 1.5},
		{name: "v4_hash_bad", experts: 256, cols: 4096, k: 6, hash: true, badHash: true, scale: 1.5},
		{name: "v4_ties", experts: 256, cols: 4096, k: 6, ties: true, scale: 1.5},
		{name: "odd_rows", experts: 255, cols: 4096, k: 8, bias: true, scale: 2.5},
		{name: "long_rows", experts: 64, cols: 7168, k: 6, bias: true, scale: 1},
		{name: "tiny", experts: 8, cols: 64, k: 2, bias: true, scale: 1},
		{name: "all", experts: 16, cols: 512, k: 16, scale: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			E, C, K := tc.experts, tc.cols, tc.k
			const tokens = 3
			rng := rand.New(rand.NewPCG(uint64(E), uint64(C+K)))
			wd := computetest.RandomWeight(rng, compute.BF16, E, C, 0.02)
			if tc.ties { // rows 2i and 2i+1 equal: every logit tied with a neighbour
				rb := 2 * C
				for r := 1; r < E; r += 2 {
					copy(wd.Data[r*rb:(r+1)*rb], wd.Data[(r-1)*rb:r*rb])
				}
			}
			wf := bf16Floats(wd.Data)
			xs := computetest.Normal(rng, tokens*C, 1)
			bias := computetest.Normal(rng, E, 0.1)
			hash := make([]int32, tokens*K)
			for i := range hash {
				hash[i] = int32(rng.IntN(E))
			}
			if tc.badHash {
				hash[K+1] = int32(E) // token 1
			}
			type out struct {
				ids     []int32
				w, lgts []float32
			}
			var fused, two [tokens]out
			onDevice(t, func(c *Ctx, d *devBufs) {
				gate := d.weight(wd)
				x := d.floats(xs)
				var pb, ph DevicePtr
				if tc.bias {
					pb = d.floats(bias)
				}
				if tc.hash {
					ph = d.int32s(hash)
				}
				ids, w, lg := d.poisoned(K), d.poisoned(K), d.poisoned(E)
				ids2, w2, lg2 := d.poisoned(K), d.poisoned(K), d.poisoned(E)
				d.synced()
				s := c.Stream()
				for i := range tokens {
					xi := x + DevicePtr(4*i*C)
					var hi DevicePtr
					if ph != 0 {
						hi = ph + DevicePtr(4*i*K)
					}
					d.check(c.GateRoute(ids, w, lg, gate, xi, pb, hi, E, K, tc.scale, s))
					d.check(c.Linear(gate, lg2, xi, 1, s))
					d.check(c.Route(ids2, w2, lg2, pb, hi, 1, E, K, tc.scale, s))
					fused[i] = out{d.getInt32s(ids, K), d.getFloats(w, K), d.getFloats(lg, E)}
					two[i] = out{d.getInt32s(ids2, K), d.getFloats(w2, K), d.getFloats(lg2, E)}
				}
			})
			for i := range tokens {
				f, o := fused[i], two[i]
				for e := range E {
					if math.Float32bits(f.lgts[e]) != math.Float32bits(o.lgts[e]) {
						t.Fatalf("token %d logit %d: %g, Linear gives %g", i, e, f.lgts[e], o.lgts[e])
					}
					want, mag := 0.0, 0.0
					for c := range C {
						v := wf[e*C+c] * float64(xs[i*C+c])
						want += v
						mag += math.Abs(v)
					}
					if d := math.Abs(float64(f.lgts[e]) - want); !(d <= 1e-5*mag) {
						t.Fatalf("token %d logit %d: %g, float64 %g (error %.3g of Σ|w·x| %.3g)", i, e, f.lgts[e], want, d, mag)
					}
				}
				for j := range K {
					if f.ids[j] != o.ids[j] || math.Float32bits(f.w[j]) != math.Float32bits(o.w[j]) {
						t.Fatalf("token %d: ids %v weights %v; Route gives %v %v", i, f.ids, f.w, o.ids, o.w)
					}
				}
				if tc.badHash && i == 1 {
					for j := range K {
						if !math.IsNaN(float64(f.w[j])) {
							t.Fatalf("token 1 has hash id %d out of range but weights %v", E, f.w)
						}
					}
					continue
				}
				var b64 []float64
				if tc.bias {
					b64 = f64s(bias)
				}
				var h []int
				if tc.hash {
					for _, v := range hash[i*K : (i+1)*K] {
						h = append(h, int(v))
					}
				}
				wantIDs, wantW := ref.Route(f64s(f.lgts), b64, h, K, float64(tc.scale))
				for j := range K {
					if int(f.ids[j]) != wantIDs[j] {
						t.Fatalf("token %d: ids %v, float64 reference %v", i, f.ids, wantIDs)
					}
				}
				expectRel(t, fmt.Sprint("token ", i, " weights"), f.w, wantW, 1e-5)
			}
		})
	}
}

// gateBenchSites is how many distinct gates BenchmarkGateRoute's cold case
// cycles through: V4-Flash's 43 layers (2 MiB each, 86 MiB in all, more
// than the H200's L2), so each router reads its gate from HBM.
const gateBenchSites = 43

// BenchmarkGateRoute times one token's router at V4-Flash's shapes (BF16
// gate 256x4096, top 6 of 256 with bias, scale 1.5; "hash": a hash layer;
// "score16": the synth model's 16x4096 gate) captured in a CUDA graph:
// "two" is Linear then Route, "fused" GateRoute's gate_route, "wide",
// "wide4" and "wide1" gate_route_w ($MOXIE_CUDA_GATEROUTE_V=wide, wide:4,
// wide:1: planned, 4 and 1 warps a block). "hot" replays fuseGraphCalls
// routers over one gate (in L2); "cold" one router on each of
// gateBenchSites gates in turn. It reports device microseconds per router.
func BenchmarkGateRoute(b *testing.B) {
	dev := testDevice(b)
	b.Setenv("MOXIE_CUDA_GATEROUTE_V", "")
	defer os.Setenv("MOXIE_CUDA_GATEROUTE_V", "")
	const C, K = 4096, 6
	paths := []struct{ name, v string }{{"two", ""}, {"fused", "old"}, {"wide", "wide"}, {"wide4", "wide:4"}, {"wide1", "wide:1"}}
	for _, cold := range []bool{false, true} {
		for _, layer := range []string{"score", "hash", "score16"} {
			for _, pth := range paths {
				kind, path, hash, E := "hot", pth.name, layer == "hash", 256
				if cold {
					kind = "cold"
				}
				if layer == "score16" {
					E = 16
				}
				fusedPath := pth.v != ""
				b.Run(kind+"/"+layer+"/"+path, func(b *testing.B) {
					var us float64
					err := dev.Do(func(c *Ctx) error {
						d := &devBufs{c: c}
						defer d.free()
						rng := rand.New(rand.NewPCG(5, 6))
						sites := 1
						if cold {
							sites = gateBenchSites
						}
						wd := computetest.RandomWeight(rng, compute.BF16, E, C, 0.02)
						gates := make([]*DeviceWeight, sites)
						for i := range gates {
							gates[i] = d.weight(wd)
						}
						x := d.floats(computetest.Normal(rng, C, 1))
						bias := d.floats(computetest.Normal(rng, E, 0.1))
						var ph DevicePtr
						if hash {
							ph = d.int32s([]int32{3, 77, 140, 9, 255, 31})
						}
						ids, w, lg := d.alloc(4*K), d.alloc(4*K), d.alloc(4*E)
						d.check(c.LoadOps())
						d.check(c.LoadRoute())
						d.synced()
						if d.err != nil {
							return d.err
						}
						os.Setenv("MOXIE_CUDA_GATEROUTE_V", pth.v)
						s := c.Stream()
						one := func() error {
							for _, g := range gates {
								if fusedPath {
									if err := c.GateRoute(ids, w, lg, g, x, bias, ph, E, K, 1.5, s); err != nil {
										return err
									}
									continue
								}
								if err := c.Linear(g, lg, x, 1, s); err != nil {
									return err
								}
								if err := c.Route(ids, w, lg, bias, ph, 1, E, K, 1.5, s); err != nil {
									return err
								}
							}
							return nil
						}
						calls := fuseGraphCalls
						if cold {
							calls = 1
						}
						var err error
						us, err = graphTime(b, c, calls, one)
						us /= float64(sites)
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(us, "device-us/op")
				})
			}
		}
	}
}

// TestGateRouteEmulated runs gate_route on the CPU (emuHarness; no GPU
// needed) beside linear.cu's linear_fast<BF16, 1, 2, 4> (the kernel Linear
// launches for the gate, 8 warps per block) and ops.cu's route, compiled
// from their own sources, and requires the same logits, ids and weights bit
// for bit: V4-Flash's gate (256x4096, top 6, scale 1.5) with bias (launched
// twice: the arrival counter must be back at 0), hash routing, 255 experts
// without bias, and tied logits (duplicated gate rows, top 8). Skipped with
// -short or without g++.
func TestGateRouteEmulated(t *testing.T) {
	lin := cutSource(t, "linear.cu", LinearSource(), "template <int FMT> struct Fmt;", "#define LIN(FMTN")
	ops := OpsSource()
	rank := cutSource(t, "ops.cu", ops, "__device__ __forceinline__ u32 rank_key(float f)", "\n}\n") + "\n}\n"
	route := cutSource(t, "ops.cu", ops, "#define ROUTE_EPL 8", "// SwiGLU: h = silu",
		"extern __shared__ u64 rsm[];", "u64 *rsm = g_rsm;")
	gr := cutSource(t, "route.cu", RouteSource(), "#define GR_RB", "")
	kern := "#define FMT_FP8 1\n#define FMT_MXFP4 2\n#define FMT_BF16 3\n#define FMT_F32 4\n#define FMT_MXFP8 5\n" +
		"void e4m3x4_bits(u32, float *); void e4m3x4(u32, float *); void e2m1x8_bits(u32, float *); void e2m1x8(u32, float *); float e8m0(u8);\n" +
		lin + rank + route + gr
	lines := runEmulation(t, kern, gateRouteEmuMain)
	if len(lines) != 6 {
		t.Fatalf("emulation printed %d lines, want 6:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for _, l := range lines {
		t.Log(l)
	}
}

const gateRouteEmuMain = `#include "harness.h"
#include "kern.inc"
int main() {
  const int C = 4096;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  int bad = 0;
  struct Case { const char *name; int E, K, bias, hash, ties, reps; };
  Case cs[] = {{"v4 bias", 256, 6, 1, 0, 0, 2}, {"v4 hash", 256, 6, 0, 1, 0, 1}, {"255 experts", 255, 6, 0, 0, 0, 1}, {"ties top 8", 256, 8, 0, 0, 1, 1}};
  for (const Case &c : cs) {
    const int E = c.E, K = c.K;
    std::vector<u16> W(E * C);
    for (auto &w : W) { float v = nd(rng) * 0.02f; u32 u; memcpy(&u, &v, 4); w = (u16)(u >> 16); }
    if (c.ties) for (int r = 1; r < E; r += 2) memcpy(&W[r * C], &W[(r - 1) * C], 2 * C);
    std::vector<float> x(C), bias(E); std::vector<int> hash(K);
    for (auto &v : x) v = nd(rng);
    for (auto &v : bias) v = nd(rng) * 0.1f;
    for (auto &h : hash) h = rng() % E;
    std::vector<float> lg1(E), lg2(E), w1(K), w2(K); std::vector<int> id1(K), id2(K);
    LinArgs a{}; a.W = (const u8 *)W.data(); a.S = (const u8 *)W.data(); a.x = x.data(); a.y = lg2.data(); a.rows = E; a.cols = C;
    a.sdivr = 1; a.sdivc = 1; a.rpg = E; a.xstride = C; a.ystride = E; a.batch = 1;
    launch((E + 1) / 2, 256, [=] { linear_fast<FMT_BF16, 1, 2, 4, 0>(a); });
    const float *pb = c.bias ? bias.data() : nullptr; const int *ph = c.hash ? hash.data() : nullptr;
    int *pi2 = id2.data(); float *pw2 = w2.data(); const float *pl2 = lg2.data();
    std::vector<u64> shm(2 * E + 64);
    g_rsm = shm.data();
    launch(1, 32, [=] { route(pi2, pw2, pl2, pb, ph, E, K, 1.5f); });
    for (int rep = 0; rep < c.reps; rep++) {
      std::fill(lg1.begin(), lg1.end(), NAN); std::fill(w1.begin(), w1.end(), NAN); std::fill(id1.begin(), id1.end(), -7);
      int *pi1 = id1.data(); float *pw1 = w1.data(); float *pl1 = lg1.data(); const uint2 *pW = (const uint2 *)W.data(); const float *px = x.data();
      launch((E + 1) / 2, 256, [=] { gate_route(pi1, pw1, pl1, pW, px, pb, ph, E, C, K, 1.5f); });
      bool ok = gr_arrivals == 0;
      if (!ok) printf("%s: arrival counter %u after the launch FAIL\n", c.name, gr_arrivals);
      for (int e = 0; e < E; e++) if (memcmp(&lg1[e], &lg2[e], 4)) { ok = false; printf("%s: logit %d %g, linear_fast %g FAIL\n", c.name, e, lg1[e], lg2[e]); break; }
      for (int j = 0; j < K; j++) if (id1[j] != id2[j] || memcmp(&w1[j], &w2[j], 4)) { ok = false; printf("%s: slot %d: %d %g, route %d %g FAIL\n", c.name, j, id1[j], w1[j], id2[j], w2[j]); }
      printf("%s launch %d: %s, ids", c.name, rep, ok ? "ok" : "FAIL");
      for (int j = 0; j < K; j++) printf(" %d:%g", id1[j], w1[j]);
      printf("\n");
      bad += !ok;
    }
  }
  printf("done\n");
  return bad;
}
`

// TestGateRouteWideEmulated runs gate_route_w on the CPU (emuHarness; no
// GPU needed) beside gate_route, both compiled from route.cu, and requires
// the same logits, ids and weights bit for bit, with the ticket counter
// back at 0 after every launch: gate rows of 4096 columns taken by kw 8
// warps (V4-Flash's gate: one pass a warp) and by kw 2 (four passes a
// warp), each with 1 warp a block (a row's warps spread over blocks) and 8
// or 4 (whole rows a block), the first case's launches twice on the same
// buffers (the partial sums poisoned between); and first, for many shapes,
// that every L2 hint range grw_pf gives a block (MOXIE_PDL_PF) lies inside
// one gate row and inside the words the block's warps read;
// with bias, hash ids, 255 experts without bias and tied logits (duplicated
// gate rows, top 8). Skipped with -short or without g++.
func TestGateRouteWideEmulated(t *testing.T) {
	if testing.Short() {
		t.Skip("host emulation of gate_route_w: skipped with -short")
	}
	gr := cutSource(t, "route.cu", RouteSource(), "#define GR_RB", "")
	lines := runEmulation(t, gr, gateRouteWideEmuMain)
	if len(lines) == 0 || lines[len(lines)-1] != "done" {
		t.Fatalf("emulation did not finish:\n%s", strings.Join(lines, "\n"))
	}
	const want = 2 + 2*2*2 + 4*2*2 // "pf ranges", "done", the first case's 2 kw x 2 wb x 2 launches, the others' 2 x 2 x 1
	if len(lines) != want {
		t.Fatalf("emulation printed %d lines, want %d:\n%s", len(lines), want, strings.Join(lines, "\n"))
	}
	for _, l := range lines {
		t.Log(l)
	}
}

const gateRouteWideEmuMain = `#include "harness.h"
#include "kern.inc"
int main() {
  const int C = 4096;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  int bad = 0;
  // grw_pf: every range lies inside one gate row and inside the block's
  // words (those its warps read: whole rows, or its slices of each pass);
  // whole-row blocks ask for exactly their rows.
  int pfbad = 0;
  for (int E : {256, 255, 16, 8}) for (int cols : {4096, 7168, 512, 64}) for (int kw : {1, 2, 4, 8}) for (int wb : {1, 2, 4, 8}) {
    if (kw % wb && wb % kw) continue;
    const int nw = cols / 4, blocks = (E * kw + wb - 1) / wb;
    blockDim = {(unsigned)(32 * wb), 1, 1};
    for (int b = 0; b < blocks; b++) {
      blockIdx = {(unsigned)b, 0, 0};
      const GrwPF f = grw_pf(E, cols, kw);
      std::vector<char> mine((size_t)E * nw, 0);
      for (int wp = 0; wp < wb; wp++) {
        const int u = b * wb + wp;
        if (u >= E * kw) continue;
        const int r = u / kw, q = u % kw;
        for (int k0 = q * 128; k0 < nw; k0 += kw * 128) for (int j = k0; j < k0 + 128 && j < nw; j++) mine[(size_t)r * nw + j] = 1;
      }
      long long asked = 0;
      for (int c = 0; c < f.count; c++) {
        const long long lo = f.off + c * f.stride / 8, hi = lo + f.bytes / 8;
        bool in = lo >= 0 && hi <= (long long)E * nw && hi > lo && (wb >= kw || lo / nw == (hi - 1) / nw);
        for (long long j = lo; in && j < hi; j++) in = mine[j];
        if (!in) { pfbad++; if (pfbad < 5) printf("pf E %d cols %d kw %d wb %d block %d range %d [%lld, %lld) outside the block's words FAIL\n", E, cols, kw, wb, b, c, lo, hi); }
        asked += hi - lo;
      }
      if (wb >= kw) {
        long long n = 0;
        for (char m : mine) n += m;
        if (asked != n) { pfbad++; if (pfbad < 5) printf("pf E %d cols %d kw %d wb %d block %d: asks %lld words of %lld FAIL\n", E, cols, kw, wb, b, asked, n); }
      }
    }
  }
  printf("pf ranges: %s\n", pfbad ? "FAIL" : "ok");
  bad += pfbad;
  struct Case { const char *name; int E, K, bias, hash, ties; };
  Case cs[] = {{"v4 bias", 256, 6, 1, 0, 0}, {"v4 hash", 256, 6, 1, 1, 0}, {"255 experts", 255, 6, 0, 0, 0},
               {"ties top 8", 256, 8, 0, 0, 1}, {"16 experts", 16, 6, 1, 0, 0}};
  for (const Case &c : cs) {
    const int E = c.E, K = c.K;
    std::vector<u16> W(E * C);
    for (auto &w : W) { float v = nd(rng) * 0.02f; u32 u; memcpy(&u, &v, 4); w = (u16)(u >> 16); }
    if (c.ties) for (int r = 1; r < E; r += 2) memcpy(&W[r * C], &W[(r - 1) * C], 2 * C);
    std::vector<float> x(C), bias(E); std::vector<int> hash(K);
    for (auto &v : x) v = nd(rng);
    for (auto &v : bias) v = nd(rng) * 0.1f;
    for (auto &h : hash) h = rng() % E;
    const float *pb = c.bias ? bias.data() : nullptr; const int *ph = c.hash ? hash.data() : nullptr;
    const uint2 *pW = (const uint2 *)W.data(); const float *px = x.data();
    for (int kw : {8, 2}) {
      std::vector<float> lg0(E), w0(K); std::vector<int> id0(K);
      int *pi0 = id0.data(); float *pw0 = w0.data(); float *pl0 = lg0.data();
      launch((E + 1) / 2, 32 * kw, [=] { gate_route(pi0, pw0, pl0, pW, px, pb, ph, E, C, K, 1.5f); });
      for (int wb : {1, kw == 8 ? 8 : 4}) {
        const unsigned blocks = (E * kw + wb - 1) / wb;
        for (int rep = 0; rep < (&c == cs ? 2 : 1); rep++) {
          std::vector<float> lg1(E, NAN), w1(K, NAN); std::vector<int> id1(K, -7);
          if (rep) std::fill(grw_part, grw_part + GR_MAXE * GR_MAXW, NAN);
          int *pi1 = id1.data(); float *pw1 = w1.data(); float *pl1 = lg1.data();
          launch(blocks, 32 * wb, [=] { gate_route_w(pi1, pw1, pl1, pW, px, pb, ph, E, C, K, 1.5f, kw); });
          bool ok = grw_arrivals == 0;
          if (!ok) printf("%s kw %d wb %d: ticket counter %u after the launch FAIL\n", c.name, kw, wb, grw_arrivals);
          for (int e = 0; e < E; e++) if (memcmp(&lg1[e], &lg0[e], 4)) { ok = false; printf("%s kw %d wb %d: logit %d %g, gate_route %g FAIL\n", c.name, kw, wb, e, lg1[e], lg0[e]); break; }
          for (int j = 0; j < K; j++) if (id1[j] != id0[j] || memcmp(&w1[j], &w0[j], 4)) { ok = false; printf("%s kw %d wb %d: slot %d: %d %g, gate_route %d %g FAIL\n", c.name, kw, wb, j, id1[j], w1[j], id0[j], w0[j]); }
          printf("%s kw %d wb %d (%u blocks) launch %d: %s, ids", c.name, kw, wb, blocks, rep, ok ? "ok" : "FAIL");
          for (int j = 0; j < K; j++) printf(" %d:%g", id1[j], w1[j]);
          printf("\n");
          bad += !ok;
        }
      }
    }
  }
  printf("done\n");
  return bad;
}
`

// gateRouteWideVariants are the $MOXIE_CUDA_GATEROUTE_V values
// TestGateRouteWide compares with gate_route.
var gateRouteWideVariants = []string{"wide", "wide:1", "wide:2", "wide:4", "wide:8"}

// TestGateRouteWide checks that every gate_route_w variant
// ($MOXIE_CUDA_GATEROUTE_V=wide, wide:1 ... wide:8; those a gate's warps a
// row do not fit are skipped) gives gate_route's logits, ids and weights bit
// for bit (TestGateRoute ties gate_route to Linear, Route and float64) at
// TestGateRoute's shapes: V4-Flash's router with and without bias, hash
// rows (one out of range: NaN weights), tied logits, odd and long rows,
// 16 experts (the synth model's router), three tokens in turn on the same
// buffers. Then each variant is captured once in a CUDA graph and replayed
// five times on new inputs, the outputs poisoned before each replay: the
// ticket counter must come back to 0 for every replay to finish its
// selection.
func TestGateRouteWide(t *testing.T) {
	t.Setenv("MOXIE_CUDA_GATEROUTE_V", "")
	for _, tc := range []struct {
		name             string
		experts, cols, k int
		bias, hash, ties bool
		badHash          bool
		scale            float32
	}{
		{name: "v4_bias", experts: 256, cols: 4096, k: 6, bias: true, scale: 1.5},
		{name: "v4_nobias", experts: 256, cols: 4096, k: 6, scale: 1.5},
		{name: "v4_hash", experts: 256, cols: 4096, k: 6, bias: true, hash: true, scale: 1.5},
		{name: "v4_hash_bad", experts: 256, cols: 4096, k: 6, hash: true, badHash: true, scale: 1.5},
		{name: "v4_ties", experts: 256, cols: 4096, k: 6, ties: true, scale: 1.5},
		{name: "odd_rows", experts: 255, cols: 4096, k: 8, bias: true, scale: 2.5},
		{name: "long_rows", experts: 64, cols: 7168, k: 6, bias: true, scale: 1},
		{name: "synth16", experts: 16, cols: 4096, k: 6, bias: true, scale: 1.5},
		{name: "tiny", experts: 8, cols: 64, k: 2, bias: true, scale: 1},
		{name: "all", experts: 16, cols: 512, k: 16, scale: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			E, C, K := tc.experts, tc.cols, tc.k
			const tokens, replays = 3, 5
			rng := rand.New(rand.NewPCG(uint64(E)+7, uint64(C+K)))
			wd := computetest.RandomWeight(rng, compute.BF16, E, C, 0.02)
			if tc.ties {
				rb := 2 * C
				for r := 1; r < E; r += 2 {
					copy(wd.Data[r*rb:(r+1)*rb], wd.Data[(r-1)*rb:r*rb])
				}
			}
			xs := computetest.Normal(rng, tokens*C, 1)
			xr := computetest.Normal(rng, replays*C, 1)
			bias := computetest.Normal(rng, E, 0.1)
			hash := make([]int32, tokens*K)
			for i := range hash {
				hash[i] = int32(rng.IntN(E))
			}
			if tc.badHash {
				hash[K+1] = int32(E) // token 1
			}
			type out struct {
				ids     []int32
				w, lgts []float32
			}
			var skipped []string
			var errs []string
			same := func(what string, a, b out) {
				for e := range a.lgts {
					if math.Float32bits(a.lgts[e]) != math.Float32bits(b.lgts[e]) {
						errs = append(errs, fmt.Sprintf("%s: logit %d %g, gate_route %g", what, e, a.lgts[e], b.lgts[e]))
						return
					}
				}
				for j := range a.ids {
					if a.ids[j] != b.ids[j] || math.Float32bits(a.w[j]) != math.Float32bits(b.w[j]) {
						errs = append(errs, fmt.Sprintf("%s: ids %v weights %v; gate_route %v %v", what, a.ids, a.w, b.ids, b.w))
						return
					}
				}
			}
			onDevice(t, func(c *Ctx, d *devBufs) {
				defer os.Setenv("MOXIE_CUDA_GATEROUTE_V", "")
				kw, err := gateRouteWarps(E, C, c.d.info.SMs, c.d.info.SharedOptin)
				d.check(err)
				gate := d.weight(wd)
				x, xg := d.floats(xs), d.alloc(4*C)
				var pb, ph DevicePtr
				if tc.bias {
					pb = d.floats(bias)
				}
				if tc.hash {
					ph = d.int32s(hash)
				}
				ids, w, lg := d.poisoned(K), d.poisoned(K), d.poisoned(E)
				ids0, w0, lg0 := d.poisoned(K), d.poisoned(K), d.poisoned(E)
				d.check(c.LoadRoute())
				d.synced()
				if d.err != nil {
					return
				}
				s := c.Stream()
				get := func(ids, w, lg DevicePtr) out {
					return out{d.getInt32s(ids, K), d.getFloats(w, K), d.getFloats(lg, E)}
				}
				old := func(xi, hi DevicePtr) out {
					os.Setenv("MOXIE_CUDA_GATEROUTE_V", "old")
					d.check(c.GateRoute(ids0, w0, lg0, gate, xi, pb, hi, E, K, tc.scale, s))
					return get(ids0, w0, lg0)
				}
				poison := func() {
					for _, p := range []struct {
						p DevicePtr
						n int
					}{{ids, K}, {w, K}, {lg, E}} {
						d.check(c.Memset(p.p, 0xff, 4*p.n, s))
					}
				}
				for _, v := range gateRouteWideVariants {
					pv, _ := ParseGateRouteVariant(v)
					if _, _, err := planGateRouteWide(E, kw, c.d.info.SMs, pv.Warps); err != nil {
						skipped = append(skipped, fmt.Sprintf("%s (%v)", v, err))
						continue
					}
					for i := range tokens {
						xi := x + DevicePtr(4*i*C)
						var hi DevicePtr
						if ph != 0 {
							hi = ph + DevicePtr(4*i*K)
						}
						want := old(xi, hi)
						os.Setenv("MOXIE_CUDA_GATEROUTE_V", v)
						d.check(c.GateRoute(ids, w, lg, gate, xi, pb, hi, E, K, tc.scale, s))
						got := get(ids, w, lg)
						if d.err != nil {
							return
						}
						same(fmt.Sprintf("%s token %d", v, i), got, want)
						if tc.badHash && i == 1 {
							for j := range K {
								if !math.IsNaN(float64(got.w[j])) {
									errs = append(errs, fmt.Sprintf("%s token 1: hash id %d out of range but weights %v", v, E, got.w))
									break
								}
							}
						}
					}
					// Graph: one capture, replays on new x (hash row of token 0).
					os.Setenv("MOXIE_CUDA_GATEROUTE_V", v)
					d.check(c.BeginCapture(s))
					if d.err != nil {
						return
					}
					err := c.GateRoute(ids, w, lg, gate, xg, pb, ph, E, K, tc.scale, s)
					g, err2 := c.EndCapture(s)
					d.check(err)
					d.check(err2)
					if d.err != nil {
						return
					}
					for r := range replays {
						d.check(c.CopyToDevice(xg, f32Bytes(xr[r*C:(r+1)*C])))
						poison()
						d.check(c.LaunchGraph(g, s))
						d.check(c.Sync(s))
						got := get(ids, w, lg)
						want := old(xg, ph)
						if d.err != nil {
							break
						}
						same(fmt.Sprintf("%s graph replay %d", v, r), got, want)
					}
					d.check(c.DestroyGraph(g))
				}
			})
			for _, s := range skipped {
				t.Logf("skipped %s", s)
			}
			for _, e := range errs {
				t.Error(e)
			}
		})
	}
}

// f32Bytes returns x's bytes (little-endian float32s).
func f32Bytes(x []float32) []byte {
	b := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}
