package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"moxie/compute"
	"moxie/compute/computetest"
	"moxie/compute/ref"
)

// The GPU tests of ops.go call the Ctx methods directly (device buffers in,
// device buffers out) at the model's shapes, batched where the op is batched,
// against compute/ref (float64) or compute.TopK. The compliance suite
// (TestCompliance in cuda_test.go) runs the same kernels through Backend.

// devBufs allocates and uploads test buffers on one Ctx, on the device
// thread. It never calls t.Fatal (that would end the device goroutine): the
// first error sticks in err, later calls do nothing and return zero values,
// and onDevice fails the test with it once back on the test goroutine.
type devBufs struct {
	c      *Ctx
	live   []DevicePtr
	arenas []*Arena
	err    error
}

// check records err (the first one wins).
func (d *devBufs) check(err error) {
	if d.err == nil && err != nil {
		d.err = err
	}
}

func (d *devBufs) alloc(n int) DevicePtr {
	if d.err != nil {
		return 0
	}
	p, err := d.c.MemAlloc(max(n, 4))
	if err != nil {
		d.check(fmt.Errorf("MemAlloc(%d): %w", n, err))
		return 0
	}
	d.live = append(d.live, p)
	return p
}

func (d *devBufs) bytes(b []byte) DevicePtr {
	p := d.alloc(len(b))
	if d.err == nil && len(b) > 0 {
		d.check(d.c.CopyToDevice(p, b))
	}
	return p
}

func (d *devBufs) floats(x []float32) DevicePtr {
	if len(x) == 0 {
		return d.alloc(4)
	}
	return d.bytes(unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x)))
}

func (d *devBufs) int32s(x []int32) DevicePtr {
	if len(x) == 0 {
		return d.alloc(4)
	}
	return d.bytes(unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x)))
}

// poisoned allocates n floats filled with NaN (every output must be written).
func (d *devBufs) poisoned(n int) DevicePtr {
	p := d.alloc(4 * n)
	if d.err == nil {
		d.check(d.c.Memset(p, 0xff, 4*n, d.c.Stream()))
	}
	return p
}

// weight uploads a weight into its own arena.
func (d *devBufs) weight(w compute.WeightData) *DeviceWeight {
	if d.err != nil {
		return &DeviceWeight{}
	}
	a, err := d.c.NewArena(len(w.Data) + len(w.Scale) + 2*ArenaAlign)
	if err != nil {
		d.check(err)
		return &DeviceWeight{}
	}
	d.arenas = append(d.arenas, a)
	dw, err := d.c.UploadWeight(a, w)
	if err != nil {
		d.check(err)
		return &DeviceWeight{}
	}
	return dw
}

// synced waits for the uploads (pageable copies on the legacy stream).
func (d *devBufs) synced() {
	if d.err == nil {
		d.check(d.c.Sync(Stream{}))
	}
}

func (d *devBufs) getFloats(p DevicePtr, n int) []float32 {
	out := make([]float32, n)
	if d.err == nil {
		d.check(d.c.CopyFloatsFromDevice(out, p))
	}
	return out
}

func (d *devBufs) getInt32s(p DevicePtr, n int) []int32 {
	out := make([]int32, n)
	if d.err == nil && n > 0 {
		d.check(d.c.CopyFromDevice(unsafe.Slice((*byte)(unsafe.Pointer(&out[0])), 4*n), p))
	}
	return out
}

func (d *devBufs) free() {
	for _, p := range d.live {
		_ = d.c.MemFree(p)
	}
	for _, a := range d.arenas {
		_ = d.c.ReleaseArena(a)
	}
}

