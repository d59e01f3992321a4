package server

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestAnthropicNodeClient runs the official Anthropic npm client (pinned in
// testdata/npm, installed by scripts/setup-openai.sh) against a live server
// on loopback serving the fake model, and checks what the client parsed:
// messages, thinking blocks, the SDK's stream assembly, tool use (plain and
// streamed), count_tokens and an error.
func TestAnthropicNodeClient(t *testing.T) {
	needNodeClient(t, "@anthropic-ai/sdk")
	fake := newFake()
	fake.maxCtx = 4096
	fake.toolAnswer = "Checking." + dsml
	fake.prefillDelay = 40 * time.Millisecond // keep-alive comments in every stream
	s := newServer(t, Config{APIKey: "test-key", KeepAlive: 10 * time.Millisecond}, fake)
	url, _ := serveOn(t, s)
	stdout := runNodeClient(t, "anthropic.mjs", url, "test-key", "moxie-test")
	type block struct {
		Type, Text, Thinking, Name string
		Input                      map[string]any
	}
	type usage struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	}
	var got struct {
		Message struct {
			Type, Role, StopReason string
			Content                []block
			Usage                  usage
		}
		Thinking []struct{ Type, Text string }
		Stream   struct {
			Text, StopReason string
			Content          []block
			Usage            usage
		}
		Tools, ToolsStream struct {
			StopReason string
			Content    []block
		}
		Count int
		Error *struct {
			Status        int
			Type, Message string
		}
	}
	if err := json.Unmarshal(stdout, &got); err != nil {
		t.Fatalf("client output: %v\n%s", err, string(stdout))
	}
	m := got.Message
	if m.Type != "message" || m.Role != "assistant" || m.StopReason != "end_turn" || len(m.Content) != 1 || m.Content[0].Text != "Hello, world!" {
		t.Errorf("message: %+v", m)
	}
	if m.Usage.InputTokens != userPromptLen(2) || m.Usage.OutputTokens != 14 {
		t.Errorf("usage %+v, want %d in, 14 out", m.Usage, userPromptLen(2))
	}
	if len(got.Thinking) != 2 || got.Thinking[0].Type != "thinking" || got.Thinking[0].Text != "Let me think." || got.Thinking[1].Text != "Hello, world!" {
		t.Errorf("thinking: %+v", got.Thinking)
	}
	st := got.Stream
	if st.Text != "Hello, world!" || st.StopReason != "end_turn" || len(st.Content) != 1 || st.Content[0].Text != "Hello, world!" || st.Usage.OutputTokens != 14 {
		t.Errorf("stream: %+v", st)
	}
	for name, tc := range map[string]struct {
		StopReason string
		Content    []block
	}{"tools": got.Tools, "tools stream": got.ToolsStream} {
		if tc.StopReason != "tool_use" || len(tc.Content) != 2 || tc.Content[0].Text != "Checking." || tc.Content[1].Type != "tool_use" ||
			tc.Content[1].Name != "get_weather" || tc.Content[1].Input["city"] != "Paris" || tc.Content[1].Input["days"] != float64(3) {
			t.Errorf("%s: %+v", name, tc)
		}
	}
	if got.Count != userPromptLen(2) {
		t.Errorf("count_tokens %d, want %d", got.Count, userPromptLen(2))
	}
	if e := got.Error; e == nil || e.Status != 404 || e.Type != "not_found_error" || !strings.Contains(e.Message, "claude-nope") {
		t.Errorf("error: %+v", got.Error)
	}
}
