package cuda

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"unsafe"

	"moxie/compute"
)

// gemvmDecodeU is the gemvm chunk a decode session uses by default: dsv4's
// $MOXIE_CUDA_GEMVM default "a,q,wo,u4" (GemvVariant{MMA: true, U: 4}).
const gemvmDecodeU = 4

// moeDefaultKernels returns the kernels a decode session launches from the
// moe modules by default, each with why: MoEPreferred's two (the variant
// ParseMoEVariant("") picks; moeKernelNames does not depend on the shapes;
// with its stage 2 that begins the next boundary, moeHCKernelName)
// and the gemvm chunk dsv4 asks for by default. They must be in the
// default module, and nothing else should.
func moeDefaultKernels(t *testing.T) map[string]string {
	v, err := ParseMoEVariant("")
	if err != nil {
		t.Fatal(err)
	}
	n1, n2 := moeKernelNames(v)
	want := map[string]string{n1: fmt.Sprintf("MoE decode variant %v, stage 1", v), n2: fmt.Sprintf("MoE decode variant %v, stage 2", v)}
	if nh := moeHCKernelName(v); nh != "" {
		want[nh] = fmt.Sprintf("MoE decode variant %v, stage 2 with the boundary's epilogue", v)
	}
	want[fmt.Sprintf("gemvm_f%d", gemvmDecodeU)] = fmt.Sprintf("Gemv MMA U %d", gemvmDecodeU)
	want[fmt.Sprintf("gemvmh_f%d", gemvmHCU)] = fmt.Sprintf("Gemv MMA U %d with the boundary's epilogue", gemvmHCU)
	want[fmt.Sprintf("gemvmc_f%d", gemvmHCU)] = fmt.Sprintf("Gemv MMA U %d on a boundary's output formed in the launch", gemvmHCU)
	return want
}

// TestMoEModuleSources checks the split of kernels/moe.cu into the default
// and benchmark modules (no NVRTC needed): the instantiations each holds,
// and that both carry the //@pdl marker (Module sets Kernel.pdl from it)
// with every kernel starting as pdlMarker requires.
func TestMoEModuleSources(t *testing.T) {
	def, bench, err := MoEModuleSources()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, src string
		want      []string
		notWant   []string
	}{
		{"default", def, []string{"struct MoeArgs", "static_assert(sizeof(MoeArgs) == 200", "MOE1LX(0, 7) MOE2LW(1, 1, 0, 2) MOE2LHW(1, 1, 0, 2)", "GEMVM(4) GEMVMH(4) GEMVMC(4)"},
			[]string{"GEMVM(1)", "GEMVM(2)", "MOE1L(0, 7)", "MOE2L(1, 1, 0, 2)", "MOE2LH(1, 1, 0, 2)", "MOE2LP(1, 1, 0, 2)", "MOE1(8, 2, 0, 2)", "MOE1W(2, 2, 0, 2)", "MOE2S(2, 2, 0, 4, 3, 6)", "//@module"}},
		{"bench", bench, []string{"struct MoeArgs", "GEMVM(1) GEMVM(2)", "MOE1(8, 2, 0, 2)", "MOE1L(0, 7) MOE2LP(1, 1, 0, 2)", "MOE2L(1, 1, 0, 2) MOE2LH(1, 1, 0, 2)", "MOE1WP(1, 1, 0, 2)", "MOE1LXG(2, 0, 4)"},
			[]string{"GEMVM(4)", "MOE1LX(0, 7)", "MOE2LW(1, 1, 0, 2)", "MOE2LHW(1, 1, 0, 2)", "//@module"}},
	} {
		checkModuleSource(t, tc.name, tc.src, tc.want, tc.notWant)
		if !hasPDLMarker(tc.src) {
			t.Errorf("%s module source lacks the %s marker", tc.name, pdlMarker)
		}
		if bad := pdlViolations(tc.src); len(bad) > 0 {
			t.Errorf("%s module: kernels that do not start as %s requires: %v", tc.name, pdlMarker, bad)
		}
	}
	if len(def)+len(bench) <= len(moeSrc) {
		t.Errorf("module sources (%d + %d bytes) do not both carry the common section of moe.cu (%d bytes)", len(def), len(bench), len(moeSrc))
	}
	for _, bad := range []struct{ src, err string }{
		{"//@module common\nC\n//@module moe\nM\n", `lacks its "bench" section`},
		{"//@module common\nC\n//@module linear\nL\n", `unknown section "linear" (want common, moe, bench)`},
	} {
		if _, _, err := splitMoESource(bad.src); err == nil || !strings.Contains(err.Error(), bad.err) || !strings.Contains(err.Error(), "moe.cu") {
			t.Errorf("splitMoESource(%q): error %v, want one naming moe.cu and containing %q", bad.src, err, bad.err)
		}
	}
	if d, b, err := splitMoESource("head\n//@module bench\nB\n//@module common\nC\n//@module moe\nM\n"); err != nil || d != "C\nM\n" || b != "C\nB\n" {
		t.Errorf("splitMoESource = %q, %q, %v; want \"C\\nM\\n\", \"C\\nB\\n\"", d, b, err)
	}
}

// TestMoECompile compiles the two moe modules (MoEModuleSources) for sm_90
// (compileModuleForTest: no GPU needed, skipped without NVRTC) and checks
// that the default module holds exactly the kernels a decode session
// launches by default (moeDefaultKernels), that both kernels of every
// MoEVariant and every gemvm chunk are in one of the two modules, and that
// no kernel is in both; register counts and stack frames are logged
// (NVRTC 11.8: the stage 1 kernels at 128 registers keep 8-32 bytes of
// frame, spilled around the double-precision sigmoid's slow-path call; the
// gemvm kernels must keep none). The benchmark module (the slow one) is
// skipped in -short mode unless MOXIE_COMPILE_BENCH is set. The .cu file's
// static_asserts check the MoeArgs/LinRec sizes at compile time.
func TestMoECompile(t *testing.T) {
	def, bench, err := MoEModuleSources()
	if err != nil {
		t.Fatal(err)
	}
	res := map[string]kernelResources{}
	compile := func(name, src string) map[string]bool {
		img := compileModuleForTest(t, name, src)
		syms := kernelSymbols(t, img)
		t.Logf("%s module: %d kernels", name, len(syms))
		for n, r := range cubinResources(t, img) {
			res[n] = r
		}
		return syms
	}
	wantDef := moeDefaultKernels(t)
	defSyms := compile("moe", def)
	for name, why := range wantDef {
		if !defSyms[name] {
			t.Errorf("default moe module lacks %s (%s)", name, why)
		}
	}
	for name := range defSyms {
		if _, ok := wantDef[name]; !ok {
			t.Errorf("default moe module has %s, which no default launches (move it to the bench section)", name)
		}
	}
	var benchSyms map[string]bool
	if testing.Short() && os.Getenv("MOXIE_COMPILE_BENCH") == "" {
		t.Log("-short: benchmark module not compiled (set MOXIE_COMPILE_BENCH=1)")
	} else {
		benchSyms = compile("moe_bench", bench)
		for name := range benchSyms {
			if defSyms[name] {
				t.Errorf("kernel %s is in both moe modules", name)
			}
		}
	}
	logRes := func(what, n string) {
		if r, ok := res[n]; ok {
			t.Logf("%s: %s: %d registers, %d-byte stack frame", what, n, r.regs, r.frame)
		} else {
			t.Errorf("%s: %s has no register count in the CUBIN's .nv.info", what, n)
		}
	}
	present := func(what, n string) bool {
		if defSyms[n] || benchSyms[n] {
			return true
		}
		if benchSyms != nil {
			t.Errorf("%s: no moe module has %s", what, n)
		}
		return false
	}
	for v := range moeVariantCount {
		n1, n2 := moeKernelNames(v)
		for _, n := range []string{n1, n2} {
			if present(v.String(), n) {
				logRes(v.String(), n)
			}
		}
	}
	// The Gemv MMA kernels (PrepareGemv with GemvVariant.MMA).
	for _, u := range []int{1, 2, 4} {
		n := fmt.Sprintf("gemvm_f%d", u)
		if !present("Gemv MMA", n) {
			continue
		}
		logRes("Gemv MMA", n)
		if r := res[n]; r.frame != 0 {
			t.Errorf("%s: %d-byte stack frame, want none (a spill)", n, r.frame)
		}
	}
}

