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

// TestSystemPrefix: conversations with one system prompt (and tools) share
// exactly the prefix SystemPrefix reports, and it is what the system
// messages alone encode to; without a system message it is 0.
func TestSystemPrefix(t *testing.T) {
	tok := tinyTokenizer(t)
	sys := []Message{{Role: "system", Content: "You are a careful assistant. Answer briefly."},
		{Role: "system", Content: "Dates are in UTC.", Tools: []Tool{{Type: "function", Function: []byte(`{"name":"clock","description":"the time","parameters":{"type":"object"}}`)}}}}
	convs := [][]Message{
		append(slices.Clone(sys), Message{Role: "user", Content: "What time is it?"}),
		append(slices.Clone(sys), Message{Role: "user", Content: "Tell me a story."}, Message{Role: "assistant", Content: "Once."}, Message{Role: "user", Content: "More."}),
	}
	for _, opts := range []Options{{}, {Thinking: true}} {
		var prefixes [][]int
		for i, msgs := range convs {
			ids, err := Encode(tok, msgs, opts)
			if err != nil {
				t.Fatal(err)
			}
			n := SystemPrefix(tok, msgs, opts, ids)
			alone, err := Encode(tok, sys, opts)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 || !slices.Equal(ids[:n], alone) {
				t.Fatalf("thinking %v, conversation %d: prefix %d, want the system messages' %d ids", opts.Thinking, i, n, len(alone))
			}
			prefixes = append(prefixes, ids[:n])
			if z := SystemPrefix(tok, msgs[len(sys):], opts, ids); z != 0 {
				t.Errorf("without a system message: prefix %d, want 0", z)
			}
			if z := SystemPrefix(tok, msgs, opts, ids[:n]); z != 0 {
				t.Errorf("ids that end with the system part: prefix %d, want 0", z)
			}
		}
		if !slices.Equal(prefixes[0], prefixes[1]) {
			t.Errorf("thinking %v: the two conversations' prefixes differ", opts.Thinking)
		}
	}
}
