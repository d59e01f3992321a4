package cuda

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"moxie/compute"
)

// The V4-Flash matvec shapes ([rows=out, cols=in], dsv4-flash.md §5.3, §8).
var v4Shapes = []struct {
	name       string
	f          compute.Format
	rows, cols int
}{
	{"wq_b", compute.FP8Block, 32768, 1024},
	{"wo_b", compute.FP8Block, 4096, 8192},
	{"expert_w1", compute.MXFP4, 2048, 4096},
	{"expert_w2", compute.MXFP4, 4096, 2048},
	{"lm_head", compute.BF16, 129280, 4096},
}

type benchRow struct {
	Name    string `json:"name"`
	Format  string `json:"format"`
	Rows    int    `json:"rows"`
	Cols    int    `json:"cols"`
	Batch   int    `json:"batch"`
	Variant string `json:"variant"`
	Kernel  string `json:"kernel"`
	Grid    int    `json:"grid_blocks"`
	Block   int    `json:"block_threads"`
	// Matrices is the number of projections in one multi launch (0: single).
	Matrices int     `json:"matrices,omitempty"`
	Copies   int     `json:"copies"`
	Bytes    int     `json:"weight_bytes"`
	US       float64 `json:"us_median"`
	USMin    float64 `json:"us_min"`
	GBps     float64 `json:"gbps"`
	PctHBM   float64 `json:"pct_hbm_read"`
}

