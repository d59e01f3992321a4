package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"moxie/tokenizer"
)

func TestModelFailure(t *testing.T) {
	t.Run("non-streaming: 500", func(t *testing.T) {
		fake := newFake()
		fake.failAfter = 3
		_, ts := testServer(t, Config{}, fake)
		resp, body := post(t, ts.URL+"/v1/chat/completions", hiBody)
		if resp.StatusCode != 500 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		checkAPIError(t, body, "", "generation_failed", "fake device lost")
	})
	t.Run("streaming: error event, no [DONE]", func(t *testing.T) {
		fake := newFake()
		fake.failAfter = 3
		_, ts := testServer(t, Config{}, fake)
		resp, body := post(t, ts.URL+"/v1/chat/completions", hiStream)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		if strings.Contains(body, "[DONE]") {
			t.Errorf("a failed stream ended with [DONE]:\n%s", body)
		}
		lines := strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n")
		last, ok := strings.CutPrefix(lines[len(lines)-1], "data: ")
		if !ok {
			t.Fatalf("last event %q", lines[len(lines)-1])
		}
		checkAPIError(t, last, "", "generation_failed", "fake device lost")
		// The tokens before the failure were streamed: the prefill and three
		// decode steps gave "Hell"; feeding back the fourth token failed.
		var content strings.Builder
		for _, l := range lines[:len(lines)-1] {
			var c chatResp
			_ = json.Unmarshal([]byte(strings.TrimPrefix(l, "data: ")), &c)
			if d := c.Choices[0].Delta.Content; d != nil {
				content.WriteString(*d)
			}
		}
		if content.String() != "Hell" {
			t.Errorf("content before the failure %q, want %q", content.String(), "Hell")
		}
	})
}

func TestNoChatTemplate(t *testing.T) {
	s, err := New(Config{}, Backend{Name: "m", Model: newFake(), Tokenizer: FromTokenizer(tinyTokenizer(t))})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptestRecorder(s, "POST", "/v1/chat/completions", hiBody)
	if rec.Code != 404 {
		t.Fatalf("status %d", rec.Code)
	}
	checkAPIError(t, rec.Body.String(), "", "unknown_url", "/v1/completions")
}

func TestNewRejects(t *testing.T) {
	tok := FromTokenizer(tinyTokenizer(t))
	cases := []struct {
		name string
		cfg  Config
		b    Backend
		want string
	}{
		{"no model", Config{}, Backend{Name: "m", Tokenizer: tok}, "Model"},
		{"no tokenizer", Config{}, Backend{Name: "m", Model: newFake()}, "Tokenizer"},
		{"no name", Config{}, Backend{Model: newFake(), Tokenizer: tok}, "Name"},
		{"negative queue", Config{QueueSize: -1}, Backend{Name: "m", Model: newFake(), Tokenizer: tok}, "QueueSize"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.cfg, tc.b); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

// FuzzRequest sends arbitrary bodies to both generation endpoints and checks
// that the server never fails internally: every answer is a 200 completion
// or a 4xx OpenAI error object, never a 500 (the recover middleware turns a
// panic into one).
func FuzzRequest(f *testing.F) {
	f.Add(false, hiBody)
	f.Add(false, `{"model":"moxie-test","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"stop":["l"],"max_tokens":3}`)
	f.Add(false, `{"model":"moxie-test","messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"{"}}]},{"role":"tool","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}`)
	f.Add(false, `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}],"thinking":{"type":"enabled"},"stream":true,"stream_options":{"include_usage":true}}`)
	f.Add(true, `{"model":"moxie-test","prompt":"<｜User｜>x","max_tokens":2,"temperature":1.5,"top_p":0.5,"top_k":3,"min_p":0.1,"seed":-4}`)
	f.Add(true, `{"model":"moxie-test","prompt":["a"],"stop":"\u00e9"}`)
	tok := tinyTokenizer(f)
	f.Fuzz(func(t *testing.T, completions bool, body string) {
		path := "/v1/chat/completions"
		if completions {
			path = "/v1/completions"
		}
		checkFuzzAnswer(t, tok, path, body, func(b []byte) bool {
			var e struct {
				Error *struct {
					Message string `json:"message"`
				} `json:"error"`
			}
			return json.Unmarshal(b, &e) == nil && e.Error != nil && e.Error.Message != ""
		})
	})
}

// checkFuzzAnswer posts body to path on a fresh server over the fake model
// (context 64) and fails t unless the answer is a 200 (valid JSON when it
// is JSON) or a 4xx whose body isError accepts: never a 500.
func checkFuzzAnswer(t *testing.T, tok *tokenizer.Tokenizer, path, body string, isError func([]byte) bool) {
	fake := newFake()
	fake.maxCtx = 64
	s, err := New(Config{MaxBodyBytes: 1 << 16}, Backend{Name: "moxie-test", Model: fake,
		Tokenizer: FromTokenizer(tok), Chat: DeepSeekV4Chat(tok), StopTokens: []int{idEOS}})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
	switch {
	case rec.Code == 200:
		if ct := rec.Header().Get("Content-Type"); ct == "application/json" && !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("200 with invalid JSON: %q", rec.Body.String())
		}
	case rec.Code >= 400 && rec.Code < 500:
		if !isError(rec.Body.Bytes()) {
			t.Fatalf("%d without an error object: %q", rec.Code, rec.Body.String())
		}
	default:
		t.Fatalf("status %d for %q: %s", rec.Code, body, rec.Body.String())
	}
}
