package cuda

import "testing"

// TestIdxDecCompiles compiles kernels/idxdec.cu for sm_90
// (compileModuleForTest: no GPU needed, skipped without NVRTC) and checks
// that every kernel Ctx.IdxDec looks up is in the image.
func TestIdxDecCompiles(t *testing.T) {
	requireKernels(t, compileModuleForTest(t, "idxdec", IdxDecSource()),
		"idx_scores_h1", "idx_scores_h2", "idx_scores_h4", "idx_scores_h8", "idx_scores_generic", "idx_topk", "idx_topk_sel")
}
