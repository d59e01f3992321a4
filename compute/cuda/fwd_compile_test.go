package cuda

import (
	"os"
	"regexp"
	"testing"
)

// TestFwdCompiles compiles kernels/fwd.cu for sm_90 (compileModuleForTest:
// no GPU needed, skipped without NVRTC) and checks that every kernel the Go
// side launches is in the image.
func TestFwdCompiles(t *testing.T) {
	img := compileModuleForTest(t, "fwd", FwdSource())
	// Every kernel Ctx.Fwd looks up must be an extern "C" symbol in the image.
	names := regexp.MustCompile(`\{"(fwd_[a-z0-9_]+)", &f\.`).FindAllStringSubmatch(fwdGoSource(t), -1)
	if len(names) < 9 {
		t.Fatalf("found %d kernel names in fwd.go, want 9", len(names))
	}
	for _, n := range names {
		requireKernels(t, img, n[1])
	}
}

func fwdGoSource(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("fwd.go")
	if err != nil {
		t.Skipf("fwd.go not found (run from compute/cuda to check kernel names): %v", err)
	}
	return string(b)
}
