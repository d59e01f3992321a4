package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"moxie/chat"
)

// MaxStopStrings bounds the number of stop strings in one request.
const MaxStopStrings = 16

// chatRequest is the body of POST /v1/chat/completions. Fields whose JSON type
// varies are kept raw and parsed by validate.
type chatRequest struct {
	Model    string          `json:"model"`
	Messages json.RawMessage `json:"messages"`
	commonParams
	ReasoningEffort *string         `json:"reasoning_effort"`
	Thinking        json.RawMessage `json:"thinking"`
	Tools           json.RawMessage `json:"tools"`
	ToolChoice      json.RawMessage `json:"tool_choice"`
	ResponseFormat  json.RawMessage `json:"response_format"`
	Logprobs        *bool           `json:"logprobs"`
	TopLogprobs     *int            `json:"top_logprobs"`
	MaxCompletion   *int            `json:"max_completion_tokens"`
}

// completionRequest is the body of POST /v1/completions.
type completionRequest struct {
	Model  string          `json:"model"`
	Prompt json.RawMessage `json:"prompt"`
	commonParams
	Echo     *bool           `json:"echo"`
	Suffix   *string         `json:"suffix"`
	Logprobs json.RawMessage `json:"logprobs"`
	BestOf   *int            `json:"best_of"`
}

// commonParams are the sampling and streaming fields both endpoints share.
type commonParams struct {
	MaxTokens         *int            `json:"max_tokens"`
	Temperature       *float64        `json:"temperature"`
	TopP              *float64        `json:"top_p"`
	TopK              *int            `json:"top_k"`
	MinP              *float64        `json:"min_p"`
	RepetitionPenalty *float64        `json:"repetition_penalty"`
	PresencePenalty   *float64        `json:"presence_penalty"`
	FrequencyPenalty  *float64        `json:"frequency_penalty"`
	Seed              *int64          `json:"seed"`
	IgnoreEOS         *bool           `json:"ignore_eos"`
	N                 *int            `json:"n"`
	Stop              json.RawMessage `json:"stop"`
	Stream            *bool           `json:"stream"`
	StreamOptions     *struct {
		IncludeUsage *bool `json:"include_usage"`
	} `json:"stream_options"`
}

// isNull reports whether raw is absent or JSON null.
func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