// onDevice runs f on the test device's thread with a devBufs that is freed
// afterwards, then fails the test (on the test goroutine) if any device call
// failed. f must not call t.Fatal; it hands its results out through captured
// variables, which the caller compares after onDevice returns.
func onDevice(t *testing.T, f func(c *Ctx, d *devBufs)) {
	t.Helper()
	dev := testDevice(t)
	err := dev.Do(func(c *Ctx) error {
		d := &devBufs{c: c}
		defer d.free()
		f(c, d)
		return d.err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func f64s(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

func expectRel(t *testing.T, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	if r := computetest.MaxRel(got, want); !(r <= tol) {
		t.Errorf("%s: max relative error %.3g > %.3g", what, r, tol)
	}
}

func TestOpsTopK(t *testing.T) {
	type tc struct {
		name string
		n, k int
		gen  func(rng *rand.Rand, i int) float32
	}
	normal := func(rng *rand.Rand, i int) float32 { return float32(rng.NormFloat64()) }
	few := func(rng *rand.Rand, i int) float32 { return float32(rng.IntN(7)) - 3 } // heavy ties
	nan := float32(math.NaN())
	cases := []tc{
		{"1M_k2048", 1 << 20, 2048, normal},
		{"1M_k1", 1 << 20, 1, normal},
		{"1M_k6", 1 << 20, 6, normal},
		{"300k_ties_k2048", 300000, 2048, few},
		{"1M_all_equal", 1 << 20, 2048, func(*rand.Rand, int) float32 { return 0 }},
		{"nan_some", 5000, 1000, func(rng *rand.Rand, i int) float32 {
			if rng.IntN(3) == 0 {
				return nan
			}
			return float32(rng.NormFloat64())
		}},
		{"nan_most", 5000, 2048, func(rng *rand.Rand, i int) float32 { // k exceeds the numbers: NaNs fill in index order
			if rng.IntN(10) != 0 {
				return nan
			}
			return float32(rng.NormFloat64())
		}},
		{"all_nan", 3000, 100, func(*rand.Rand, int) float32 { return nan }},
		{"signed_zero_inf", 4096, 2048, func(rng *rand.Rand, i int) float32 {
			switch rng.IntN(5) {
			case 0:
				return float32(math.Copysign(0, -1))
			case 1:
				return 0
			case 2:
				return float32(math.Inf(-1))
			case 3:
				return float32(math.Inf(1))
			}
			return -float32(rng.ExpFloat64())
		}},
		{"k_eq_n", 2048, 2048, normal},
		{"n1", 1, 1, normal},
		{"n33_k5", 33, 5, few},
		{"k_not_pow2", 100003, 1500, normal},
		{"subnormals", 10000, 700, func(rng *rand.Rand, i int) float32 {
			return math.Float32frombits(uint32(rng.IntN(1 << 23))) // positive subnormals and 0
		}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(21, uint64(i)))
			sc := make([]float32, tc.n)
			for j := range sc {
				sc[j] = tc.gen(rng, j)
			}
			var got []int32
			onDevice(t, func(c *Ctx, d *devBufs) {
				ds := d.floats(sc)
				idx := d.poisoned(tc.k)
				d.synced()
				d.check(c.TopK(idx, ds, tc.n, tc.k, c.Stream()))
				got = d.getInt32s(idx, tc.k)
			})
			want := compute.TopK(nil, sc, tc.k)
			for j := range want {
				if int(got[j]) != want[j] {
					t.Fatalf("idx[%d] = %d (score %g), want %d (score %g); got[:8] = %v, want[:8] = %v",
						j, got[j], scoreAt(sc, got[j]), want[j], sc[want[j]], got[:min(8, len(got))], want[:min(8, len(want))])
				}
			}
		})
	}
}

// TestOpsTopKRows ranks rows of different lengths in one launch (the
// indexer's causal prefix per token), each against compute.TopK.
func TestOpsTopKRows(t *testing.T) {
	const stride, k = 5000, 512
	ns := []int32{0, 1, 100, 511, 512, 513, 4999, 5000, 7000, -3} // 7000 and -3 are clamped
	rows := len(ns)
	rng := rand.New(rand.NewPCG(27, 1))
	sc := make([]float32, rows*stride)
	for i := range sc {
		sc[i] = float32(rng.IntN(50)) // ties across and within rows
	}
	var got []int32
	onDevice(t, func(c *Ctx, d *devBufs) {
		ds, dn := d.floats(sc), d.int32s(ns)
		d.synced()
		idx := d.poisoned(rows * k)
		d.check(c.TopKRows(idx, ds, dn, rows, stride, k, c.Stream()))
		got = d.getInt32s(idx, rows*k)
	})
	for r, n32 := range ns {
		n := min(max(int(n32), 0), stride)
		want := compute.TopK(nil, sc[r*stride:r*stride+n], k)
		row := got[r*k : (r+1)*k]
		for j := range k {
			w := -1
			if j < len(want) {
				w = want[j]
			}
			if int(row[j]) != w {
				t.Fatalf("row %d (n %d): idx[%d] = %d, want %d", r, n, j, row[j], w)
			}
		}
	}
}

func scoreAt(sc []float32, i int32) float32 {
	if i < 0 || int(i) >= len(sc) {
		return float32(math.NaN())
	}
	return sc[i]
}

func TestOpsRoute(t *testing.T) {
	const E, k, batch = 256, 6, 9
	rng := rand.New(rand.NewPCG(22, 1))
	logits := computetest.Normal(rng, batch*E, 2)
	logits[3] = 25     // beyond the softplus threshold
	logits[E+7] = -40  // softplus underflows to ~0
	for e := range E { // token 2: all tied
		logits[2*E+e] = 0.5
	}
	bias := computetest.Normal(rng, E, 0.3)
	hash := make([]int32, batch*k)
	for i := range hash {
		hash[i] = int32(rng.IntN(E))
	}
	for _, mode := range []string{"scores", "bias", "hash", "hash+bias"} {
		t.Run(mode, func(t *testing.T) {
			useBias, useHash := strings.Contains(mode, "bias"), strings.HasPrefix(mode, "hash")
			var gi []int32
			var gw []float32
			onDevice(t, func(c *Ctx, d *devBufs) {
				dl := d.floats(logits)
				var pb, ph DevicePtr
				if useBias {
					pb = d.floats(bias)
				}
				if useHash {
					ph = d.int32s(hash)
				}
				d.synced()
				ids, w := d.poisoned(batch*k), d.poisoned(batch*k)
				d.check(c.Route(ids, w, dl, pb, ph, batch, E, k, 2.5, c.Stream()))
				gi, gw = d.getInt32s(ids, batch*k), d.getFloats(w, batch*k)
			})
			for b := range batch {
				var b64 []float64
				if useBias {
					b64 = f64s(bias)
				}
				var hrow []int
				if useHash {
					for _, e := range hash[b*k : (b+1)*k] {
						hrow = append(hrow, int(e))
					}
				}
				wantIDs, wantW := ref.Route(f64s(logits[b*E:(b+1)*E]), b64, hrow, k, 2.5)
				for j := range k {
					if int(gi[b*k+j]) != wantIDs[j] {
						t.Fatalf("token %d: ids %v, want %v", b, gi[b*k:(b+1)*k], wantIDs)
					}
				}
				expectRel(t, fmt.Sprint("token ", b, " weights"), gw[b*k:(b+1)*k], wantW, 1e-5)
			}
			if !useHash && !useBias {
				for j := range k { // the tied token takes experts 0..k-1 in order
					if gi[2*k+j] != int32(j) {
						t.Fatalf("tied token: ids %v, want 0..%d", gi[2*k:3*k], k-1)
					}
				}
			}
		})
	}
	t.Run("bad_hash_id", func(t *testing.T) {
		bad := append([]int32(nil), hash[:k]...)
		bad[2] = E // out of range: the token's weights are NaN
		var gw []float32
		onDevice(t, func(c *Ctx, d *devBufs) {
			dl, dbad := d.floats(logits[:E]), d.int32s(bad)
			d.synced()
			ids, w := d.poisoned(k), d.alloc(4*k)
			d.check(c.Route(ids, w, dl, 0, dbad, 1, E, k, 1, c.Stream()))
			gw = d.getFloats(w, k)
		})
		for j, v := range gw {
			if v == v {
				t.Fatalf("weight %d = %g with an out-of-range hash id, want NaN", j, v)
			}
		}
	})
}

func TestOpsEmbedBF16(t *testing.T) {
	const V, dim, hc = 50, 70, 4
	rng := rand.New(rand.NewPCG(23, 1))
	table := make([]byte, 2*V*dim)
	for i := range V * dim {
		h := uint16(rng.Uint32())
		if h&0x7f80 == 0x7f80 {
			h &^= 0x4000 // no Inf/NaN codes: compare values exactly
		}
		table[2*i], table[2*i+1] = byte(h), byte(h>>8)
	}
	tokens := []int32{3, 0, 49, 3, 17, 48, 1}
	var got []float32
	onDevice(t, func(c *Ctx, d *devBufs) {
		dt, dk := d.bytes(table), d.int32s(tokens)
		d.synced()
		x := d.poisoned(len(tokens) * hc * dim)
		d.check(c.EmbedBF16(x, dt, dk, len(tokens), dim, hc, c.Stream()))
		got = d.getFloats(x, len(tokens)*hc*dim)
	})
	for i, tok := range tokens {
		for j := range hc {
			for ch := range dim {
				o := 2 * (int(tok)*dim + ch)
				want := math.Float32frombits(uint32(table[o])<<16 | uint32(table[o+1])<<24)
				if g := got[(i*hc+j)*dim+ch]; g != want {
					t.Fatalf("x[%d, %d, %d] = %g, want %g (token %d)", i, j, ch, g, want, tok)
				}
			}
		}
	}
}

func TestOpsAxpyScale(t *testing.T) {
	for _, n := range []int{1, 257, 1000003} {
		t.Run(fmt.Sprint("n=", n), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(24, uint64(n)))
			x, y := computetest.Normal(rng, n, 1), computetest.Normal(rng, n, 1)
			const a, s = float32(-0.75), float32(3.5)
			var ax, sc []float32
			onDevice(t, func(c *Ctx, d *devBufs) {
				dx, dy := d.floats(x), d.floats(y)
				d.synced()
				d.check(c.Axpy(dy, dx, a, n, c.Stream()))
				ax = d.getFloats(dy, n)
				d.check(c.Scale(dy, s, n, c.Stream()))
				d.check(c.Axpy(dy, dx, a, 0, c.Stream())) // n == 0: no-ops
				d.check(c.Scale(dy, s, 0, c.Stream()))
				sc = d.getFloats(dy, n)
			})
			want := make([]float64, n)
			for i := range want {
				want[i] = float64(y[i]) + float64(a)*float64(x[i])
			}
			expectRel(t, "axpy", ax, want, 1e-6)
			for i := range want {
				want[i] *= float64(s)
			}
			expectRel(t, "scale", sc, want, 1e-6)
		})
	}
}

