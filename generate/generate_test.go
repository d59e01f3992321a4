package generate

import (
	"cmp"
	"context"
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"moxie/sample"
)

// pieces is the test vocabulary: id -> text.
var pieces = []string{"<s>", "</s>", "He", "llo", " wor", "ld", "!", "o", "\n", "STOP", "a", "b", "c", "d", "e", "f"}

const (
	tBOS = iota
	tEOS
	tHe
	tLlo
	tWor
	tLd
	tBang
	tO
	tNL
	tSTOP
	tA
	tB
)

var prompt3 = []int{tBOS, tA, tB}

func TestGenerateStops(t *testing.T) {
	hello := []int{tHe, tLlo, tWor, tLd, tBang, tEOS}
	cases := []struct {
		name       string
		model      func() Model
		opts       Options
		wantEvents []Event
		wantText   string
		finish     FinishReason
		stopTok    int
		stopStr    string
		nTokens    int
	}{
		{
			name:  "eos",
			model: func() Model { return &fakeModel{vocab: 16, maxCtx: 64, eos: tEOS, next: script(3, hello...)} },
			wantEvents: []Event{
				{tHe, "He"}, {tLlo, "llo"}, {tWor, " wor"}, {tLd, "ld"}, {tBang, "!"},
			},
			wantText: "Hello world!", finish: FinishStop, stopTok: tEOS, nTokens: 6,
		},
		{
			name:  "custom stop token",
			model: func() Model { return &fakeModel{vocab: 16, maxCtx: 64, eos: tEOS, next: script(3, hello...)} },
			opts:  Options{StopTokens: []int{tLd}},
			wantEvents: []Event{
				{tHe, "He"}, {tLlo, "llo"}, {tWor, " wor"},
			},
			wantText: "Hello wor", finish: FinishStop, stopTok: tLd, nTokens: 4,
		},
		{
			name:  "ignore eos runs to max tokens",
			model: func() Model { return &fakeModel{vocab: 16, maxCtx: 64, eos: tEOS, next: script(3, tHe, tEOS, tO)} },
			opts:  Options{IgnoreEOS: true, MaxTokens: 4},
			wantEvents: []Event{
				{tHe, "He"}, {tEOS, "</s>"}, {tO, "o"}, {tO, "o"},
			},
			wantText: "He</s>oo", finish: FinishLength, stopTok: NoToken, nTokens: 4,
		},
		{
			name:       "model without EOS is not stopped by id 1",
			model:      func() Model { return fakeNoEOS{&fakeModel{vocab: 16, maxCtx: 64, next: script(3, tEOS)}} },
			opts:       Options{MaxTokens: 2},
			wantEvents: []Event{{tEOS, "</s>"}, {tEOS, "</s>"}},
			wantText:   "</s></s>", finish: FinishLength, stopTok: NoToken, nTokens: 2,
		},
		{
			name:       "max tokens",
			model:      func() Model { return &fakeModel{vocab: 16, maxCtx: 64, eos: tEOS, next: script(3, hello...)} },
			opts:       Options{MaxTokens: 2},
			wantEvents: []Event{{tHe, "He"}, {tLlo, "llo"}},
			wantText:   "Hello", finish: FinishLength, stopTok: NoToken, nTokens: 2,
		},
		{
			name:       "context full",
			model:      func() Model { return &fakeModel{vocab: 16, maxCtx: 5, eos: tEOS, next: script(3, hello...)} },
			opts:       Options{MaxTokens: 100},
			wantEvents: []Event{{tHe, "He"}, {tLlo, "llo"}},
			wantText:   "Hello", finish: FinishLength, stopTok: NoToken, nTokens: 2,
		},
		{
			name:  "stop string spanning tokens",
			model: func() Model { return &fakeModel{vocab: 16, maxCtx: 64, eos: tEOS, next: script(3, hello...)} },
			opts:  Options{StopStrings: []string{"o w"}},
			// "He" is safe; "llo" ends in "o", a prefix of "o w", held back;
			// " wor" completes "o w": nothing from "o" on is emitted.
			wantEvents: []Event{{tHe, "He"}, {tLlo, "ll"}, {tWor, ""}},
			wantText:   "Hell", finish: FinishStop, stopTok: NoToken, stopStr: "o w", nTokens: 3,
		},
		{
			name:  "stop string prefix released at the end",
			model: func() Model { return &fakeModel{vocab: 16, maxCtx: 64, eos: tEOS, next: script(3, tHe, tLlo, tEOS)} },
			opts:  Options{StopStrings: []string{"lo!"}},
			wantEvents: []Event{
				{tHe, "He"}, {tLlo, "l"}, {NoToken, "lo"},
			},
			wantText: "Hello", finish: FinishStop, stopTok: tEOS, nTokens: 3,
		},
		{
			name:  "stop string prefix released at length limit",
			model: func() Model { return &fakeModel{vocab: 16, maxCtx: 64, eos: tEOS, next: script(3, tHe, tLlo, tEOS)} },
			opts:  Options{StopStrings: []string{"lo!"}, MaxTokens: 2},
			wantEvents: []Event{
				{tHe, "He"}, {tLlo, "l"}, {NoToken, "lo"},
			},
			wantText: "Hello", finish: FinishLength, stopTok: NoToken, nTokens: 2,
		},
		{
			name:       "stop string inside one token",
			model:      func() Model { return &fakeModel{vocab: 16, maxCtx: 64, eos: tEOS, next: script(3, tA, tSTOP, tB)} },
			opts:       Options{StopStrings: []string{"TO"}},
			wantEvents: []Event{{tA, "a"}, {tSTOP, "S"}},
			wantText:   "aS", finish: FinishStop, stopTok: NoToken, stopStr: "TO", nTokens: 2,
		},
		{
			name:  "first completed stop string wins",
			model: func() Model { return &fakeModel{vocab: 16, maxCtx: 64, eos: tEOS, next: script(3, hello...)} },
			// "lo w" completes at " wor", before the others; until then
			// everything is a prefix of "Hello world!" and held back.
			opts:       Options{StopStrings: []string{"ld!", "lo w", "Hello world!"}},
			wantEvents: []Event{{tHe, ""}, {tLlo, ""}, {tWor, "Hel"}},
			wantText:   "Hel", finish: FinishStop, stopTok: NoToken, stopStr: "lo w", nTokens: 3,
		},
		{
			name:  "same completion point: earliest start wins",
			model: func() Model { return &fakeModel{vocab: 16, maxCtx: 64, eos: tEOS, next: script(3, hello...)} },
			opts:  Options{StopStrings: []string{"llo", "Hello"}},
			wantEvents: []Event{
				{tHe, ""}, {tLlo, ""},
			},
			wantText: "", finish: FinishStop, stopTok: NoToken, stopStr: "Hello", nTokens: 2,
		},
		{
			name: "stop string in the detokenizer's final flush",
			model: func() Model {
				return &fakeModel{vocab: 16, maxCtx: 64, eos: tEOS, next: script(3, tA, tEOS)}
			},
			opts:       Options{StopStrings: []string{"aZ"}},
			wantEvents: []Event{{tA, ""}},
			wantText:   "", finish: FinishStop, stopTok: tEOS, stopStr: "aZ", nTokens: 2,
		},
		{
			name:       "no detokenizer: tokens only",
			model:      func() Model { return &fakeModel{vocab: 16, maxCtx: 64, eos: tEOS, next: script(3, hello...)} },
			opts:       Options{MaxTokens: 3},
			wantEvents: []Event{{tHe, ""}, {tLlo, ""}, {tWor, ""}},
			wantText:   "", finish: FinishLength, stopTok: NoToken, nTokens: 3,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := tc.model()
			opts := tc.opts
			if tc.name != "no detokenizer: tokens only" {
				d := &tableDetok{pieces: pieces}
				if tc.name == "stop string in the detokenizer's final flush" {
					d.tail = "Z"
				}
				opts.Detokenizer = d
			}
			var got []Event
			res, err := Generate(context.Background(), m, prompt3, opts, func(e Event) error {
				got = append(got, e)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.wantEvents) {
				t.Errorf("events = %+v, want %+v", got, tc.wantEvents)
			}
			if res.Text != tc.wantText {
				t.Errorf("text = %q, want %q", res.Text, tc.wantText)
			}
			var cat strings.Builder
			for _, e := range got {
				cat.WriteString(e.Text)
			}
			if cat.String() != res.Text {
				t.Errorf("concatenated events %q != Result.Text %q", cat.String(), res.Text)
			}
			if res.Finish != tc.finish || res.StopToken != tc.stopTok || res.StopString != tc.stopStr {
				t.Errorf("finish=%q stopTok=%d stopStr=%q, want %q %d %q", res.Finish, res.StopToken, res.StopString, tc.finish, tc.stopTok, tc.stopStr)
			}
			if res.GeneratedTokens != tc.nTokens || len(res.Tokens) != tc.nTokens {
				t.Errorf("generated %d tokens (%v), want %d", res.GeneratedTokens, res.Tokens, tc.nTokens)
			}
			if res.PromptTokens != len(prompt3) {
				t.Errorf("prompt tokens %d, want %d", res.PromptTokens, len(prompt3))
			}
			var fm *fakeModel
			switch x := m.(type) {
			case *fakeModel:
				fm = x
			case fakeNoEOS:
				fm = x.fakeModel
			}
			if o, c := fm.stats(); o != 1 || c != 1 {
				t.Errorf("sequences opened %d closed %d, want 1 1", o, c)
			}
		})
	}
}

