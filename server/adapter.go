package server

import (
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
