package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeByteTokenizer writes a byte-level tokenizer without merges: byte b
// has id b (in GPT-2's byte-to-character spelling), <think> is id 256.
func writeByteTokenizer(t *testing.T) string {
	t.Helper()
	vocab := map[string]int{}
	n := 0
	for b := 0; b < 256; b++ {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		if printable {
			vocab[string(rune(b))] = b
		} else {
			vocab[string(rune(256+n))] = b
			n++
		}
	}
	tj, err := json.Marshal(map[string]any{
		"added_tokens":  []any{map[string]any{"id": 256, "content": "<think>", "special": true}},
		"pre_tokenizer": map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
		"decoder":       map[string]any{"type": "ByteLevel"},
		"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tj, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"add_bos_token": false}`), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestTokenize(t *testing.T) {
	dir := writeByteTokenizer(t)
	tests := []struct {
		name  string
		args  []string
		input string
		want  string
	}{
		{"plain lines", nil, "ab\nc\r\n", "[97,98]\n[99]\n"},
		{"json string line", nil, `"a\tb\n"` + "\n", "[97,9,98,10]\n"},
		{"not a json string", nil, `"open` + "\n", "[34,111,112,101,110]\n"},
		{"special off", nil, "<think>\n", "[60,116,104,105,110,107,62]\n"},
		{"special on", []string{"--special"}, "<think>x\n", "[256,120]\n"},
		{"empty line", nil, "\n", "[]\n"},
		{"no final newline", nil, "é", "[195,169]\n"},
		{"decode", []string{"--decode"}, "[97,10,98]\n[256]\n[]\n", "\"a\\nb\"\n\"<think>\"\n\"\"\n"},
	}
	for _, c := range tests {
		t.Run(c.name, func(t *testing.T) {
			var out, errb strings.Builder
			args := append([]string{"--model", dir}, c.args...)
			if err := runTokenize(args, strings.NewReader(c.input), &out, &errb); err != nil {
				t.Fatalf("err %v (stderr %s)", err, errb.String())
			}
			if out.String() != c.want {
				t.Errorf("got %q, want %q", out.String(), c.want)
			}
		})
	}
}

func TestTokenizeFileAndErrors(t *testing.T) {
	dir := writeByteTokenizer(t)
	in := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(in, []byte("hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb strings.Builder
	if err := runTokenize([]string{"--model", dir, "--file", in}, strings.NewReader("ignored"), &out, &errb); err != nil || out.String() != "[104,105]\n" {
		t.Errorf("--file: %q, %v", out.String(), err)
	}
	for _, c := range []struct {
		name  string
		args  []string
		input string
		want  string
	}{
		{"no model", nil, "", "--model DIR is required"},
		{"missing files", []string{"--model", t.TempDir()}, "", "tokenizer.json not found"},
		{"bad decode line", []string{"--model", dir, "--decode"}, "[1,2\n", ":1: want a JSON array"},
		{"id out of range", []string{"--model", dir, "--decode"}, "[1]\n[999]\n", ":2: id 999 is outside"},
		{"extra args", []string{"--model", dir, "x"}, "", "unexpected arguments"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errb strings.Builder
			err := runTokenize(c.args, strings.NewReader(c.input), &out, &errb)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err = %v, want it to mention %q", err, c.want)
			}
		})
	}
}
