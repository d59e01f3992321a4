package server

import (
	"moxie/chat"
	"moxie/generate"
	"moxie/tokenizer"
)

// FromTokenizer adapts a *tokenizer.Tokenizer to Tokenizer: Encode recognises
// control tokens written in the text (AllowSpecial), and detokenizers are
// tokenizer.Decoders.
func FromTokenizer(t *tokenizer.Tokenizer) Tokenizer { return tokAdapter{t} }

type tokAdapter struct{ t *tokenizer.Tokenizer }

func (a tokAdapter) Encode(text string) []int {
	return a.t.Encode(text, tokenizer.EncodeOptions{AllowSpecial: true})
}

func (a tokAdapter) NewDetokenizer() generate.Detokenizer { return a.t.NewDecoder() }

// DeepSeekV4Chat is the DeepSeek-V4 chat template (package chat) encoded with
// t. The rendered prompt is encoded with control tokens recognised, so
// control-token text inside a message becomes a control token too: like any
// raw-prompt API, the server trusts its clients with their own
// conversations.
func DeepSeekV4Chat(t *tokenizer.Tokenizer) ChatTemplate { return dsv4Chat{t} }

type dsv4Chat struct{ t *tokenizer.Tokenizer }

func (c dsv4Chat) Prompt(msgs []chat.Message, opts chat.Options) ([]int, error) {
	text, err := chat.Render(msgs, opts)
	if err != nil {
		return nil, err
	}
	return c.t.Encode(text, tokenizer.EncodeOptions{AllowSpecial: true}), nil
}
