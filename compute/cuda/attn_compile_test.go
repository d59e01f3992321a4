package cuda

import "testing"

// TestAttnCompiles compiles kernels/attn.cu for sm_90 (compileModuleForTest:
// no GPU needed, skipped without NVRTC), checks that every kernel
// AttentionPrefill launches is in the image and that each fits the H200's
// opt-in shared memory.
func TestAttnCompiles(t *testing.T) {
	img := compileModuleForTest(t, "attn", AttnSource())
	for _, variant := range []string{attnLdsm, attnSplit} {
		for _, dim := range []int{128, 256, 512} {
			name := attnPrefillKernel(variant, dim)
			requireKernels(t, img, name)
			requireSharedFits(t, name, attnPrefillShared(variant, dim))
		}
	}
}
