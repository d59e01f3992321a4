package cuda

import (
	_ "embed"
	"fmt"

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
	e32, c32, k32, w := int32(experts), int32(gate.Cols), int32(k), gate.Data
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
