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

// dsv3PreTokenizer is the whole DeepSeek-V3 pre-tokenizer (the three Splits
// and a plain ByteLevel) fused into nested loops without closures. It emits
// the same pieces as the generic sequence of the same steps.
type dsv3PreTokenizer struct {
	main dsv3Main
}

// fuseDSV3 returns the fused pre-tokenizer when p is exactly the DeepSeek-V3
// sequence, and p otherwise.
func fuseDSV3(p preTokenizer) preTokenizer {
	seq, ok := p.(sequence)
	if !ok || len(seq) != 4 {
		return p
	}
	isSplit := func(i int, want func(matcher) bool) bool {
		s, ok := seq[i].(*splitStep)
		return ok && s.behavior == behIsolated && !s.invert && want(s.m)
	}
	digits := func(m matcher) bool {
		r, ok := m.(runMatcher)
		return ok && r.max == 3 && r.pred(0x0663) && !r.pred('a')
	}
	cjk := func(m matcher) bool {
		r, ok := m.(runMatcher)
		return ok && r.max == 0 && r.pred(0x4e2d) && !r.pred('1')
	}
	main := func(m matcher) bool { _, ok := m.(dsv3Main); return ok }
	bl, ok := seq[3].(*byteLevelStep)
	if !ok || bl.addPrefixSpace || bl.re != nil || !isSplit(0, digits) || !isSplit(1, cjk) || !isSplit(2, main) {
		return p
	}
	return &dsv3PreTokenizer{main: dsv3Main{tab: bmpClasses()}}
}

// split applies \p{N}{1,3} (Isolated), then the CJK run split, then the main
// pattern.
func (p *dsv3PreTokenizer) split(s string, emit func(string)) {
	// wide records a non-ASCII byte in s[prev:i]: only then can the CJK
	// split matter, and only then can a digit run be other than ASCII.
	prev, i, count, start, wide := 0, 0, 0, -1, false
	for i < len(s) {
		c := s[i]
		n := 1
		isNum := false
		if c < utf8.RuneSelf {
			isNum = c-'0' < 10
		} else {
			var r rune
			r, n = utf8.DecodeRuneInString(s[i:])
			isNum = unicode.IsNumber(r)
			wide = true
		}
		if isNum {
			if start < 0 {
				start, count = i, 0
			}
			count++
			i += n
			if count == 3 {
				p.digitsGap(s, prev, start, i, wide, emit)
				prev, start, wide = i, -1, false
			}
			continue
		}
		if start >= 0 {
			p.digitsGap(s, prev, start, i, wide, emit)
			prev, start, wide = i, -1, c >= utf8.RuneSelf
		}
		i += n
	}
	if start >= 0 {
		p.digitsGap(s, prev, start, len(s), wide, emit)
		prev = len(s)
	}
	if prev < len(s) {
		p.cjkIf(s[prev:], wide, emit)
	}
}

// digitsGap handles the gap s[prev:start] and the digit match s[start:end];
// wide is false when both are ASCII.
func (p *dsv3PreTokenizer) digitsGap(s string, prev, start, end int, wide bool, emit func(string)) {
	if start > prev {
		p.cjkIf(s[prev:start], wide, emit)
	}
	if wide {
		p.cjk(s[start:end], emit)
	} else {
		emit(s[start:end]) // ASCII digits: no later split applies
	}
}

// cjkIf skips the CJK split for ASCII text.
func (p *dsv3PreTokenizer) cjkIf(s string, wide bool, emit func(string)) {
	if wide {
		p.cjk(s, emit)
	} else {
		p.mainSplit(s, emit)
	}
}

func (p *dsv3PreTokenizer) cjk(s string, emit func(string)) {
	prev, start := 0, -1
	for i := 0; i < len(s); {
		if s[i] < utf8.RuneSelf {
			if start >= 0 {
				p.emitCJK(s, prev, start, i, emit)
				prev, start = i, -1
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if isDSV3CJK(r) {
			if start < 0 {
				start = i
			}
		} else if start >= 0 {
			p.emitCJK(s, prev, start, i, emit)
			prev, start = i, -1
		}
		i += n
	}
	if start >= 0 {
		p.emitCJK(s, prev, start, len(s), emit)
		prev = len(s)
	}
	if prev < len(s) {
		p.mainSplit(s[prev:], emit)
	}
}

func (p *dsv3PreTokenizer) emitCJK(s string, prev, start, end int, emit func(string)) {
	if start > prev {
		p.mainSplit(s[prev:start], emit)
	}
	p.mainSplit(s[start:end], emit)
}

func (p *dsv3PreTokenizer) mainSplit(s string, emit func(string)) {
	prev := 0
	for i := 0; i < len(s); {
		end, n := p.main.matchAt(s, i)
		if end > i {
			if i > prev {
				emit(s[prev:i])
			}
			emit(s[i:end])
			i, prev = end, end
		} else {
			i += n
		}
	}
	if prev < len(s) {
		emit(s[prev:])
	}
}
