package cuda

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// emuCUDAHeader is cuda_emu.h, which buildHostEmulation writes beside
// every host emulation: what all of them take of CUDA. A harness's launch
// sets gridDim, blockDim and, in each std::thread, threadIdx and blockIdx,
// and points g_block_bar (a barrier of the block's threads), g_warp_bar
// (one of 32 threads per warp) and, where a kernel uses a named barrier,
// g_named_bar at barriers it makes for each block; __shared__ variables
// are statics (one block runs at a time). module.go's preamble macros
// (MOXIE_PDL, MOXIE_PDL_PF, MOXIE_PDL_WAIT, …) are no-ops: on a GPU they wait for the
// previous kernel (and ask L2 for the kernel's weights), while an
// emulation runs one kernel at a time.
const emuCUDAHeader = `#pragma once
#include <barrier>
struct U3 { unsigned x, y, z; };
thread_local U3 threadIdx, blockIdx;
U3 blockDim, gridDim;
std::barrier<> *g_block_bar, *g_named_bar;
std::barrier<> *g_warp_bar[32];
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define MOXIE_PDL() do {} while (0)
#define MOXIE_PDL_PF(...) do {} while (0)
#define MOXIE_PDL_UNLESS(c) do {} while (0)
#define MOXIE_PDL_INSIDE() do {} while (0)
#define MOXIE_PF(...) do {} while (0)
#define MOXIE_PDL_WAIT() do {} while (0)
#define MOXIE_PDL_TRIGGER() do {} while (0)
inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
`

// buildHostEmulation writes files (name to contents; one of them emu.cpp,
// which includes the others) and cuda_emu.h (emuCUDAHeader) to a fresh
// temporary directory, compiles
// emu.cpp with g++ -O1 -w and flags, and returns the program's path. It
// skips t without g++ and fails it when the compile fails.
func buildHostEmulation(t *testing.T, files map[string]string, flags ...string) string {
	t.Helper()
	gxx, err := exec.LookPath("g++")
	if err != nil {
		t.Skipf("no g++: %v", err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "cuda_emu.h"), []byte(emuCUDAHeader), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "emu")
	args := append(append([]string{"-O1", "-w"}, flags...), "-o", bin, filepath.Join(dir, "emu.cpp"))
	if out, err := exec.Command(gxx, args...).CombinedOutput(); err != nil {
		t.Fatalf("compiling the emulation: %v\n%s", err, out)
	}
	return bin
}

// runHostEmulation compiles files as buildHostEmulation does (C++20,
// -pthread, then flags), runs the program and returns its output lines
// (stdout and stderr). It skips t with -short or without g++, fails t for
// each line that contains FAIL, and stops t when the program exits with
// an error.
func runHostEmulation(t *testing.T, files map[string]string, flags ...string) []string {
	t.Helper()
	if testing.Short() {
		t.Skip("the g++ host emulation takes seconds to a minute")
	}
	bin := buildHostEmulation(t, files, append([]string{"-std=c++20", "-pthread"}, flags...)...)
	out, err := exec.Command(bin).CombinedOutput()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	for _, l := range lines {
		if strings.Contains(l, "FAIL") {
			t.Error(l)
		}
	}
	if err != nil {
		t.Fatalf("emulation: %v\n%s", err, out)
	}
	return lines
}

// cuDefinition returns the definition in src that starts with head (through
// its balanced closing brace), for the emulation harnesses that compile
// single functions of a kernel source.
func cuDefinition(src, head string) (string, error) {
	i := strings.Index(src, head)
	if i < 0 {
		return "", fmt.Errorf("no %q", head)
	}
	depth := 0
	for k := i; k < len(src); k++ {
		switch src[k] {
		case '{':
			depth++
		case '}':
			if depth--; depth == 0 {
				return src[i : k+1], nil
			}
		}
	}
	return "", fmt.Errorf("no end of %q", head)
}
