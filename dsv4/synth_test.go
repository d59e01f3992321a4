package dsv4

import (
	"testing"

	"moxie/checkpoint"
	"moxie/compute/cpu"
)

// TestSynthTiny runs the forward pass on the shared synthetic tiny checkpoint
// (the one the golden files are made from): logits finite and not degenerate,
// and prefill/chunked/decode agreement over 40 tokens (window 8).
func TestSynthTiny(t *testing.T) {
	src, err := checkpoint.Open("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	m, err := Load(src, Options{Backend: cpu.New(2)})
	if err != nil {
		t.Fatal(err)
	}
	V := m.Cfg.VocabSize
	toks := testTokens(40, V, 11)
	full, err := m.NewSession().PrefillAll(toks)
	if err != nil {
		t.Fatal(err)
	}
	checkRows(t, "synth:tiny", full, V)
	mixed, err := Logits(m, toks, 17)
	if err != nil {
		t.Fatal(err)
	}
	for i := range toks {
		a, b := mixed[i*V:(i+1)*V], full[i*V:(i+1)*V]
		if r := maxRel(a, b); r > 1e-5 {
			t.Errorf("position %d: prefill 17 + decode differs from full prefill by %.3g", i, r)
		}
		if argmax(a) != argmax(b) {
			t.Errorf("position %d: argmax %d vs %d", i, argmax(a), argmax(b))
		}
	}
}
