package cuda

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"moxie/compute"
)

// TestLinearModuleSources checks the split of kernels/linear.cu into the
// default and benchmark modules.
func TestLinearModuleSources(t *testing.T) {
	def, bench, err := LinearModuleSources()
	if err != nil {
		t.Fatal(err)
	}
	tcs, err := LinearTCSource()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, src string
		want      []string
		notWant   []string
	}{
		{"default", def, []string{"struct LinArgs", "LIN_NB(fp8, FMT_FP8, 2, 4, 0, _d0)", "LINV_U(LINV, fp8, FMT_FP8, 1, 0, 0)", "void spin(", "void read_bw4(", "LINTC3(64, 32, 2, 2, 4, 1)", "LINTM(mxfp4, FMT_MXFP4, 128, 64, 4, 2, 4, 1)", "LINTM(fp8, FMT_FP8, 128, 64, 4, 2, 4, 1)"}, []string{"LINV_U(LINV, fp8, FMT_FP8, 2, 0, 0)", "LINTC1(128, 128, 2, 4, 3, 1)", "LINTC1(256, 64, 8, 2, 4, 1)"}},
		{"bench", bench, []string{"struct LinArgs", "LINV_U(LINV, fp8, FMT_FP8, 2, 0, 0)", "LINW_NB(fp8"}, []string{"void spin(", "LIN_NB(fp8, FMT_FP8, 2, 4, 0, _d0)", "LINV_U(LINV, fp8, FMT_FP8, 1, 0, 0)", "LINTC1(128, 128, 2, 4, 3, 1)"}},
		{"tc", tcs, []string{"struct LinArgs", "tc_gemm", "LINTC1(128, 128, 2, 4, 3, 1)", "LINTC1(256, 64, 8, 2, 4, 1)"}, []string{"void spin(", "LIN_NB(fp8, FMT_FP8", "LINV_U(LINV, fp8, FMT_FP8, 2", "LINTC3(64, 32, 2, 2, 4, 1)", "LINTM(mxfp4, FMT_MXFP4, 128, 64, 4, 2, 4, 1)"}},
	} {
		checkModuleSource(t, tc.name, tc.src, tc.want, tc.notWant)
	}
	if len(def)+len(bench)+len(tcs) <= len(linearSrc)/2 {
		t.Errorf("module sources (%d + %d bytes) miss most of linear.cu (%d bytes)", len(def), len(bench), len(linearSrc))
	}
}

