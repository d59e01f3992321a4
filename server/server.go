// Package server is moxie's OpenAI-compatible HTTP API, with Anthropic's
// Messages API beside it.
//
// Endpoints:
//
//	POST /v1/chat/completions  chat, non-streaming or SSE streaming
//	POST /v1/completions       raw prompt -> text, non-streaming or SSE streaming
//	POST /v1/messages          Anthropic Messages (anthropic.go)
//	POST /v1/messages/count_tokens  the prompt's token count
//	GET  /v1/models            the one served model
//	GET  /health               200 {"status":"ok"} (503 while shutting down)
//	GET  /metrics              Prometheus text format
//
// Thinking mode. A chat request asks for DeepSeek-V4's thinking mode with
// "thinking": {"type": "enabled"} (DeepSeek's API; a boolean is accepted too)
// or with "reasoning_effort": "low" | "medium" | "high" | "max" (thinking on;
// the levels do not differ yet) or "none" | "minimal" (off). "thinking" wins
// over "reasoning_effort"; without either the server default applies
// (Config.DefaultThinking). In thinking mode the text the model writes before
// </think> is returned as message.reasoning_content (delta.reasoning_content
// when streaming) and the rest as content; usage.completion_tokens_details.
// reasoning_tokens counts the tokens up to and including </think>. Stop
// strings are matched on the whole generated text, reasoning included.
//
// Tool calling. "tools" (type "function") are described to the model in the
// system prompt, assistant "tool_calls" and "tool" results in the history are
// rendered in DeepSeek's DSML format, and DSML tool calls in the output come
// back as message.tool_calls with finish_reason "tool_calls" (streamed as one
// delta.tool_calls chunk once the block is complete). tool_choice may be
// "auto" or "none". A tool-call block that does not parse is returned as
// content.
//
// Sampling: temperature, top_p and seed as OpenAI; extensions top_k, min_p
// and repetition_penalty (vLLM's meanings), all through package sample.
// presence_penalty and frequency_penalty are refused unless 0. ignore_eos
// (vLLM's extension) keeps generating past the stop tokens up to max_tokens,
// for benchmarks.
//
// Timings. Non-streamed responses and the finish chunk of a stream carry a
// "timings" object (moxie's extension; clients ignore unknown fields):
// prompt_tokens, prefill_ms, prefill_tokens_per_second,
// time_to_first_token_ms, generated_tokens, decode_ms and
// decode_tokens_per_second, as defined by generate.Result.
//
// Every error is an OpenAI-style object {"error": {"message", "type",
// "param", "code"}} whose param names the field at fault; on the Messages
// endpoints, Anthropic's {"type": "error", "error": {"type", "message"}}.
//
// Messages API. system (a string or text blocks), messages of user and
// assistant turns whose content is a string or blocks (text; thinking,
// redacted_thinking and tool_use from the assistant; tool_result from the
// user; images and documents are refused), max_tokens (required),
// stop_sequences, temperature, top_p, top_k, stream, tools (name,
// description, input_schema; server tools refused), tool_choice auto or
// none, thinking {"type": "enabled"|"disabled"} (budget_tokens is not
// enforced). Responses carry thinking (with an empty signature), text and
// tool_use blocks, stop_reason end_turn, max_tokens, stop_sequence or
// tool_use, and usage with the prompt cache's reuse as
// cache_read_input_tokens (input_tokens counts the rest). Streams send
// Anthropic's named events: message_start, content_block_start /
// _delta (text_delta, thinking_delta, signature_delta, input_json_delta) /
// _stop, message_delta, message_stop. The API key may come as x-api-key.
package server

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"moxie/chat"
	"moxie/generate"
)

// ChatTemplate turns chat messages into prompt token ids. Implementations must
// be safe for concurrent use.
type ChatTemplate interface {
	// Prompt returns the ids of the prompt for msgs, ending with the
	// assistant opener of the mode in opts. An error is reported to the
	// client as a 400 naming "messages".
	Prompt(msgs []chat.Message, opts chat.Options) ([]int, error)
}

// Tokenizer is what the server needs from a tokenizer. It must be safe for
// concurrent use.
type Tokenizer interface {
	// Encode returns the ids of text, turning the text of control tokens into
	// their ids (the raw prompt of /v1/completions is the caller's own
	// template).
	Encode(text string) []int
	// NewDetokenizer returns a fresh streaming decoder.
	NewDetokenizer() generate.Detokenizer
}

