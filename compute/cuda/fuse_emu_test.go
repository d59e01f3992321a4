package cuda

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestHCOneEmulated runs kernels/fuse.cu's one-kernel boundary (fuse_hc_one4
// and fuse_hc_one) on the CPU (no GPU needed): testdata/hcone_emu.cpp turns
// every CUDA thread into a std::thread with barriers for __syncthreads, the
// collapse warps' named barrier and the shuffles, runs each case twice on
// the same counters at the launch shapes fuse.go computes (V4's mix and head
// sites at the default and the one-virtual-block shape, BF16 and F32, T up
// to 6 over token groups, hc 2, 3 and 6 on the generic kernel) and compares
// x', pre, post, comb and a with its own float64 evaluation; it also fails
// when the two launches differ or a counter is left non-zero. Skipped with
// -short or without g++ (C++20).
func TestHCOneEmulated(t *testing.T) {
	if testing.Short() {
		t.Skip("emulation takes several seconds")
	}
	gxx, err := exec.LookPath("g++")
	if err != nil {
		t.Skipf("no g++: %v", err)
	}
	inc, err := hcOneEmuSource()
	if err != nil {
		t.Fatal(err)
	}
	type emuCase struct {
		name                         string
		hc, D, T                     int
		head, expand, bf16, weighted bool
		target                       int
	}
	cases := []emuCase{
		{"v4 mix T1", 4, 4096, 1, false, true, false, true, hcOneThreads},
		{"v4 mix T1 one64", 4, 4096, 1, false, true, false, true, 64},
		{"v4 head T1", 4, 4096, 1, true, true, false, true, hcOneThreads},
		{"hc4 D1024 mix T5 bf16", 4, 1024, 5, false, true, true, true, hcOneThreads},
		{"hc4 D1024 mix T3 no expand", 4, 1024, 3, false, false, false, false, 128},
		{"hc3 D100 mix T3 no expand", 3, 100, 3, false, false, false, true, hcOneThreads},
		{"hc6 D64 mix T2", 6, 64, 2, false, true, false, false, hcOneThreads},
		{"hc2 D36 head T6 bf16", 2, 36, 6, true, true, true, true, hcOneThreads},
	}
	b2i := func(b bool) int {
		if b {
			return 1
		}
		return 0
	}
	var gen strings.Builder
	gen.WriteString("static std::vector<Case> cases = {\n")
	for _, c := range cases {
		rows := (2 + c.hc) * c.hc
		if c.head {
			rows = c.hc
		}
		rb, groups, splits, cq, threads := hcSplitShape(rows, c.hc*c.D)
		v, blocks, _ := hcOneShape(groups, splits, threads, c.target)
		fmt.Fprintf(&gen, "  {%q, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d},\n", c.name, c.hc, c.D, c.T,
			b2i(c.head), b2i(c.expand), b2i(c.bf16), b2i(c.weighted), rb, groups, splits, cq, threads, v, blocks, rmsThreads(c.D))
	}
	gen.WriteString("};\n")
	harness, err := os.ReadFile("testdata/hcone_emu.cpp")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, body := range map[string]string{"kern.inc": inc, "gen.inc": gen.String(), "emu.cpp": string(harness)} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "emu")
	if out, err := exec.Command(gxx, "-std=c++20", "-O1", "-pthread", "-w", "-o", bin, filepath.Join(dir, "emu.cpp")).CombinedOutput(); err != nil {
		t.Fatalf("compiling the emulation: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).CombinedOutput()
	if err != nil {
		t.Fatalf("emulation: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(cases)+1 {
		t.Fatalf("emulation printed %d lines, want one per case and a last one:\n%s", len(lines), out)
	}
	for _, l := range lines {
		t.Log(l)
		if strings.Contains(l, "FAIL") {
			t.Error(l)
		}
	}
	last := lines[len(lines)-1]
	worst, err := strconv.ParseFloat(strings.TrimPrefix(last, "worst "), 64)
	if err != nil || !(worst <= 1e-4) {
		t.Errorf("emulation's last line %q: want worst <= 1e-4", last)
	}
}

// hcOneEmuSource returns what the emulation compiles of the fuse module:
// ops.cu's definitions that fuse_hc_one uses, then fuse.cu's fuse_hc_one
// section with its named barrier turned into a call the harness defines.
func hcOneEmuSource() (string, error) {
	ops, fuse := OpsSource(), fuseCu
	var b strings.Builder
	b.WriteString("#define MOXIE_PDL() do {} while (0)\n")
	for _, d := range []string{"HC_MAXNM", "HCS_RB", "HCS_TB", "HCS_MAXS"} {
		m := regexp.MustCompile(`(?m)^#define ` + d + ` .*$`).FindString(ops)
		if m == "" {
			return "", fmt.Errorf("ops.cu no longer defines %s; update the emulation", d)
		}
		b.WriteString(m + "\n")
	}
	for _, f := range []string{"float warp_sum(", "float sigmoidf_(", "float hc_pre_gate(", "float dot4("} {
		i := strings.Index(ops, "__device__ __forceinline__ "+f)
		if i < 0 {
			return "", fmt.Errorf("ops.cu no longer defines %s...); update the emulation", f)
		}
		end, depth := -1, 0
		for k := i; k < len(ops) && end < 0; k++ {
			switch ops[k] {
			case '{':
				depth++
			case '}':
				if depth--; depth == 0 {
					end = k + 1
				}
			}
		}
		if end < 0 {
			return "", fmt.Errorf("ops.cu: no end of %s...)", f)
		}
		b.WriteString(ops[i:end] + "\n")
	}
	i, j := strings.Index(fuse, "#define HCO_MAXDOTS"), strings.Index(fuse, "// fuse_rows:")
	if i < 0 || j < i {
		return "", fmt.Errorf("fuse.cu: fuse_hc_one's section not found; update the emulation")
	}
	sec := fuse[i:j]
	const bar = `asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory");`
	if !strings.Contains(sec, bar) {
		return "", fmt.Errorf("fuse.cu: hco_bar no longer reads %s; update the emulation", bar)
	}
	b.WriteString(strings.Replace(sec, bar, "hco_emu_bar(threads);", 1))
	return b.String(), nil
}
