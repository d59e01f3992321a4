package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"moxie/chat"
	"moxie/generate"
)

// job is a validated generation request.
type job struct {
	chat     bool // chat.completion vs text_completion
	model    string
	prompt   []int
	p        params
	thinking bool
	sampler  generate.Sampler
	system   int // the prompt's system part, a prompt-cache checkpoint (0: none)
}

// systemPrefixer is a ChatTemplate that says where a prompt's leading
// system messages end (chat.SystemPrefix).
type systemPrefixer interface {
	SystemPrefix(msgs []chat.Message, opts chat.Options, ids []int) int
}

// systemPart is chat.SystemPrefix through the template, when it can say
// and a prompt cache could use it; else 0.
func (s *Server) systemPart(msgs []chat.Message, opts chat.Options, ids []int) int {
	sp, ok := s.b.Chat.(systemPrefixer)
	if !ok || s.cache == nil || s.cfg.DiskCache == nil {
		return 0
	}
	return sp.SystemPrefix(msgs, opts, ids)
}

func (s *Server) checkModel(model string) *apiError {
	if model == "" {
		return badRequest("model", "missing_required_parameter", "model: required (this server serves %q)", s.b.Name)
	}
	if model != s.b.Name {
		return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error",
			Message: fmt.Sprintf("model: %q is not served here (this server serves %q)", model, s.b.Name),
			Param:   strp("model"), Code: strp("model_not_found")}
	}
	return nil
}

// checkContext rejects prompts that, with the requested max tokens, do not fit
// the model's context; maxField names the field max tokens came from.
func (s *Server) checkContext(j *job, promptField, maxField string) *apiError {
	ctxLen := s.b.Model.MaxContext()
	n := len(j.prompt)
	if n == 0 {
		return badRequest(promptField, "invalid_value", "%s: the prompt encodes to no tokens", promptField)
	}
	if n >= ctxLen {
		return badRequest(promptField, "context_length_exceeded",
			"%s: the prompt is %d tokens; this model's context is %d tokens, leaving no room for output", promptField, n, ctxLen)
	}
	if j.p.maxTokens == 0 && s.cfg.DefaultMaxTokens > 0 {
		j.p.maxTokens = min(s.cfg.DefaultMaxTokens, ctxLen-n)
		return nil
	}
	if j.p.maxTokens > ctxLen-n {
		return badRequest(maxField, "context_length_exceeded",
			"%s: %d prompt tokens + %d requested exceed this model's context of %d tokens (at most %d can be requested)",
			maxField, n, j.p.maxTokens, ctxLen, ctxLen-n)
	}
	return nil
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	if s.b.Chat == nil {
		writeError(w, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error",
			Message: "this server has no chat template: use /v1/completions", Code: strp("unknown_url")})
		return
	}
	var req chatRequest
	if e := decodeJSON(r.Body, &req); e != nil {
		writeError(w, e)
		return
	}
	j, e := s.chatJob(&req)
	if e != nil {
		writeError(w, e)
		return
	}
	s.run(w, r, j)
}

func (s *Server) chatJob(req *chatRequest) (*job, *apiError) {
	if e := s.checkModel(req.Model); e != nil {
		return nil, e
	}
	msgs, e := parseMessages(req.Messages)
	if e != nil {
		return nil, e
	}
	p, e := req.validate(req.MaxCompletion)
	if e != nil {
		return nil, e
	}
	thinking, e := parseThinking(req.Thinking, req.ReasoningEffort, s.cfg.DefaultThinking)
	if e != nil {
		return nil, e
	}
	tools, e := parseTools(req.Tools, req.ToolChoice)
	if e != nil {
		return nil, e
	}
	msgs = withTools(msgs, tools)
	if !isNull(req.ResponseFormat) {
		var rf struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(req.ResponseFormat, &rf); err != nil || rf.Type != "text" {
			return nil, badRequest("response_format", "unsupported_value", "response_format: only {\"type\": \"text\"} is supported")
		}
	}
	if req.Logprobs != nil && *req.Logprobs || req.TopLogprobs != nil {
		return nil, badRequest("logprobs", "unsupported_value", "logprobs: not supported")
	}
	copts := chat.Options{Thinking: thinking}
	prompt, err := s.b.Chat.Prompt(msgs, copts)
	if err != nil {
		return nil, badRequest("messages", "invalid_value", "messages: %v", err)
	}
	j := &job{chat: true, model: req.Model, prompt: prompt, p: p, thinking: thinking, system: s.systemPart(msgs, copts, prompt)}
	maxField := "max_tokens"
	if req.MaxCompletion != nil {
		maxField = "max_completion_tokens"
	}
	return s.finishJob(j, "messages", maxField)
}

