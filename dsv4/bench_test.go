package dsv4

import (
	"strings"
	"sync"
	"testing"

	"moxie/checkpoint"
	"moxie/compute/cpu"
)

var flashBench struct {
	once sync.Once
	m    *Model
	err  error
}

// flashModel loads synth:flash?layers=4&experts=8 once per test binary: the
// exact V4-Flash widths with 4 layers (window, window, CSA, HCA) and 8 routed
// experts. The source and backend stay open until the process exits.
func flashModel(b *testing.B) *Model {
	flashBench.once.Do(func() {
		src, err := checkpoint.Open("synth:flash?layers=4&experts=8")
		if err != nil {
			flashBench.err = err
			return
		}
		flashBench.m, flashBench.err = Load(src, Options{Backend: cpu.New(0)})
	})
	if flashBench.err != nil {
		b.Fatal(flashBench.err)
	}
	return flashBench.m
}

// BenchmarkFlashDecode measures one decode step at the exact V4-Flash widths
// (4 layers, 8 experts) after a 16-token prefill. Bytes read per step are
// reported so that the time can be compared with the machine's memory bandwidth.
func BenchmarkFlashDecode(b *testing.B) {
	m := flashModel(b)
	s := m.NewSession()
	if _, err := s.Prefill(testTokens(16, m.Cfg.VocabSize, 1)); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(decodeBytes(m))
	b.ResetTimer()
	for b.Loop() {
		if _, err := s.Decode(s.Pos()*7919%m.Cfg.VocabSize + 3); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFlashPrefill64 measures a 64-token prefill (last-position logits)
// at the same widths; tokens/s = 64 / (ns/op).
func BenchmarkFlashPrefill64(b *testing.B) {
	m := flashModel(b)
	toks := testTokens(64, m.Cfg.VocabSize, 2)
	for b.Loop() {
		if _, err := m.NewSession().Prefill(toks); err != nil {
			b.Fatal(err)
		}
	}
}

// decodeBytes estimates the weight bytes one decode step reads: every dense
// tensor of the main layers and the head (embedding: one row), plus top-k
// routed experts per layer.
func decodeBytes(m *Model) int64 {
	var n int64
	c := m.Cfg
	for _, t := range m.src.Tensors() {
		switch {
		case t.Name == "embed.weight":
			n += int64(c.Dim * 2)
		case len(t.Name) > 4 && t.Name[:4] == "mtp.":
		case contains(t.Name, ".experts."):
			n += t.Size * int64(c.NActivatedExperts) / int64(c.NRoutedExperts)
		case contains(t.Name, "tid2eid"):
		default:
			n += t.Size
		}
	}
	return n
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// BenchmarkTinyPrefill40 measures a 40-token prefill of the tiny preset.
func BenchmarkTinyPrefill40(b *testing.B) {
	src, err := checkpoint.Open("synth:tiny")
	if err != nil {
		b.Fatal(err)
	}
	m := loadTiny(b, src)
	toks := testTokens(40, m.Cfg.VocabSize, 1)
	for b.Loop() {
		if _, err := m.NewSession().Prefill(toks); err != nil {
			b.Fatal(err)
		}
	}
}
