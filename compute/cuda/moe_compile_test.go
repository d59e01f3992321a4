package cuda

import (
	"bytes"
	"testing"
	"time"
	"unsafe"

	"moxie/compute/cuda/driver"
)

// TestMoECompile compiles kernels/moe.cu with the NVRTC found on this
// machine for sm_90 (no GPU needed; skipped without NVRTC, e.g. set
// MOXIE_NVRTC=/usr/lib/x86_64-linux-gnu/libnvrtc.so.11.2) and checks that
// the CUBIN defines both kernels of every MoEVariant. The .cu file's
// static_asserts check the MoeArgs/LinRec sizes at compile time.
func TestMoECompile(t *testing.T) {
	nv, err := driver.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC: %v", err)
	}
	t0 := time.Now()
	img, err := nv.Compile(MoESource(), "moe.cu", []string{"--gpu-architecture=sm_90", "--std=c++17"})
	if err != nil {
		t.Fatalf("moe.cu does not compile with NVRTC %d.%d: %v", nv.Major, nv.Minor, err)
	}
	t.Logf("moe.cu: %d-byte CUBIN in %v (NVRTC %d.%d)", len(img), time.Since(t0), nv.Major, nv.Minor)
	for v := range moeVariantCount {
		n1, n2 := moeKernelNames(v)
		for _, n := range []string{n1, n2} {
			if !bytes.Contains(img, []byte("\x00.text."+n+"\x00")) {
				t.Errorf("variant %v: CUBIN has no kernel %q", v, n)
			}
		}
	}
}

// TestMoEArgsMirror checks the Go mirror of MoeArgs: its size is the one
// kernels/moe.cu asserts, and E and Limit sit after 13 pointers and 6 ints
// as C lays them out.
func TestMoEArgsMirror(t *testing.T) {
	var a moeArgs
	if s := unsafe.Sizeof(a); s != 136 {
		t.Errorf("moeArgs is %d bytes, kernels/moe.cu's MoeArgs 136", s)
	}
	if o := unsafe.Offsetof(a.E); o != 104 {
		t.Errorf("moeArgs.E at %d, MoeArgs.E at 104", o)
	}
	if o := unsafe.Offsetof(a.Limit); o != 128 {
		t.Errorf("moeArgs.Limit at %d, MoeArgs.limit at 128", o)
	}
	for _, want := range []string{"sizeof(MoeArgs) == 136", "sizeof(LinRec) == 80"} {
		if !bytes.Contains([]byte(MoESource()), []byte(want)) {
			t.Errorf("kernels/moe.cu no longer asserts %q", want)
		}
	}
	if s := unsafe.Sizeof(linArgs{}); s != 80 {
		t.Errorf("linArgs is %d bytes, LinRec mirrors 80", s)
	}
}
