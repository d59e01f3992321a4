package dsv4

import (
	"path/filepath"
	"slices"
	"testing"

	"moxie/checkpoint"
	"moxie/dsv4/config"
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
	var tensors []checkpoint.OutTensor
	for _, lt := range config.Layout(gen.Config()) {
		dt := lt.DType
		if dt == format.I8 {
			dt = format.U8
		}
		tensors = append(tensors, checkpoint.OutTensor{Name: lt.Name, DType: dt, Shape: lt.Shape,
			Data: func() ([]byte, error) { return gen.TensorData(lt.Name) }})
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
