package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"moxie/generate"
	"moxie/tokenizer"
)

func TestRunOneShotIsReproducibleAndReportsStats(t *testing.T) {
	args := []string{"run", "--max-tokens", "12", "--seed", "42", "--temperature", "0.8", "Hello, moxie"}
	code, out1, errs := moxie(t, args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	_, out2, _ := moxie(t, args...)
	if out1 != out2 || out1 == "" {
		t.Fatalf("same seed gave different answers:\n%q\n%q", out1, out2)
	}
	for _, want := range []string{"[prompt ", "prefill", "decode", "12 tok, length", "memory"} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errs)
		}
	}
	// The default is the trained miniature, not a synthetic model.
	if strings.Contains(errs, "synthetic model") {
		t.Errorf("the default model was announced as synthetic:\n%s", errs)
	}
	if _, _, errs := moxie(t, "run", "--model", "synth:tiny", "--max-tokens", "2", "Hi"); !strings.Contains(errs, "synthetic model") {
		t.Errorf("synth:tiny was not announced as synthetic:\n%s", errs)
	}
	_, out3, _ := moxie(t, "run", "--max-tokens", "12", "--seed", "43", "--temperature", "0.8", "Hello, moxie")
	if out3 == out1 {
		t.Errorf("a different seed gave the same sampled answer %q", out1)
	}
}

// loadDefaultChat loads the built-in model and its tokenizer, closed when
// tb ends.
func loadDefaultChat(tb testing.TB) (*loadedModel, *tokenizer.Tokenizer) {
	tb.Helper()
	lm, err := loadModel(defaultModel(), nil, io.Discard)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { lm.Close() })
	tok, err := loadTokenizer(lm)
	if err != nil {
		tb.Fatal(err)
	}
	return lm, tok
}

