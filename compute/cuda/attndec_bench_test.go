package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"moxie/compute/computetest"
)

// BenchmarkAttentionDecode times AttentionDecode's partial-kernel variants
// (name g<heads per block>k<keys per tile>s<most splits>) against
// AttentionRing (one block per head, "ring") at V4-Flash's decode shapes:
// 64 heads of 512, window 128, CSA with 512 selected entries, HCA with every
// entry, window-only. Each runs 32 times in a captured CUDA graph
// (graphTime): the figure is device µs per call including the graph's launch
// cost per kernel. hca_ctx4096_max64k sizes the grid for a 64k context (640
// keys) while the position has 160, as a graph captured for the longest
// context does; hca_ctx262144 (2,176 keys) has splits of several tiles
// (variant g8k16db keeps the next tile's copies in flight).
func BenchmarkAttentionDecode(b *testing.B) {
	const (
		H, hd, window, topk = 64, 512, 128, 512
		calls               = 32
	)
	type bcase struct {
		name    string
		ctx, T  int
		kind    string
		maxKeys int // 0: what the position needs
	}
	cases := []bcase{
		{"window_ctx4096", 4096, 1, "window", 0},
		{"hca_ctx4096", 4096, 1, "hca", 0},
		{"hca_ctx4096_max64k", 4096, 1, "hca", window + 65536/128},
		{"hca_ctx262144", 262144, 1, "hca", 0},
		{"csa_ctx1024", 1024, 1, "csa", 0},
		{"csa_ctx4096", 4096, 1, "csa", 0},
		{"csa_ctx4096_T2", 4096, 2, "csa", 0},
		{"csa_ctx4096_T4", 4096, 4, "csa", 0},
	}
	variants := []attnDecVariant{}
	for _, v := range attnDecVariants {
		variants = append(variants, v)
		for w := v; w.MaxSplits > 4; { // halves down to 4 splits: fewer partials to combine, longer splits
			w.MaxSplits /= 2
			variants = append(variants, w)
		}
	}
	dev := testDevice(b)
	for _, bc := range cases {
		for vi := -1; vi < len(variants); vi++ { // -1: AttentionRing
			name := "ring"
			if vi >= 0 {
				v := variants[vi]
				name = fmt.Sprintf("%ss%d", v.Name, v.MaxSplits)
			}
			b.Run(bc.name+"/"+name, func(b *testing.B) {
				var us float64
				err := dev.Do(func(c *Ctx) error {
					f, err := c.Fwd()
					if err != nil {
						return err
					}
					if err := c.LoadAttnDec(); err != nil {
						return err
					}
					d := &devBufs{c: c}
					defer d.free()
					rng := rand.New(rand.NewPCG(3, uint64(bc.ctx)))
					ratio := map[string]int{"window": 0, "hca": 128, "csa": 4}[bc.kind]
					nEnt := 0
					if ratio > 0 {
						nEnt = bc.ctx / ratio
					}
					ringRows := window + bc.T
					idx := make([]int32, bc.T*topk)
					for j := range idx {
						idx[j] = int32(rng.IntN(max(nEnt, 1)))
					}
					pos := make([]int32, bc.T)
					for i := range pos {
						pos[i] = int32(bc.ctx - bc.T + i)
					}
					p := AttnParams{O: d.alloc(4 * bc.T * H * hd), Q: d.floats(computetest.Normal(rng, bc.T*H*hd, 1)),
						Ring: d.floats(computetest.Normal(rng, ringRows*hd, 1)), Sinks: d.floats(computetest.Normal(rng, H, 1)),
						Pos: d.int32s(pos), RingRows: ringRows, Window: window, T: bc.T, Ratio: ratio, IdxStride: topk, Heads: H, Dim: hd,
						HeadsPerBlock: 1, MaxKeys: window, Scale: float32(1 / math.Sqrt(hd))}
					switch bc.kind {
					case "csa":
						p.Comp, p.Idx, p.TopK, p.MaxKeys = d.floats(computetest.Normal(rng, nEnt*hd, 1)), d.int32s(idx), topk, window+topk
					case "hca":
						p.Comp, p.MaxKeys = d.floats(computetest.Normal(rng, nEnt*hd, 1)), window+nEnt
					}
					if bc.maxKeys > 0 {
						p.MaxKeys = bc.maxKeys
					}
					one := func() error { return f.AttentionRing(c, p, c.Stream()) }
					if vi >= 0 {
						v := variants[vi]
						scratch := d.alloc(4 * bc.T * v.splits(p.MaxKeys) * H * (hd + 2))
						one = func() error { return c.attentionDecodeV(p, scratch, v, c.Stream()) }
					}
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
}

// BenchmarkAttentionDecodeInvRoPE times a decode step's attention and its
// output's inverse rotation at V4-Flash's shapes (64 heads of 512, 32
// frequencies, CSA with 512 selected entries at a 4,096 context, one
// query): "chain" is AttentionDecode then RoPE (inverse), three kernels;
// "fused" is AttentionDecodeInvRoPE, two. Each runs 32 times in a captured
// CUDA graph (graphTime): device µs per call.
func BenchmarkAttentionDecodeInvRoPE(b *testing.B) {
	const (
		H, hd, window, topk, nf = 64, 512, 128, 512, 32
		ctx, calls              = 4096, 32
	)
	dev := testDevice(b)
	for _, name := range []string{"chain", "fused"} {
		b.Run(name, func(b *testing.B) {
			var us float64
			err := dev.Do(func(c *Ctx) error {
				if err := c.LoadAttnDec(); err != nil {
					return err
				}
				if err := c.LoadOps(); err != nil {
					return err
				}
				d := &devBufs{c: c}
				defer d.free()
				rng := rand.New(rand.NewPCG(5, ctx))
				nEnt := ctx / 4
				idx := make([]int32, topk)
				for j := range idx {
					idx[j] = int32(rng.IntN(nEnt))
				}
				p := AttnParams{O: d.alloc(4 * H * hd), Q: d.floats(computetest.Normal(rng, H*hd, 1)),
					Ring: d.floats(computetest.Normal(rng, (window+1)*hd, 1)), Sinks: d.floats(computetest.Normal(rng, H, 1)),
					Pos: d.int32s([]int32{ctx - 1}), RingRows: window + 1, Window: window, T: 1, Ratio: 4, IdxStride: topk, TopK: topk,
					Heads: H, Dim: hd, MaxKeys: window + topk, Scale: float32(1 / math.Sqrt(hd)),
					Comp: d.floats(computetest.Normal(rng, nEnt*hd, 1)), Idx: d.int32s(idx)}
				freq := d.floats(ropeFreqs(nf))
				scratch := d.alloc(AttentionDecodeScratchBytes(H, hd, 1, p.MaxKeys))
				d.synced()
				if d.err != nil {
					return d.err
				}
				one := func() error { return c.AttentionDecodeInvRoPE(p, freq, nf, scratch, c.Stream()) }
				if name == "chain" {
					one = func() error {
						if err := c.AttentionDecode(p, scratch, c.Stream()); err != nil {
							return err
						}
						return c.RoPE(p.O, p.Pos, freq, 1, H*hd, hd, nf, true, c.Stream())
					}
				}
				var err error
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