// TestOpsBatched runs the per-row ops at prefill batches and the model's
// widths, and the single-query ops at V4-Flash's head shapes and long key sets.
func TestOpsBatched(t *testing.T) {
	rng := rand.New(rand.NewPCG(25, 1))
	t.Run("RMSNorm", func(t *testing.T) {
		for _, sh := range [][2]int{{300, 4096}, {1, 7168}, {4096, 512}, {3, 33}} {
			rows, dim := sh[0], sh[1]
			x, w := computetest.Normal(rng, rows*dim, 2), computetest.Normal(rng, dim, 1)
			var got, inPlace []float32
			onDevice(t, func(c *Ctx, d *devBufs) {
				dx, dw := d.floats(x), d.floats(w)
				d.synced()
				y := d.poisoned(rows * dim)
				d.check(c.RMSNorm(y, dx, dw, rows, dim, 1e-6, c.Stream()))
				got = d.getFloats(y, rows*dim)
				d.check(c.RMSNorm(dx, dx, 0, rows, dim, 1e-6, c.Stream())) // in place, unweighted
				inPlace = d.getFloats(dx, rows*dim)
			})
			expectRel(t, fmt.Sprint("rows ", rows, " dim ", dim), got, ref.RMSNorm(f64s(x), f64s(w), dim, 1e-6), computetest.TolElemwise)
			expectRel(t, fmt.Sprint("in place rows ", rows, " dim ", dim), inPlace, ref.RMSNorm(f64s(x), nil, dim, 1e-6), computetest.TolElemwise)
		}
	})
	for _, sh := range []struct {
		f            compute.Format
		hc, D, batch int
	}{{compute.F32, 4, 4096, 1}, {compute.F32, 4, 4096, 5}, {compute.F32, 4, 4096, 37}, {compute.BF16, 4, 4096, 2},
		{compute.BF16, 4, 4096, 70}, {compute.F32, 6, 100, 3}, {compute.F32, 6, 100, 20}} { // hc 6: comb on one thread
		f, hc, D, batch := sh.f, sh.hc, sh.D, sh.batch
		t.Run(fmt.Sprintf("HCMix_%s_hc%d_b%d", f, hc, batch), func(t *testing.T) {
			nm := (2 + hc) * hc
			// Mix logits of O(0.3): the float32 dot error stays far below TolHCMix.
			fd := computetest.RandomWeight(rng, f, nm, hc*D, 0.3/math.Sqrt(float64(hc*D)))
			hd := fd // the head collapse: the first hc rows of the same Fn
			hd.Rows = hc
			hd.Data = fd.Data[:len(fd.Data)*hc/nm]
			base, scale := computetest.Normal(rng, nm, 1), computetest.Normal(rng, 3, 1)
			scale[2] = 4
			x := computetest.Normal(rng, batch*hc*D, 1)
			var gp, gq, gc, gh []float32
			onDevice(t, func(c *Ctx, d *devBufs) {
				p := &HC{Fn: d.weight(fd), Base: d.floats(base), Scale: d.floats(scale), HC: hc, Iters: 20, Eps: 1e-6, NormEps: 1e-6}
				ph := &HC{Fn: d.weight(hd), Base: p.Base, Scale: p.Scale, HC: hc, Iters: 20, Eps: 1e-6, NormEps: 1e-6}
				dx := d.floats(x)
				d.synced()
				pre, post, comb, hp := d.poisoned(batch*hc), d.poisoned(batch*hc), d.poisoned(batch*hc*hc), d.poisoned(batch*hc)
				if d.err == nil {
					d.check(c.HCMix(pre, post, comb, dx, p, batch, c.Stream()))
					d.check(c.HCHeadPre(hp, dx, ph, batch, c.Stream()))
				}
				gp, gq, gc, gh = d.getFloats(pre, batch*hc), d.getFloats(post, batch*hc), d.getFloats(comb, batch*hc*hc), d.getFloats(hp, batch*hc)
			})
			fn, hfn := ref.Dequant(fd), ref.Dequant(hd)
			for b := range batch {
				xb := f64s(x[b*hc*D : (b+1)*hc*D])
				wp, wq, wc := ref.HCMix(xb, fn, f64s(base), f64s(scale), hc, 20, 1e-6, 1e-6)
				expectRel(t, fmt.Sprint("pre ", b), gp[b*hc:(b+1)*hc], wp, computetest.TolHCMix)
				expectRel(t, fmt.Sprint("post ", b), gq[b*hc:(b+1)*hc], wq, computetest.TolHCMix)
				expectRel(t, fmt.Sprint("comb ", b), gc[b*hc*hc:(b+1)*hc*hc], wc, computetest.TolHCMix)
				want := ref.HCHeadPre(xb, hfn, f64s(base[:hc]), f64s(scale[:1]), hc, 1e-6, 1e-6)
				expectRel(t, fmt.Sprint("head pre ", b), gh[b*hc:(b+1)*hc], want, computetest.TolHCMix)
			}
		})
	}
	t.Run("HCCollapseExpand", func(t *testing.T) {
		const hc, dim, batch = 4, 4096, 65
		x, o := computetest.Normal(rng, batch*hc*dim, 1), computetest.Normal(rng, batch*dim, 1)
		pre, post, comb := computetest.Normal(rng, batch*hc, 1), computetest.Normal(rng, batch*hc, 1), computetest.Normal(rng, batch*hc*hc, 1)
		var gy, gout []float32
		onDevice(t, func(c *Ctx, d *devBufs) {
			dx, do, dpre, dpost, dcomb := d.floats(x), d.floats(o), d.floats(pre), d.floats(post), d.floats(comb)
			d.synced()
			y, out := d.poisoned(batch*dim), d.poisoned(batch*hc*dim)
			d.check(c.HCCollapse(y, dx, dpre, hc, dim, batch, c.Stream()))
			d.check(c.HCExpand(out, dx, do, dpost, dcomb, hc, dim, batch, c.Stream()))
			gy, gout = d.getFloats(y, batch*dim), d.getFloats(out, batch*hc*dim)
		})
		for b := range batch {
			xs := f64s(x[b*hc*dim : (b+1)*hc*dim])
			expectRel(t, fmt.Sprint("collapse ", b), gy[b*dim:(b+1)*dim], ref.HCCollapse(xs, f64s(pre[b*hc:(b+1)*hc]), hc, dim), computetest.TolElemwise)
			expectRel(t, fmt.Sprint("expand ", b), gout[b*hc*dim:(b+1)*hc*dim],
				ref.HCExpand(xs, f64s(o[b*dim:(b+1)*dim]), f64s(post[b*hc:(b+1)*hc]), f64s(comb[b*hc*hc:(b+1)*hc*hc]), hc, dim), computetest.TolElemwise)
		}
	})
	t.Run("RoPE", func(t *testing.T) {
		const rows, heads, dim = 70, 64, 512
		freq := compute.RopeFreqs(160000, 64, &compute.YaRN{Factor: 16, OriginalSeqLen: 65536, BetaFast: 32, BetaSlow: 1})
		pos := make([]int32, rows)
		for i := range pos {
			pos[i] = int32(rng.IntN(1 << 20))
		}
		x := computetest.Normal(rng, rows*heads*dim, 1)
		for _, inv := range []bool{false, true} {
			var got, back []float32
			onDevice(t, func(c *Ctx, d *devBufs) {
				dx, dp, df := d.floats(x), d.int32s(pos), d.floats(freq)
				d.synced()
				d.check(c.RoPE(dx, dp, df, rows, heads*dim, dim, len(freq), inv, c.Stream()))
				got = d.getFloats(dx, rows*heads*dim)
				d.check(c.RoPE(dx, dp, df, rows, heads*dim, dim, len(freq), !inv, c.Stream()))
				back = d.getFloats(dx, rows*heads*dim)
			})
			for i := range rows {
				want := ref.RoPE(f64s(x[i*heads*dim:(i+1)*heads*dim]), int(pos[i]), freq, dim, inv)
				expectRel(t, fmt.Sprint("row ", i, " inverse ", inv), got[i*heads*dim:(i+1)*heads*dim], want, computetest.TolElemwise)
			}
			expectRel(t, fmt.Sprint("round trip, inverse first ", inv), back, f64s(x), computetest.TolElemwise)
		}
	})
	t.Run("Attention", func(t *testing.T) {
		for _, sh := range [][3]int{{64, 512, 8192}, {64, 512, 640}, {64, 512, 1}, {8, 1024, 300}, {3, 5, 7}, {16, 128, 129}} {
			heads, dim, nKeys := sh[0], sh[1], sh[2]
			q, kv := computetest.Normal(rng, heads*dim, 1), computetest.Normal(rng, nKeys*dim, 1)
			sinks := computetest.Normal(rng, heads, 2)
			sinks[0] = 30
			scale := float32(1 / math.Sqrt(float64(dim)))
			var got []float32
			onDevice(t, func(c *Ctx, d *devBufs) {
				dq, dkv, ds := d.floats(q), d.floats(kv), d.floats(sinks)
				d.synced()
				o := d.poisoned(heads * dim)
				d.check(c.Attention(o, dq, dkv, ds, nKeys, heads, dim, scale, c.Stream()))
				got = d.getFloats(o, heads*dim)
			})
			want := ref.Attention(f64s(q), f64s(kv), f64s(sinks), nKeys, heads, dim, float64(scale))
			for h := range heads {
				expectRel(t, fmt.Sprintf("heads %d dim %d keys %d: head %d", heads, dim, nKeys, h), got[h*dim:(h+1)*dim], want[h*dim:(h+1)*dim], computetest.TolAttention)
			}
		}
	})
	t.Run("CompressPool", func(t *testing.T) {
		for _, sh := range [][2]int{{8, 1024}, {128, 512}, {1, 3}} {
			slots, width := sh[0], sh[1]
			kv, z := computetest.Normal(rng, slots*width, 1), computetest.Normal(rng, slots*width, 3)
			var got []float32
			onDevice(t, func(c *Ctx, d *devBufs) {
				dkv, dz := d.floats(kv), d.floats(z)
				d.synced()
				out := d.poisoned(width)
				d.check(c.CompressPool(out, dkv, dz, slots, width, c.Stream()))
				got = d.getFloats(out, width)
			})
			expectRel(t, fmt.Sprint("slots ", slots), got, ref.CompressPool(f64s(kv), f64s(z), slots, width), computetest.TolElemwise)
		}
	})
	t.Run("IndexScores", func(t *testing.T) {
		// 64x128 is V4-Flash's indexer (shared-memory kernel); 8x1024 does
		// not fit shared memory (one thread per key).
		for _, sh := range [][3]int{{64, 128, 5003}, {64, 128, 1}, {8, 1024, 333}, {3, 7, 40}} {
			heads, dim, nKeys := sh[0], sh[1], sh[2]
			q, w, keys := computetest.Normal(rng, heads*dim, 1), computetest.Normal(rng, heads, 1), computetest.Normal(rng, nKeys*dim, 1)
			var got []float32
			onDevice(t, func(c *Ctx, d *devBufs) {
				dq, dw, dk := d.floats(q), d.floats(w), d.floats(keys)
				d.synced()
				sc := d.poisoned(nKeys)
				d.check(c.IndexScores(sc, dq, dw, dk, nKeys, heads, dim, c.Stream()))
				got = d.getFloats(sc, nKeys)
			})
			expectRel(t, fmt.Sprintf("heads %d dim %d keys %d", heads, dim, nKeys), got,
				ref.IndexScores(f64s(q), f64s(w), f64s(keys), nKeys, heads, dim), computetest.TolLinear)
		}
	})
	t.Run("SwiGLU", func(t *testing.T) {
		const rows, width = 129, 2048
		g, u := computetest.Normal(rng, rows*width, 8), computetest.Normal(rng, rows*width, 8)
		rs := computetest.Normal(rng, rows, 1)
		var got [2][]float32
		var inPlace []float32
		onDevice(t, func(c *Ctx, d *devBufs) {
			dg, du, dr := d.floats(g), d.floats(u), d.floats(rs)
			d.synced()
			for i, limit := range []float32{0, 10} {
				h := d.poisoned(rows * width)
				d.check(c.SwiGLU(h, dg, du, dr, rows, width, limit, c.Stream()))
				got[i] = d.getFloats(h, rows*width)
			}
			d.check(c.SwiGLU(dg, dg, du, 0, rows, width, 0, c.Stream())) // in place over g, no row scale
			inPlace = d.getFloats(dg, rows*width)
		})
		for i, limit := range []float32{0, 10} {
			for r := range rows {
				want := ref.SwiGLU(f64s(g[r*width:(r+1)*width]), f64s(u[r*width:(r+1)*width]), float64(rs[r]), float64(limit))
				expectRel(t, fmt.Sprint("limit ", limit, " row ", r), got[i][r*width:(r+1)*width], want, computetest.TolElemwise)
			}
		}
		for r := range rows {
			want := ref.SwiGLU(f64s(g[r*width:(r+1)*width]), f64s(u[r*width:(r+1)*width]), 1, 0)
			expectRel(t, fmt.Sprint("in place row ", r), inPlace[r*width:(r+1)*width], want, computetest.TolElemwise)
		}
	})
}

