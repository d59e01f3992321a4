package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"golang.org/x/term"

	"moxie/chat"
	"moxie/dsv4"
	"moxie/generate"
	"moxie/internal/progress"
	"moxie/sample"
	"moxie/tokenizer"
)

func runRun(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlags("run", "[--model M] [PROMPT]", `
Chat with a model. With a PROMPT, answer it once and exit; without one, start an
interactive chat (type /reset to clear the history, /exit or Ctrl-D to leave).
When standard input is not a terminal and no PROMPT is given, it is read as one
prompt. Text streams as it is generated; a stats line follows each answer
(prompt tokens, time to first token, prefill and decode tokens/s, memory).
Without --model, moxie uses its built-in model, models/brown-mini: a miniature
(88.8M parameters) of the V4-Flash architecture trained on the Brown corpus,
which writes English-like text, not good English ($MOXIE_MODEL picks another).`, stderr)
	model := fs.String("model", defaultModel(), "model: a checkpoint directory or synth:PRESET")
	maxTokens := fs.Int("max-tokens", 256, "most tokens to generate per answer")
	temp := fs.Float64("temperature", defaultTemperature, "sampling temperature; 0 is greedy")
	topP := fs.Float64("top-p", defaultTopP, "nucleus sampling: keep the most likely tokens up to this probability mass (1 disables)")
	topK := fs.Int("top-k", 0, "keep only the K most likely tokens (0 disables)")
	minP := fs.Float64("min-p", 0, "drop tokens less likely than min-p times the best (0 disables)")
	repPen := fs.Float64("repeat-penalty", 1, "repetition penalty over generated and prompt tokens (1 disables)")
	seed := fs.Uint64("seed", 0, "random seed (the same seed and prompt give the same answer)")
	think := fs.Bool("think", false, "thinking mode: the model reasons before answering")
	system := fs.String("system", "", "system prompt")
	raw := fs.Bool("raw", false, "send PROMPT as raw text, without the chat template")
	stats := fs.Bool("stats", true, "print a stats line after each answer")
	historyFile := fs.String("history", "", "keep the chat in this JSON file (OpenAI-style messages): a run continues the conversation it holds and saves each turn to it, so a chat can go on across runs; with --cache-dir the next run restores the conversation's state instead of prefilling it")
	promptCache := fs.Bool("prompt-cache", true, "in a chat, continue the conversation's sequence when the next prompt extends it, so a turn prefills only its new tokens (false: every turn prefills the whole conversation)")
	mf := addMemFlags(fs)
	df := addDiskFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *historyFile != "" && *raw {
		return usagef("--history keeps a chat; --raw sends a raw prompt without one")
	}
	if df.dir != "" && !*promptCache {
		return usagef("--cache-dir needs the prompt cache (--prompt-cache=true)")
	}
	if *maxTokens < 1 {
		return usagef("--max-tokens must be at least 1")
	}
	params := sample.Params{Temperature: *temp, TopP: *topP, TopK: *topK, MinP: *minP, RepetitionPenalty: *repPen, Seed: *seed}
	if _, err := sample.New(params); err != nil {
		return usagef("%v", err)
	}
	lm, err := loadModel(*model, mf, stderr)
	if err != nil {
		return err
	}
	defer lm.Close()
	tok, err := loadTokenizer(lm)
	if err != nil {
		return err
	}
	r := &runner{m: lm.m, lm: lm, tok: tok, params: params, maxTokens: *maxTokens, think: *think, raw: *raw,
		stats: *stats, stdout: stdout, stderr: stderr}
	if *historyFile != "" {
		if r.history, err = loadHistory(*historyFile); err != nil {
			return err
		}
		r.historyFile = *historyFile
	}
	if *system != "" {
		switch {
		case len(r.history) == 0:
			r.history = append(r.history, chat.Message{Role: "system", Content: *system})
		case r.history[0].Role != "system" || r.history[0].Content != *system:
			return usagef("--system differs from the system prompt of the chat in %s (leave --system out to continue it)", *historyFile)
		}
	}
	if *promptCache {
		r.cache = generate.NewCache(1)
		defer r.cache.Close()
		dopts, err := df.options(stderr)
		if err != nil {
			return err
		}
		if dopts != nil {
			if _, err := r.cache.UseDisk(*dopts, lm.m); err != nil {
				return err
			}
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	prompt := strings.Join(fs.Args(), " ")
	if prompt == "" && !isTerminal(stdin) {
		b, err := io.ReadAll(stdin)
		if err != nil {
			return err
		}
		prompt = strings.TrimSpace(string(b))
		if prompt == "" {
			return usagef("no prompt: give PROMPT, or text on standard input")
		}
	}
	if prompt != "" {
		return r.turn(ctx, prompt)
	}
	return r.interactive(ctx, stdin)
}

func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// loadTokenizer reads the model's tokenizer files; an error names what is missing.
func loadTokenizer(lm *loadedModel) (*tokenizer.Tokenizer, error) {
	tj, err := lm.src.File("tokenizer.json")
	if err != nil {
		return nil, fmt.Errorf("%s has no tokenizer.json: copy tokenizer.json and tokenizer_config.json from the model's release into the directory (%w)", lm.src.Name(), err)
	}
	cj, err := lm.src.File("tokenizer_config.json")
	if err != nil {
		return nil, fmt.Errorf("%s has no tokenizer_config.json: copy it from the model's release into the directory (%w)", lm.src.Name(), err)
	}
	tok, err := tokenizer.Load(tj, cj)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", lm.src.Name(), err)
	}
	return tok, nil
}

// runner holds one chat: the model, the conversation so far and the options.
type runner struct {
	m         *dsv4.Model
	lm        *loadedModel // for expert statistics; may be nil
	tok       *tokenizer.Tokenizer
	params    sample.Params
	maxTokens int
	think     bool
	raw       bool
	stats     bool
	history   []chat.Message
	// historyFile, when set, receives history after each turn and /reset.
	historyFile string
	cache       *generate.Cache // the conversation's sequence between turns; nil: none
	stdout      io.Writer
	stderr      io.Writer
}

func (r *runner) interactive(ctx context.Context, stdin io.Reader) error {
	fmt.Fprintf(r.stderr, "moxie chat: /reset clears the conversation, /exit or Ctrl-D leaves.\n")
	sc := bufio.NewScanner(stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	system := r.history
	for {
		fmt.Fprint(r.stderr, ">>> ")
		if !sc.Scan() {
			fmt.Fprintln(r.stderr)
			return sc.Err()
		}
		line := strings.TrimSpace(sc.Text())
		switch line {
		case "":
			continue
		case "/exit", "/quit", "/bye":
			return nil
		case "/reset":
			r.history = system
			if r.cache != nil {
				if err := r.cache.Clear(); err != nil {
					return err
				}
			}
			if err := r.saveHistory(); err != nil {
				return err
			}
			fmt.Fprintln(r.stderr, "(conversation cleared)")
			continue
		}
		if err := r.turn(ctx, line); err != nil {
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		}
	}
}

// turn answers one user message, streaming the reply, and keeps both in the history.
func (r *runner) turn(ctx context.Context, prompt string) error {
	var ids []int
	var checkpoints []int // the system prompt's end: a disk cache's checkpoint
	eos, _ := r.tok.EOS()
	if r.raw {
		ids = r.tok.Encode(prompt, tokenizer.EncodeOptions{})
		if bos, ok := r.tok.BOS(); ok {
			ids = append([]int{bos}, ids...)
		}
	} else {
		msgs := append(append([]chat.Message(nil), r.history...), chat.Message{Role: "user", Content: prompt})
		var err error
		copts := chat.Options{Thinking: r.think}
		ids, err = chat.Encode(r.tok, msgs, copts)
		if err != nil {
			return err
		}
		if n := chat.SystemPrefix(r.tok, msgs, copts, ids); n > 0 {
			checkpoints = []int{n}
		}
	}
	sampler, err := sample.New(r.params)
	if err != nil {
		return err
	}
	parser := chat.NewParser(r.think && !r.raw)
	inReasoning := false
	var content, reasoning strings.Builder
	emit := func(ev generate.Event) error {
		if r.raw {
			_, err := io.WriteString(r.stdout, ev.Text)
			content.WriteString(ev.Text)
			return err
		}
		d := parser.Add(ev.Text)
		r.show(d, &inReasoning, &content, &reasoning)
		return nil
	}
	res, err := generate.Generate(ctx, r.m, ids, generate.Options{
		MaxTokens: r.maxTokens, Sampler: sampler, StopTokens: []int{eos}, Detokenizer: r.tok.NewDecoder(), Cache: r.cache,
		// The template drops this turn's reasoning from the next prompt,
		// which then leaves this prompt at its last token (<think>).
		Snapshot:    r.think && !r.raw,
		Checkpoints: checkpoints,
	}, emit)
	if !r.raw {
		d, _, perr := parser.Finish()
		r.show(d, &inReasoning, &content, &reasoning)
		if perr != nil && err == nil && res.Finish == generate.FinishStop {
			fmt.Fprintf(r.stderr, "\n(warning: %v)", perr)
		}
	}
	fmt.Fprintln(r.stdout)
	if r.stats {
		fmt.Fprintln(r.stderr, statsLine(res, r.lm))
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	r.history = append(r.history, chat.Message{Role: "user", Content: prompt},
		chat.Message{Role: "assistant", Content: content.String(), ReasoningContent: reasoning.String()})
	if herr := r.saveHistory(); herr != nil && err == nil {
		err = herr
	}
	return err
}

// saveHistory writes the chat to historyFile, if set (a temporary file
// renamed into place).
func (r *runner) saveHistory() error {
	if r.historyFile == "" {
		return nil
	}
	b, err := json.MarshalIndent(r.history, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(r.historyFile, func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
}

// loadHistory reads a chat saved by --history; a missing file is an empty
// chat.
func loadHistory(path string) ([]chat.Message, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var msgs []chat.Message
	if err := json.Unmarshal(b, &msgs); err != nil {
		return nil, fmt.Errorf("--history %s: not a chat (a JSON array of messages with role and content): %v", path, err)
	}
	for i, m := range msgs {
		switch m.Role {
		case "system", "user", "assistant":
		default:
			return nil, fmt.Errorf("--history %s: message %d has role %q (want system, user or assistant)", path, i, m.Role)
		}
	}
	return msgs, nil
}

// show prints a parsed delta, marking where reasoning starts and ends.
func (r *runner) show(d chat.Delta, inReasoning *bool, content, reasoning *strings.Builder) {
	if d.Reasoning != "" {
		if !*inReasoning {
			fmt.Fprint(r.stdout, "<think>\n")
			*inReasoning = true
		}
		fmt.Fprint(r.stdout, d.Reasoning)
		reasoning.WriteString(d.Reasoning)
	}
	if d.Content != "" {
		if *inReasoning {
			fmt.Fprint(r.stdout, "\n</think>\n")
			*inReasoning = false
		}
		fmt.Fprint(r.stdout, d.Content)
		content.WriteString(d.Content)
	}
}

// statsLine summarises a generation for people: prompt size, latency, speeds,
// expert hit rate (and PCIe traffic with a GPU expert tier), memory (and GPU
// memory on the GPU).
func statsLine(res generate.Result, lm *loadedModel) string {
	var st servingStats
	if lm != nil {
		st = lm.servingStats()
	}
	return formatStats(res, st, residentBytes())
}

// formatStats is statsLine's text for the serving figures st and resident
// memory rss (bytes).
func formatStats(res generate.Result, st servingStats, rss int64) string {
	extra := ""
	if st.experts {
		extra = fmt.Sprintf(" | experts hit %.1f%%", 100*st.hitRate)
		if st.pcieBytes > 0 {
			extra += fmt.Sprintf(", %s over PCIe", progress.FormatBytes(st.pcieBytes))
		}
	}
	mem := "memory " + progress.FormatBytes(rss)
	if st.gpuBytes > 0 {
		mem += ", GPU " + progress.FormatBytes(st.gpuBytes)
	}
	cached := ""
	if res.CachedTokens > 0 {
		cached = fmt.Sprintf(" (%d cached)", res.CachedTokens)
		if res.CachedFromDisk {
			cached = fmt.Sprintf(" (%d cached, from disk)", res.CachedTokens)
		}
	}
	return fmt.Sprintf("[prompt %d tok%s | first token %s | prefill %.1f tok/s | decode %.1f tok/s | %d tok, %s%s | %s]",
		res.PromptTokens, cached, res.TimeToFirstToken.Round(time.Millisecond), res.PrefillTokensPerSecond(),
		res.DecodeTokensPerSecond(), res.GeneratedTokens, res.Finish, extra, mem)
}

// residentBytes is the process's resident memory (VmRSS), or 0 where unknown.
func residentBytes() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb int64
			fmt.Sscanf(strings.TrimSpace(rest), "%d", &kb)
			return kb << 10
		}
	}
	return 0
}
