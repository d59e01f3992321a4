package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"moxie/dsv4"
	"moxie/internal/progress"
	"moxie/tokenizer"
)

// pplReport is what `moxie perplexity` measures; --json writes it.
type pplReport struct {
	Model      string  `json:"model"`
	Synthetic  bool    `json:"synthetic"`
	File       string  `json:"file"`
	Tokens     int     `json:"tokens"`   // text tokens, each predicted once
	Segments   int     `json:"segments"` // independent windows, each starting at BOS
	Window     int     `json:"window"`
	MeanNLL    float64 `json:"mean_nll"` // nats per token
	Perplexity float64 `json:"perplexity"`
	TokPerSec  float64 `json:"tokens_per_second"`
}

func runPerplexity(args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlags("perplexity", "--model M --file F", `
Measure a model's perplexity on a text file: the text is tokenized, cut into
windows of --window tokens (each evaluated from scratch, starting with BOS), and
every text token is predicted once from the tokens before it in its window.
Reports the mean negative log-likelihood (nats per token), the perplexity
exp(mean NLL), and tokens per second.`, stderr)
	model := fs.String("model", defaultModel(), "model: a checkpoint directory or synth:PRESET")
	file := fs.String("file", "", "text file to score")
	window := fs.Int("window", 1024, "tokens per window, BOS included (capped at the model's context)")
	jsonOut := fs.String("json", "", "also write the report as JSON to this file")
	mf := addMemFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 || *file == "" {
		return usagef("want --file F (and no positional arguments)")
	}
	if *window < 2 {
		return usagef("--window must be at least 2")
	}
	// --chunk (shared with run/serve/bench) also sets the tokens per
	// prefill call within a window; 0 means 256.
	chunk := 256
	if mf.chunk > 0 {
		chunk = mf.chunk
	}
	text, err := os.ReadFile(*file)
	if err != nil {
		return fmt.Errorf("reading the text: %w", err)
	}
	lm, err := loadModel(*model, mf, stderr)
	if err != nil {
		return err
	}
	defer lm.Close()
	ids, bos, err := encodeFile(lm, text, *file)
	if err != nil {
		return err
	}
	w := min(*window, lm.m.Cfg.MaxPositions)
	rep := &pplReport{Model: lm.src.Name(), Synthetic: lm.src.Synthetic(), File: *file, Window: w}
	bar := progress.New(stderr, "perplexity", int64(len(ids)), false)
	start := time.Now()
	var nll float64
	err = forWindows(ids, bos, w, func(seg []int) error {
		segNLL, err := windowNLL(lm.m, seg, chunk)
		if err != nil {
			return err
		}
		nll += segNLL
		rep.Segments++
		bar.Add(int64(len(seg) - 1))
		return nil
	})
	if err != nil {
		return err
	}
	bar.Done()
	rep.Tokens = len(ids)
	rep.MeanNLL = nll / float64(len(ids))
	rep.Perplexity = math.Exp(rep.MeanNLL)
	rep.TokPerSec = float64(len(ids)) / time.Since(start).Seconds()
	syn := ""
	if rep.Synthetic {
		syn = " (synthetic, random weights)"
	}
	fmt.Fprintf(stdout, "model       %s%s\nfile        %s: %d tokens in %d windows of up to %d\nmean NLL    %.4f nats/token\nperplexity  %.3f\nspeed       %.1f tokens/s\n",
		rep.Model, syn, rep.File, rep.Tokens, rep.Segments, w, rep.MeanNLL, rep.Perplexity, rep.TokPerSec)
	if *jsonOut != "" {
		return writeJSONFile(*jsonOut, rep)
	}
	return nil
}

// encodeFile tokenizes a text file's contents with the model's tokenizer
// and returns its ids (an error naming file when there are none) and the
// BOS id that starts each window.
func encodeFile(lm *loadedModel, text []byte, file string) (ids []int, bos int, err error) {
	tok, err := loadTokenizer(lm)
	if err != nil {
		return nil, 0, err
	}
	ids = tok.Encode(string(text), tokenizer.EncodeOptions{})
	if len(ids) == 0 {
		return nil, 0, fmt.Errorf("%s: no tokens in the file", file)
	}
	bos, ok := tok.BOS()
	if !ok {
		bos = lm.m.Cfg.BOS
	}
	return ids, bos, nil
}

// forWindows cuts ids into windows of w tokens, each its BOS and the next
// w-1 text tokens (the last window may be shorter), so that every text token
// is in one window, and calls f on each in order; it stops at f's first
// error.
func forWindows(ids []int, bos, w int, f func(seg []int) error) error {
	for lo := 0; lo < len(ids); lo += w - 1 {
		if err := f(append([]int{bos}, ids[lo:min(lo+w-1, len(ids))]...)); err != nil {
			return err
		}
	}
	return nil
}

// windowNLL runs seg (BOS first) through a fresh session in prefill chunks and
// returns the summed negative log-likelihood of seg[1:], each token predicted
// from the logits at the position before it (log-softmax in float64).
func windowNLL(m *dsv4.Model, seg []int, chunk int) (float64, error) {
	seq, err := m.NewSequence() // a device session when the model is on a GPU
	if err != nil {
		return 0, err
	}
	defer seq.Close()
	s, ok := seq.(interface {
		PrefillAll([]int) ([]float32, error)
	})
	if !ok {
		return 0, fmt.Errorf("perplexity: %T cannot return every position's logits", seq)
	}
	V := m.Cfg.VocabSize
	var nll float64
	for lo := 0; lo < len(seg)-1; lo += chunk {
		hi := min(lo+chunk, len(seg)-1)
		logits, err := s.PrefillAll(seg[lo:hi])
		if err != nil {
			return 0, err
		}
		for i := range hi - lo {
			nll -= logSoftmaxAt(logits[i*V:(i+1)*V], seg[lo+i+1])
		}
	}
	return nll, nil
}

// logSoftmaxAt is log(softmax(logits)[target]) computed in float64.
func logSoftmaxAt(logits []float32, target int) float64 {
	mx := math.Inf(-1)
	for _, v := range logits {
		mx = math.Max(mx, float64(v))
	}
	var sum float64
	for _, v := range logits {
		sum += math.Exp(float64(v) - mx)
	}
	return float64(logits[target]) - mx - math.Log(sum)
}
