package cuda

import (
	_ "embed"
	"fmt"
	"os"
	"strconv"
	"strings"

	"moxie/compute"
)

//go:embed kernels/route.cu
var routeSrc string

// RouteSource returns the CUDA source of the fused router module
// (kernels/route.cu).
func RouteSource() string { return routeSrc }

// routeModuleName names the fused router module among the device's modules.
const routeModuleName = "route"

// GateRouteMaxExperts is the largest expert count GateRoute takes.
const GateRouteMaxExperts = 256

// gateRouteKernel is the Linear kernel whose arithmetic gate_route repeats
// (linear.cu's narrow BF16 kernel at batch 1, RB 2, U 4).
const gateRouteKernel = "linear_bf16_b1_r2_u4_d0"

// routeModule returns the device's fused router module, compiling (or
// loading from the disk cache) on first use.
func (c *Ctx) routeModule() (*Module, error) { return c.namedModule(routeModuleName, routeSrc, nil) }

// LoadRoute compiles (or loads from the disk cache) the fused router module
// now: call it before capturing a CUDA graph that contains GateRoute, since
// loading a module is not a stream operation.
func (c *Ctx) LoadRoute() error {
	_, err := c.routeModule()
	return err
}

// GateRoute enqueues the router of one token in one kernel: logits
// [experts] (float32, written) = gate·x, then Route(ids, weights, logits,
// bias, hash, 1, experts, k, scale): ids int32 [k] and weights [k]. gate is
// a BF16 [experts, Cols] weight, x float32 [Cols] (16-byte aligned), bias
// [experts] or 0 (selection only), hash int32 [k] (the token's tid2eid row)
// or 0 (then the top-k of sqrt(softplus(logit)) + bias). Results are the
// bits of c.Linear(gate, logits, x, 1) followed by c.Route on the default
// linear kernel (gateRouteKernel); a hash id outside [0, experts) makes the
// weights NaN, as in Route.
//
// The launch's blocks meet through a counter in the module's device memory,
// which the last block resets: GateRoute launches of one device must not
// run concurrently (launches on one stream never do).
//
// $MOXIE_CUDA_GATEROUTE_V picks the kernel (read at each call; see
// ParseGateRouteVariant): unset or "old" gate_route, whose blocks take two
// gate rows each; "wide" gate_route_w, the same bits from a grid of many
// more blocks (planGateRouteWide).
func (c *Ctx) GateRoute(ids, weights, logits DevicePtr, gate *DeviceWeight, x, bias, hash DevicePtr, experts, k int, scale float32, s Stream) error {
	const op = "GateRoute"
	switch {
	case gate == nil:
		return opErr(op, "nil gate weight")
	case gate.Format != compute.BF16:
		return opErr(op, "gate format %v: want BF16", gate.Format)
	case experts <= 0 || experts > GateRouteMaxExperts || gate.Rows != experts:
		return opErr(op, "experts %d, gate rows %d: want equal and in [1, %d]", experts, gate.Rows, GateRouteMaxExperts)
	case k <= 0 || k > experts:
		return opErr(op, "k %d: want 1 <= k <= experts (%d)", k, experts)
	case gate.Cols <= 0 || gate.Cols%4 != 0 || gate.Cols > 1<<28:
		return opErr(op, "gate columns %d: want a positive multiple of 4", gate.Cols)
	case !nonNull(ids, weights, logits, gate.Data, x):
		return opErr(op, "null ids, weights, logits, gate or x")
	case x%16 != 0 || gate.Data%8 != 0:
		return opErr(op, "x %#x, gate %#x: want 16- and 8-byte aligned", x, gate.Data)
	}
	kw, err := gateRouteWarps(experts, gate.Cols, c.d.info.SMs, c.d.info.SharedOptin)
	if err != nil {
		return opErr(op, "%v", err)
	}
	v, err := ParseGateRouteVariant(os.Getenv("MOXIE_CUDA_GATEROUTE_V"))
	if err != nil {
		return opErr(op, "%v", err)
	}
	e32, c32, k32, w := int32(experts), int32(gate.Cols), int32(k), gate.Data
	if v.Wide {
		wb, blocks, err := planGateRouteWide(experts, kw, c.d.info.SMs, v.Warps)
		if err != nil {
			return opErr(op, "%v", err)
		}
		kw32 := int32(kw)
		return c.launchNamed(c.routeModule, "gate_route_w", Dim3{X: uint32(blocks)}, Dim3{X: uint32(32 * wb)}, 0, s,
			ptr(&ids), ptr(&weights), ptr(&logits), ptr(&w), ptr(&x), ptr(&bias), ptr(&hash), ptr(&e32), ptr(&c32), ptr(&k32), ptr(&scale), ptr(&kw32))
	}
	return c.launchNamed(c.routeModule, "gate_route", Dim3{X: uint32((experts + 1) / 2)}, Dim3{X: uint32(32 * kw)}, 0, s,
		ptr(&ids), ptr(&weights), ptr(&logits), ptr(&w), ptr(&x), ptr(&bias), ptr(&hash), ptr(&e32), ptr(&c32), ptr(&k32), ptr(&scale))
}

