package dsv4

import (
	"os"
	"strings"
	"testing"

	"moxie/compute/cuda"
)

// TestDecodeKernelUses runs a prefill and three decode steps of synth:flash
// (4 layers: window, CSA and HCA attention) on the GPU and lists every
// kernel launched, with its registers, shared memory, resident blocks an
// SM and preferred carveout: where each one's blocks fit decides how much
// L1 the driver can leave for loads in flight (session 16 found MoE stage 1
// with ~23 KB of it). It checks that every launched kernel fits at least
// one block an SM at its last launch's shape, and that the default
// carveout rule reached MoE stage 1 on an sm_90 device (unless
// $MOXIE_CUDA_CARVE overrides it). Skipped with -short (seconds of
// synthetic weights).
func TestDecodeKernelUses(t *testing.T) {
	if testing.Short() {
		t.Skip("V4-Flash widths: seconds of synthetic weights")
	}
	m := loadDeviceModel(t, "synth:flash?layers=4&experts=8&mtp=0", Options{DeviceContext: 1024})
	defer m.Close()
	seq, err := m.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	toks := testTokens(260, m.Cfg.VocabSize, 9)
	if _, err := seq.Append(t.Context(), toks[:256]); err != nil {
		t.Fatal(err)
	}
	for _, tok := range toks[256:259] {
		if _, err := seq.Append(t.Context(), []int{tok}); err != nil {
			t.Fatal(err)
		}
	}
	var uses []cuda.KernelUse
	dev := deviceForTest(t)
	defaultCarve := os.Getenv("MOXIE_CUDA_CARVE") == "" && dev.Info().Major == 9 // the default rule applies on sm_90
	if err := dev.Do(func(c *cuda.Ctx) error {
		var err error
		uses, err = c.KernelUses()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(uses) == 0 {
		t.Fatal("no kernel launched")
	}
	t.Logf("%-36s %8s %7s %9s %5s %7s %6s %9s %6s", "kernel", "launches", "threads", "dyn smem", "regs", "static", "blk/SM", "smem/SM", "carve")
	stage1 := 0
	for _, u := range uses {
		perSM := u.BlocksPerSM * (u.StaticShared + u.DynamicShared + 1024) // 1 KB reserved a block
		t.Logf("%-36s %8d %7d %9d %5d %7d %6d %8dK %6d", u.Name, u.Launches, u.Threads, u.DynamicShared, u.Registers, u.StaticShared, u.BlocksPerSM, perSM>>10, u.Carveout)
		if u.Launches < 1 || u.Threads < 1 || u.BlocksPerSM < 1 {
			t.Errorf("%s: %d launches of %d threads, %d blocks an SM: want each at least 1", u.Name, u.Launches, u.Threads, u.BlocksPerSM)
		}
		if strings.HasPrefix(u.Name, "moe1lx") {
			stage1++
			if defaultCarve && u.Carveout != 44 {
				t.Errorf("%s: carveout %d, want the default 44", u.Name, u.Carveout)
			}
		}
	}
	if stage1 == 0 {
		t.Error("no MoE stage 1 (moe1lx) among the launched kernels: did the decode step change?")
	}
}
