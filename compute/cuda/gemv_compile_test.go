package cuda

import (
	"fmt"
	"testing"
)

// TestGemvCompiles compiles kernels/gemv.cu for sm_90 (compileModuleForTest:
// no GPU needed, skipped without NVRTC) and checks the launched kernels are
// in it, with the GemvPair kernels' register counts and stack frames
// logged: they run one 512-thread block per multiprocessor, so 128
// registers a thread at most (their __launch_bounds__).
func TestGemvCompiles(t *testing.T) {
	img := compileModuleForTest(t, "gemv", GemvSource())
	for _, u := range []int{2, 4, 8} {
		requireKernels(t, img, fmt.Sprintf("gemv_u%d", u))
	}
	res := cubinResources(t, img)
	for _, u := range []int{4, 8} {
		n := fmt.Sprintf("gemv_pair_u%d", u)
		requireKernels(t, img, n)
		r, ok := res[n]
		if !ok {
			t.Errorf("%s has no register count in the CUBIN's .nv.info", n)
			continue
		}
		if r.regs > 128 {
			t.Errorf("%s: %d registers, more than 512 threads a block allow (128)", n, r.regs)
		}
		t.Logf("%s: %d registers, %d-byte stack frame", n, r.regs, r.frame)
	}
}
