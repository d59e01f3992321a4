package cuda

import (
	"fmt"
	"testing"
)

// TestGemvCompiles compiles kernels/gemv.cu for sm_90 (compileModuleForTest:
// no GPU needed, skipped without NVRTC) and checks the launched kernels are
// in it.
func TestGemvCompiles(t *testing.T) {
	img := compileModuleForTest(t, "gemv", GemvSource())
	for _, u := range []int{2, 4, 8} {
		requireKernels(t, img, fmt.Sprintf("gemv_u%d", u))
	}
}
