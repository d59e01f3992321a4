package cuda

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"moxie/compute"
	"moxie/compute/computetest"
)

// BenchmarkGemvPair times wo_a then wo_b of a V4-Flash decode step (wo_a
// FP8 [8192, 4096] in 8 row groups, wo_b FP8 [4096, 8192], 67 MB of
// weights) as one GemvPair launch against two Gemv launches (U 2), each
// run reading the next of 8 copies of both weights (537 MB: past L2), 32
// runs timed between CUDA events both as plain stream launches and as a
// captured graph (programmatic dependent launch as the device has it: on
// for sm_90 unless MOXIE_CUDA_PDL=off). In the graph also the pair's
// variants (U 4, late fill, no or 8 rows of wo_b in shared memory, no or
// early L2 hints, wo_a's rows hinted first alone and with late fill, U 4
// or 16 rows of wo_b in shared memory) and each Gemv alone. Reports device µs per run, GB/s of the
// weight bytes and %HBM (of ReadBandwidth); fails when a pair's barrier
// timed out.
func BenchmarkGemvPair(b *testing.B) {
	dev := testDevice(b)
	hbm, err := dev.ReadBandwidth(4<<30, 11)
	if err != nil {
		b.Fatal(err)
	}
	const copies, calls = 8, 32
	const r1, c1, g1, r2, c2 = 8192, 4096, 8, 4096, 8192
	type result struct {
		name  string
		us    float64
		bytes int
		err   error
	}
	var results []result
	err = dev.Do(func(c *Ctx) error {
		d := &devBufs{c: c}
		defer d.free()
		ar, err := c.NewArena(1 << 20)
		if err != nil {
			return err
		}
		defer c.ReleaseArena(ar)
		da := randomWeightPar(71, compute.FP8Block, r1, c1, 0.05)
		db := randomWeightPar(72, compute.FP8Block, r2, c2, 0.05)
		was, wbs := make([]*DeviceWeight, copies), make([]*DeviceWeight, copies)
		for k := range copies {
			was[k], wbs[k] = d.weight(da), d.weight(db)
		}
		x := d.floats(computetest.Normal(rand.New(rand.NewPCG(7, 3)), g1*c1, 1))
		u, y := d.alloc(4*r1), d.alloc(4*r2)
		d.synced()
		if d.err != nil {
			return d.err
		}
		bytesA, bytesB := was[0].Bytes, wbs[0].Bytes
		s := c.Stream()
		graph := func(name string, bytes int, one func(k int) error) {
			i := 0
			us, err := graphTime(b, c, calls, func() error { i++; return one(i % copies) })
			results = append(results, result{name + "/graph", us, bytes, err})
		}
		plain := func(name string, bytes int, one func(k int) error) {
			i := 0
			run := func() error { i++; return one(i % copies) }
			if err := run(); err != nil { // loads the modules
				results = append(results, result{name + "/plain", 0, bytes, err})
				return
			}
			if err := c.Sync(s); err != nil {
				results = append(results, result{name + "/plain", 0, bytes, err})
				return
			}
			n := max(b.N, 1) * calls
			ms, err := deviceMS(c, s, repeat(n, run))
			results = append(results, result{name + "/plain", ms * 1000 / float64(n), bytes, err})
		}
		// Two Gemv launches: wo_a (x → u), then wo_b (u → y).
		ga, gb := make([]*Gemv, copies), make([]*Gemv, copies)
		for k := range copies {
			if ga[k], err = c.PrepareGemv([]GemvProj{{W: was[k], Y: u, X: x, Groups: g1}}, GemvVariant{}); err != nil {
				return err
			}
			if gb[k], err = c.PrepareGemv([]GemvProj{{W: wbs[k], Y: y, X: u}}, GemvVariant{}); err != nil {
				return err
			}
		}
		twoGemv := func(k int) error {
			if err := c.LaunchGemv(ga[k], s); err != nil {
				return err
			}
			return c.LaunchGemv(gb[k], s)
		}
		// The pair, per variant.
		var prepared []*GemvPair
		defer func() {
			for _, p := range prepared {
				_ = p.Free(ar)
			}
		}()
		pairs := func(v GemvPairVariant) (func(k int) error, error) {
			ps := make([]*GemvPair, copies)
			for k := range copies {
				p, err := c.PrepareGemvPair(ar, GemvProj{W: was[k], X: x, Y: u, Groups: g1}, GemvProj{W: wbs[k], Y: y}, v)
				if err != nil {
					return nil, err
				}
				ps[k] = p
				prepared = append(prepared, p)
			}
			b.Logf("pair %+v: %d blocks, %d rows of wo_b a block in shared memory (%d bytes)", v, ps[0].Blocks(), ps[0].SharedRows(), ps[0].SharedBytes())
			return func(k int) error { return c.LaunchGemvPair(ps[k], s) }, nil
		}
		pair, err := pairs(GemvPairVariant{})
		if err != nil {
			return err
		}
		graph("pair", bytesA+bytesB, pair)
		plain("pair", bytesA+bytesB, pair)
		graph("two_gemv", bytesA+bytesB, twoGemv)
		plain("two_gemv", bytesA+bytesB, twoGemv)
		graph("gemv_wo_a", bytesA, func(k int) error { return c.LaunchGemv(ga[k], s) })
		graph("gemv_wo_b", bytesB, func(k int) error { return c.LaunchGemv(gb[k], s) })
		for _, vr := range []struct {
			name string
			v    GemvPairVariant
		}{
			{"pair_u4", GemvPairVariant{U: 4}},
			{"pair_late_fill", GemvPairVariant{LateFill: true}},
			{"pair_smem0", GemvPairVariant{SmemRows: -1}},
			{"pair_smem8", GemvPairVariant{SmemRows: 8}},
			{"pair_no_l2pf", GemvPairVariant{NoL2Prefetch: true}},
			{"pair_early_l2pf", GemvPairVariant{EarlyL2Prefetch: true}},
			{"pair_hint_a", GemvPairVariant{HintFirst: true}},
			{"pair_hint_a_late_fill", GemvPairVariant{HintFirst: true, LateFill: true}},
			{"pair_hint_a_u4", GemvPairVariant{HintFirst: true, U: 4}},
			{"pair_hint_a_smem16", GemvPairVariant{HintFirst: true, SmemRows: 16}},
		} {
			f, err := pairs(vr.v)
			if err != nil {
				return err
			}
			graph(vr.name, bytesA+bytesB, f)
		}
		for _, p := range prepared {
			if n, err := c.BarrierTimeouts(p); err != nil || n != 0 {
				return fmt.Errorf("a pair's barrier timed out %d times (%v)", n, err)
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	for _, r := range results {
		b.Run(r.name, func(b *testing.B) {
			if r.err != nil {
				b.Fatal(r.err)
			}
			b.ReportMetric(r.us, "device-us/op")
			b.ReportMetric(float64(r.bytes)/(r.us*1e-6)/1e9, "GB/s")
			b.ReportMetric(100*float64(r.bytes)/(r.us*1e-6)/hbm, "%HBM")
		})
	}
}