// jsonKind names the JSON type of raw for error messages.
func jsonKind(raw json.RawMessage) string {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 {
		return "nothing"
	}
	switch t[0] {
	case '"':
		return "a string"
	case '[':
		return "an array"
	case '{':
		return "an object"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}

// params is a validated request, common to both endpoints.
type params struct {
	maxTokens    int // 0: up to the context
	sampling     SamplingParams
	stop         []string
	stream       bool
	includeUsage bool
	ignoreEOS    bool
}

// validateCommon checks the shared fields. maxField names the field that
// maxTokens came from.
func (c *commonParams) validate(maxCompletion *int) (params, *apiError) {
	var p params
	if c.N != nil && *c.N != 1 {
		return p, badRequest("n", "unsupported_value", "n: only 1 choice per request is supported, got %d", *c.N)
	}
	switch {
	case maxCompletion != nil:
		if *maxCompletion < 1 {
			return p, badRequest("max_completion_tokens", "invalid_value", "max_completion_tokens: must be at least 1, got %d", *maxCompletion)
		}
		p.maxTokens = *maxCompletion
	case c.MaxTokens != nil:
		if *c.MaxTokens < 1 {
			return p, badRequest("max_tokens", "invalid_value", "max_tokens: must be at least 1, got %d", *c.MaxTokens)
		}
		p.maxTokens = *c.MaxTokens
	}
	s := SamplingParams{Temperature: 1, TopP: 1, RepetitionPenalty: 1}
	if v := c.Temperature; v != nil {
		if math.IsNaN(*v) || *v < 0 || *v > 2 {
			return p, badRequest("temperature", "invalid_value", "temperature: must be in [0, 2], got %g", *v)
		}
		s.Temperature = *v
	}
	if v := c.TopP; v != nil {
		if math.IsNaN(*v) || *v <= 0 || *v > 1 {
			return p, badRequest("top_p", "invalid_value", "top_p: must be in (0, 1], got %g", *v)
		}
		s.TopP = *v
	}
	if v := c.TopK; v != nil {
		if *v < 0 {
			return p, badRequest("top_k", "invalid_value", "top_k: must be >= 0 (0 disables it), got %d", *v)
		}
		s.TopK = *v
	}
	if v := c.MinP; v != nil {
		if math.IsNaN(*v) || *v < 0 || *v > 1 {
			return p, badRequest("min_p", "invalid_value", "min_p: must be in [0, 1], got %g", *v)
		}
		s.MinP = *v
	}
	if v := c.RepetitionPenalty; v != nil {
		if math.IsNaN(*v) || *v <= 0 || *v > 10 {
			return p, badRequest("repetition_penalty", "invalid_value", "repetition_penalty: must be in (0, 10], got %g", *v)
		}
		s.RepetitionPenalty = *v
	}
	// Presence and frequency penalties are not implemented: 0 (what most
	// clients send) is accepted, anything else refused rather than ignored.
	if v := c.PresencePenalty; v != nil && *v != 0 {
		return p, badRequest("presence_penalty", "unsupported_value", "presence_penalty: not supported (only 0); use repetition_penalty")
	}
	if v := c.FrequencyPenalty; v != nil && *v != 0 {
		return p, badRequest("frequency_penalty", "unsupported_value", "frequency_penalty: not supported (only 0); use repetition_penalty")
	}
	if c.Seed != nil {
		s.Seed, s.Seeded = *c.Seed, true
	}
	p.sampling = s
	stop, err := parseStop(c.Stop, "stop")
	if err != nil {
		return p, err
	}
	p.stop = stop
	p.ignoreEOS = c.IgnoreEOS != nil && *c.IgnoreEOS
	p.stream = c.Stream != nil && *c.Stream
	if c.StreamOptions != nil {
		if !p.stream {
			return p, badRequest("stream_options", "invalid_value", "stream_options: only allowed when stream is true")
		}
		p.includeUsage = c.StreamOptions.IncludeUsage != nil && *c.StreamOptions.IncludeUsage
	}
	return p, nil
}

// parseStop reads the stop strings of field (stop, or stop_sequences on
// the Messages API): null, a string, or an array of strings.
func parseStop(raw json.RawMessage, field string) ([]string, *apiError) {
	if isNull(raw) {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		if one == "" {
			return nil, badRequest(field, "invalid_value", "%s: must not be an empty string", field)
		}
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, badRequest(field, "invalid_type", "%s: expected a string or an array of strings, got %s", field, jsonKind(raw))
	}
	if len(many) > MaxStopStrings {
		return nil, badRequest(field, "invalid_value", "%s: at most %d stop strings, got %d", field, MaxStopStrings, len(many))
	}
	for i, s := range many {
		if s == "" {
			return nil, badRequest(field, "invalid_value", "%s[%d]: must not be an empty string", field, i)
		}
	}
	return many, nil
}

// wireMessage is one element of "messages" as sent.
type wireMessage struct {
	Role             *string         `json:"role"`
	Content          json.RawMessage `json:"content"`
	ReasoningContent *string         `json:"reasoning_content"`
	Name             *string         `json:"name"`
	ToolCalls        json.RawMessage `json:"tool_calls"`
	ToolCallID       *string         `json:"tool_call_id"`
}

// parseMessages validates "messages": a non-empty array of objects with a
// known role and text content (a string or an array of text parts);
// assistant messages may carry tool_calls, tool messages answer them.
func parseMessages(raw json.RawMessage) ([]chat.Message, *apiError) {
	if isNull(raw) {
		return nil, badRequest("messages", "missing_required_parameter", "messages: required")
	}
	var wire []json.RawMessage
	if err := json.Unmarshal(raw, &wire); err != nil {
		return nil, badRequest("messages", "invalid_type", "messages: expected an array, got %s", jsonKind(raw))
	}
	if len(wire) == 0 {
		return nil, badRequest("messages", "invalid_value", "messages: must hold at least one message")
	}
	out := make([]chat.Message, 0, len(wire))
	for i, w := range wire {
		field := fmt.Sprintf("messages[%d]", i)
		var m wireMessage
		if err := json.Unmarshal(w, &m); err != nil {
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) && te.Field != "" {
				return nil, badRequest(field+"."+te.Field, "invalid_type", "%s.%s: expected %s, got %s", field, te.Field, jsonTypeName(te.Type.String()), te.Value)
			}
			return nil, badRequest(field, "invalid_type", "%s: expected an object with role and content, got %s", field, jsonKind(w))
		}
		if m.Role == nil {
			return nil, badRequest(field+".role", "missing_required_parameter", "%s.role: required", field)
		}
		role := *m.Role
		switch role {
		case "system", "developer", "user", "assistant", "tool":
		case "function":
			return nil, badRequest(field+".role", "unsupported_value", "%s.role: the legacy \"function\" role is not supported; use \"tool\"", field)
		default:
			return nil, badRequest(field+".role", "invalid_value", "%s.role: unknown role %q (want system, developer, user, assistant or tool)", field, role)
		}
		msg := chat.Message{Role: role}
		if !isNull(m.ToolCalls) {
			if role != "assistant" {
				return nil, badRequest(field+".tool_calls", "invalid_value", "%s.tool_calls: only assistant messages carry tool calls", field)
			}
			calls, e := parseToolCalls(m.ToolCalls, field+".tool_calls")
			if e != nil {
				return nil, e
			}
			msg.ToolCalls = calls
		}
		content, e := parseContent(m.Content, field+".content", role == "assistant")
		if e != nil {
			return nil, e
		}
		msg.Content = content
		if m.ReasoningContent != nil {
			msg.ReasoningContent = *m.ReasoningContent
		}
		if m.ToolCallID != nil {
			if role != "tool" {
				return nil, badRequest(field+".tool_call_id", "invalid_value", "%s.tool_call_id: only tool messages answer tool calls", field)
			}
			msg.ToolCallID = *m.ToolCallID
		}
		out = append(out, msg)
	}
	return out, nil
}

