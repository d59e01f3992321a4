package server

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"moxie/checkpoint"
	"moxie/dsv4"
)

// needNodeClient skips t unless node and the npm package pkg (installed in
// testdata/npm by scripts/setup-openai.sh) are there.
func needNodeClient(t *testing.T, pkg string) {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Skipf("node not found in PATH: this test runs the official %s npm client", pkg)
	}
	if _, err := os.Stat(filepath.Join("testdata", "npm", "node_modules", filepath.FromSlash(pkg), "package.json")); err != nil {
		t.Skipf("the %s npm package is not installed (run scripts/setup-openai.sh, needs npm)", pkg)
	}
}

// runNodeClient runs `node script args...` in testdata/npm (2 minutes at
// most) and returns its standard output; it fails t if the script fails.
func runNodeClient(t *testing.T, script string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{script}, args...)...)
	cmd.Dir = filepath.Join("testdata", "npm")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node %s: %v\nstderr:\n%s", script, err, stderr.String())
	}
	return stdout.Bytes()
}

// TestOpenAINodeClient runs the official openai npm client (pinned in
// testdata/npm, installed by scripts/setup-openai.sh) against a live server
// on loopback serving the fake model, and checks what the client parsed.
func TestOpenAINodeClient(t *testing.T) {
	needNodeClient(t, "openai")
	fake := newFake()
	fake.maxCtx = 4096
	fake.toolAnswer = "Checking." + dsml
	// Every stream carries keep-alive comments (a 60ms prefill, 10ms
	// keep-alive): the client must skip them.
	fake.prefillDelay = 60 * time.Millisecond
	s := newServer(t, Config{APIKey: "test-key", Concurrency: 2, QueueSize: 4, KeepAlive: 10 * time.Millisecond}, fake)
	url, stop := serveOn(t, s)

	stdout := runNodeClient(t, "client.mjs", url+"/v1", "test-key", "moxie-test")
	type usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	}
	var got struct {
		Models []string `json:"models"`
		Chat   struct {
			Object, Content, Role, Finish string
			Usage                         usage
		} `json:"chat"`
		Thinking struct {
			Content         string
			Reasoning       *string
			ReasoningTokens *int
		} `json:"thinking"`
		Stream struct {
			Content string
			Chunks  int
			Finish  string
			Usage   *usage
		} `json:"stream"`
		Completion struct {
			Object, Text, Finish string
			Usage                usage
		} `json:"completion"`
		CompletionStream struct{ Text string } `json:"completionStream"`
		Tools            struct {
			Finish  string
			Content *string
			Calls   []struct {
				ID, Type, Name string
				Arguments      map[string]any
			}
		} `json:"tools"`
		ToolsStream struct {
			Finish  string
			Content *string
			Calls   []struct {
				Name      string
				Arguments map[string]any
			}
		} `json:"toolsStream"`
		ToolsSecondTurn struct{ Finish string } `json:"toolsSecondTurn"`
		Error           *struct {
			Status                     int
			Code, Param, Type, Message string
		} `json:"error"`
		AuthError *struct {
			Status int
			Code   string
		} `json:"authError"`
	}
	if err := json.Unmarshal(stdout, &got); err != nil {
		t.Fatalf("client output is not JSON: %v\n%s", err, string(stdout))
	}
	t.Logf("client saw: %s", string(stdout))

	if len(got.Models) != 1 || got.Models[0] != "moxie-test" {
		t.Errorf("models %v", got.Models)
	}
	c := got.Chat
	if c.Object != "chat.completion" || c.Role != "assistant" || c.Content != "Hello, world!" || c.Finish != "stop" ||
		c.Usage != (usage{userPromptLen(2), 14, userPromptLen(2) + 14}) {
		t.Errorf("chat %+v", c)
	}
	if th := got.Thinking; th.Content != "Hello, world!" || th.Reasoning == nil || *th.Reasoning != "Let me think." ||
		th.ReasoningTokens == nil || *th.ReasoningTokens != 14 {
		t.Errorf("thinking %+v", th)
	}
	// stop "world": the content ends before it; "Hello, world" is 12 tokens.
	if st := got.Stream; st.Content != "Hello, " || st.Finish != "stop" || st.Chunks < 8 ||
		st.Usage == nil || *st.Usage != (usage{userPromptLen(2), 12, userPromptLen(2) + 12}) {
		t.Errorf("stream %+v (usage %+v)", st, st.Usage)
	}
	if cp := got.Completion; cp.Object != "text_completion" || cp.Text != "Hello" || cp.Finish != "length" || cp.Usage != (usage{9, 5, 14}) {
		t.Errorf("completion %+v", cp)
	}
	if got.CompletionStream.Text != "Hel" {
		t.Errorf("completion stream %+v", got.CompletionStream)
	}
	weather := map[string]any{"city": "Paris", "days": float64(3)}
	if tl := got.Tools; tl.Finish != "tool_calls" || tl.Content == nil || *tl.Content != "Checking." || len(tl.Calls) != 1 ||
		tl.Calls[0].Name != "get_weather" || tl.Calls[0].Type != "function" || !strings.HasPrefix(tl.Calls[0].ID, "call_") ||
		!reflect.DeepEqual(tl.Calls[0].Arguments, weather) {
		t.Errorf("tools %+v", tl)
	}
	if tl := got.ToolsStream; tl.Finish != "tool_calls" || tl.Content == nil || *tl.Content != "Checking." || len(tl.Calls) != 1 ||
		tl.Calls[0].Name != "get_weather" || !reflect.DeepEqual(tl.Calls[0].Arguments, weather) {
		t.Errorf("tools stream %+v", tl)
	}
	// The second turn still declares the tools, so the fake answers with a call again.
	if got.ToolsSecondTurn.Finish != "tool_calls" {
		t.Errorf("second tool turn %+v", got.ToolsSecondTurn)
	}
	if p, _ := fake.lastPrompt.Load().(string); !strings.Contains(p, "<tool_result>sunny</tool_result>") {
		t.Errorf("the last prompt lacks the tool result: %q", p)
	}
	if e := got.Error; e == nil || e.Status != 404 || e.Code != "model_not_found" || e.Param != "model" || e.Type != "invalid_request_error" {
		t.Errorf("error %+v", e)
	}
	if e := got.AuthError; e == nil || e.Status != 401 || e.Code != "invalid_api_key" {
		t.Errorf("auth error %+v", e)
	}
	if err := stop(); err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// TestOpenAINodeClientTinyModel runs the client's basic checks against the
