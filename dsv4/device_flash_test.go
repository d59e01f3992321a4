package dsv4

import (
	"runtime"
	"testing"

	"moxie/checkpoint"
	"moxie/compute/cpu"
)

// TestDeviceFlash runs the device forward pass at V4-Flash's widths, where
// the kernels synth:tiny's toy widths never reach take over (tensor-core
// prefill GEMMs and attention, expert tiles of 64 rows, the split decode
// attention, the one-token Gemv products, the fused MoE decode), against the
// CPU session: synth:flash with 4 layers (window, CSA and HCA attention,
// hash and score routing) and 8 experts per layer; a 260-token prefill, then
// 40 decode steps through the captured graph. The two models share one
// generation of the weights.
func TestDeviceFlash(t *testing.T) {
	if testing.Short() {
		t.Skip("V4-Flash widths: seconds of synthetic weights and CPU work")
	}
	dev := deviceForTest(t)
	raw, err := checkpoint.Open("synth:flash?layers=4&experts=8&mtp=0")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	src := &cachedSource{Source: raw, m: map[string][]byte{}}
	be := cpu.New(runtime.NumCPU())
	defer be.Close()
	mc, err := Load(src, Options{Backend: be})
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	md, err := Load(src, Options{Backend: be, Device: dev, DeviceContext: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer md.Close()
	V := mc.Cfg.VocabSize
	toks := testTokens(300, V, 5)
	const pre = 260
	run := func(prefill func([]int) ([]float32, error), decode func(int) ([]float32, error)) []float32 {
		out, err := prefill(toks[:pre])
		if err != nil {
			t.Fatal(err)
		}
		for _, tok := range toks[pre:] {
			l, err := decode(tok)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, l...)
		}
		return out
	}
	cs := mc.NewSession()
	want := run(cs.Prefill, cs.Decode)
	// The defaults (each boundary begun in its producer's epilogue), then
	// with wq_a+wkv forming the attention side's output itself.
	for _, env := range []string{"", "on"} {
		t.Setenv("MOXIE_CUDA_HCCOL", env)
		ds, err := md.NewDeviceSession()
		if err != nil {
			t.Fatal(err)
		}
		got := run(ds.Prefill, ds.Decode)
		t.Log(ds.Describe())
		if ds.graph == nil {
			t.Errorf("no decode graph captured: %v", ds.graphErr)
		}
		what := "device vs CPU at V4-Flash widths"
		if env != "" {
			what += ", MOXIE_CUDA_HCCOL=" + env
		}
		compareDevice(t, what, got, want, V, 2e-4)
		if ds.epi.moe == 0 || ds.epi.woB == 0 || (env == "on") != (ds.epi.col > 0) {
			t.Errorf("%s: launches on the epilogue paths: %+v", what, ds.epi)
		}
		ds.Close()
	}
}
