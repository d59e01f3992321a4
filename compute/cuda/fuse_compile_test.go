package cuda

import (
	"bytes"
	"testing"
	"time"

	"moxie/compute/cuda/driver"
)

// fuseKernelNames lists every kernel fuse.go launches from the fuse module.
var fuseKernelNames = []string{"hc_split_dots", "fuse_hc_dots", "fuse_hc_finish", "fuse_rows"}

// TestFuseCompile compiles the fuse module (kernels/ops.cu followed by
// kernels/fuse.cu) with NVRTC for sm_90 (no GPU needed; skipped when NVRTC
// cannot be loaded, e.g. set MOXIE_NVRTC to a libnvrtc.so) and checks that
// the CUBIN defines every kernel fuse.go launches, under its unmangled name.
func TestFuseCompile(t *testing.T) {
	nv, err := driver.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC: %v", err)
	}
	t0 := time.Now()
	img, err := nv.Compile(FuseSource(), "fuse.cu", []string{"--gpu-architecture=sm_90", "--std=c++17"})
	if err != nil {
		t.Fatalf("NVRTC %d.%d (%s): %v", nv.Major, nv.Minor, nv.Path, err)
	}
	t.Logf("fuse module: %d-byte CUBIN in %v (NVRTC %d.%d)", len(img), time.Since(t0), nv.Major, nv.Minor)
	for _, name := range fuseKernelNames {
		if !bytes.Contains(img, []byte("\x00.text."+name+"\x00")) {
			t.Errorf("CUBIN has no kernel %q", name)
		}
	}
}