func TestRunInteractive(t *testing.T) {
	var out, errb strings.Builder
	in := strings.NewReader("first question\n/reset\nsecond\n/exit\nnever read\n")
	// A strings.Reader is not a terminal, so pass the conversation through the
	// interactive loop directly.
	lm, tok := loadDefaultChat(t)
	r := &runner{m: lm.m, tok: tok, maxTokens: 4, stats: true, stdout: &out, stderr: &errb}
	if err := r.interactive(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(errb.String(), "[prompt "); n != 2 {
		t.Fatalf("%d answers, want 2 (before /reset and after):\n%s", n, errb.String())
	}
	if !strings.Contains(errb.String(), "conversation cleared") {
		t.Fatal("/reset did not say it cleared the conversation")
	}
	if len(r.history) != 2 || r.history[0].Content != "second" {
		t.Fatalf("history after /reset = %+v, want only the second exchange", r.history)
	}
}

// TestRunChatContinuesConversation: with the prompt cache each turn's
// prompt extends the last turn's sequence (the conversation so far, as
// the model generated it), so a turn prefills only its new tokens. The
// cached count is exact: the previous prompt plus the tokens fed back, all
// generated tokens but the last (sampled, then generation stopped). In
// thinking mode the template drops the reasoning, so the next prompt
// leaves the previous one at its last token (<think>): the copy of the
// sequence from before that token is continued (len(prompt) - 1 cached).
func TestRunChatContinuesConversation(t *testing.T) {
	lm, tok := loadDefaultChat(t)
	for _, think := range []bool{false, true} {
		t.Run(fmt.Sprintf("think=%v", think), func(t *testing.T) {
			var out, errb strings.Builder
			in := strings.NewReader("Tell me about the river.\nAnd then what happened?\nWhy?\n/exit\n")
			cache := generate.NewCache(1)
			defer cache.Close()
			r := &runner{m: lm.m, tok: tok, maxTokens: 12, think: think, stats: true, stdout: &out, stderr: &errb, cache: cache}
			if err := r.interactive(t.Context(), in); err != nil {
				t.Fatal(err)
			}
			re := regexp.MustCompile(`\[prompt (\d+) tok(?: \((\d+) cached\))? \|.*\| (\d+) tok, `)
			m := re.FindAllStringSubmatch(errb.String(), -1)
			if len(m) != 3 {
				t.Fatalf("%d stats lines, want 3:\n%s", len(m), errb.String())
			}
			num := func(s string) int { n, _ := strconv.Atoi(s); return n }
			if m[0][2] != "" {
				t.Errorf("the first turn reports %s cached tokens", m[0][2])
			}
			reused := 0
			for i := 1; i < 3; i++ {
				prev, gen := num(m[i-1][1]), num(m[i-1][3])
				want, why := prev+gen-1, fmt.Sprintf("the previous prompt's %d and %d generated tokens fed back", prev, gen-1)
				if think {
					want, why = prev-1, "the previous prompt but its <think>"
				}
				if c := m[i][2]; c != "" {
					reused++
					if num(c) != want {
						t.Errorf("turn %d: %s cached tokens, want %d (%s)", i+1, c, want, why)
					}
				}
			}
			// Both later turns continue here; a reply that does not survive
			// being decoded and encoded again would cost its next turn the
			// reuse (without thinking).
			if reused == 0 {
				t.Errorf("no turn continued the conversation's sequence:\n%s", errb.String())
			}
			if cache.Len() != 1 {
				t.Errorf("the cache holds %d generations after the chat, want 1", cache.Len())
			}
		})
	}
}

func TestRunStdinPromptAndRaw(t *testing.T) {
	var out, errb strings.Builder
	code := run([]string{"run", "--raw", "--max-tokens", "5", "--temperature", "0"}, strings.NewReader("raw text prompt\n"), &out, &errb)
	if code != 0 || !strings.Contains(errb.String(), "5 tok, length") {
		t.Fatalf("exit %d, stderr %s", code, errb.String())
	}
}

func TestRunNeedsTokenizer(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "m")
	if code, _, errs := moxie(t, "synth", "tiny", "--out", dir); code != 0 {
		t.Fatal(errs)
	}
	if err := os.Remove(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	code, _, errs := moxie(t, "run", "--model", dir, "hi")
	if code != 1 || !strings.Contains(errs, "tokenizer.json") {
		t.Fatalf("exit %d, stderr %q: want an error naming tokenizer.json", code, errs)
	}
	// And the same directory with its tokenizer answers.
	dir2 := filepath.Join(t.TempDir(), "m2")
	moxie(t, "synth", "tiny", "--out", dir2)
	if code, _, errs := moxie(t, "run", "--model", dir2, "--max-tokens", "3", "hi"); code != 0 {
		t.Fatalf("run on a synth directory: exit %d: %s", code, errs)
	}
}

func TestRunBadFlags(t *testing.T) {
	for _, args := range [][]string{{"run", "--max-tokens", "0", "x"}, {"run", "--top-p", "2", "x"}, {"run", "--temperature", "-1", "x"}} {
		if code, _, errs := moxie(t, args...); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", args, code, errs)
		}
	}
}

// TestDefaultModelResolution checks where the built-in model is looked for:
// $MOXIE_MODEL first, then models/brown-mini in the working directory or a
// parent, and a clear error naming what to do when it is nowhere.
func TestDefaultModelResolution(t *testing.T) {
	t.Run("from a subdirectory of the repository", func(t *testing.T) {
		d := defaultModel()
		if _, err := os.Stat(filepath.Join(d, "config.json")); err != nil || filepath.Base(d) != "brown-mini" {
			t.Fatalf("defaultModel() = %q (%v), want the repository's models/brown-mini", d, err)
		}
	})
	t.Run("MOXIE_MODEL wins", func(t *testing.T) {
		t.Setenv("MOXIE_MODEL", "synth:tiny")
		if d := defaultModel(); d != "synth:tiny" {
			t.Fatalf("defaultModel() = %q, want synth:tiny", d)
		}
	})
	t.Run("nowhere", func(t *testing.T) {
		t.Chdir(t.TempDir())
		if d := defaultModel(); d != builtinModel {
			t.Skipf("found %q beside the test executable", d)
		}
		code, _, errs := moxie(t, "run", "Hi")
		if code == 0 || !strings.Contains(errs, "MOXIE_MODEL") || !strings.Contains(errs, builtinModel) {
			t.Fatalf("exit %d, stderr %q: want a failure naming %s and MOXIE_MODEL", code, errs, builtinModel)
		}
	})
}