func TestGenerateHistoryAndStats(t *testing.T) {
	m := &fakeModel{vocab: 16, maxCtx: 64, eos: tEOS, next: script(3, tHe, tLlo, tEOS), step: 3 * time.Millisecond}
	rec := &recSampler{}
	res, err := Generate(context.Background(), m, prompt3, Options{Sampler: rec}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]int{
		{tBOS, tA, tB},
		{tBOS, tA, tB, tHe},
		{tBOS, tA, tB, tHe, tLlo},
	}
	if !reflect.DeepEqual(rec.hist, want) {
		t.Errorf("sampler histories %v, want %v", rec.hist, want)
	}
	if res.Prefill < m.step {
		t.Errorf("prefill %v shorter than the model's %v step", res.Prefill, m.step)
	}
	if res.TimeToFirstToken < res.Prefill {
		t.Errorf("TTFT %v < prefill %v", res.TimeToFirstToken, res.Prefill)
	}
	if res.Decode < 2*m.step {
		t.Errorf("decode %v shorter than two %v steps", res.Decode, m.step)
	}
	// Rates follow from the durations by definition.
	if got, want := res.PrefillTokensPerSecond(), 3/res.Prefill.Seconds(); got != want {
		t.Errorf("prefill rate %v, want %v", got, want)
	}
	if got, want := res.DecodeTokensPerSecond(), 2/res.Decode.Seconds(); got != want {
		t.Errorf("decode rate %v, want %v", got, want)
	}
	if (Result{GeneratedTokens: 1, Decode: time.Second}).DecodeTokensPerSecond() != 0 {
		t.Error("decode rate with one token should be 0")
	}
	if (Result{}).PrefillTokensPerSecond() != 0 {
		t.Error("prefill rate with no duration should be 0")
	}
}

