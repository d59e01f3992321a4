package generate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"moxie/sample"
)

// Detokenizer turns generated ids into text incrementally. tokenizer.Decoder
// satisfies it. Implementations must never return part of a UTF-8 character.
type Detokenizer interface {
	// Add consumes one id and returns the text it completes (possibly empty).
	Add(id int) string
	// Flush returns whatever is still held back at the end of the stream.
	Flush() string
}

// Sampler picks the next token from a logits vector; *sample.Sampler
// implements it.
type Sampler interface {
	// Sample returns a token id in [0, len(logits)), or an error (for
	// example on NaN logits), which ends generation. history holds the
	// prompt followed by the tokens generated so far; it is read-only and
	// only valid during the call. logits may be modified in place.
	Sample(logits []float32, history []int) (int, error)
}

// EOSModel is implemented by models that know their end-of-sequence token.
// Generate stops on it unless Options.IgnoreEOS is set.
type EOSModel interface {
	EOS() int
}

// FinishReason says why generation ended; the values are OpenAI's.
type FinishReason string

const (
	// FinishStop: a stop token or stop string was produced.
	FinishStop FinishReason = "stop"
	// FinishLength: MaxTokens were generated or the context is full.
	FinishLength FinishReason = "length"
	// FinishCancelled: the context was cancelled or its deadline passed.
	FinishCancelled FinishReason = "cancelled"
)

// Options controls one generation. The zero value generates greedily up to
// the end of the context, with no text, stopping only on the model's EOS.
type Options struct {
	// MaxTokens bounds the number of generated tokens (stop token included);
	// <= 0 means up to the model's MaxContext.
	MaxTokens int
	// Sampler chooses each token; nil means greedy decoding (package sample
	// with zero Params: argmax, lowest id on ties, an error on NaN logits).
	Sampler Sampler
	// StopTokens end generation when sampled, in addition to the model's EOS
	// (see EOSModel). A stop token is counted in Result.Tokens but its text is
	// never emitted.
	StopTokens []int
	// IgnoreEOS disables the implicit stop on the model's EOS.
	IgnoreEOS bool
	// StopStrings end generation as soon as one appears in the generated text,
	// even across token boundaries; neither it nor anything after it is
	// emitted. Empty strings are rejected. Requires Detokenizer.
	StopStrings []string
	// Detokenizer turns generated ids into the text of Event.Text and
	// Result.Text; nil means no text is produced. Generate owns it for the
	// duration of the call.
	Detokenizer Detokenizer
	// Cache, if set, supplies a sequence whose tokens the prompt extends
	// (only the rest of the prompt is prefilled; Result.CachedTokens says
	// how many were not) and keeps the sequence afterwards, unless the
	// model failed, instead of closing it. It must be used with one model.
	Cache *Cache
	// Snapshot, with Cache and a sequence that implements Cloner, also
	// keeps a copy of the sequence taken before the prompt's last token
	// (the prompt is then fed as two calls: all but that token, then it).
	// A later prompt that agrees with this one up to there but not after
	// continues from the copy: the next turn of a thinking chat, whose
	// template renders this turn's final marker differently once the
	// reasoning is dropped. It costs a copy of the state and a one-token
	// call each generation.
	Snapshot bool
	// Checkpoints are prompt lengths (the end of a system prompt, say) at
	// which, with a Cache that has a disk tier and a sequence that
	// implements Saver, the sequence is written to disk as its prefill
	// passes them (the prompt is then fed in pieces), unless a file already
	// holds exactly those tokens: a later prompt that starts the same way,
	// a conversation of its own, restores that state instead of prefilling
	// it. Lengths the cached sequence already holds, or that leave fewer
	// than two prompt tokens after them, are skipped.
	Checkpoints []int
}

// Event is one step of the stream passed to the emit callback.
type Event struct {
	// Token is the sampled id, or NoToken for the final event that carries
	// the text held back until the end.
	Token int
	// Text is text that became final with this event (may be empty while a
	// UTF-8 character or a possible stop string is incomplete). Concatenating
	// every Event.Text gives Result.Text.
	Text string
}

// NoToken marks an Event that carries text but no new token.
const NoToken = -1