func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	if e := decodeJSON(r.Body, &req); e != nil {
		writeError(w, e)
		return
	}
	j, e := s.completionJob(&req)
	if e != nil {
		writeError(w, e)
		return
	}
	s.run(w, r, j)
}

func (s *Server) completionJob(req *completionRequest) (*job, *apiError) {
	if e := s.checkModel(req.Model); e != nil {
		return nil, e
	}
	prompt, e := parsePrompt(req.Prompt)
	if e != nil {
		return nil, e
	}
	p, e := req.validate(nil)
	if e != nil {
		return nil, e
	}
	switch {
	case req.Echo != nil && *req.Echo:
		return nil, badRequest("echo", "unsupported_value", "echo: not supported")
	case req.Suffix != nil && *req.Suffix != "":
		return nil, badRequest("suffix", "unsupported_value", "suffix: not supported")
	case !isNull(req.Logprobs):
		return nil, badRequest("logprobs", "unsupported_value", "logprobs: not supported")
	case req.BestOf != nil && *req.BestOf != 1:
		return nil, badRequest("best_of", "unsupported_value", "best_of: only 1 is supported")
	}
	j := &job{model: req.Model, prompt: s.b.Tokenizer.Encode(prompt), p: p}
	return s.finishJob(j, "prompt", "max_tokens")
}

// finishJob checks that j fits the context (promptField and maxField name
// the fields to blame) and makes its sampler.
func (s *Server) finishJob(j *job, promptField, maxField string) (*job, *apiError) {
	if e := s.checkContext(j, promptField, maxField); e != nil {
		return nil, e
	}
	if e := s.makeSampler(j); e != nil {
		return nil, e
	}
	return j, nil
}

func (s *Server) makeSampler(j *job) *apiError {
	sp, err := s.b.NewSampler(j.p.sampling)
	if err != nil {
		return badRequest("", "invalid_value", "sampling parameters: %v", err)
	}
	j.sampler = sp
	return nil
}

// Wire types of responses.
type (
	usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
		// PromptDetails is present when the server keeps a prompt cache.
		PromptDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details,omitempty"`
		CompletionDetails *struct {
			ReasoningTokens int `json:"reasoning_tokens"`
		} `json:"completion_tokens_details,omitempty"`
	}
	toolCallOut struct {
		Index    *int   `json:"index,omitempty"` // streaming only
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	}
	// chatMessage is a streamed delta: absent fields are left out.
	chatMessage struct {
		Role             string        `json:"role,omitempty"`
		Content          *string       `json:"content,omitempty"`
		ReasoningContent *string       `json:"reasoning_content,omitempty"`
		ToolCalls        []toolCallOut `json:"tool_calls,omitempty"`
	}
	// fullMessage is a non-streamed message: content is null when empty
	// beside tool calls.
	fullMessage struct {
		Role             string        `json:"role"`
		Content          *string       `json:"content"`
		ReasoningContent *string       `json:"reasoning_content,omitempty"`
		ToolCalls        []toolCallOut `json:"tool_calls,omitempty"`
	}
	chatChoice struct {
		Index        int          `json:"index"`
		Message      *fullMessage `json:"message,omitempty"`
		Delta        *chatMessage `json:"delta,omitempty"`
		Text         *string      `json:"text,omitempty"`
		Logprobs     *struct{}    `json:"logprobs"`
		FinishReason *string      `json:"finish_reason"`
	}
	// timings is moxie's extension: where the time of a generation went.
	timings struct {
		PromptTokens           int     `json:"prompt_tokens"`
		CachedTokens           int     `json:"cached_prompt_tokens"`
		PrefillMS              float64 `json:"prefill_ms"`
		PrefillTokensPerSecond float64 `json:"prefill_tokens_per_second"`
		TimeToFirstTokenMS     float64 `json:"time_to_first_token_ms"`
		GeneratedTokens        int     `json:"generated_tokens"`
		DecodeMS               float64 `json:"decode_ms"`
		DecodeTokensPerSecond  float64 `json:"decode_tokens_per_second"`
	}
	response struct {
		ID      string       `json:"id"`
		Object  string       `json:"object"`
		Created int64        `json:"created"`
		Model   string       `json:"model"`
		Choices []chatChoice `json:"choices"`
		Usage   *usage       `json:"usage,omitempty"`
		Timings *timings     `json:"timings,omitempty"`
	}
	// streamChunk is response with usage always present (null until the
	// last chunk) when include_usage is set.
	streamChunk struct {
		ID      string       `json:"id"`
		Object  string       `json:"object"`
		Created int64        `json:"created"`
		Model   string       `json:"model"`
		Choices []chatChoice `json:"choices"`
		Usage   *usage       `json:"usage"`
		Timings *timings     `json:"timings,omitempty"`
	}
)

