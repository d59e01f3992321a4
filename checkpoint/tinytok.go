package checkpoint

import (
	"encoding/json"
	"fmt"

	"moxie/dsv4/config"
)

// tinySpecial are the tiny preset's special tokens after the 256 byte tokens.
var tinySpecial = []string{"<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"}

// byteLevelAlphabet is the byte-level BPE mapping of bytes to printable runes
// (printable Latin-1 bytes map to themselves, the rest to U+0100 upwards in byte
// order), as used by GPT-2-style tokenizers and DeepSeek's.
func byteLevelAlphabet() [256]rune {
	var m [256]rune
	next := rune(256)
	for b := range 256 {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF {
			m[b] = rune(b)
		} else {
			m[b] = next
			next++
		}
	}
	return m
}

// TinyTokenizerJSON is the tiny preset's tokenizer.json: a byte-level BPE with
// no merges. Ids: 0 BOS, 1 EOS, 2 pad, 3..258 the bytes 0..255, then the chat
// special tokens, then placeholders up to config.TinyVocab.
func TinyTokenizerJSON() []byte {
	type added struct {
		ID         int    `json:"id"`
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		Normalized bool   `json:"normalized"`
		Special    bool   `json:"special"`
	}
	vocab := map[string]int{}
	var addedTokens []added
	addSpecial := func(id int, s string) {
		vocab[s] = id
		addedTokens = append(addedTokens, added{ID: id, Content: s, Special: true})
	}
	addSpecial(0, "<｜begin▁of▁sentence｜>")
	addSpecial(1, "<｜end▁of▁sentence｜>")
	addSpecial(2, "<｜▁pad▁｜>")
	for b, r := range byteLevelAlphabet() {
		vocab[string(r)] = 3 + b
	}
	id := 259
	for _, s := range tinySpecial {
		addSpecial(id, s)
		id++
	}
	for n := 0; id < config.TinyVocab; n++ {
		addSpecial(id, fmt.Sprintf("<｜place▁holder▁no▁%d｜>", n))
		id++
	}
	tok := map[string]any{
		"version":        "1.0",
		"truncation":     nil,
		"padding":        nil,
		"added_tokens":   addedTokens,
		"normalizer":     nil,
		"pre_tokenizer":  map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		"post_processor": nil,
		"decoder":        map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
			"vocab": vocab, "merges": []string{},
		},
	}
	out, err := json.MarshalIndent(tok, "", "  ")
	if err != nil {
		panic(err)
	}
	return append(out, '\n')
}

// TinyTokenizerConfigJSON is the tiny preset's tokenizer_config.json.
func TinyTokenizerConfigJSON() []byte {
	return []byte(`{
  "add_bos_token": false,
  "add_eos_token": false,
  "bos_token": "<｜begin▁of▁sentence｜>",
  "eos_token": "<｜end▁of▁sentence｜>",
  "pad_token": "<｜end▁of▁sentence｜>",
  "legacy": true,
  "model_max_length": 4096,
  "tokenizer_class": "PreTrainedTokenizerFast"
}
`)
}
