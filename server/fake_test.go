package server

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"moxie/checkpoint"
	"moxie/generate"
	"moxie/tokenizer"
)

// Ids of the tiny tokenizer (checkpoint.TinyTokenizerJSON): 0 BOS, 1 EOS,
// 3+b the byte b, then the chat markers.
const (
	idBOS       = 0
	idEOS       = 1
	idUser      = 259
	idAssistant = 260
	idThink     = 261
	idEndThink  = 262
)

func tinyTokenizer(t testing.TB) *tokenizer.Tokenizer {
	t.Helper()
	tok, err := tokenizer.Load(checkpoint.TinyTokenizerJSON(), checkpoint.TinyTokenizerConfigJSON())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// byteIDs spells s in the tiny vocabulary, one id per byte (it has no merges).
func byteIDs(s string) []int {
	out := make([]int, len(s))
	for i := range len(s) {
		out[i] = 3 + int(s[i])
	}
	return out
}

// fakeModel answers every prompt with a script: in thinking mode (prompt
// ending in <think>) reasoning, </think>, answer, EOS; otherwise answer, EOS.
// After the script it repeats the last token (the answer's last byte when
// the script has no EOS).
type fakeModel struct {
	vocab, maxCtx int
	reasoning     string
	answer        string
	toolAnswer    string // if set, the answer to prompts that declare tools ("## Tools")
	noEOS         bool
	step          time.Duration // per Append, interrupted by ctx
	block         chan struct{} // if set, every Append after prefill waits for it (or ctx)
	blockPrefill  bool          // block applies to the prefill too
	panicOnAppend bool
	flat          bool          // the scripted token only slightly favoured: sampling wanders
	failAfter     int           // if > 0, feeding back generated token failAfter+1 fails
	prefillDelay  time.Duration // extra time the prefill takes (interrupted by ctx)

	appends    atomic.Int64
	cancelled  atomic.Int64  // Appends that saw ctx done
	lastPrompt atomic.Value  // string: the latest prompt as text (bytes only)
	seen       chan struct{} // closed-once signal: an Append observed cancellation
	seenOnce   sync.Once
	started    chan struct{} // receives once per prefill (buffered)
}

func newFake() *fakeModel {
	return &fakeModel{vocab: 288, maxCtx: 256, answer: "Hello, world!", reasoning: "Let me think.",
		seen: make(chan struct{}), started: make(chan struct{}, 1024)}
}

func (m *fakeModel) NewSequence() (generate.Sequence, error) { return &fakeSeq{m: m}, nil }
func (m *fakeModel) VocabSize() int                          { return m.vocab }
func (m *fakeModel) MaxContext() int                         { return m.maxCtx }

type fakeSeq struct {
	m      *fakeModel
	h      []int
	script []int
	prompt int
	expect int // the token the last logits made certain (fed back by a decode step)
}

func (s *fakeSeq) observe(ctx context.Context) error {
	s.m.cancelled.Add(1)
	s.m.seenOnce.Do(func() { close(s.m.seen) })
	return ctx.Err()
}

func (s *fakeSeq) Append(ctx context.Context, tokens []int) ([]float32, error) {
	m := s.m
	m.appends.Add(1)
	if m.panicOnAppend {
		panic("fake model exploded")
	}
	if err := ctx.Err(); err != nil {
		return nil, s.observe(ctx)
	}
	if len(s.h) == 0 || len(tokens) > 1 || tokens[0] != s.expect && !m.flat {
		// A prompt: the first Append, a continuation of a cached sequence,
		// or a prompt's last token fed alone (Snapshot, or a continuation
		// by one token): anything but the token the script made certain
		// (with flat logits, sampling wanders: only multi-token calls).
		// The script answers the whole history.
		s.prompt = len(s.h) + len(tokens)
		s.script = nil
		var text []byte
		for _, id := range append(append([]int(nil), s.h...), tokens...) {
			if id >= 3 && id < 259 {
				text = append(text, byte(id-3))
			}
		}
		m.lastPrompt.Store(string(text))
		if tokens[len(tokens)-1] == idThink {
			s.script = append(byteIDs(m.reasoning), idEndThink)
		}
		answer := m.answer
		if m.toolAnswer != "" && strings.Contains(string(text), "## Tools") {
			answer = m.toolAnswer
		}
		s.script = append(s.script, byteIDs(answer)...)
		if !m.noEOS {
			s.script = append(s.script, idEOS)
		}
		select {
		case m.started <- struct{}{}:
		default:
		}
		if m.prefillDelay > 0 {
			select {
			case <-time.After(m.prefillDelay):
			case <-ctx.Done():
				return nil, s.observe(ctx)
			}
		}
	}
	if m.block != nil && (len(s.h) > 0 || m.blockPrefill) {
		select {
		case <-m.block:
		case <-ctx.Done():
			return nil, s.observe(ctx)
		}
	}
	if m.step > 0 {
		t := time.NewTimer(m.step)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, s.observe(ctx)
		}
	}
	if m.failAfter > 0 && len(s.h) > 0 && len(s.h)-s.prompt+1 > m.failAfter {
		return nil, errors.New("fake device lost")
	}
	s.h = append(s.h, tokens...)
	if len(s.h) > m.maxCtx {
		return nil, errors.New("context overflow")
	}
	i := min(len(s.h)-s.prompt, len(s.script)-1)
	s.expect = s.script[i]
	logits := make([]float32, m.vocab)
	for k := range logits {
		logits[k] = float32(k%7) * 0.1
	}
	if m.flat {
		for k := range logits {
			logits[k] /= 10 // background below 0.07
		}
		logits[s.script[i]] += 0.3
	} else {
		logits[s.script[i]] = 40 // certain under any sampler
	}
	return logits, nil
}

func (s *fakeSeq) Len() int { return len(s.h) }

// CloneSequence implements generate.Cloner: the copy has the same history
// and script.
func (s *fakeSeq) CloneSequence() (generate.Sequence, error) {
	return &fakeSeq{m: s.m, h: slices.Clone(s.h), script: slices.Clone(s.script), prompt: s.prompt, expect: s.expect}, nil
}
func (s *fakeSeq) Close() error { return nil }

// testServer starts an httptest server around a Server on fake.
func testServer(t testing.TB, cfg Config, fake *fakeModel) (*Server, *httptest.Server) {
	t.Helper()
	s, err := New(cfg, Backend{
		Name: "moxie-test", Model: fake, Tokenizer: FromTokenizer(tinyTokenizer(t)),
		Chat: DeepSeekV4Chat(tinyTokenizer(t)), StopTokens: []int{idEOS},
	})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, ts
}

func post(t testing.TB, url, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func get(t testing.TB, url string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// httptestRecorder runs one request through h in process.
func httptestRecorder(h http.Handler, method, path, body string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
	return rec
}

// doPost is post for goroutines other than the test's: it reports errors
// instead of failing the test.
func doPost(url, body string) (int, string, error) {
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}
