package server

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
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
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not found in PATH: this test runs the official Anthropic npm client")
	}
	if _, err := os.Stat(filepath.Join("testdata", "npm", "node_modules", "@anthropic-ai", "sdk", "package.json")); err != nil {
		t.Skip("the @anthropic-ai/sdk npm package is not installed (run scripts/setup-openai.sh, needs npm)")
	}
	fake := newFake()
	fake.maxCtx = 4096
	fake.toolAnswer = "Checking." + dsml
	fake.prefillDelay = 40 * time.Millisecond // keep-alive comments in every stream
	s := newServer(t, Config{APIKey: "test-key", KeepAlive: 10 * time.Millisecond}, fake)
	url, _ := serveOn(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "anthropic.mjs", url, "test-key", "moxie-test")
	cmd.Dir = filepath.Join("testdata", "npm")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node anthropic.mjs: %v\nstderr:\n%s", err, stderr.String())
	}
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
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("client output: %v\n%s", err, stdout.String())
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