func TestBackendFlag(t *testing.T) {
	t.Run("unknown backend is a usage error", func(t *testing.T) {
		code, _, errs := moxie(t, "run", "--model", "synth:tiny", "--backend", "tpu", "Hi")
		if code != 2 || !strings.Contains(errs, "--backend") || !strings.Contains(errs, "cpu, cuda or auto") {
			t.Fatalf("exit %d, stderr %q", code, errs)
		}
	})
	t.Run("auto runs on the GPU or says why not", func(t *testing.T) {
		code, out, errs := moxie(t, "run", "--model", "synth:tiny", "--backend", "auto", "--max-tokens", "2", "Hi")
		if code != 0 || out == "" {
			t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
		}
		if !strings.Contains(errs, "running on the CPU") && !strings.Contains(errs, "device: ") {
			t.Fatalf("stderr says neither where the model ran nor why not the GPU: %q", errs)
		}
	})
}

// TestChunkFlag checks that --chunk changes nothing but the chunking: a
// prompt prefilled in chunks of 3 gives the same greedy tokens as in one
// chunk (the CPU's chunkings agree to 1e-5: dsv4's
// TestPrefillChunkDecodeAgree), and a negative chunk is a usage error.
func TestChunkFlag(t *testing.T) {
	t.Run("negative is a usage error", func(t *testing.T) {
		code, _, errs := moxie(t, "run", "--model", "synth:tiny", "--backend", "cpu", "--chunk", "-4", "Hi")
		if code != 2 || !strings.Contains(errs, "--chunk") {
			t.Fatalf("exit %d, stderr %q: want a usage error naming --chunk", code, errs)
		}
	})
	t.Run("small chunks give the same tokens", func(t *testing.T) {
		var outs []string
		for _, chunk := range []string{"3", "0"} {
			code, out, errs := moxie(t, "run", "--model", "synth:tiny", "--backend", "cpu", "--chunk", chunk, "--max-tokens", "6", "The quick brown fox jumps")
			if code != 0 {
				t.Fatalf("--chunk %s: exit %d, stderr %q", chunk, code, errs)
			}
			outs = append(outs, out)
		}
		if outs[0] != outs[1] {
			t.Fatalf("--chunk 3 wrote %q, the default chunk %q", outs[0], outs[1])
		}
	})
}

func TestGPUMemNeedsCUDA(t *testing.T) {
	for _, tc := range []struct{ name, backend, value string }{
		{"with the CPU backend", "cpu", "1GiB"},
		{"malformed, with auto", "auto", "lots"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errs := moxie(t, "run", "--model", "synth:tiny", "--backend", tc.backend, "--gpu-mem", tc.value, "Hi")
			if code != 2 || !strings.Contains(errs, "--gpu-mem") {
				t.Fatalf("exit %d, stderr %q: want a usage error naming --gpu-mem", code, errs)
			}
		})
	}
}

// TestFormatStats checks the stats line's serving figures: the expert hit
// rate only where something counts hits, PCIe traffic only when there was
// some, GPU memory only on the GPU.
func TestFormatStats(t *testing.T) {
	res := generate.Result{PromptTokens: 10, GeneratedTokens: 20, Finish: generate.FinishLength,
		Prefill: 500 * time.Millisecond, TimeToFirstToken: 510 * time.Millisecond, Decode: 2 * time.Second}
	for _, tc := range []struct {
		name string
		st   servingStats
		want string
	}{
		{"no store", servingStats{}, "| 20 tok, length | memory 1.00 GiB]"},
		{"host store", servingStats{experts: true, hitRate: 0.5}, "| 20 tok, length | experts hit 50.0% | memory 1.00 GiB]"},
		{"GPU resident", servingStats{gpuBytes: 3 << 30}, "| 20 tok, length | memory 1.00 GiB, GPU 3.00 GiB]"},
		{"GPU tier", servingStats{experts: true, hitRate: 0.661, pcieBytes: 5 << 30, gpuBytes: 80 << 30},
			"| 20 tok, length | experts hit 66.1%, 5.00 GiB over PCIe | memory 1.00 GiB, GPU 80.00 GiB]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := formatStats(res, tc.st, 1<<30)
			if !strings.HasPrefix(got, "[prompt 10 tok | first token 510ms | prefill 20.0 tok/s | decode ") || !strings.HasSuffix(got, tc.want) {
				t.Errorf("got %q, want the prompt/latency prefix and the suffix %q", got, tc.want)
			}
		})
	}
	t.Run("cached prompt tokens", func(t *testing.T) {
		// 6 of the 10 prompt tokens cached: 4 prefilled in 0.5 s.
		c := res
		c.CachedTokens = 6
		if got, want := formatStats(c, servingStats{}, 1<<30), "[prompt 10 tok (6 cached) | first token 510ms | prefill 8.0 tok/s | decode "; !strings.HasPrefix(got, want) {
			t.Errorf("got %q, want the prefix %q", got, want)
		}
	})
}

