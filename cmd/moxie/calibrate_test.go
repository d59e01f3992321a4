package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"moxie/checkpoint"
	"moxie/dsv4"
	"moxie/experts/trace"
	"moxie/reap"
	"moxie/tokenizer"
)

// TestCalibrate runs moxie calibrate on the tiny synthetic model and checks
// the report against the bookkeeping it must satisfy: one stats entry a layer,
// every token (BOS included) routed to top_k experts in every layer, so each
// layer's counts sum to tokens·top_k; and against a direct run: the same
// windows through dsv4 with a reap.Saliency attached give the same report.
func TestCalibrate(t *testing.T) {
	dir := t.TempDir()
	text := strings.Repeat("experts that are never chosen rank lowest. ", 5)
	file := filepath.Join(dir, "c.txt")
	os.WriteFile(file, []byte(text), 0o644)
	out := filepath.Join(dir, "s.json")
	code, stdout, errs := moxie(t, "calibrate", "--model", "synth:tiny", "--file", file, "--out", out, "--window", "30", "--chunk", "9", "--show", "3")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	rep, err := reap.ReadReportFile(out)
	if err != nil {
		t.Fatal(err)
	}
	src, _ := checkpoint.Open("synth:tiny")
	defer src.Close()
	sal, _ := reap.New(rep.Layers, rep.Experts)
	m, err := dsv4.Load(src, dsv4.Options{Observer: sal, MaxChunk: 9})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Layers != m.Cfg.NLayers || rep.Experts != m.Cfg.NRoutedExperts || rep.TopK != m.Cfg.NActivatedExperts {
		t.Fatalf("report shape %d layers x %d experts, top %d; model %d x %d, top %d", rep.Layers, rep.Experts, rep.TopK, m.Cfg.NLayers, m.Cfg.NRoutedExperts, m.Cfg.NActivatedExperts)
	}
	tj, _ := src.File("tokenizer.json")
	cj, _ := src.File("tokenizer_config.json")
	tok, _ := tokenizer.Load(tj, cj)
	ids := tok.Encode(text, tokenizer.EncodeOptions{})
	run := 0
	for lo := 0; lo < len(ids); lo += 29 {
		seg := append([]int{m.Cfg.BOS}, ids[lo:min(lo+29, len(ids))]...)
		if _, err := dsv4.Logits(m, seg, len(seg)); err != nil {
			t.Fatal(err)
		}
		run += len(seg)
	}
	if rep.Tokens != run {
		t.Errorf("report says %d tokens run, the windows hold %d", rep.Tokens, run)
	}
	for l, st := range rep.Stats {
		var n int64
		for _, c := range st.Count {
			n += c
		}
		if n != int64(run*rep.TopK) {
			t.Errorf("layer %d: %d routed slots, want tokens·top_k = %d", l, n, run*rep.TopK)
		}
	}
	direct := sal.Report(rep.Model, rep.Text, rep.Tokens, rep.TopK)
	for l := range rep.Layers {
		for e := range rep.Experts {
			a, oka := rep.Saliency(l, e)
			b, okb := direct.Saliency(l, e)
			if oka != okb || a != b {
				t.Fatalf("layer %d expert %d: calibrate %v (%v), a direct run %v (%v)", l, e, a, oka, b, okb)
			}
		}
	}
	if !strings.Contains(stdout, "least salient") || !strings.Contains(stdout, "report") {
		t.Errorf("stdout lacks the summary:\n%s", stdout)
	}
}

// TestCalibrateMaxTokens: --max-tokens N calibrates on the text's first N
// tokens: each layer's slots are (N + BOS a window)·top_k.
func TestCalibrateMaxTokens(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.txt")
	os.WriteFile(file, []byte(strings.Repeat("a long calibration text is cut. ", 20)), 0o644)
	out := filepath.Join(dir, "s.json")
	if code, _, errs := moxie(t, "calibrate", "--model", "synth:tiny", "--file", file, "--out", out, "--window", "16", "--max-tokens", "40"); code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	rep, err := reap.ReadReportFile(out)
	if err != nil {
		t.Fatal(err)
	}
	// 40 tokens in windows of 15 text tokens: 3 windows, 43 tokens run.
	if rep.Tokens != 43 {
		t.Errorf("%d tokens run, want 43 (40 text tokens and 3 BOS)", rep.Tokens)
	}
	for l, st := range rep.Stats {
		var n int64
		for _, c := range st.Count {
			n += c
		}
		if n != int64(43*rep.TopK) {
			t.Errorf("layer %d: %d slots, want %d", l, n, 43*rep.TopK)
		}
	}
}

