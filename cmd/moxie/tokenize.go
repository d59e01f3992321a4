package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"moxie/tokenizer"
)

const tokenizeAbout = `Encode text to token ids with a model's tokenizer, or decode ids to text.

Input is read line by line from --file or stdin. When encoding, a line that is
a JSON string literal ("a\tb\n") is unescaped first, so tabs, newlines and
other characters can be written; any other line is taken as is (without its
line ending). Each input line gives one output line: a JSON array of ids.
With --decode each input line must be a JSON array of ids, and each output
line is the decoded text as a JSON string literal.

Control tokens such as <｜User｜> or <think> are recognised in the text only
with --special; otherwise they are encoded as ordinary characters.

DIR must hold tokenizer.json and tokenizer_config.json (as shipped with the
checkpoint).`

// runTokenize implements "moxie tokenize --model DIR [--file F] [--decode]
// [--special]".
func runTokenize(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	flags := newFlags("tokenize", "--model DIR [--file F] [--decode] [--special]", tokenizeAbout, stderr)
	modelDir := flags.String("model", "", "model directory holding tokenizer.json and tokenizer_config.json (required)")
	file := flags.String("file", "", "read input lines from this file instead of stdin")
	decode := flags.Bool("decode", false, "decode JSON arrays of ids to text")
	special := flags.Bool("special", false, "recognise control tokens written in the text (encoding only)")
	if err := parseFlags(flags, args); err != nil {
		return err
	}
	if flags.NArg() > 0 {
		return usagef("unexpected arguments %q (input comes from --file or stdin)", flags.Args())
	}
	if *modelDir == "" {
		return usagef("--model DIR is required")
	}
	tok, err := loadTokenizerDir(*modelDir)
	if err != nil {
		return err
	}
	in := stdin
	name := "stdin"
	if *file != "" {
		f, err := os.Open(*file)
		if err != nil {
			return err
		}
		defer f.Close()
		in, name = f, *file
	}
	out := bufio.NewWriter(stdout)
	defer out.Flush()
	r := bufio.NewReader(in)
	for lineNo := 1; ; lineNo++ {
		line, err := r.ReadString('\n')
		if line == "" && err != nil {
			if errors.Is(err, io.EOF) {
				return out.Flush()
			}
			return fmt.Errorf("%s: %w", name, err)
		}
		line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
		var res []byte
		if *decode {
			res, err = decodeLine(tok, line)
		} else {
			res, err = encodeLine(tok, line, *special)
		}
		if err != nil {
			return fmt.Errorf("%s:%d: %w", name, lineNo, err)
		}
		out.Write(res)
		out.WriteByte('\n')
	}
}

// loadTokenizerDir loads DIR/tokenizer.json and DIR/tokenizer_config.json.
func loadTokenizerDir(dir string) (*tokenizer.Tokenizer, error) {
	read := func(name string) ([]byte, error) {
		p := filepath.Join(dir, name)
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s not found: --model must be a checkpoint directory with tokenizer.json and tokenizer_config.json (download them with the model)", p)
		}
		return b, err
	}
	tj, err := read("tokenizer.json")
	if err != nil {
		return nil, err
	}
	cj, err := read("tokenizer_config.json")
	if err != nil {
		return nil, err
	}
	tok, err := tokenizer.Load(tj, cj)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return tok, nil
}

func encodeLine(tok *tokenizer.Tokenizer, line string, special bool) ([]byte, error) {
	text := line
	if strings.HasPrefix(line, `"`) {
		var s string
		if json.Unmarshal([]byte(line), &s) == nil {
			text = s
		}
	}
	ids := tok.Encode(text, tokenizer.EncodeOptions{AllowSpecial: special})
	if ids == nil {
		ids = []int{}
	}
	return json.Marshal(ids)
}

func decodeLine(tok *tokenizer.Tokenizer, line string) ([]byte, error) {
	var ids []int
	if err := json.Unmarshal([]byte(line), &ids); err != nil {
		return nil, fmt.Errorf("want a JSON array of token ids: %v", err)
	}
	for _, id := range ids {
		if id < 0 || id >= tok.VocabSize() {
			return nil, fmt.Errorf("id %d is outside the vocabulary [0, %d)", id, tok.VocabSize())
		}
	}
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(tok.Decode(ids)); err != nil {
		return nil, err
	}
	return []byte(strings.TrimSuffix(b.String(), "\n")), nil
}
