package cuda

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"moxie/compute"
	"moxie/compute/computetest"
	"moxie/compute/ref"
)

// openOnce shares one Device among the tests of this binary.
var (
	devOnce sync.Once
	devOpen *Device
	devErr  error
)

func testDevice(t testing.TB) *Device {
	t.Helper()
	devOnce.Do(func() { devOpen, devErr = Open(0) })
	if devErr != nil {
		t.Skipf("no GPU: %v", devErr)
	}
	return devOpen
}

func TestMain(m *testing.M) {
	code := m.Run()
	if devOpen != nil {
		devOpen.Close()
	}
	os.Exit(code)
}

func TestOpenErrorNamesCause(t *testing.T) {
	d, err := Open(0)
	if err == nil {
		d.Close()
		t.Skip("a GPU is present; the no-GPU error path is not reachable here")
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Open error %v does not wrap ErrUnavailable", err)
	}
	if err.Error() == ErrUnavailable.Error() {
		t.Fatalf("Open error %q does not say why", err)
	}
}

func TestArena(t *testing.T) {
	const base = DevicePtr(1 << 20)
	a := NewArenaAt(base, 4096+100) // the tail that is not a whole alignment unit is unusable
	p1, err := a.Alloc(1)
	if err != nil || p1 != base {
		t.Fatalf("first Alloc = %#x, %v; want base", p1, err)
	}
	p2, _ := a.Alloc(300) // 512 bytes
	p3, _ := a.Alloc(256)
	if p2 != base+256 || p3 != base+768 {
		t.Fatalf("bump order: %#x %#x, want %#x %#x", p2, p3, base+256, base+768)
	}
	if a.Live() != 1024 {
		t.Fatalf("Live = %d, want 1024", a.Live())
	}
	if _, err := a.Alloc(4096); err == nil {
		t.Fatal("over-allocation succeeded")
	}
	// Free the middle then the first: they merge into one 768-byte hole.
	if err := a.Free(p2); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(p1); err != nil {
		t.Fatal(err)
	}
	if p, _ := a.Alloc(700); p != base {
		t.Fatalf("merged hole not reused: got %#x", p)
	}
	if err := a.Free(p2); err == nil {
		t.Fatal("double free accepted")
	}
	if err := a.Free(base + 8); err == nil {
		t.Fatal("free of an interior pointer accepted")
	}
	if err := a.Free(base + 1<<30); err == nil {
		t.Fatal("free outside the arena accepted")
	}
	if _, err := a.Alloc(0); err == nil {
		t.Fatal("zero-size allocation accepted")
	}
	// Free everything: one span covering the usable size again.
	a.Free(base)
	a.Free(p3)
	if p, err := a.Alloc(4096); err != nil || p != base {
		t.Fatalf("after freeing all, Alloc(4096) = %#x, %v", p, err)
	}
	if a.Peak() < 4096 {
		t.Fatalf("Peak = %d", a.Peak())
	}
}

func TestArenaRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const size = 1 << 20
	a := NewArenaAt(0x1000, size)
	live := map[DevicePtr]int{}
	for range 5000 {
		if len(live) > 0 && rng.IntN(2) == 0 {
			for p := range live {
				if err := a.Free(p); err != nil {
					t.Fatal(err)
				}
				delete(live, p)
				break
			}
			continue
		}
		n := 1 + rng.IntN(20000)
		p, err := a.Alloc(n)
		if err != nil {
			continue
		}
		if uint64(p)%ArenaAlign != 0 || p < 0x1000 || int(p-0x1000)+n > size {
			t.Fatalf("allocation %#x of %d out of bounds or misaligned", p, n)
		}
		for q, m := range live { // no overlap with any live allocation
			if p < q+DevicePtr(m) && q < p+DevicePtr(n) {
				t.Fatalf("allocation [%#x,+%d) overlaps [%#x,+%d)", p, n, q, m)
			}
		}
		live[p] = n
	}
	for p := range live {
		a.Free(p)
	}
	if a.Live() != 0 || a.largest() != size {
		t.Fatalf("after freeing all: live %d, largest free %d", a.Live(), a.largest())
	}
}