func TestCalibrateUsage(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.txt")
	os.WriteFile(file, []byte("some text"), 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--model", "synth:tiny", "--file", file}, "--out"},
		{[]string{"--model", "synth:tiny", "--out", filepath.Join(dir, "s.json")}, "--file"},
		{[]string{"--model", "synth:tiny", "--file", file, "--out", filepath.Join(dir, "s.json"), "--backend", "cuda"}, "CPU"},
		{[]string{"--model", "synth:tiny", "--file", file, "--out", filepath.Join(dir, "s.json"), "--window", "1"}, "--window"},
		{[]string{"--model", "synth:tiny", "--file", file, "--out", filepath.Join(dir, "s.json"), "--max-tokens", "-1"}, "--max-tokens"},
		{[]string{"--model", "synth:tiny", "--file", filepath.Join(dir, "missing.txt"), "--out", filepath.Join(dir, "s.json")}, "calibration text"},
	} {
		code, _, errs := moxie(t, append([]string{"calibrate"}, c.args...)...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("calibrate %v: exit %d, stderr %q; want a failure mentioning %q", c.args, code, errs, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "s.json")); err == nil {
		t.Error("a failed calibration left a report")
	}
}

// TestPruneMasksTheLeastSalient calibrates the tiny model, then runs
// perplexity with --prune REPORT:N while recording routes: in every
// score-routed layer no token selects one of the report's N least salient
// experts, and the hash-routed layers select as they do without the mask.
func TestPruneMasksTheLeastSalient(t *testing.T) {
	dir := t.TempDir()
	text := strings.Repeat("a pruned model routes around the experts it lost. ", 6)
	file := filepath.Join(dir, "c.txt")
	os.WriteFile(file, []byte(text), 0o644)
	sal := filepath.Join(dir, "s.json")
	if code, _, errs := moxie(t, "calibrate", "--model", "synth:tiny", "--file", file, "--out", sal, "--window", "40"); code != 0 {
		t.Fatalf("calibrate: exit %d: %s", code, errs)
	}
	rep, err := reap.ReadReportFile(sal)
	if err != nil {
		t.Fatal(err)
	}
	const n = 3
	routes := func(prune bool) *trace.Trace {
		tr := filepath.Join(dir, fmt.Sprintf("r%v.trace", prune))
		args := []string{"perplexity", "--model", "synth:tiny", "--file", file, "--window", "40", "--backend", "cpu", "--record-routes", tr}
		if prune {
			args = append(args, "--prune", fmt.Sprintf("%s:%d", sal, n))
		}
		code, _, errs := moxie(t, args...)
		if code != 0 {
			t.Fatalf("perplexity (prune %v): exit %d: %s", prune, code, errs)
		}
		if prune && !strings.Contains(errs, "least salient") {
			t.Errorf("stderr does not say what --prune did:\n%s", errs)
		}
		got, err := trace.ReadFile(tr)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	plain, pruned := routes(false), routes(true)
	src, _ := checkpoint.Open("synth:tiny")
	defer src.Close()
	m, err := dsv4.Load(src, dsv4.Options{})
	if err != nil {
		t.Fatal(err)
	}
	masked := map[[2]int]bool{}
	for l := range rep.Layers {
		if !m.Cfg.HashRouted(l) {
			for _, e := range rep.Ranking(l)[:n] {
				masked[[2]int{l, e}] = true
			}
		}
	}
	if len(plain.Records) != len(pruned.Records) || len(plain.Records) == 0 {
		t.Fatalf("%d records without the mask, %d with", len(plain.Records), len(pruned.Records))
	}
	hits := 0
	for i, r := range pruned.Records {
		if r.Layer >= rep.Layers {
			continue // MTP blocks keep every expert
		}
		if m.Cfg.HashRouted(r.Layer) {
			if fmt.Sprint(r.Experts) != fmt.Sprint(plain.Records[i].Experts) {
				t.Fatalf("hash-routed layer %d position %d: %v with the mask, %v without", r.Layer, r.Pos, r.Experts, plain.Records[i].Experts)
			}
			continue
		}
		for _, e := range r.Experts {
			if masked[[2]int{r.Layer, e}] {
				t.Fatalf("layer %d position %d selected masked expert %d", r.Layer, r.Pos, e)
			}
		}
		for _, e := range plain.Records[i].Experts {
			if masked[[2]int{r.Layer, e}] {
				hits++
			}
		}
	}
	if hits == 0 {
		t.Error("the unmasked run never selected a masked expert: the test would pass without a mask")
	}
	for _, bad := range []string{sal, sal + ":0", sal + ":x", filepath.Join(dir, "none.json") + ":2", fmt.Sprintf("%s:%d", sal, m.Cfg.NRoutedExperts)} {
		code, _, errs := moxie(t, "perplexity", "--model", "synth:tiny", "--file", file, "--prune", bad)
		if code == 0 || !strings.Contains(errs, "--prune") {
			t.Errorf("--prune %s: exit %d, stderr %q; want a failure naming --prune", bad, code, errs)
		}
	}
}

func TestParsePrune(t *testing.T) {
	for _, c := range []struct {
		in     string
		report string
		n      int
		ok     bool
	}{
		{"s.json:8", "s.json", 8, true},
		{"dir:with:colons/s.json:16", "dir:with:colons/s.json", 16, true},
		{"s.json", "", 0, false},
		{"s.json:", "", 0, false},
		{":4", "", 0, false},
		{"s.json:0", "", 0, false},
		{"s.json:-2", "", 0, false},
		{"s.json:x", "", 0, false},
	} {
		p, err := parsePrune(c.in)
		if (err == nil) != c.ok || (c.ok && (p.report != c.report || p.n != c.n)) {
			t.Errorf("parsePrune(%q) = %+v, %v; want report %q n %d ok %v", c.in, p, err, c.report, c.n, c.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "--prune") {
			t.Errorf("parsePrune(%q): error %q does not name --prune", c.in, err)
		}
	}
}

func FuzzParsePrune(f *testing.F) {
	for _, s := range []string{"s.json:8", "a:b:3", ":", "x:0", "x:99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		p, err := parsePrune(in)
		if err != nil {
			return
		}
		if p.n < 1 || p.report == "" || !strings.HasSuffix(in, ":"+fmt.Sprint(p.n)) && !strings.Contains(in, p.report) {
			t.Fatalf("parsePrune(%q) = %+v", in, p)
		}
	})
}