func timingsOf(r generate.Result) *timings {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return &timings{
		PromptTokens: r.PromptTokens, CachedTokens: r.CachedTokens, PrefillMS: ms(r.Prefill), PrefillTokensPerSecond: r.PrefillTokensPerSecond(),
		TimeToFirstTokenMS: ms(r.TimeToFirstToken), GeneratedTokens: r.GeneratedTokens, DecodeMS: ms(r.Decode),
		DecodeTokensPerSecond: r.DecodeTokensPerSecond(),
	}
}

// output routes generated text: raw for completions; for chat, through a
// chat.Parser into reasoning, content and DSML tool calls.
type output struct {
	parser          *chat.Parser // nil for completions
	raw             []byte       // everything generated, as text
	reasoning       []byte
	content         []byte
	reasoningTokens int
	inReasoning     bool
}

// run admits j, generates, and writes the response.
func (s *Server) run(w http.ResponseWriter, r *http.Request, j *job) {
	ctx := r.Context()
	if !s.acquire(ctx, w) {
		return
	}
	defer s.release()

	id, object := newID("cmpl-"), "text_completion"
	if j.chat {
		id, object = newID("chatcmpl-"), "chat.completion"
	}
	created := time.Now().Unix()
	out := &output{}
	if j.chat {
		out.parser = chat.NewParser(j.thinking)
		out.inReasoning = j.thinking
	}

	var st *sseWriter
	if j.p.stream {
		st = newSSE(w)
		if j.chat { // OpenAI's completion chunks keep "text_completion"
			object += ".chunk"
		}
		if j.chat {
			st.event(s.chunk(id, object, created, j, chatChoice{Delta: &chatMessage{Role: "assistant", Content: new(string)}}))
		}
		defer s.keepAlive(st)()
	}
	// deliver records final reasoning/content text and streams it.
	deliver := func(rs, cs string) error {
		out.content = append(out.content, cs...)
		out.reasoning = append(out.reasoning, rs...)
		if st == nil || rs == "" && cs == "" {
			return nil
		}
		c := chatChoice{}
		switch {
		case !j.chat:
			c.Text = &cs
		case rs != "" && cs != "":
			c.Delta = &chatMessage{ReasoningContent: &rs, Content: &cs}
		case rs != "":
			c.Delta = &chatMessage{ReasoningContent: &rs}
		default:
			c.Delta = &chatMessage{Content: &cs}
		}
		return st.event(s.chunk(id, object, created, j, c))
	}
	res, tc, err := s.generateJob(ctx, j, out, deliver)
	var calls []toolCallOut
	for k, c := range tc {
		t := toolCallOut{ID: newID("call_"), Type: "function"}
		t.Function.Name, t.Function.Arguments = c.Function.Name, c.Function.Arguments
		if st != nil {
			t.Index = &k
		}
		calls = append(calls, t)
	}
	if err != nil {
		e := s.failure(r, st, res, err)
		switch {
		case e == nil:
		case st != nil:
			st.event(struct {
				Error *apiError `json:"error"`
			}{e})
		default:
			writeError(w, e)
		}
		return
	}

	finish := string(res.Finish)
	if len(calls) > 0 {
		finish = "tool_calls"
	}
	s.m.generation(res, finish)
	s.log.Info("generation", "id", id, "prompt_tokens", res.PromptTokens, "cached_tokens", res.CachedTokens, "generated_tokens", res.GeneratedTokens,
		"finish", finish, "ttft", res.TimeToFirstToken, "prefill_tok_s", res.PrefillTokensPerSecond(),
		"decode_tok_s", res.DecodeTokensPerSecond())
	u := &usage{PromptTokens: res.PromptTokens, CompletionTokens: res.GeneratedTokens, TotalTokens: res.PromptTokens + res.GeneratedTokens}
	if s.cache != nil {
		u.PromptDetails = &struct {
			CachedTokens int `json:"cached_tokens"`
		}{res.CachedTokens}
	}
	if j.thinking {
		u.CompletionDetails = &struct {
			ReasoningTokens int `json:"reasoning_tokens"`
		}{out.reasoningTokens}
	}
	if st != nil {
		if len(calls) > 0 {
			st.event(s.chunk(id, object, created, j, chatChoice{Delta: &chatMessage{ToolCalls: calls}}))
		}
		c := chatChoice{FinishReason: &finish}
		if j.chat {
			c.Delta = &chatMessage{}
		} else {
			c.Text = new(string)
		}
		switch fc := s.chunk(id, object, created, j, c).(type) {
		case response:
			fc.Timings = timingsOf(res)
			st.event(fc)
		case streamChunk:
			fc.Timings = timingsOf(res)
			st.event(fc)
		}
		if j.p.includeUsage {
			st.event(streamChunk{ID: id, Object: object, Created: created, Model: j.model, Choices: []chatChoice{}, Usage: u})
		}
		st.done()
		return
	}
	c := chatChoice{FinishReason: &finish}
	cs := string(out.content)
	if j.chat {
		c.Message = &fullMessage{Role: "assistant", Content: &cs, ToolCalls: calls}
		if cs == "" && len(calls) > 0 {
			c.Message.Content = nil
		}
		if j.thinking {
			rs := string(out.reasoning)
			c.Message.ReasoningContent = &rs
		}
	} else {
		c.Text = &cs
	}
	writeJSON(w, response{ID: id, Object: object, Created: created, Model: j.model, Choices: []chatChoice{c}, Usage: u, Timings: timingsOf(res)})
}

