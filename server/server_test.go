package server

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// chatResp is the subset of a chat.completion the tests read.
type chatResp struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Created int64  `json:"created"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Role             string  `json:"role"`
			Content          *string `json:"content"`
			ReasoningContent *string `json:"reasoning_content"`
		} `json:"message"`
		Delta struct {
			Role             *string `json:"role"`
			Content          *string `json:"content"`
			ReasoningContent *string `json:"reasoning_content"`
		} `json:"delta"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
		Details          *struct {
			ReasoningTokens int `json:"reasoning_tokens"`
		} `json:"completion_tokens_details"`
	} `json:"usage"`
}

// userPromptLen is the prompt length of one user message of n ASCII bytes in
// the DeepSeek-V4 format with the tiny tokenizer (one token per byte, the
// markers one token each): BOS, <｜User｜>, n bytes, <｜Assistant｜>, then
// </think> or <think>.
func userPromptLen(n int) int { return 4 + n }

func TestChatNonStreaming(t *testing.T) {
	cases := []struct {
		name      string
		body      string
		answer    string
		noEOS     bool
		content   string
		reasoning *string
		finish    string
		ptoks     int
		ctoks     int
		rtoks     int
	}{
		{
			name:    "plain",
			body:    `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}]}`,
			content: "Hello, world!", finish: "stop", ptoks: userPromptLen(2), ctoks: 14, // 13 bytes + EOS
		},
		{
			name:    "system and history, content parts",
			body:    `{"model":"moxie-test","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"A"},{"type":"text","text":"B"}]},{"role":"assistant","content":"C"},{"role":"user","content":"D"}]}`,
			content: "Hello, world!", finish: "stop",
			// BOS + 9 + (User + 2) + (Assistant + </think> + 1 + EOS) + (User + 1) + Assistant + </think>
			ptoks: 1 + 9 + 3 + 4 + 2 + 2, ctoks: 14,
		},
		{
			name:    "stop string",
			body:    `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}],"stop":"world"}`,
			content: "Hello, ", finish: "stop", ptoks: userPromptLen(2), ctoks: 12, // "Hello, world" sampled, the "d" completes the stop
		},
		{
			name:    "stop array, first to complete wins",
			body:    `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}],"stop":["zzz","lo,"]}`,
			content: "Hel", finish: "stop", ptoks: userPromptLen(2), ctoks: 6,
		},
		{
			name:    "max_tokens",
			body:    `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}],"max_tokens":4}`,
			content: "Hell", finish: "length", ptoks: userPromptLen(2), ctoks: 4,
		},
		{
			name:    "max_completion_tokens wins over max_tokens",
			body:    `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}],"max_tokens":4,"max_completion_tokens":2}`,
			content: "He", finish: "length", ptoks: userPromptLen(2), ctoks: 2,
		},
		{
			name:    "ignore_eos runs to max_tokens",
			body:    `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}],"ignore_eos":true,"max_tokens":20}`,
			answer:  "ab", // then EOS, repeated: its text is the EOS marker
			content: "ab" + strings.Repeat("<｜end▁of▁sentence｜>", 18), finish: "length", ptoks: userPromptLen(2), ctoks: 20,
		},
		{
			name:   "runs to the end of the context",
			body:   `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}]}`,
			answer: "ab", noEOS: true,
			content: "ab" + strings.Repeat("b", 256-userPromptLen(2)-2), finish: "length", ptoks: userPromptLen(2), ctoks: 256 - userPromptLen(2),
		},
		{
			name:    "thinking via thinking field",
			body:    `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}],"thinking":{"type":"enabled"}}`,
			content: "Hello, world!", reasoning: ptr("Let me think."), finish: "stop",
			ptoks: userPromptLen(2), ctoks: 13 + 1 + 14, rtoks: 14, // reasoning and </think>
		},
		{
			name:    "thinking via reasoning_effort",
			body:    `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}],"reasoning_effort":"high"}`,
			content: "Hello, world!", reasoning: ptr("Let me think."), finish: "stop",
			ptoks: userPromptLen(2), ctoks: 28, rtoks: 14,
		},
		{
			name:    "thinking field wins over reasoning_effort",
			body:    `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}],"reasoning_effort":"high","thinking":false}`,
			content: "Hello, world!", finish: "stop", ptoks: userPromptLen(2), ctoks: 14,
		},
		{
			name:    "thinking cut by max_tokens stays reasoning",
			body:    `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}],"thinking":true,"max_tokens":5}`,
			content: "", reasoning: ptr("Let m"), finish: "length",
			ptoks: userPromptLen(2), ctoks: 5, rtoks: 5,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fake := newFake()
			if tc.answer != "" {
				fake.answer = tc.answer
			}
			fake.noEOS = tc.noEOS
			_, ts := testServer(t, Config{}, fake)
			resp, body := post(t, ts.URL+"/v1/chat/completions", tc.body)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("content type %q", ct)
			}
			var r chatResp
			if err := json.Unmarshal([]byte(body), &r); err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(r.ID, "chatcmpl-") || r.Object != "chat.completion" || r.Model != "moxie-test" || r.Created == 0 {
				t.Errorf("envelope: %s", body)
			}
			if len(r.Choices) != 1 {
				t.Fatalf("choices: %s", body)
			}
			c := r.Choices[0]
			if c.Message.Role != "assistant" || c.Message.Content == nil || *c.Message.Content != tc.content {
				t.Errorf("message = %s, want content %q", body, tc.content)
			}
			if !reflect.DeepEqual(c.Message.ReasoningContent, tc.reasoning) {
				t.Errorf("reasoning_content = %v, want %v", deref(c.Message.ReasoningContent), deref(tc.reasoning))
			}
			if c.FinishReason == nil || *c.FinishReason != tc.finish {
				t.Errorf("finish_reason = %v, want %q", deref(c.FinishReason), tc.finish)
			}
			u := r.Usage
			if u == nil || u.PromptTokens != tc.ptoks || u.CompletionTokens != tc.ctoks || u.TotalTokens != tc.ptoks+tc.ctoks {
				t.Errorf("usage = %+v, want %d + %d", u, tc.ptoks, tc.ctoks)
			}
			if tc.reasoning != nil && (u.Details == nil || u.Details.ReasoningTokens != tc.rtoks) {
				t.Errorf("reasoning tokens = %+v, want %d", u.Details, tc.rtoks)
			}
		})
	}
}

