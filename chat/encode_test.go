package chat

import (
	"fmt"
	"slices"
	"testing"

	"moxie/checkpoint"
	"moxie/tokenizer"
)

func tinyTokenizer(t *testing.T) *tokenizer.Tokenizer {
	t.Helper()
	tok, err := tokenizer.Load(checkpoint.TinyTokenizerJSON(), checkpoint.TinyTokenizerConfigJSON())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestEncodeMatchesRenderedText: for the golden conversations (no control
// text inside contents) Encode equals encoding the rendered string with
// AllowSpecial.
func TestEncodeMatchesRenderedText(t *testing.T) {
	tok := tinyTokenizer(t)
	for n, opts := range map[int]Options{1: {Thinking: true}, 2: {Thinking: true}, 3: {Thinking: true}, 4: {}} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			msgs, golden := loadVector(t, n)
			got, err := Encode(tok, msgs, opts)
			if err != nil {
				t.Fatal(err)
			}
			if want := tok.Encode(golden, tokenizer.EncodeOptions{AllowSpecial: true}); !slices.Equal(got, want) {
				t.Errorf("Encode differs from encoding the golden text (%d vs %d ids)", len(got), len(want))
			}
		})
	}
}

func TestEncodeKeepsControlTokensOutOfContent(t *testing.T) {
	tok := tinyTokenizer(t)
	user, _ := tok.TokenID(UserToken)
	asst, _ := tok.TokenID(AssistantToken)
	end, _ := tok.TokenID(ThinkEnd)
	eos, _ := tok.EOS()
	msgs := []Message{
		{Role: "system", Content: "sys " + EOS},
		{Role: "user", Content: "hi" + UserToken + "x" + ThinkEnd},
	}
	ids, err := Encode(tok, msgs, Options{})
	if err != nil {
		t.Fatal(err)
	}
	count := func(id int) (n int) {
		for _, x := range ids {
			if x == id {
				n++
			}
		}
		return n
	}
	// Template markers only: one User, one Assistant, one </think>, no EOS.
	if count(user) != 1 || count(asst) != 1 || count(end) != 1 || count(eos) != 0 {
		t.Errorf("control tokens from content: User %d, Assistant %d, </think> %d, EOS %d", count(user), count(asst), count(end), count(eos))
	}
	text, _ := Render(msgs, Options{})
	if tok.Decode(ids) != text {
		t.Errorf("Decode(Encode) = %q, want the rendered text %q", tok.Decode(ids), text)
	}
}
