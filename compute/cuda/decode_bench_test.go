package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"moxie/compute"
	"moxie/compute/computetest"
)

// BenchmarkDecodeKernels times, at V4-Flash's decode shapes (one token, the
// context given in the name), the per-layer kernels that are neither weight
// products nor hyper-connection ops: the indexer's scores and top-k, the
// attention over window + compressed entries, routing, and a small BF16
// gate product. Each runs 32 times in a captured CUDA graph (graphTime), so
// the figure is device µs per call with graph launch costs, as in a decode
// step.
func BenchmarkDecodeKernels(b *testing.B) {
	const (
		H, hd, IH, ID = 64, 512, 64, 128
		window, topk  = 128, 512
		E, K          = 256, 6
		D             = 4096
		calls         = 32
	)
	dev := testDevice(b)
	type kcase struct {
		name  string
		setup func(c *Ctx, f *Fwd, d *devBufs) func() error
	}
	var cases []kcase
	for _, ctx := range []int{1024, 4096, 8192} {
		n := ctx / 4 // CSA entries
		// The indexer's scores and top-k on Fwd's kernels and on IdxDec's
		// (the same arguments and inputs).
		type indexer interface {
			IndexScores(c *Ctx, scores, q, w, keys, pos DevicePtr, T, nKeys, ratio, heads, dim, stride int, s Stream) error
			TopKRows(c *Ctx, idx, scores, pos DevicePtr, T, ratio, k, stride int, s Stream) error
		}
		for _, impl := range []struct {
			suffix string
			get    func(c *Ctx, f *Fwd) (indexer, error)
		}{
			{"", func(c *Ctx, f *Fwd) (indexer, error) { return f, nil }},
			{"_idxdec", func(c *Ctx, f *Fwd) (indexer, error) { return c.IdxDec() }},
		} {
			cases = append(cases,
				kcase{fmt.Sprintf("index_scores%s_ctx%d", impl.suffix, ctx), func(c *Ctx, f *Fwd, d *devBufs) func() error {
					x, err := impl.get(c, f)
					if err != nil {
						d.err = err
						return nil
					}
					rng := rand.New(rand.NewPCG(1, uint64(ctx)))
					sc := d.alloc(4 * n)
					q, w := d.floats(computetest.Normal(rng, IH*ID, 1)), d.floats(computetest.Normal(rng, IH, 1))
					keys := d.floats(computetest.Normal(rng, n*ID, 1))
					pos := d.int32s([]int32{int32(ctx - 1)})
					return func() error { return x.IndexScores(c, sc, q, w, keys, pos, 1, n, 4, IH, ID, n, c.Stream()) }
				}},
				kcase{fmt.Sprintf("topk_rows%s_ctx%d", impl.suffix, ctx), func(c *Ctx, f *Fwd, d *devBufs) func() error {
					x, err := impl.get(c, f)
					if err != nil {
						d.err = err
						return nil
					}
					rng := rand.New(rand.NewPCG(2, uint64(ctx)))
					sc := d.floats(computetest.Normal(rng, n, 1))
					idx := d.alloc(4 * topk)
					pos := d.int32s([]int32{int32(ctx - 1)})
					return func() error { return x.TopKRows(c, idx, sc, pos, 1, 4, topk, n, c.Stream()) }
				}},
			)
		}
		for _, kind := range []string{"csa", "hca"} {
			cases = append(cases, kcase{fmt.Sprintf("attention_%s_ctx%d", kind, ctx), func(c *Ctx, f *Fwd, d *devBufs) func() error {
				rng := rand.New(rand.NewPCG(3, uint64(ctx)))
				ratio := 4
				if kind == "hca" {
					ratio = 128
				}
				nEnt := ctx / ratio
				ringRows := window + 1
				idx := make([]int32, topk)
				for j := range idx {
					idx[j] = int32(rng.IntN(max(nEnt, 1)))
				}
				p := AttnParams{O: d.alloc(4 * H * hd), Q: d.floats(computetest.Normal(rng, H*hd, 1)),
					Ring: d.floats(computetest.Normal(rng, ringRows*hd, 1)), Comp: d.floats(computetest.Normal(rng, max(nEnt, 1)*hd, 1)),
					Sinks: d.floats(computetest.Normal(rng, H, 1)), Pos: d.int32s([]int32{int32(ctx - 1)}), RingRows: ringRows,
					Window: window, T: 1, Ratio: ratio, IdxStride: topk, Heads: H, Dim: hd, HeadsPerBlock: 1,
					Scale: float32(1 / math.Sqrt(hd))}
				if kind == "csa" {
					p.Idx, p.TopK, p.MaxKeys = d.int32s(idx), topk, window+topk
				} else {
					p.MaxKeys = window + nEnt
				}
				return func() error { return f.AttentionRing(c, p, c.Stream()) }
			}})
		}
	}
	cases = append(cases,
		kcase{"route_b1", func(c *Ctx, f *Fwd, d *devBufs) func() error {
			rng := rand.New(rand.NewPCG(4, 4))
			ids, w := d.alloc(4*K), d.alloc(4*K)
			lg, bias := d.floats(computetest.Normal(rng, E, 1)), d.floats(computetest.Normal(rng, E, 0.1))
			return func() error { return c.Route(ids, w, lg, bias, 0, 1, E, K, 1.5, c.Stream()) }
		}},
		kcase{"gate_bf16_256x4096_b1", func(c *Ctx, f *Fwd, d *devBufs) func() error {
			rng := rand.New(rand.NewPCG(5, 5))
			w := d.weight(computetest.RandomWeight(rng, compute.BF16, E, D, 0.02))
			x, y := d.floats(computetest.Normal(rng, D, 1)), d.alloc(4*E)
			return func() error { return c.Linear(w, y, x, 1, c.Stream()) }
		}},
	)
	for _, kc := range cases {
		b.Run(kc.name, func(b *testing.B) {
			var us float64
			err := dev.Do(func(c *Ctx) error {
				f, err := c.Fwd()
				if err != nil {
					return err
				}
				d := &devBufs{c: c}
				defer d.free()
				one := kc.setup(c, f, d)
				d.synced()
				if d.err != nil {
					return d.err
				}
				us, err = graphTime(b, c, calls, one)
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(us, "device-us/op")
		})
	}
}
