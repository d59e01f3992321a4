package tokenizer

import (
	"slices"
	"testing"

	"moxie/checkpoint"
	"moxie/dsv4/config"
)

// TestSynthTinyTokenizer loads the tokenizer that `moxie synth tiny` writes.
func TestSynthTinyTokenizer(t *testing.T) {
	tok, err := Load(checkpoint.TinyTokenizerJSON(), checkpoint.TinyTokenizerConfigJSON())
	if err != nil {
		t.Fatal(err)
	}
	if tok.VocabSize() != config.TinyVocab {
		t.Errorf("VocabSize = %d, want config.TinyVocab = %d", tok.VocabSize(), config.TinyVocab)
	}
	if id, ok := tok.BOS(); !ok || id != 0 {
		t.Errorf("BOS = %d, %v", id, ok)
	}
	if id, ok := tok.EOS(); !ok || id != 1 {
		t.Errorf("EOS = %d, %v", id, ok)
	}
	text := "<｜User｜>hé<｜Assistant｜><think>x</think>"
	want := []int{259, 3 + 'h', 3 + 0xC3, 3 + 0xA9, 260, 261, 3 + 'x', 262}
	if got := tok.Encode(text, EncodeOptions{AllowSpecial: true}); !slices.Equal(got, want) {
		t.Errorf("Encode = %v, want %v", got, want)
	}
	if got := tok.Decode(want); got != text {
		t.Errorf("Decode = %q", got)
	}
}
