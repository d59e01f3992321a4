package server

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// msgResp is a Messages response as a client reads it.
type msgResp struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Role    string `json:"role"`
	Model   string `json:"model"`
	Content []struct {
		Type      string          `json:"type"`
		Text      *string         `json:"text"`
		Thinking  *string         `json:"thinking"`
		Signature *string         `json:"signature"`
		ID        string          `json:"id"`
		Name      string          `json:"name"`
		Input     json.RawMessage `json:"input"`
	} `json:"content"`
	StopReason   *string `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
	Usage        struct {
		InputTokens          int `json:"input_tokens"`
		OutputTokens         int `json:"output_tokens"`
		CacheReadInputTokens int `json:"cache_read_input_tokens"`
	} `json:"usage"`
}

func postMessages(t *testing.T, url, body string, hdr ...string) (int, msgResp, string) {
	t.Helper()
	resp, out := post(t, url+"/v1/messages", body, hdr...)
	var r msgResp
	if resp.StatusCode == 200 && !strings.Contains(resp.Header.Get("Content-Type"), "event-stream") {
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	return resp.StatusCode, r, out
}

// namedEvent is one event of an Anthropic stream.
type namedEvent struct {
	name string
	data map[string]any
}

// namedEvents parses an Anthropic SSE body: "event: NAME" and "data: JSON"
// lines, a blank line after each event; comments (keep-alives) skipped.
func namedEvents(t *testing.T, body string) []namedEvent {
	t.Helper()
	var out []namedEvent
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var cur namedEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, ": "):
		case strings.HasPrefix(line, "event: "):
			cur = namedEvent{name: strings.TrimPrefix(line, "event: ")}
		case strings.HasPrefix(line, "data: "):
			if cur.name == "" {
				t.Fatalf("data without an event name: %q", line)
			}
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &cur.data); err != nil {
				t.Fatalf("event %s: %v", cur.name, err)
			}
			if cur.data["type"] != cur.name {
				t.Errorf("event %s carries type %v", cur.name, cur.data["type"])
			}
			out = append(out, cur)
			cur = namedEvent{}
		case line == "":
		default:
			t.Fatalf("unexpected line %q", line)
		}
	}
	return out
}

const hiMessages = `{"model":"moxie-test","max_tokens":64,"messages":[{"role":"user","content":"Hi"}]`

func TestMessages(t *testing.T) {
	for _, c := range []struct {
		name, body    string
		think         bool
		text, reason  string
		stop          string
		seq           string
		output        int
		promptContain string
	}{
		{"plain", hiMessages + `}`, false, "Hello, world!", "", "end_turn", "", 14, "Hi"},
		{"blocks and a system prompt", `{"model":"moxie-test","max_tokens":64,"system":[{"type":"text","text":"Be brief."}],"messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]}]}`,
			false, "Hello, world!", "", "end_turn", "", 14, "Be brief.Hi"},
		{"thinking", hiMessages + `,"thinking":{"type":"enabled","budget_tokens":1024}}`, true, "Hello, world!", "Let me think.", "end_turn", "", 28, "Hi"},
		{"max_tokens", `{"model":"moxie-test","max_tokens":5,"messages":[{"role":"user","content":"Hi"}]}`, false, "Hello", "", "max_tokens", "", 5, "Hi"},
		{"stop sequence", hiMessages + `,"stop_sequences":["world"]}`, false, "Hello, ", "", "stop_sequence", "world", 0, "Hi"},
	} {
		t.Run(c.name, func(t *testing.T) {
			fake := newFake()
			_, ts := testServer(t, Config{}, fake)
			code, r, raw := postMessages(t, ts.URL, c.body)
			if code != 200 {
				t.Fatalf("status %d: %s", code, raw)
			}
			if r.Type != "message" || r.Role != "assistant" || r.Model != "moxie-test" || !strings.HasPrefix(r.ID, "msg_") {
				t.Errorf("envelope %s", raw)
			}
			var text, reason string
			var types []string
			for _, b := range r.Content {
				types = append(types, b.Type)
				switch b.Type {
				case "text":
					text += *b.Text
				case "thinking":
					reason += *b.Thinking
					if b.Signature == nil {
						t.Errorf("thinking block without a signature field: %s", raw)
					}
				}
			}
			want := []string{"text"}
			if c.think {
				want = []string{"thinking", "text"}
			}
			if strings.Join(types, ",") != strings.Join(want, ",") || text != c.text || reason != c.reason {
				t.Errorf("content %v %q %q, want %v %q %q: %s", types, text, reason, want, c.text, c.reason, raw)
			}
			if r.StopReason == nil || *r.StopReason != c.stop || (c.seq == "") != (r.StopSequence == nil) || (r.StopSequence != nil && *r.StopSequence != c.seq) {
				t.Errorf("stop %v %v, want %q %q", r.StopReason, r.StopSequence, c.stop, c.seq)
			}
			if c.output > 0 && r.Usage.OutputTokens != c.output {
				t.Errorf("output tokens %d, want %d", r.Usage.OutputTokens, c.output)
			}
			if r.Usage.InputTokens < userPromptLen(2) || r.Usage.CacheReadInputTokens != 0 {
				t.Errorf("usage %+v", r.Usage)
			}
			if p, _ := fake.lastPrompt.Load().(string); !strings.Contains(p, c.promptContain) {
				t.Errorf("the model saw %q, want it to contain %q", p, c.promptContain)
			}
		})
	}
}

