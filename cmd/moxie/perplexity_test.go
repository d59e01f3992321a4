package main

import (
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"moxie/checkpoint"
	"moxie/dsv4"
	"moxie/tokenizer"
)

// TestPerplexityMatchesDirectComputation recomputes the report from whole-window
// logits (dsv4.Logits, one prefill per window) and a separately written
// log-softmax, and checks the window bookkeeping: every text token predicted once.
func TestPerplexityMatchesDirectComputation(t *testing.T) {
	dir := t.TempDir()
	text := strings.Repeat("moxie reads the checkpoint as shipped. ", 6)
	file := filepath.Join(dir, "t.txt")
	os.WriteFile(file, []byte(text), 0o644)
	out := filepath.Join(dir, "p.json")
	const window = 40
	code, _, errs := moxie(t, "perplexity", "--model", "synth:tiny", "--file", file, "--window", "40", "--chunk", "7", "--json", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var rep pplReport
	b, _ := os.ReadFile(out)
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}

	src, _ := checkpoint.Open("synth:tiny")
	defer src.Close()
	m, err := dsv4.Load(src, dsv4.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tj, _ := src.File("tokenizer.json")
	cj, _ := src.File("tokenizer_config.json")
	tok, _ := tokenizer.Load(tj, cj)
	ids := tok.Encode(text, tokenizer.EncodeOptions{})
	V := m.Cfg.VocabSize
	var nll float64
	segments := 0
	for lo := 0; lo < len(ids); lo += window - 1 {
		seg := append([]int{m.Cfg.BOS}, ids[lo:min(lo+window-1, len(ids))]...)
		logits, err := dsv4.Logits(m, seg, len(seg))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(seg); i++ {
			row := logits[i*V : (i+1)*V]
			var z float64
			for _, v := range row {
				z += math.Exp(float64(v))
			}
			nll += math.Log(z) - float64(row[seg[i+1]])
		}
		segments++
	}
	want := nll / float64(len(ids))
	if rep.Tokens != len(ids) || rep.Segments != segments || rep.Window != window {
		t.Fatalf("report counts %d tokens in %d windows of %d; want %d in %d of %d", rep.Tokens, rep.Segments, rep.Window, len(ids), segments, window)
	}
	if math.Abs(rep.MeanNLL-want) > 1e-5*want {
		t.Fatalf("mean NLL %.8f, direct computation %.8f", rep.MeanNLL, want)
	}
	if math.Abs(rep.Perplexity-math.Exp(want)) > 1e-4*math.Exp(want) {
		t.Fatalf("perplexity %g, want exp(%g)", rep.Perplexity, want)
	}
}

func TestPerplexityBadInput(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.txt")
	os.WriteFile(empty, nil, 0o644)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"perplexity"}, 2, "--file"},
		{[]string{"perplexity", "--file", empty, "--window", "1"}, 2, "--window"},
		{[]string{"perplexity", "--file", filepath.Join(dir, "nope.txt")}, 1, "nope.txt"},
		{[]string{"perplexity", "--file", empty}, 1, "no tokens"},
	} {
		var errb strings.Builder
		code := run(tc.args, strings.NewReader(""), io.Discard, &errb)
		if code != tc.code || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d mentioning %q", tc.args, code, errb.String(), tc.code, tc.want)
		}
	}
}
