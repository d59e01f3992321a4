package cuda

import (
	"bytes"
	"testing"
	"unsafe"
)

// TestMoECompile compiles kernels/moe.cu for sm_90 (compileModuleForTest:
// no GPU needed, skipped without NVRTC) and checks that the CUBIN defines
// both kernels of every MoEVariant. The .cu file's static_asserts check the
// MoeArgs/LinRec sizes at compile time.
func TestMoECompile(t *testing.T) {
	img := compileModuleForTest(t, "moe", MoESource())
	for v := range moeVariantCount {
		n1, n2 := moeKernelNames(v)
		requireKernels(t, img, n1, n2)
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