func TestMessagesStreaming(t *testing.T) {
	for _, think := range []bool{false, true} {
		name := map[bool]string{false: "text", true: "thinking"}[think]
		t.Run(name, func(t *testing.T) {
			_, ts := testServer(t, Config{}, newFake())
			body := hiMessages + `,"stream":true`
			if think {
				body += `,"thinking":{"type":"enabled","budget_tokens":64}`
			}
			resp, out := post(t, ts.URL+"/v1/messages", body+`}`)
			if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("%d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), out)
			}
			evs := namedEvents(t, out)
			var names []string
			texts := map[float64]string{}
			kinds := map[float64]string{}
			for _, e := range evs {
				names = append(names, e.name)
				switch e.name {
				case "content_block_start":
					kinds[e.data["index"].(float64)] = e.data["content_block"].(map[string]any)["type"].(string)
				case "content_block_delta":
					d := e.data["delta"].(map[string]any)
					i := e.data["index"].(float64)
					switch d["type"] {
					case "text_delta":
						texts[i] += d["text"].(string)
					case "thinking_delta":
						texts[i] += d["thinking"].(string)
					case "signature_delta":
					default:
						t.Errorf("delta %v", d)
					}
				}
			}
			// The order of the frame: start, blocks, delta with the stop
			// reason, stop.
			if len(names) < 5 || names[0] != "message_start" || names[len(names)-2] != "message_delta" || names[len(names)-1] != "message_stop" {
				t.Fatalf("events %v", names)
			}
			md := evs[len(evs)-2].data
			if md["delta"].(map[string]any)["stop_reason"] != "end_turn" {
				t.Errorf("message_delta %v", md)
			}
			if u := md["usage"].(map[string]any); u["output_tokens"].(float64) < 14 {
				t.Errorf("usage %v", u)
			}
			want := map[float64]string{0: "text"}
			wantText := map[float64]string{0: "Hello, world!"}
			if think {
				want = map[float64]string{0: "thinking", 1: "text"}
				wantText = map[float64]string{0: "Let me think.", 1: "Hello, world!"}
			}
			if len(kinds) != len(want) {
				t.Errorf("blocks %v, want %v", kinds, want)
			}
			for i, k := range want {
				if kinds[i] != k || texts[i] != wantText[i] {
					t.Errorf("block %v: %s %q, want %s %q", i, kinds[i], texts[i], k, wantText[i])
				}
			}
			starts, stops := strings.Count(strings.Join(names, " "), "content_block_start"), strings.Count(strings.Join(names, " "), "content_block_stop")
			if starts != len(want) || stops != len(want) {
				t.Errorf("%d starts and %d stops for %d blocks: %v", starts, stops, len(want), names)
			}
		})
	}
}

const weatherToolAnthropic = `{"name":"get_weather","description":"Weather forecast","input_schema":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}`

