package tokenizer

import (
	"strings"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// preTokenizer splits a normalized text segment into pieces; BPE runs on each
// piece independently. emit receives the pieces in order; they are substrings
// of s (or, for a ByteLevel step with add_prefix_space, new strings).
type preTokenizer interface {
	split(s string, emit func(piece string))
}

// matcher reports the non-overlapping, non-empty matches of a pattern in s,
// leftmost first, as byte offsets.
type matcher interface {
	eachMatch(s string, fn func(start, end int))
}

// behavior is HF tokenizers' SplitDelimiterBehavior.
type behavior int

const (
	behRemoved behavior = iota
	behIsolated
	behMergedWithPrevious
	behMergedWithNext
	behContiguous
)

var behaviorNames = map[string]behavior{
	"Removed":            behRemoved,
	"Isolated":           behIsolated,
	"MergedWithPrevious": behMergedWithPrevious,
	"MergedWithNext":     behMergedWithNext,
	"Contiguous":         behContiguous,
}

// splitStep is HF's Split pre-tokenizer (also used for Digits).
type splitStep struct {
	m        matcher
	behavior behavior
	invert   bool
}

type segment struct {
	start, end int
	match      bool
}

func (p *splitStep) split(s string, emit func(string)) {
	if s == "" {
		return
	}
	// Fast path: Isolated without invert emits gaps and matches as found.
	if p.behavior == behIsolated {
		prev := 0
		p.m.eachMatch(s, func(start, end int) {
			if start > prev {
				emit(s[prev:start])
			}
			emit(s[start:end])
			prev = end
		})
		if prev < len(s) {
			emit(s[prev:])
		}
		return
	}
	var segs []segment
	prev := 0
	p.m.eachMatch(s, func(start, end int) {
		if start > prev {
			segs = append(segs, segment{prev, start, p.invert})
		}
		segs = append(segs, segment{start, end, !p.invert})
		prev = end
	})
	if prev < len(s) {
		segs = append(segs, segment{prev, len(s), p.invert})
	}
	var out []segment
	switch p.behavior {
	case behRemoved:
		for _, g := range segs {
			if !g.match {
				out = append(out, g)
			}
		}
	case behMergedWithPrevious:
		prevMatch := false
		for _, g := range segs {
			if g.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].end = g.end
			} else {
				out = append(out, g)
			}
			prevMatch = g.match
		}
	case behMergedWithNext:
		prevMatch := false
		for i := len(segs) - 1; i >= 0; i-- {
			g := segs[i]
			if g.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].start = g.start
			} else {
				out = append(out, g)
			}
			prevMatch = g.match
		}
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
	case behContiguous:
		prevMatch := false
		for _, g := range segs {
			if g.match == prevMatch && len(out) > 0 {
				out[len(out)-1].end = g.end
			} else {
				out = append(out, g)
			}
			prevMatch = g.match
		}
	default: // Isolated with invert
		out = segs
	}
	for _, g := range out {
		if g.end > g.start {
			emit(s[g.start:g.end])
		}
	}
}

// sequence applies its steps one after another, each to every piece of the
// previous one.
type sequence []preTokenizer

func (q sequence) split(s string, emit func(string)) {
	q.run(0, s, emit)
}

func (q sequence) run(i int, s string, emit func(string)) {
	if i == len(q) {
		emit(s)
		return
	}
	q[i].split(s, func(p string) { q.run(i+1, p, emit) })
}

// byteLevelStep is HF's ByteLevel pre-tokenizer. The mapping of bytes to the
// byte-level alphabet is folded into the vocabulary at load time, so this step
// only adds the prefix space and applies the GPT-2 split when configured.
type byteLevelStep struct {
	addPrefixSpace bool
	re             matcher // nil unless use_regex
}

func (b *byteLevelStep) split(s string, emit func(string)) {
	if b.addPrefixSpace && !strings.HasPrefix(s, " ") {
		s = " " + s
	}
	if b.re == nil {
		emit(s)
		return
	}
	(&splitStep{m: b.re, behavior: behIsolated}).split(s, emit)
}

// gpt2Pattern is the split ByteLevel applies when use_regex is true.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// regexMatcher runs a regexp2 pattern (the HF/Oniguruma dialect with
// lookaround). Invalid UTF-8 bytes count as one U+FFFD rune each, so byte
// offsets stay exact.
type regexMatcher struct {
	re *regexp2.Regexp
}

func (m *regexMatcher) eachMatch(s string, fn func(start, end int)) {
	runes := make([]rune, 0, len(s))
	offs := make([]int, 0, len(s)+1)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		runes = append(runes, r)
		offs = append(offs, i)
		i += n
	}
	offs = append(offs, len(s))
	idx, err := m.re.FindAllRunesIndex(runes, -1)
	if err != nil {
		return // only a match timeout errors, and none is set
	}
	for _, p := range idx {
		if p[1] > p[0] {
			fn(offs[p[0]], offs[p[1]])
		}
	}
}

// literalMatcher is a Split pattern given as {"String": ...}.
type literalMatcher struct{ lit string }

func (m literalMatcher) eachMatch(s string, fn func(start, end int)) {
	for i := 0; ; {
		j := strings.Index(s[i:], m.lit)
		if j < 0 {
			return
		}
		fn(i+j, i+j+len(m.lit))
		i += j + len(m.lit)
	}
}

// runMatcher matches maximal runs of runes satisfying pred, cut into chunks
// of at most max runes when max > 0 (HF's Digits is a Split on is_numeric).
type runMatcher struct {
	pred func(rune) bool
	max  int
}

func (m runMatcher) eachMatch(s string, fn func(start, end int)) {
	start, count := -1, 0
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if m.pred(r) && !(r == utf8.RuneError && n == 1) {
			if start < 0 {
				start, count = i, 0
			}
			count++
			i += n
			if m.max > 0 && count == m.max {
				fn(start, i)
				start = -1
			}
			continue
		}
		if start >= 0 {
			fn(start, i)
			start = -1
		}
		i += n
	}
	if start >= 0 {
		fn(start, len(s))
	}
}