// generateJob runs the admitted job j, collecting its text in out and
// calling deliver with each piece of reasoning and content as it becomes
// final (for a completion job, content only), and once more at the end
// (possibly with nothing). For a chat job it returns the tool calls the
// model's output declared. deliver's error ends the generation.
func (s *Server) generateJob(ctx context.Context, j *job, out *output, deliver func(reasoning, content string) error) (generate.Result, []chat.ToolCall, error) {
	opts := generate.Options{
		MaxTokens:   j.p.maxTokens,
		Sampler:     j.sampler,
		StopTokens:  s.b.StopTokens,
		StopStrings: j.p.stop,
		Detokenizer: s.b.Tokenizer.NewDetokenizer(),
		IgnoreEOS:   j.p.ignoreEOS,
		Cache:       s.cache,
		// A thinking chat's next prompt drops this turn's reasoning and
		// leaves this prompt at its last token (<think>).
		Snapshot: j.chat && j.thinking,
	}
	if j.system > 0 {
		opts.Checkpoints = []int{j.system}
	}
	if j.p.ignoreEOS {
		opts.StopTokens = nil // run to max_tokens (benchmarks)
	}
	res, err := generate.Generate(ctx, s.b.Model, j.prompt, opts, func(e generate.Event) error {
		out.raw = append(out.raw, e.Text...)
		if out.parser == nil {
			return deliver("", e.Text)
		}
		if out.inReasoning {
			if e.Token != generate.NoToken {
				out.reasoningTokens++
			}
			// The token that completes </think> still counts as reasoning.
			tail := out.raw[max(0, len(out.raw)-len(e.Text)-len(chat.ThinkEnd)):]
			if bytes.Contains(tail, []byte(chat.ThinkEnd)) {
				out.inReasoning = false
			}
		}
		d := out.parser.Add(e.Text)
		return deliver(d.Reasoning, d.Content)
	})
	if err != nil {
		return res, nil, err
	}
	if out.parser == nil {
		return res, nil, deliver("", "")
	}
	d, tc, perr := out.parser.Finish()
	if perr != nil && !errors.Is(perr, chat.ErrNoThinkEnd) {
		// A tool-call block that does not parse (or text after EOS):
		// nothing is dropped; whatever the parser withheld from the
		// content comes back as content.
		s.log.Warn("unparsed model output returned as content", "err", perr)
		d = chat.Delta{Reasoning: d.Reasoning, Content: d.Content + rawContentRest(out, j.thinking, d.Content)}
		tc = nil
	}
	return res, tc, deliver(d.Reasoning, d.Content)
}

// failure records a failed generation in the metrics and returns the error
// to answer with, or nil when there is nobody to answer (the client went
// away: its request was cancelled, or a write to its stream st failed).
func (s *Server) failure(r *http.Request, st *sseWriter, res generate.Result, err error) *apiError {
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		s.m.generation(res, string(generate.FinishCancelled))
		if r.Context().Err() != nil && s.base.Err() == nil {
			s.m.clientGone.Add(1)
			return nil
		}
		return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error",
			Message: "generation cancelled: server shutting down", Code: strp("shutting_down")}
	case st != nil && st.failed() != nil:
		s.m.generation(res, string(generate.FinishCancelled))
		s.m.clientGone.Add(1)
		return nil
	default:
		s.m.generation(res, "error")
		s.log.Error("generation failed", "err", err)
		return &apiError{Status: http.StatusInternalServerError, Type: "server_error",
			Message: "generation failed: " + err.Error(), Code: strp("generation_failed")}
	}
}