func ptr(s string) *string { return &s }

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%q", *s)
}

// sseEvents reads an SSE body line by line, checking the framing: every
// event is exactly one "data: " line (or one ": comment" line) followed by an
// empty line, and the last is [DONE]. It returns the JSON payloads before
// [DONE].
func sseEvents(t *testing.T, body string) []string {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(body))
	var out []string
	done := false
	for sc.Scan() {
		line := sc.Text()
		if done {
			t.Fatalf("data after [DONE]: %q", line)
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok && !strings.HasPrefix(line, ": ") {
			t.Fatalf("line %q is neither a data line nor a comment", line)
		}
		if !sc.Scan() || sc.Text() != "" {
			t.Fatalf("event %q not followed by an empty line", line)
		}
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		if !json.Valid([]byte(data)) {
			t.Fatalf("event is not JSON: %q", data)
		}
		out = append(out, data)
	}
	if !done {
		t.Fatalf("stream did not end with data: [DONE]:\n%s", body)
	}
	return out
}

func TestChatStreaming(t *testing.T) {
	cases := []struct {
		name         string
		body         string
		content      string
		reasoning    string
		finish       string
		includeUsage bool
		ctoks        int
	}{
		{name: "plain", body: `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}],"stream":true}`,
			content: "Hello, world!", finish: "stop"},
		{name: "usage", body: `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}],"stream":true,"stream_options":{"include_usage":true}}`,
			content: "Hello, world!", finish: "stop", includeUsage: true, ctoks: 14},
		{name: "thinking", body: `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}],"stream":true,"reasoning_effort":"max"}`,
			content: "Hello, world!", reasoning: "Let me think.", finish: "stop"},
		{name: "stop string and limit", body: `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}],"stream":true,"stop":["xyz"],"max_tokens":3,"stream_options":{"include_usage":true}}`,
			content: "Hel", finish: "length", includeUsage: true, ctoks: 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, ts := testServer(t, Config{}, newFake())
			resp, body := post(t, ts.URL+"/v1/chat/completions", tc.body)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
				t.Errorf("content type %q", ct)
			}
			events := sseEvents(t, body)
			var content, reasoning strings.Builder
			var id string
			finishes := 0
			for i, ev := range events {
				var c chatResp
				if err := json.Unmarshal([]byte(ev), &c); err != nil {
					t.Fatal(err)
				}
				var raw map[string]json.RawMessage
				_ = json.Unmarshal([]byte(ev), &raw)
				_, hasUsage := raw["usage"]
				if tc.includeUsage != hasUsage {
					t.Errorf("event %d: usage key present=%v, want %v: %s", i, hasUsage, tc.includeUsage, ev)
				}
				if c.Object != "chat.completion.chunk" || c.Model != "moxie-test" {
					t.Errorf("event %d envelope: %s", i, ev)
				}
				if id == "" {
					id = c.ID
				} else if c.ID != id {
					t.Errorf("event %d id %q != %q", i, c.ID, id)
				}
				if tc.includeUsage && i == len(events)-1 {
					if len(c.Choices) != 0 || c.Usage == nil {
						t.Fatalf("last event should be the usage chunk: %s", ev)
					}
					if c.Usage.PromptTokens != userPromptLen(2) || c.Usage.CompletionTokens != tc.ctoks {
						t.Errorf("usage %+v, want %d + %d", c.Usage, userPromptLen(2), tc.ctoks)
					}
					continue
				}
				if c.Usage != nil {
					t.Errorf("event %d: usage before the end: %s", i, ev)
				}
				if len(c.Choices) != 1 {
					t.Fatalf("event %d: %s", i, ev)
				}
				ch := c.Choices[0]
				if i == 0 {
					if ch.Delta.Role == nil || *ch.Delta.Role != "assistant" {
						t.Errorf("first event has no assistant role: %s", ev)
					}
				} else if ch.Delta.Role != nil {
					t.Errorf("event %d repeats the role: %s", i, ev)
				}
				if ch.Delta.Content != nil {
					content.WriteString(*ch.Delta.Content)
				}
				if ch.Delta.ReasoningContent != nil {
					if content.Len() > 0 {
						t.Errorf("reasoning after content: %s", ev)
					}
					reasoning.WriteString(*ch.Delta.ReasoningContent)
				}
				if ch.FinishReason != nil {
					finishes++
					if *ch.FinishReason != tc.finish {
						t.Errorf("finish %q, want %q", *ch.FinishReason, tc.finish)
					}
				} else if finishes > 0 {
					t.Errorf("event after the finish event: %s", ev)
				}
			}
			if finishes != 1 {
				t.Errorf("%d finish events, want 1", finishes)
			}
			if content.String() != tc.content || reasoning.String() != tc.reasoning {
				t.Errorf("streamed content %q reasoning %q, want %q %q", content.String(), reasoning.String(), tc.content, tc.reasoning)
			}
			// At least one delta per generated character of content: the
			// stream is incremental, not one final blob.
			if len(events) < len(tc.content) {
				t.Errorf("only %d events for %q", len(events), tc.content)
			}
		})
	}
}

