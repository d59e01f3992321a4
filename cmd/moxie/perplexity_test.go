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

// TestPerplexityQATTarget runs the built-in trained miniature on a piece
// of its held-out text under both numeric targets: --target qat computes
// another function (the NLL differs) whose quality stays that of the
// exact one (the mean NLL within 1%: the reference's quantization of
// activations, KV and indexer is noise a trained model absorbs; a wrong
// scale or grid would not be). Bad --target values are usage errors.
func TestPerplexityQATTarget(t *testing.T) {
	if testing.Short() {
		t.Skip("two CPU runs of the built-in model")
	}
	model := defaultModel()
	if _, err := os.Stat(filepath.Join(model, "config.json")); err != nil {
		t.Skipf("no built-in model: %v", err)
	}
	held, err := os.ReadFile(filepath.Join("..", "..", "training", "data", "heldout.txt"))
	if err != nil {
		t.Skipf("no held-out text: %v", err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "h.txt")
	os.WriteFile(file, held[:3000], 0o644)
	nll := map[string]float64{}
	for _, target := range []string{"exact", "qat"} {
		out := filepath.Join(dir, target+".json")
		code, _, errs := moxie(t, "perplexity", "--model", model, "--file", file, "--window", "256", "--backend", "cpu", "--target", target, "--json", out)
		if code != 0 {
			t.Fatalf("--target %s: exit %d: %s", target, code, errs)
		}
		var rep pplReport
		b, _ := os.ReadFile(out)
		if err := json.Unmarshal(b, &rep); err != nil {
			t.Fatal(err)
		}
		nll[target] = rep.MeanNLL
	}
	t.Logf("mean NLL: exact %.6f, qat %.6f", nll["exact"], nll["qat"])
	if d := math.Abs(nll["qat"] - nll["exact"]); d == 0 || d > 0.01*nll["exact"] {
		t.Errorf("mean NLL: exact %.6f, qat %.6f: want them different, within 1%%", nll["exact"], nll["qat"])
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"perplexity", "--file", file, "--target", "fp8"}, "--target"},
		{[]string{"perplexity", "--file", file, "--target", "qat", "--backend", "cuda"}, "--backend cpu"},
	} {
		var errb strings.Builder
		if code := run(tc.args, strings.NewReader(""), io.Discard, &errb); code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 mentioning %q", tc.args, code, errb.String(), tc.want)
		}
	}
}
