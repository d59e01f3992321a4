package cuda

import (
	"fmt"
	"math/rand/v2"
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