// rawContentRest is the generated text after the reasoning that has not been
// delivered as content yet (plus final, the parser's last content delta).
func rawContentRest(out *output, thinking bool, final string) string {
	raw := string(out.raw)
	if thinking {
		i := strings.Index(raw, chat.ThinkEnd)
		if i < 0 {
			return ""
		}
		raw = raw[i+len(chat.ThinkEnd):]
	}
	done := len(out.content) + len(final)
	if done > len(raw) {
		return ""
	}
	return raw[done:]
}

// chunk builds one streamed chunk; usage is null in every chunk when the
// client asked for usage (it comes in an extra final chunk), absent otherwise.
func (s *Server) chunk(id, object string, created int64, j *job, c chatChoice) any {
	if j.p.includeUsage {
		return streamChunk{ID: id, Object: object, Created: created, Model: j.model, Choices: []chatChoice{c}}
	}
	return response{ID: id, Object: object, Created: created, Model: j.model, Choices: []chatChoice{c}}
}

// sseWriter writes server-sent events. It is safe for concurrent use (the
// keep-alive ticker writes from its own goroutine). After the first write
// error it writes nothing more and reports that error from every call.
type sseWriter struct {
	mu   sync.Mutex
	w    http.ResponseWriter
	rc   *http.ResponseController
	err  error
	last time.Time // of the last write
}

func newSSE(w http.ResponseWriter) *sseWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	return &sseWriter{w: w, rc: http.NewResponseController(w), last: time.Now()}
}

// raw writes b and flushes.
func (s *sseWriter) raw(b []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	if _, err := s.w.Write(b); err != nil {
		s.err = err
		return err
	}
	if err := s.rc.Flush(); err != nil {
		s.err = err
	}
	s.last = time.Now()
	return s.err
}

// frame writes one event: an "event: name" line unless name is empty,
// then data.
func (s *sseWriter) frame(name string, data []byte) error {
	buf := make([]byte, 0, len(data)+len(name)+16)
	if name != "" {
		buf = append(buf, "event: "...)
		buf = append(buf, name...)
		buf = append(buf, '\n')
	}
	buf = append(buf, "data: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	return s.raw(buf)
}

func (s *sseWriter) write(data []byte) error { return s.frame("", data) }

// named writes v as an event with a name (event: name), as Anthropic's
// streams do.
func (s *sseWriter) named(name string, v any) error {
	b, err := marshal(v)
	if err != nil {
		return err
	}
	return s.frame(name, b)
}

func (s *sseWriter) event(v any) error { return s.named("", v) }

// marshal is json.Marshal without HTML escaping (text such as "<think>" stays
// readable), with no trailing newline.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// writeJSON writes v as a 200 JSON response.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// keepAlive starts st's keep-alive comments (Config.KeepAlive; none when
// it is 0) and returns the function that stops them.
func (s *Server) keepAlive(st *sseWriter) (stop func()) {
	if s.cfg.KeepAlive <= 0 {
		return func() {}
	}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() { st.keepAlive(s.cfg.KeepAlive, quit); close(done) }()
	return func() { close(quit); <-done }
}

func (s *sseWriter) done() { _ = s.write([]byte("[DONE]")) }

func (s *sseWriter) failed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// keepAlive writes an SSE comment whenever nothing was written for every,
// until stop is closed, so that proxies and clients do not time out during a
// long prefill.
func (s *sseWriter) keepAlive(every time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(every / 2)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			s.mu.Lock()
			idle := time.Since(s.last) >= every
			s.mu.Unlock()
			if idle && s.raw([]byte(": keep-alive\n\n")) != nil {
				return
			}
		}
	}
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, map[string]any{"object": "list", "data": []any{s.modelObject()}})
}

func (s *Server) handleModel(w http.ResponseWriter, r *http.Request) {
	if id := r.PathValue("id"); id != s.b.Name {
		writeError(w, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error",
			Message: fmt.Sprintf("model %q is not served here (this server serves %q)", id, s.b.Name),
			Param:   strp("model"), Code: strp("model_not_found")})
		return
	}
	writeJSON(w, s.modelObject())
}

func (s *Server) modelObject() map[string]any {
	return map[string]any{
		"id": s.b.Name, "object": "model", "created": s.created, "owned_by": "moxie",
		"context_length": s.b.Model.MaxContext(),
	}
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if s.draining.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, `{"status":"shutting_down"}`)
		return
	}
	fmt.Fprintln(w, `{"status":"ok"}`)
}
