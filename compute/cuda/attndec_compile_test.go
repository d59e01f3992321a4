package cuda

import (
	"bytes"
	"testing"

	"moxie/compute/cuda/driver"
)

// TestAttnDecCompiles compiles kernels/attndec.cu with the NVRTC found on
// this machine for sm_90 (no GPU needed; skipped without NVRTC, e.g. set
// MOXIE_NVRTC=/usr/lib/x86_64-linux-gnu/libnvrtc.so.11.2), checks that every
// kernel AttentionDecode launches is in the image and that each fits the
// H200's opt-in shared memory (227 KiB less the 1 KiB sm_90 reserves).
func TestAttnDecCompiles(t *testing.T) {
	nv, err := driver.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC: %v", err)
	}
	img, err := nv.Compile(AttnDecSource(), "attndec.cu", []string{"--gpu-architecture=sm_90", "--std=c++17"})
	if err != nil {
		t.Fatalf("attndec.cu does not compile with NVRTC %d.%d: %v", nv.Major, nv.Minor, err)
	}
	if !bytes.HasPrefix(img, []byte("\x7fELF")) {
		t.Fatalf("NVRTC returned %d bytes that are not an ELF cubin", len(img))
	}
	names := []string{"attndec_combine"}
	for _, v := range attnDecVariants {
		for _, dim := range v.dims {
			names = append(names, v.kernel(dim))
			if sh := v.shared(dim); sh > 227<<10-1<<10 {
				t.Errorf("%s needs %d bytes of shared memory, more than the H200 allows", v.kernel(dim), sh)
			}
		}
	}
	for _, n := range names {
		if !bytes.Contains(img, append([]byte(n), 0)) {
			t.Errorf("kernel %s is not in the compiled image", n)
		}
	}
}
