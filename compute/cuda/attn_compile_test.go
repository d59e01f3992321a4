package cuda

import (
	"bytes"
	"testing"

	"moxie/compute/cuda/driver"
)

// TestAttnCompiles compiles kernels/attn.cu with the NVRTC found on this
// machine for sm_90 (no GPU needed; skipped without NVRTC, e.g. set
// MOXIE_NVRTC=/usr/lib/x86_64-linux-gnu/libnvrtc.so.11.2), checks that every
// kernel AttentionPrefill launches is in the image and that each fits the
// H200's opt-in shared memory (227 KiB).
func TestAttnCompiles(t *testing.T) {
	nv, err := driver.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC: %v", err)
	}
	img, err := nv.Compile(AttnSource(), "attn.cu", []string{"--gpu-architecture=sm_90", "--std=c++17"})
	if err != nil {
		t.Fatalf("attn.cu does not compile with NVRTC %d.%d: %v", nv.Major, nv.Minor, err)
	}
	if !bytes.HasPrefix(img, []byte("\x7fELF")) {
		t.Fatalf("NVRTC returned %d bytes that are not an ELF cubin", len(img))
	}
	for _, variant := range []string{attnLdsm, attnSplit} {
		for _, dim := range []int{128, 256, 512} {
			name := attnPrefillKernel(variant, dim)
			if !bytes.Contains(img, append([]byte(name), 0)) {
				t.Errorf("kernel %s is not in the compiled image", name)
			}
			// The opt-in limit less the 1 KiB sm_90 reserves per block.
			if sh := attnPrefillShared(variant, dim); sh > 227<<10-1<<10 {
				t.Errorf("%s needs %d bytes of shared memory, more than the H200 allows", name, sh)
			}
		}
	}
}
