package server

import (
	"encoding/json"
	"testing"
)

// cacheResp is what TestPromptCache reads of a chat response.
type cacheResp struct {
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		PromptDetails    *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Timings struct {
		CachedTokens int `json:"cached_prompt_tokens"`
	} `json:"timings"`
}

func chatCached(t *testing.T, url, body string) cacheResp {
	t.Helper()
	resp, out := post(t, url+"/v1/chat/completions", body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, out)
	}
	var r cacheResp
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestPromptCache: a chat's second turn, sent with the whole conversation,
// continues the first turn's sequence: the fake model (one token per byte)
// is fed only the new tokens, and usage says how many were cached: the
// first prompt and the answer's 13 bytes (its EOS was sampled, never fed).
func TestPromptCache(t *testing.T) {
	const turn1 = `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}]}`
	const turn2 = `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello, world!"},{"role":"user","content":"More"}]}`
	t.Run("on by default", func(t *testing.T) {
		fake := newFake()
		s, ts := testServer(t, Config{}, fake)
		r1 := chatCached(t, ts.URL, turn1)
		if r1.Choices[0].Message.Content != "Hello, world!" || r1.Usage.PromptDetails == nil || r1.Usage.PromptDetails.CachedTokens != 0 {
			t.Fatalf("first turn: %+v", r1)
		}
		before := fake.appends.Load()
		r2 := chatCached(t, ts.URL, turn2)
		want := userPromptLen(2) + 13
		if r2.Usage.PromptDetails == nil || r2.Usage.PromptDetails.CachedTokens != want || r2.Timings.CachedTokens != want {
			t.Errorf("second turn: usage %+v, timings %+v; want %d cached tokens", r2.Usage, r2.Timings, want)
		}
		if r2.Choices[0].Message.Content != "Hello, world!" {
			t.Errorf("second turn answered %q", r2.Choices[0].Message.Content)
		}
		// One prefill Append for the new tokens, then one per fed-back token.
		if n := fake.appends.Load() - before; n != int64(r2.Usage.CompletionTokens) {
			t.Errorf("second turn: %d model calls, want %d (one prefill, %d decode steps)", n, r2.Usage.CompletionTokens, r2.Usage.CompletionTokens-1)
		}
		_, m := get(t, ts.URL+"/metrics")
		if v, ok := metricValue(m, "moxie_prompt_cached_tokens_total"); !ok || int(v) != want {
			t.Errorf("moxie_prompt_cached_tokens_total %v (present %v), want %d", v, ok, want)
		}
		if s.cache.Len() != 1 {
			t.Errorf("%d cached sequences, want 1", s.cache.Len())
		}
		if err := s.Close(); err != nil || s.cache.Len() != 0 {
			t.Errorf("Close: %v, %d cached sequences left", err, s.cache.Len())
		}
	})
	t.Run("thinking: continued from the copy before <think>", func(t *testing.T) {
		// The template drops earlier reasoning, so the second prompt leaves
		// the first one at its last token (<think>): the copy of the
		// sequence from before it is continued.
		_, ts := testServer(t, Config{DefaultThinking: true}, newFake())
		chatCached(t, ts.URL, turn1)
		if r := chatCached(t, ts.URL, turn2); r.Usage.PromptDetails == nil || r.Usage.PromptDetails.CachedTokens != userPromptLen(2)-1 {
			t.Errorf("second thinking turn: usage %+v, want %d cached tokens", r.Usage, userPromptLen(2)-1)
		}
	})
	t.Run("disabled", func(t *testing.T) {
		s, ts := testServer(t, Config{PromptCache: -1}, newFake())
		chatCached(t, ts.URL, turn1)
		r := chatCached(t, ts.URL, turn2)
		if r.Usage.PromptDetails != nil || r.Timings.CachedTokens != 0 || s.cache != nil {
			t.Errorf("with the cache off: usage %+v, timings %+v", r.Usage, r.Timings)
		}
	})
}