// SamplingParams are a request's sampling fields after validation, with
// OpenAI's defaults filled in (Temperature 1, TopP 1, RepetitionPenalty 1,
// the rest off).
type SamplingParams struct {
	Temperature       float64 // 0: greedy
	TopP              float64 // (0, 1]
	TopK              int     // 0: off
	MinP              float64 // 0: off
	RepetitionPenalty float64 // 1: off
	Seed              int64
	Seeded            bool // false: the sampler picks its own seed
}

// Backend is the model the server serves.
type Backend struct {
	// Name is the model id listed by /v1/models and required in requests.
	Name string
	// Model generates tokens. With Config.Concurrency > 1 its sequences must
	// be usable from several goroutines at once (one goroutine per sequence).
	Model generate.Model
	// Tokenizer encodes raw prompts and decodes output.
	Tokenizer Tokenizer
	// Chat renders chat requests; nil disables /v1/chat/completions (404).
	Chat ChatTemplate
	// StopTokens end every generation (normally the EOS id).
	StopTokens []int
	// NewSampler builds a request's sampler; nil uses the package sample
	// implementation (see DefaultSampler).
	NewSampler func(SamplingParams) (generate.Sampler, error)
}

// Gauge is one extra metric value exported on /metrics, e.g. the expert cache
// hit rate or memory in use by tier. Name must match
// [a-zA-Z_:][a-zA-Z0-9_:]*; invalid gauges are skipped.
type Gauge struct {
	Name   string
	Help   string
	Labels map[string]string
	Value  float64
}

// Config controls the server. The zero value is usable.
type Config struct {
	// Concurrency is the number of generations run at once (default 1).
	Concurrency int
	// QueueSize is the number of requests that may wait for a slot; a request
	// arriving when Concurrency are running and QueueSize are waiting gets
	// 503 with Retry-After. 0 means no waiting.
	QueueSize int
	// RetryAfter is the Retry-After of a 503 (default 1s, rounded up to seconds).
	RetryAfter time.Duration
	// APIKey, when set, must be sent as "Authorization: Bearer KEY" on every
	// request (401 otherwise).
	APIKey string
	// MaxBodyBytes bounds a request body (default 8 MiB; 413 beyond).
	MaxBodyBytes int64
	// DefaultMaxTokens caps generation for requests that set neither
	// max_tokens nor max_completion_tokens (clamped to the room left in the
	// context); 0 means up to the end of the context.
	DefaultMaxTokens int
	// DefaultThinking is the thinking mode of chat requests that do not say.
	DefaultThinking bool
	// PromptCache is how many finished sequences the server keeps so that
	// a later request whose prompt extends one (a chat's next turn, sent
	// with the whole conversation) prefills only its new tokens
	// (generate.Cache; usage.prompt_tokens_details.cached_tokens says how
	// many were reused). 0 means one per generation slot (Concurrency);
	// negative disables. Cached sequences keep their memory.
	PromptCache int
	// DiskCache, when set with the prompt cache on, gives the prompt cache a
	// disk tier (generate.Cache.UseDisk): a sequence evicted from memory,
	// and every cached one when the server stops, is written to
	// DiskCache.Dir, and a later request (in this process or the next)
	// whose prompt extends one restores it instead of prefilling. The model
	// must implement generate.Restorer (New fails otherwise); sequences that
	// cannot be saved (generate.Saver) are not written.
	DiskCache *generate.DiskOptions
	// KeepAlive is the idle time after which a stream gets an SSE comment
	// line (": keep-alive"), e.g. during a long prefill (default 15s;
	// negative disables).
	KeepAlive time.Duration
	// ShutdownGrace is how long Serve lets in-flight requests finish after
	// its context is cancelled before cancelling them (default 30s).
	ShutdownGrace time.Duration
	// Gauges, if set, is called on every /metrics scrape for extra gauges.
	Gauges func() []Gauge
	// Logger receives one line per request; nil discards.
	Logger *slog.Logger
}

// Server is an http.Handler serving one Backend.
type Server struct {
	cfg Config
	b   Backend
	mux *http.ServeMux
	log *slog.Logger

	slots   chan struct{}   // one token per running generation
	cache   *generate.Cache // nil: no prompt cache
	waiting atomic.Int64    // requests queued for a slot
	m       *metrics

	base     context.Context // parent of every request context under Serve
	cancel   context.CancelFunc
	draining atomic.Bool
	active   sync.WaitGroup // handlers running
	created  int64
}