// Result describes a finished generation.
type Result struct {
	// Tokens are the generated ids in order, a final stop token included.
	Tokens []int
	// Text is the emitted text (empty without a Detokenizer).
	Text string
	// Finish says why generation ended; empty when Generate failed with an
	// error other than cancellation.
	Finish FinishReason
	// StopToken is the stop token that ended generation, or NoToken.
	StopToken int
	// StopString is the stop string that ended generation, or "".
	StopString string

	// PromptTokens is len(prompt); GeneratedTokens is len(Tokens).
	PromptTokens, GeneratedTokens int
	// CachedTokens is how many of the prompt's first tokens a sequence
	// from Options.Cache already held (not prefilled again).
	CachedTokens int
	// CachedFromDisk: that sequence was restored from the cache's disk
	// tier (Cache.UseDisk).
	CachedFromDisk bool
	// Prefill is the time from the call to the prompt's logits; TimeToFirstToken
	// adds the first sample; Decode is the time from the first token to the end.
	Prefill, TimeToFirstToken, Decode time.Duration
}

// PrefillTokensPerSecond is the rate of the prompt tokens prefilled,
// (PromptTokens - CachedTokens) / Prefill (0 when not measurable).
func (r Result) PrefillTokensPerSecond() float64 {
	if r.Prefill <= 0 {
		return 0
	}
	return float64(r.PromptTokens-r.CachedTokens) / r.Prefill.Seconds()
}

// DecodeTokensPerSecond is the rate of the tokens after the first one:
// (GeneratedTokens-1) / Decode (0 when not measurable).
func (r Result) DecodeTokensPerSecond() float64 {
	if r.Decode <= 0 || r.GeneratedTokens < 2 {
		return 0
	}
	return float64(r.GeneratedTokens-1) / r.Decode.Seconds()
}

// Errors returned by Generate before any token is generated.
var (
	ErrEmptyPrompt   = errors.New("generate: empty prompt")
	ErrPromptTooLong = errors.New("generate: prompt does not fit in the model's context")
)

