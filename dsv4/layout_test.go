package dsv4

import (
	"path/filepath"
	"slices"
	"testing"

	"moxie/checkpoint"
	"moxie/format"
)

// TestPackedExpertsAsU8: a checkpoint that labels packed MXFP4 expert bytes U8
// instead of I8 loads and computes the same logits.
func TestPackedExpertsAsU8(t *testing.T) {
	gen, err := checkpoint.OpenSynth("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	aux, _ := checkpoint.AuxFiles(gen)
	tensors := gen.OutTensors()
	for i := range tensors {
		if tensors[i].DType == format.I8 {
			tensors[i].DType = format.U8
		}
	}
	dir := filepath.Join(t.TempDir(), "u8")
	if err := checkpoint.WriteDir(dir, aux, tensors, checkpoint.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	src, err := checkpoint.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if ti, _ := src.Lookup("layers.0.ffn.experts.0.w1.weight"); ti.DType != format.U8 {
		t.Fatalf("fixture stores experts as %s, want U8", ti.DType)
	}
	m, err := Load(src, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := Load(gen, Options{})
	if err != nil {
		t.Fatal(err)
	}
	toks := []int{4, 90, 17, 200, 33}
	a, err := Logits(m, toks, 3)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Logits(ref, toks, 3)
	if !slices.Equal(a, b) {
		t.Fatal("U8-labelled experts give different logits")
	}
}
