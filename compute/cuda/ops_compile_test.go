package cuda

import "testing"

// opsKernelNames lists every kernel ops.go launches.
var opsKernelNames = []string{
	"rmsnorm", "hc_dots_r1_t1", "hc_dots_r8_t8", "hc_finish", "hc_split_dots", "hc_split_finish", "hc_collapse", "hc_expand", "rope",
	"attention4", "attention16", "attention32", "compress_pool",
	"index_scores", "index_scores_simple", "topk", "topk_rows", "route", "swiglu",
	"embed_bf16", "axpy", "scale_f32",
}

// TestOpsCompile compiles kernels/ops.cu for sm_90 (compileModuleForTest: no
// GPU needed, skipped without NVRTC) and checks that the CUBIN defines every
// kernel the host launches, under its unmangled name.
func TestOpsCompile(t *testing.T) {
	requireKernels(t, compileModuleForTest(t, "ops", OpsSource()), opsKernelNames...)
}
