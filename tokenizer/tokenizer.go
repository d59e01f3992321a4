// Package tokenizer implements byte-level BPE tokenization as defined by a
// HuggingFace tokenizers `tokenizer.json` (model type BPE with a ByteLevel
// pre-tokenizer and decoder, as used by DeepSeek-V3/V4) plus the companion
// `tokenizer_config.json`.
//
// A *Tokenizer is immutable after Load apart from an internal piece cache and
// is safe for concurrent use.
package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// AddedToken is an entry of tokenizer.json's added_tokens: a string matched
// as a whole before pre-tokenization and mapped to one id.
type AddedToken struct {
	ID      int
	Content string
	// Special marks control tokens (BOS, EOS, role markers...). The flag is
	// informational: Encode matches every added token only when
	// EncodeOptions.AllowSpecial is set, special or not.
	Special bool
	// LStrip and RStrip make a match absorb the whitespace on its left/right.
	LStrip, RStrip bool
	// SingleWord matches only when no letter, digit or '_' touches either end.
	SingleWord bool
}

// Tokenizer encodes text to token ids and back.
type Tokenizer struct {
	bpe       *bpeModel
	normalize normalizer // nil: identity
	pretok    preTokenizer

	idBytes []string // decoded bytes of each id; "" with known[id]=false for holes
	known   []bool
	byStr   map[string]int // TokenID lookup: added-token content or byte-level vocab string

	added   []AddedToken
	special []bool    // by id: an added token flagged special
	trie    addedTrie // over the contents of added

	bos, eos       int // -1 when not configured
	addBOS, addEOS bool
}

// EncodeOptions controls Encode.
type EncodeOptions struct {
	// AllowSpecial recognises added tokens (such as `<｜User｜>` or `<think>`)
	// written in the text as their single ids. When false, the whole text is
	// encoded as ordinary bytes, so user-supplied text can never produce a
	// control token. Chat templates render with AllowSpecial set.
	AllowSpecial bool
	// AddSpecialTokens prepends BOS / appends EOS as tokenizer_config.json's
	// add_bos_token / add_eos_token ask (HF's add_special_tokens=True).
	AddSpecialTokens bool
}

// Encode returns the token ids of text. It never fails: every byte sequence,
// including invalid UTF-8, has an encoding, and Decode(Encode(s)) == s for
// every s when the tokenizer has no normalizer, no prefix space and all 256
// byte tokens (true for DeepSeek-V3/V4).
func (t *Tokenizer) Encode(text string, opts EncodeOptions) []int {
	out := make([]int, 0, len(text)/3+2)
	if opts.AddSpecialTokens && t.addBOS && t.bos >= 0 {
		out = append(out, t.bos)
	}
	if opts.AllowSpecial && len(t.added) > 0 {
		out = t.encodeWithAdded(text, out)
	} else {
		out = t.encodeText(text, out)
	}
	if opts.AddSpecialTokens && t.addEOS && t.eos >= 0 {
		out = append(out, t.eos)
	}
	return out
}

// Segment is one piece of text for EncodeSegments.
type Segment struct {
	Text string
	// AllowSpecial recognises added tokens inside this segment's text.
	AllowSpecial bool
}

// EncodeSegments encodes the concatenation of the segments' texts the way
// Encode with AllowSpecial does, except that added tokens are recognised
// only inside segments with AllowSpecial set (never across a boundary). Text
// runs that span segments are pre-tokenized and merged as one, so when the
// plain segments hold no added-token text the result equals
// Encode(concatenation, EncodeOptions{AllowSpecial: true}). Chat templates use
// it to keep control tokens out of user-supplied text.
func (t *Tokenizer) EncodeSegments(segs []Segment) []int {
	var out []int
	var plain strings.Builder
	flush := func() {
		out = t.encodeText(plain.String(), out)
		plain.Reset()
	}
	for _, sg := range segs {
		if !sg.AllowSpecial || len(t.added) == 0 {
			plain.WriteString(sg.Text)
			continue
		}
		pos := 0
		for pos < len(sg.Text) {
			k, start, end := t.findAdded(sg.Text, pos)
			if k < 0 {
				break
			}
			plain.WriteString(sg.Text[pos:start])
			flush()
			out = append(out, t.added[k].ID)
			pos = end
		}
		plain.WriteString(sg.Text[pos:])
	}
	flush()
	if out == nil {
		out = []int{}
	}
	return out
}