// New validates cfg and b and returns a Server.
func New(cfg Config, b Backend) (*Server, error) {
	if b.Model == nil || b.Tokenizer == nil {
		return nil, errors.New("server: backend needs a Model and a Tokenizer")
	}
	if b.Name == "" {
		return nil, errors.New("server: backend needs a Name")
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 1
	}
	if cfg.QueueSize < 0 {
		return nil, fmt.Errorf("server: QueueSize %d < 0", cfg.QueueSize)
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = time.Second
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 8 << 20
	}
	if cfg.KeepAlive == 0 {
		cfg.KeepAlive = 15 * time.Second
	}
	if cfg.ShutdownGrace <= 0 {
		cfg.ShutdownGrace = 30 * time.Second
	}
	if b.NewSampler == nil {
		b.NewSampler = DefaultSampler
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, b: b, log: log, slots: make(chan struct{}, cfg.Concurrency),
		m: newMetrics(), created: time.Now().Unix()}
	switch {
	case cfg.PromptCache == 0:
		s.cache = generate.NewCache(cfg.Concurrency)
	case cfg.PromptCache > 0:
		s.cache = generate.NewCache(cfg.PromptCache)
	}
	if cfg.DiskCache != nil && s.cache != nil {
		r, ok := b.Model.(generate.Restorer)
		if !ok {
			return nil, fmt.Errorf("server: DiskCache: the model cannot restore saved sequences")
		}
		opts := *cfg.DiskCache
		if opts.OnError == nil {
			opts.OnError = func(err error) { log.Warn("prompt cache on disk", "err", err) }
		}
		n, err := s.cache.UseDisk(opts, r)
		if err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
		log.Info("prompt cache on disk", "dir", opts.Dir, "saved sequences", n)
	}
	s.base, s.cancel = context.WithCancel(context.Background())
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/chat/completions", only("POST", s.handleChat))
	mux.HandleFunc("/v1/completions", only("POST", s.handleCompletions))
	mux.HandleFunc("/v1/messages", only("POST", s.handleMessages))
	mux.HandleFunc("/v1/messages/count_tokens", only("POST", s.handleCountTokens))
	mux.HandleFunc("/v1/models", only("GET", s.handleModels))
	mux.HandleFunc("/v1/models/{id}", only("GET", s.handleModel))
	mux.HandleFunc("/health", only("GET", s.handleHealth))
	mux.HandleFunc("/metrics", only("GET", s.handleMetrics))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error",
			Message: fmt.Sprintf("no route %s %s", r.Method, r.URL.Path), Code: strp("unknown_url")})
	})
	s.mux = mux
	return s, nil
}

// only answers 405 with an OpenAI-style error to methods other than method.
func only(method string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method {
			w.Header().Set("Allow", method)
			writeError(w, &apiError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error",
				Message: fmt.Sprintf("%s %s: method not allowed (use %s)", r.Method, r.URL.Path, method), Code: strp("method_not_allowed")})
			return
		}
		h(w, r)
	}
}

// endpoints are the metric labels of known paths; others count as "other".
var endpoints = map[string]bool{
	"/v1/chat/completions": true, "/v1/completions": true, "/v1/models": true,
	"/v1/messages": true, "/v1/messages/count_tokens": true,
	"/health": true, "/metrics": true,
}