func TestMessagesTools(t *testing.T) {
	fake := newFake()
	fake.maxCtx = 4096
	fake.answer = "Let me check." + dsml
	_, ts := testServer(t, Config{}, fake)
	body := `{"model":"moxie-test","max_tokens":512,"messages":[{"role":"user","content":"Weather in Paris?"}],"tools":[` + weatherToolAnthropic + `]}`
	code, r, raw := postMessages(t, ts.URL, body)
	if code != 200 {
		t.Fatalf("%d %s", code, raw)
	}
	if r.StopReason == nil || *r.StopReason != "tool_use" || len(r.Content) != 2 || r.Content[0].Type != "text" || *r.Content[0].Text != "Let me check." || r.Content[1].Type != "tool_use" {
		t.Fatalf("response %s", raw)
	}
	tu := r.Content[1]
	var in map[string]any
	if err := json.Unmarshal(tu.Input, &in); err != nil || tu.Name != "get_weather" || in["city"] != "Paris" || in["days"] != float64(3) || !strings.HasPrefix(tu.ID, "toolu_") {
		t.Fatalf("tool_use %+v (%v): %s", tu, err, raw)
	}
	if p, _ := fake.lastPrompt.Load().(string); !strings.Contains(p, "get_weather") || !strings.Contains(p, "Weather forecast") {
		t.Errorf("the tool was not described to the model: %q", p)
	}
	// The client runs the tool and sends the result back.
	follow := `{"model":"moxie-test","max_tokens":512,"tools":[` + weatherToolAnthropic + `],"messages":[` +
		`{"role":"user","content":"Weather in Paris?"},` +
		`{"role":"assistant","content":[{"type":"text","text":"Let me check."},{"type":"tool_use","id":"` + tu.ID + `","name":"get_weather","input":{"city":"Paris","days":3}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"` + tu.ID + `","content":"Sunny, 24 C"}]}]}`
	fake.answer = "It is sunny."
	code, r, raw = postMessages(t, ts.URL, follow)
	if code != 200 || *r.StopReason != "end_turn" || len(r.Content) != 1 || *r.Content[0].Text != "It is sunny." {
		t.Fatalf("%d %s", code, raw)
	}
	p, _ := fake.lastPrompt.Load().(string)
	if !strings.Contains(p, "Sunny, 24 C") || !strings.Contains(p, `"Paris"`) && !strings.Contains(p, ">Paris<") {
		t.Errorf("the tool call and its result were not in the prompt: %q", p)
	}
	// Streamed, the call is a tool_use block with its input as one
	// input_json_delta.
	fake.answer = "Let me check." + dsml
	resp, out := post(t, ts.URL+"/v1/messages", strings.Replace(body, `"max_tokens":512`, `"max_tokens":512,"stream":true`, 1))
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	var js, text, stop string
	uses := 0
	for _, e := range namedEvents(t, out) {
		switch e.name {
		case "content_block_start":
			if b := e.data["content_block"].(map[string]any); b["type"] == "tool_use" {
				uses++
				if b["name"] != "get_weather" {
					t.Errorf("tool_use block %v", b)
				}
			}
		case "content_block_delta":
			switch d := e.data["delta"].(map[string]any); d["type"] {
			case "input_json_delta":
				js += d["partial_json"].(string)
			case "text_delta":
				text += d["text"].(string)
			}
		case "message_delta":
			stop, _ = e.data["delta"].(map[string]any)["stop_reason"].(string)
		}
	}
	in = nil
	if err := json.Unmarshal([]byte(js), &in); err != nil || uses != 1 || in["city"] != "Paris" || text != "Let me check." || stop != "tool_use" {
		t.Errorf("stream: %d tool_use blocks, input %q (%v), text %q, stop %q", uses, js, err, text, stop)
	}
}

