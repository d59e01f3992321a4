package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"moxie/dsv4"
	"moxie/dsv4/npy"
)

func runLogits(args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlags("logits", "--model M --tokens FILE --prefill N --out OUT.npy", `
Run token ids through the model and save the logits, for checking moxie against
another implementation. FILE holds a JSON array of token ids. The first N tokens
go through one prefill, each later token through one decode step. OUT.npy gets
float32 logits of shape [len(tokens), vocab]; row i predicts token i+1.`, stderr)
	model := fs.String("model", defaultModel(), "model: a checkpoint directory or synth:PRESET")
	tokFile := fs.String("tokens", "", "JSON file with an array of token ids")
	prefill := fs.Int("prefill", 0, "how many leading tokens form the prefill (default: all)")
	out := fs.String("out", "", "output .npy file")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 || *tokFile == "" || *out == "" {
		return usagef("want --tokens FILE and --out OUT.npy (and no positional arguments)")
	}
	raw, err := os.ReadFile(*tokFile)
	if err != nil {
		return fmt.Errorf("reading token ids: %w", err)
	}
	var tokens []int
	if err := json.Unmarshal(raw, &tokens); err != nil {
		return fmt.Errorf("%s: want a JSON array of integer token ids: %w", *tokFile, err)
	}
	if len(tokens) == 0 {
		return fmt.Errorf("%s: the token array is empty", *tokFile)
	}
	n := *prefill
	if n == 0 {
		n = len(tokens)
	}
	if n < 1 || n > len(tokens) {
		return usagef("--prefill %d: want 1..%d (the number of tokens in %s)", n, len(tokens), *tokFile)
	}
	lm, err := loadModel(*model, nil, stderr)
	if err != nil {
		return err
	}
	defer lm.Close()
	V := lm.m.Cfg.VocabSize
	for i, t := range tokens {
		if t < 0 || t >= V {
			return fmt.Errorf("%s: token %d at index %d is outside the model's vocabulary [0, %d)", *tokFile, t, i, V)
		}
	}
	logits, err := dsv4.Logits(lm.m, tokens, n)
	if err != nil {
		return err
	}
	if err := npy.WriteFile(*out, logits, []int{len(tokens), V}); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s: float32 [%d, %d] (prefill %d, then %d decode steps)\n", *out, len(tokens), V, n, len(tokens)-n)
	return nil
}