func TestGenerateCancel(t *testing.T) {
	t.Run("cancel between steps", func(t *testing.T) {
		m := &fakeModel{vocab: 16, maxCtx: 1000, eos: tEOS, next: script(3, tA)}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		n := 0
		res, err := Generate(ctx, m, prompt3, Options{}, func(e Event) error {
			n++
			if n == 5 {
				cancel()
			}
			return nil
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if res.Finish != FinishCancelled || res.GeneratedTokens != 5 {
			t.Errorf("finish %q after %d tokens, want cancelled after 5", res.Finish, res.GeneratedTokens)
		}
		if o, c := m.stats(); o != 1 || c != 1 {
			t.Errorf("sequences opened %d closed %d", o, c)
		}
	})
	t.Run("cancel while the model blocks", func(t *testing.T) {
		m := &fakeModel{vocab: 16, maxCtx: 1000, eos: tEOS, next: script(3, tA), blockAt: 6}
		ctx, cancel := context.WithCancel(context.Background())
		m.onBlock = func() { time.AfterFunc(20*time.Millisecond, cancel) }
		start := time.Now()
		res, err := Generate(ctx, m, prompt3, Options{}, nil)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("returned after %v", d)
		}
		if res.Finish != FinishCancelled || res.GeneratedTokens != 4 {
			// Len 3 after prefill; the decode Appends of tokens 1-3 reach
			// Len 6, so the Append of token 4 blocks.
			t.Errorf("finish %q after %d tokens, want cancelled after 4", res.Finish, res.GeneratedTokens)
		}
	})
	t.Run("deadline while the model blocks", func(t *testing.T) {
		m := &fakeModel{vocab: 16, maxCtx: 1000, eos: tEOS, next: script(3, tA), blockAt: 1}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		res, err := Generate(ctx, m, prompt3, Options{}, nil)
		if !errors.Is(err, context.DeadlineExceeded) || res.Finish != FinishCancelled {
			t.Fatalf("err = %v finish %q, want deadline exceeded, cancelled", err, res.Finish)
		}
	})
	t.Run("already cancelled", func(t *testing.T) {
		m := &fakeModel{vocab: 16, maxCtx: 1000, eos: tEOS, next: script(3, tA)}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		res, err := Generate(ctx, m, prompt3, Options{}, nil)
		if !errors.Is(err, context.Canceled) || res.Finish != FinishCancelled {
			t.Fatalf("err = %v finish %q", err, res.Finish)
		}
		if o, _ := m.stats(); o != 0 {
			t.Errorf("opened %d sequences for a cancelled request", o)
		}
	})
}

func TestGenerateSeededReproducible(t *testing.T) {
	m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}
	run := func(seed uint64) []int {
		res, err := Generate(context.Background(), m, prompt3, Options{MaxTokens: 40, IgnoreEOS: true, Sampler: newSeeded(seed)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res.Tokens
	}
	a, b, c := run(1), run(1), run(2)
	if !reflect.DeepEqual(a, b) {
		t.Errorf("same seed gave different tokens:\n%v\n%v", a, b)
	}
	if reflect.DeepEqual(a, c) {
		t.Errorf("seeds 1 and 2 gave the same 40 tokens %v", a)
	}
}

func TestGenerateErrors(t *testing.T) {
	emitErr := errors.New("client went away")
	cases := []struct {
		name   string
		fail   string
		prompt []int
		opts   Options
		emit   func(Event) error
		want   string
		is     error
	}{
		{name: "empty prompt", prompt: nil, is: ErrEmptyPrompt},
		{name: "prompt fills the context", prompt: make([]int, 8), is: ErrPromptTooLong},
		{name: "prompt token out of range", prompt: []int{0, 16}, want: "prompt token 16 at position 1"},
		{name: "negative prompt token", prompt: []int{-1}, want: "prompt token -1 at position 0"},
		{name: "empty stop string", prompt: prompt3, opts: Options{StopStrings: []string{"a", ""}, Detokenizer: &tableDetok{pieces: pieces}}, want: "empty stop string"},
		{name: "stop strings without detokenizer", prompt: prompt3, opts: Options{StopStrings: []string{"a"}}, want: "need a Detokenizer"},
		{name: "sampler out of range", prompt: prompt3, opts: Options{Sampler: badSampler(99)}, want: "sampler returned id 99"},
		{name: "sampler error", prompt: prompt3, opts: Options{Sampler: failSampler{}}, is: errSample},
		{name: "NaN logits with the default sampler", fail: "nan", prompt: prompt3, is: sample.ErrNaN},
		{name: "model fails in prefill", fail: "prefill", prompt: prompt3, is: errFake},
		{name: "model fails in decode", fail: "decode", prompt: prompt3, is: errFake},
		{name: "emit error", prompt: prompt3, emit: func(Event) error { return emitErr }, is: emitErr},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := &fakeModel{vocab: 16, maxCtx: 8, eos: tEOS, next: script(3, tA)}
			var model Model = m
			switch tc.fail {
			case "prefill":
				model = failingModel{m}
			case "decode":
				m.failAt = 4
			case "nan":
				m.nan = true
			}
			_, err := Generate(context.Background(), model, tc.prompt, tc.opts, tc.emit)
			if err == nil {
				t.Fatal("no error")
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("err = %v, want %v", err, tc.is)
			}
			if tc.want != "" && !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to mention %q", err, tc.want)
			}
			if o, c := m.stats(); o != c {
				t.Errorf("sequences opened %d closed %d", o, c)
			}
		})
	}
}

