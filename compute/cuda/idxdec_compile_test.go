package cuda

import "testing"

// idxTopKSelStatic is idx_topk_sel's static shared memory in bytes: s
// (TK_SORT words), sb (TK_SMALL words), hist (256), wsum (32) and five
// counters of 4 bytes.
const idxTopKSelStatic = 2048*8 + 1024*8 + 256*4 + 32*4 + 5*4

// TestIdxDecCompiles compiles kernels/idxdec.cu for sm_90
// (compileModuleForTest: no GPU needed, skipped without NVRTC) and checks
// that every kernel Ctx.IdxDec looks up is in the image and that
// idx_topk_sel's key cache fits beside its static shared memory.
func TestIdxDecCompiles(t *testing.T) {
	requireKernels(t, compileModuleForTest(t, "idxdec", IdxDecSource()),
		"idx_scores_h1", "idx_scores_h2", "idx_scores_h4", "idx_scores_h8", "idx_scores_generic", "idx_topk", "idx_topk_sel")
	requireSharedFits(t, "idx_topk_sel", 4*idxTopKCache+idxTopKSelStatic)
}