func TestCompletions(t *testing.T) {
	_, ts := testServer(t, Config{}, newFake())
	t.Run("non-streaming", func(t *testing.T) {
		resp, body := post(t, ts.URL+"/v1/completions", `{"model":"moxie-test","prompt":"Once upon","max_tokens":5}`)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		var r chatResp
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			t.Fatal(err)
		}
		if r.Object != "text_completion" || !strings.HasPrefix(r.ID, "cmpl-") || len(r.Choices) != 1 {
			t.Fatalf("envelope: %s", body)
		}
		if c := r.Choices[0]; c.Text == nil || *c.Text != "Hello" || deref(c.FinishReason) != `"length"` {
			t.Errorf("choice: %s", body)
		}
		// "Once upon" is 9 bytes, one token each in the tiny vocabulary.
		if r.Usage == nil || r.Usage.PromptTokens != 9 || r.Usage.CompletionTokens != 5 || r.Usage.TotalTokens != 14 {
			t.Errorf("usage: %s", body)
		}
	})
	t.Run("prompt with control tokens", func(t *testing.T) {
		// The raw prompt is the caller's template: <｜User｜> is one token.
		_, body := post(t, ts.URL+"/v1/completions", `{"model":"moxie-test","prompt":["<｜User｜>x"],"max_tokens":1}`)
		var r chatResp
		_ = json.Unmarshal([]byte(body), &r)
		if r.Usage == nil || r.Usage.PromptTokens != 2 {
			t.Errorf("usage: %s", body)
		}
	})
	t.Run("streaming", func(t *testing.T) {
		resp, body := post(t, ts.URL+"/v1/completions", `{"model":"moxie-test","prompt":"Once","stream":true,"stop":"wor","stream_options":{"include_usage":true}}`)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		events := sseEvents(t, body)
		var text strings.Builder
		for i, ev := range events {
			var c chatResp
			_ = json.Unmarshal([]byte(ev), &c)
			if c.Object != "text_completion" {
				t.Errorf("object %q", c.Object)
			}
			if i == len(events)-1 {
				if c.Usage == nil || c.Usage.PromptTokens != 4 || len(c.Choices) != 0 {
					t.Errorf("usage chunk: %s", ev)
				}
				continue
			}
			if c.Choices[0].Text != nil {
				text.WriteString(*c.Choices[0].Text)
			}
			if i == len(events)-2 && deref(c.Choices[0].FinishReason) != `"stop"` {
				t.Errorf("finish chunk: %s", ev)
			}
		}
		if text.String() != "Hello, " {
			t.Errorf("text %q", text.String())
		}
	})
}

