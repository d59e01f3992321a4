package cuda

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
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
	Name    string  `json:"name"`
	Format  string  `json:"format"`
	Rows    int     `json:"rows"`
	Cols    int     `json:"cols"`
	Batch   int     `json:"batch"`
	Variant string  `json:"variant"`
	Copies  int     `json:"copies"`
	Bytes   int     `json:"weight_bytes"`
	US      float64 `json:"us_median"`
	USMin   float64 `json:"us_min"`
	GBps    float64 `json:"gbps"`
	PctHBM  float64 `json:"pct_hbm_read"`
}

type benchReport struct {
	Device       string     `json:"device"`
	When         string     `json:"when"`
	HBMReadGBps  float64    `json:"hbm_read_gbps"`
	HBMBytes     int64      `json:"hbm_read_bytes"`
	CompileMS    float64    `json:"linear_module_compile_ms"`
	FromCache    bool       `json:"linear_module_from_cache"`
	Linear       []benchRow `json:"linear"`
	GraphKernels int        `json:"graph_kernels"`
	PlainUSPerK  float64    `json:"plain_launch_us_per_kernel"`
	PlainHostUS  float64    `json:"plain_launch_host_us_per_kernel"`
	GraphUSPerK  float64    `json:"graph_us_per_kernel"`
	GraphHostUS  float64    `json:"graph_launch_host_us"`
	Notes        []string   `json:"notes"`
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// timed runs reps repetitions of: spin (so the host can queue ahead), event,
// n launches, event; it returns the per-launch device times (µs).
func timed(c *Ctx, spin *Kernel, n, reps int, launch func(i int) error) ([]float64, error) {
	s := c.Stream()
	e0, err := c.NewEvent(true)
	if err != nil {
		return nil, err
	}
	defer c.DestroyEvent(e0)
	e1, err := c.NewEvent(true)
	if err != nil {
		return nil, err
	}
	defer c.DestroyEvent(e1)
	out := make([]float64, 0, reps)
	spinNS := int64(500_000 + n*15_000)
	for range reps {
		if err := c.Launch(spin, Dim3{X: 1}, Dim3{X: 1}, 0, s, unsafe.Pointer(&spinNS)); err != nil {
			return nil, err
		}
		if err := c.Record(e0, s); err != nil {
			return nil, err
		}
		for i := range n {
			if err := launch(i); err != nil {
				return nil, err
			}
		}
		if err := c.Record(e1, s); err != nil {
			return nil, err
		}
		if err := c.WaitEvent(e1); err != nil {
			return nil, err
		}
		ms, err := c.Elapsed(e0, e1)
		if err != nil {
			return nil, err
		}
		out = append(out, ms*1000/float64(n))
	}
	return out, nil
}

// randomWeight fills a weight of the given format with random, finite values
// (FP8 codes without NaN, scales near 1, BF16 of moderate exponent).
func randomWeight(rng *rand.Rand, f compute.Format, rows, cols int) compute.WeightData {
	d := compute.WeightData{Format: f, Rows: rows, Cols: cols, Block: 128}
	fill := func(b []byte) {
		for i := 0; i+8 <= len(b); i += 8 {
			v := rng.Uint64()
			for k := range 8 {
				b[i+k] = byte(v >> (8 * k))
			}
		}
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
		if lin, err = c.Module("linear", linearSrc); err != nil {
			return err
		}
		rep.CompileMS = float64(time.Since(t0).Microseconds()) / 1000
		rep.FromCache = lin.FromCache
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

	type variant struct {
		name string
		v    LinearVariant
	}
	W := WidthWide
	b1Variants := []variant{
		{"auto", LinearVariant{}}, {"bits", LinearVariant{Decode: DecodeBits}},
		{"r2u8", LinearVariant{RB: 2, U: 8}}, {"r4u4", LinearVariant{RB: 4, U: 4}},
		{"kw1", LinearVariant{KW: 1}}, {"kw2", LinearVariant{KW: 2}}, {"kw4", LinearVariant{KW: 4}}, {"kw8", LinearVariant{KW: 8}},
		{"wide", LinearVariant{Width: W}}, {"wide_bits", LinearVariant{Width: W, Decode: DecodeBits}},
		{"wide_u4", LinearVariant{Width: W, U: 4}}, {"wide_u1", LinearVariant{Width: W, U: 1}}, {"wide_r4", LinearVariant{Width: W, RB: 4}},
		{"wide_kw1", LinearVariant{Width: W, KW: 1}}, {"wide_kw2", LinearVariant{Width: W, KW: 2}},
		{"wide_kw4", LinearVariant{Width: W, KW: 4}}, {"wide_kw8", LinearVariant{Width: W, KW: 8}},
	}
	bnVariants := map[int][]variant{
		4: {{"auto", LinearVariant{}}, {"bits", LinearVariant{Decode: DecodeBits}}, {"r4u4", LinearVariant{RB: 4, U: 4}},
			{"wide", LinearVariant{Width: W}}, {"wide_bits", LinearVariant{Width: W, Decode: DecodeBits}}, {"wide_r4", LinearVariant{Width: W, RB: 4}}},
		16: {{"auto", LinearVariant{}}, {"bits", LinearVariant{Decode: DecodeBits}}, {"r4u4", LinearVariant{RB: 4, U: 4}},
			{"wide", LinearVariant{Width: W}}, {"wide_bits", LinearVariant{Width: W, Decode: DecodeBits}}},
	}
	quick := os.Getenv("MOXIE_BENCH_QUICK") != ""
	if quick {
		P := WidthPersist
		b1Variants = []variant{{"auto", LinearVariant{}}, {"wide_r4", LinearVariant{Width: W, RB: 4}},
			{"persist", LinearVariant{Width: P}}, {"persist_bits", LinearVariant{Width: P, Decode: DecodeBits}},
			{"persist_rb1", LinearVariant{Width: P, RB: 1}}}
		bnVariants = map[int][]variant{4: {{"auto", LinearVariant{}}, {"persist", LinearVariant{Width: P}}}}
	}
	rng := rand.New(rand.NewPCG(42, 7))
	for _, sh := range v4Shapes {
		if quick && sh.f == compute.BF16 {
			continue
		}
		d := randomWeight(rng, sh.f, sh.rows, sh.cols)
		bytes := len(d.Data) + len(d.Scale)
		copies := max(2, (5*dev.Info().L2Bytes+bytes-1)/bytes)
		for _, batch := range []int{1, 4, 16} {
			if quick && batch == 16 {
				continue
			}
			vs := b1Variants
			if batch > 1 {
				vs = bnVariants[batch]
			}
			for _, v := range vs {
				if sh.f == compute.BF16 && (v.v.Decode == DecodeBits || v.v.Width == WidthWide) {
					continue // one kernel family only
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
						row := benchRow{Name: sh.name, Format: sh.f.String(), Rows: sh.rows, Cols: sh.cols, Batch: batch,
							Variant: v.name, Copies: copies, Bytes: bytes, US: us, USMin: slices.Min(ts),
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
			if quick && batch > 1 {
				continue
			}
			mvs := []variant{{"auto", LinearVariant{}}, {"bits", LinearVariant{Decode: DecodeBits}},
				{"wide", LinearVariant{Width: W}}, {"wide_bits", LinearVariant{Width: W, Decode: DecodeBits}},
				{"persist", LinearVariant{Width: WidthPersist}}, {"persist_bits", LinearVariant{Width: WidthPersist, Decode: DecodeBits}}}
			if quick {
				mvs = []variant{mvs[0], mvs[1], mvs[4], mvs[5]}
			}
			for _, v := range mvs {
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
							Variant: fmt.Sprintf("x%d_%s", mu.n, v.name), Copies: sets, Bytes: ms[0].Bytes(), US: us, USMin: slices.Min(ts),
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
			e0, _ := c.NewEvent(true)
			e1, _ := c.NewEvent(true)
			defer c.DestroyEvent(e0)
			defer c.DestroyEvent(e1)
			var plain, plainHost, graph, graphHost []float64
			for range 11 {
				t0 := time.Now()
				c.Record(e0, s)
				for range nk {
					if err := one(); err != nil {
						return err
					}
				}
				c.Record(e1, s)
				plainHost = append(plainHost, float64(time.Since(t0).Nanoseconds())/1e3/nk)
				if err := c.WaitEvent(e1); err != nil {
					return err
				}
				ms, _ := c.Elapsed(e0, e1)
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
				c.Record(e0, s)
				t0 := time.Now()
				if err := c.LaunchGraph(g, s); err != nil {
					return err
				}
				graphHost = append(graphHost, float64(time.Since(t0).Nanoseconds())/1e3)
				c.Record(e1, s)
				if err := c.WaitEvent(e1); err != nil {
					return err
				}
				ms, _ := c.Elapsed(e0, e1)
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
	b.Logf("linear module: %.1f ms (from cache: %v)", r.CompileMS, r.FromCache)
	b.Logf("HBM read (8 GiB, median of 21): %.0f GB/s", r.HBMReadGBps)
	b.Logf("%-10s %-9s %-12s %5s %-6s %7s %9s %8s %6s", "shape", "format", "rows x cols", "batch", "var", "copies", "us (med)", "GB/s", "%HBM")
	for _, x := range r.Linear {
		b.Logf("%-10s %-9s %-12s %5d %-6s %7d %9.2f %8.0f %6.1f", x.Name, x.Format, fmt.Sprintf("%dx%d", x.Rows, x.Cols), x.Batch, x.Variant, x.Copies, x.US, x.GBps, x.PctHBM)
	}
	b.Logf("%d tiny launches: plain %.2f us/kernel on the device (host %.2f us/launch), graph %.2f us/kernel (host %.1f us per graph launch)",
		r.GraphKernels, r.PlainUSPerK, r.PlainHostUS, r.GraphUSPerK, r.GraphHostUS)
}