// BenchmarkChatTurns: a six-turn chat with the built-in model, with and
// without the prompt cache (docs/benchmarks.md). Reports the later turns'
// mean time to the first token and the prompt tokens prefilled per chat.
func BenchmarkChatTurns(b *testing.B) {
	lm, tok := loadDefaultChat(b)
	const chat = "Tell me about the river and the old town by the water.\nAnd then what happened when the winter came?\nWhy did they leave?\nWhere did they go after that?\nWhat did they find there?\nHow does the story end?\n/exit\n"
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("cache=%v", on), func(b *testing.B) {
			var ttft time.Duration
			var turns, prefilled int
			re := regexp.MustCompile(`\[prompt (\d+) tok(?: \((\d+) cached\))? \| first token (\S+) `)
			for b.Loop() {
				var errb strings.Builder
				r := &runner{m: lm.m, tok: tok, maxTokens: 32, stats: true, stdout: io.Discard, stderr: &errb}
				if on {
					r.cache = generate.NewCache(1)
				}
				if err := r.interactive(b.Context(), strings.NewReader(chat)); err != nil {
					b.Fatal(err)
				}
				if r.cache != nil {
					r.cache.Close()
				}
				for i, m := range re.FindAllStringSubmatch(errb.String(), -1) {
					p, _ := strconv.Atoi(m[1])
					c, _ := strconv.Atoi(m[2])
					prefilled += p - c
					if i > 0 {
						d, _ := time.ParseDuration(m[3])
						ttft += d
						turns++
					}
				}
			}
			b.ReportMetric(float64(ttft.Milliseconds())/float64(max(turns, 1)), "ttft-ms/later-turn")
			b.ReportMetric(float64(prefilled)/float64(b.N), "prefilled-tok/chat")
		})
	}
}