// TestOpsErrors checks that bad sizes and null buffers give an error naming
// the op, before anything touches the device (so it runs without a GPU).
func TestOpsErrors(t *testing.T) {
	c := &Ctx{} // no device: the argument checks must return first
	const p = DevicePtr(1 << 20)
	f32w := &DeviceWeight{Format: compute.F32, Rows: 24, Cols: 16, Data: p, Scale: p}
	fp8w := &DeviceWeight{Format: compute.FP8Block, Rows: 24, Cols: 16, Data: p, Scale: p}
	goodHC := HC{Fn: f32w, Base: p, Scale: p, HC: 4, Iters: 20, Eps: 1e-6, NormEps: 1e-6}
	hc := func(mod func(h *HC)) *HC { h := goodHC; mod(&h); return &h }
	s := Stream{}
	cases := []opCall{
		{"RMSNorm", func() error { return c.RMSNorm(p, p, 0, 0, 8, 1e-6, s) }},
		{"RMSNorm", func() error { return c.RMSNorm(p, p, 0, 4, -1, 1e-6, s) }},
		{"RMSNorm", func() error { return c.RMSNorm(0, p, 0, 4, 8, 1e-6, s) }},
		{"HCMix", func() error { return c.HCMix(p, p, p, p, nil, 1, s) }},
		{"HCMix", func() error { return c.HCMix(p, p, p, p, hc(func(h *HC) { h.Fn = fp8w }), 1, s) }},
		{"HCMix", func() error { return c.HCMix(p, p, p, p, hc(func(h *HC) { h.HC = 3 }), 1, s) }},
		{"HCMix", func() error { return c.HCMix(p, p, p, p, &goodHC, 0, s) }},
		{"HCMix", func() error { return c.HCMix(p, 0, p, p, &goodHC, 1, s) }},
		{"HCMix", func() error { return c.HCMix(p, p, p, p, hc(func(h *HC) { h.Base = 0 }), 1, s) }},
		{"HCHeadPre", func() error { return c.HCHeadPre(p, p, &goodHC, 1, s) }}, // Fn has 24 rows, head wants 4
		{"HCCollapse", func() error { return c.HCCollapse(p, p, p, 4, 0, 1, s) }},
		{"HCCollapse", func() error { return c.HCCollapse(p, p, p, 4, 8, 70000, s) }},
		{"HCExpand", func() error { return c.HCExpand(p, p, p, p, p, 0, 8, 1, s) }},
		{"HCExpand", func() error { return c.HCExpand(p, p, p+8, p+12, p+16, 4, 8, 1, s) }}, // out aliases x
		{"RoPE", func() error { return c.RoPE(p, p, p, 2, 64, 16, 9, false, s) }},           // 2·9 > 16
		{"RoPE", func() error { return c.RoPE(p, p, p, 2, 60, 16, 4, false, s) }},           // rowLen % dim
		{"RoPE", func() error { return c.RoPE(p, 0, p, 2, 64, 16, 4, false, s) }},
		{"Attention", func() error { return c.Attention(p, p, p, p, 10, 4, 2048, 1, s) }},
		{"Attention", func() error { return c.Attention(p, p, p, p, -1, 4, 64, 1, s) }},
		{"Attention", func() error { return c.Attention(p, p, 0, p, 10, 4, 64, 1, s) }},
		{"CompressPool", func() error { return c.CompressPool(p, p, p, 0, 8, s) }},
		{"IndexScores", func() error { return c.IndexScores(p, p, p, p, -3, 4, 8, s) }},
		{"IndexScores", func() error { return c.IndexScores(p, p, p, p, 5, 0, 8, s) }},
		{"IndexScores", func() error { return c.IndexScores(0, p, p, p, 5, 4, 8, s) }},
		{"TopK", func() error { return c.TopK(p, p, 10, 11, s) }},
		{"TopK", func() error { return c.TopK(p, p, 1<<20, OpsMaxTopK+1, s) }},
		{"TopK", func() error { return c.TopK(p, p, -1, 0, s) }},
		{"TopK", func() error { return c.TopK(0, p, 10, 3, s) }},
		{"TopKRows", func() error { return c.TopKRows(p, p, p, 0, 10, 3, s) }},
		{"TopKRows", func() error { return c.TopKRows(p, p, p, 2, 10, OpsMaxTopK+1, s) }},
		{"TopKRows", func() error { return c.TopKRows(p, p, 0, 2, 10, 3, s) }},
		{"Route", func() error { return c.Route(p, p, p, 0, 0, 1, 8, 9, 1, s) }},
		{"Route", func() error { return c.Route(p, p, p, 0, 0, 0, 8, 2, 1, s) }},
		{"Route", func() error { return c.Route(p, p, p, 0, 0, 1, OpsMaxExperts+1, 2, 1, s) }},
		{"Route", func() error { return c.Route(p, 0, p, 0, 0, 1, 8, 2, 1, s) }},
		{"SwiGLU", func() error { return c.SwiGLU(p, p, p, 0, 3, 0, 0, s) }},
		{"SwiGLU", func() error { return c.SwiGLU(p, p, p, 0, 3, 8, -1, s) }},
		{"SwiGLU", func() error { return c.SwiGLU(p, p, p, 0, 3, 8, float32(math.NaN()), s) }},
		{"EmbedBF16", func() error { return c.EmbedBF16(p, p, p, 0, 8, 4, s) }},
		{"EmbedBF16", func() error { return c.EmbedBF16(p, 0, p, 2, 8, 4, s) }},
		{"Axpy", func() error { return c.Axpy(p, p, 1, -1, s) }},
		{"Axpy", func() error { return c.Axpy(p, 0, 1, 5, s) }},
		{"Scale", func() error { return c.Scale(0, 1, 5, s) }},
	}
	expectOpErrors(t, cases)
}