// real synth:tiny model (dsv4 on the CPU backend, the tiny tokenizer, the
// DeepSeek-V4 chat template). Its weights are random, so the checks are
// consistency checks: greedy output is the same streamed or not, token counts
// match the prompt and the limits.
func TestOpenAINodeClientTinyModel(t *testing.T) {
	needNodeClient(t, "openai")
	src, err := checkpoint.Open("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	m, err := dsv4.Load(src, dsv4.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tok := tinyTokenizer(t)
	s, err := New(Config{}, Backend{Name: "synth:tiny", Model: m, Tokenizer: FromTokenizer(tok),
		Chat: DeepSeekV4Chat(tok), StopTokens: []int{idEOS}})
	if err != nil {
		t.Fatal(err)
	}
	url, stop := serveOn(t, s)
	stdout := runNodeClient(t, "client.mjs", url+"/v1", "unused", "synth:tiny", "basic")
	t.Logf("client saw: %s", string(stdout))
	type usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	}
	var got struct {
		Models []string
		Chat   struct {
			Content, Finish string
			Usage           usage
		}
		Stream struct {
			Content, Finish string
			Usage           *usage
		}
		Completion struct {
			Text, Finish string
			Usage        usage
		}
		Error *struct {
			Status      int
			Code, Param string
		}
	}
	if err := json.Unmarshal(stdout, &got); err != nil {
		t.Fatalf("client output is not JSON: %v\n%s", err, string(stdout))
	}
	if len(got.Models) != 1 || got.Models[0] != "synth:tiny" {
		t.Errorf("models %v", got.Models)
	}
	c := got.Chat
	// "Hi" as one user message: BOS, <｜User｜>, H, i, <｜Assistant｜>, </think>.
	if c.Usage.PromptTokens != 6 || c.Usage.CompletionTokens < 1 || c.Usage.CompletionTokens > 8 ||
		(c.Finish == "length") != (c.Usage.CompletionTokens == 8) {
		t.Errorf("chat %+v", c)
	}
	if st := got.Stream; st.Content != c.Content || st.Finish != c.Finish || st.Usage == nil || *st.Usage != c.Usage {
		t.Errorf("greedy stream %+v (usage %+v) differs from the response %+v", st, st.Usage, c)
	}
	if cp := got.Completion; cp.Usage.PromptTokens != 9 || cp.Usage.CompletionTokens < 1 || cp.Usage.CompletionTokens > 5 {
		t.Errorf("completion %+v", cp)
	}
	if e := got.Error; e == nil || e.Status != 400 || e.Param != "messages[0].role" {
		t.Errorf("error %+v", e)
	}
	if err := stop(); err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// TestTinyModelConcurrentRequests runs greedy requests at once on the real
// synth:tiny model with Concurrency > 1: every answer must equal the one
// computed alone (sequences are independent; under -race this also checks
// that the model's sequences may run on several goroutines).
func TestTinyModelConcurrentRequests(t *testing.T) {
	src, err := checkpoint.Open("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	m, err := dsv4.Load(src, dsv4.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tok := tinyTokenizer(t)
	s, err := New(Config{Concurrency: 3, QueueSize: 3}, Backend{Name: "t", Model: m, Tokenizer: FromTokenizer(tok),
		Chat: DeepSeekV4Chat(tok), StopTokens: []int{idEOS}})
	if err != nil {
		t.Fatal(err)
	}
	text := func(body string) string {
		rec := httptestRecorder(s, "POST", "/v1/completions", body)
		var r chatResp
		if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &r) != nil {
			t.Errorf("%d %s", rec.Code, rec.Body.String())
			return ""
		}
		return *r.Choices[0].Text
	}
	prompts := []string{"Once upon a time", "Hi", "The capital of France"}
	alone := make([]string, len(prompts))
	for i, p := range prompts {
		alone[i] = text(`{"model":"t","prompt":"` + p + `","max_tokens":6,"temperature":0}`)
	}
	got := make([]string, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = text(`{"model":"t","prompt":"` + p + `","max_tokens":6,"temperature":0}`)
		}()
	}
	wg.Wait()
	for i := range prompts {
		if got[i] != alone[i] {
			t.Errorf("prompt %q: concurrent %q, alone %q", prompts[i], got[i], alone[i])
		}
	}
}
