package tokenizer

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// gpt2Alphabet is GPT-2's bytes_to_unicode written out the way the original
// Python does it (independently of byteLevelAlphabet): printable bytes keep
// their code point, the rest get 256, 257, ... in byte order.
func gpt2Alphabet() [256]rune {
	var bs []int
	for b := '!'; b <= '~'; b++ {
		bs = append(bs, int(b))
	}
	for b := 0xA1; b <= 0xAC; b++ {
		bs = append(bs, b)
	}
	for b := 0xAE; b <= 0xFF; b++ {
		bs = append(bs, b)
	}
	var out [256]rune
	for _, b := range bs {
		out[b] = rune(b)
	}
	n := 0
	for b := 0; b < 256; b++ {
		if !slices.Contains(bs, b) {
			out[b] = rune(256 + n)
			n++
		}
	}
	return out
}

func bl(s string) string {
	a := gpt2Alphabet()
	var r []rune
	for i := 0; i < len(s); i++ {
		r = append(r, a[s[i]])
	}
	return string(r)
}

type tokSpec struct {
	added      []map[string]any
	vocab      map[string]int
	merges     any
	preTok     any
	normalizer any
}

// tinyTokenizerJSON is the tokenizer the tiny synthetic model ships (as the
// task describes it): specials 0-2, the 256 byte symbols at 3..258 in byte
// order, role/think tokens at 259-262, placeholders up to 287, no merges.
func tinyTokenizerJSON() []byte {
	a := gpt2Alphabet()
	vocab := map[string]int{}
	added := []map[string]any{}
	add := func(id int, s string, special bool) {
		vocab[s] = id
		added = append(added, map[string]any{"id": id, "content": s, "single_word": false, "lstrip": false,
			"rstrip": false, "normalized": false, "special": special})
	}
	add(0, "<｜begin▁of▁sentence｜>", true)
	add(1, "<｜end▁of▁sentence｜>", true)
	add(2, "<｜▁pad▁｜>", true)
	for b := 0; b < 256; b++ {
		vocab[string(a[b])] = 3 + b
	}
	add(259, "<｜User｜>", true)
	add(260, "<｜Assistant｜>", true)
	add(261, "<think>", true)
	add(262, "</think>", true)
	for i := 263; i <= 287; i++ {
		add(i, fmt.Sprintf("<｜place▁holder▁no▁%d｜>", i-263), true)
	}
	return mustJSON(map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil, "added_tokens": added, "normalizer": nil,
		"pre_tokenizer":  map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		"post_processor": nil,
		"decoder":        map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": []string{}},
	})
}

const tinyConfigJSON = `{"add_bos_token": false, "add_eos_token": false,
 "bos_token": {"__type": "AddedToken", "content": "<｜begin▁of▁sentence｜>"},
 "eos_token": "<｜end▁of▁sentence｜>", "tokenizer_class": "PreTrainedTokenizerFast"}`

func mustJSON(v any) []byte {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic(err)
	}
	return []byte(b.String())
}

// dsv3PreTokJSON is the DeepSeek-V3 pre_tokenizer section.
func dsv3PreTokJSON() map[string]any {
	split := func(p string) map[string]any {
		return map[string]any{"type": "Split", "pattern": map[string]any{"Regex": p}, "behavior": "Isolated", "invert": false}
	}
	return map[string]any{"type": "Sequence", "pretokenizers": []any{
		split(dsv3DigitsPattern), split(dsv3CJKPattern), split(dsv3MainPattern),
		map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
	}}
}

// mergeTokenizerJSON is a small byte-level BPE with real merges and the
// DeepSeek-V3 pre-tokenizer: the 256 byte tokens (ids 0..255 in byte order),
// then one token per merge, plus two added tokens.
func mergeTokenizerJSON(merges [][2]string, preTok any) []byte {
	a := gpt2Alphabet()
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[string(a[b])] = b
	}
	var ms []string
	for _, m := range merges {
		l, r := bl(m[0]), bl(m[1])
		if _, ok := vocab[l+r]; !ok {
			vocab[l+r] = len(vocab)
		}
		ms = append(ms, l+" "+r)
	}
	n := len(vocab)
	return mustJSON(map[string]any{
		"added_tokens": []map[string]any{
			{"id": n, "content": "<s>", "special": true},
			{"id": n + 1, "content": "<tool>", "special": false},
		},
		"normalizer":    map[string]any{"type": "Sequence", "normalizers": []any{}},
		"pre_tokenizer": preTok,
		"decoder":       map[string]any{"type": "ByteLevel"},
		"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": ms},
	})
}

var englishMerges = [][2]string{
	{"t", "h"}, {"th", "e"}, {" ", "t"}, {" t", "he"}, {"i", "n"}, {"in", "g"}, {"e", "r"}, {" ", "a"},
	{"a", "n"}, {"an", "d"}, {" ", "and"}, {"o", "n"}, {"e", "s"}, {"r", "e"}, {" ", "s"}, {"l", "l"},
	{"h", "e"}, {" ", "w"}, {"o", "r"}, {" ", "c"}, {"1", "2"}, {"12", "3"}, {"\n", "\n"}, {" ", " "},
	{"  ", "  "}, {"a", "a"}, {"aa", "aa"},
}

func loadMergeTokenizer(t testing.TB) *Tokenizer {
	t.Helper()
	tok, err := Load(mergeTokenizerJSON(englishMerges, dsv3PreTokJSON()), nil)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func goEnvGOROOT() (string, error) {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	return strings.TrimSpace(string(out)), err
}