// failingModel's sequences fail on the first Append.
type failingModel struct{ *fakeModel }

func (f failingModel) NewSequence() (Sequence, error) {
	s, _ := f.fakeModel.NewSequence()
	return failingSeq{s}, nil
}
func (f failingModel) VocabSize() int  { return f.fakeModel.VocabSize() }
func (f failingModel) MaxContext() int { return f.fakeModel.MaxContext() }

type failingSeq struct{ Sequence }

func (failingSeq) Append(context.Context, []int) ([]float32, error) { return nil, errFake }

func TestGenerateSampleSampler(t *testing.T) {
	// With flat logits (the favourite only 0.5 above the rest) temperature
	// sampling through package sample wanders; the seed fixes the path.
	m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, flat: true, next: script(3, tA)}
	run := func(p sample.Params) []int {
		sp, err := sample.New(p)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Generate(context.Background(), m, prompt3, Options{MaxTokens: 30, Sampler: sp}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res.Tokens
	}
	a, b, c := run(sample.Params{Temperature: 1, Seed: 5}), run(sample.Params{Temperature: 1, Seed: 5}), run(sample.Params{Temperature: 1, Seed: 6})
	if !reflect.DeepEqual(a, b) {
		t.Errorf("same seed, different tokens:\n%v\n%v", a, b)
	}
	if reflect.DeepEqual(a, c) {
		t.Errorf("seeds 5 and 6 gave the same 30 tokens %v", a)
	}
	// Greedy (the nil default and Temperature 0) follows the script.
	g := run(sample.Params{})
	res, err := Generate(context.Background(), m, prompt3, Options{MaxTokens: 30}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range g {
		if g[i] != tA || res.Tokens[i] != tA {
			t.Fatalf("greedy tokens %v / default %v, want all %d", g, res.Tokens, tA)
		}
	}
}

// intoModel's sequences implement IntoAppender over the fake model's
// Append, recording each call's destination.
type intoModel struct {
	*fakeModel
	calls  int // AppendInto calls
	reused int // calls whose dst was the previous call's (or the prompt's) logits
	last   []float32
}

type intoSeq struct {
	*fakeSeq
	im *intoModel
}

func (m *intoModel) NewSequence() (Sequence, error) {
	s, err := m.fakeModel.NewSequence()
	if err != nil {
		return nil, err
	}
	return &intoSeq{s.(*fakeSeq), m}, nil
}

func (s *intoSeq) Append(ctx context.Context, tokens []int) ([]float32, error) {
	l, err := s.fakeSeq.Append(ctx, tokens)
	s.im.last = l
	return l, err
}

func (s *intoSeq) AppendInto(ctx context.Context, tokens []int, dst []float32) ([]float32, error) {
	s.im.calls++
	if len(dst) > 0 && len(s.im.last) > 0 && &dst[0] == &s.im.last[0] {
		s.im.reused++
	}
	l, err := s.fakeSeq.Append(ctx, tokens)
	if err != nil || cap(dst) < len(l) {
		s.im.last = l
		return l, err
	}
	dst = dst[:len(l)]
	copy(dst, l)
	s.im.last = dst
	return dst, nil
}

func TestGenerateAppendInto(t *testing.T) {
	// A sequence that writes logits into the caller's slice gets each
	// decode step's previous logits as that slice and generates what the
	// plain sequence does.
	m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}
	im := &intoModel{fakeModel: &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}}
	opts := func() Options { return Options{MaxTokens: 25, IgnoreEOS: true, Sampler: newSeeded(3)} }
	want, err := Generate(context.Background(), m, prompt3, opts(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Generate(context.Background(), im, prompt3, opts(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Tokens, want.Tokens) {
		t.Errorf("with AppendInto: %v\nwithout: %v", got.Tokens, want.Tokens)
	}
	if steps := len(want.Tokens) - 1; im.calls != steps || im.reused != steps {
		t.Errorf("AppendInto called %d times, %d with the previous logits as dst; want %d decode steps, all reusing", im.calls, im.reused, steps)
	}
}

// reduceModel's sequences implement Reducer over the fake model's Append:
// AppendReduce reduces the logits in float64 in id order (one of Sample's
// chunks: the vocabularies here are small), as a device would.
type reduceModel struct {
	*fakeModel
	keep                       int // > 0: more candidates than this make the reduction incomplete
	reduces, lastLogits, draws int
}

type reduceSeq struct {
	*fakeSeq
	rm   *reduceModel
	last []float32
	spec sample.ReduceSpec
}

func (m *reduceModel) NewSequence() (Sequence, error) {
	s, err := m.fakeModel.NewSequence()
	if err != nil {
		return nil, err
	}
	return &reduceSeq{fakeSeq: s.(*fakeSeq), rm: m}, nil
}

func (s *reduceSeq) AppendReduce(ctx context.Context, tokens []int, spec sample.ReduceSpec, dst *sample.Reduction) error {
	s.rm.reduces++
	l, err := s.fakeSeq.Append(ctx, tokens)
	if err != nil {
		return err
	}
	s.last = l
	*dst = sample.Reduction{N: len(l), Best: -1, IDs: dst.IDs[:0], E: dst.E[:0], Complete: true}
	m := math.Inf(-1)
	for id, v := range l {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 1) {
			dst.Bad = true
		}
		if float64(v) > m {
			dst.Best, m = id, float64(v)
		}
	}
	if spec.Greedy {
		return nil
	}
	for id, v := range l {
		x := math.Exp((float64(v) - m) * spec.InvT)
		dst.Z += x
		if x > 0 && x >= spec.Threshold {
			dst.Count++
			dst.CandMass += x
			dst.IDs = append(dst.IDs, int32(id))
			dst.E = append(dst.E, x)
		}
	}
	if s.rm.keep > 0 && dst.Count > s.rm.keep {
		dst.IDs, dst.E, dst.Complete = dst.IDs[:0], dst.E[:0], false
	}
	s.spec = spec
	return nil
}

// DrawReduced draws as a device would: the candidates ranked by e (the
// lower id on ties), cut by d.TopK and d.TopP, then d.U times the kept mass
// walked in id order.
func (s *reduceSeq) DrawReduced(d sample.DeviceDraw) (int, error) {
	s.rm.draws++
	m := float64(slices.Max(s.last))
	var kept []int
	for id, v := range s.last {
		if x := math.Exp((float64(v) - m) * s.spec.InvT); x > 0 && x >= s.spec.Threshold {
			kept = append(kept, id)
		}
	}
	e := func(id int) float64 { return math.Exp((float64(s.last[id]) - m) * s.spec.InvT) }
	slices.SortStableFunc(kept, func(a, b int) int { return cmp.Compare(e(b), e(a)) })
	zk := d.Z
	if d.TopK > 0 && d.TopK <= len(kept) {
		kept, zk = kept[:d.TopK], 0
		for _, id := range kept {
			zk += e(id)
		}
	}
	if d.TopP > 0 {
		var cum float64
		for i, id := range kept {
			if cum += e(id); cum >= d.TopP*zk {
				kept = kept[:i+1]
				break
			}
		}
	}
	slices.Sort(kept)
	var total float64
	for _, id := range kept {
		total += e(id)
	}
	u := d.U * total
	for _, id := range kept {
		if u -= e(id); u < 0 {
			return id, nil
		}
	}
	return kept[len(kept)-1], nil
}

func (s *reduceSeq) LastLogits(dst []float32) ([]float32, error) {
	s.rm.lastLogits++
	return append(dst[:0], s.last...), nil
}

func TestGenerateReduce(t *testing.T) {
	// A sequence that reduces its logits for the sampler generates what the
	// plain sequence does, seed for seed; the sampler asks for the logits
	// only where its reduction does not suffice.
	for _, c := range []struct {
		name       string
		p          sample.Params
		keep       int  // the reducer's capacity (0: any)
		wantReduce bool // decode steps go through AppendReduce
		wantLogits bool // and each then asks for the logits
		wantDraw   bool // or has the sequence draw
	}{
		{"greedy", sample.Params{}, 0, true, false, false},
		{"top-p", sample.Params{Temperature: 1, TopP: 0.9, Seed: 5}, 0, true, false, false},
		{"top-k and min-p", sample.Params{Temperature: 0.7, TopK: 3, MinP: 0.2, Seed: 6}, 0, true, false, false},
		{"top-k over the vocabulary", sample.Params{Temperature: 1, TopK: 16, Seed: 7}, 0, true, true, false},
		{"temperature alone", sample.Params{Temperature: 1, Seed: 8}, 0, false, false, false},
		{"top-p, candidates past the capacity", sample.Params{Temperature: 1, TopP: 0.9, Seed: 9}, 4, true, false, true},
		{"top-k, candidates past the capacity", sample.Params{Temperature: 1, TopK: 6, Seed: 10}, 4, true, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, flat: true, next: script(3, tA)}
			rm := &reduceModel{fakeModel: &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, flat: true, next: script(3, tA)}, keep: c.keep}
			run := func(model Model) []int {
				sp, err := sample.New(c.p)
				if err != nil {
					t.Fatal(err)
				}
				res, err := Generate(context.Background(), model, prompt3, Options{MaxTokens: 30, IgnoreEOS: true, Sampler: sp}, nil)
				if err != nil {
					t.Fatal(err)
				}
				return res.Tokens
			}
			want, got := run(m), run(rm)
			if c.wantDraw { // another draw order: the same seed gives the same tokens
				want = run(&reduceModel{fakeModel: &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, flat: true, next: script(3, tA)}, keep: c.keep})
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("reduced: %v\nplain:   %v", got, want)
			}
			if wd := map[bool]int{true: len(want) - 1}[c.wantDraw]; rm.draws != wd {
				t.Errorf("%d DrawReduced calls, want %d", rm.draws, wd)
			}
			steps := len(want) - 1
			if wr := map[bool]int{true: steps}[c.wantReduce]; rm.reduces != wr {
				t.Errorf("%d AppendReduce calls, want %d", rm.reduces, wr)
			}
			if wl := map[bool]int{true: steps}[c.wantLogits]; rm.lastLogits != wl {
				t.Errorf("%d LastLogits calls, want %d", rm.lastLogits, wl)
			}
		})
	}
}

