package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// emuPDLNoops defines module.go's preamble macros MOXIE_PDL and
// MOXIE_PDL_PF as no-ops for the host emulations: on a GPU they wait for
// the previous kernel (and ask L2 for the kernel's weights); an emulation
// runs one kernel at a time.
const emuPDLNoops = "#define MOXIE_PDL() do {} while (0)\n#define MOXIE_PDL_PF(...) do {} while (0)\n"

// buildHostEmulation writes files (name to contents; one of them emu.cpp,
// which includes the others) to a fresh temporary directory, compiles
// emu.cpp with g++ -O1 -w and flags, and returns the program's path. It
// skips t without g++ and fails it when the compile fails.
func buildHostEmulation(t *testing.T, files map[string]string, flags ...string) string {
	t.Helper()
	gxx, err := exec.LookPath("g++")
	if err != nil {
		t.Skipf("no g++: %v", err)
	}
	dir := t.TempDir()
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