func TestMessagesErrors(t *testing.T) {
	fake := newFake()
	_, ts := testServer(t, Config{APIKey: "sekret"}, fake)
	auth := []string{"x-api-key", "sekret"}
	for _, c := range []struct {
		name, body string
		hdr        []string
		status     int
		typ, msg   string
	}{
		{"no key", hiMessages + `}`, nil, 401, "authentication_error", "API key"},
		{"wrong key", hiMessages + `}`, []string{"x-api-key", "nope"}, 401, "authentication_error", "API key"},
		{"no max_tokens", `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}]}`, auth, 400, "invalid_request_error", "max_tokens: required"},
		{"unknown model", `{"model":"claude-x","max_tokens":5,"messages":[{"role":"user","content":"Hi"}]}`, auth, 404, "not_found_error", "claude-x"},
		{"an image", `{"model":"moxie-test","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`, auth, 400, "invalid_request_error", "image blocks are not supported"},
		{"a system role message", `{"model":"moxie-test","max_tokens":5,"messages":[{"role":"system","content":"x"}]}`, auth, 400, "invalid_request_error", `goes in "system"`},
		{"tool_choice any", hiMessages + `,"tool_choice":{"type":"any"}}`, auth, 400, "invalid_request_error", "tool_choice.type"},
		{"a server tool", hiMessages + `,"tools":[{"type":"web_search_20250305","name":"web_search"}]}`, auth, 400, "invalid_request_error", "server tools"},
		{"empty stop sequence", hiMessages + `,"stop_sequences":[""]}`, auth, 400, "invalid_request_error", "stop_sequences"},
		{"malformed JSON", `{"model":`, auth, 400, "invalid_request_error", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _, raw := postMessages(t, ts.URL, c.body, c.hdr...)
			var e struct {
				Type  string `json:"type"`
				Error struct {
					Type    string `json:"type"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(raw), &e); err != nil {
				t.Fatalf("%v: %s", err, raw)
			}
			if code != c.status || e.Type != "error" || e.Error.Type != c.typ || !strings.Contains(e.Error.Message, c.msg) {
				t.Errorf("got %d %s, want %d %s containing %q", code, raw, c.status, c.typ, c.msg)
			}
		})
	}
	t.Run("GET", func(t *testing.T) {
		resp, b := get(t, ts.URL+"/v1/messages", "x-api-key", "sekret")
		if resp.StatusCode != http.StatusMethodNotAllowed || !strings.Contains(b, `"type":"error"`) {
			t.Errorf("%d %s", resp.StatusCode, b)
		}
	})
	t.Run("the OpenAI endpoints keep their shape", func(t *testing.T) {
		resp, b := post(t, ts.URL+"/v1/chat/completions", hiBody, "x-api-key", "nope")
		if resp.StatusCode != 401 || !strings.Contains(b, `"code":"invalid_api_key"`) {
			t.Errorf("%d %s", resp.StatusCode, b)
		}
	})
}

func TestCountTokens(t *testing.T) {
	_, ts := testServer(t, Config{}, newFake())
	resp, b := post(t, ts.URL+"/v1/messages/count_tokens", `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}]}`)
	var r struct {
		InputTokens int `json:"input_tokens"`
	}
	if err := json.Unmarshal([]byte(b), &r); err != nil || resp.StatusCode != 200 || r.InputTokens != userPromptLen(2) {
		t.Errorf("%d %s, want %d input tokens", resp.StatusCode, b, userPromptLen(2))
	}
}

// TestMessagesPromptCache: the second turn of a conversation reports the
// reused tokens as cache_read_input_tokens, outside input_tokens.
func TestMessagesPromptCache(t *testing.T) {
	_, ts := testServer(t, Config{}, newFake())
	_, r1, _ := postMessages(t, ts.URL, hiMessages+`}`)
	turn2 := `{"model":"moxie-test","max_tokens":64,"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello, world!"},{"role":"user","content":"More"}]}`
	_, r2, raw := postMessages(t, ts.URL, turn2)
	want := r1.Usage.InputTokens + 13
	if r2.Usage.CacheReadInputTokens != want || r2.Usage.InputTokens+r2.Usage.CacheReadInputTokens != userPromptLen(2)+13+1+userPromptLen(4)-1 {
		t.Errorf("second turn usage %+v, want %d read from the cache: %s", r2.Usage, want, raw)
	}
}

// FuzzMessages sends arbitrary bodies to /v1/messages and count_tokens and
// checks that the server never fails internally: every answer is a 200 or
// a 4xx Anthropic error object ({"type": "error", "error": {...}}).
func FuzzMessages(f *testing.F) {
	f.Add(false, hiMessages+`}`)
	f.Add(false, `{"model":"moxie-test","max_tokens":3,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"stop_sequences":["l"],"stream":true}`)
	f.Add(false, `{"model":"moxie-test","max_tokens":8,"tools":[{"name":"f","input_schema":{"type":"object"}}],"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"x"}],"is_error":true}]}]}`)
	f.Add(false, `{"model":"moxie-test","max_tokens":4,"thinking":{"type":"enabled","budget_tokens":2},"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":""},{"type":"redacted_thinking","data":"x"}]}]}`)
	f.Add(true, `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}]}`)
	f.Add(false, `{"model":"moxie-test","max_tokens":4,"messages":[{"role":"user","content":[{"type":"tool_use","input":[]}]}]}`)
	tok := tinyTokenizer(f)
	f.Fuzz(func(t *testing.T, count bool, body string) {
		path := "/v1/messages"
		if count {
			path = "/v1/messages/count_tokens"
		}
		checkFuzzAnswer(t, tok, path, body, func(b []byte) bool {
			var e struct {
				Type  string `json:"type"`
				Error *struct {
					Type    string `json:"type"`
					Message string `json:"message"`
				} `json:"error"`
			}
			return json.Unmarshal(b, &e) == nil && e.Type == "error" && e.Error != nil && e.Error.Message != "" && e.Error.Type != ""
		})
	})
}
