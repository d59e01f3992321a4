package tokenizer

import (
	"sync"
	"unicode"
	"unicode/utf8"
)

// The DeepSeek-V3 pre-tokenizer (shared by V4) is a Sequence of three
// Isolated Splits followed by ByteLevel. The three patterns below are matched
// by hand-written scanners that give exactly the splits regexp2 gives for the
// same patterns (fuzz-tested in dsv3scan_test.go); any other pattern falls
// back to regexp2.
const (
	dsv3DigitsPattern = `\p{N}{1,3}`
	dsv3CJKPattern    = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
	dsv3MainPattern   = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+" +
		"|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+" +
		"| ?[\\p{P}\\p{S}]+[\r\n]*" +
		"|\\s*[\r\n]+" +
		"|\\s+(?!\\S)" +
		"|\\s+"
)

// fastMatcher returns a hand-written matcher for a known pattern, or nil.
func fastMatcher(pattern string) matcher {
	switch pattern {
	case dsv3DigitsPattern:
		return runMatcher{pred: unicode.IsNumber, max: 3}
	case dsv3CJKPattern:
		return runMatcher{pred: isDSV3CJK}
	case dsv3MainPattern:
		return dsv3Main{tab: bmpClasses()}
	}
	return nil
}

func isDSV3CJK(r rune) bool {
	return (r >= 0x4e00 && r <= 0x9fa5) || (r >= 0x3040 && r <= 0x309f) || (r >= 0x30a0 && r <= 0x30ff)
}

// Character classes used by the main pattern. \s is unicode.IsSpace, as in
// regexp2.
const (
	clL uint8 = 1 << iota
	clM
	clP
	clS
	clSpace
	clASCIIPunct // the explicit class of the first alternative
	clASCIIAlpha
)

func classOfSlow(r rune) uint8 {
	var c uint8
	if unicode.IsLetter(r) {
		c |= clL
	}
	if unicode.IsMark(r) {
		c |= clM
	}
	if unicode.IsPunct(r) {
		c |= clP
	}
	if unicode.IsSymbol(r) {
		c |= clS
	}
	if unicode.IsSpace(r) {
		c |= clSpace
	}
	if r < 0x80 {
		switch {
		case r >= '!' && r <= '/', r >= ':' && r <= '@', r >= '[' && r <= '`', r >= '{' && r <= '~':
			c |= clASCIIPunct
		case r >= 'A' && r <= 'Z', r >= 'a' && r <= 'z':
			c |= clASCIIAlpha
		}
	}
	return c
}

// bmpClasses is the class table for the Basic Multilingual Plane, built once
// on first use and read-only afterwards.
var bmpClasses = sync.OnceValue(func() *[0x10000]uint8 {
	var t [0x10000]uint8
	for r := range t {
		t[r] = classOfSlow(rune(r))
	}
	return &t
})

type dsv3Main struct {
	tab *[0x10000]uint8
}

// at decodes the rune at s[i]; an invalid byte reads as U+FFFD of width 1,
// the same rune regexp2 sees for it.
func (m dsv3Main) at(s string, i int) (rune, int, uint8) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1, m.tab[c]
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	if r < 0x10000 {
		return r, n, m.tab[r]
	}
	return r, n, classOfSlow(r)
}

// run returns the end of the run of runes from i whose class intersects want.
func (m dsv3Main) run(s string, i int, want uint8) int {
	for i < len(s) {
		_, n, c := m.at(s, i)
		if c&want == 0 {
			break
		}
		i += n
	}
	return i
}

func (m dsv3Main) eachMatch(s string, fn func(start, end int)) {
	for i := 0; i < len(s); {
		end, n := m.matchAt(s, i)
		if end > i {
			fn(i, end)
			i = end
		} else {
			i += n
		}
	}
}

// matchAt returns the end of the match starting at i (i itself when there is
// none) and the width of the rune at i. The alternatives are tried in the
// pattern's order with its backtracking semantics.
func (m dsv3Main) matchAt(s string, i int) (end, width int) {
	r0, n0, c0 := m.at(s, i)
	// [!"#...~][A-Za-z]+
	if c0&clASCIIPunct != 0 {
		j := i + 1
		for j < len(s) && s[j] < utf8.RuneSelf && m.tab[s[j]]&clASCIIAlpha != 0 {
			j++
		}
		if j > i+1 {
			return j, n0
		}
	}
	// [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
	if c0&clL != 0 {
		return m.run(s, i, clL|clM), n0
	}
	if c0&(clP|clS) == 0 && r0 != '\r' && r0 != '\n' {
		if i+n0 < len(s) {
			if _, _, c1 := m.at(s, i+n0); c1&(clL|clM) != 0 {
				return m.run(s, i+n0, clL|clM), n0
			}
		}
		if c0&clM != 0 {
			return m.run(s, i, clL|clM), n0
		}
	}
	// ' '?[\p{P}\p{S}]+[\r\n]*
	start := -1
	if c0&(clP|clS) != 0 {
		start = i
	} else if r0 == ' ' && i+1 < len(s) {
		if _, _, c1 := m.at(s, i+1); c1&(clP|clS) != 0 {
			start = i + 1
		}
	}
	if start >= 0 {
		j := m.run(s, start, clP|clS)
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j, n0
	}
	if c0&clSpace == 0 {
		return i, n0
	}
	// \s*[\r\n]+ | \s+(?!\S) | \s+
	w, last, lastNL, count := i, i, -1, 0
	for w < len(s) {
		r, n, c := m.at(s, w)
		if c&clSpace == 0 {
			break
		}
		if r == '\r' || r == '\n' {
			lastNL = w
		}
		last = w
		count++
		w += n
	}
	switch {
	case lastNL >= 0:
		return lastNL + 1, n0
	case w == len(s) || count < 2:
		return w, n0
	default:
		return last, n0
	}
}
