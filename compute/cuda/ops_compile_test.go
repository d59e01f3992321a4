package cuda

import (
	"bytes"
	"testing"
	"time"

	"moxie/compute/cuda/driver"
)

// opsKernelNames lists every kernel ops.go launches.
var opsKernelNames = []string{
	"rmsnorm", "hc_dots_r1_t1", "hc_dots_r8_t8", "hc_finish", "hc_split_dots", "hc_split_finish", "hc_collapse", "hc_expand", "rope",
	"attention4", "attention16", "attention32", "compress_pool",
	"index_scores", "index_scores_simple", "topk", "topk_rows", "route", "swiglu",
	"embed_bf16", "axpy", "scale_f32",
}

// TestOpsCompile compiles kernels/ops.cu with NVRTC for sm_90 (no GPU needed;
// skipped when NVRTC cannot be loaded, e.g. set MOXIE_NVRTC to a
// libnvrtc.so) and checks that the CUBIN defines every kernel the host
// launches, under its unmangled name.
func TestOpsCompile(t *testing.T) {
	nv, err := driver.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC: %v", err)
	}
	t0 := time.Now()
	img, err := nv.Compile(OpsSource(), "ops.cu", []string{"--gpu-architecture=sm_90", "--std=c++17"})
	if err != nil {
		t.Fatalf("NVRTC %d.%d (%s): %v", nv.Major, nv.Minor, nv.Path, err)
	}
	t.Logf("ops.cu: %d-byte CUBIN in %v (NVRTC %d.%d)", len(img), time.Since(t0), nv.Major, nv.Minor)
	for _, name := range opsKernelNames {
		// Every kernel has a code section .text.<name> (CUBINs carry a
		// nonstandard ELF version, which debug/elf rejects).
		if !bytes.Contains(img, []byte("\x00.text."+name+"\x00")) {
			t.Errorf("CUBIN has no kernel %q", name)
		}
	}
}