// opCall is a call with bad arguments that must fail naming op.
type opCall struct {
	op   string
	call func() error
}

// expectOpErrors runs each call as a subtest (no device: the argument
// checks return first) and fails it unless it returns an error that
// contains "cuda <op>:".
func expectOpErrors(t *testing.T, cases []opCall) {
	for i, tc := range cases {
		t.Run(fmt.Sprint(i, "_", tc.op), func(t *testing.T) {
			err := tc.call()
			if err == nil {
				t.Fatal("bad arguments accepted")
			}
			if !strings.Contains(err.Error(), "cuda "+tc.op+":") {
				t.Fatalf("error %q does not name %s", err, tc.op)
			}
		})
	}
}

// TestOpsNoops checks the documented no-op sizes (no device needed).
func TestOpsNoops(t *testing.T) {
	c := &Ctx{}
	s := Stream{}
	for name, call := range map[string]func() error{
		"TopK k=0":        func() error { return c.TopK(0, 0, 5, 0, s) },
		"IndexScores n=0": func() error { return c.IndexScores(0, 0, 0, 0, 0, 4, 8, s) },
		"Axpy n=0":        func() error { return c.Axpy(0, 0, 1, 0, s) },
		"Scale n=0":       func() error { return c.Scale(0, 1, 0, s) },
	} {
		if err := call(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// benchOp times f (which enqueues one op on the compute stream) with CUDA
// events around b.N back-to-back calls, after one warm-up call (which also
// compiles or loads the ops module), and reports device microseconds per call.
// Tiny kernels are bound by the host's launch rate (see NOTES.md), which the
// figure then measures instead.
func benchOp(b *testing.B, setup func(c *Ctx, d *devBufs) func() error) {
	dev := testDevice(b)
	var us float64
	err := dev.Do(func(c *Ctx) error {
		d := &devBufs{c: c}
		defer d.free()
		f := setup(c, d)
		d.synced()
		if d.err != nil {
			return d.err
		}
		if err := f(); err != nil {
			return err
		}
		if err := c.Sync(c.Stream()); err != nil {
			return err
		}
		b.ResetTimer()
		ms, err := deviceMS(c, c.Stream(), repeat(b.N, f))
		b.StopTimer()
		us = ms * 1000 / float64(b.N)
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(us, "device-us/op")
}

func BenchmarkOpsTopK(b *testing.B) {
	for _, sh := range [][2]int{{1 << 20, 2048}, {1 << 18, 512}, {16384, 512}} {
		n, k := sh[0], sh[1]
		b.Run(fmt.Sprintf("n%d_k%d", n, k), func(b *testing.B) {
			benchOp(b, func(c *Ctx, d *devBufs) func() error {
				sc := computetest.Normal(rand.New(rand.NewPCG(1, 1)), n, 1)
				ds, idx := d.floats(sc), d.alloc(4*k)
				return func() error { return c.TopK(idx, ds, n, k, c.Stream()) }
			})
		})
	}
}

func BenchmarkOpsHCMix(b *testing.B) {
	const hc, D = 4, 4096
	for _, batch := range []int{1, 16, 256} {
		b.Run(fmt.Sprint("b", batch), func(b *testing.B) {
			benchOp(b, func(c *Ctx, d *devBufs) func() error {
				rng := rand.New(rand.NewPCG(2, 2))
				nm := (2 + hc) * hc
				p := &HC{Fn: d.weight(computetest.RandomWeight(rng, compute.F32, nm, hc*D, 0.02)),
					Base: d.floats(computetest.Normal(rng, nm, 1)), Scale: d.floats(computetest.Normal(rng, 3, 1)),
					HC: hc, Iters: 20, Eps: 1e-6, NormEps: 1e-6}
				x := d.floats(computetest.Normal(rng, batch*hc*D, 1))
				pre, post, comb := d.alloc(4*batch*hc), d.alloc(4*batch*hc), d.alloc(4*batch*hc*hc)
				return func() error { return c.HCMix(pre, post, comb, x, p, batch, c.Stream()) }
			})
		})
	}
}

func BenchmarkOpsAttention(b *testing.B) {
	const heads, dim = 64, 512
	for _, nKeys := range []int{640, 8192} {
		b.Run(fmt.Sprint("keys", nKeys), func(b *testing.B) {
			benchOp(b, func(c *Ctx, d *devBufs) func() error {
				rng := rand.New(rand.NewPCG(3, 3))
				q, kv := d.floats(computetest.Normal(rng, heads*dim, 1)), d.floats(computetest.Normal(rng, nKeys*dim, 1))
				sinks, o := d.floats(computetest.Normal(rng, heads, 1)), d.alloc(4*heads*dim)
				return func() error { return c.Attention(o, q, kv, sinks, nKeys, heads, dim, 0.044, c.Stream()) }
			})
		})
	}
}

func BenchmarkOpsRMSNorm(b *testing.B) {
	for _, sh := range [][2]int{{1, 4096}, {64, 512}, {4096, 4096}} {
		rows, dim := sh[0], sh[1]
		b.Run(fmt.Sprintf("%dx%d", rows, dim), func(b *testing.B) {
			benchOp(b, func(c *Ctx, d *devBufs) func() error {
				rng := rand.New(rand.NewPCG(4, 4))
				x, w := d.floats(computetest.Normal(rng, rows*dim, 1)), d.floats(computetest.Normal(rng, dim, 1))
				return func() error { return c.RMSNorm(x, x, w, rows, dim, 1e-6, c.Stream()) }
			})
		})
	}
}

func BenchmarkOpsRoute(b *testing.B) {
	const E, k = 256, 6
	for _, batch := range []int{1, 4096} {
		b.Run(fmt.Sprint("b", batch), func(b *testing.B) {
			benchOp(b, func(c *Ctx, d *devBufs) func() error {
				rng := rand.New(rand.NewPCG(5, 5))
				lg, bias := d.floats(computetest.Normal(rng, batch*E, 2)), d.floats(computetest.Normal(rng, E, 0.3))
				ids, w := d.alloc(4*batch*k), d.alloc(4*batch*k)
				return func() error { return c.Route(ids, w, lg, bias, 0, batch, E, k, 2.5, c.Stream()) }
			})
		})
	}
}

// TestOpsBackend checks what the compliance suite does not: that Backend
// keeps host aliasing (SwiGLU's h over g or u) correct, and that it panics,
// naming the op, on shapes the host backends reject.
func TestOpsBackend(t *testing.T) {
	dev := testDevice(t)
	b, err := NewBackend(dev, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	rng := rand.New(rand.NewPCG(26, 1))
	const rows, width = 3, 40
	g, u := computetest.Normal(rng, rows*width, 4), computetest.Normal(rng, rows*width, 4)
	rs := []float32{0.5, 2, -1}
	for _, alias := range []string{"g", "u"} {
		t.Run("SwiGLU_h="+alias, func(t *testing.T) {
			gc, uc := append([]float32(nil), g...), append([]float32(nil), u...)
			h := gc
			if alias == "u" {
				h = uc
			}
			b.SwiGLU(h, gc, uc, rs, width, 10)
			for r := range rows {
				want := ref.SwiGLU(f64s(g[r*width:(r+1)*width]), f64s(u[r*width:(r+1)*width]), float64(rs[r]), 10)
				expectRel(t, fmt.Sprint("row ", r), h[r*width:(r+1)*width], want, computetest.TolElemwise)
			}
		})
	}
	panics := []struct {
		op   string
		call func()
	}{
		{"RMSNorm", func() { b.RMSNorm(make([]float32, 8), make([]float32, 16), nil, 8, 1e-6) }},
		{"SwiGLU", func() { b.SwiGLU(make([]float32, 8), make([]float32, 8), make([]float32, 8), []float32{1, 1, 1}, 4, 0) }},
		{"Route", func() { b.Route(make([]int, 2), make([]float32, 2), make([]float32, 8), nil, []int{1, 8}, 1) }},
		{"Attention", func() {
			b.Attention(make([]float32, 8), make([]float32, 8), make([]float32, 7), []float32{0, 0}, 2, 2, 4, 1)
		}},
		{"HCCollapse", func() { b.HCCollapse(make([]float32, 4), make([]float32, 15), make([]float32, 4), 4, 4, 1) }},
	}
	for _, tc := range panics {
		t.Run("panic_"+tc.op, func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil {
					t.Fatal("bad shapes accepted")
				}
				if msg := fmt.Sprint(r); !strings.Contains(msg, "cuda."+tc.op) {
					t.Fatalf("panic %q does not name cuda.%s", msg, tc.op)
				}
			}()
			tc.call()
		})
	}
}

// TestOpsLoad loads the ops module and looks up every kernel ops.go launches.
func TestOpsLoad(t *testing.T) {
	dev := testDevice(t)
	err := dev.Do(func(c *Ctx) error {
		t0 := time.Now()
		if err := c.LoadOps(); err != nil {
			return err
		}
		m, err := c.opsModule()
		if err != nil {
			return err
		}
		t.Logf("ops module: from cache %v, NVRTC %v, load %v", m.FromCache, m.CompileTime, time.Since(t0))
		for _, name := range opsKernelNames {
			if _, err := m.Kernel(name); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func BenchmarkOpsTopKRows(b *testing.B) {
	const rows, stride, k = 64, 16384, 512
	benchOp(b, func(c *Ctx, d *devBufs) func() error {
		rng := rand.New(rand.NewPCG(6, 6))
		ns := make([]int32, rows)
		for i := range ns {
			ns[i] = int32(stride - rows + i)
		}
		sc, dn := d.floats(computetest.Normal(rng, rows*stride, 1)), d.int32s(ns)
		idx := d.alloc(4 * rows * k)
		return func() error { return c.TopKRows(idx, sc, dn, rows, stride, k, c.Stream()) }
	})
}

// TestHCSplitShape checks the split-K launch shape against its contract:
// row groups of at most hcSplitRB covering every row, no empty row group or
// chunk, chunks covering every quad, at most hcMaxSplits, whole warps, and at
// least hcMinBlocks blocks per token group at the V4 shapes. The wanted row
// group sizes and split counts are worked out by hand (24 mix rows + Σx²:
// 5 groups of 5 rows × 64 splits; 4 head rows + Σx²: 5 × 1 × 64; 128 rows +
// Σx²: 17 groups of 8 × 16 splits).
func TestHCSplitShape(t *testing.T) {
	for _, tc := range []struct {
		rows, n, wantRB, wantSplits int
	}{{24, 16384, 5, 64}, {4, 16384, 1, 64}, {48, 600, 7, 50}, {24, 8, 5, 2}, {128, 16384, 8, 16}, {1, 4, 1, 1}, {3, 1 << 20, 1, 64}} {
		t.Run(fmt.Sprintf("rows%d_n%d", tc.rows, tc.n), func(t *testing.T) {
			rb, groups, splits, cq, threads := hcSplitShape(tc.rows, tc.n)
			nq, r1 := tc.n/4, tc.rows+1
			if rb != tc.wantRB || splits != tc.wantSplits {
				t.Errorf("%d rows a group, %d splits; want %d, %d", rb, splits, tc.wantRB, tc.wantSplits)
			}
			if rb < 1 || rb > hcSplitRB || rb*groups < r1 || (groups-1)*rb >= r1 {
				t.Errorf("%d groups × %d rows for %d rows: want groups of 1..%d rows, none empty, covering all", groups, rb, r1, hcSplitRB)
			}
			if splits < 1 || splits > hcMaxSplits || cq < 1 || splits*cq < nq || (splits-1)*cq >= nq {
				t.Errorf("splits %d × %d quads for %d quads: want 1..%d non-empty chunks covering all", splits, cq, nq, hcMaxSplits)
			}
			if threads%32 != 0 || threads < 32 || threads > 256 {
				t.Errorf("threads %d: want a multiple of 32 in [32, 256]", threads)
			}
			if tc.n == 16384 && splits*groups < hcMinBlocks {
				t.Errorf("%d blocks per token group, want at least %d", splits*groups, hcMinBlocks)
			}
		})
	}
}

func TestHCSplitAligned(t *testing.T) {
	for _, tc := range []struct {
		x, fn DevicePtr
		n     int
		code  int32
		want  bool
	}{
		{0x1000, 0x2000, 16384, 4, true},
		{0x1000, 0x2008, 16384, 4, false}, // F32 Fn needs 16 bytes
		{0x1000, 0x2008, 16384, 3, true},  // BF16 Fn needs 8
		{0x1000, 0x2004, 16384, 3, false},
		{0x1008, 0x2000, 16384, 4, false},
		{0x1000, 0x2000, 606, 4, false}, // rows not in whole quads
	} {
		if got := hcSplitAligned(tc.x, tc.fn, tc.n, tc.code); got != tc.want {
			t.Errorf("hcSplitAligned(%#x, %#x, %d, %d) = %v, want %v", tc.x, tc.fn, tc.n, tc.code, got, tc.want)
		}
	}
}

// TestOpsHCMixSplit runs HCMix and HCHeadPre with the split path chosen (as
// MOXIE_CUDA_HCMIX=split would) at every batch 1..16 and at larger batches
// (which fall back to the tiled kernels), and at a width that is not whole
// quads (falls back too). Each result is checked against compute/ref, each
// call is made twice and must give the same bits, a token's results must not
// depend on the batch it is in (the split shape does not), and the scratch
// partials of the batch-16 mix must sum to the float64 dots and Σx².
func TestOpsHCMixSplit(t *testing.T) {
	t.Cleanup(splitHCMix(t))
	rng := rand.New(rand.NewPCG(31, 7))
	for _, sh := range []struct {
		f       compute.Format
		hc, D   int
		batches []int
	}{
		{compute.F32, 4, 4096, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 37}},
		{compute.BF16, 4, 4096, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 70}},
		{compute.F32, 6, 100, []int{1, 3, 16, 20}},  // hc 6: comb on one thread
		{compute.F32, 6, 101, []int{1, 16}},         // 606 columns: not whole quads, falls back
		{compute.BF16, 2, 64, []int{1, 5, 16, 17}},  // 128 columns: fewer quads than hcMaxSplits
		{compute.F32, 4, 4096 + 4, []int{1, 9, 16}}, // 16400 columns: a short last chunk
	} {
		f, hc, D := sh.f, sh.hc, sh.D
		t.Run(fmt.Sprintf("%s_hc%d_D%d", f, hc, D), func(t *testing.T) {
			nm, n := (2+hc)*hc, hc*D
			fd := computetest.RandomWeight(rng, f, nm, n, 0.3/math.Sqrt(float64(n)))
			hd := fd
			hd.Rows = hc
			hd.Data = fd.Data[:len(fd.Data)*hc/nm]
			base, scale := computetest.Normal(rng, nm, 1), computetest.Normal(rng, 3, 1)
			scale[2] = 4
			maxB := slices.Max(sh.batches)
			x := computetest.Normal(rng, maxB*n, 1)
			type result struct{ pre, post, comb, head []float32 }
			got := make(map[int][2]result)
			var part []float32
			_, _, splits, _, _ := hcSplitShape(nm, n)
			onDevice(t, func(c *Ctx, d *devBufs) {
				p := &HC{Fn: d.weight(fd), Base: d.floats(base), Scale: d.floats(scale), HC: hc, Iters: 20, Eps: 1e-6, NormEps: 1e-6}
				ph := &HC{Fn: d.weight(hd), Base: p.Base, Scale: p.Scale, HC: hc, Iters: 20, Eps: 1e-6, NormEps: 1e-6}
				dx := d.floats(x)
				d.synced()
				for _, batch := range sh.batches {
					var rs [2]result
					for rep := range rs {
						pre, post, comb, hp := d.poisoned(batch*hc), d.poisoned(batch*hc), d.poisoned(batch*hc*hc), d.poisoned(batch*hc)
						if d.err == nil {
							d.check(c.HCMix(pre, post, comb, dx, p, batch, c.Stream()))
						}
						if batch == 16 && rep == 0 && n%4 == 0 {
							part = d.getFloats(c.d.hcMix.scratch, batch*(nm+1)*splits)
						}
						if d.err == nil {
							d.check(c.HCHeadPre(hp, dx, ph, batch, c.Stream()))
						}
						rs[rep] = result{d.getFloats(pre, batch*hc), d.getFloats(post, batch*hc), d.getFloats(comb, batch*hc*hc), d.getFloats(hp, batch*hc)}
					}
					got[batch] = rs
				}
			})
			fn, hfn := ref.Dequant(fd), ref.Dequant(hd)
			for _, batch := range sh.batches {
				rs := got[batch]
				for i, name := range []string{"pre", "post", "comb", "head pre"} {
					a := [][]float32{rs[0].pre, rs[0].post, rs[0].comb, rs[0].head}[i]
					b := [][]float32{rs[1].pre, rs[1].post, rs[1].comb, rs[1].head}[i]
					if !bitsEqual(a, b) {
						t.Errorf("batch %d: %s differs between two runs", batch, name)
					}
				}
				for b := range batch {
					xb := f64s(x[b*n : (b+1)*n])
					wp, wq, wc := ref.HCMix(xb, fn, f64s(base), f64s(scale), hc, 20, 1e-6, 1e-6)
					what := fmt.Sprintf("batch %d token %d", batch, b)
					expectRel(t, what+" pre", rs[0].pre[b*hc:(b+1)*hc], wp, computetest.TolHCMix)
					expectRel(t, what+" post", rs[0].post[b*hc:(b+1)*hc], wq, computetest.TolHCMix)
					expectRel(t, what+" comb", rs[0].comb[b*hc*hc:(b+1)*hc*hc], wc, computetest.TolHCMix)
					want := ref.HCHeadPre(xb, hfn, f64s(base[:hc]), f64s(scale[:1]), hc, 1e-6, 1e-6)
					expectRel(t, what+" head pre", rs[0].head[b*hc:(b+1)*hc], want, computetest.TolHCMix)
				}
				if one, ok := got[1]; ok && batch <= hcSmallBatch && n%4 == 0 {
					r := rs[0]
					if !bitsEqual(r.pre[:hc], one[0].pre) || !bitsEqual(r.post[:hc], one[0].post) ||
						!bitsEqual(r.comb[:hc*hc], one[0].comb) || !bitsEqual(r.head[:hc], one[0].head) {
						t.Errorf("batch %d: token 0's results differ from batch 1's", batch)
					}
				}
			}
			if part == nil {
				return
			}
			// The partials: Σ_s part[b, r, s] against the float64 dot (row r <
			// nm) or Σx² (row nm), relative to Σ|terms|.
			for b := range 16 {
				xb := x[b*n : (b+1)*n]
				for r := 0; r <= nm; r++ {
					var want, mag float64
					for c, v := range xb {
						w := float64(v)
						if r < nm {
							w = fn[r*n+c]
						}
						want += w * float64(v)
						mag += math.Abs(w * float64(v))
					}
					var sum float64
					for _, v := range part[(b*(nm+1)+r)*splits : (b*(nm+1)+r+1)*splits] {
						sum += float64(v)
					}
					if e := math.Abs(sum-want) / mag; !(e <= 1e-5) {
						t.Errorf("token %d row %d: partials sum to %g, want %g (error %.3g of Σ|terms|)", b, r, sum, want, e)
					}
				}
			}
		})
	}
}

// bitsEqual reports whether a and b hold the same float32 bit patterns.
func bitsEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// BenchmarkOpsHCMixPaths times HCMix (and HCHeadPre) at decode batches on
// both paths, whatever $MOXIE_CUDA_HCMIX says, as a decode step runs them:
// hcGraphCalls calls captured into one CUDA graph, so the host's launch rate
// does not hide the kernels' time. It reports device microseconds per call.
func BenchmarkOpsHCMixPaths(b *testing.B) {
	const hc, D, hcGraphCalls = 4, 4096, 32
	dev := testDevice(b)
	for _, path := range []string{"default", "split"} {
		for _, sh := range []struct {
			name  string
			head  bool
			batch int
		}{{"mix_b1", false, 1}, {"mix_b4", false, 4}, {"mix_b16", false, 16}, {"head_b1", true, 1}} {
			b.Run(path+"/"+sh.name, func(b *testing.B) {
				var us float64
				err := dev.Do(func(c *Ctx) error {
					if _, err := c.hcMixChoice(); err != nil {
						return err
					}
					prev := c.d.hcMix
					defer func() { c.d.hcMix.chosen, c.d.hcMix.split = prev.chosen, prev.split }()
					if err := c.setHCMixSplit(path == "split"); err != nil {
						return err
					}
					d := &devBufs{c: c}
					defer d.free()
					rng := rand.New(rand.NewPCG(2, 2))
					nm := (2 + hc) * hc
					if sh.head {
						nm = hc
					}
					p := &HC{Fn: d.weight(computetest.RandomWeight(rng, compute.F32, nm, hc*D, 0.02)),
						Base: d.floats(computetest.Normal(rng, (2+hc)*hc, 1)), Scale: d.floats(computetest.Normal(rng, 3, 1)),
						HC: hc, Iters: 20, Eps: 1e-6, NormEps: 1e-6}
					x := d.floats(computetest.Normal(rng, sh.batch*hc*D, 1))
					pre, post, comb := d.alloc(4*sh.batch*hc), d.alloc(4*sh.batch*hc), d.alloc(4*sh.batch*hc*hc)
					d.synced()
					if d.err != nil {
						return d.err
					}
					s := c.Stream()
					one := func() error {
						if sh.head {
							return c.HCHeadPre(pre, x, p, sh.batch, s)
						}
						return c.HCMix(pre, post, comb, x, p, sh.batch, s)
					}
					var err error
					us, err = graphTime(b, c, hcGraphCalls, one) // its plain run loads the module before the capture
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
