package server

import (
	"encoding/json"
	"strings"
	"testing"

	"moxie/chat"
	"moxie/tokenizer"
)

// dsml is a DSML tool-call block as DeepSeek-V4 writes it, spelled out by hand
// from the format (dsv4-flash.md §6): one call of get_weather(city="Paris",
// days=3).
const dsml = "\n\n<｜DSML｜tool_calls>\n" +
	"<｜DSML｜invoke name=\"get_weather\">\n" +
	"<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n" +
	"<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n" +
	"</｜DSML｜invoke>\n" +
	"</｜DSML｜tool_calls>"

const weatherTool = `{"type":"function","function":{"name":"get_weather","description":"Weather forecast","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}}`

func TestToolCalls(t *testing.T) {
	body := `{"model":"moxie-test","messages":[{"role":"user","content":"Weather in Paris?"}],"tools":[` + weatherTool + `]`
	t.Run("non-streaming", func(t *testing.T) {
		fake := newFake()
		fake.maxCtx = 4096 // the tools instruction is long in a byte-level vocabulary
		fake.answer = "Let me check." + dsml
		_, ts := testServer(t, Config{}, fake)
		resp, b := post(t, ts.URL+"/v1/chat/completions", body+`}`)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		var r struct {
			Choices []struct {
				Message struct {
					Content   *string `json:"content"`
					ToolCalls []struct {
						ID       string `json:"id"`
						Type     string `json:"type"`
						Index    *int   `json:"index"`
						Function struct{ Name, Arguments string }
					} `json:"tool_calls"`
				} `json:"message"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(b), &r); err != nil {
			t.Fatal(err)
		}
		m := r.Choices[0].Message
		if m.Content == nil || *m.Content != "Let me check." || r.Choices[0].FinishReason != "tool_calls" || len(m.ToolCalls) != 1 {
			t.Fatalf("response %s", b)
		}
		tc := m.ToolCalls[0]
		var args map[string]any
		if err := json.Unmarshal([]byte(tc.Function.Arguments), &args); err != nil {
			t.Fatalf("arguments %q are not JSON: %v", tc.Function.Arguments, err)
		}
		if !strings.HasPrefix(tc.ID, "call_") || tc.Type != "function" || tc.Index != nil || tc.Function.Name != "get_weather" ||
			args["city"] != "Paris" || args["days"] != float64(3) || len(args) != 2 {
			t.Errorf("tool call %+v args %v", tc, args)
		}
	})
	t.Run("only a tool call: content is null", func(t *testing.T) {
		fake := newFake()
		fake.maxCtx = 4096 // the tools instruction is long in a byte-level vocabulary
		fake.answer = dsml
		_, ts := testServer(t, Config{}, fake)
		_, b := post(t, ts.URL+"/v1/chat/completions", body+`}`)
		if !strings.Contains(b, `"content":null`) || !strings.Contains(b, `"finish_reason":"tool_calls"`) {
			t.Errorf("response %s", b)
		}
	})
	t.Run("streaming", func(t *testing.T) {
		fake := newFake()
		fake.maxCtx = 4096 // the tools instruction is long in a byte-level vocabulary
		fake.answer = "Let me check." + dsml
		_, ts := testServer(t, Config{}, fake)
		_, b := post(t, ts.URL+"/v1/chat/completions", body+`,"stream":true}`)
		events := sseEvents(t, b)
		var content strings.Builder
		var calls []json.RawMessage
		var finish string
		for _, ev := range events {
			var c struct {
				Choices []struct {
					Delta struct {
						Content   *string           `json:"content"`
						ToolCalls []json.RawMessage `json:"tool_calls"`
					} `json:"delta"`
					FinishReason *string `json:"finish_reason"`
				} `json:"choices"`
			}
			_ = json.Unmarshal([]byte(ev), &c)
			ch := c.Choices[0]
			if ch.Delta.Content != nil {
				if strings.Contains(*ch.Delta.Content, "DSML") {
					t.Errorf("DSML text streamed as content: %s", ev)
				}
				content.WriteString(*ch.Delta.Content)
			}
			calls = append(calls, ch.Delta.ToolCalls...)
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
		if content.String() != "Let me check." || finish != "tool_calls" || len(calls) != 1 {
			t.Fatalf("content %q finish %q calls %s", content.String(), finish, calls)
		}
		var tc struct {
			Index    *int `json:"index"`
			ID, Type string
			Function struct{ Name, Arguments string }
		}
		_ = json.Unmarshal(calls[0], &tc)
		if tc.Index == nil || *tc.Index != 0 || !strings.HasPrefix(tc.ID, "call_") || tc.Function.Name != "get_weather" {
			t.Errorf("streamed tool call %s", calls[0])
		}
	})
	t.Run("malformed block comes back as content", func(t *testing.T) {
		bad := strings.Replace(dsml, `string="true"`, `string="maybe"`, 1)
		for _, stream := range []bool{false, true} {
			fake := newFake()
			fake.maxCtx = 4096
			fake.maxCtx = 4096 // the tools instruction is long in a byte-level vocabulary
			fake.answer = "Hmm." + bad
			_, ts := testServer(t, Config{}, fake)
			req := body + `}`
			if stream {
				req = body + `,"stream":true}`
			}
			_, b := post(t, ts.URL+"/v1/chat/completions", req)
			var content string
			if stream {
				for _, ev := range sseEvents(t, b) {
					var c chatResp
					_ = json.Unmarshal([]byte(ev), &c)
					if d := c.Choices[0].Delta.Content; d != nil {
						content += *d
					}
				}
			} else {
				var c chatResp
				_ = json.Unmarshal([]byte(b), &c)
				content = *c.Choices[0].Message.Content
			}
			if content != "Hmm."+bad || strings.Contains(b, "tool_calls\"") {
				t.Errorf("stream=%v: content %q, want the whole output; body %s", stream, content, b)
			}
		}
	})
	t.Run("tool_choice none hides the tools", func(t *testing.T) {
		fake := newFake()
		fake.maxCtx = 4096 // the tools instruction is long in a byte-level vocabulary
		_, ts := testServer(t, Config{}, fake)
		post(t, ts.URL+"/v1/chat/completions", body+`,"tool_choice":"none"}`)
		if p, _ := fake.lastPrompt.Load().(string); strings.Contains(p, "get_weather") {
			t.Errorf("prompt mentions the tool: %q", p)
		}
	})
}

// TestToolHistoryPrompt checks that a request's tools, assistant tool calls
// and tool results reach the template as the equivalent chat.Messages: the
// prompt the model sees equals chat.Render of messages built by hand.
func TestToolHistoryPrompt(t *testing.T) {
	fake := newFake()
	fake.maxCtx = 4096
	_, ts := testServer(t, Config{}, fake)
	body := `{"model":"moxie-test","tools":[` + weatherTool + `],"messages":[
		{"role":"system","content":"You are terse."},
		{"role":"user","content":"Weather in Paris?"},
		{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
		{"role":"tool","tool_call_id":"call_1","content":"sunny"}]}`
	resp, b := post(t, ts.URL+"/v1/chat/completions", body)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	var tool chat.Tool
	_ = json.Unmarshal([]byte(weatherTool), &tool)
	want, err := chat.Render([]chat.Message{
		{Role: "system", Content: "You are terse.", Tools: []chat.Tool{tool}},
		{Role: "user", Content: "Weather in Paris?"},
		{Role: "assistant", ToolCalls: []chat.ToolCall{{ID: "call_1", Type: "function", Function: chat.FunctionCall{Name: "get_weather", Arguments: `{"city": "Paris"}`}}}},
		{Role: "tool", ToolCallID: "call_1", Content: "sunny"},
	}, chat.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The fake keeps only the byte tokens of the prompt: drop the markers.
	tok := tinyTokenizer(t)
	var bytesOnly []byte
	for _, id := range tok.Encode(want, tokenizer.EncodeOptions{AllowSpecial: true}) {
		if id >= 3 && id < 259 {
			bytesOnly = append(bytesOnly, byte(id-3))
		}
	}
	if got, _ := fake.lastPrompt.Load().(string); got != string(bytesOnly) {
		t.Errorf("prompt text\n%q\nwant\n%q", got, bytesOnly)
	}
	if !strings.Contains(string(bytesOnly), "<tool_result>sunny</tool_result>") || !strings.Contains(string(bytesOnly), "get_weather") {
		t.Errorf("expected prompt lacks the tool history: %q", bytesOnly)
	}
}
