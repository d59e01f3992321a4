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
// t by chat.Encode: only the template's own markers become control tokens;
// text inside messages (contents, reasoning, tool arguments and results) is
// always plain text, even when it spells a control token such as <｜User｜>.
// (Raw /v1/completions prompts, by contrast, are the client's own template and
// do recognise control tokens.)
func DeepSeekV4Chat(t *tokenizer.Tokenizer) ChatTemplate { return dsv4Chat{t} }

type dsv4Chat struct{ t *tokenizer.Tokenizer }

func (c dsv4Chat) Prompt(msgs []chat.Message, opts chat.Options) ([]int, error) {
	return chat.Encode(c.t, msgs, opts)
}

// SystemPrefix implements systemPrefixer (chat.SystemPrefix).
func (c dsv4Chat) SystemPrefix(msgs []chat.Message, opts chat.Options, ids []int) int {
	return chat.SystemPrefix(c.t, msgs, opts, ids)
}