func TestCacheKey(t *testing.T) {
	base := CacheKey("src", []string{"-a", "-b"}, 13, 0, 9, 0)
	if base != CacheKey("src", []string{"-a", "-b"}, 13, 0, 9, 0) {
		t.Fatal("key not deterministic")
	}
	variants := map[string]string{
		"source":    CacheKey("src2", []string{"-a", "-b"}, 13, 0, 9, 0),
		"options":   CacheKey("src", []string{"-a"}, 13, 0, 9, 0),
		"opt order": CacheKey("src", []string{"-b", "-a"}, 13, 0, 9, 0),
		"opt split": CacheKey("src", []string{"-a-b"}, 13, 0, 9, 0),
		"nvrtc":     CacheKey("src", []string{"-a", "-b"}, 13, 1, 9, 0),
		"cc":        CacheKey("src", []string{"-a", "-b"}, 13, 0, 8, 9),
	}
	for name, k := range variants {
		if k == base {
			t.Errorf("changing the %s does not change the key", name)
		}
		if len(k) != 64 {
			t.Errorf("key %q is not a hex sha256", k)
		}
	}
}

func TestCacheReadWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sub")
	key := CacheKey("x", nil, 1, 2, 3, 4)
	if _, ok := readCache(dir, key); ok {
		t.Fatal("hit in an empty cache")
	}
	img := append([]byte("\x7fELF"), 1, 2, 3)
	if err := writeCache(dir, key, img); err != nil {
		t.Fatal(err)
	}
	got, ok := readCache(dir, key)
	if !ok || string(got) != string(img) {
		t.Fatalf("read back %q, %v", got, ok)
	}
	// A corrupt entry (not ELF) is a miss, not an error.
	os.WriteFile(filepath.Join(dir, key+".cubin"), []byte("junk"), 0o644)
	if _, ok := readCache(dir, key); ok {
		t.Fatal("corrupt entry returned as a hit")
	}
	if err := writeCache(dir, "../evil", img); err == nil {
		t.Fatal("a key with a path separator was accepted")
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if filepath.Ext(e.Name()) == ".tmp" {
			t.Fatalf("temporary file %s left behind", e.Name())
		}
	}
	t.Setenv("MOXIE_CUDA_CACHE", dir)
	if d, _ := CacheDir(); d != dir {
		t.Fatalf("CacheDir ignores MOXIE_CUDA_CACHE: %s", d)
	}
}