// kernelResources is what a CUBIN's .nv.info section records of a kernel.
type kernelResources struct{ regs, frame int }

// The .nv.info attributes read (EIATTR_*: 4-byte symbol index, 4-byte value).
const (
	eiattrFrameSize = 0x11
	eiattrRegCount  = 0x2f
)

// cubinResources reads every kernel's register count and stack frame size
// from the CUBIN's global .nv.info section; it fails t when img is not ELF.
func cubinResources(t *testing.T, cubin []byte) map[string]kernelResources {
	t.Helper()
	if len(cubin) < 24 {
		t.Fatalf("CUBIN of %d bytes", len(cubin))
	}
	img := bytes.Clone(cubin)
	img[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	binary.LittleEndian.PutUint32(img[20:], uint32(elf.EV_CURRENT))
	f, err := elf.NewFile(bytes.NewReader(img))
	if err != nil {
		t.Fatalf("CUBIN: %v", err)
	}
	syms, err := f.Symbols()
	if err != nil {
		t.Fatalf("CUBIN symbols: %v", err)
	}
	sec := f.Section(".nv.info")
	if sec == nil {
		t.Fatalf("CUBIN has no .nv.info section")
	}
	b, err := sec.Data()
	if err != nil {
		t.Fatalf("CUBIN .nv.info: %v", err)
	}
	out := map[string]kernelResources{}
	for len(b) >= 2 {
		format, attr := b[0], b[1]
		b = b[2:]
		var val []byte
		switch format {
		case 1: // no value
		case 2: // one byte
			if len(b) < 1 {
				t.Fatalf(".nv.info truncated")
			}
			b = b[1:]
		case 3: // two bytes
			if len(b) < 2 {
				t.Fatalf(".nv.info truncated")
			}
			b = b[2:]
		case 4: // sized value
			if len(b) < 2 || len(b) < 2+int(binary.LittleEndian.Uint16(b)) {
				t.Fatalf(".nv.info truncated")
			}
			n := int(binary.LittleEndian.Uint16(b))
			val, b = b[2:2+n], b[2+n:]
		default:
			t.Fatalf(".nv.info: unknown attribute format %#x", format)
		}
		if (attr != eiattrRegCount && attr != eiattrFrameSize) || len(val) != 8 {
			continue
		}
		// Symbol indexes count from the ELF's null symbol, which
		// debug/elf's Symbols drops.
		i := int(binary.LittleEndian.Uint32(val)) - 1
		if i < 0 || i >= len(syms) {
			continue
		}
		r := out[syms[i].Name]
		if attr == eiattrRegCount {
			r.regs = int(binary.LittleEndian.Uint32(val[4:]))
		} else {
			r.frame = int(binary.LittleEndian.Uint32(val[4:]))
		}
		out[syms[i].Name] = r
	}
	return out
}

// TestMoEArgsMirror checks the Go mirror of MoeArgs: its size is the one
// kernels/moe.cu asserts, and E, Limit, Part and the boundary's fields sit
// after 13 pointers and 6 ints as C lays them out (Part 8-byte aligned
// after the float).
func TestMoEArgsMirror(t *testing.T) {
	var a moeArgs
	if s := unsafe.Sizeof(a); s != 200 {
		t.Errorf("moeArgs is %d bytes, kernels/moe.cu's MoeArgs 200", s)
	}
	if o := unsafe.Offsetof(a.HC); o != 144 {
		t.Errorf("moeArgs.HC at %d, MoeArgs.hc at 144", o)
	}
	var h hcEpiArgs
	if s, o := unsafe.Sizeof(h), unsafe.Offsetof(h.NM); s != 56 || o != 48 {
		t.Errorf("hcEpiArgs is %d bytes with NM at %d, HcEpi 56 with nm at 48", s, o)
	}
	var hc hcColArgs
	if s, o := unsafe.Sizeof(hc), unsafe.Offsetof(hc.NormEps); s != 72 || o != 56 {
		t.Errorf("hcColArgs is %d bytes with NormEps at %d, HcCol 72 with normEps at 56", s, o)
	}
	if o := unsafe.Offsetof(a.E); o != 104 {
		t.Errorf("moeArgs.E at %d, MoeArgs.E at 104", o)
	}
	if o := unsafe.Offsetof(a.Limit); o != 128 {
		t.Errorf("moeArgs.Limit at %d, MoeArgs.limit at 128", o)
	}
	if o := unsafe.Offsetof(a.Part); o != 136 {
		t.Errorf("moeArgs.Part at %d, MoeArgs.part at 136", o)
	}
	for _, want := range []string{"sizeof(MoeArgs) == 200", "sizeof(LinRec) == 80", "sizeof(HcEpi) == 56", "sizeof(HcCol) == 72"} {
		if !bytes.Contains([]byte(MoESource()), []byte(want)) {
			t.Errorf("kernels/moe.cu no longer asserts %q", want)
		}
	}
	if s := unsafe.Sizeof(linArgs{}); s != 80 {
		t.Errorf("linArgs is %d bytes, LinRec mirrors 80", s)
	}
}

// TestMoELeanEmulated runs the lean family's kernels (MoELean, MoELeanPF,
// MoELeanX, MoELeanX2, MoELeanX2P, MoELeanXG2, MoELeanX1G2, MoELeanX1G4, MoELeanXE, MoELeanXW8G4, MoELeanXW8G2, both stages,
// and MoELeanX's stage 2 with the boundary's epilogue, moe2lh) on the CPU through a g++ host emulation (every
// CUDA thread a std::thread, mma.sync m16n8k16 emulated from the PTX
// fragment layouts in float64, f16 conversions by _Float16) and checks h
// and out against a float64 evaluation of the MoE layer written in the
// harness from the formats' definitions (E2M1 codes with E8M0 scales per
// 32 columns, E4M3 with E8M0 scales per block), plus: a second run gives
// the same bits, an id outside the table makes out NaN. Skipped with
// -short or without g++.
func TestMoELeanEmulated(t *testing.T) {
	inc, err := moeLeanEmuSource()
	if err != nil {
		t.Fatal(err)
	}
	var gen strings.Builder
	for _, c := range []struct {
		D, I, Is, blk, E, K int
		limit               float64
	}{
		{256, 128, 128, 64, 4, 3, 1.25},
		{256, 128, 0, 64, 4, 3, 0},
		{384, 384, 384, 128, 5, 6, 0},   // spans and groups not a multiple of the warps
		{640, 128, 128, 128, 3, 2, 1.5}, // a routed warp's columns (256) above a shared warp's (192)
		{256, 128, 512, 64, 4, 9, 0},    // stage 2's warp 4 takes the last routed unit and the first FP8 span
	} {
		fmt.Fprintf(&gen, "{%d, %d, %d, %d, %d, %d, %g, %d},\n", c.D, c.I, c.Is, c.blk, c.E, c.K, c.limit, moeLean1Smem(c.D))
	}
	lines := runHostEmulation(t, map[string]string{"kern.inc": inc, "gen.inc": gen.String(), "emu.cpp": moeLeanEmuHarness})
	for _, l := range lines {
		t.Log(l)
		if strings.HasPrefix(l, "FAIL") {
			t.Error(l)
		}
	}
	if len(lines) == 0 || !strings.HasPrefix(lines[len(lines)-1], "worst ") {
		t.Fatalf("emulation did not finish: %q", lines)
	}
}

// moeLeanEmuSource returns what the emulation compiles of kernels/moe.cu:
// the argument structs and the helpers the lean family uses (moe.cu's own
// text), then the lean section with its cp.async wrappers made plain
// copies and its dynamic shared memory a harness buffer. The functions
// written in inline PTX (mma16816, ldw, hilo, hilo2, e4m3x2_f16x2,
// moe_prefetch) come from the harness.
func moeLeanEmuSource() (string, error) {
	src := MoESource()
	var b strings.Builder
	section := func(from, to string) error {
		i := strings.Index(src, from)
		j := strings.Index(src[max(i, 0):], to)
		if i < 0 || j < 0 {
			return fmt.Errorf("kernels/moe.cu: no section %q .. %q; update the emulation", from, to)
		}
		b.WriteString(src[i:i+j] + "\n")
		return nil
	}
	def := func(head string) error {
		d, err := cuDefinition(src, head)
		if err != nil {
			return fmt.Errorf("kernels/moe.cu: %v; update the emulation", err)
		}
		b.WriteString(d + "\n")
		return nil
	}
	if err := section("typedef unsigned char u8;", "__device__ __forceinline__ void moe_prefetch("); err != nil {
		return "", err
	}
	for _, h := range []string{
		"__device__ __forceinline__ void e2m1_f16x4(",
		"__device__ __forceinline__ void e2m1_f16x4_cvt(",
	} {
		if err := def(h); err != nil {
			return "", err
		}
	}
	if err := section("template <int DEC> struct MoeDec;", "__device__ __forceinline__ float e8m0_at("); err != nil {
		return "", err
	}
	for _, h := range []string{
		"__device__ __forceinline__ u32 quarter(",
		"__device__ __forceinline__ int perm8(",
		"__device__ __forceinline__ void hilo8(",
		"__device__ __forceinline__ float moe_sigmoid(",
		"__device__ __forceinline__ float moe_swiglu(",
		"template <int NW>\n__device__ __forceinline__ void stage1_sums(",
		"template <int DEC, int NW = MOE_WARPS>",
		"template <int NM> __device__ __forceinline__ void quad_sum(",
		"template <typename Chunk, typename Ld, typename Cp, typename Mid>\n__device__ __forceinline__ void wide_walk(",
	} {
		if err := def(h); err != nil {
			return "", err
		}
	}
	sec, err := splitSections("moe.cu", src, "common", "moe", "bench")
	if err != nil {
		return "", err
	}
	i := strings.Index(sec["common"], "#define LEAN1_WARPS")
	if i < 0 {
		return "", fmt.Errorf("kernels/moe.cu: no lean section; update the emulation")
	}
	lean := sec["common"][i:]
	// The lean and gemvm kernels: the lines of both modules' sections that
	// instantiate the macros the lean part of common defines.
	inst, err := emuInstantiations(lean, sec["moe"]+sec["bench"])
	if err != nil {
		return "", err
	}
	lean += inst
	for _, r := range []struct{ old, new string }{
		{"extern __shared__ uint4 moe_smem[];", "uint4 *moe_smem = g_moe_smem;"},
		{`  const u32 d = (u32)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");`, "  memcpy(dst, src, 16);"},
		{`asm volatile("cp.async.commit_group;" ::: "memory");`, ""},
		{`asm volatile("cp.async.wait_group 1;" ::: "memory");`, ""},
		{`asm volatile("cp.async.wait_all;" ::: "memory");`, ""},
	} {
		if n := strings.Count(lean, r.old); n < 1 {
			return "", fmt.Errorf("kernels/moe.cu: the lean section has no %q; update the emulation", r.old)
		}
		lean = strings.ReplaceAll(lean, r.old, r.new)
	}
	if strings.Contains(lean, "asm") {
		return "", fmt.Errorf("kernels/moe.cu: the lean section has inline PTX the emulation does not replace")
	}
	b.WriteString(lean)
	return b.String(), nil
}

var (
	cuMacroDef  = regexp.MustCompile(`(?m)^#define ([A-Z][A-Z0-9_]*)\(`)
	cuMacroCall = regexp.MustCompile(`\b([A-Z][A-Z0-9_]*)\(`)
)

// emuInstantiations returns the lines of sections (moe.cu's module
// sections: instantiation lines and comments) that call macros defined in
// part (moe.cu's lean and gemvm text), the other instantiation lines
// dropped; a line calling both kinds is an error (keep the families on
// separate lines).
func emuInstantiations(part, sections string) (string, error) {
	defined := map[string]bool{}
	for _, m := range cuMacroDef.FindAllStringSubmatch(part, -1) {
		defined[m[1]] = true
	}
	var b strings.Builder
	for line := range strings.Lines(sections) {
		if strings.HasPrefix(strings.TrimSpace(line), "//") {
			continue
		}
		in, out := 0, 0
		for _, m := range cuMacroCall.FindAllStringSubmatch(line, -1) {
			if defined[m[1]] {
				in++
			} else {
				out++
			}
		}
		switch {
		case in > 0 && out > 0:
			return "", fmt.Errorf("kernels/moe.cu: %q instantiates lean and other kernels on one line; split it for the emulation", strings.TrimSpace(line))
		case in > 0:
			b.WriteString(line)
		}
	}
	if b.Len() == 0 {
		return "", fmt.Errorf("kernels/moe.cu: no lean or gemvm instantiation in the module sections; update the emulation")
	}
	return b.String(), nil
}

// moeLeanEmuHarness is TestMoELeanEmulated's C++ program (it includes
// kern.inc, moeLeanEmuSource's output, and gen.inc, the cases: D, I, Is,
// FP8 block, E, K, limit, stage 1's dynamic shared memory). Each case
// draws weights, x and route weights, runs each lean variant's kernels
// twice, and prints the max relative errors of h and out against float64
// (FAIL above 1e-4), FAIL when the two runs differ, when an id outside
// the table does not make out NaN, or when a split variant leaves a
// ticket non-zero; then leanxh (moe2lh: leanx's stage 2 that begins the
// boundary after it), FAIL unless its out is leanx's bits, x' HCExpand's
// float32 operations on it and its partials within 1e-5 of float64; then
// "worst <max>".
const moeLeanEmuHarness = `#include <atomic>
#include <barrier>
#include <thread>
#include <vector>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <cstdint>
#include <random>
#include <algorithm>
using std::min; using std::max;
struct uint4 { unsigned x, y, z, w; };
struct float4 { float x, y, z, w; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
#include "cuda_emu.h"
alignas(16) static unsigned char g_smem_bytes[1 << 17];
uint4 *const g_moe_smem = reinterpret_cast<uint4 *>(g_smem_bytes);
inline float __int_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
template <class T> inline T __ldg(const T *p) { return *p; }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t v = ((uint64_t)y << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; i++) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
static float g_shfl[32][32];
inline void __syncwarp() { g_warp_bar[threadIdx.x / 32]->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int o) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  g_warp_bar[w]->arrive_and_wait();
  g_shfl[w][l] = v;
  g_warp_bar[w]->arrive_and_wait();
  return g_shfl[w][l ^ o];
}
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float h2f(unsigned short h) { _Float16 x; memcpy(&x, &h, 2); return (float)x; }
inline unsigned short f2h(float f) { _Float16 x = (_Float16)f; unsigned short h; memcpy(&h, &x, 2); return h; }
inline void hilo(float v, unsigned short &hi, unsigned short &lo) { hi = f2h(v); lo = f2h((v - h2f(hi)) * 2048.f); }
inline void hilo2(float a, float b, unsigned &hi, unsigned &lo) {
  unsigned short ha, la, hb, lb;
  hilo(a, ha, la);
  hilo(b, hb, lb);
  hi = ha | (unsigned)hb << 16;
  lo = la | (unsigned)lb << 16;
}
static double e4m3(unsigned b) {
  const int e = (b >> 3) & 15, m = b & 7;
  double v = (e == 15 && m == 7) ? NAN : e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1 + m / 8.0, e - 7);
  return (b & 0x80) ? -v : v;
}
inline unsigned e4m3x2_f16x2(unsigned w) { return f2h((float)e4m3(w & 0xff)) | (unsigned)f2h((float)e4m3((w >> 8) & 0xff)) << 16; }
inline unsigned ldw(const unsigned *p) { return *p; }
inline uint4 ldw(const uint4 *p) { return *p; }
inline void moe_prefetch(const void *) {}
// The split stage 2's ticket: blocks run one at a time, so plain memory.
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline unsigned atomicAdd(unsigned *p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline unsigned atomicExch(unsigned *p, unsigned v) { return std::atomic_ref<unsigned>(*p).exchange(v); }
template <class T> inline T __ldcg(const T *p) { return *p; }
// mma.sync.m16n8k16.row.col.f32.f16.f16.f32 over the warp's fragments (PTX
// ISA layouts): A[r][k] in lane (r%8)·4 + (k%8)/2, register (r>=8) +
// 2·(k>=8), half k%2; B[k][n] in lane 4n + (k%8)/2, register k>=8, half
// k%2; C/D[r][n] in lane (r%8)·4 + n/2, element 2·(r>=8) + n%2.
struct MmaX { unsigned a[4], b[2]; };
static MmaX g_mma[32][32];
inline void mma16816(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l / 4, t = l % 4;
  g_warp_bar[w]->arrive_and_wait();
  g_mma[w][l] = MmaX{{a0, a1, a2, a3}, {b0, b1}};
  g_warp_bar[w]->arrive_and_wait();
  auto half = [](unsigned reg, int k) { return (double)h2f((unsigned short)(k % 2 ? reg >> 16 : reg & 0xffff)); };
  for (int i = 0; i < 4; i++) {
    const int r = g + 8 * (i >= 2), n = 2 * t + i % 2;
    double s = d[i];
    for (int k = 0; k < 16; k++)
      s += half(g_mma[w][(r % 8) * 4 + (k % 8) / 2].a[(r >= 8) + 2 * (k >= 8)], k) * half(g_mma[w][n * 4 + (k % 8) / 2].b[k >= 8], k);
    d[i] = (float)s;
  }
}
// The E4M3 code nearest v (ties to the even code), saturating at ±448: by
// search over the codes.
static unsigned f2e4m3(float v) {
  const double a = std::fabs((double)v);
  unsigned best = 0;
  for (unsigned c = 1; c < 0x7f; c++) {
    const double dc = std::fabs(e4m3(c) - a), db = std::fabs(e4m3(best) - a);
    if (dc < db || (dc == db && c % 2 == 0)) best = c;
  }
  if (a > 448) best = 0x7e;
  return best | (std::signbit(v) ? 0x80u : 0u);
}
inline unsigned q8x4(float4 v, float inv) { return f2e4m3(v.x * inv) | f2e4m3(v.y * inv) << 8 | f2e4m3(v.z * inv) << 16 | f2e4m3(v.w * inv) << 24; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
#include "kern.inc"

template <class A> void launch(void (*k)(A), unsigned grid, unsigned threads, A a) {
  gridDim = {grid, 1, 1};
  blockDim = {threads, 1, 1};
  for (unsigned x = 0; x < grid; x++) {
    std::barrier<> bb(threads);
    g_block_bar = &bb;
    for (unsigned w = 0; w < threads / 32; w++) g_warp_bar[w] = new std::barrier<>(32);
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < threads; t++) ts.emplace_back([=] { threadIdx = {t, 0, 0}; blockIdx = {x, 0, 0}; k(a); });
    for (auto &t : ts) t.join();
    for (unsigned w = 0; w < threads / 32; w++) delete g_warp_bar[w];
  }
}

// The boundary a producer of out [D] begins (HcEpi, hc_epi_finish): random
// streams, coefficients and fn; then, after the producer ran, how many
// x' values are off HCExpand's float32 operations on out, and the
// partials' largest error against float64 tile sums (relative to the sum
// of the terms' magnitudes).
// The Gram rows' stream pairs (j, k), in hc_epi_finish's order.
static const int gj[10] = {0, 0, 0, 0, 1, 1, 1, 2, 2, 3}, gk[10] = {0, 1, 2, 3, 1, 2, 3, 2, 3, 3};
struct HcData {
  int D;
  std::vector<float> x, post, comb, fn, xo, part;
  HcData(int d, std::mt19937 &rng) : D(d), x(4 * d), post(4), comb(16), fn((size_t)24 * 4 * d), xo(4 * d, NAN), part(35 * (d / 16), NAN) {
    std::normal_distribution<double> nd(0, 1);
    for (auto &v : x) v = (float)nd(rng);
    for (auto &v : post) v = (float)(2 * std::fabs(nd(rng)));
    for (auto &v : comb) v = (float)(0.25 * std::fabs(nd(rng)));
    for (auto &v : fn) v = (float)(0.3 * nd(rng) / std::sqrt(4.0 * d));
  }
  HcEpi args(bool gram = false) { return HcEpi{x.data(), post.data(), comb.data(), fn.data(), xo.data(), part.data(), 24, gram ? 1 : 0}; }
  void check(const float *out, int &xbad, double &pe) const {
    xbad = 0;
    for (int k = 0; k < 4; k++)
      for (int i = 0; i < D; i++) {
        float v = __fmul_rn(post[k], out[i]);
        for (int j = 0; j < 4; j++) v = __fmaf_rn(comb[4 * j + k], x[j * D + i], v);
        xbad += memcmp(&v, &xo[k * D + i], 4) != 0;
      }
    pe = 0;
    for (int m = 0; m < (gram ? 35 : 25); m++)
      for (int ti = 0; ti < D / 16; ti++) {
        double sum = 0, mag = 0;
        if (m < 25) {
          for (int k = 0; k < 4; k++)
            for (int i = 16 * ti; i < 16 * ti + 16; i++) {
              const double xv = xo[k * D + i], f = m < 24 ? (double)fn[(size_t)m * 4 * D + k * D + i] : xv;
              sum += f * xv;
              mag += std::fabs(f * xv);
            }
        } else {  // Gram row: Σ_i x'_j[i]·x'_k[i] over the tile
          for (int i = 16 * ti; i < 16 * ti + 16; i++) {
            const double t = (double)xo[gj[m - 25] * D + i] * xo[gk[m - 25] * D + i];
            sum += t;
            mag += std::fabs(t);
          }
        }
        const double g = part[m * (D / 16) + ti];
        pe = std::isfinite(g) ? max(pe, std::fabs(g - sum) / max(mag, 1e-30)) : INFINITY;
      }
  }
  bool gram = false;
};

struct Case { int D, I, Is, blk, E, K; double limit; int smem1; };
static const Case cases[] = {
#include "gen.inc"
};

// An MXFP4 [rows, cols] weight: codes (nibble i of a little-endian word is
// column i), E8M0 scales per 32 columns; and its float64 values.
struct Mx { std::vector<unsigned char> W, S; std::vector<double> v; };
static Mx mxfp4(std::mt19937 &rng, int rows, int cols) {
  static const double e2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  Mx m{std::vector<unsigned char>(rows * cols / 2), std::vector<unsigned char>(rows * cols / 32), std::vector<double>(rows * cols)};
  for (auto &b : m.W) b = rng() & 0xff;
  for (auto &s : m.S) s = 127 - 6 + rng() % 5;
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      const int code = (m.W[(r * cols + c) / 2] >> (4 * (c % 2))) & 15;
      m.v[r * cols + c] = (code & 8 ? -1 : 1) * e2m1[code & 7] * std::ldexp(1.0, m.S[r * (cols / 32) + c / 32] - 127);
    }
  return m;
}
// An FP8 block [rows, cols] weight: E4M3 bytes (no NaN), E8M0 scales per
// blk x blk block (partial blocks at the edges), and its float64 values.
static Mx fp8(std::mt19937 &rng, int rows, int cols, int blk) {
  const int sr = (rows + blk - 1) / blk, sc = (cols + blk - 1) / blk;
  Mx m{std::vector<unsigned char>(rows * cols), std::vector<unsigned char>(sr * sc), std::vector<double>(rows * cols)};
  for (auto &b : m.W) do b = rng() & 0xff; while ((b & 0x7f) == 0x7f);
  for (auto &s : m.S) s = 127 - 10 + rng() % 4;
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) m.v[r * cols + c] = e4m3(m.W[r * cols + c]) * std::ldexp(1.0, m.S[(r / blk) * sc + c / blk] - 127);
  return m;
}
static std::vector<double> matvec(const Mx &m, int rows, int cols, const std::vector<double> &x) {
  std::vector<double> y(rows);
  for (int r = 0; r < rows; r++) {
    double s = 0;
    for (int c = 0; c < cols; c++) s += m.v[r * cols + c] * x[c];
    y[r] = s;
  }
  return y;
}
static double swiglu(double g, double u, double limit) {
  if (limit > 0) { g = std::min(g, limit); u = std::max(std::min(u, limit), -limit); }
  return g / (1 + std::exp(-g)) * u;
}
static double maxrel(const std::vector<float> &got, const std::vector<double> &want) {
  double e = 0, m = 0;
  for (size_t i = 0; i < got.size(); i++) {
    if (!std::isfinite(got[i])) return INFINITY;
    e = max(e, std::fabs(got[i] - want[i]));
    m = max(m, std::fabs(want[i]));
  }
  return m > 0 ? e / m : e;
}

int main() {
  double worst = 0;
  int ci = 0;
  for (const Case &c : cases) {
    ci++;
    std::mt19937 rng(1234 + ci);
    std::normal_distribution<double> nd(0, 1);
    const int D = c.D, I = c.I, Is = c.Is, K = c.K, E = c.E;
    std::vector<Mx> w1, w3, w2;
    for (int e = 0; e < E; e++) { w1.push_back(mxfp4(rng, I, D)); w3.push_back(mxfp4(rng, I, D)); w2.push_back(mxfp4(rng, D, I)); }
    Mx s1, s3, s2;
    if (Is > 0) { s1 = fp8(rng, Is, D, c.blk); s3 = fp8(rng, Is, D, c.blk); s2 = fp8(rng, D, Is, c.blk); }
    std::vector<LinRec> t13(2 * E), t2(E);
    for (int e = 0; e < E; e++) {
      t13[2 * e] = LinRec{w1[e].W.data(), w1[e].S.data()};
      t13[2 * e + 1] = LinRec{w3[e].W.data(), w3[e].S.data()};
      t2[e] = LinRec{w2[e].W.data(), w2[e].S.data()};
    }
    std::vector<int> ids(K);
    std::vector<float> rw(K), x(D);
    std::vector<double> xd(D);
    for (int k = 0; k < K; k++) { ids[k] = (k * 7 + ci) % E; rw[k] = (float)(0.25 + 0.5 * k); }
    for (int i = 0; i < D; i++) { x[i] = (float)nd(rng); xd[i] = x[i]; }
    // float64 reference
    std::vector<std::vector<double>> hw;
    std::vector<double> outw(D, 0.0);
    for (int k = 0; k < K; k++) {
      const int e = ids[k];
      auto g = matvec(w1[e], I, D, xd), u = matvec(w3[e], I, D, xd);
      std::vector<double> h(I);
      for (int i = 0; i < I; i++) h[i] = swiglu(g[i], u[i], c.limit) * rw[k];
      auto y = matvec(w2[e], D, I, h);
      for (int d = 0; d < D; d++) outw[d] += y[d];
      hw.push_back(h);
    }
    if (Is > 0) {
      auto g = matvec(s1, Is, D, xd), u = matvec(s3, Is, D, xd);
      std::vector<double> h(Is);
      for (int i = 0; i < Is; i++) h[i] = swiglu(g[i], u[i], 0);
      auto y = matvec(s2, D, Is, h);
      for (int d = 0; d < D; d++) outw[d] += y[d];
      hw.push_back(h);
    }
    std::vector<unsigned short> hbuf(2 * (K * I + Is));
    std::vector<float> out(D);
    int bshift = 0;
    while ((1 << bshift) < c.blk) bshift++;
    MoeArgs a{};
    a.t13 = t13.data(); a.t2 = t2.data(); a.ids = ids.data(); a.rw = rw.data(); a.x = x.data(); a.h = hbuf.data(); a.out = out.data();
    if (Is > 0) { a.s1 = s1.W.data(); a.s3 = s3.W.data(); a.s2 = s2.W.data(); a.c1 = s1.S.data(); a.c3 = s3.S.data(); a.c2 = s2.S.data(); }
    a.E = E; a.K = K; a.D = D; a.I = I; a.Is = Is; a.bshift = bshift; a.limit = (float)c.limit;
    const unsigned grid1 = Is / 16 + K * I / 16;
    struct V { const char *name; void (*k1)(MoeArgs); void (*k2)(MoeArgs); unsigned split, threads2; bool sh2 = false; };
    const V vs[] = {{"lean", moe1l_d0_b7, moe2l_g1_f1_d0_b2, 1, 512}, {"leanpf", moe1lp_d0_b7, moe2lp_g1_f1_d0_b2, 1, 512}, {"leanx", moe1lx_d0_b7, moe2l_g1_f1_d0_b2, 1, 512},
                    {"leanx2", moe1lx_d0_b7, moe2s_g2_f2_d0_w4_s3_b6, 3, 128}, {"leanx2p", moe1lx_d0_b7, moe2sp_g2_f2_d0_w4_s3_b6, 3, 128},
                    {"leanxg2", moe1lx_d0_b7, moe2l_g2_f2_d0_b1, 1, 512}, {"leanx1g2", moe1lx_g2_d0_b4, moe2l_g1_f1_d0_b2, 1, 512},
                    {"leanx1g4", moe1lx_g4_d0_b2, moe2l_g1_f1_d0_b2, 1, 512}, {"leanxe", moe1lx_d0_b7, moe2le_g1_f1_d0_b2, 1, 512},
                    {"leanxw8g4", moe1lx_d0_b7, moe2s_g4_f4_d0_w8_s1_b2, 1, 256}, {"leanxw8g2", moe1lx_d0_b7, moe2s_g2_f2_d0_w8_s1_b2, 1, 256},
                    {"leanxw", moe1lx_d0_b7, moe2lw_g1_f1_d0_b2, 1, 512}, {"leanxwr", moe1lxr_d0_b7, moe2lw_g1_f1_d0_b2, 1, 512},
                    {"leanxwh", moe1lxh_d0_b7, moe2lw_g1_f1_d0_b2, 1, 512, true}};
    // A split stage 2's partials (3·D) and tickets (D/16), zero to start.
    std::vector<float> part(3 * D + D / 16, 0.f);
    // leanxwh's shared halves' sums (64 a tile) and tickets (one a tile), zero to start.
    std::vector<float> part2(65 * (Is / 16) + 1, 0.f);
    a.part = part.data();
    if (c.smem1 > (int)sizeof(g_smem_bytes)) { printf("FAIL case %d: stage 1 shared memory %d over the harness's buffer\n", ci, c.smem1); continue; }
    for (const V &v : vs) {
      std::fill(hbuf.begin(), hbuf.end(), 0xffff);
      std::fill(out.begin(), out.end(), NAN);
      a.part = v.sh2 ? part2.data() : part.data();
      const unsigned g1 = v.sh2 ? grid1 + Is / 16 : grid1;
      launch(v.k1, g1, 128, a);
      launch(v.k2, v.split * (D / 16), v.threads2, a);
      double eh = 0;
      for (int k = 0; k < K + (Is > 0); k++) {
        const bool sh = k == K;
        const int n = sh ? Is : I;
        const unsigned short *row = hbuf.data() + 2 * k * I;
        std::vector<float> got(n);
        for (int i = 0; i < n; i++) {
          const int at = sh ? i : (i & ~7) | ((i & 3) << 1) | ((i & 7) >> 2);
          got[i] = h2f(row[at]) + h2f(row[n + at]) / 2048.f;
        }
        eh = max(eh, maxrel(got, hw[k]));
      }
      const double eo = maxrel(out, outw);
      std::vector<float> first = out;
      launch(v.k1, g1, 128, a);
      launch(v.k2, v.split * (D / 16), v.threads2, a);
      const bool same = memcmp(first.data(), out.data(), 4 * D) == 0;
      for (int i = 0; v.sh2 && i < Is / 16; i++)
        if (reinterpret_cast<const unsigned *>(part2.data() + 64 * (Is / 16))[i] != 0) {
          printf("FAIL case %d %s: shared-half ticket %d left at %u\n", ci, v.name, i, reinterpret_cast<const unsigned *>(part2.data() + 64 * (Is / 16))[i]);
          break;
        }
      for (int i = 0; i < D / 16; i++)
        if (v.split > 1 && reinterpret_cast<const unsigned *>(part.data() + v.split * D)[i] != 0) {
          printf("FAIL case %d %s: ticket %d left at %u\n", ci, v.name, i, reinterpret_cast<const unsigned *>(part.data() + v.split * D)[i]);
          break;
        }
      printf("%s %s case %d (D %d, I %d, Is %d, K %d, limit %g): h max rel %.3g, out max rel %.3g%s\n", (eh > 1e-4 || eo > 1e-4 || !same) ? "FAIL" : "ok",
             v.name, ci, D, I, Is, K, c.limit, eh, eo, same ? "" : ", second run differs");
      worst = max(worst, max(eh, eo));
      // An id outside the table (first case): out all NaN.
      if (ci > 1) continue;
      ids[K - 1] = E;
      launch(v.k1, g1, 128, a);
      launch(v.k2, v.split * (D / 16), v.threads2, a);
      int finite = 0;
      for (float o : out) finite += std::isfinite(o);
      if (finite) printf("FAIL case %d %s: id %d outside the table left %d finite outputs\n", ci, v.name, E, finite);
      ids[K - 1] = ((K - 1) * 7 + ci) % E;
    }
    a.part = part.data();
    // leanxh: leanx with moe2lh, the stage 2 that begins the sublayer
    // boundary after it (HCEpilogue): out must be leanx's bits, x' HCExpand's
    // float32 operations on that out, and each tile's partials within
    // 1e-5 (relative to the sum of the terms' magnitudes) of float64 sums.
    {
      HcData hd(D, rng);
      launch(moe1lx_d0_b7, grid1, 128, a);
      launch(moe2l_g1_f1_d0_b2, D / 16, 512, a);
      const std::vector<float> want = out;
      MoeArgs ah = a;
      hd.gram = ci % 2 == 1;  // the Gram rows in odd cases
      ah.hc = hd.args(hd.gram);
      std::fill(out.begin(), out.end(), NAN);
      // leanxhw: leanxw's stage 2 with the epilogue (moe2lhw), the same checks.
      for (int w = 0; w < 2; w++) {
        std::fill(out.begin(), out.end(), NAN);
        std::fill(hd.xo.begin(), hd.xo.end(), NAN);
        std::fill(hd.part.begin(), hd.part.end(), NAN);
        launch(moe1lx_d0_b7, grid1, 128, ah);
        launch(w ? moe2lhw_g1_f1_d0_b2 : moe2lh_g1_f1_d0_b2, D / 16, 512, ah);
        const bool same = memcmp(want.data(), out.data(), 4 * D) == 0;
        int xbad;
        double pe;
        hd.check(out.data(), xbad, pe);
        printf("%s %s case %d%s: out %s leanx's bits, %d x' values off HCExpand's, partials max rel %.3g\n",
               (same && xbad == 0 && pe <= 1e-5) ? "ok" : "FAIL", w ? "leanxhw" : "leanxh", ci, hd.gram ? " (Gram rows)" : "", same ? "=" : "!=", xbad, pe);
      }
    }
  }
  printf("worst %.3g\n", worst);
}
`

// TestGemvMEmulated runs the Gemv MMA kernels (gemvm_f1, f2, f4) on the CPU
// through the lean family's host emulation (moeLeanEmuSource, the harness's
// emulated CUDA and mma) and checks y against a float64 product of the FP8
// weights' values (E4M3 codes times E8M0 block scales): several products
// in one launch, row groups, tiles past the last row, warps sharing a tile
// (wpr 1 to 8), x RMS-normalized in the launch (GemvProj.Norm, against
// RMSNorm(x)·w in float64); and that a second run gives the same bits;
// and gemvmh_f4 (the boundary's epilogue, with the Gram rows) and gemvmc_f4
// (x a boundary's a formed in the launch) where a case fits them. Skipped
// with -short or without g++.
func TestGemvMEmulated(t *testing.T) {
	inc, err := moeLeanEmuSource()
	if err != nil {
		t.Fatal(err)
	}
	h := moeLeanEmuHarness
	i := strings.Index(h, "struct Case {")
	if i < 0 {
		t.Fatal("moeLeanEmuHarness: no struct Case; update this test")
	}
	var b strings.Builder
	b.WriteString(h[:i])
	b.WriteString("struct Mx { std::vector<unsigned char> W, S; std::vector<double> v; };\n")
	for _, head := range []string{"static Mx fp8(", "static double maxrel("} {
		d, err := cuDefinition(h, head)
		if err != nil {
			t.Fatalf("moeLeanEmuHarness: %v; update this test", err)
		}
		b.WriteString(d + "\n")
	}
	b.WriteString(gemvmEmuMain)
	// Launch shapes: each product's wpr and blocks as prepareGemvM plans
	// them on a 2-SM device (so that the splits happen at small sizes).
	var gen strings.Builder
	// groups 0 in a shape: one group, x normalized (GemvProj.Norm).
	for ci, c := range [][]gemvShape{
		{{compute.FP8Block, 48, 512, 1}},                                   // 3 tiles: wpr 8, one per block
		{{compute.FP8Block, 16, 64, 1}, {compute.FP8Block, 64, 256, 2}},    // one span; grouped
		{{compute.FP8Block, 96, 1024, 3}, {compute.FP8Block, 512, 128, 1}}, // tiles past the grid's last row
		{{compute.FP8Block, 64, 1024, 0}, {compute.FP8Block, 32, 512, 0}},  // normalized x
	} {
		blocks, maxPer := 0, 0
		fmt.Fprintf(&gen, "{%d, {", len(c))
		for _, m := range c {
			norm := m.groups == 0
			m.groups = max(m.groups, 1)
			tiles, spans := m.rows/16, m.cols/64
			wpr := gemvmWPR(tiles, spans, 2)
			per := spans / wpr
			maxPer = max(maxPer, per)
			fmt.Fprintf(&gen, "{%d, %d, %d, %d, %d, %t},", m.rows, m.cols, m.groups, wpr, blocks, norm)
			tpb := gemvmWarps / wpr
			blocks += (tiles + tpb - 1) / tpb
		}
		fmt.Fprintf(&gen, "}, %d, %d}, // case %d\n", blocks, gemvmWarps*256*maxPer, ci+1)
	}
	lines := runHostEmulation(t, map[string]string{"kern.inc": inc, "gen.inc": gen.String(), "emu.cpp": b.String()})
	for _, l := range lines {
		t.Log(l)
		if strings.HasPrefix(l, "FAIL") {
			t.Error(l)
		}
	}
	if len(lines) == 0 || !strings.HasPrefix(lines[len(lines)-1], "worst ") {
		t.Fatalf("emulation did not finish: %q", lines)
	}
}

// gemvmEmuMain is TestGemvMEmulated's cases (gen.inc: products with rows,
// cols, groups, wpr, first block, normalized x; the grid; the dynamic
// shared memory) and
// main: FP8 weights of block edge 128 (64 for 64 columns), x and the float64 products, each
// gemvm kernel run twice; FAIL above a relative error of 1e-5 or when the
// runs differ; then "worst <max>".
const gemvmEmuMain = `
static HcEpi g_hc;  // gemvmh_f4's second argument
static void gemvmh_f4_wrap(const GemvArgsM a) { gemvmh_f4(a, g_hc); }
static HcCol g_col;  // gemvmc_f4's
static void gemvmc_f4_wrap(const GemvArgsM a) { gemvmc_f4(a, g_col); }
struct P { int rows, cols, groups, wpr, blk0; bool norm; };
struct GCase { int n; P p[8]; unsigned grid; int smem; };
static const GCase gcases[] = {
#include "gen.inc"
};
int main() {
  double worst = 0;
  int ci = 0;
  for (const GCase &c : gcases) {
    ci++;
    std::mt19937 rng(77 + ci);
    std::normal_distribution<double> nd(0, 1);
    std::vector<Mx> ws;
    std::vector<std::vector<float>> xs, ys, nws;
    std::vector<std::vector<double>> want;
    GemvArgsM a{};
    a.n = c.n;
    for (int i = 0; i < c.n; i++) {
      const P &p = c.p[i];
      ws.push_back(fp8(rng, p.rows, p.cols, p.cols >= 128 ? 128 : 64));
    }
    for (int i = 0; i < c.n; i++) {
      const P &p = c.p[i];
      std::vector<float> x(p.groups * p.cols), nw(p.cols);
      for (auto &v : x) v = (float)(p.norm ? 3 * nd(rng) : nd(rng));
      for (auto &v : nw) v = (float)(0.5 + (rng() % 1000) / 1000.0);
      xs.push_back(x);
      nws.push_back(nw);
      ys.push_back(std::vector<float>(p.rows, NAN));
    }
    for (int i = 0; i < c.n; i++) {
      const P &p = c.p[i];
      const int blk = p.cols >= 128 ? 128 : 64, rpg = p.rows / p.groups;
      int bshift = 0;
      while ((1 << bshift) < blk) bshift++;
      std::vector<double> xd(p.groups * p.cols);
      for (size_t k = 0; k < xd.size(); k++) xd[k] = xs[i][k];
      if (p.norm) {  // RMSNorm(x)·w in float64, eps 1e-6
        double ss = 0;
        for (double v : xd) ss += v * v;
        const double inv = 1 / std::sqrt(ss / p.cols + 1e-6);
        for (int k = 0; k < p.cols; k++) xd[k] = xd[k] * inv * nws[i][k];
        a.nw[i] = nws[i].data();
        a.eps[i] = 1e-6f;
      }
      std::vector<double> w(p.rows);
      for (int r = 0; r < p.rows; r++) {
        double s = 0;
        for (int k = 0; k < p.cols; k++) s += ws[i].v[r * p.cols + k] * xd[(r / rpg) * p.cols + k];
        w[r] = s;
      }
      want.push_back(w);
      a.m[i] = GemvMatM{ws[i].W.data(), ws[i].S.data(), xs[i].data(), ys[i].data(), p.rows, p.cols, rpg, bshift, (p.cols + blk - 1) / blk, 1, p.wpr, p.blk0};
    }
    if (c.smem > (int)sizeof(g_smem_bytes)) { printf("FAIL case %d: shared memory %d over the harness's buffer\n", ci, c.smem); continue; }
    struct V { const char *name; void (*k)(const GemvArgsM); };
    const V vs[] = {{"gemvm_f1", gemvm_f1}, {"gemvm_f2", gemvm_f2}, {"gemvm_f4", gemvm_f4}};
    for (const V &v : vs) {
      for (auto &y : ys) std::fill(y.begin(), y.end(), NAN);
      launch<const GemvArgsM>(v.k, c.grid, 256, a);
      double e = 0;
      std::vector<std::vector<float>> first = ys;
      for (int i = 0; i < c.n; i++) e = max(e, maxrel(ys[i], want[i]));
      launch<const GemvArgsM>(v.k, c.grid, 256, a);
      bool same = true;
      for (int i = 0; i < c.n; i++) same = same && memcmp(first[i].data(), ys[i].data(), 4 * ys[i].size()) == 0;
      printf("%s %s case %d: max rel %.3g%s\n", (e > 1e-5 || !same) ? "FAIL" : "ok", v.name, ci, e, same ? "" : ", second run differs");
      worst = max(worst, e);
    }
    // gemvq_f2/f4 (the qat target; plain x only): y against float64 sums of
    // the weights' values times act_quant(x), formed here (E4M3 in blocks of
    // 128 columns, s = 2^ceil(log2(max(amax, 1e-4)/448)) from the float32
    // quotient, nearest code by search), within 2^-18 of Σ|w·q(x)| a row.
    bool plain = true;
    for (int i = 0; i < c.n; i++) plain = plain && !c.p[i].norm;
    if (plain) {
      std::vector<std::vector<double>> qw, qm;
      for (int i = 0; i < c.n; i++) {
        const P &p = c.p[i];
        const int rpg = p.rows / p.groups;
        std::vector<double> xq(p.groups * p.cols);
        for (int r = 0; r < p.groups; r++)
          for (int b = 0; b < p.cols; b += 128) {
            float am = 1e-4f;
            for (int k = b; k < min(b + 128, p.cols); k++) am = max(am, std::fabs(xs[i][r * p.cols + k]));
            const double sc = std::ldexp(1.0, (int)std::ceil(std::log2((double)(am / 448.f))));
            for (int k = b; k < min(b + 128, p.cols); k++) xq[r * p.cols + k] = e4m3(f2e4m3((float)(xs[i][r * p.cols + k] / sc))) * sc;
          }
        std::vector<double> w(p.rows), m(p.rows);
        for (int r = 0; r < p.rows; r++)
          for (int k = 0; k < p.cols; k++) {
            const double t = ws[i].v[r * p.cols + k] * xq[(r / rpg) * p.cols + k];
            w[r] += t;
            m[r] += std::fabs(t);
          }
        qw.push_back(w);
        qm.push_back(m);
      }
      const V qs[] = {{"gemvq_f2", gemvq_f2}, {"gemvq_f4", gemvq_f4}};
      for (const V &v : qs) {
        for (auto &y : ys) std::fill(y.begin(), y.end(), NAN);
        launch<const GemvArgsM>(v.k, c.grid, 256, a);
        double e = 0;
        for (int i = 0; i < c.n; i++)
          for (int r = 0; r < c.p[i].rows; r++) e = std::isfinite(ys[i][r]) ? max(e, std::fabs(ys[i][r] - qw[i][r]) / max(qm[i][r], 1e-300)) : INFINITY;
        printf("%s %s case %d: max error %.3g of a row's sum of magnitudes\n", e > std::ldexp(1.0, -18) ? "FAIL" : "ok", v.name, ci, e);
      }
    }
    // gemvmh_f4 (one product, one tile a block): y must be gemvm_f4's bits
    // and the boundary it begins as HcData::check says.
    if (c.n == 1 && c.p[0].wpr == 8 && c.p[0].groups == 1 && !c.p[0].norm) {
      HcData hd(c.p[0].rows, rng);
      launch<const GemvArgsM>(gemvm_f4, c.grid, 256, a);
      const std::vector<float> want4 = ys[0];
      hd.gram = true;
      g_hc = hd.args(true);
      std::fill(ys[0].begin(), ys[0].end(), NAN);
      launch<const GemvArgsM>(gemvmh_f4_wrap, c.grid, 256, a);
      const bool same = memcmp(want4.data(), ys[0].data(), 4 * want4.size()) == 0;
      int xbad;
      double pe;
      hd.check(ys[0].data(), xbad, pe);
      printf("%s gemvmh_f4 case %d: y %s gemvm_f4's bits, %d x' values off HCExpand's, partials max rel %.3g\n",
             (same && xbad == 0 && pe <= 1e-5) ? "ok" : "FAIL", ci, same ? "=" : "!=", xbad, pe);
    }
    // gemvmc_f4 (every product one-tile blocks of one row group on a plain
    // x of the same width): x is a boundary's a formed in the launch from x'
    // and the partials (HcCol; the Σx'² and Gram rows made from x' here),
    // y against W·a in float64, a = RMS(Σ_j pre_j·x'_j; w) with pre and ρ
    // from the summed partials and the RMS over a's own values.
    bool fits = true;
    for (int i = 0; i < c.n; i++) fits = fits && c.p[i].wpr == 8 && c.p[i].groups == 1 && !c.p[i].norm && c.p[i].cols == c.p[0].cols;
    if (fits) {
      const int D = c.p[0].cols, S = D / 16, nm = 24;
        std::vector<float> xs4(4 * D), part((size_t)(nm + 11) * S), base(24), scale(3), w(D);
      for (auto &v : xs4) v = (float)nd(rng);
      for (auto &v : part) v = (float)(0.3 * nd(rng) / std::sqrt((double)S));
      for (auto &v : base) v = (float)nd(rng);
      for (auto &v : scale) v = (float)nd(rng);
      for (auto &v : w) v = (float)(0.5 + (rng() % 1000) / 1000.0);
      for (int t = 0; t < S; t++) {
        double sq = 0, G[10] = {0};
        for (int i = 16 * t; i < 16 * t + 16; i++)
          for (int q = 0; q < 10; q++) {
            const double v = (double)xs4[gj[q] * D + i] * xs4[gk[q] * D + i];
            G[q] += v;
            if (gj[q] == gk[q]) sq += v;
          }
        part[nm * S + t] = (float)sq;
        for (int q = 0; q < 10; q++) part[(nm + 1 + q) * S + t] = (float)G[q];
      }
      g_col = HcCol{xs4.data(), part.data(), base.data(), scale.data(), w.data(), S, nm, D, 0, 1e-6f, 1e-6f, 1e-6f, 0.f};
      double dsum[5] = {0, 0, 0, 0, 0};
      for (int r = 0; r < 5; r++)
        for (int t = 0; t < S; t++) dsum[r] += part[(r < 4 ? r : nm) * S + t];
      const double rho = 1 / std::sqrt(dsum[4] / (4.0 * D) + 1e-6);
      double pre[4];
      for (int j = 0; j < 4; j++) pre[j] = 1 / (1 + std::exp(-(dsum[j] * rho * scale[0] + base[j]))) + 1e-6;
      std::vector<double> av(D);
      double ss = 0;
      for (int k = 0; k < D; k++) {
        av[k] = 0;
        for (int j = 0; j < 4; j++) av[k] += pre[j] * xs4[j * D + k];
        ss += av[k] * av[k];
      }
      const double inv = 1 / std::sqrt(ss / D + 1e-6);
      for (int k = 0; k < D; k++) av[k] *= inv * w[k];
      for (auto &y : ys) std::fill(y.begin(), y.end(), NAN);
      launch<const GemvArgsM>(gemvmc_f4_wrap, c.grid, 256, a);
      double e = 0;
      for (int i = 0; i < c.n; i++) {
        const P &pp = c.p[i];
        std::vector<double> wy(pp.rows);
        for (int r = 0; r < pp.rows; r++) {
          double sacc = 0;
          for (int k = 0; k < pp.cols; k++) sacc += ws[i].v[r * pp.cols + k] * av[k];
          wy[r] = sacc;
        }
        e = max(e, maxrel(ys[i], wy));
      }
      printf("%s gemvmc_f4 case %d: max rel %.3g against W·a in float64\n", e <= 1e-5 ? "ok" : "FAIL", ci, e);
      worst = max(worst, e);
    }
  }
  printf("worst %.3g\n", worst);
}
`