// plannedKernels lists, per module that must hold them, the kernels that
// planLinear and planMulti choose: for the default variant at every batch
// tile and shape class (these must be in the default module), and for the
// variants the tests and benchmarks ask for (default or benchmark module).
func plannedKernels(t *testing.T) (def, any map[string]string) {
	def, any = map[string]string{}, map[string]string{}
	type shape struct {
		rows, cols, block, groups int
	}
	shapes := []shape{
		{32768, 1024, 128, 1}, {4096, 8192, 128, 1}, {2048, 4096, 128, 1}, {4096, 2048, 128, 1}, {129280, 4096, 128, 1},
		{257, 2176, 128, 1}, {256, 640, 128, 4}, {129, 2056, 128, 1}, {130, 4100, 128, 1}, {33, 50, 128, 1},
		{40, 130, 128, 1}, {100, 480, 96, 1}, {66, 2080, 128, 1}, {34, 2064, 128, 1}, {6, 1024, 128, 2}, {8, 64, 128, 8},
	}
	formats := []compute.Format{compute.FP8Block, compute.MXFP4, compute.MXFP8, compute.BF16, compute.F32}
	add := func(m map[string]string, name, why string) {
		if _, ok := m[name]; !ok {
			m[name] = why
		}
	}
	variants := slices.Concat(testLinearVariants(), benchVariantList())
	for _, f := range formats {
		for _, sh := range shapes {
			for nb := 1; nb <= maxNB; nb++ {
				why := fmt.Sprintf("%v [%d, %d] block %d groups %d batch %d", f, sh.rows, sh.cols, sh.block, sh.groups, nb)
				p, err := planLinear(f, sh.rows, sh.cols, sh.block, sh.groups, nb, LinearVariant{}, 132, 232448)
				if err != nil {
					t.Fatalf("%s, default variant: %v", why, err)
				}
				add(def, p.name, why)
				for _, v := range variants {
					if !variantApplies(v.v, f, nb) {
						continue
					}
					p, err := planLinear(f, sh.rows, sh.cols, sh.block, sh.groups, nb, v.v, 132, 232448)
					if err != nil {
						if v.v.RB == 4 && sh.groups > 1 {
							continue // RB 4 needs rows per group divisible by 4
						}
						t.Fatalf("%s, variant %s: %v", why, v.name, err)
					}
					add(any, p.name, why+", variant "+v.name)
				}
			}
		}
	}
	// Tensor-core GEMMs: the automatic choice at prefill batches (default
	// module) and every tile (either module), single and multi.
	tcShapes := slices.Concat(shapes, []shape{{1024, 4096, 128, 1}, {8192, 4096, 128, 8}, {512, 4096, 128, 1}, {256, 4096, 128, 1}, {100, 512, 64, 1}})
	for _, f := range []compute.Format{compute.FP8Block, compute.MXFP4, compute.BF16} {
		for _, sh := range tcShapes {
			for _, nb := range []int{16, 33, 64, 300, 1024, 4096} {
				why := fmt.Sprintf("%v [%d, %d] block %d groups %d batch %d", f, sh.rows, sh.cols, sh.block, sh.groups, nb)
				if p, ok, err := planTC(f, sh.rows, sh.cols, sh.block, sh.groups, nb, LinearVariant{}, 132, 232448); err != nil {
					t.Fatalf("%s, tc: %v", why, err)
				} else if ok {
					add(def, p.name, why+", tc auto")
				}
				for _, v := range tcTestVariants() {
					if p, ok, err := planTC(f, sh.rows, sh.cols, sh.block, sh.groups, nb, v.v, 132, 232448); err != nil {
						t.Fatalf("%s, %s: %v", why, v.name, err)
					} else if ok {
						add(any, p.name, why+", "+v.name)
					}
				}
				shs := [][2]int{{sh.rows, sh.cols}, {sh.rows / 2, sh.cols}}
				if p, ok, err := planMultiTC(f, shs, sh.block, nb, LinearVariant{}, 132, 232448); err != nil {
					t.Fatalf("multi %s: %v", why, err)
				} else if ok {
					add(def, p.name, "multi "+why+", tc auto")
				}
				for _, v := range tcTestVariants() {
					if p, ok, err := planMultiTC(f, shs, sh.block, nb, v.v, 132, 232448); err != nil {
						t.Fatalf("multi %s, %s: %v", why, v.name, err)
					} else if ok {
						add(any, p.name, "multi "+why+", "+v.name)
					}
				}
			}
		}
	}
	// The expert tiles' automatic modes (PrepareExpertTiles) at the V4-Flash
	// expert shapes: default module.
	for _, f := range []compute.Format{compute.FP8Block, compute.MXFP4, compute.BF16} {
		for _, shs := range [][][2]int{{{2048, 4096}, {2048, 4096}}, {{4096, 2048}}} {
			for _, m := range autoExpertModes {
				p, ok, err := planMultiTC(f, shs, 128, m.Rows, LinearVariant{Width: WidthTC, Tile: m.Tile}, 132, 232448)
				if err != nil || !ok {
					t.Fatalf("expert mode %+v, %v %v: ok %v, %v", m, f, shs, ok, err)
				}
				add(def, p.name, fmt.Sprintf("expert tiles, automatic mode %+v, %v %v", m, f, shs))
			}
		}
	}
	for _, set := range multiTestSets() {
		for nb := 1; nb <= maxNB; nb++ {
			why := fmt.Sprintf("multi %v %v batch %d", set.f, set.shape, nb)
			p, _, err := planMulti(set.f, set.shape, 128, nb, LinearVariant{}, 132, 232448)
			if err != nil {
				t.Fatalf("%s: %v", why, err)
			}
			add(def, p.name, why)
			for _, v := range multiVariantList() {
				if !multiVariantApplies(v.v, set.f, nb) {
					continue
				}
				p, _, err := planMulti(set.f, set.shape, 128, nb, v.v, 132, 232448)
				if err != nil {
					t.Fatalf("%s, variant %s: %v", why, v.name, err)
				}
				add(any, p.name, why+", variant "+v.name)
			}
		}
	}
	return def, any
}