// TestRunDiskCache: with --cache-dir, a second run whose prompt has the
// first's system prompt restores that part from disk (the stats line says
// so) instead of prefilling it; without a system prompt nothing is
// checkpointed.
func TestRunDiskCache(t *testing.T) {
	dir := t.TempDir()
	sys := strings.Repeat("The county court house stands on the square, and the river runs past the mill to the south. ", 6)
	run1 := []string{"run", "--cache-dir", dir, "--system", sys, "--max-tokens", "3", "--temperature", "0", "Where is the mill?"}
	code, _, errs := moxie(t, run1...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if strings.Contains(errs, "cached") {
		t.Errorf("the first run reports cached tokens:\n%s", errs)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.mxseq"))
	if len(files) != 2 { // the system prompt's checkpoint, and the conversation at exit
		t.Fatalf("%d files in the cache directory, want 2", len(files))
	}
	code, out, errs := moxie(t, "run", "--cache-dir", dir, "--system", sys, "--max-tokens", "3", "--temperature", "0", "Who built the court house?")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	m := regexp.MustCompile(`\[prompt (\d+) tok \((\d+) cached, from disk\)`).FindStringSubmatch(errs)
	if m == nil {
		t.Fatalf("the second run's stats line does not report tokens from disk:\n%s", errs)
	}
	if p, c := atoi(m[1]), atoi(m[2]); c >= p || c < 64 {
		t.Errorf("%d of %d prompt tokens from disk, want the system prompt's (at least 64, fewer than all)", c, p)
	}
	if strings.TrimSpace(out) == "" {
		t.Error("no answer")
	}
	// --cache-every: raw prompts that share a long start.
	doc := strings.Repeat("The mill stood by the river for a hundred years. ", 12)
	dir2 := t.TempDir()
	for i, q := range []string{"Who built it?", "When did it burn?"} {
		code, _, errs := moxie(t, "run", "--cache-dir", dir2, "--cache-every", "100", "--raw", "--max-tokens", "2", doc+q)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errs)
		}
		m := regexp.MustCompile(`\[prompt (\d+) tok \((\d+) cached, from disk\)`).FindStringSubmatch(errs)
		switch {
		case i == 0 && m != nil:
			t.Errorf("the first raw prompt reports tokens from disk:\n%s", errs)
		case i == 1 && (m == nil || atoi(m[2])%100 != 0 || atoi(m[2]) < 100):
			t.Errorf("the second raw prompt does not restore a multiple of 100 tokens from disk:\n%s", errs)
		}
	}
	if code, _, errs := moxie(t, "run", "--cache-dir", dir, "--cache-every", "-1", "Hi"); code != 2 || !strings.Contains(errs, "--cache-every") {
		t.Errorf("--cache-every -1: exit %d, %s", code, errs)
	}
	if code, _, errs := moxie(t, "run", "--cache-dir", dir, "--prompt-cache=false", "Hi"); code != 2 || !strings.Contains(errs, "--cache-dir needs the prompt cache") {
		t.Errorf("--cache-dir without the prompt cache: exit %d, %s", code, errs)
	}
	if code, _, errs := moxie(t, "run", "--cache-dir", dir, "--cache-disk", "lots", "Hi"); code != 2 || !strings.Contains(errs, "--cache-disk") {
		t.Errorf("--cache-disk lots: exit %d, %s", code, errs)
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// TestRunHistory: --history carries a chat across runs (each run adds its
// turn to the file), and with --cache-dir the second run restores the first
// run's sequence from disk instead of prefilling the conversation.
func TestRunHistory(t *testing.T) {
	dir := t.TempDir()
	hist := filepath.Join(dir, "chat.json")
	cache := filepath.Join(dir, "cache")
	sys := strings.Repeat("Answer in the style of a county newspaper. ", 10)
	args := func(q string) []string {
		return []string{"run", "--history", hist, "--cache-dir", cache, "--max-tokens", "4", "--temperature", "0", q}
	}
	code, _, errs := moxie(t, append([]string{"run", "--history", hist, "--system", sys}, args("Tell me about the river.")[3:]...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	msgs, err := loadHistory(hist)
	if err != nil || len(msgs) != 3 || msgs[0].Content != sys || msgs[1].Content != "Tell me about the river." || msgs[2].Role != "assistant" {
		t.Fatalf("after one turn the history holds %+v (%v)", msgs, err)
	}
	code, _, errs = moxie(t, args("And then what happened?")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	m := regexp.MustCompile(`\[prompt (\d+) tok \((\d+) cached, from disk\)`).FindStringSubmatch(errs)
	if m == nil || atoi(m[2]) < 64 {
		t.Errorf("the second run did not restore the conversation from disk:\n%s", errs)
	}
	if msgs, _ = loadHistory(hist); len(msgs) != 5 || msgs[3].Content != "And then what happened?" {
		t.Errorf("after two turns the history holds %d messages", len(msgs))
	}
	if code, _, errs := moxie(t, "run", "--history", hist, "--system", "Another prompt.", "Hi"); code != 2 || !strings.Contains(errs, "--system differs") {
		t.Errorf("another --system: exit %d, %s", code, errs)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"role":"user"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := moxie(t, "run", "--history", bad, "Hi"); code == 0 || !strings.Contains(errs, bad) {
		t.Errorf("a history that is not a chat: exit %d, %s", code, errs)
	}
	if code, _, errs := moxie(t, "run", "--history", hist, "--raw", "Hi"); code != 2 || !strings.Contains(errs, "--raw") {
		t.Errorf("--history with --raw: exit %d, %s", code, errs)
	}
}
