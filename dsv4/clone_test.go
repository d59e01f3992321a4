package dsv4

import (
	"slices"
	"testing"

	"moxie/dsv4/config"
)

// TestSessionClone: a clone continues exactly as the original would have
// (the same logits, bit for bit, as a fresh session fed the same chunks),
// and the two are independent: appending to one leaves the other's
// continuation unchanged. 70 tokens: past synth:tiny's window and several
// closes of each compressor, so every cache has content when cloned.
func TestSessionClone(t *testing.T) {
	m := loadTiny(t, newMemSource(config.Tiny(), 1))
	V := m.Cfg.VocabSize
	toks := testTokens(90, V, 5)
	a, b, c := toks[:70], toks[70:80], toks[80:90]
	// run feeds chunks to s: a prefill, then one decode step per token.
	run := func(s *Session, chunks ...[]int) []float32 {
		t.Helper()
		var out []float32
		for _, ch := range chunks {
			for i, tk := range ch {
				if i == 0 && len(ch) > 1 {
					l, err := s.Prefill(ch)
					if err != nil {
						t.Fatal(err)
					}
					out = append(out, l...)
					break
				}
				l, err := s.Decode(tk)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, l...)
			}
		}
		return out
	}
	wantB := run(m.NewSession(), a, b)[V:] // the logits after a, then b's
	wantC := run(m.NewSession(), a, c)[V:]
	orig := m.NewSession()
	run(orig, a)
	cl, err := orig.Clone()
	if err != nil {
		t.Fatal(err)
	}
	if cl.Len() != 70 {
		t.Fatalf("clone at position %d, want 70", cl.Len())
	}
	gotC := run(orig, c) // the original moves on first...
	gotB := run(cl, b)   // ...and the clone still continues from 70
	if !slices.Equal(gotB, wantB) {
		t.Errorf("the clone's continuation differs from a fresh session's (max rel %.3g)", maxRel(gotB, wantB))
	}
	if !slices.Equal(gotC, wantC) {
		t.Errorf("the original's continuation after cloning differs from a fresh session's (max rel %.3g)", maxRel(gotC, wantC))
	}
	if err := cl.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Clone(); err == nil {
		t.Error("cloning a closed session succeeded")
	}
}
