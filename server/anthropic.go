package server

// The Anthropic Messages API (POST /v1/messages, POST
// /v1/messages/count_tokens) over the same generation as the OpenAI
// endpoints: Claude clients (the anthropic SDKs, tools built on them) can
// use a moxie server. Errors on these paths take Anthropic's shape
// ({"type": "error", "error": {"type", "message"}}); the API key may come
// as x-api-key.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"moxie/chat"
	"moxie/generate"
)

// messagesRequest is the body of POST /v1/messages (and of count_tokens,
// which ignores the generation fields).
type messagesRequest struct {
	Model         string          `json:"model"`
	MaxTokens     *int            `json:"max_tokens"`
	Messages      json.RawMessage `json:"messages"`
	System        json.RawMessage `json:"system"`
	StopSequences json.RawMessage `json:"stop_sequences"`
	Stream        *bool           `json:"stream"`
	Temperature   *float64        `json:"temperature"`
	TopP          *float64        `json:"top_p"`
	TopK          *int            `json:"top_k"`
	Tools         json.RawMessage `json:"tools"`
	ToolChoice    json.RawMessage `json:"tool_choice"`
	Thinking      json.RawMessage `json:"thinking"`
}

// anthropicBlock is one content block as sent: text, thinking,
// redacted_thinking, tool_use or tool_result (images and documents are
// refused).
type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text"`
	Thinking  *string         `json:"thinking"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
}

// anthropicBlocks reads a content field: a string (one text block) or an
// array of blocks.
func anthropicBlocks(raw json.RawMessage, field string) ([]anthropicBlock, *apiError) {
	if isNull(raw) {
		return nil, badRequest(field, "missing_required_parameter", "%s: required", field)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return []anthropicBlock{{Type: "text", Text: &s}}, nil
	}
	var bs []anthropicBlock
	if err := json.Unmarshal(raw, &bs); err != nil {
		return nil, badRequest(field, "invalid_type", "%s: expected a string or an array of content blocks, got %s", field, jsonKind(raw))
	}
	return bs, nil
}

// anthropicText joins the text blocks of a system prompt or tool result
// (a string, or an array of text blocks).
func anthropicText(raw json.RawMessage, field string) (string, *apiError) {
	if isNull(raw) {
		return "", nil
	}
	bs, e := anthropicBlocks(raw, field)
	if e != nil {
		return "", e
	}
	var b strings.Builder
	for i, x := range bs {
		if x.Type != "text" || x.Text == nil {
			return "", badRequest(fmt.Sprintf("%s[%d]", field, i), "unsupported_value", "%s[%d]: only text blocks are supported here, got %q", field, i, x.Type)
		}
		b.WriteString(*x.Text)
	}
	return b.String(), nil
}

// anthropicMessages turns system and messages into the chat format: a
// user turn's tool_result blocks become tool messages (before its text),
// an assistant turn's thinking, text and tool_use blocks its reasoning,
// content and tool calls.
func anthropicMessages(system, raw json.RawMessage) ([]chat.Message, *apiError) {
	var out []chat.Message
	sys, e := anthropicText(system, "system")
	if e != nil {
		return nil, e
	}
	if sys != "" {
		out = append(out, chat.Message{Role: "system", Content: sys})
	}
	if isNull(raw) {
		return nil, badRequest("messages", "missing_required_parameter", "messages: required")
	}
	var wire []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &wire); err != nil {
		return nil, badRequest("messages", "invalid_type", "messages: expected an array of {role, content} objects, got %s", jsonKind(raw))
	}
	if len(wire) == 0 {
		return nil, badRequest("messages", "invalid_value", "messages: must hold at least one message")
	}
	for i, m := range wire {
		field := fmt.Sprintf("messages[%d]", i)
		if m.Role != "user" && m.Role != "assistant" {
			return nil, badRequest(field+".role", "invalid_value", "%s.role: want \"user\" or \"assistant\", got %q (the system prompt goes in \"system\")", field, m.Role)
		}
		blocks, e := anthropicBlocks(m.Content, field+".content")
		if e != nil {
			return nil, e
		}
		msg := chat.Message{Role: m.Role}
		var text, reasoning strings.Builder
		for k, b := range blocks {
			bf := fmt.Sprintf("%s.content[%d]", field, k)
			switch {
			case b.Type == "text" && b.Text != nil:
				text.WriteString(*b.Text)
			case b.Type == "thinking" && m.Role == "assistant":
				if b.Thinking != nil {
					reasoning.WriteString(*b.Thinking)
				}
			case b.Type == "redacted_thinking" && m.Role == "assistant":
			case b.Type == "tool_use" && m.Role == "assistant":
				if b.Name == "" {
					return nil, badRequest(bf+".name", "missing_required_parameter", "%s.name: required", bf)
				}
				args := "{}"
				if !isNull(b.Input) {
					if t := strings.TrimSpace(string(b.Input)); !strings.HasPrefix(t, "{") {
						return nil, badRequest(bf+".input", "invalid_type", "%s.input: expected an object, got %s", bf, jsonKind(b.Input))
					}
					args = string(b.Input)
				}
				msg.ToolCalls = append(msg.ToolCalls, chat.ToolCall{ID: b.ID, Type: "function", Function: chat.FunctionCall{Name: b.Name, Arguments: args}})
			case b.Type == "tool_result" && m.Role == "user":
				if b.ToolUseID == "" {
					return nil, badRequest(bf+".tool_use_id", "missing_required_parameter", "%s.tool_use_id: required", bf)
				}
				c, e := anthropicText(b.Content, bf+".content")
				if e != nil {
					return nil, e
				}
				if b.IsError {
					c = "Error: " + c
				}
				out = append(out, chat.Message{Role: "tool", ToolCallID: b.ToolUseID, Content: c})
			case b.Type == "image" || b.Type == "document":
				return nil, badRequest(bf+".type", "unsupported_value", "%s: %s blocks are not supported (this model reads text)", bf, b.Type)
			default:
				return nil, badRequest(bf+".type", "invalid_value", "%s.type: %q is not a %s content block this server takes (text, %s)", bf, b.Type, m.Role,
					map[string]string{"user": "tool_result", "assistant": "thinking, redacted_thinking, tool_use"}[m.Role])
			}
		}
		msg.Content, msg.ReasoningContent = text.String(), reasoning.String()
		if m.Role == "user" && msg.Content == "" {
			continue // only tool results
		}
		out = append(out, msg)
	}
	return out, nil
}

// anthropicTools converts tools ({name, description, input_schema}) to the
// chat format; tool_choice may be {"type": "auto"} or {"type": "none"}.
func anthropicTools(raw, choice json.RawMessage) ([]chat.Tool, *apiError) {
	none := false
	if !isNull(choice) {
		var c struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(choice, &c); err != nil {
			return nil, badRequest("tool_choice", "invalid_type", "tool_choice: expected an object {\"type\": ...}, got %s", jsonKind(choice))
		}
		switch c.Type {
		case "auto":
		case "none":
			none = true
		default:
			return nil, badRequest("tool_choice.type", "unsupported_value", "tool_choice.type: only \"auto\" and \"none\" are supported, got %q", c.Type)
		}
	}
	if isNull(raw) || none {
		return nil, nil
	}
	var tools []struct {
		Type        string          `json:"type"`
		Name        string          `json:"name"`
		Description string          `json:"description"`
		InputSchema json.RawMessage `json:"input_schema"`
	}
	if err := json.Unmarshal(raw, &tools); err != nil {
		return nil, badRequest("tools", "invalid_type", "tools: expected an array of {name, description, input_schema} objects, got %s", jsonKind(raw))
	}
	out := make([]chat.Tool, len(tools))
	for k, t := range tools {
		f := fmt.Sprintf("tools[%d]", k)
		if t.Type != "" && t.Type != "custom" {
			return nil, badRequest(f+".type", "unsupported_value", "%s.type: server tools (%q) are not supported; declare a custom tool with name and input_schema", f, t.Type)
		}
		if t.Name == "" {
			return nil, badRequest(f+".name", "missing_required_parameter", "%s.name: required", f)
		}
		schema := t.InputSchema
		if isNull(schema) {
			return nil, badRequest(f+".input_schema", "missing_required_parameter", "%s.input_schema: required", f)
		}
		fn, err := marshal(struct {
			Name        string          `json:"name"`
			Description string          `json:"description,omitempty"`
			Parameters  json.RawMessage `json:"parameters"`
		}{t.Name, t.Description, schema})
		if err != nil {
			return nil, badRequest(f+".input_schema", "invalid_value", "%s.input_schema: %v", f, err)
		}
		out[k] = chat.Tool{Type: "function", Function: fn}
	}
	return out, nil
}

// anthropicThinking reads "thinking": {"type": "enabled", "budget_tokens":
// N} or {"type": "disabled"}; absent means the server's default. The
// budget is not enforced (max_tokens bounds reasoning and answer together).
func anthropicThinking(raw json.RawMessage, def bool) (bool, *apiError) {
	if isNull(raw) {
		return def, nil
	}
	var t struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(raw, &t); err != nil {
		return false, badRequest("thinking", "invalid_type", "thinking: expected {\"type\": \"enabled\"|\"disabled\"}, got %s", jsonKind(raw))
	}
	switch t.Type {
	case "enabled", "adaptive":
		return true, nil
	case "disabled":
		return false, nil
	}
	return false, badRequest("thinking.type", "invalid_value", "thinking.type: want \"enabled\" or \"disabled\", got %q", t.Type)
}

// messagesJob validates a Messages request; count (count_tokens) needs no
// max_tokens and no sampler.
func (s *Server) messagesJob(req *messagesRequest, count bool) (*job, *apiError) {
	if s.b.Chat == nil {
		return nil, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Message: "this server has no chat template"}
	}
	if e := s.checkModel(req.Model); e != nil {
		return nil, e
	}
	msgs, e := anthropicMessages(req.System, req.Messages)
	if e != nil {
		return nil, e
	}
	thinking, e := anthropicThinking(req.Thinking, s.cfg.DefaultThinking)
	if e != nil {
		return nil, e
	}
	tools, e := anthropicTools(req.Tools, req.ToolChoice)
	if e != nil {
		return nil, e
	}
	msgs = withTools(msgs, tools)
	copts := chat.Options{Thinking: thinking}
	prompt, err := s.b.Chat.Prompt(msgs, copts)
	if err != nil {
		return nil, badRequest("messages", "invalid_value", "messages: %v", err)
	}
	j := &job{chat: true, model: req.Model, prompt: prompt, thinking: thinking}
	if !count {
		j.system = s.systemPart(msgs, copts, prompt)
	}
	if count {
		return j, nil
	}
	if req.MaxTokens == nil {
		return nil, badRequest("max_tokens", "missing_required_parameter", "max_tokens: required")
	}
	cp := commonParams{MaxTokens: req.MaxTokens, Temperature: req.Temperature, TopP: req.TopP, TopK: req.TopK, Stream: req.Stream}
	p, e := cp.validate(nil)
	if e != nil {
		return nil, e
	}
	if p.stop, e = parseStop(req.StopSequences, "stop_sequences"); e != nil {
		return nil, e
	}
	j.p = p
	return s.finishJob(j, "messages", "max_tokens")
}

func (s *Server) handleMessages(w http.ResponseWriter, r *http.Request) {
	var req messagesRequest
	if e := decodeJSON(r.Body, &req); e != nil {
		writeError(w, e)
		return
	}
	j, e := s.messagesJob(&req, false)
	if e != nil {
		writeError(w, e)
		return
	}
	s.runMessages(w, r, j)
}

func (s *Server) handleCountTokens(w http.ResponseWriter, r *http.Request) {
	var req messagesRequest
	if e := decodeJSON(r.Body, &req); e != nil {
		writeError(w, e)
		return
	}
	j, e := s.messagesJob(&req, true)
	if e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, map[string]int{"input_tokens": len(j.prompt)})
}

// Wire types of Messages responses.
type (
	anthropicUsage struct {
		InputTokens              int `json:"input_tokens"`
		OutputTokens             int `json:"output_tokens"`
		CacheReadInputTokens     int `json:"cache_read_input_tokens"`
		CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	}
	// anthropicOut is a content block of a response.
	anthropicOut struct {
		Type      string          `json:"type"`
		Text      *string         `json:"text,omitempty"`
		Thinking  *string         `json:"thinking,omitempty"`
		Signature *string         `json:"signature,omitempty"`
		ID        string          `json:"id,omitempty"`
		Name      string          `json:"name,omitempty"`
		Input     json.RawMessage `json:"input,omitempty"`
	}
	anthropicMessage struct {
		ID           string         `json:"id"`
		Type         string         `json:"type"`
		Role         string         `json:"role"`
		Model        string         `json:"model"`
		Content      []anthropicOut `json:"content"`
		StopReason   *string        `json:"stop_reason"`
		StopSequence *string        `json:"stop_sequence"`
		Usage        anthropicUsage `json:"usage"`
		Timings      *timings       `json:"timings,omitempty"`
	}
)

// anthropicInput is a tool call's arguments as a tool_use block's input:
// the JSON object the model wrote, or {} with a warning when it is not one.
func (s *Server) anthropicInput(c chat.ToolCall) json.RawMessage {
	a := strings.TrimSpace(c.Function.Arguments)
	if json.Valid([]byte(a)) && strings.HasPrefix(a, "{") {
		return json.RawMessage(a)
	}
	s.log.Warn("tool call arguments are not a JSON object; sent as {}", "tool", c.Function.Name)
	return json.RawMessage("{}")
}

// anthropicStop maps how a generation ended to stop_reason and
// stop_sequence.
func anthropicStop(res generate.Result, calls int) (*string, *string) {
	reason := "end_turn"
	var seq *string
	switch {
	case calls > 0:
		reason = "tool_use"
	case res.StopString != "":
		reason, seq = "stop_sequence", &res.StopString
	case res.Finish == generate.FinishLength:
		reason = "max_tokens"
	}
	return &reason, seq
}

// anthropicStream tracks the content blocks of a streamed Messages
// response.
type anthropicStream struct {
	st   *sseWriter
	n    int    // blocks started
	open string // the type of the block in progress ("" none)
}

func (a *anthropicStream) send(name string, v any) error { return a.st.named(name, v) }

// start closes the block in progress and starts one (block is its
// content_block object).
func (a *anthropicStream) start(typ string, block any) error {
	if err := a.stop(); err != nil {
		return err
	}
	a.open = typ
	a.n++
	return a.send("content_block_start", map[string]any{"type": "content_block_start", "index": a.n - 1, "content_block": block})
}

// stop closes the block in progress, if any (a thinking block with an
// empty signature: nothing here signs reasoning).
func (a *anthropicStream) stop() error {
	if a.open == "" {
		return nil
	}
	if a.open == "thinking" {
		if err := a.delta(map[string]any{"type": "signature_delta", "signature": ""}); err != nil {
			return err
		}
	}
	a.open = ""
	return a.send("content_block_stop", map[string]any{"type": "content_block_stop", "index": a.n - 1})
}

func (a *anthropicStream) delta(d any) error {
	return a.send("content_block_delta", map[string]any{"type": "content_block_delta", "index": a.n - 1, "delta": d})
}

// text streams a piece of reasoning or answer into a block of its type.
func (a *anthropicStream) text(typ, s string) error {
	if s == "" {
		return nil
	}
	if a.open != typ {
		empty := ""
		b := anthropicOut{Type: typ, Text: &empty}
		if typ == "thinking" {
			b = anthropicOut{Type: typ, Thinking: &empty, Signature: &empty}
		}
		if err := a.start(typ, b); err != nil {
			return err
		}
	}
	if typ == "thinking" {
		return a.delta(map[string]string{"type": "thinking_delta", "thinking": s})
	}
	return a.delta(map[string]string{"type": "text_delta", "text": s})
}

// runMessages admits j, generates, and writes a Messages response.
func (s *Server) runMessages(w http.ResponseWriter, r *http.Request, j *job) {
	ctx := r.Context()
	if !s.acquire(ctx, w) {
		return
	}
	defer s.release()
	id := newID("msg_")
	out := &output{parser: chat.NewParser(j.thinking), inReasoning: j.thinking}
	var as *anthropicStream
	if j.p.stream {
		st := newSSE(w)
		as = &anthropicStream{st: st}
		as.send("message_start", map[string]any{"type": "message_start", "message": anthropicMessage{ID: id, Type: "message", Role: "assistant",
			Model: j.model, Content: []anthropicOut{}, Usage: anthropicUsage{InputTokens: len(j.prompt)}}})
		defer s.keepAlive(st)()
	}
	deliver := func(rs, cs string) error {
		out.content = append(out.content, cs...)
		out.reasoning = append(out.reasoning, rs...)
		if as == nil {
			return nil
		}
		if err := as.text("thinking", rs); err != nil {
			return err
		}
		return as.text("text", cs)
	}
	res, calls, err := s.generateJob(ctx, j, out, deliver)
	if err != nil {
		var st *sseWriter
		if as != nil {
			st = as.st
		}
		e := s.failure(r, st, res, err)
		switch {
		case e == nil:
		case as != nil:
			as.send("error", anthropicErrorBody(e))
		default:
			writeError(w, e)
		}
		return
	}
	reason, seq := anthropicStop(res, len(calls))
	s.m.generation(res, *reason)
	s.log.Info("generation", "id", id, "api", "messages", "prompt_tokens", res.PromptTokens, "cached_tokens", res.CachedTokens,
		"generated_tokens", res.GeneratedTokens, "finish", *reason, "ttft", res.TimeToFirstToken,
		"prefill_tok_s", res.PrefillTokensPerSecond(), "decode_tok_s", res.DecodeTokensPerSecond())
	u := anthropicUsage{InputTokens: res.PromptTokens - res.CachedTokens, OutputTokens: res.GeneratedTokens, CacheReadInputTokens: res.CachedTokens}
	if as != nil {
		for _, c := range calls {
			if err := as.start("tool_use", anthropicOut{Type: "tool_use", ID: newID("toolu_"), Name: c.Function.Name, Input: json.RawMessage("{}")}); err != nil {
				return
			}
			if err := as.delta(map[string]string{"type": "input_json_delta", "partial_json": string(s.anthropicInput(c))}); err != nil {
				return
			}
		}
		if as.stop() != nil {
			return
		}
		as.send("message_delta", map[string]any{"type": "message_delta",
			"delta": map[string]any{"stop_reason": reason, "stop_sequence": seq}, "usage": u, "timings": timingsOf(res)})
		as.send("message_stop", map[string]string{"type": "message_stop"})
		return
	}
	m := anthropicMessage{ID: id, Type: "message", Role: "assistant", Model: j.model, Content: []anthropicOut{},
		StopReason: reason, StopSequence: seq, Usage: u, Timings: timingsOf(res)}
	if j.thinking {
		rs, sig := string(out.reasoning), ""
		m.Content = append(m.Content, anthropicOut{Type: "thinking", Thinking: &rs, Signature: &sig})
	}
	if cs := string(out.content); cs != "" || len(calls) == 0 {
		m.Content = append(m.Content, anthropicOut{Type: "text", Text: &cs})
	}
	for _, c := range calls {
		m.Content = append(m.Content, anthropicOut{Type: "tool_use", ID: newID("toolu_"), Name: c.Function.Name, Input: s.anthropicInput(c)})
	}
	writeJSON(w, m)
}

// anthropicErrorBody is e in Anthropic's error shape; its type follows
// the status (Anthropic's names).
func anthropicErrorBody(e *apiError) any {
	typ := "api_error"
	switch {
	case e.Status == http.StatusBadRequest || e.Status == http.StatusMethodNotAllowed:
		typ = "invalid_request_error"
	case e.Status == http.StatusUnauthorized:
		typ = "authentication_error"
	case e.Status == http.StatusForbidden:
		typ = "permission_error"
	case e.Status == http.StatusNotFound:
		typ = "not_found_error"
	case e.Status == http.StatusRequestEntityTooLarge:
		typ = "request_too_large"
	case e.Status == http.StatusTooManyRequests:
		typ = "rate_limit_error"
	case e.Status == http.StatusServiceUnavailable:
		typ = "overloaded_error"
	}
	return map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": e.Message}}
}

// anthropicPath reports whether a request path is one of the Messages
// endpoints, whose errors take Anthropic's shape.
func anthropicPath(p string) bool {
	return p == "/v1/messages" || strings.HasPrefix(p, "/v1/messages/")
}
