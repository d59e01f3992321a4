package generate

import (
	"strings"
	"testing"
)

// refStop is the whole-text reference for stop-string matching: scanning end
// positions left to right, the first position where some stop string ends
// wins, and among the strings ending there the longest (earliest start). It
// returns the text before the winner, or all of text when none occurs.
func refStop(text string, stops []string) (string, int) {
	for e := 1; e <= len(text); e++ {
		best, bestStart := -1, 0
		for k, s := range stops {
			if s != "" && strings.HasSuffix(text[:e], s) && (best < 0 || e-len(s) < bestStart) {
				best, bestStart = k, e-len(s)
			}
		}
		if best >= 0 {
			return text[:bestStart], best
		}
	}
	return text, -1
}

// refHold is the length of the longest suffix of s that is a proper prefix of
// a stop string, by brute force over all suffixes.
func refHold(s string, stops []string) int {
	for n := len(s); n > 0; n-- {
		for _, stop := range stops {
			if n < len(stop) && strings.HasPrefix(stop, s[len(s)-n:]) {
				return n
			}
		}
	}
	return 0
}

// checkMatcher feeds text to a stopMatcher in the pieces given by cuts and
// compares against the references.
func checkMatcher(t *testing.T, text string, stops []string, cuts []byte) {
	t.Helper()
	m := newStopMatcher(stops)
	var out strings.Builder
	matched := -1
	pos, ci := 0, 0
	for pos < len(text) && matched < 0 {
		n := 1
		if ci < len(cuts) {
			n = int(cuts[ci]) % 8
			ci++
		}
		n = min(n, len(text)-pos)
		e, k := m.push(text[pos : pos+n])
		pos += n
		out.WriteString(e)
		if k >= 0 {
			matched = k
			break
		}
		// Everything consumed is either emitted or held, and exactly the
		// minimal tail is held.
		if got := out.String() + m.pending; got != text[:pos] {
			t.Fatalf("emitted+held %q != consumed %q", got, text[:pos])
		}
		if h := refHold(text[:pos], stops); len(m.pending) != h {
			t.Fatalf("after %q holds %q, want %d bytes", text[:pos], m.pending, h)
		}
	}
	if matched < 0 {
		out.WriteString(m.flush())
	}
	want, wantK := refStop(text, stops)
	if out.String() != want || matched != wantK {
		t.Fatalf("text %q stops %q cuts %v: got %q (stop %d), want %q (stop %d)", text, stops, cuts, out.String(), matched, want, wantK)
	}
	if e, k := m.push("more"); matched >= 0 && (e != "" || k != -1) {
		t.Fatalf("push after a match returned %q %d", e, k)
	}
}

func TestStopMatcher(t *testing.T) {
	cases := []struct {
		text  string
		stops []string
		cuts  []byte
	}{
		{"Hello world", []string{"o w"}, []byte{2, 3, 4, 2}},
		{"Hello world", []string{"xyz"}, []byte{1}},
		{"aaab", []string{"aab"}, []byte{1, 1, 1, 1}},
		{"abab", []string{"bab", "ab"}, []byte{1, 1, 1, 1}},
		{"abcd", []string{"bcd", "abcd"}, []byte{4}},
		{"日本語の文", []string{"語の"}, []byte{2, 5, 1}},
		{"no stops", nil, []byte{3}},
		{"tail ab", []string{"abc"}, []byte{7}},
		{"xxSTOP", []string{"STOP", "TOP", "P"}, []byte{6}},
	}
	for _, c := range cases {
		t.Run(c.text, func(t *testing.T) { checkMatcher(t, c.text, c.stops, c.cuts) })
	}
}

// FuzzStopMatcher: stops is a newline-separated list (empty entries dropped);
// cuts chooses chunk lengths 0-7.
func FuzzStopMatcher(f *testing.F) {
	f.Add("Hello world", "o w", []byte{2, 3, 4})
	f.Add("aaaaab", "aab\naaab", []byte{1, 0, 2})
	f.Add("abcabcabd", "abd\ncab", []byte{5, 1})
	f.Fuzz(func(t *testing.T, text, stopList string, cuts []byte) {
		var stops []string
		for _, s := range strings.Split(stopList, "\n") {
			if s != "" && len(stops) < 6 {
				stops = append(stops, s)
			}
		}
		if len(text) > 512 {
			text = text[:512]
		}
		checkMatcher(t, text, stops, cuts)
	})
}