func TestModelsHealth(t *testing.T) {
	_, ts := testServer(t, Config{}, newFake())
	resp, body := get(t, ts.URL+"/v1/models")
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID, Object, OwnedBy string
			ContextLength       int `json:"context_length"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil || resp.StatusCode != 200 {
		t.Fatalf("%d %s %v", resp.StatusCode, body, err)
	}
	if list.Object != "list" || len(list.Data) != 1 || list.Data[0].ID != "moxie-test" || list.Data[0].Object != "model" || list.Data[0].ContextLength != 256 {
		t.Errorf("models: %s", body)
	}
	if resp, body := get(t, ts.URL+"/v1/models/moxie-test"); resp.StatusCode != 200 || !strings.Contains(body, `"id":"moxie-test"`) {
		t.Errorf("model: %d %s", resp.StatusCode, body)
	}
	if resp, body := get(t, ts.URL+"/v1/models/gpt-4"); resp.StatusCode != 404 || !strings.Contains(body, "model_not_found") {
		t.Errorf("unknown model: %d %s", resp.StatusCode, body)
	}
	if resp, body := get(t, ts.URL+"/health"); resp.StatusCode != 200 || strings.TrimSpace(body) != `{"status":"ok"}` {
		t.Errorf("health: %d %s", resp.StatusCode, body)
	}
}

// apiErr is the error envelope.
type apiErr struct {
	Error *struct {
		Message *string `json:"message"`
		Type    *string `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// checkAPIError asserts an OpenAI-style error body with the given param and
// code, and a message mentioning want.
func checkAPIError(t *testing.T, body string, param, code, want string) {
	t.Helper()
	var e apiErr
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil || e.Error == nil || e.Error.Message == nil || e.Error.Type == nil {
		t.Fatalf("not an OpenAI error object: %s (%v)", body, err)
	}
	var raw map[string]map[string]json.RawMessage
	_ = json.Unmarshal([]byte(body), &raw)
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := raw["error"][k]; !ok {
			t.Errorf("error object lacks %q: %s", k, body)
		}
	}
	if got := deref(e.Error.Param); param != "" && got != fmt.Sprintf("%q", param) || param == "" && e.Error.Param != nil {
		t.Errorf("param = %s, want %q: %s", got, param, body)
	}
	if deref(e.Error.Code) != fmt.Sprintf("%q", code) {
		t.Errorf("code = %s, want %q: %s", deref(e.Error.Code), code, body)
	}
	if !strings.Contains(*e.Error.Message, want) {
		t.Errorf("message %q does not mention %q", *e.Error.Message, want)
	}
}