// encodeText runs normalizer, pre-tokenizer and BPE on text that holds no
// added tokens.
func (t *Tokenizer) encodeText(text string, out []int) []int {
	if text == "" {
		return out
	}
	if t.normalize != nil {
		text = t.normalize.normalize(text)
	}
	t.pretok.split(text, func(piece string) {
		out = t.bpe.encodeWord(piece, out)
	})
	return out
}

func isWordRune(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) }

// addedTrie is a byte trie over the added tokens' contents.
type addedTrie struct {
	root  [256]int32 // node reached by each first byte; 0 = none
	nodes []trieNode // nodes[0] is unused
}

type trieNode struct {
	tok  int32 // index into Tokenizer.added ending here, -1 if none
	kids []trieKid
}

type trieKid struct {
	b    byte
	node int32
}

func (tr *addedTrie) insert(s string, tok int) {
	if len(tr.nodes) == 0 {
		tr.nodes = append(tr.nodes, trieNode{tok: -1})
	}
	n := tr.root[s[0]]
	if n == 0 {
		n = int32(len(tr.nodes))
		tr.nodes = append(tr.nodes, trieNode{tok: -1})
		tr.root[s[0]] = n
	}
	for i := 1; i < len(s); i++ {
		next := int32(0)
		for _, k := range tr.nodes[n].kids {
			if k.b == s[i] {
				next = k.node
				break
			}
		}
		if next == 0 {
			next = int32(len(tr.nodes))
			tr.nodes = append(tr.nodes, trieNode{tok: -1})
			tr.nodes[n].kids = append(tr.nodes[n].kids, trieKid{s[i], next})
		}
		n = next
	}
	tr.nodes[n].tok = int32(tok)
}

// findAdded returns the leftmost-longest added-token match in s at or after
// from, with its extent after lstrip/rstrip; k < 0 when there is none.
func (t *Tokenizer) findAdded(s string, from int) (k, start, end int) {
	tr := &t.trie
	var ends [8]struct{ end, tok int }
	for i := from; i < len(s); i++ {
		n := tr.root[s[i]]
		if n == 0 {
			continue
		}
		found := ends[:0]
		for j := i + 1; ; j++ {
			if tok := tr.nodes[n].tok; tok >= 0 {
				found = append(found, struct{ end, tok int }{j, int(tok)})
			}
			if j == len(s) {
				break
			}
			next := int32(0)
			for _, kid := range tr.nodes[n].kids {
				if kid.b == s[j] {
					next = kid.node
					break
				}
			}
			if next == 0 {
				break
			}
			n = next
		}
		for f := len(found) - 1; f >= 0; f-- { // longest first
			a := &t.added[found[f].tok]
			j := found[f].end
			if a.SingleWord {
				if r, _ := utf8.DecodeLastRuneInString(s[:i]); i > 0 && isWordRune(r) {
					continue
				}
				if r, _ := utf8.DecodeRuneInString(s[j:]); j < len(s) && isWordRune(r) {
					continue
				}
			}
			st := i
			if a.LStrip {
				for st > from {
					r, n := utf8.DecodeLastRuneInString(s[from:st])
					if !unicode.IsSpace(r) {
						break
					}
					st -= n
				}
			}
			if a.RStrip {
				for j < len(s) {
					r, n := utf8.DecodeRuneInString(s[j:])
					if !unicode.IsSpace(r) {
						break
					}
					j += n
				}
			}
			return found[f].tok, st, j
		}
	}
	return -1, 0, 0
}

