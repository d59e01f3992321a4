package cuda

import (
	"bytes"
	"os"
	"regexp"
	"testing"

	"moxie/compute/cuda/driver"
)

// TestFwdCompiles compiles kernels/fwd.cu with the NVRTC found on this
// machine for sm_90 (no GPU needed; skipped without NVRTC, e.g. set
// MOXIE_NVRTC=/usr/lib/x86_64-linux-gnu/libnvrtc.so.11.2), and checks that
// every kernel the Go side launches is in the image.
func TestFwdCompiles(t *testing.T) {
	nv, err := driver.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC: %v", err)
	}
	img, err := nv.Compile(FwdSource(), "fwd.cu", []string{"--gpu-architecture=sm_90", "--std=c++17"})
	if err != nil {
		t.Fatalf("fwd.cu does not compile with NVRTC %d.%d: %v", nv.Major, nv.Minor, err)
	}
	if !bytes.HasPrefix(img, []byte("\x7fELF")) {
		t.Fatalf("NVRTC returned %d bytes that are not an ELF cubin", len(img))
	}
	// Every kernel Ctx.Fwd looks up must be an extern "C" symbol in the image.
	names := regexp.MustCompile(`\{"(fwd_[a-z0-9_]+)", &f\.`).FindAllStringSubmatch(fwdGoSource(t), -1)
	if len(names) < 9 {
		t.Fatalf("found %d kernel names in fwd.go, want 9", len(names))
	}
	for _, n := range names {
		if !bytes.Contains(img, append([]byte(n[1]), 0)) {
			t.Errorf("kernel %s is not in the compiled image", n[1])
		}
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