// TestLinearCompile compiles the linear modules for sm_90
// (compileModuleForTest: no GPU needed, skipped without NVRTC) and
// checks that every kernel the planners can choose exists in the module it
// must come from, and that no kernel is defined by both modules. The
// benchmark module (the slow one) is skipped in -short mode.
func TestLinearCompile(t *testing.T) {
	def, bench, err := LinearModuleSources()
	if err != nil {
		t.Fatal(err)
	}
	compile := func(name, src string) map[string]bool {
		syms := kernelSymbols(t, compileModuleForTest(t, name, src))
		t.Logf("%s module: %d kernels", name, len(syms))
		return syms
	}
	wantDef, wantAny := plannedKernels(t)
	defSyms := compile("linear", def)
	for name, why := range wantDef {
		if !defSyms[name] {
			t.Errorf("default module lacks %s (default variant, %s)", name, why)
		}
	}
	if testing.Short() && os.Getenv("MOXIE_COMPILE_BENCH") == "" {
		t.Log("-short: benchmark module not compiled (set MOXIE_COMPILE_BENCH=1)")
		return
	}
	tcs, err := LinearTCSource()
	if err != nil {
		t.Fatal(err)
	}
	tcSyms := compile("linear_tc", tcs)
	benchSyms := compile("linear_bench", bench)
	for name := range benchSyms {
		if defSyms[name] || tcSyms[name] {
			t.Errorf("kernel %s is in two modules", name)
		}
		if strings.HasPrefix(name, "lint") {
			t.Errorf("tensor-core kernel %s is in the benchmark module (linKernel looks for it in linear_tc)", name)
		}
	}
	for name := range tcSyms {
		if defSyms[name] {
			t.Errorf("kernel %s is in two modules", name)
		}
		if !strings.HasPrefix(name, "lint") {
			t.Errorf("kernel %s is in the tensor-core module (linKernel looks for it in linear_bench)", name)
		}
	}
	for name, why := range wantAny {
		if !defSyms[name] && !benchSyms[name] && !tcSyms[name] {
			t.Errorf("no module has %s (%s)", name, why)
		}
	}
}

// TestSplitLinearSource checks the section split on small texts, bad ones
// included.
func TestSplitLinearSource(t *testing.T) {
	cases := []struct {
		name, src      string
		def, bench, tc string
		err            string
	}{
		{"ok", "head\n//@module common\nC\n//@module linear\nL\n//@module bench\nB\n//@module tc\nT\n", "C\nL\n", "C\nB\n", "C\nT\n", ""},
		{"order", "//@module bench\nB\n//@module tc\nT\n//@module common\nC\n//@module linear\nL", "C\nL", "C\nB\n", "C\nT\n", ""},
		{"missing bench", "//@module common\nC\n//@module linear\nL\n//@module tc\nT\n", "", "", "", `lacks its "bench" section`},
		{"missing tc", "//@module common\nC\n//@module linear\nL\n//@module bench\nB\n", "", "", "", `lacks its "tc" section`},
		{"duplicate", "//@module common\nC\n//@module linear\nL\n//@module bench\nB\n//@module linear\nL2\n", "", "", "", `two "linear" sections`},
		{"unknown", "//@module common\n//@module extra\n", "", "", "", `unknown section "extra"`},
		{"none", "just code\n", "", "", "", `lacks its "common" section`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			def, bench, tcs, err := splitLinearSource(tc.src)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if def != tc.def || bench != tc.bench || tcs != tc.tc {
				t.Fatalf("split = %q, %q, %q; want %q, %q, %q", def, bench, tcs, tc.def, tc.bench, tc.tc)
			}
		})
	}
}