// parseToolCalls reads an assistant message's tool_calls.
func parseToolCalls(raw json.RawMessage, field string) ([]chat.ToolCall, *apiError) {
	var calls []struct {
		ID       *string `json:"id"`
		Type     *string `json:"type"`
		Function *struct {
			Name      *string `json:"name"`
			Arguments *string `json:"arguments"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &calls); err != nil {
		return nil, badRequest(field, "invalid_type", "%s: expected an array of {id, type, function: {name, arguments}} objects", field)
	}
	out := make([]chat.ToolCall, len(calls))
	for k, c := range calls {
		f := fmt.Sprintf("%s[%d]", field, k)
		if c.Type != nil && *c.Type != "function" {
			return nil, badRequest(f+".type", "invalid_value", "%s.type: only \"function\" is supported, got %q", f, *c.Type)
		}
		if c.Function == nil || c.Function.Name == nil || *c.Function.Name == "" {
			return nil, badRequest(f+".function.name", "missing_required_parameter", "%s.function.name: required", f)
		}
		args := "{}"
		if c.Function.Arguments != nil {
			args = *c.Function.Arguments
		}
		out[k] = chat.ToolCall{Type: "function", Function: chat.FunctionCall{Name: *c.Function.Name, Arguments: args}}
		if c.ID != nil {
			out[k].ID = *c.ID
		}
	}
	return out, nil
}

// parseTools validates "tools" and "tool_choice": tools is an array of
// {"type": "function", "function": {"name", ...}}; tool_choice may be
// "auto" (the default) or "none" (the tools are not shown to the model).
func parseTools(raw, choice json.RawMessage) ([]chat.Tool, *apiError) {
	none := false
	if !isNull(choice) {
		var c string
		if err := json.Unmarshal(choice, &c); err != nil {
			return nil, badRequest("tool_choice", "unsupported_value", "tool_choice: only \"auto\" and \"none\" are supported, got %s", jsonKind(choice))
		}
		switch c {
		case "auto":
		case "none":
			none = true
		default:
			return nil, badRequest("tool_choice", "unsupported_value", "tool_choice: only \"auto\" and \"none\" are supported, got %q", c)
		}
	}
	if isNull(raw) {
		return nil, nil
	}
	var tools []struct {
		Type     *string         `json:"type"`
		Function json.RawMessage `json:"function"`
	}
	if err := json.Unmarshal(raw, &tools); err != nil {
		return nil, badRequest("tools", "invalid_type", "tools: expected an array of {type: \"function\", function: {...}} objects, got %s", jsonKind(raw))
	}
	out := make([]chat.Tool, len(tools))
	for k, t := range tools {
		f := fmt.Sprintf("tools[%d]", k)
		if t.Type == nil || *t.Type != "function" {
			return nil, badRequest(f+".type", "invalid_value", "%s.type: must be \"function\"", f)
		}
		var fn struct {
			Name *string `json:"name"`
		}
		if err := json.Unmarshal(t.Function, &fn); err != nil || fn.Name == nil || *fn.Name == "" {
			return nil, badRequest(f+".function.name", "missing_required_parameter", "%s.function: an object with a non-empty name is required", f)
		}
		out[k] = chat.Tool{Type: "function", Function: t.Function}
	}
	if none {
		return nil, nil
	}
	return out, nil
}

// withTools declares tools on the first system message, adding an empty one
// at the start when there is none (the DeepSeek-V4 format describes tools in
// the system prompt).
func withTools(msgs []chat.Message, tools []chat.Tool) []chat.Message {
	if len(tools) == 0 {
		return msgs
	}
	for i := range msgs {
		if msgs[i].Role == "system" {
			msgs[i].Tools = tools
			return msgs
		}
	}
	return append([]chat.Message{{Role: "system", Tools: tools}}, msgs...)
}

// parseContent accepts a string or an array of {"type":"text","text":...}
// parts (concatenated). Assistant messages may have null content.
func parseContent(raw json.RawMessage, field string, nullOK bool) (string, *apiError) {
	if isNull(raw) {
		if nullOK {
			return "", nil
		}
		return "", badRequest(field, "missing_required_parameter", "%s: required", field)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type *string `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", badRequest(field, "invalid_type", "%s: expected a string or an array of text parts, got %s", field, jsonKind(raw))
	}
	var b bytes.Buffer
	for i, p := range parts {
		pf := fmt.Sprintf("%s[%d]", field, i)
		if p.Type == nil || *p.Type != "text" {
			t := "nothing"
			if p.Type != nil {
				t = fmt.Sprintf("%q", *p.Type)
			}
			return "", badRequest(pf+".type", "unsupported_value", "%s.type: only \"text\" parts are supported, got %s", pf, t)
		}
		if p.Text == nil {
			return "", badRequest(pf+".text", "missing_required_parameter", "%s.text: required", pf)
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

// parseThinking decides the thinking mode of a chat request. Precedence:
// "thinking" ({"type": "enabled"|"disabled"} or a boolean), then
// "reasoning_effort" ("none"/"minimal" off; "low"/"medium"/"high"/"max" on),
// then the server default.
func parseThinking(raw json.RawMessage, effort *string, def bool) (bool, *apiError) {
	on := def
	if effort != nil {
		switch *effort {
		case "none", "minimal":
			on = false
		case "low", "medium", "high", "max":
			on = true
		default:
			return false, badRequest("reasoning_effort", "invalid_value", "reasoning_effort: want none, minimal, low, medium, high or max, got %q", *effort)
		}
	}
	if isNull(raw) {
		return on, nil
	}
	var b bool
	if err := json.Unmarshal(raw, &b); err == nil {
		return b, nil
	}
	var obj struct {
		Type *string `json:"type"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Type == nil {
		return false, badRequest("thinking", "invalid_type", "thinking: expected {\"type\": \"enabled\"|\"disabled\"} or a boolean, got %s", jsonKind(raw))
	}
	switch *obj.Type {
	case "enabled":
		return true, nil
	case "disabled":
		return false, nil
	default:
		return false, badRequest("thinking.type", "invalid_value", "thinking.type: want \"enabled\" or \"disabled\", got %q", *obj.Type)
	}
}

// parsePrompt accepts a string or an array holding exactly one string.
func parsePrompt(raw json.RawMessage) (string, *apiError) {
	if isNull(raw) {
		return "", badRequest("prompt", "missing_required_parameter", "prompt: required")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return "", badRequest("prompt", "invalid_type", "prompt: expected a string, got %s", jsonKind(raw))
	}
	if len(many) != 1 {
		return "", badRequest("prompt", "unsupported_value", "prompt: exactly one prompt per request is supported, got %d", len(many))
	}
	return many[0], nil
}