func TestCompliance(t *testing.T) {
	dev := testDevice(t)
	t.Logf("device: %s", dev.Info())
	b, err := NewBackend(dev, 256<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	computetest.RunAll(t, b)
}

// TestLinearShapes checks the fast kernels (and the generic one) at shapes
// that cross chunk, block and batch-tile edges, against the float64 reference
// of compute/ref, with the output poisoned first.
func TestLinearShapes(t *testing.T) {
	dev := testDevice(t)
	cases := []struct {
		f          compute.Format
		rows, cols int
		groups     int
		block      int // FP8Block tile edge; 0 means 128
	}{
		{compute.FP8Block, 300, 1024, 1, 0}, {compute.FP8Block, 257, 2176, 1, 0}, {compute.FP8Block, 256, 640, 4, 0},
		{compute.MXFP4, 200, 4096, 1, 0}, {compute.MXFP4, 129, 2056, 1, 0}, {compute.MXFP4, 64, 512, 2, 0},
		{compute.BF16, 130, 4100, 1, 0}, {compute.BF16, 64, 768, 1, 0}, {compute.BF16, 33, 50, 1, 0},
		{compute.F32, 48, 1028, 1, 0}, {compute.MXFP8, 96, 1056, 1, 0}, {compute.FP8Block, 40, 130, 1, 0},
		{compute.FP8Block, 100, 512, 1, 64}, {compute.FP8Block, 100, 480, 1, 96}, // fast / generic (non-power-of-two block)
		{compute.MXFP4, 66, 2080, 1, 0}, {compute.MXFP8, 34, 2064, 1, 0}, // wide kernels' tail chunk
	}
	variants := testLinearVariants()
	var maxErr = map[string]float64{}
	err := dev.Do(func(c *Ctx) error {
		t0 := time.Now()
		m, err := c.linearModule()
		if err != nil {
			return err
		}
		t.Logf("linear module: from cache %v, NVRTC %v, load %v", m.FromCache, m.CompileTime, time.Since(t0))
		t0 = time.Now()
		bm, err := c.linearBenchModule()
		if err != nil {
			return err
		}
		t.Logf("linear_bench module: from cache %v, NVRTC %v, load %v", bm.FromCache, bm.CompileTime, time.Since(t0))
		a, err := c.NewArena(512 << 20)
		if err != nil {
			return err
		}
		defer c.ReleaseArena(a)
		for i, tc := range cases {
			// One weight per case; x per batch; both shared by the variants.
			block := tc.block
			if block == 0 {
				block = 128
			}
			rng := rand.New(rand.NewPCG(uint64(i), 0))
			d := computetest.Quantize(tc.f, computetest.Normal(rng, tc.rows*tc.cols, 0.05), tc.rows, tc.cols, block)
			W := ref.ParallelDequant(d)
			for _, batch := range []int{1, 2, 3, 5, 16, 19} {
				rng := rand.New(rand.NewPCG(uint64(i), uint64(batch)))
				x := computetest.Normal(rng, batch*tc.groups*tc.cols, 1)
				lr := linRef{W: W, rows: tc.rows, cols: tc.cols, groups: tc.groups, x: f64s(x), batch: batch}
				for _, nv := range variants {
					vname, v := nv.name, nv.v
					if !variantApplies(v, tc.f, min(batch, maxNB)) || batch > maxNB && !variantApplies(v, tc.f, batch-maxNB) {
						continue
					}
					name := fmt.Sprintf("%s_%dx%d_g%d_blk%d_b%d_%s", tc.f, tc.rows, tc.cols, tc.groups, tc.block, batch, vname)
					w, err := c.UploadWeight(a, d)
					if err != nil {
						return err
					}
					dx, _ := a.Alloc(4 * len(x))
					dy, _ := a.Alloc(4 * batch * tc.rows)
					if err := c.CopyFloatsToDevice(dx, x); err != nil {
						return err
					}
					y, err := poisonedLinear(c, w, dy, dx, batch, tc.groups, v)
					if err != nil {
						return fmt.Errorf("%s: %w", name, err)
					}
					e := lr.rel(y)
					key := fmt.Sprintf("%s %s", tc.f, vname)
					maxErr[key] = math.Max(maxErr[key], e)
					if !(e <= computetest.TolLinear) {
						t.Errorf("%s: max relative error %.3g > %.3g", name, e, computetest.TolLinear)
					}
					FreeWeight(a, w)
					a.Free(dx)
					a.Free(dy)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	logMaxErrs(t, maxErr)
}

// TestGraph captures 300 launches that each add 1 to every element and checks
// that replaying the graph (three times) and plain launches give the counts.
func TestGraph(t *testing.T) {
	dev := testDevice(t)
	err := dev.Do(func(c *Ctx) error {
		m, err := c.linearModule()
		if err != nil {
			return err
		}
		k, err := m.Kernel("tiny_add")
		if err != nil {
			return err
		}
		p, err := c.MemAlloc(4 * 32)
		if err != nil {
			return err
		}
		defer c.MemFree(p)
		if err := c.Memset(p, 0, 128, c.Stream()); err != nil {
			return err
		}
		one := float32(1)
		s := c.Stream()
		if err := c.BeginCapture(s); err != nil {
			return err
		}
		for range 300 {
			if err := c.Launch(k, Dim3{X: 1}, Dim3{X: 32}, 0, s, unsafe.Pointer(&p), unsafe.Pointer(&one)); err != nil {
				return err
			}
		}
		g, err := c.EndCapture(s)
		if err != nil {
			return err
		}
		defer c.DestroyGraph(g)
		for range 3 {
			if err := c.LaunchGraph(g, s); err != nil {
				return err
			}
		}
		for range 7 {
			if err := c.Launch(k, Dim3{X: 1}, Dim3{X: 32}, 0, s, unsafe.Pointer(&p), unsafe.Pointer(&one)); err != nil {
				return err
			}
		}
		got := make([]float32, 32)
		if err := c.CopyFloatsFromDevice(got, p); err != nil {
			return err
		}
		for i, v := range got {
			if v != 907 {
				return fmt.Errorf("element %d = %g after 3 graph replays of 300 adds and 7 plain adds, want 907", i, v)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestPinnedRoundTrip copies random bytes host→device→host through pinned
// buffers asynchronously.
func TestPinnedRoundTrip(t *testing.T) {
	dev := testDevice(t)
	err := dev.Do(func(c *Ctx) error {
		const n = 3<<20 + 5
		h, err := c.NewHostBuffer(n)
		if err != nil {
			return err
		}
		defer c.FreeHost(h)
		h2, err := c.NewHostBuffer(n)
		if err != nil {
			return err
		}
		defer c.FreeHost(h2)
		rng := rand.New(rand.NewPCG(3, 3))
		src := h.Bytes()
		for i := range src {
			src[i] = byte(rng.Uint32())
		}
		p, err := c.MemAlloc(n)
		if err != nil {
			return err
		}
		defer c.MemFree(p)
		s := c.Stream()
		if err := c.UploadAsync(p, h, 0, n, s); err != nil {
			return err
		}
		if err := c.DownloadAsync(h2, 0, p, n, s); err != nil {
			return err
		}
		if err := c.Sync(s); err != nil {
			return err
		}
		if string(h2.Bytes()) != string(src) {
			return errors.New("pinned round trip changed the bytes")
		}
		if err := c.UploadAsync(p, h, n-1, 2, s); err == nil {
			return errors.New("an upload past the host buffer's end was accepted")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestMultiLinear checks one launch of several projections (different shapes,
// inputs and outputs) against the float64 reference, per decoder.
func TestMultiLinear(t *testing.T) {
	dev := testDevice(t)
	sets := multiTestSets()
	err := dev.Do(func(c *Ctx) error {
		a, err := c.NewArena(256 << 20)
		if err != nil {
			return err
		}
		defer c.ReleaseArena(a)
		for si, set := range sets {
			mw := newMultiWeights(set.f, set.shape, uint64(si))
			for _, batch := range []int{1, 3, 16} {
				mds := mw.data(batch)
				for _, nv := range multiVariantList() {
					v := nv.v
					if !multiVariantApplies(v, set.f, batch) {
						continue
					}
					a.Reset() // each case allocates afresh (the cases together outgrow the arena)
					var ws []*DeviceWeight
					var ys, xs []DevicePtr
					for i, md := range mds {
						d, x, sh := md.d, md.x, set.shape[i]
						w, err := c.UploadWeight(a, d)
						if err != nil {
							return err
						}
						dx, _ := a.Alloc(4 * len(x))
						dy, _ := a.Alloc(4 * batch * sh[0])
						c.Memset(dy, 0xff, 4*batch*sh[0], c.Stream())
						if err := c.CopyFloatsToDevice(dx, x); err != nil {
							return err
						}
						ws, ys, xs = append(ws, w), append(ys, dy), append(xs, dx)
					}
					m, err := c.PrepareMultiLinear(a, ws, ys, xs, batch, v)
					if err != nil {
						return err
					}
					if err := c.LaunchMultiLinear(m, c.Stream()); err != nil {
						return err
					}
					for i, md := range mds {
						d := md.d
						y := make([]float32, batch*d.Rows)
						if err := c.CopyFloatsFromDevice(y, ys[i]); err != nil {
							return err
						}
						if e := md.ref.rel(y); !(e <= computetest.TolLinear) {
							t.Errorf("%s set, matrix %d [%d, %d], batch %d, variant %+v: max relative error %.3g", set.f, i, d.Rows, d.Cols, batch, v, e)
						}
					}
				}
			}
		}
		// A set that mixes formats is refused.
		d1 := computetest.RandomWeight(rand.New(rand.NewPCG(9, 9)), compute.MXFP4, 8, 64, 1)
		d2 := computetest.RandomWeight(rand.New(rand.NewPCG(9, 9)), compute.BF16, 8, 64, 1)
		w1, _ := c.UploadWeight(a, d1)
		w2, _ := c.UploadWeight(a, d2)
		if _, err := c.PrepareMultiLinear(a, []*DeviceWeight{w1, w2}, make([]DevicePtr, 2), make([]DevicePtr, 2), 1, LinearVariant{}); err == nil {
			t.Error("a mixed-format set was accepted")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// testLinearVariants is the variants TestLinearShapes checks (each where
// variantApplies): every family and decoder, the vec tile shapes and the
// tensor-core kernels.
func testLinearVariants() []namedVariant {
	V := WidthVec
	return []namedVariant{
		{"cvt", LinearVariant{Decode: DecodeCvt}, true}, {"bits", LinearVariant{Decode: DecodeBits}, true},
		{"generic", LinearVariant{Generic: true}, true}, {"wide", LinearVariant{Width: WidthWide}, true},
		{"vec", LinearVariant{Width: V}, true}, {"vec_bits", LinearVariant{Width: V, Decode: DecodeBits}, true},
		{"vec_hint", LinearVariant{Width: V, Hint: 1}, true}, {"vec_u2", LinearVariant{Width: V, U: 2}, true},
		{"vec_u4", LinearVariant{Width: V, U: 4}, true}, {"vec_u8", LinearVariant{Width: V, U: 8}, true},
		{"vec_bps1", LinearVariant{Width: V, Blocks: 1}, true}, {"mma", LinearVariant{Width: WidthMMA}, true},
	}
}

// multiTestSets is the projection sets TestMultiLinear checks.
func multiTestSets() []struct {
	f     compute.Format
	shape [][2]int
} {
	return []struct {
		f     compute.Format
		shape [][2]int
	}{
		{compute.MXFP4, [][2]int{{64, 4096}, {130, 512}, {2, 1032}, {64, 4096}}},
		{compute.MXFP4, [][2]int{{64, 4096}, {130, 512}, {2, 2080}}},
		{compute.MXFP4, [][2]int{{2048, 4096}, {2048, 4096}, {66, 2080}}},
		{compute.FP8Block, [][2]int{{256, 1024}, {40, 2048}, {130, 132}}},
		{compute.FP8Block, [][2]int{{256, 1024}, {40, 2048}, {130, 144}}},
		{compute.FP8Block, [][2]int{{256, 1024}, {40, 2048}, {130, 192}}},
		{compute.BF16, [][2]int{{100, 516}, {32, 64}}},
	}
}

// TestLinearRB4 checks the four-rows-per-block kernels (narrow and wide),
// which only the benchmark selects: batch tiles 1 and 4, row counts that are
// multiples of 4.
func TestLinearRB4(t *testing.T) {
	dev := testDevice(t)
	cases := []struct {
		f          compute.Format
		rows, cols int
	}{{compute.FP8Block, 260, 1024}, {compute.MXFP4, 132, 2080}, {compute.BF16, 68, 520}}
	err := dev.Do(func(c *Ctx) error {
		a, err := c.NewArena(64 << 20)
		if err != nil {
			return err
		}
		defer c.ReleaseArena(a)
		for i, tc := range cases {
			for _, batch := range []int{1, 3, 4} {
				rng := rand.New(rand.NewPCG(uint64(i), uint64(batch)))
				d := computetest.RandomWeight(rng, tc.f, tc.rows, tc.cols, 0.05)
				x := computetest.Normal(rng, batch*tc.cols, 1)
				lr := newLinRef(d, 1, x, batch)
				for _, v := range []LinearVariant{{RB: 4, U: 4}, {RB: 4, Width: WidthWide}} {
					if v.Width == WidthWide && tc.f == compute.BF16 {
						continue
					}
					w, err := c.UploadWeight(a, d)
					if err != nil {
						return err
					}
					dx, _ := a.Alloc(4 * len(x))
					dy, _ := a.Alloc(4 * batch * tc.rows)
					if err := c.CopyFloatsToDevice(dx, x); err != nil {
						return err
					}
					y, err := poisonedLinear(c, w, dy, dx, batch, 1, v)
					if err != nil {
						return fmt.Errorf("%s [%d, %d] batch %d %+v: %w", tc.f, tc.rows, tc.cols, batch, v, err)
					}
					if e := lr.rel(y); !(e <= computetest.TolLinear) {
						t.Errorf("%s [%d, %d] batch %d %+v: max relative error %.3g", tc.f, tc.rows, tc.cols, batch, v, e)
					}
					FreeWeight(a, w)
					a.Free(dx)
					a.Free(dy)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// tolTC is the accuracy the tensor-core GEMM family is held to (max
// relative error against float64, over the whole output): float32-grade.
const tolTC = 1e-6

// tcTestVariants is the tensor-core variants TestLinearTC and
// TestMultiLinearTC check: the automatic choice, every tile shape and
// split-K (which multi launches ignore).
func tcTestVariants() []namedVariant {
	out := []namedVariant{{"auto", LinearVariant{}, true}}
	for i := range tcTileList() {
		tl := tcTileList()[i]
		out = append(out, namedVariant{fmt.Sprintf("tc%d_%dx%d", i+1, tl.BM, tl.BN), LinearVariant{Width: WidthTC, Tile: i + 1}, i < 2})
	}
	return append(out, namedVariant{"tc1_k3", LinearVariant{Width: WidthTC, Tile: 1, SplitK: 3}, false},
		namedVariant{"tc2_k4", LinearVariant{Width: WidthTC, Tile: 2, SplitK: 4}, false})
}

// TestLinearTC checks the tensor-core GEMM family (and what the automatic
// choice runs at batches of 16 and more) against the float64 reference at
// batch counts that cross tile edges, odd row counts, grouped weights, FP8
// blocks of 64 and x of small and large magnitude (the hi/lo split), with
// the output poisoned first. -short keeps the automatic variant and the
// two default-module tiles.
func TestLinearTC(t *testing.T) {
	dev := testDevice(t)
	cases := []struct {
		f          compute.Format
		rows, cols int
		groups     int
		block      int
		xstd       float64
		batches    []int
	}{
		{compute.FP8Block, 300, 1024, 1, 128, 1, []int{16, 33, 64, 257, 1024}},
		{compute.FP8Block, 257, 2176, 1, 128, 1, []int{16, 65}},
		{compute.FP8Block, 1024, 512, 8, 128, 1, []int{16, 33, 257}}, // wo_a-like: 8 groups of 128 rows
		{compute.FP8Block, 256, 640, 4, 128, 1, []int{33}},           // 64 rows per group: the 128-row tiles fall back
		{compute.FP8Block, 100, 512, 1, 64, 1, []int{16, 100}},
		{compute.FP8Block, 200, 1024, 1, 128, 1e-3, []int{40}}, // small x: lo far below f16's normal range
		{compute.FP8Block, 200, 1024, 1, 128, 300, []int{40}},  // large x
		{compute.MXFP4, 200, 4096, 1, 128, 1, []int{16, 33, 64, 257}},
		{compute.MXFP4, 129, 512, 1, 128, 1, []int{16, 1024}},
		{compute.MXFP4, 256, 512, 2, 128, 1, []int{19, 64}},
		{compute.MXFP4, 130, 1024, 1, 128, 1e-3, []int{33}},
		{compute.BF16, 130, 1024, 1, 128, 1, []int{16, 33, 257}},
		{compute.BF16, 64, 768, 1, 128, 1, []int{64, 1024}},
		{compute.BF16, 256, 512, 2, 128, 1e-3, []int{20}},
	}
	// The automatic variant runs first (right after the uploads of w and
	// x) and twice more after the others: a failure of the first run alone
	// points at the uploads (TestCopyToDeviceOrdered), one of every run
	// at the kernel.
	variants := slices.Concat(tcTestVariants(), []namedVariant{{"auto_again", LinearVariant{}, true}, {"auto_third", LinearVariant{}, true}})
	maxErr := map[string]float64{}
	err := dev.Do(func(c *Ctx) error {
		a, err := c.NewArena(256 << 20)
		if err != nil {
			return err
		}
		defer c.ReleaseArena(a)
		for i, tc := range cases {
			rng := rand.New(rand.NewPCG(uint64(i), 77))
			d := computetest.Quantize(tc.f, computetest.Normal(rng, tc.rows*tc.cols, 0.05), tc.rows, tc.cols, tc.block)
			W := ref.ParallelDequant(d)
			for _, batch := range tc.batches {
				a.Reset()
				w, err := c.UploadWeight(a, d)
				if err != nil {
					return err
				}
				x := computetest.Normal(rng, batch*tc.groups*tc.cols, tc.xstd)
				lr := linRef{W: W, rows: tc.rows, cols: tc.cols, groups: tc.groups, x: f64s(x), batch: batch}
				dx, err := a.Alloc(4 * len(x))
				if err != nil {
					return err
				}
				dy, err := a.Alloc(4 * batch * tc.rows)
				if err != nil {
					return err
				}
				if err := c.CopyFloatsToDevice(dx, x); err != nil {
					return err
				}
				for _, nv := range variants {
					if testing.Short() && !nv.quick {
						continue
					}
					name := fmt.Sprintf("%s_%dx%d_g%d_blk%d_x%g_b%d_%s", tc.f, tc.rows, tc.cols, tc.groups, tc.block, tc.xstd, batch, nv.name)
					y, err := poisonedLinear(c, w, dy, dx, batch, tc.groups, nv.v)
					if err != nil {
						return fmt.Errorf("%s: %w", name, err)
					}
					e := lr.rel(y)
					key := fmt.Sprintf("%s %s", tc.f, nv.name)
					maxErr[key] = math.Max(maxErr[key], e)
					if !(e <= tolTC) {
						t.Errorf("%s: max relative error %.3g > %.3g", name, e, tolTC)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	logMaxErrs(t, maxErr)
}

// TestCopyToDeviceOrdered checks that work queued on the compute stream
// right after CopyFloatsToDevice sees the copied values: 32 MB of pageable
// memory, new values each round, then at once a kernel adding 1 to the
// last 1024 floats (run before the copy lands, its sum is overwritten) and
// a device copy of the whole buffer (run early, it copies stale bytes).
// cuMemcpyHtoD from pageable memory may return before its DMA has landed
// (CUDA's "API synchronization behavior"), and the legacy stream it runs
// on does not order the non-blocking compute stream.
func TestCopyToDeviceOrdered(t *testing.T) {
	dev := testDevice(t)
	const n, rounds, tail = 8 << 20, 8, 1024 // floats
	err := dev.Do(func(c *Ctx) error {
		m, err := c.linearModule()
		if err != nil {
			return err
		}
		add, err := m.Kernel("tiny_add")
		if err != nil {
			return err
		}
		a, err := c.NewArena(8*n + 1<<20)
		if err != nil {
			return err
		}
		defer c.ReleaseArena(a)
		src, err := a.Alloc(4 * n)
		if err != nil {
			return err
		}
		dst, err := a.Alloc(4 * n)
		if err != nil {
			return err
		}
		host, back, cp := make([]float32, n), make([]float32, n), make([]float32, n)
		for r := range rounds {
			for i := range host {
				host[i] = float32((i*7 + r*131) % 4093)
			}
			if err := c.CopyFloatsToDevice(src, host); err != nil {
				return err
			}
			p, one := src+DevicePtr(4*(n-tail)), float32(1)
			if err := c.Launch(add, Dim3{X: 1}, Dim3{X: tail}, 0, c.Stream(), unsafe.Pointer(&p), unsafe.Pointer(&one)); err != nil {
				return err
			}
			if err := c.CopyAsync(dst, src, 4*n, c.Stream()); err != nil {
				return err
			}
			if err := c.CopyFloatsFromDevice(back, src); err != nil {
				return err
			}
			if err := c.CopyFloatsFromDevice(cp, dst); err != nil {
				return err
			}
			want := func(i int) float32 {
				if i >= n-tail {
					return host[i] + 1
				}
				return host[i]
			}
			bad, first := 0, -1
			for i := range back {
				if back[i] != want(i) || cp[i] != want(i) {
					bad++
					if first < 0 {
						first = i
					}
				}
			}
			if bad > 0 {
				t.Errorf("round %d: %d of %d floats wrong, the first at %d (%g, copied %g, want %g): the stream ran before the upload landed",
					r, bad, n, first, back[first], cp[first], want(first))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestMultiLinearTC checks one tensor-core launch over several projections
// (different row counts and columns, their own inputs and outputs) against
// the float64 reference.
func TestMultiLinearTC(t *testing.T) {
	dev := testDevice(t)
	sets := []struct {
		f     compute.Format
		shape [][2]int
	}{
		{compute.MXFP4, [][2]int{{256, 512}, {130, 1024}, {64, 512}}},
		{compute.FP8Block, [][2]int{{256, 1024}, {72, 512}, {130, 256}}},
		{compute.BF16, [][2]int{{100, 512}, {64, 128}}},
	}
	err := dev.Do(func(c *Ctx) error {
		a, err := c.NewArena(128 << 20)
		if err != nil {
			return err
		}
		defer c.ReleaseArena(a)
		for si, set := range sets {
			mw := newMultiWeights(set.f, set.shape, uint64(si))
			for _, batch := range []int{16, 40, 64, 100} {
				mds := mw.data(batch)
				for _, nv := range tcTestVariants() {
					if testing.Short() && !nv.quick {
						continue
					}
					a.Reset()
					var ws []*DeviceWeight
					var ys, xs []DevicePtr
					for i, md := range mds {
						d, x, sh := md.d, md.x, set.shape[i]
						w, err := c.UploadWeight(a, d)
						if err != nil {
							return err
						}
						dx, _ := a.Alloc(4 * len(x))
						dy, err := a.Alloc(4 * batch * sh[0])
						if err != nil {
							return err
						}
						c.Memset(dy, 0xff, 4*batch*sh[0], c.Stream())
						if err := c.CopyFloatsToDevice(dx, x); err != nil {
							return err
						}
						ws, ys, xs = append(ws, w), append(ys, dy), append(xs, dx)
					}
					m, err := c.PrepareMultiLinear(a, ws, ys, xs, batch, nv.v)
					if err != nil {
						return fmt.Errorf("%v set %d batch %d %s: %w", set.f, si, batch, nv.name, err)
					}
					if !strings.HasPrefix(m.Kernel(), "lintmulti_") {
						t.Errorf("%v set %d batch %d %s: kernel %s, want a tensor-core one", set.f, si, batch, nv.name, m.Kernel())
					}
					if err := c.LaunchMultiLinear(m, c.Stream()); err != nil {
						return err
					}
					for i, md := range mds {
						d := md.d
						y := make([]float32, batch*d.Rows)
						if err := c.CopyFloatsFromDevice(y, ys[i]); err != nil {
							return err
						}
						if e := md.ref.rel(y); !(e <= tolTC) {
							t.Errorf("%s set %d, matrix %d [%d, %d], batch %d, %s: max relative error %.3g", set.f, si, i, d.Rows, d.Cols, batch, nv.name, e)
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