// TestPlanLinear checks the kernel and launch shape the planners choose for
// the documented cases (132 SMs).
func TestPlanLinear(t *testing.T) {
	V := WidthVec
	cases := []struct {
		name                      string
		f                         compute.Format
		rows, cols, block, groups int
		nb                        int
		v                         LinearVariant
		kernel                    string
		grid, threads             uint32
	}{
		// Default: the vec family for batch 1 over rows of at most vecAutoCols, else narrow.
		{"wq_b default", compute.FP8Block, 32768, 1024, 128, 1, 1, LinearVariant{}, "linv_fp8_b1_r4_u2_d0_h0", 264, 256},
		{"wo_b default", compute.FP8Block, 4096, 8192, 128, 1, 1, LinearVariant{}, "linear_fp8_b1_r2_u4_d0", 2048, 0},
		{"wq_b default batch 2", compute.FP8Block, 32768, 1024, 128, 1, 2, LinearVariant{}, "linear_fp8_b2_r2_u4_d0", 16384, 0},
		{"odd rows one group", compute.MXFP4, 129, 4096, 128, 1, 1, LinearVariant{}, "linear_mxfp4_b1_r2_u4_d0", 65, 0},
		{"odd rows per group", compute.FP8Block, 6, 1024, 128, 2, 1, LinearVariant{}, "linear_generic", 1, 256},
		{"batch 3 tile 4", compute.BF16, 64, 768, 128, 1, 3, LinearVariant{}, "linear_bf16_b4_r2_u4_d0", 32, 0},
		{"non-pow2 block", compute.FP8Block, 100, 480, 96, 1, 1, LinearVariant{}, "linear_generic", 13, 256},
		{"vec wq_b", compute.FP8Block, 32768, 1024, 128, 1, 1, LinearVariant{Width: V}, "linv_fp8_b1_r4_u2_d0_h0", 264, 256},
		{"vec wo_b", compute.FP8Block, 4096, 8192, 128, 1, 1, LinearVariant{Width: V}, "linv_fp8_b1_r1_u8_d0_h0", 264, 256},
		{"vec w1", compute.MXFP4, 2048, 4096, 128, 1, 4, LinearVariant{Width: V}, "linv_mxfp4_b4_r2_u4_d0_h0", 128, 256},
		{"vec w2 bits", compute.MXFP4, 4096, 2048, 128, 1, 1, LinearVariant{Width: V, Decode: DecodeBits}, "linv_mxfp4_b1_r4_u2_d1_h0", 128, 256},
		{"vec hint blocks 4", compute.FP8Block, 32768, 1024, 128, 1, 1, LinearVariant{Width: V, Hint: 1, Blocks: 4}, "linv_fp8_b1_r4_u2_d0_h1", 528, 256},
		{"vec batch 8 falls back", compute.FP8Block, 4096, 8192, 128, 1, 8, LinearVariant{Width: V}, "linear_fp8_b8_r2_u4_d0", 2048, 0},
		{"vec unaligned cols", compute.MXFP4, 64, 2056, 128, 1, 1, LinearVariant{Width: V}, "linear_mxfp4_b1_r2_u4_d0", 32, 0},
		{"vec grouped", compute.FP8Block, 256, 640, 128, 4, 2, LinearVariant{Width: V}, "linv_fp8_b2_r4_u2_d0_h0", 8, 256},
		{"vec grouped odd", compute.FP8Block, 6, 1024, 128, 2, 1, LinearVariant{Width: V}, "linear_generic", 1, 256},
		{"mma wq_b", compute.FP8Block, 32768, 1024, 128, 1, 1, LinearVariant{Width: WidthMMA}, "linm_fp8_b1_u4", 256, 256},
		{"mma w1 batch 3", compute.MXFP4, 2048, 4096, 128, 1, 3, LinearVariant{Width: WidthMMA}, "linm_mxfp4_b4_u8", 128, 256},
		{"mma wo_b batch 4", compute.FP8Block, 4096, 8192, 128, 1, 4, LinearVariant{Width: WidthMMA}, "linm_fp8_b4_u4", 128, 256},
		{"mma wo_b", compute.FP8Block, 4096, 8192, 128, 1, 1, LinearVariant{Width: WidthMMA}, "linm_fp8_b1_u4", 256, 256},
		{"mma block 32 falls back", compute.FP8Block, 256, 1024, 32, 1, 1, LinearVariant{Width: WidthMMA}, "linear_fp8_b1_r2_u4_d0", 128, 0},
		{"mma grouped falls back", compute.MXFP4, 256, 1024, 128, 2, 1, LinearVariant{Width: WidthMMA}, "linear_mxfp4_b1_r2_u4_d0", 128, 0},
		{"wide r4", compute.MXFP4, 2048, 4096, 128, 1, 1, LinearVariant{Width: WidthWide, RB: 4}, "linw_mxfp4_b1_r4_u2_d0", 512, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := planLinear(tc.f, tc.rows, tc.cols, tc.block, tc.groups, tc.nb, tc.v, 132, 232448)
			if err != nil {
				t.Fatal(err)
			}
			if p.name != tc.kernel || p.grid.X != tc.grid || tc.threads != 0 && p.block.X != tc.threads {
				t.Fatalf("plan %s grid %d block %d; want %s grid %d block %d", p.name, p.grid.X, p.block.X, tc.kernel, tc.grid, tc.threads)
			}
			if p.block.X == 0 || p.block.X > 256 || p.block.X%32 != 0 {
				t.Fatalf("block of %d threads", p.block.X)
			}
		})
	}
	// Warps per tensor-core tile: one for the 2048 tiles of wq_b, all eight
	// for the 256 of wo_b at batch 1 (two blocks an SM), four at batch 4
	// (131 KB of staged x: one block an SM).
	for _, tc := range []struct {
		rows, cols, nb int
		ks             int32
	}{{32768, 1024, 1, 1}, {4096, 8192, 1, 8}, {4096, 8192, 4, 4}} {
		p, err := planLinear(compute.FP8Block, tc.rows, tc.cols, 128, 1, tc.nb, LinearVariant{Width: WidthMMA}, 132, 232448)
		if err != nil || p.ks != tc.ks {
			t.Errorf("[%d, %d] batch %d: ks %d (%v), want %d", tc.rows, tc.cols, tc.nb, p.ks, err, tc.ks)
		}
	}
	for _, bad := range []LinearVariant{{Width: V, U: 3}, {Width: V, U: 2, RB: 2}} {
		if _, err := planLinear(compute.FP8Block, 256, 1024, 128, 1, 1, bad, 132, 232448); err == nil {
			t.Errorf("variant %+v accepted", bad)
		}
	}
	if _, err := planLinear(compute.Format(99), 8, 64, 128, 1, 1, LinearVariant{}, 132, 232448); err == nil {
		t.Error("unknown format accepted")
	}

	// Multi: 12 expert matrices; the vec grid covers the chip, capped by tiles.
	w13 := make([][2]int, 12)
	for i := range w13 {
		w13[i] = [2]int{2048, 4096}
	}
	p, vec, err := planMulti(compute.MXFP4, w13, 128, 1, LinearVariant{Width: V}, 132, 232448)
	if err != nil || !vec || p.name != "linvmulti_mxfp4_b1_r2_u4_d0_h0" || p.grid.X != 264 || p.block.X != 256 {
		t.Errorf("vec multi plan %+v vec %v err %v", p, vec, err)
	}
	p, vec, err = planMulti(compute.MXFP4, w13, 128, 1, LinearVariant{}, 132, 232448)
	if err != nil || vec || p.name != "linmulti_mxfp4_b1_r2_u4_d0" || p.grid.X != 1024 || p.grid.Y != 12 {
		t.Errorf("default multi plan %+v vec %v err %v", p, vec, err)
	}
	p, vec, err = planMulti(compute.MXFP4, w13, 128, 1, LinearVariant{Width: WidthMMA}, 132, 232448)
	if err != nil || vec || p.name != "linmmulti_mxfp4_b1_u8" || p.grid.X != 16 || p.grid.Y != 12 || p.shared != 2*(4096+8)*2 {
		t.Errorf("mma multi plan %+v vec %v err %v", p, vec, err)
	}
	if _, _, err := planMulti(compute.MXFP4, [][2]int{{3, 64}}, 128, 1, LinearVariant{}, 132, 232448); err == nil {
		t.Error("odd rows accepted in a multi set")
	}
	if _, _, err := planMulti(compute.MXFP8, w13, 128, 1, LinearVariant{}, 132, 232448); err == nil {
		t.Error("MXFP8 multi set accepted")
	}
}