// statusWriter records the status code and whether anything was written.
type statusWriter struct {
	http.ResponseWriter
	status int
	// anthropic: the request is for an Anthropic endpoint, whose errors
	// take Anthropic's shape (writeError).
	anthropic bool
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach Flush.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ServeHTTP implements http.Handler: recovery, auth, body limit, metrics and
// logging around the routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.active.Add(1)
	defer s.active.Done()
	start := time.Now()
	sw := &statusWriter{ResponseWriter: w, anthropic: anthropicPath(r.URL.Path)}
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.Error("panic in handler", "path", r.URL.Path, "panic", v, "stack", string(debug.Stack()))
			if sw.status == 0 {
				writeError(sw, &apiError{Status: http.StatusInternalServerError, Type: "server_error",
					Message: "internal error", Code: strp("internal_error")})
			}
		}
		ep := r.URL.Path
		if !endpoints[ep] {
			ep = "other"
		}
		status := sw.status
		if status == 0 {
			status = http.StatusOK
		}
		s.m.request(ep, status)
		s.log.Info("request", "method", r.Method, "path", r.URL.Path, "status", status,
			"duration", time.Since(start), "remote", r.RemoteAddr)
	}()

	if s.cfg.APIKey != "" && !s.authorized(r) {
		sw.Header().Set("WWW-Authenticate", `Bearer realm="moxie"`)
		writeError(sw, &apiError{Status: http.StatusUnauthorized, Type: "invalid_request_error",
			Message: "missing or wrong API key: send \"Authorization: Bearer KEY\" (or \"x-api-key: KEY\")", Code: strp("invalid_api_key")})
		return
	}
	r.Body = http.MaxBytesReader(sw, r.Body, s.cfg.MaxBodyBytes)
	s.mux.ServeHTTP(sw, r)
}

func (s *Server) authorized(r *http.Request) bool {
	if k := r.Header.Get("X-Api-Key"); k != "" {
		return subtle.ConstantTimeCompare([]byte(k), []byte(s.cfg.APIKey)) == 1
	}
	const prefix = "Bearer "
	h := r.Header.Get("Authorization")
	if len(h) < len(prefix) || h[:len(prefix)] != prefix {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(h[len(prefix):]), []byte(s.cfg.APIKey)) == 1
}

// acquire waits for a generation slot. It answers false, having written the
// error, when the queue is full (503), the server is draining (503) or ctx
// ends while waiting.
func (s *Server) acquire(ctx context.Context, w http.ResponseWriter) bool {
	if s.draining.Load() {
		s.unavailable(w, "server is shutting down", "shutting_down")
		return false
	}
	select {
	case s.slots <- struct{}{}:
		s.m.inflight.Add(1)
		return true
	default:
	}
	if n := s.waiting.Add(1); n > int64(s.cfg.QueueSize) {
		s.waiting.Add(-1)
		s.unavailable(w, fmt.Sprintf("server busy: %d requests running and %d queued; retry later", s.cfg.Concurrency, s.cfg.QueueSize), "queue_full")
		return false
	}
	defer s.waiting.Add(-1)
	select {
	case s.slots <- struct{}{}:
		s.m.inflight.Add(1)
		return true
	case <-ctx.Done():
		writeError(w, &apiError{Status: http.StatusServiceUnavailable, Type: "server_error",
			Message: "request cancelled while queued", Code: strp("cancelled")})
		return false
	}
}

func (s *Server) release() {
	s.m.inflight.Add(-1)
	<-s.slots
}

func (s *Server) unavailable(w http.ResponseWriter, msg, code string) {
	secs := int((s.cfg.RetryAfter + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	writeError(w, &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Message: msg, Code: strp(code)})
}

// Serve serves HTTP on ln until ctx is cancelled, then shuts down gracefully:
// it stops accepting connections, answers new requests on open connections
// with 503, lets in-flight requests finish for up to Config.ShutdownGrace,
// cancels those still running and waits for their handlers to return. It
// returns nil after a clean shutdown, or the error that stopped serving. A
// Server serves at most once: its request contexts stay cancelled after.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return s.base },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		s.cancel()
		s.Close()
		return err
	case <-ctx.Done():
	}
	s.draining.Store(true)
	s.log.Info("shutting down", "grace", s.cfg.ShutdownGrace)
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownGrace)
	defer cancel()
	err := hs.Shutdown(sctx)
	if err != nil {
		s.log.Warn("grace period over: cancelling in-flight requests")
		s.cancel()
		done := make(chan struct{})
		go func() { s.active.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			s.log.Error("handlers still running 10s after cancellation")
		}
		hs.Close()
	}
	s.cancel()
	if e := <-errc; e != nil && !errors.Is(e, http.ErrServerClosed) {
		s.Close()
		return e
	}
	return s.Close()
}

// Close frees the sequences the prompt cache holds; later generations
// close theirs instead of caching them. Serve calls it when it returns; a
// caller that uses the Server only as an http.Handler calls it when done.
func (s *Server) Close() error {
	if s.cache == nil {
		return nil
	}
	return s.cache.Close()
}

// newID returns prefix followed by 24 random hex digits.
func newID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
