package checkpoint

import (
	"strconv"
	"strings"
	"testing"
)

// FuzzParseSynth: any spec either fails with an error quoting it or yields a
// configuration that validates and a canonical spec that parses to the same.
func FuzzParseSynth(f *testing.F) {
	for _, s := range []string{"synth:tiny", "synth:flash?layers=2", "tiny?seed=5&experts=3", "synth:flash?mtp=0&topk=1", "synth:tiny?layers=%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		s, err := ParseSynth(spec)
		if err != nil {
			if !strings.Contains(err.Error(), strconv.Quote(spec)) {
				t.Fatalf("error %q does not quote the spec %q", err, spec)
			}
			return
		}
		if err := s.Config.Validate(); err != nil {
			t.Fatalf("accepted %q but config invalid: %v", spec, err)
		}
		again, err := ParseSynth(s.String())
		if err != nil || again.String() != s.String() {
			t.Fatalf("canonical spec %q does not round trip: %v", s.String(), err)
		}
	})
}