func (t *Tokenizer) encodeWithAdded(text string, out []int) []int {
	pos := 0
	for pos < len(text) {
		k, start, end := t.findAdded(text, pos)
		if k < 0 {
			break
		}
		out = t.encodeText(text[pos:start], out)
		out = append(out, t.added[k].ID)
		pos = end
	}
	return t.encodeText(text[pos:], out)
}

// Decode returns the bytes the ids stand for, concatenated: added tokens give
// their content, vocabulary tokens their raw bytes. The result is not valid
// UTF-8 when ids cut a character in two (use a Decoder for text shown to
// people); an id outside the vocabulary decodes to U+FFFD.
func (t *Tokenizer) Decode(ids []int) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(t.tokenBytes(id))
	}
	return b.String()
}

func (t *Tokenizer) tokenBytes(id int) string {
	if id < 0 || id >= len(t.idBytes) || !t.known[id] {
		return "\uFFFD"
	}
	return t.idBytes[id]
}

// TokenID returns the id of an added token's content or of a vocabulary entry
// written in the byte-level alphabet (as in tokenizer.json).
func (t *Tokenizer) TokenID(s string) (int, bool) {
	id, ok := t.byStr[s]
	return id, ok
}

// VocabSize is one more than the largest id in the vocabulary or the added
// tokens. Ids below it that name no token (holes) decode to U+FFFD.
func (t *Tokenizer) VocabSize() int { return len(t.idBytes) }

// BOS returns the id of tokenizer_config.json's bos_token; ok is false when
// none is configured.
func (t *Tokenizer) BOS() (id int, ok bool) { return t.bos, t.bos >= 0 }

// EOS returns the id of tokenizer_config.json's eos_token; ok is false when
// none is configured.
func (t *Tokenizer) EOS() (id int, ok bool) { return t.eos, t.eos >= 0 }

// AddedTokens returns a copy of the added tokens in id order.
func (t *Tokenizer) AddedTokens() []AddedToken {
	return append([]AddedToken(nil), t.added...)
}

// IsSpecial reports whether id is an added token flagged special.
func (t *Tokenizer) IsSpecial(id int) bool {
	return id >= 0 && id < len(t.special) && t.special[id]
}

// Decoder turns a stream of ids into text, one id at a time, without ever
// emitting part of a UTF-8 character: bytes of an incomplete character are
// held back until the character completes. Byte sequences that can never
// become valid UTF-8 are emitted as U+FFFD. A Decoder is not safe for
// concurrent use; the zero value is not usable (use NewDecoder).
type Decoder struct {
	t       *Tokenizer
	pending []byte
}

// NewDecoder returns a streaming decoder for t.
func (t *Tokenizer) NewDecoder() *Decoder { return &Decoder{t: t} }

// Add appends the bytes of id and returns the text that is now complete (may
// be empty). The returned string is always valid UTF-8.
func (d *Decoder) Add(id int) string {
	d.pending = append(d.pending, d.t.tokenBytes(id)...)
	var b strings.Builder
	p := d.pending
	for len(p) > 0 {
		r, n := utf8.DecodeRune(p)
		if r == utf8.RuneError && n <= 1 {
			if !utf8.FullRune(p) {
				break // an incomplete character at the end: wait for more
			}
			b.WriteRune(utf8.RuneError)
			p = p[1:]
			continue
		}
		b.Write(p[:n])
		p = p[n:]
	}
	d.pending = append(d.pending[:0], p...)
	return b.String()
}

// Flush returns what is held back (an incomplete character, as U+FFFD) and
// resets the decoder.
func (d *Decoder) Flush() string {
	if len(d.pending) == 0 {
		return ""
	}
	d.pending = d.pending[:0]
	return "\uFFFD"
}
