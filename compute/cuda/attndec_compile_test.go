package cuda

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// TestAttnDecCompiles compiles kernels/attndec.cu for sm_90
// (compileModuleForTest: no GPU needed, skipped without NVRTC), checks that
// every kernel AttentionDecode launches is in the image and that each fits
// the H200's opt-in shared memory.
func TestAttnDecCompiles(t *testing.T) {
	// kernels/attndec.cu static_asserts sizeof(ADArgs) == 120.
	if n := unsafe.Sizeof(attnDecArgs{}); n != 120 {
		t.Errorf("attnDecArgs is %d bytes, struct ADArgs 120", n)
	}
	img := compileModuleForTest(t, "attndec", AttnDecSource())
	requireKernels(t, img, "attndec_combine")
	for _, v := range attnDecVariants {
		for _, dim := range v.dims {
			requireKernels(t, img, v.kernel(dim))
			requireSharedFits(t, v.kernel(dim), v.shared(dim))
		}
	}
}

// TestAttnDecEmulated runs kernels/attndec.cu's partial and combine kernels
// on the CPU (no GPU needed): testdata/attndec_emu.cpp turns every CUDA
// thread into a std::thread with barriers for __syncthreads and the warp
// shuffles, runs window, HCA and CSA problems (padding, multi-tile splits,
// MaxKeys truncation, T up to 4, dims 128/256/512, every variant) and
// compares with its own float64 attention. Skipped with -short or without
// g++ (C++20).
func TestAttnDecEmulated(t *testing.T) {
	src := AttnDecSource()
	for _, m := range []string{"extern __shared__ float4 ad_sm[];", "extern __shared__ float4 cpart[];"} {
		if !strings.Contains(src, m) {
			t.Fatalf("attndec.cu no longer declares %q; update the emulation", m)
		}
		name := strings.Fields(m)[3]
		name = strings.TrimSuffix(name, "[];")
		src = strings.Replace(src, m, "float4 *"+name+" = (float4 *)g_dyn;", 1)
	}
	var gen strings.Builder
	gen.WriteString("static std::vector<Var> vars = {\n")
	for _, v := range attnDecVariants {
		ds := make([]string, len(v.dims))
		for i, d := range v.dims {
			ds[i] = strconv.Itoa(d)
		}
		fmt.Fprintf(&gen, "  {%q, %d, %d, %d, {%s}},\n", v.Name, v.G, v.KT, v.MaxSplits, strings.Join(ds, ", "))
	}
	gen.WriteString("};\nstatic void (*kernel(std::string n, int D))(ADArgs) {\n")
	for _, v := range attnDecVariants {
		for _, d := range v.dims {
			fmt.Fprintf(&gen, "  if (n == %q && D == %d) return %s;\n", v.Name, d, v.kernel(d))
		}
	}
	gen.WriteString("  return nullptr;\n}\nstatic unsigned combine_threads(int D) {\n")
	for _, d := range []int{128, 256, 512} {
		fmt.Fprintf(&gen, "  if (D == %d) return %d;\n", d, d/4*attnDecCombineParts(d))
	}
	gen.WriteString("  return 0;\n}\n")
	harness, err := os.ReadFile("testdata/attndec_emu.cpp")
	if err != nil {
		t.Fatal(err)
	}
	lines := runHostEmulation(t, map[string]string{"kern.inc": src, "gen.inc": gen.String(), "emu.cpp": string(harness)})
	if len(lines) < 20 {
		t.Fatalf("emulation printed %d lines, want a result per case and variant:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	last := lines[len(lines)-1]
	worst, err := strconv.ParseFloat(strings.TrimPrefix(last, "worst "), 64)
	if err != nil || !(worst <= attnDecTol) {
		t.Errorf("emulation's last line %q: want worst <= %g", last, attnDecTol)
	}
	t.Logf("%d results, max relative error %.3g vs float64", len(lines)-1, worst)
}