type benchReport struct {
	Device         string     `json:"device"`
	When           string     `json:"when"`
	HBMReadGBps    float64    `json:"hbm_read_gbps"`
	HBMBytes       int64      `json:"hbm_read_bytes"`
	CompileMS      float64    `json:"linear_module_compile_ms"`
	FromCache      bool       `json:"linear_module_from_cache"`
	BenchCompileMS float64    `json:"linear_bench_module_compile_ms"`
	BenchFromCache bool       `json:"linear_bench_module_from_cache"`
	Linear         []benchRow `json:"linear"`
	GraphKernels   int        `json:"graph_kernels"`
	PlainUSPerK    float64    `json:"plain_launch_us_per_kernel"`
	PlainHostUS    float64    `json:"plain_launch_host_us_per_kernel"`
	GraphUSPerK    float64    `json:"graph_us_per_kernel"`
	GraphHostUS    float64    `json:"graph_launch_host_us"`
	Notes          []string   `json:"notes"`
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// repeat returns a function that calls f n times, stopping at the first
// error.
func repeat(n int, f func() error) func() error {
	return func() error {
		for range n {
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	}
}

// randomWeight fills a weight of the given format with random, finite values
// (FP8 codes without NaN, scales near 1, BF16 of moderate exponent).
func randomWeight(rng *rand.Rand, f compute.Format, rows, cols int) compute.WeightData {
	d := compute.WeightData{Format: f, Rows: rows, Cols: cols, Block: 128}
	seed := rng.Uint64()
	fill := func(b []byte) { // 1 MiB chunks on all CPUs (lm_head is 1 GiB), chunk i from PCG (seed, i)
		const chunk = 1 << 20
		parallelFor((len(b)+chunk-1)/chunk, func(i int) {
			r := rand.New(rand.NewPCG(seed, uint64(i)))
			p := b[i*chunk : min(len(b), (i+1)*chunk)]
			for j := 0; j+8 <= len(p); j += 8 {
				v := r.Uint64()
				for k := range 8 {
					p[j+k] = byte(v >> (8 * k))
				}
			}
		})
	}
	switch f {
	case compute.FP8Block:
		d.Data = make([]byte, rows*cols)
		fill(d.Data)
		for i, v := range d.Data {
			if v&0x7f == 0x7f {
				d.Data[i] = v - 1
			}
		}
		d.Scale = make([]byte, ((rows+127)/128)*((cols+127)/128))
	case compute.MXFP4:
		d.Data = make([]byte, rows*cols/2)
		fill(d.Data)
		d.Scale = make([]byte, rows*((cols+31)/32))
	case compute.BF16:
		d.Data = make([]byte, 2*rows*cols)
		fill(d.Data)
		for i := 1; i < len(d.Data); i += 2 { // exponent in [2^-7, 2^0]: sign | 0x3c..0x3f
			d.Data[i] = d.Data[i]&0x83 | 0x3c
		}
	}
	for i := range d.Scale {
		d.Scale[i] = byte(120 + rng.IntN(15))
	}
	return d
}

// BenchmarkV4 measures, on the GPU, the HBM read ceiling, the linear kernels
// at V4-Flash shapes (weights rotated over copies totalling ≥ 5× L2) and a
// CUDA graph of 300 small launches against plain launches. Run it with
// -test.benchtime=1x (each sub-benchmark times itself with CUDA events, median
// of many); $MOXIE_BENCH_JSON names a file for the full report.
func BenchmarkV4(b *testing.B) {
	dev := testDevice(b)
	rep := &benchReport{Device: dev.Info().String(), When: time.Now().UTC().Format(time.RFC3339)}
	var lin *Module
	var spin *Kernel
	err := dev.Do(func(c *Ctx) error {
		var err error
		t0 := time.Now()
		if lin, err = c.linearModule(); err != nil {
			return err
		}
		rep.CompileMS = float64(time.Since(t0).Microseconds()) / 1000
		rep.FromCache = lin.FromCache
		t0 = time.Now()
		bm, err := c.linearBenchModule()
		if err != nil {
			return err
		}
		rep.BenchCompileMS = float64(time.Since(t0).Microseconds()) / 1000
		rep.BenchFromCache = bm.FromCache
		spin, err = lin.Kernel("spin")
		return err
	})
	if err != nil {
		b.Fatal(err)
	}

	b.Run("hbm_read_8GiB", func(b *testing.B) {
		err := dev.Do(func(c *Ctx) error {
			const n = int64(8 << 30)
			p, err := c.MemAlloc(int(n) + 256)
			if err != nil {
				return err
			}
			defer c.MemFree(p)
			if err := c.Memset(p, 0x3f, int(n)+256, c.Stream()); err != nil {
				return err
			}
			k, err := lin.Kernel("read_bw4")
			if err != nil {
				return err
			}
			out := p + DevicePtr(n)
			n4 := n / 16
			grid := uint32((n4 + 1023) / 1024)
			ts, err := timed(c, spin, 1, 21, func(int) error {
				return c.Launch(k, Dim3{X: grid}, Dim3{X: 256}, 0, c.Stream(), unsafe.Pointer(&p), unsafe.Pointer(&n4), unsafe.Pointer(&out))
			})
			if err != nil {
				return err
			}
			rep.HBMBytes = n
			rep.HBMReadGBps = float64(n) / (median(ts) * 1e3)
			b.ReportMetric(rep.HBMReadGBps, "GB/s")
			b.ReportMetric(median(ts), "us/op")
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	})

	quick := os.Getenv("MOXIE_BENCH_QUICK") != ""
	rng := rand.New(rand.NewPCG(42, 7))
	for _, sh := range v4Shapes {
		if quick && sh.f == compute.BF16 {
			continue
		}
		d := randomWeight(rng, sh.f, sh.rows, sh.cols)
		bytes := len(d.Data) + len(d.Scale)
		copies := max(2, (5*dev.Info().L2Bytes+bytes-1)/bytes)
		for _, batch := range []int{1, 4} {
			for _, v := range benchVariantList() {
				if !benchVariantFor(v, sh.f, batch, quick) {
					continue
				}
				name := fmt.Sprintf("%s_%s_%dx%d_b%d_%s", sh.name, sh.f, sh.rows, sh.cols, batch, v.name)
				b.Run(name, func(b *testing.B) {
					err := dev.Do(func(c *Ctx) error {
						a, err := c.NewArena(copies*(bytes+1024) + 8*batch*(sh.rows+sh.cols) + 1<<20)
						if err != nil {
							return err
						}
						defer c.ReleaseArena(a)
						ws := make([]*DeviceWeight, copies)
						if ws[0], err = c.UploadWeight(a, d); err != nil {
							return err
						}
						for i := 1; i < copies; i++ { // device-side copies of copy 0
							w := *ws[0]
							if w.Data, err = a.Alloc(len(d.Data)); err != nil {
								return err
							}
							if err := c.CopyAsync(w.Data, ws[0].Data, len(d.Data), c.Stream()); err != nil {
								return err
							}
							w.Scale = w.Data
							if len(d.Scale) > 0 {
								if w.Scale, err = a.Alloc(len(d.Scale)); err != nil {
									return err
								}
								if err := c.CopyAsync(w.Scale, ws[0].Scale, len(d.Scale), c.Stream()); err != nil {
									return err
								}
							}
							ws[i] = &w
						}
						x := make([]float32, batch*sh.cols)
						for i := range x {
							x[i] = float32(rng.NormFloat64())
						}
						dx, _ := a.Alloc(4 * len(x))
						dy, err := a.Alloc(4 * batch * sh.rows)
						if err != nil {
							return err
						}
						if err := c.CopyFloatsToDevice(dx, x); err != nil {
							return err
						}
						launch := func(i int) error {
							return c.LinearWith(ws[i%copies], dy, dx, batch, 1, v.v, c.Stream())
						}
						for i := range 2 * copies { // warm-up
							if err := launch(i); err != nil {
								return err
							}
						}
						n := max(copies, 40)
						ts, err := timed(c, spin, n, 15, launch)
						if err != nil {
							return err
						}
						us := median(ts)
						p, err := planLinear(sh.f, sh.rows, sh.cols, 128, 1, batch, v.v, c.d.info.SMs, c.d.info.SharedOptin)
						if err != nil {
							return err
						}
						row := benchRow{Name: sh.name, Format: sh.f.String(), Rows: sh.rows, Cols: sh.cols, Batch: batch,
							Variant: v.name, Kernel: p.name, Grid: int(p.grid.X), Block: int(p.block.X), Copies: copies, Bytes: bytes, US: us, USMin: slices.Min(ts),
							GBps: float64(bytes) / (us * 1e3)}
						if rep.HBMReadGBps > 0 {
							row.PctHBM = 100 * row.GBps / rep.HBMReadGBps
						}
						rep.Linear = append(rep.Linear, row)
						b.ReportMetric(row.GBps, "GB/s")
						b.ReportMetric(row.PctHBM, "%HBM")
						b.ReportMetric(us, "us/op")
						return nil
					})
					if err != nil {
						b.Fatal(err)
					}
				})
			}
		}
	}

	// The active experts of one token in one launch: w1 and w3 of 6 experts
	// (12 matrices, one shared x) and w2 of 6 experts (6 inputs).
	multis := []struct {
		name       string
		n          int
		rows, cols int
		sharedX    bool
	}{
		{"experts6_w1w3", 12, 2048, 4096, true},
		{"experts6_w2", 6, 4096, 2048, false},
	}
	for _, mu := range multis {
		d := randomWeight(rng, compute.MXFP4, mu.rows, mu.cols)
		bytes := len(d.Data) + len(d.Scale)
		sets := max(2, (5*dev.Info().L2Bytes+mu.n*bytes-1)/(mu.n*bytes))
		for _, batch := range []int{1, 4} {
			for _, v := range multiVariantList() {
				if !multiVariantApplies(v.v, compute.MXFP4, batch) || quick && !v.quick {
					continue
				}
				name := fmt.Sprintf("%s_mxfp4_%dx%dx%d_b%d_%s", mu.name, mu.n, mu.rows, mu.cols, batch, v.name)
				b.Run(name, func(b *testing.B) {
					err := dev.Do(func(c *Ctx) error {
						a, err := c.NewArena(sets*mu.n*(bytes+1024) + sets*mu.n*8*batch*(mu.rows+mu.cols) + 16<<20)
						if err != nil {
							return err
						}
						defer c.ReleaseArena(a)
						w0, err := c.UploadWeight(a, d)
						if err != nil {
							return err
						}
						x := make([]float32, batch*mu.cols)
						for i := range x {
							x[i] = float32(rng.NormFloat64())
						}
						var ms []*MultiLinear
						for range sets {
							ws := make([]*DeviceWeight, mu.n)
							ys := make([]DevicePtr, mu.n)
							xs := make([]DevicePtr, mu.n)
							for i := range mu.n {
								w := *w0
								if w.Data, err = a.Alloc(len(d.Data)); err != nil {
									return err
								}
								if w.Scale, err = a.Alloc(len(d.Scale)); err != nil {
									return err
								}
								c.CopyAsync(w.Data, w0.Data, len(d.Data), c.Stream())
								c.CopyAsync(w.Scale, w0.Scale, len(d.Scale), c.Stream())
								ws[i] = &w
								if ys[i], err = a.Alloc(4 * batch * mu.rows); err != nil {
									return err
								}
								if i == 0 || !mu.sharedX {
									if xs[i], err = a.Alloc(4 * len(x)); err != nil {
										return err
									}
									if err := c.CopyFloatsToDevice(xs[i], x); err != nil {
										return err
									}
								} else {
									xs[i] = xs[0]
								}
							}
							m, err := c.PrepareMultiLinear(a, ws, ys, xs, batch, v.v)
							if err != nil {
								return err
							}
							ms = append(ms, m)
						}
						launch := func(i int) error { return c.LaunchMultiLinear(ms[i%sets], c.Stream()) }
						for i := range 2 * sets {
							if err := launch(i); err != nil {
								return err
							}
						}
						ts, err := timed(c, spin, max(sets, 40), 15, launch)
						if err != nil {
							return err
						}
						us := median(ts)
						row := benchRow{Name: mu.name, Format: "mxfp4", Rows: mu.rows, Cols: mu.cols, Batch: batch,
							Variant: v.name, Kernel: ms[0].Kernel(), Grid: int(ms[0].grid.X * ms[0].grid.Y), Block: int(ms[0].block.X), Matrices: mu.n, Copies: sets, Bytes: ms[0].Bytes(), US: us, USMin: slices.Min(ts),
							GBps: float64(ms[0].Bytes()) / (us * 1e3)}
						if rep.HBMReadGBps > 0 {
							row.PctHBM = 100 * row.GBps / rep.HBMReadGBps
						}
						rep.Linear = append(rep.Linear, row)
						b.ReportMetric(row.GBps, "GB/s")
						b.ReportMetric(row.PctHBM, "%HBM")
						b.ReportMetric(us, "us/op")
						return nil
					})
					if err != nil {
						b.Fatal(err)
					}
				})
			}
		}
	}

	b.Run("graph_300_launches", func(b *testing.B) {
		const nk = 300
		err := dev.Do(func(c *Ctx) error {
			k, err := lin.Kernel("tiny_add")
			if err != nil {
				return err
			}
			p, err := c.MemAlloc(128)
			if err != nil {
				return err
			}
			defer c.MemFree(p)
			v := float32(1)
			s := c.Stream()
			one := func() error {
				return c.Launch(k, Dim3{X: 1}, Dim3{X: 32}, 0, s, unsafe.Pointer(&p), unsafe.Pointer(&v))
			}
			var plain, plainHost, graph, graphHost []float64
			for range 11 {
				t0 := time.Now()
				ms, err := deviceMS(c, s, func() error {
					err := repeat(nk, one)()
					plainHost = append(plainHost, float64(time.Since(t0).Nanoseconds())/1e3/nk)
					return err
				})
				if err != nil {
					return err
				}
				plain = append(plain, ms*1000/nk)
			}
			if err := c.BeginCapture(s); err != nil {
				return err
			}
			for range nk {
				if err := one(); err != nil {
					return err
				}
			}
			g, err := c.EndCapture(s)
			if err != nil {
				return err
			}
			defer c.DestroyGraph(g)
			c.LaunchGraph(g, s)
			for range 11 {
				ms, err := deviceMS(c, s, func() error {
					t0 := time.Now()
					err := c.LaunchGraph(g, s)
					graphHost = append(graphHost, float64(time.Since(t0).Nanoseconds())/1e3)
					return err
				})
				if err != nil {
					return err
				}
				graph = append(graph, ms*1000/nk)
			}
			rep.GraphKernels = nk
			rep.PlainUSPerK, rep.PlainHostUS = median(plain), median(plainHost)
			rep.GraphUSPerK, rep.GraphHostUS = median(graph), median(graphHost)
			b.ReportMetric(rep.PlainUSPerK, "plain_us/kernel")
			b.ReportMetric(rep.GraphUSPerK, "graph_us/kernel")
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	})

	printReport(b, rep)
	if path := os.Getenv("MOXIE_BENCH_JSON"); path != "" {
		js, _ := json.MarshalIndent(rep, "", "  ")
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, js, 0o644); err != nil {
			b.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			b.Fatal(err)
		}
		b.Logf("report written to %s", filepath.Clean(path))
	}
}

func printReport(b *testing.B, r *benchReport) {
	b.Logf("device %s", r.Device)
	b.Logf("linear modules: default %.1f ms (from cache: %v), bench %.1f ms (from cache: %v)", r.CompileMS, r.FromCache, r.BenchCompileMS, r.BenchFromCache)
	b.Logf("HBM read (8 GiB, median of 21): %.0f GB/s", r.HBMReadGBps)
	b.Logf("%-13s %-8s %-11s %2s %-12s %8s %6s %5s  %s", "shape", "format", "rows x cols", "b", "variant", "us(med)", "GB/s", "%HBM", "kernel grid x block")
	for _, x := range r.Linear {
		shape := fmt.Sprintf("%dx%d", x.Rows, x.Cols)
		if x.Matrices > 0 {
			shape = fmt.Sprintf("%dx%s", x.Matrices, shape)
		}
		b.Logf("%-13s %-8s %-11s %2d %-12s %8.2f %6.0f %5.1f  %s %dx%d", x.Name, x.Format, shape, x.Batch, x.Variant, x.US, x.GBps, x.PctHBM, x.Kernel, x.Grid, x.Block)
	}
	// Summary (last, so that a tail of the log shows it): per shape and
	// batch, the default, the best earlier variant and the best vec variant.
	type key struct {
		name  string
		batch int
	}
	var order []key
	best := map[key][3]*benchRow{} // default, best earlier, best vec
	for i := range r.Linear {
		x := &r.Linear[i]
		k := key{x.Name, x.Batch}
		cur, seen := best[k]
		if !seen {
			order = append(order, k)
		}
		slot := 1
		if strings.HasPrefix(x.Variant, "vec") {
			slot = 2
		}
		if x.Variant == "narrow" {
			cur[0] = x
		}
		if cur[slot] == nil || x.US < cur[slot].US {
			cur[slot] = x
		}
		best[k] = cur
	}
	b.Logf("summary (%%HBM of %.0f GB/s): shape batch | default | best earlier | best vec | vec speed-up over default", r.HBMReadGBps)
	for _, k := range order {
		v := best[k]
		cell := func(x *benchRow) string {
			if x == nil {
				return "-"
			}
			return fmt.Sprintf("%s %.2fus %.1f%%", x.Variant, x.US, x.PctHBM)
		}
		up := "-"
		if v[0] != nil && v[2] != nil {
			up = fmt.Sprintf("%.2fx", v[0].US/v[2].US)
		}
		b.Logf("summary %-13s b%d | %s | %s | %s | %s", k.name, k.batch, cell(v[0]), cell(v[1]), cell(v[2]), up)
	}
	b.Logf("%d tiny launches: plain %.2f us/kernel on the device (host %.2f us/launch), graph %.2f us/kernel (host %.1f us per graph launch)",
		r.GraphKernels, r.PlainUSPerK, r.PlainHostUS, r.GraphUSPerK, r.GraphHostUS)
}

// namedVariant is a LinearVariant with the name the tests and benchmarks
// report; quick marks the ones MOXIE_BENCH_QUICK keeps.
type namedVariant struct {
	name  string
	v     LinearVariant
	quick bool
}

// benchVariantList is every single-matrix variant BenchmarkV4 may run:
// the default (narrow) and the best earlier ones, then the vec family and
// the tensor-core kernels.
func benchVariantList() []namedVariant {
	W, V := WidthWide, WidthVec
	return []namedVariant{
		{"narrow", LinearVariant{}, true},
		{"narrow_bits", LinearVariant{Decode: DecodeBits}, false},
		{"narrow_kw8", LinearVariant{KW: 8}, false},
		{"narrow_r4", LinearVariant{RB: 4, U: 4}, false},
		{"wide", LinearVariant{Width: W}, false},
		{"wide_r4", LinearVariant{Width: W, RB: 4}, true},
		{"vec", LinearVariant{Width: V}, true},
		{"vec_bits", LinearVariant{Width: V, Decode: DecodeBits}, true},
		{"vec_hint", LinearVariant{Width: V, Hint: 1}, true},
		{"vec_u2", LinearVariant{Width: V, U: 2}, false},
		{"vec_u4", LinearVariant{Width: V, U: 4}, false},
		{"vec_u8", LinearVariant{Width: V, U: 8}, false},
		{"vec_bps1", LinearVariant{Width: V, Blocks: 1}, false},
		{"vec_bps3", LinearVariant{Width: V, Blocks: 3}, false},
		{"vec_bps4", LinearVariant{Width: V, Blocks: 4}, false},
		{"mma", LinearVariant{Width: WidthMMA}, true},
	}
}

// variantApplies reports whether v has kernels for format f at batch tile
// pow2ceil(nb) (the instantiation lists of kernels/linear.cu).
func variantApplies(v LinearVariant, f compute.Format, nb int) bool {
	NB := pow2ceil(nb)
	wideFmt := f == compute.FP8Block || f == compute.MXFP4 || f == compute.MXFP8
	switch {
	case v.Hint != 0:
		return (f == compute.FP8Block || f == compute.MXFP4) && NB == 1
	case v.Width == WidthVec && v.Decode == DecodeBits && NB <= maxVecNB:
		return f == compute.MXFP4 || f == compute.FP8Block && NB == 1 || !wideFmt
	case v.RB == 4:
		return (f == compute.FP8Block || f == compute.MXFP4 || f == compute.BF16) && (NB == 1 || NB == 4)
	}
	return true
}

// benchVariantFor reports whether BenchmarkV4 runs v for a format and batch:
// BF16 (the LM head) runs the narrow family only; the load hint only at
// batch 1; the vec shape sweeps only at batch 1 and 4 for FP8 and MXFP4.
func benchVariantFor(v namedVariant, f compute.Format, batch int, quick bool) bool {
	if quick && !v.quick || !variantApplies(v.v, f, batch) {
		return false
	}
	if f == compute.BF16 {
		return v.v.Width == WidthAuto && v.v.Decode == DecodeAuto
	}
	if batch > 1 {
		switch v.name {
		case "narrow_kw8", "wide", "vec_bps1", "vec_bps3", "vec_bps4":
			return false
		}
	}
	return true
}

// multiVariantList is every multi-projection variant BenchmarkV4 and
// TestMultiLinear run.
func multiVariantList() []namedVariant {
	V := WidthVec
	return []namedVariant{
		{"narrow", LinearVariant{}, true},
		{"narrow_bits", LinearVariant{Decode: DecodeBits}, true},
		{"vec", LinearVariant{Width: V}, true},
		{"vec_bits", LinearVariant{Width: V, Decode: DecodeBits}, true},
		{"vec_hint", LinearVariant{Width: V, Hint: 1}, true},
		{"vec_u2", LinearVariant{Width: V, U: 2}, false},
		{"vec_u8", LinearVariant{Width: V, U: 8}, false},
		{"vec_bps4", LinearVariant{Width: V, Blocks: 4}, false},
		{"mma", LinearVariant{Width: WidthMMA}, true},
	}
}

// multiVariantApplies is variantApplies for multi-projection kernels.
func multiVariantApplies(v LinearVariant, f compute.Format, nb int) bool {
	NB := pow2ceil(nb)
	switch {
	case v.Hint != 0:
		return f == compute.MXFP4 && NB == 1
	case v.Width == WidthVec && v.Decode == DecodeBits && NB <= maxVecNB:
		return f != compute.FP8Block
	}
	return true
}

// prefillShapes are the V4-Flash prefill GEMM shapes of BenchmarkPrefillGEMM
// ([rows=out, cols=in], groups > 1 for the grouped wo_a).
var prefillShapes = []struct {
	name               string
	f                  compute.Format
	rows, cols, groups int
}{
	{"sq4096", compute.FP8Block, 4096, 4096, 1},
	{"wq_b", compute.FP8Block, 32768, 1024, 1},
	{"wo_b", compute.FP8Block, 4096, 8192, 1},
	{"wo_a", compute.FP8Block, 8192, 4096, 8},
	{"shared_w1", compute.FP8Block, 2048, 4096, 1},
	{"comp_wkv", compute.BF16, 1024, 4096, 1},
	{"gate", compute.BF16, 256, 4096, 1},
	{"expert_w1", compute.MXFP4, 2048, 4096, 1},
	{"expert_w2", compute.MXFP4, 4096, 2048, 1},
}

// prefillVariants is the variants BenchmarkPrefillGEMM compares: the
// automatic choice, every tensor-core tile and (at batches up to 64 only,
// it is slow) the narrow CUDA-core kernels the automatic choice used
// before, for the tcMinBatch threshold.
//
// smallBatchVariant names the ones it runs at batches 16 and 32.
func smallBatchVariant(name string) bool {
	switch name {
	case "narrow", "auto", "tc2_64x32", "tc12_64x32", "tc14_64x16", "tc15_64x16":
		return true
	}
	return false
}

// prefillVariants: see smallBatchVariant.
func prefillVariants() []namedVariant {
	return append([]namedVariant{{"narrow", LinearVariant{Width: WidthNarrow}, true}}, tcTestVariants()...)
}

type gemmRow struct {
	Name    string  `json:"name"`
	Format  string  `json:"format"`
	Rows    int     `json:"rows"`
	Cols    int     `json:"cols"`
	Groups  int     `json:"groups,omitempty"`
	Batch   int     `json:"batch"`
	Records int     `json:"records,omitempty"`
	Variant string  `json:"variant"`
	Kernel  string  `json:"kernel"`
	US      float64 `json:"us_median"`
	USMin   float64 `json:"us_min"`
	TFLOPS  float64 `json:"tflops"`
}

// BenchmarkPrefillGEMM measures the linear kernels at prefill batches (16,
// 32, 64, 256, 512 = the default chunk, 1024, 4096 rows) on the V4-Flash
// shapes, and multi launches shaped like a chunk's expert tiles, reporting
// us/op and effective TFLOP/s
// (2·rows·cols·batch per launch; the tensor-core kernels' hi/lo products
// are not counted twice). Run with -test.benchtime 1x; filter shapes,
// batches and variants by name, e.g. -test.bench 'PrefillGEMM/sq4096_b1024'.
// $MOXIE_BENCH_QUICK keeps the automatic variant, the two default tiles and
// (up to batch 64) the narrow kernels;
// $MOXIE_BENCH_JSON names a file for the rows.
func BenchmarkPrefillGEMM(b *testing.B) {
	dev := testDevice(b)
	var spin *Kernel
	if err := dev.Do(func(c *Ctx) error {
		var err error
		spin, err = spinKernel(c)
		return err
	}); err != nil {
		b.Fatal(err)
	}
	quick := os.Getenv("MOXIE_BENCH_QUICK") != ""
	var rows []gemmRow
	record := func(b *testing.B, r gemmRow, ts []float64, flop float64) {
		r.US, r.USMin = median(ts), slices.Min(ts)
		r.TFLOPS = flop / (r.US * 1e6)
		rows = append(rows, r)
		b.ReportMetric(r.TFLOPS, "TFLOP/s")
		b.ReportMetric(r.US, "us/op")
	}
	rng := rand.New(rand.NewPCG(4, 2))
	xpool := make([]float32, 1<<20) // x: these values repeated
	for i := range xpool {
		xpool[i] = float32(rng.NormFloat64())
	}
	for _, sh := range prefillShapes {
		d := randomWeight(rng, sh.f, sh.rows, sh.cols)
		bytes := len(d.Data) + len(d.Scale)
		copies := max(2, (2*dev.Info().L2Bytes+bytes-1)/bytes)
		for _, batch := range []int{16, 32, 64, 256, 512, 1024, 4096} {
			for _, v := range prefillVariants() {
				if quick && !v.quick || v.name == "narrow" && batch > 64 || batch < 64 && !smallBatchVariant(v.name) {
					continue
				}
				if v.name != "narrow" {
					if _, ok, _ := planTC(sh.f, sh.rows, sh.cols, 128, sh.groups, batch, v.v, 132, 232448); !ok {
						continue // no tensor-core kernel for this shape and tile
					}
				}
				name := fmt.Sprintf("%s_b%d_%s", sh.name, batch, v.name)
				b.Run(name, func(b *testing.B) {
					err := dev.Do(func(c *Ctx) error {
						xn, yn := batch*sh.groups*sh.cols, batch*sh.rows
						a, err := c.NewArena(copies*(bytes+1024) + 4*(xn+yn) + 1<<20)
						if err != nil {
							return err
						}
						defer c.ReleaseArena(a)
						ws, err := uploadCopies(c, a, d, copies)
						if err != nil {
							return err
						}
						dx, err := a.Alloc(4 * xn)
						if err != nil {
							return err
						}
						dy, err := a.Alloc(4 * yn)
						if err != nil {
							return err
						}
						if err := fillNormal(c, dx, xn, xpool); err != nil {
							return err
						}
						launch := func(i int) error {
							return c.LinearWith(ws[i%copies], dy, dx, batch, sh.groups, v.v, c.Stream())
						}
						if err := launch(0); err != nil {
							return err
						}
						flop := 2 * float64(sh.rows) * float64(sh.cols) * float64(batch)
						n := int(min(max(2e-3*100e12/flop, 3), 40)) // about 2 ms of launches at 100 TFLOP/s
						ts, err := timed(c, spin, n, 7, launch)
						if err != nil {
							return err
						}
						kernel := "narrow"
						if p, ok, _ := planTC(sh.f, sh.rows, sh.cols, 128, sh.groups, batch, v.v, c.d.info.SMs, c.d.info.SharedOptin); ok && tcWanted(v.v, batch) {
							kernel = p.name
						}
						record(b, gemmRow{Name: sh.name, Format: sh.f.String(), Rows: sh.rows, Cols: sh.cols, Groups: sh.groups, Batch: batch, Variant: v.name, Kernel: kernel}, ts, flop)
						return nil
					})
					if err != nil {
						b.Fatal(err)
					}
				})
			}
		}
	}

	// Expert tiles of a prefill chunk: every record one expert's matrix
	// over `batch` routed rows (K=6: 256 experts of about 12 rows at a
	// chunk of 512 tokens, 24 at 1024; the 16-expert synthetic model's 192
	// rows at 512 in tiles of 64).
	multis := []struct {
		name              string
		experts, per      int // distinct expert matrices, records per matrix
		rows, cols, batch int
		w13               bool
	}{
		{"tiles_e256_w1w3", 256, 1, 2048, 4096, 12, true},
		{"tiles_e256_w2", 256, 1, 4096, 2048, 12, false},
		{"tiles_e256_w1w3", 256, 1, 2048, 4096, 24, true},
		{"tiles_e16_w1w3", 16, 3, 2048, 4096, 64, true},
		{"tiles_e16_w2", 16, 3, 4096, 2048, 64, false},
	}
	for _, mu := range multis {
		d := randomWeight(rng, compute.MXFP4, mu.rows, mu.cols)
		for _, v := range tcTestVariants() {
			if quick && !v.quick || v.v.SplitK > 1 { // multi launches have no split-K
				continue
			}
			b.Run(fmt.Sprintf("%s_b%d_%s", mu.name, mu.batch, v.name), func(b *testing.B) {
				err := dev.Do(func(c *Ctx) error {
					mats := mu.experts
					if mu.w13 {
						mats *= 2
					}
					recs := mats * mu.per
					a, err := c.NewArena(mats*(len(d.Data)+len(d.Scale)+1024) + recs*4*mu.batch*(mu.rows+mu.cols) + recs*256 + 1<<20)
					if err != nil {
						return err
					}
					defer c.ReleaseArena(a)
					wm, err := uploadCopies(c, a, d, mats)
					if err != nil {
						return err
					}
					ws := make([]*DeviceWeight, recs)
					ys, xs := make([]DevicePtr, recs), make([]DevicePtr, recs)
					for i := range recs {
						ws[i] = wm[i%mats]
						if xs[i], err = a.Alloc(4 * mu.batch * mu.cols); err != nil {
							return err
						}
						if ys[i], err = a.Alloc(4 * mu.batch * mu.rows); err != nil {
							return err
						}
						if err := fillNormal(c, xs[i], mu.batch*mu.cols, xpool); err != nil {
							return err
						}
					}
					m, err := c.PrepareMultiLinear(a, ws, ys, xs, mu.batch, v.v)
					if err != nil {
						return err
					}
					launch := func(int) error { return c.LaunchMultiLinear(m, c.Stream()) }
					if err := launch(0); err != nil {
						return err
					}
					ts, err := timed(c, spin, 5, 7, launch)
					if err != nil {
						return err
					}
					flop := 2 * float64(mu.rows) * float64(mu.cols) * float64(mu.batch) * float64(recs)
					record(b, gemmRow{Name: mu.name, Format: "mxfp4", Rows: mu.rows, Cols: mu.cols, Batch: mu.batch, Records: recs, Variant: v.name, Kernel: m.Kernel()}, ts, flop)
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			})
		}
	}

	for _, r := range rows {
		b.Logf("%-16s %-8s %5dx%-5d g%d b%-4d %-14s %10.1f us %7.1f TFLOP/s  %s", r.Name, r.Format, r.Rows, r.Cols, max(r.Groups, 1), r.Batch, r.Variant, r.US, r.TFLOPS, r.Kernel)
	}
	if path := os.Getenv("MOXIE_BENCH_JSON"); path != "" {
		js, _ := json.MarshalIndent(rows, "", "  ")
		if err := os.WriteFile(path+".tmp", js, 0o644); err != nil {
			b.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			b.Fatal(err)
		}
	}
}

// fillNormal fills n floats at p with the values of pool, repeated.
func fillNormal(c *Ctx, p DevicePtr, n int, pool []float32) error {
	k := min(n, len(pool))
	if err := c.CopyFloatsToDevice(p, pool[:k]); err != nil {
		return err
	}
	if err := c.lib.CtxSynchronize(); err != nil { // the copy has landed before the stream reads it (TestCopyToDeviceOrdered)
		return err
	}
	for done := k; done < n; {
		m := min(done, n-done) // double the filled prefix each step
		if err := c.CopyAsync(p+DevicePtr(4*done), p, 4*m, c.Stream()); err != nil {
			return err
		}
		done += m
	}
	return nil
}

// uploadCopies uploads d once and makes n-1 device-side copies of it.
func uploadCopies(c *Ctx, a *Arena, d compute.WeightData, n int) ([]*DeviceWeight, error) {
	ws := make([]*DeviceWeight, n)
	var err error
	if ws[0], err = c.UploadWeight(a, d); err != nil {
		return nil, err
	}
	if err := c.lib.CtxSynchronize(); err != nil { // the upload has landed before the stream copies it
		return nil, err
	}
	for i := 1; i < n; i++ {
		w := *ws[0]
		if w.Data, err = a.Alloc(len(d.Data)); err != nil {
			return nil, err
		}
		if err := c.CopyAsync(w.Data, ws[0].Data, len(d.Data), c.Stream()); err != nil {
			return nil, err
		}
		w.Scale = w.Data
		if len(d.Scale) > 0 {
			if w.Scale, err = a.Alloc(len(d.Scale)); err != nil {
				return nil, err
			}
			if err := c.CopyAsync(w.Scale, ws[0].Scale, len(d.Scale), c.Stream()); err != nil {
				return nil, err
			}
		}
		ws[i] = &w
	}
	return ws, nil
}

// expertBenchMode is one way BenchmarkPrefillExperts runs the experts: nil
// modes mean PrepareExpertTiles (automatic).
type expertBenchMode struct {
	name  string
	modes []ExpertTileMode
	quick bool
}

// expertBenchModes are the record sizes and tiles BenchmarkPrefillExperts
// compares: the automatic choice, 64-row records with the 64x32, 64x16,
// 128x64, 256x32 and 128x64 with the in-place x split, 256-row records
// with 128x64, 256x64 (16 warps) and 256x64 (8 warps), 128-row records with
// 128x128 (in-place x split).
func expertBenchModes() []expertBenchMode {
	one := func(rows, tile int) []ExpertTileMode { return []ExpertTileMode{{rows, tile, 0}} }
	return []expertBenchMode{
		{"auto", nil, true},
		{"r64_t2_64x32", one(64, 2), true},
		{"r64_t1_128x64", one(64, 1), true},
		{"r64_t15_64x16", one(64, 15), false},
		{"r256_t1_128x64", one(256, 1), false},
		{"r256_t16_256x64w8", one(256, 16), false},
		{"r64_t17_256x32", one(64, 17), false},
		{"r64_t11_128x64x", one(64, 11), false},
		{"r256_t8_256x64w4", one(256, 8), false},
		{"r128_t13_128x128x", one(128, 13), false},
	}
}

// BenchmarkPrefillExperts measures a prefill chunk's routed experts on the
// V4-Flash shapes (MXFP4 w1, w3 [2048, 4096], w2 [4096, 2048]) as the
// device session runs them (PlanExperts, RunExpertTiles13, RunExpertTiles2)
// for 192 and 256 experts and chunks of 512, 2048 and 4096 tokens, K = 6
// distinct experts per token chosen uniformly at random, per record size
// and tile (expertBenchModes), reporting us and TFLOP/s (2·rows·cols per
// routed row and matrix; the hi/lo products are not counted twice) of the
// w1+w3 and the w2 launch; and the FP8 shared expert's w1+w3 multi launch
// over the whole chunk per tile (shared_*). The experts' records point at 8
// distinct uploaded experts (more than L2 holds). Run with
// -test.benchtime 1x; $MOXIE_BENCH_QUICK keeps the automatic choice and the
// two default tiles; filter by name, e.g. -test.bench
// 'PrefillExperts/e256_t4096'.
func BenchmarkPrefillExperts(b *testing.B) {
	dev := testDevice(b)
	const inter, dim, K, distinct, maxT = 2048, 4096, 6, 8, 4096
	quick := os.Getenv("MOXIE_BENCH_QUICK") != ""
	rng := rand.New(rand.NewPCG(6, 1))
	d13 := randomWeight(rng, compute.MXFP4, inter, dim)
	d2 := randomWeight(rng, compute.MXFP4, dim, inter)
	dsh := randomWeight(rng, compute.FP8Block, inter, dim)
	xpool := make([]float32, 1<<20)
	for i := range xpool {
		xpool[i] = float32(rng.NormFloat64())
	}
	Es, Ts := []int{192, 256}, []int{512, 2048, 4096}
	n := maxT * K
	var (
		a          *Arena
		fw         *Fwd
		spin       *Kernel
		bufs       ExpertTileBufs
		sh         []*DeviceWeight
		shx        DevicePtr
		shg, shu   DevicePtr
		tabs       = map[int]*ExpertTable{}
		ids, wts   = map[[2]int]DevicePtr{}, map[[2]int]DevicePtr{}
		setupError error
	)
	setupError = dev.Do(func(c *Ctx) error {
		var err error
		if fw, err = c.Fwd(); err != nil {
			return err
		}
		if spin, err = spinKernel(c); err != nil {
			return err
		}
		m13 := len(d13.Data) + len(d13.Scale) + 2048
		m2 := len(d2.Data) + len(d2.Scale) + 2048
		size := distinct*(2*m13+m2) + 2*(len(dsh.Data)+len(dsh.Scale)+2048) + 4*n*(2*dim+3*inter) + 4*maxT*(dim+2*inter) +
			len(Es)*len(Ts)*8*n + 64<<20
		if a, err = c.NewArena(size); err != nil {
			return err
		}
		w1, err := uploadCopies(c, a, d13, distinct)
		if err != nil {
			return err
		}
		w3, err := uploadCopies(c, a, d13, distinct)
		if err != nil {
			return err
		}
		w2, err := uploadCopies(c, a, d2, distinct)
		if err != nil {
			return err
		}
		if sh, err = uploadCopies(c, a, dsh, 2); err != nil {
			return err
		}
		alloc := func(bytes int) DevicePtr {
			if err != nil {
				return 0
			}
			var p DevicePtr
			p, err = a.Alloc(bytes)
			return p
		}
		bufs = ExpertTileBufs{RowTok: alloc(4 * n), RowW: alloc(4 * n), Inv: alloc(4 * n), Tiles: alloc(4 * 3 * expertMaxTiles(n, 256, moeTile)),
			XE: alloc(4 * n * dim), G: alloc(4 * n * inter), U: alloc(4 * n * inter), H: alloc(4 * n * inter), Y: alloc(4 * n * dim)}
		shx, shg, shu = alloc(4*maxT*dim), alloc(4*maxT*inter), alloc(4*maxT*inter)
		for _, E := range Es {
			for _, T := range Ts {
				ids[[2]int{E, T}], wts[[2]int{E, T}] = alloc(4*T*K), alloc(4*T*K)
			}
		}
		if err != nil {
			return err
		}
		for _, p := range []struct {
			p DevicePtr
			n int
		}{{bufs.XE, n * dim}, {bufs.H, n * inter}, {shx, maxT * dim}} {
			if err := fillNormal(c, p.p, p.n, xpool); err != nil {
				return err
			}
		}
		for _, E := range Es {
			e1, e3, e2 := make([]*DeviceWeight, E), make([]*DeviceWeight, E), make([]*DeviceWeight, E)
			for e := range E {
				e1[e], e3[e], e2[e] = w1[e%distinct], w3[e%distinct], w2[e%distinct]
			}
			if tabs[E], err = c.PrepareExpertTable(a, e1, e3, e2); err != nil {
				return err
			}
			for _, T := range Ts {
				if err := uploadRandomRoute(c, rng, ids[[2]int{E, T}], wts[[2]int{E, T}], T, K, E); err != nil {
					return err
				}
			}
		}
		return c.lib.CtxSynchronize() // the uploads have landed (TestCopyToDeviceOrdered)
	})
	defer dev.Do(func(c *Ctx) error {
		if a != nil {
			c.ReleaseArena(a)
		}
		return nil
	})
	if setupError != nil {
		b.Fatal(setupError)
	}
	var logs []string
	for _, E := range Es {
		for _, T := range Ts {
			nr := T * K
			for _, md := range expertBenchModes() {
				if quick && !md.quick {
					continue
				}
				b.Run(fmt.Sprintf("e%d_t%d_%s", E, T, md.name), func(b *testing.B) {
					err := dev.Do(func(c *Ctx) error {
						var et *ExpertTiles
						var err error
						if md.modes == nil {
							et, err = c.PrepareExpertTiles(a, tabs[E], maxT, K, bufs)
						} else {
							et, err = c.PrepareExpertTilesWith(a, tabs[E], maxT, K, bufs, md.modes)
						}
						if err != nil {
							return err
						}
						defer func() {
							for _, m := range et.modes {
								a.Free(m.run13.args)
								a.Free(m.run2.args)
							}
						}()
						if err := fw.PlanExperts(c, et, ids[[2]int{E, T}], wts[[2]int{E, T}], T, c.Stream()); err != nil {
							return err
						}
						k13, k2 := et.Kernels()
						flop := 2 * float64(nr) * inter * dim
						var us, tf [2]float64
						for i, launch := range []func(int) error{
							func(int) error { return fw.RunExpertTiles13(c, et, tabs[E], c.Stream()) },
							func(int) error { return fw.RunExpertTiles2(c, et, c.Stream()) },
						} {
							if err := launch(0); err != nil {
								return err
							}
							ts, err := timed(c, spin, 1, 3, launch)
							if err != nil {
								return err
							}
							us[i] = median(ts)
							tf[i] = flop * float64(2-i) / (us[i] * 1e6)
						}
						b.ReportMetric(tf[0], "TFLOP/s-w13")
						b.ReportMetric(us[0], "us-w13")
						b.ReportMetric(tf[1], "TFLOP/s-w2")
						b.ReportMetric(us[1], "us-w2")
						logs = append(logs, fmt.Sprintf("e%-3d t%-4d %-18s w1+w3 %8.0f us %5.1f TFLOP/s  w2 %8.0f us %5.1f TFLOP/s  %s %s",
							E, T, md.name, us[0], tf[0], us[1], tf[1], k13, k2))
						return nil
					})
					if err != nil {
						b.Fatal(err)
					}
				})
			}
		}
	}
	// The FP8 shared expert's w1 and w3 over the whole chunk.
	for _, T := range Ts {
		for _, v := range []namedVariant{{"auto", LinearVariant{}, true}, {"tc2_64x32", LinearVariant{Width: WidthTC, Tile: 2}, true}, {"tc1_128x64", LinearVariant{Width: WidthTC, Tile: 1}, true}} {
			b.Run(fmt.Sprintf("shared_fp8_w1w3_t%d_%s", T, v.name), func(b *testing.B) {
				err := dev.Do(func(c *Ctx) error {
					m, err := c.PrepareMultiLinear(a, sh, []DevicePtr{shg, shu}, []DevicePtr{shx, shx}, T, v.v)
					if err != nil {
						return err
					}
					defer a.Free(m.args)
					launch := func(int) error { return c.LaunchMultiLinear(m, c.Stream()) }
					if err := launch(0); err != nil {
						return err
					}
					ts, err := timed(c, spin, 2, 3, launch)
					if err != nil {
						return err
					}
					us := median(ts)
					tf := 2 * 2 * float64(T) * inter * dim / (us * 1e6)
					b.ReportMetric(tf, "TFLOP/s")
					b.ReportMetric(us, "us/op")
					logs = append(logs, fmt.Sprintf("shared fp8 w1+w3 t%-4d %-10s %8.0f us %5.1f TFLOP/s  %s", T, v.name, us, tf, m.Kernel()))
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			})
		}
	}
	for _, l := range logs {
		b.Log(l)
	}
}

// uploadRandomRoute writes T tokens' routing to ids and wts (T·K int32
// expert ids and float32 weights, token-major): K distinct experts per
// token drawn uniformly from E, weights uniform in [0, 1). The uploads are
// pageable: synchronise the context before a stream reads them.
func uploadRandomRoute(c *Ctx, rng *rand.Rand, ids, wts DevicePtr, T, K, E int) error {
	idb, wb := make([]byte, 4*T*K), make([]byte, 4*T*K)
	for tk := range T {
		for k, e := range rng.Perm(E)[:K] {
			j := tk*K + k
			binary.LittleEndian.PutUint32(idb[4*j:], uint32(e))
			binary.LittleEndian.PutUint32(wb[4*j:], math.Float32bits(float32(rng.Float64())))
		}
	}
	if err := c.CopyToDevice(ids, idb); err != nil {
		return err
	}
	return c.CopyToDevice(wts, wb)
}

// BenchmarkMoEPlan measures the prefill MoE's bookkeeping kernels on the
// V4-Flash shapes (K = 6 distinct experts per token chosen uniformly at
// random, dim 4096): PlanExperts with the one-block planner (old) and the
// multi-block one (multi) for 192 and 256 experts and chunks of 512, 2048
// and 4096 tokens, alone (us-plan) and with the tiles' records
// (fwd_moe_tiles, 64-row tiles: us-plan+tiles); and, per chunk size,
// GatherRows of the chunk's T·6 rows and CombineExperts (us, GB/s of the
// bytes each must move). Device time from CUDA events, median of 5 runs of
// 10 launches each; run with -test.benchtime 1x (about 10 s).
func BenchmarkMoEPlan(b *testing.B) {
	dev := testDevice(b)
	const K, dim, maxT, tile = 6, 4096, 4096, 64
	Es, Ts := []int{192, 256}, []int{512, 2048, 4096}
	n := maxT * K
	rng := rand.New(rand.NewPCG(9, 2))
	var (
		a          *Arena
		fw         *Fwd
		spin       *Kernel
		bufs       ExpertTileBufs
		x, out     DevicePtr
		rec13      DevicePtr
		rec2       DevicePtr
		all13      DevicePtr
		all2       DevicePtr
		ids, wts   = map[[2]int]DevicePtr{}, map[[2]int]DevicePtr{}
		setupError error
	)
	maxTiles := expertMaxTiles(n, 256, tile)
	setupError = dev.Do(func(c *Ctx) error {
		var err error
		if fw, err = c.Fwd(); err != nil {
			return err
		}
		if spin, err = spinKernel(c); err != nil {
			return err
		}
		rec := int(unsafe.Sizeof(linArgs{}))
		if a, err = c.NewArena(4*n*(2*dim+3) + 8*maxT*dim + 4*3*maxTiles + 3*rec*(maxTiles+256) + len(Es)*len(Ts)*8*n + 16<<20); err != nil {
			return err
		}
		alloc := func(bytes int) DevicePtr {
			if err != nil {
				return 0
			}
			var p DevicePtr
			p, err = a.Alloc(bytes)
			return p
		}
		bufs = ExpertTileBufs{RowTok: alloc(4 * n), RowW: alloc(4 * n), Inv: alloc(4 * n), Tiles: alloc(4 * 3 * maxTiles),
			XE: alloc(4 * n * dim), Y: alloc(4 * n * dim)}
		x, out = alloc(4*maxT*dim), alloc(4*maxT*dim)
		rec13, rec2, all13, all2 = alloc(2*rec*maxTiles), alloc(rec*maxTiles), alloc(2*rec*256), alloc(rec*256)
		for _, E := range Es {
			for _, T := range Ts {
				ids[[2]int{E, T}], wts[[2]int{E, T}] = alloc(4*T*K), alloc(4*T*K)
			}
		}
		if err != nil {
			return err
		}
		for _, p := range []struct {
			p DevicePtr
			n int
		}{{bufs.Y, 4 * n * dim}, {x, 4 * maxT * dim}, {out, 4 * maxT * dim}, {all13, 2 * rec * 256}, {all2, rec * 256}} {
			if err := c.Memset(p.p, 0, p.n, c.Stream()); err != nil {
				return err
			}
		}
		for _, E := range Es {
			for _, T := range Ts {
				if err := uploadRandomRoute(c, rng, ids[[2]int{E, T}], wts[[2]int{E, T}], T, K, E); err != nil {
					return err
				}
			}
		}
		return c.lib.CtxSynchronize()
	})
	defer dev.Do(func(c *Ctx) error {
		if a != nil {
			c.ReleaseArena(a)
		}
		return nil
	})
	if setupError != nil {
		b.Fatal(setupError)
	}
	const launches, reps = 10, 5
	var logs []string
	for _, E := range Es {
		for _, T := range Ts {
			for _, v := range []struct {
				name string
				v    moePlanVariant
			}{{"old", moePlanOld}, {"multi", moePlanMulti}} {
				b.Run(fmt.Sprintf("e%d_t%d_%s", E, T, v.name), func(b *testing.B) {
					err := dev.Do(func(c *Ctx) error {
						mt := expertMaxTiles(n, E, tile)
						et := &ExpertTiles{modes: []expertMode{{ExpertTileMode: ExpertTileMode{Rows: tile}, maxTiles: mt,
							run13: &MultiLinear{args: rec13}, run2: &MultiLinear{args: rec2}}}, maxRows: n, K: K, E: E, dim: dim, b: bufs}
						plan := func(int) error {
							return fw.planExperts(c, et, ids[[2]int{E, T}], wts[[2]int{E, T}], T, v.v, c.Stream())
						}
						both := func(i int) error {
							if err := plan(i); err != nil {
								return err
							}
							return fw.expertRecords(c, et, all13, all2, c.Stream())
						}
						var us [2]float64
						for i, f := range []func(int) error{plan, both} {
							if err := f(0); err != nil {
								return err
							}
							ts, err := timed(c, spin, launches, reps, f)
							if err != nil {
								return err
							}
							us[i] = median(ts)
						}
						b.ReportMetric(us[0], "us-plan")
						b.ReportMetric(us[1], "us-plan+tiles")
						logs = append(logs, fmt.Sprintf("e%-3d t%-4d %-5s plan %8.1f us  plan+tiles %8.1f us", E, T, v.name, us[0], us[1]))
						return nil
					})
					if err != nil {
						b.Fatal(err)
					}
				})
			}
		}
	}
	// The gather of the chunk's routed rows and the combine: E does not
	// matter (the layout of the last plan of 256 experts at T).
	for _, T := range Ts {
		nr := T * K
		for _, op := range []struct {
			name  string
			bytes float64
		}{{"gather", 4 * float64(nr*dim+nr*dim)}, {"combine", 4 * float64(nr*dim+2*T*dim)}} {
			b.Run(fmt.Sprintf("%s_t%d", op.name, T), func(b *testing.B) {
				err := dev.Do(func(c *Ctx) error {
					et := &ExpertTiles{modes: []expertMode{{ExpertTileMode: ExpertTileMode{Rows: tile}, maxTiles: expertMaxTiles(n, 256, tile)}},
						maxRows: n, K: K, E: 256, dim: dim, b: bufs}
					if err := fw.planExperts(c, et, ids[[2]int{256, T}], wts[[2]int{256, T}], T, moePlanMulti, c.Stream()); err != nil {
						return err
					}
					f := func(int) error { return fw.GatherRows(c, bufs.XE, x, bufs.RowTok, nr, dim, c.Stream()) }
					if op.name == "combine" {
						f = func(int) error { return fw.CombineExperts(c, out, et, T, c.Stream()) }
					}
					if err := f(0); err != nil {
						return err
					}
					ts, err := timed(c, spin, launches, reps, f)
					if err != nil {
						return err
					}
					us := median(ts)
					b.ReportMetric(us, "us/op")
					b.ReportMetric(op.bytes/(us*1e3), "GB/s")
					logs = append(logs, fmt.Sprintf("%-7s t%-4d %8.1f us %7.0f GB/s", op.name, T, us, op.bytes/(us*1e3)))
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			})
		}
	}
	for _, l := range logs {
		b.Log(l)
	}
}
