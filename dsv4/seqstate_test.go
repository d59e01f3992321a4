package dsv4

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"moxie/checkpoint"
	"moxie/dsv4/config"
	"moxie/generate"
)

// saveState returns s's saved state.
func saveState(t testing.TB, s *Session) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := s.SaveSequence(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// feed prefills toks into s (decode steps for one token) and returns the
// last logits.
func feed(t testing.TB, s *Session, toks []int) []float32 {
	t.Helper()
	l, err := s.Prefill(toks)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestSessionSaveRestore: a restored session continues exactly as the one
// that was saved (the same logits, bit for bit, as a session that was never
// saved), at positions before the first compressor close, between closes
// and past the window, and saving leaves the session unchanged.
func TestSessionSaveRestore(t *testing.T) {
	m := loadTiny(t, newMemSource(config.Tiny(), 1))
	toks := testTokens(90, m.Cfg.VocabSize, 7)
	for _, at := range []int{0, 3, 9, 70} {
		t.Run(fmt.Sprintf("pos%d", at), func(t *testing.T) {
			head, tail := toks[:at], toks[at:at+12]
			ref := m.NewSession()
			if at > 0 {
				feed(t, ref, head)
			}
			want := append(feed(t, ref, tail[:5]), feed(t, ref, tail[5:])...)

			orig := m.NewSession()
			if at > 0 {
				feed(t, orig, head)
			}
			state := saveState(t, orig)
			if again := saveState(t, orig); !bytes.Equal(state, again) {
				t.Fatal("saving twice gave different bytes")
			}
			seq, err := m.RestoreSequence(bytes.NewReader(state))
			if err != nil {
				t.Fatal(err)
			}
			rs := seq.(*Session)
			if rs.Len() != at {
				t.Fatalf("restored session at %d, want %d", rs.Len(), at)
			}
			if re := saveState(t, rs); !bytes.Equal(re, state) {
				t.Error("the restored session saves different bytes")
			}
			got := append(feed(t, rs, tail[:5]), feed(t, rs, tail[5:])...)
			if !slices.Equal(got, want) {
				t.Errorf("restored session's continuation differs (max rel %.3g)", maxRel(got, want))
			}
			// The saved session itself still continues as before.
			if g := append(feed(t, orig, tail[:5]), feed(t, orig, tail[5:])...); !slices.Equal(g, want) {
				t.Errorf("the saved session's continuation changed (max rel %.3g)", maxRel(g, want))
			}
		})
	}
}

// TestRestoreSessionErrors: every malformed state is refused with an error
// naming what is wrong, never a panic or a session.
func TestRestoreSessionErrors(t *testing.T) {
	m := loadTiny(t, newMemSource(config.Tiny(), 1))
	s := m.NewSession()
	feed(t, s, testTokens(21, m.Cfg.VocabSize, 3))
	state := saveState(t, s)
	mod := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(state)) }
	put32 := func(off int, v uint32) []byte {
		return mod(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[off:], v); return b })
	}
	other := config.Tiny()
	other.NLayers = 3
	other.CompressRatios = other.CompressRatios[1:]
	mo := loadTiny(t, newMemSource(other, 1))
	so := mo.NewSession()
	feed(t, so, testTokens(5, mo.Cfg.VocabSize, 3))
	cases := []struct {
		name, want string
		data       []byte
	}{
		{"empty", "truncated", nil},
		{"magic", "not a saved session", mod(func(b []byte) []byte { b[0] = 'X'; return b })},
		{"version", "version is 9", put32(8, 9)},
		{"layers", "layers is 3", saveState(t, so)},
		{"window", "window is 99", put32(16, 99)},
		{"pos", "exceeds max_position_embeddings", mod(func(b []byte) []byte {
			binary.LittleEndian.PutUint64(b[28:], 1<<40)
			return b
		})},
		{"pos changed", "disagree with pos", mod(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[28:], 2); return b })},
		{"ratio", "layer 0 compressor ratio is 4", put32(36, 4)},
		{"flags", "unknown bits", mod(func(b []byte) []byte { b[44] |= 0x80; return b })},
		{"truncated data", "truncated", state[:len(state)/2]},
		{"truncated checksum", "inside checksum", state[:len(state)-2]},
		{"flipped bit", "corrupt", mod(func(b []byte) []byte { b[len(b)/2] ^= 4; return b })},
		{"trailing", "after its checksum", append(bytes.Clone(state), 0)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			seq, err := m.RestoreSequence(bytes.NewReader(c.data))
			if err == nil {
				t.Fatalf("restored %v, want an error containing %q", seq, c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q, want it to contain %q", err, c.want)
			}
			if !errors.Is(err, generate.ErrBadState) {
				t.Errorf("error %q does not wrap generate.ErrBadState", err)
			}
		})
	}
	// Every prefix fails.
	for n := 0; n < len(state); n += 1 + n/7 {
		if _, err := m.RestoreSequence(bytes.NewReader(state[:n])); err == nil {
			t.Fatalf("a %d-byte prefix of a %d-byte state was restored", n, len(state))
		}
	}
}

// TestSequenceID: the same weights give the same ID, other weights of the
// same shapes another.
func TestSequenceID(t *testing.T) {
	a := loadTiny(t, newMemSource(config.Tiny(), 1)).SequenceID()
	b := loadTiny(t, newMemSource(config.Tiny(), 1)).SequenceID()
	c := loadTiny(t, newMemSource(config.Tiny(), 2)).SequenceID()
	if a != b {
		t.Errorf("one model's IDs differ: %s, %s", a, b)
	}
	if a == c {
		t.Errorf("two seeds' models share ID %s", a)
	}
	if len(a) != 32 {
		t.Errorf("ID %q, want 32 hex digits", a)
	}
	// A router masked by its gate bias (moxie's --prune) makes another model.
	src := newMemSource(config.Tiny(), 1)
	var name string
	for _, ti := range src.Tensors() {
		if strings.HasSuffix(ti.Name, ".gate.bias") {
			name = ti.Name
			break
		}
	}
	d, err := src.TensorData(name)
	if name == "" || err != nil {
		t.Fatalf("no gate bias in the tiny model (%q, %v)", name, err)
	}
	masked := append([]byte(nil), d...)
	binary.LittleEndian.PutUint32(masked, math.Float32bits(-1e30))
	ms, err := checkpoint.WithTensors(src, map[string][]byte{name: masked})
	if err != nil {
		t.Fatal(err)
	}
	if m := loadTiny(t, ms).SequenceID(); m == a {
		t.Errorf("a model with %s masked shares the unmasked model's ID %s", name, a)
	}
}

// FuzzRestoreSession: no input panics; whatever is restored saves back to
// the same bytes.
func FuzzRestoreSession(f *testing.F) {
	m := loadTiny(f, newMemSource(config.Tiny(), 1))
	for _, n := range []int{0, 5} {
		s := m.NewSession()
		if n > 0 {
			feed(f, s, testTokens(n, m.Cfg.VocabSize, 1))
		}
		f.Add(saveState(f, s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		seq, err := m.RestoreSequence(bytes.NewReader(data))
		if err != nil {
			return
		}
		if re := saveState(t, seq.(*Session)); !bytes.Equal(re, data) {
			t.Fatalf("restored %d bytes, saved back %d different ones", len(data), len(re))
		}
	})
}
