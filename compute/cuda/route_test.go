package cuda

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"moxie/compute/computetest"
	"moxie/compute/ref"
)

// TestOpsRouteShapes checks Route against the float64 reference on both of
// its paths (experts in registers up to 256, the shared-memory loop above)
// and on k up to 32 and beyond a warp's lanes, with and without bias, plus
// heavy ties (every lane holds tied words).
func TestOpsRouteShapes(t *testing.T) {
	for _, tc := range []struct {
		experts, k, batch int
		ties              bool
	}{
		{8, 1, 3, false}, {8, 8, 2, false}, {33, 6, 4, false}, {256, 6, 2, true}, {256, 40, 2, false},
		{300, 6, 3, false}, {300, 6, 2, true}, {2048, 8, 2, false}, {2048, 64, 1, true},
	} {
		for _, useBias := range []bool{false, true} {
			t.Run(fmt.Sprintf("E%d_k%d_ties%v_bias%v", tc.experts, tc.k, tc.ties, useBias), func(t *testing.T) {
				E, k, batch := tc.experts, tc.k, tc.batch
				rng := rand.New(rand.NewPCG(uint64(E), uint64(k)))
				logits := computetest.Normal(rng, batch*E, 2)
				if tc.ties {
					for i := range logits {
						logits[i] = float32(rng.IntN(3)) / 4
					}
				}
				bias := computetest.Normal(rng, E, 0.3)
				if tc.ties {
					for i := range bias {
						bias[i] = 0
					}
				}
				var gi []int32
				var gw []float32
				onDevice(t, func(c *Ctx, d *devBufs) {
					dl := d.floats(logits)
					var pb DevicePtr
					if useBias {
						pb = d.floats(bias)
					}
					d.synced()
					ids, w := d.poisoned(batch*k), d.poisoned(batch*k)
					d.check(c.Route(ids, w, dl, pb, 0, batch, E, k, 1.5, c.Stream()))
					gi, gw = d.getInt32s(ids, batch*k), d.getFloats(w, batch*k)
				})
				for b := range batch {
					var b64 []float64
					if useBias {
						b64 = f64s(bias)
					}
					wantIDs, wantW := ref.Route(f64s(logits[b*E:(b+1)*E]), b64, nil, k, 1.5)
					for j := range k {
						if int(gi[b*k+j]) != wantIDs[j] {
							t.Fatalf("token %d: ids %v, want %v", b, gi[b*k:(b+1)*k], wantIDs)
						}
					}
					expectRel(t, fmt.Sprint("token ", b, " weights"), gw[b*k:(b+1)*k], wantW, 1e-5)
				}
			})
		}
	}
}

// TestParseGateRouteVariant checks $MOXIE_CUDA_GATEROUTE_V's values: the
// default and "old" (gate_route), "wide" (planned warps), "wide:N" for N in
// [1, 8], and errors naming the variable for anything else.
func TestParseGateRouteVariant(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want GateRouteVariant
	}{
		{"", GateRouteVariant{}}, {"old", GateRouteVariant{}}, {"wide", GateRouteVariant{Wide: true}},
		{"wide:1", GateRouteVariant{Wide: true, Warps: 1}}, {"wide:8", GateRouteVariant{Wide: true, Warps: 8}},
	} {
		t.Run("ok_"+tc.v, func(t *testing.T) {
			got, err := ParseGateRouteVariant(tc.v)
			if err != nil || got != tc.want {
				t.Fatalf("ParseGateRouteVariant(%q) = %+v, %v; want %+v", tc.v, got, err, tc.want)
			}
		})
	}
	for _, v := range []string{"on", "Wide", "wide:", "wide:0", "wide:9", "wide:-1", "wide:x", "wide:2:3", " wide"} {
		t.Run("bad_"+v, func(t *testing.T) {
			got, err := ParseGateRouteVariant(v)
			if err == nil {
				t.Fatalf("ParseGateRouteVariant(%q) = %+v, want an error", v, got)
			}
			if !strings.Contains(err.Error(), "MOXIE_CUDA_GATEROUTE_V") {
				t.Errorf("error %q does not name the variable", err)
			}
		})
	}
}

// TestPlanGateRouteWide checks gate_route_w's launch shapes: every
// (row, warp slice) unit gets exactly one warp (blocks·wb covers
// experts·kw with less than one block to spare), wb divides kw or is a
// multiple of it, the planned wb is the largest divisor of kw giving at
// least one block per SM (1 when none does), and bad shapes are refused.
func TestPlanGateRouteWide(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		experts, kw, sms, warps int
		wantWB, wantBlocks      int
	}{
		{"v4 H200", 256, 8, 132, 0, 8, 256},
		{"synth 16 experts", 16, 8, 132, 0, 1, 128},
		{"64x1024", 64, 2, 132, 0, 1, 128},
		{"64 experts small gpu", 64, 2, 40, 0, 2, 64},
		{"v4 big gpu", 256, 8, 600, 0, 2, 1024},
		{"odd experts", 255, 8, 132, 0, 8, 255},
		{"tiny", 8, 1, 132, 0, 1, 8},
		{"forced 1", 256, 8, 132, 1, 1, 2048},
		{"forced 4", 256, 8, 132, 4, 4, 512},
		{"forced rows", 255, 2, 132, 8, 8, 64},
		{"forced 6 of 3", 16, 3, 132, 6, 6, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wb, blocks, err := planGateRouteWide(tc.experts, tc.kw, tc.sms, tc.warps)
			if err != nil || wb != tc.wantWB || blocks != tc.wantBlocks {
				t.Fatalf("planGateRouteWide(%d, %d, %d, %d) = %d, %d, %v; want %d, %d", tc.experts, tc.kw, tc.sms, tc.warps, wb, blocks, err, tc.wantWB, tc.wantBlocks)
			}
			units := tc.experts * tc.kw
			if blocks*wb < units || (blocks-1)*wb >= units {
				t.Errorf("%d blocks of %d warps for %d units", blocks, wb, units)
			}
			if tc.kw%wb != 0 && wb%tc.kw != 0 {
				t.Errorf("wb %d and kw %d: neither divides the other", wb, tc.kw)
			}
		})
	}
	for _, tc := range []struct{ experts, kw, warps int }{
		{0, 8, 0}, {257, 8, 0}, {256, 0, 0}, {256, 9, 0}, {256, 8, 9}, {256, 8, -1}, {256, 8, 3}, {256, 3, 2},
	} {
		t.Run(fmt.Sprintf("bad_E%d_kw%d_w%d", tc.experts, tc.kw, tc.warps), func(t *testing.T) {
			if wb, blocks, err := planGateRouteWide(tc.experts, tc.kw, 132, tc.warps); err == nil {
				t.Fatalf("planGateRouteWide accepted experts %d, kw %d, warps %d: %d, %d", tc.experts, tc.kw, tc.warps, wb, blocks)
			}
		})
	}
}