// pipeModel's sequences run greedy steps "ahead" as a device would
// (Pipeliner): a greedy AppendReduce with Pipeline on starts the step for
// its argmax (pending, not in the history), the matching AppendReduce
// confirms it, anything else drops it first.
type pipeModel struct {
	*reduceModel
	started, confirmed, dropped, onCalls int
	seqs                                 []*pipeSeq
}

type pipeSeq struct {
	*reduceSeq
	pm         *pipeModel
	on, pend   bool
	pendTok    int
	logitsGone bool
}

func (m *pipeModel) NewSequence() (Sequence, error) {
	s, err := m.reduceModel.NewSequence()
	if err != nil {
		return nil, err
	}
	p := &pipeSeq{reduceSeq: s.(*reduceSeq), pm: m}
	m.seqs = append(m.seqs, p)
	return p, nil
}

func (s *pipeSeq) Pipeline(on bool) {
	if on {
		s.pm.onCalls++
	}
	s.on = on
}

func (s *pipeSeq) Settle() error {
	if s.pend {
		s.pend = false
		s.pm.dropped++
	}
	return nil
}

func (s *pipeSeq) Append(ctx context.Context, tokens []int) ([]float32, error) {
	_ = s.Settle()
	s.logitsGone = false
	return s.reduceSeq.Append(ctx, tokens)
}