func TestBadRequests(t *testing.T) {
	const chat = "/v1/chat/completions"
	const comp = "/v1/completions"
	const hi = `"messages":[{"role":"user","content":"Hi"}]`
	cases := []struct {
		name, path, body string
		status           int
		param, code      string
		mention          string
	}{
		{"malformed JSON", chat, `{"model":"moxie-test",`, 400, "", "invalid_json", "JSON"},
		{"syntax error", chat, `{"model": moxie}`, 400, "", "invalid_json", "malformed JSON"},
		{"empty body", chat, ``, 400, "", "invalid_json", "empty request body"},
		{"not an object", chat, `[1,2]`, 400, "", "invalid_json", "JSON object"},
		{"two values", chat, `{"model":"moxie-test",` + hi + `} {}`, 400, "", "invalid_json", "more than one"},
		{"model wrong type", chat, `{"model":5,` + hi + `}`, 400, "model", "invalid_type", "expected a string"},
		{"temperature wrong type", chat, `{"model":"moxie-test",` + hi + `,"temperature":"hot"}`, 400, "temperature", "invalid_type", "expected a number"},
		{"max_tokens wrong type", chat, `{"model":"moxie-test",` + hi + `,"max_tokens":1.5}`, 400, "max_tokens", "invalid_type", "integer"},
		{"stream wrong type", chat, `{"model":"moxie-test",` + hi + `,"stream":"yes"}`, 400, "stream", "invalid_type", "boolean"},
		{"missing model", chat, `{` + hi + `}`, 400, "model", "missing_required_parameter", "model"},
		{"unknown model", chat, `{"model":"gpt-4o",` + hi + `}`, 404, "model", "model_not_found", "gpt-4o"},
		{"missing messages", chat, `{"model":"moxie-test"}`, 400, "messages", "missing_required_parameter", "messages"},
		{"messages not an array", chat, `{"model":"moxie-test","messages":"Hi"}`, 400, "messages", "invalid_type", "array"},
		{"empty messages", chat, `{"model":"moxie-test","messages":[]}`, 400, "messages", "invalid_value", "at least one"},
		{"message not an object", chat, `{"model":"moxie-test","messages":[3]}`, 400, "messages[0]", "invalid_type", "object"},
		{"missing role", chat, `{"model":"moxie-test","messages":[{"content":"Hi"}]}`, 400, "messages[0].role", "missing_required_parameter", "role"},
		{"bad role", chat, `{"model":"moxie-test","messages":[{"role":"user","content":"a"},{"role":"wizard","content":"Hi"}]}`, 400, "messages[1].role", "invalid_value", "wizard"},
		{"function role", chat, `{"model":"moxie-test","messages":[{"role":"function","content":"Hi"}]}`, 400, "messages[0].role", "unsupported_value", "tool"},
		{"missing content", chat, `{"model":"moxie-test","messages":[{"role":"user"}]}`, 400, "messages[0].content", "missing_required_parameter", "content"},
		{"content wrong type", chat, `{"model":"moxie-test","messages":[{"role":"user","content":7}]}`, 400, "messages[0].content", "invalid_type", "string"},
		{"image part", chat, `{"model":"moxie-test","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "messages[0].content[0].type", "unsupported_value", "image_url"},
		{"template refuses", chat, `{"model":"moxie-test","messages":[{"role":"developer","content":""}]}`, 400, "messages", "invalid_value", "developer message has no content"},
		{"n > 1", chat, `{"model":"moxie-test",` + hi + `,"n":2}`, 400, "n", "unsupported_value", "n"},
		{"temperature too high", chat, `{"model":"moxie-test",` + hi + `,"temperature":3}`, 400, "temperature", "invalid_value", "[0, 2]"},
		{"top_p zero", chat, `{"model":"moxie-test",` + hi + `,"top_p":0}`, 400, "top_p", "invalid_value", "top_p"},
		{"top_k negative", chat, `{"model":"moxie-test",` + hi + `,"top_k":-1}`, 400, "top_k", "invalid_value", "top_k"},
		{"min_p above 1", chat, `{"model":"moxie-test",` + hi + `,"min_p":1.5}`, 400, "min_p", "invalid_value", "min_p"},
		{"presence_penalty", chat, `{"model":"moxie-test",` + hi + `,"presence_penalty":0.5}`, 400, "presence_penalty", "unsupported_value", "repetition_penalty"},
		{"frequency_penalty", chat, `{"model":"moxie-test",` + hi + `,"frequency_penalty":-1}`, 400, "frequency_penalty", "unsupported_value", "not supported"},
		{"repetition_penalty zero", chat, `{"model":"moxie-test",` + hi + `,"repetition_penalty":0}`, 400, "repetition_penalty", "invalid_value", "repetition_penalty"},
		{"seed wrong type", chat, `{"model":"moxie-test",` + hi + `,"seed":"x"}`, 400, "seed", "invalid_type", "integer"},
		{"max_tokens zero", chat, `{"model":"moxie-test",` + hi + `,"max_tokens":0}`, 400, "max_tokens", "invalid_value", "at least 1"},
		{"max_completion_tokens negative", chat, `{"model":"moxie-test",` + hi + `,"max_completion_tokens":-3}`, 400, "max_completion_tokens", "invalid_value", "at least 1"},
		{"too many tokens requested", chat, `{"model":"moxie-test",` + hi + `,"max_tokens":1000}`, 400, "max_tokens", "context_length_exceeded", "at most 250"},
		{"too many tokens requested (completion field)", chat, `{"model":"moxie-test",` + hi + `,"max_completion_tokens":251}`, 400, "max_completion_tokens", "context_length_exceeded", "256"},
		{"prompt too long", chat, `{"model":"moxie-test","messages":[{"role":"user","content":"` + strings.Repeat("x", 300) + `"}]}`, 400, "messages", "context_length_exceeded", "304 tokens"},
		{"stop wrong type", chat, `{"model":"moxie-test",` + hi + `,"stop":5}`, 400, "stop", "invalid_type", "string or an array"},
		{"stop empty", chat, `{"model":"moxie-test",` + hi + `,"stop":["a",""]}`, 400, "stop", "invalid_value", "stop[1]"},
		{"too many stops", chat, `{"model":"moxie-test",` + hi + `,"stop":["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"]}`, 400, "stop", "invalid_value", "at most 16"},
		{"stream_options without stream", chat, `{"model":"moxie-test",` + hi + `,"stream_options":{"include_usage":true}}`, 400, "stream_options", "invalid_value", "stream"},
		{"bad reasoning_effort", chat, `{"model":"moxie-test",` + hi + `,"reasoning_effort":"extreme"}`, 400, "reasoning_effort", "invalid_value", "extreme"},
		{"bad thinking type", chat, `{"model":"moxie-test",` + hi + `,"thinking":{"type":"sometimes"}}`, 400, "thinking.type", "invalid_value", "sometimes"},
		{"thinking wrong type", chat, `{"model":"moxie-test",` + hi + `,"thinking":"yes"}`, 400, "thinking", "invalid_type", "a string"},
		{"tools wrong type", chat, `{"model":"moxie-test",` + hi + `,"tools":{"type":"function"}}`, 400, "tools", "invalid_type", "array"},
		{"tool without name", chat, `{"model":"moxie-test",` + hi + `,"tools":[{"type":"function","function":{"description":"f"}}]}`, 400, "tools[0].function.name", "missing_required_parameter", "name"},
		{"tool of another type", chat, `{"model":"moxie-test",` + hi + `,"tools":[{"type":"retrieval"}]}`, 400, "tools[0].type", "invalid_value", "function"},
		{"tool_choice required", chat, `{"model":"moxie-test",` + hi + `,"tool_choice":"required"}`, 400, "tool_choice", "unsupported_value", "required"},
		{"tool_choice object", chat, `{"model":"moxie-test",` + hi + `,"tool_choice":{"type":"function","function":{"name":"f"}}}`, 400, "tool_choice", "unsupported_value", "auto"},
		{"tool_calls on a user message", chat, `{"model":"moxie-test","messages":[{"role":"user","content":"a","tool_calls":[]}]}`, 400, "messages[0].tool_calls", "invalid_value", "assistant"},
		{"tool call without name", chat, `{"model":"moxie-test","messages":[{"role":"user","content":"a"},{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"arguments":"{}"}}]},{"role":"tool","tool_call_id":"1","content":"x"}]}`, 400, "messages[1].tool_calls[0].function.name", "missing_required_parameter", "name"},
		{"tool_call_id on a user message", chat, `{"model":"moxie-test","messages":[{"role":"user","content":"a","tool_call_id":"1"}]}`, 400, "messages[0].tool_call_id", "invalid_value", "tool"},
		{"tool_call_id wrong type", chat, `{"model":"moxie-test","messages":[{"role":"tool","content":"a","tool_call_id":1}]}`, 400, "messages[0].tool_call_id", "invalid_type", "string"},
		{"response_format json", chat, `{"model":"moxie-test",` + hi + `,"response_format":{"type":"json_object"}}`, 400, "response_format", "unsupported_value", "text"},
		{"logprobs", chat, `{"model":"moxie-test",` + hi + `,"logprobs":true}`, 400, "logprobs", "unsupported_value", "logprobs"},
		{"completion missing prompt", comp, `{"model":"moxie-test"}`, 400, "prompt", "missing_required_parameter", "prompt"},
		{"completion prompt wrong type", comp, `{"model":"moxie-test","prompt":{"a":1}}`, 400, "prompt", "invalid_type", "object"},
		{"completion several prompts", comp, `{"model":"moxie-test","prompt":["a","b"]}`, 400, "prompt", "unsupported_value", "exactly one"},
		{"completion empty prompt", comp, `{"model":"moxie-test","prompt":""}`, 400, "prompt", "invalid_value", "no tokens"},
		{"completion echo", comp, `{"model":"moxie-test","prompt":"a","echo":true}`, 400, "echo", "unsupported_value", "echo"},
		{"completion too long", comp, `{"model":"moxie-test","prompt":"` + strings.Repeat("y", 256) + `"}`, 400, "prompt", "context_length_exceeded", "256"},
		{"completion max_tokens overflowing int", comp, `{"model":"moxie-test","prompt":"a","max_tokens":9223372036854775807}`, 400, "max_tokens", "context_length_exceeded", "at most 255"},
		{"completion unknown model", comp, `{"model":"davinci","prompt":"a"}`, 404, "model", "model_not_found", "davinci"},
		{"body over the limit", chat, `{"model":"moxie-test","messages":[{"role":"user","content":"` + strings.Repeat("z", 5000) + `"}]}`, 413, "", "body_too_large", "4096 bytes"},
	}
	_, ts := testServer(t, Config{MaxBodyBytes: 4096}, newFake())
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := post(t, ts.URL+tc.path, tc.body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			checkAPIError(t, body, tc.param, tc.code, tc.mention)
		})
	}
	t.Run("unknown route", func(t *testing.T) {
		resp, body := get(t, ts.URL+"/v1/engines")
		if resp.StatusCode != 404 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		checkAPIError(t, body, "", "unknown_url", "/v1/engines")
	})
	t.Run("wrong method", func(t *testing.T) {
		resp, body := get(t, ts.URL+chat)
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
			t.Fatalf("status %d allow %q", resp.StatusCode, resp.Header.Get("Allow"))
		}
		checkAPIError(t, body, "", "method_not_allowed", "POST")
	})
}

func TestAuth(t *testing.T) {
	_, ts := testServer(t, Config{APIKey: "sekrit"}, newFake())
	body := `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}]}`
	cases := []struct {
		name, method, path, auth string
		status                   int
	}{
		{"no key chat", "POST", "/v1/chat/completions", "", 401},
		{"wrong key chat", "POST", "/v1/chat/completions", "Bearer nope", 401},
		{"key without Bearer", "POST", "/v1/chat/completions", "sekrit", 401},
		{"prefix of the key", "POST", "/v1/chat/completions", "Bearer sekri", 401},
		{"right key chat", "POST", "/v1/chat/completions", "Bearer sekrit", 200},
		{"no key models", "GET", "/v1/models", "", 401},
		{"no key health", "GET", "/health", "", 401},
		{"no key metrics", "GET", "/metrics", "", 401},
		{"right key metrics", "GET", "/metrics", "Bearer sekrit", 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var resp *http.Response
			var b string
			if tc.method == "POST" {
				resp, b = post(t, ts.URL+tc.path, body, "Authorization", tc.auth)
			} else {
				resp, b = get(t, ts.URL+tc.path, "Authorization", tc.auth)
			}
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			if tc.status == 401 {
				checkAPIError(t, b, "", "invalid_api_key", "API key")
				if resp.Header.Get("WWW-Authenticate") == "" {
					t.Error("no WWW-Authenticate header")
				}
			}
		})
	}
}