// gateRouteWarps returns the warps per block of gate_route for a BF16
// [experts, cols] gate: those of the Linear launch it repeats.
func gateRouteWarps(experts, cols, sms, optin int) (int, error) {
	p, err := planLinear(compute.BF16, experts, cols, 0, 1, 1, LinearVariant{}, sms, optin)
	if err != nil {
		return 0, err
	}
	if p.name != gateRouteKernel || p.block.X%32 != 0 || p.block.X == 0 || p.block.X > 256 {
		return 0, fmt.Errorf("the BF16 [%d, %d] batch-1 linear plan is %s with %d threads, not %s", experts, cols, p.name, p.block.X, gateRouteKernel)
	}
	return int(p.block.X / 32), nil
}

// GateRouteVariant is a parsed $MOXIE_CUDA_GATEROUTE_V: which kernel
// GateRoute launches. Both give the same bits.
type GateRouteVariant struct {
	// Wide selects gate_route_w (else gate_route).
	Wide bool
	// Warps is gate_route_w's warps per block, or 0 for planGateRouteWide's
	// choice.
	Warps int
}

// gateRouteMaxWarps is the most warps a gate_route or gate_route_w block
// has (route.cu's GR_MAXW).
const gateRouteMaxWarps = 8

// ParseGateRouteVariant parses a $MOXIE_CUDA_GATEROUTE_V value: "" or
// "old" (gate_route, the default), "wide" (gate_route_w, warps per block
// chosen by planGateRouteWide) or "wide:N" (gate_route_w with N warps per
// block, 1 <= N <= 8; a launch whose gate needs kw warps a row then
// requires N to divide kw or kw to divide N).
func ParseGateRouteVariant(v string) (GateRouteVariant, error) {
	switch v {
	case "", "old":
		return GateRouteVariant{}, nil
	case "wide":
		return GateRouteVariant{Wide: true}, nil
	}
	if n, ok := strings.CutPrefix(v, "wide:"); ok {
		w, err := strconv.Atoi(n)
		if err == nil && w >= 1 && w <= gateRouteMaxWarps {
			return GateRouteVariant{Wide: true, Warps: w}, nil
		}
	}
	return GateRouteVariant{}, fmt.Errorf("MOXIE_CUDA_GATEROUTE_V=%q: want old, wide or wide:N with N in [1, %d] (or unset: old)", v, gateRouteMaxWarps)
}

// planGateRouteWide returns gate_route_w's warps per block (wb) and block
// count for experts gate rows whose dot products gate_route computes with
// kw warps a row (gateRouteWarps), on a device of sms SMs. Each warp takes
// one (row, warp slice) unit, experts·kw in all; wb is warps (a divisor of
// kw or a multiple of it, at most 8) when warps > 0, else the largest
// divisor of kw that still gives at least sms blocks (1 when none does:
// one warp a block, experts·kw blocks).
func planGateRouteWide(experts, kw, sms, warps int) (wb, blocks int, err error) {
	switch {
	case experts <= 0 || experts > GateRouteMaxExperts:
		return 0, 0, fmt.Errorf("gate_route_w: %d experts, want [1, %d]", experts, GateRouteMaxExperts)
	case kw <= 0 || kw > gateRouteMaxWarps:
		return 0, 0, fmt.Errorf("gate_route_w: %d warps a row, want [1, %d]", kw, gateRouteMaxWarps)
	case warps < 0 || warps > gateRouteMaxWarps:
		return 0, 0, fmt.Errorf("gate_route_w: %d warps a block, want [1, %d] (or 0: planned)", warps, gateRouteMaxWarps)
	case warps > 0 && kw%warps != 0 && warps%kw != 0:
		return 0, 0, fmt.Errorf("gate_route_w: %d warps a block with %d warps a row: want one a multiple of the other", warps, kw)
	}
	units := experts * kw
	wb = warps
	if wb == 0 {
		wb = 1
		for d := kw; d >= 1; d-- {
			if kw%d == 0 && units/d >= sms {
				wb = d
				break
			}
		}
	}
	return wb, (units + wb - 1) / wb, nil
}