func (s *pipeSeq) AppendReduce(ctx context.Context, tokens []int, spec sample.ReduceSpec, dst *sample.Reduction) error {
	if s.pend && spec.Greedy && len(tokens) == 1 && tokens[0] == s.pendTok {
		s.pm.confirmed++
		s.pend = false
	} else {
		_ = s.Settle()
	}
	if err := s.reduceSeq.AppendReduce(ctx, tokens, spec, dst); err != nil {
		return err
	}
	s.logitsGone = false
	if s.on && spec.Greedy && len(tokens) == 1 && !dst.Bad && dst.Best >= 0 {
		s.pend, s.pendTok, s.logitsGone = true, dst.Best, true
		s.pm.started++
	}
	return nil
}

func (s *pipeSeq) LastLogits(dst []float32) ([]float32, error) {
	if s.logitsGone {
		return nil, errors.New("pipeSeq: logits gone")
	}
	return s.reduceSeq.LastLogits(dst)
}

func (s *pipeSeq) Close() error {
	_ = s.Settle()
	return s.reduceSeq.Close()
}

func TestGeneratePipeline(t *testing.T) {
	// Greedy generation over a sequence that runs steps ahead gives the
	// plain sequence's tokens; each step but the first is confirmed, none
	// is started past the limit, a step started for a stop token is
	// dropped before the sequence is kept, and a sampler that is not
	// greedy never switches it on.
	newPM := func(next func([]int) int, eos int) *pipeModel {
		return &pipeModel{reduceModel: &reduceModel{fakeModel: &fakeModel{vocab: 16, maxCtx: 1000, eos: eos, flat: true, next: next}}}
	}
	for _, c := range []struct {
		name             string
		next             func([]int) int
		eos              int
		p                sample.Params
		max              int
		wantOn           bool
		wantTokens       int
		wantConfirmed    int
		wantDropped      int
		wantCachedLength int
	}{
		{"to the limit", script(3, tA, tB, tA, tA, tB), -1, sample.Params{}, 12, true, 12, 10, 0, 3 + 11}, // the last token is not appended
		{"to the limit of 2", script(3, tA, tB), -1, sample.Params{}, 2, true, 2, 0, 0, 3 + 1},
		{"one token", script(3, tA, tB), -1, sample.Params{}, 1, false, 1, 0, 0, 3 + 1},
		{"stop token", script(3, tA, tB, tA, tEOS), tEOS, sample.Params{}, 50, true, 4, 2, 1, 3 + 3},
		{"sampled", script(3, tA, tB, tA, tEOS), tEOS, sample.Params{Temperature: 0.5, TopK: 3, Seed: 4}, 8, false, -1, 0, 0, -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			run := func(m Model, cache *Cache) Result {
				sp, err := sample.New(c.p)
				if err != nil {
					t.Fatal(err)
				}
				res, err := Generate(context.Background(), m, prompt3, Options{MaxTokens: c.max, Sampler: sp, Cache: cache}, nil)
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			want := run(&fakeModel{vocab: 16, maxCtx: 1000, eos: c.eos, flat: true, next: c.next}, nil)
			pm := newPM(c.next, c.eos)
			cache := NewCache(2)
			got := run(pm, cache)
			if !reflect.DeepEqual(got.Tokens, want.Tokens) {
				t.Fatalf("pipelined: %v\nplain:     %v", got.Tokens, want.Tokens)
			}
			if c.wantTokens >= 0 && len(got.Tokens) != c.wantTokens {
				t.Errorf("%d tokens, want %d", len(got.Tokens), c.wantTokens)
			}
			if (pm.onCalls > 0) != c.wantOn {
				t.Errorf("Pipeline(true) called %d times, want on %v", pm.onCalls, c.wantOn)
			}
			if !c.wantOn {
				if pm.started != 0 {
					t.Errorf("%d steps started ahead, want none", pm.started)
				}
				return
			}
			if pm.confirmed != c.wantConfirmed || pm.dropped != c.wantDropped || pm.started != c.wantConfirmed+c.wantDropped {
				t.Errorf("started %d, confirmed %d, dropped %d; want %d confirmed and %d dropped", pm.started, pm.confirmed, pm.dropped, c.wantConfirmed, c.wantDropped)
			}
			for _, s := range pm.seqs {
				if s.pend || s.on {
					t.Errorf("a sequence left with a step in flight (%v) or Pipeline on (%v)", s.pend, s.on)
				}
			}
			if cache.Len() != 1 || len(pm.seqs) != 1 || pm.seqs[0].Len() != c.wantCachedLength {
				t.Errorf("cache holds %d sequences; the sequence holds %d tokens, want one of %d", cache.Len(), pm.seqs[0].Len(), c.wantCachedLength)
			}
		})
	}
}