// Generate feeds prompt to a new sequence of model, then samples tokens one at
// a time until a stop token, a stop string, MaxTokens, a full context or
// cancellation. emit is called once per sampled token that is not a stop
// token, in order, with the text that token made final, and once more at the
// end with Token == NoToken when held-back text remains; an error from emit
// ends generation and is returned.
//
// On cancellation Generate returns promptly (between model steps, or as soon
// as the model honours ctx) with Finish == FinishCancelled, the partial
// Result, and ctx.Err(). Other errors (model, sampler out of range, emit)
// return the partial Result and the error. The sequence is always closed.
func Generate(ctx context.Context, model Model, prompt []int, opts Options, emit func(Event) error) (res Result, err error) {
	res = Result{StopToken: NoToken, PromptTokens: len(prompt)}
	start := time.Now()
	if len(prompt) == 0 {
		return res, ErrEmptyPrompt
	}
	maxCtx := model.MaxContext()
	if len(prompt) >= maxCtx {
		return res, fmt.Errorf("%w: %d prompt tokens, context %d", ErrPromptTooLong, len(prompt), maxCtx)
	}
	vocab := model.VocabSize()
	for i, id := range prompt {
		if id < 0 || id >= vocab {
			return res, fmt.Errorf("generate: prompt token %d at position %d outside the vocabulary of %d", id, i, vocab)
		}
	}
	for _, s := range opts.StopStrings {
		if s == "" {
			return res, errors.New("generate: empty stop string")
		}
	}
	if len(opts.StopStrings) > 0 && opts.Detokenizer == nil {
		return res, errors.New("generate: stop strings need a Detokenizer")
	}
	if emit == nil {
		emit = func(Event) error { return nil }
	}
	sampler := opts.Sampler
	if sampler == nil {
		greedy, err := sample.New(sample.Params{})
		if err != nil {
			return res, fmt.Errorf("generate: greedy sampler: %w", err)
		}
		sampler = greedy
	}
	stopTok := map[int]bool{}
	for _, id := range opts.StopTokens {
		stopTok[id] = true
	}
	if m, ok := model.(EOSModel); ok && !opts.IgnoreEOS {
		stopTok[m.EOS()] = true
	}
	limit := maxCtx - len(prompt)
	if opts.MaxTokens > 0 && opts.MaxTokens < limit {
		limit = opts.MaxTokens
	}
	if err := ctx.Err(); err != nil {
		res.Finish = FinishCancelled
		return res, err
	}

	var seq Sequence
	if opts.Cache != nil {
		seq, res.CachedTokens, res.CachedFromDisk = opts.Cache.take(prompt)
		if seq != nil && seq.Len() != res.CachedTokens {
			// Not what was stored: do not trust it.
			_ = seq.Close()
			seq, res.CachedTokens, res.CachedFromDisk = nil, 0, false
		}
	}
	if seq == nil {
		if opts.Cache != nil {
			if err := opts.Cache.makeRoom(); err != nil {
				return res, fmt.Errorf("generate: closing a cached sequence: %w", err)
			}
		}
		seq, err = model.NewSequence()
		if err != nil && opts.Cache != nil && opts.Cache.Len() > 0 {
			// The cached sequences may hold the memory a new one needs.
			if cerr := opts.Cache.Clear(); cerr != nil {
				return res, fmt.Errorf("generate: new sequence: %w (freeing cached sequences: %v)", err, cerr)
			}
			seq, err = model.NewSequence()
		}
		if err != nil {
			return res, fmt.Errorf("generate: new sequence: %w", err)
		}
	}
	// held counts the tokens of history the sequence holds; healthy is
	// false once an Append has failed (the sequence must not be used again).
	// snap (Options.Snapshot) is a copy of the sequence holding the
	// prompt's first len(prompt)-1 tokens.
	held, healthy := res.CachedTokens, true
	var history []int
	var snap Sequence
	var pipe Pipeliner // set when the decode steps run ahead
	defer func() {
		var cerr error
		if pipe != nil {
			pipe.Pipeline(false)
			if serr := pipe.Settle(); serr != nil {
				healthy = false
			}
		}
		if opts.Cache != nil && healthy && seq.Len() == held {
			var st []int
			if snap != nil {
				st = prompt[:len(prompt)-1]
			}
			cerr = opts.Cache.put(seq, history[:held], snap, st)
		} else {
			cerr = seq.Close()
			if snap != nil {
				cerr = errors.Join(cerr, snap.Close())
			}
		}
		if cerr != nil && err == nil {
			err = fmt.Errorf("generate: close sequence: %w", cerr)
		}
	}()

	var text []byte
	var matcher *stopMatcher
	if len(opts.StopStrings) > 0 {
		matcher = newStopMatcher(opts.StopStrings)
	}
	history = make([]int, len(prompt), len(prompt)+limit)
	copy(history, prompt)

	var first time.Time
	finish := func() {
		if !first.IsZero() {
			res.Decode = time.Since(first)
		}
		res.GeneratedTokens = len(res.Tokens)
		res.Text = string(text)
	}
	// cancelled maps a context error (from ctx or surfaced by the model) to
	// the cancelled result.
	cancelled := func(e error) (Result, error) {
		res.Finish = FinishCancelled
		finish()
		if ce := ctx.Err(); ce != nil {
			return res, ce
		}
		return res, e
	}

	// prefillFailed ends the generation after a failed prefill call.
	prefillFailed := func(e error) (Result, error) {
		healthy = false
		if ctx.Err() != nil {
			return cancelled(e)
		}
		finish()
		return res, fmt.Errorf("generate: prefill: %w", e)
	}
	var cps []int
	if opts.Cache != nil {
		cps = opts.Cache.checkpoints(opts.Checkpoints, len(prompt))
	}
	for _, c := range slices.Compact(slices.Sorted(slices.Values(cps))) {
		if c <= held || c > len(prompt)-2 || !opts.Cache.wantsCheckpoint(seq, prompt[:c]) {
			continue
		}
		if _, err := seq.Append(ctx, prompt[held:c]); err != nil {
			return prefillFailed(err)
		}
		held = c
		opts.Cache.checkpoint(seq, prompt[:c])
	}
	rest := prompt[held:]
	cl, canClone := seq.(Cloner)
	if opts.Cache != nil && opts.Snapshot && canClone && len(rest) >= 2 {
		if _, err := seq.Append(ctx, rest[:len(rest)-1]); err != nil {
			return prefillFailed(err)
		}
		held = len(prompt) - 1
		if c, cerr := cl.CloneSequence(); cerr == nil && c.Len() == held {
			snap = c
		} else if cerr == nil {
			_ = c.Close() // not what it claims: no snapshot
		}
		rest = rest[len(rest)-1:]
	}
	logits, err := seq.Append(ctx, rest)
	if err != nil {
		return prefillFailed(err)
	}
	held = len(prompt)
	res.Prefill = time.Since(start)
	into, _ := seq.(IntoAppender) // decode steps reuse the logits' slice
	// Decode steps reduce the logits where they are when both sides can.
	red, _ := seq.(Reducer)
	rs, _ := sampler.(ReducingSampler)
	var spec sample.ReduceSpec
	if red != nil && rs != nil {
		spec = rs.Reduce()
	}
	var reduction sample.Reduction
	reduced := false // this step's result is in reduction, not logits
	// A greedy decode may run its steps ahead of this loop (Pipeliner):
	// the sequence starts each step as soon as the one before it has its
	// token; the step after the limit is not started, and one in flight
	// when the loop ends is dropped (below, before the sequence is kept).
	if pl, ok := seq.(Pipeliner); ok && spec.OK && spec.Greedy {
		pipe = pl
		pipe.Pipeline(limit > 1)
	}

	for {
		var id int
		full := !reduced
		if reduced {
			if reduction.N != vocab {
				healthy = false
				finish()
				return res, fmt.Errorf("generate: model reduced %d logits, want %d", reduction.N, vocab)
			}
			id, full, err = rs.SampleReduced(&reduction)
			if err == nil && full && !reduction.Complete {
				if d, ok := rs.PrepareDeviceDraw(&reduction); ok {
					full = false
					if id, err = red.DrawReduced(d); err != nil {
						healthy = false
						finish()
						return res, fmt.Errorf("generate: decode step %d: %w", len(res.Tokens), err)
					}
				}
			}
			if err == nil && full {
				if logits, err = red.LastLogits(logits); err != nil {
					healthy = false
					finish()
					return res, fmt.Errorf("generate: decode step %d: %w", len(res.Tokens), err)
				}
			}
		}
		if full && err == nil {
			if len(logits) != vocab {
				healthy = false
				finish()
				return res, fmt.Errorf("generate: model returned %d logits, want %d", len(logits), vocab)
			}
			id, err = sampler.Sample(logits, history)
		}
		if err != nil {
			finish()
			return res, fmt.Errorf("generate: sampling token %d: %w", len(res.Tokens)+1, err)
		}
		if id < 0 || id >= vocab {
			finish()
			return res, fmt.Errorf("generate: sampler returned id %d outside the vocabulary of %d", id, vocab)
		}
		if first.IsZero() {
			first = time.Now()
			res.TimeToFirstToken = first.Sub(start)
		}
		res.Tokens = append(res.Tokens, id)
		history = append(history, id)

		if stopTok[id] {
			res.Finish, res.StopToken = FinishStop, id
			break
		}
		var piece string
		stopped := false
		if opts.Detokenizer != nil {
			piece = opts.Detokenizer.Add(id)
			if matcher != nil {
				var k int
				piece, k = matcher.push(piece)
				if k >= 0 {
					res.Finish, res.StopString = FinishStop, opts.StopStrings[k]
					stopped = true
				}
			}
		}
		text = append(text, piece...)
		if err := emit(Event{Token: id, Text: piece}); err != nil {
			finish()
			return res, err
		}
		if stopped {
			break
		}
		if len(res.Tokens) >= limit {
			res.Finish = FinishLength
			break
		}
		if err := ctx.Err(); err != nil {
			return cancelled(err)
		}
		reduced = spec.OK
		if pipe != nil && len(res.Tokens)+1 >= limit {
			pipe.Pipeline(false) // this step's token is the last
		}
		switch {
		case reduced:
			err = red.AppendReduce(ctx, history[len(history)-1:], spec, &reduction)
		case into != nil:
			logits, err = into.AppendInto(ctx, history[len(history)-1:], logits)
		default:
			logits, err = seq.Append(ctx, history[len(history)-1:])
		}
		if err != nil {
			healthy = false
			if ctx.Err() != nil {
				return cancelled(err)
			}
			finish()
			return res, fmt.Errorf("generate: decode step %d: %w", len(res.Tokens), err)
		}
		held = len(history)
	}

	// Release held-back text unless a stop string cut the stream.
	if res.StopString == "" && opts.Detokenizer != nil {
		rest := opts.Detokenizer.Flush()
		if matcher != nil {
			var k int
			rest, k = matcher.push(rest)
			if k >= 0 {
				res.Finish, res.StopString = FinishStop, opts.StopStrings[k]
			} else {
				rest += matcher.flush()
			}
		}
		if rest != "" {
			text = append(text, rest...)
			if err := emit(Event{Token: NoToken, Text: rest}); err != nil {
				finish()
				return res, err
			}
		}
	}
	finish()
	return res, nil
}