// TestPlanTC checks when the tensor-core GEMM family is chosen and its
// launch shapes (132 SMs, 227 KB of opt-in shared memory).
func TestPlanTC(t *testing.T) {
	const sms, optin = 132, 232448
	cases := []struct {
		name                      string
		f                         compute.Format
		rows, cols, block, groups int
		batch                     int
		v                         LinearVariant
		kernel                    string // "" when the family does not take the shape
		gx, gy, threads           uint32
		shared                    int
	}{
		{"fp8 4096 batch 1024", compute.FP8Block, 4096, 4096, 128, 1, 1024, LinearVariant{}, "lint_fp8_128x64_w4x2_s4_o1", 32, 16, 256, 4*(128*64+256*64) + 8*32},
		{"wo_b batch 64: few 128-row tiles", compute.FP8Block, 4096, 8192, 128, 1, 64, LinearVariant{}, "lint_fp8_64x32_w2x2_s4_o1", 64, 2, 128, 4*(64*64+256*32) + 4*64},
		{"wq_b batch 64", compute.FP8Block, 32768, 1024, 128, 1, 64, LinearVariant{}, "lint_fp8_128x64_w4x2_s4_o1", 256, 1, 256, 4*(128*64+256*64) + 8*8},
		{"batch 33", compute.MXFP4, 2048, 4096, 128, 1, 33, LinearVariant{}, "lint_mxfp4_64x32_w2x2_s4_o1", 32, 2, 128, 4*(64*32+256*32) + 64*128},
		{"bf16 gate", compute.BF16, 256, 4096, 128, 1, 300, LinearVariant{}, "lint_bf16_64x32_w2x2_s4_o1", 4, 10, 128, 4 * (64*128 + 256*32)},
		{"wo_a grouped", compute.FP8Block, 8192, 4096, 128, 8, 256, LinearVariant{}, "lint_fp8_128x64_w4x2_s4_o1", 64, 4, 256, 4*(128*64+256*64) + 8*32},
		{"tile 3", compute.FP8Block, 4096, 4096, 128, 1, 16, LinearVariant{Width: WidthTC, Tile: 3}, "lint_fp8_128x128_w2x4_s3_o1", 32, 1, 256, 3*(128*64+256*128) + 8*32},
		{"tile alone", compute.MXFP4, 4096, 2048, 128, 1, 5, LinearVariant{Tile: 8}, "lint_mxfp4_256x64_w4x2_s3_o1", 16, 1, 256, 3*(256*32+256*64) + 256*64},
		{"grouped rows per group < tile", compute.FP8Block, 256, 640, 128, 4, 33, LinearVariant{Width: WidthTC, Tile: 1}, "", 0, 0, 0, 0},
		{"grouped rows per group = tile", compute.FP8Block, 256, 640, 128, 4, 33, LinearVariant{Width: WidthTC, Tile: 2}, "lint_fp8_64x32_w2x2_s4_o1", 4, 2, 128, 4*(64*64+256*32) + 32},
		{"mxfp4 cols not a multiple of 128", compute.MXFP4, 256, 2112, 128, 1, 64, LinearVariant{}, "", 0, 0, 0, 0},
		{"fp8 block 32", compute.FP8Block, 256, 1024, 32, 1, 64, LinearVariant{}, "", 0, 0, 0, 0},
		{"fp8 block 64", compute.FP8Block, 100, 512, 64, 1, 64, LinearVariant{}, "lint_fp8_64x32_w2x2_s4_o1", 2, 2, 128, 4*(64*64+256*32) + 4*8},
		{"f32", compute.F32, 256, 1024, 128, 1, 64, LinearVariant{}, "", 0, 0, 0, 0},
		{"split-K", compute.FP8Block, 4096, 8192, 128, 1, 64, LinearVariant{Tile: 2, SplitK: 4}, "lint_fp8_64x32_w2x2_s4_o1_k", 64, 2, 128, 4*(64*64+256*32) + 4*64},
		{"x split once", compute.MXFP4, 2048, 4096, 128, 1, 256, LinearVariant{Tile: 13}, "lint_mxfp4_128x128_w2x4_s4_o1_x", 16, 2, 256, 4*(128*32+256*128) + 128*128},
		{"x split once: not bf16", compute.BF16, 2048, 4096, 128, 1, 256, LinearVariant{Tile: 11}, "", 0, 0, 0, 0},
		{"too much shared", compute.MXFP4, 256, 65536, 128, 1, 64, LinearVariant{Width: WidthTC, Tile: 8}, "", 0, 0, 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, ok, err := planTC(tc.f, tc.rows, tc.cols, tc.block, tc.groups, tc.batch, tc.v, sms, optin)
			if err != nil {
				t.Fatal(err)
			}
			if tc.kernel == "" {
				if ok {
					t.Fatalf("planned %s for a shape the family does not take", p.name)
				}
				return
			}
			if !ok || p.name != tc.kernel || p.grid.X != tc.gx || p.grid.Y != tc.gy || p.block.X != tc.threads || p.shared != tc.shared {
				t.Fatalf("plan %+v ok %v; want %s grid %dx%d block %d shared %d", p, ok, tc.kernel, tc.gx, tc.gy, tc.threads, tc.shared)
			}
		})
	}
	for _, bad := range []LinearVariant{{Width: WidthTC, Tile: len(tcTileList()) + 1}, {Tile: 3, SplitK: 2}, {Tile: 1, SplitK: 33}} {
		if _, _, err := planTC(compute.FP8Block, 256, 1024, 128, 1, 64, bad, sms, optin); err == nil {
			t.Errorf("variant %+v accepted", bad)
		}
	}
	if p, _, _ := planTC(compute.FP8Block, 4096, 8192, 128, 1, 64, LinearVariant{Tile: 1, SplitK: 4}, sms, optin); p.grid.Z != 4 || !p.split {
		t.Errorf("split-K plan %+v", p)
	}
	for _, tc := range []struct {
		v     LinearVariant
		batch int
		want  bool
	}{
		{LinearVariant{}, 16, true}, {LinearVariant{}, 15, false}, {LinearVariant{Width: WidthTC}, 1, true},
		{LinearVariant{Tile: 2}, 3, true}, {LinearVariant{Width: WidthNarrow}, 64, false}, {LinearVariant{KW: 8}, 64, false},
		{LinearVariant{Width: WidthMMA, Tile: 1}, 64, false}, {LinearVariant{SplitK: 2}, 1, true},
	} {
		if got := tcWanted(tc.v, tc.batch); got != tc.want {
			t.Errorf("tcWanted(%+v, %d) = %v, want %v", tc.v, tc.batch, got, tc.want)
		}
	}
	// Multi launches (expert tiles): 64x32 tiles, one grid layer per record.
	w13 := [][2]int{{2048, 4096}, {2048, 4096}, {2048, 4096}}
	p, ok, err := planMultiTC(compute.MXFP4, w13, 128, 64, LinearVariant{}, sms, optin)
	if err != nil || !ok || p.name != "lintmulti_mxfp4_64x32_w2x2_s4_o1" || p.grid != (Dim3{X: 32, Y: 2, Z: 3}) || p.shared != 4*(64*32+256*32)+64*128 {
		t.Errorf("multi plan %+v ok %v err %v", p, ok, err)
	}
	if _, ok, _ := planMultiTC(compute.MXFP4, [][2]int{{2048, 4096}, {64, 2080}}, 128, 64, LinearVariant{}, sms, optin); ok {
		t.Error("multi plan with a 2080-column MXFP4 weight accepted")
	}
	// The automatic multi tile: 128x64 from multiBigRows rows per record
	// when its blocks fill the chip (FP8 and MXFP4), else 64x32; explicit
	// tiles a format has no multi kernel of mean 64x32.
	rep := func(sh [2]int, n int) [][2]int {
		out := make([][2]int, n)
		for i := range out {
			out[i] = sh
		}
		return out
	}
	for _, mc := range []struct {
		name       string
		f          compute.Format
		shapes     [][2]int
		batch      int
		v          LinearVariant
		kernel     string
		gx, gy, gz uint32
	}{
		{"expert records of 64 rows", compute.MXFP4, rep([2]int{2048, 4096}, 480), 64, LinearVariant{}, "lintmulti_mxfp4_128x64_w4x2_s4_o1", 16, 1, 480},
		{"expert records of 39 rows", compute.MXFP4, rep([2]int{2048, 4096}, 480), 39, LinearVariant{}, "lintmulti_mxfp4_64x32_w2x2_s4_o1", 32, 2, 480},
		{"expert records, tile 2", compute.MXFP4, rep([2]int{4096, 2048}, 240), 64, LinearVariant{Width: WidthTC, Tile: 2}, "lintmulti_mxfp4_64x32_w2x2_s4_o1", 64, 2, 240},
		{"expert records, tile 16", compute.MXFP4, rep([2]int{4096, 2048}, 240), 256, LinearVariant{Width: WidthTC, Tile: 16}, "lintmulti_mxfp4_256x64_w8x2_s4_o1", 16, 4, 240},
		{"expert records, tile 17", compute.MXFP4, rep([2]int{2048, 4096}, 480), 128, LinearVariant{Width: WidthTC, Tile: 17}, "lintmulti_mxfp4_256x32_w8x1_s4_o1", 8, 4, 480},
		{"fp8 shared expert w1, w3", compute.FP8Block, rep([2]int{2048, 4096}, 2), 2048, LinearVariant{}, "lintmulti_fp8_128x64_w4x2_s4_o1", 16, 32, 2},
		{"fp8 tile 3 falls back", compute.FP8Block, rep([2]int{2048, 4096}, 2), 2048, LinearVariant{Width: WidthTC, Tile: 3}, "lintmulti_fp8_64x32_w2x2_s4_o1", 32, 64, 2},
		{"bf16 set", compute.BF16, rep([2]int{2048, 4096}, 2), 2048, LinearVariant{}, "lintmulti_bf16_64x32_w2x2_s4_o1", 32, 64, 2},
	} {
		p, ok, err := planMultiTC(mc.f, mc.shapes, 128, mc.batch, mc.v, sms, optin)
		if err != nil || !ok || p.name != mc.kernel || p.grid != (Dim3{X: mc.gx, Y: mc.gy, Z: mc.gz}) {
			t.Errorf("%s: plan %+v ok %v err %v, want %s grid (%d, %d, %d)", mc.name, p, ok, err, mc.kernel, mc.gx, mc.gy, mc.gz)
		}
	}
}

// checkModuleSource fails t for each of want that the named module's
// source lacks and each of notWant that it contains.
func checkModuleSource(t *testing.T, name, src string, want, notWant []string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(src, w) {
			t.Errorf("%s module source lacks %q", name, w)
		}
	}
	for _, w := range notWant {
		if strings.Contains(src, w) {
			t.Errorf("%s module source contains %q", name, w)
		}
	}
}
