package server

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

type timingsResp struct {
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Choices []struct {
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Timings *struct {
		PromptTokens           int     `json:"prompt_tokens"`
		PrefillMS              float64 `json:"prefill_ms"`
		PrefillTokensPerSecond float64 `json:"prefill_tokens_per_second"`
		TimeToFirstTokenMS     float64 `json:"time_to_first_token_ms"`
		GeneratedTokens        int     `json:"generated_tokens"`
		DecodeMS               float64 `json:"decode_ms"`
		DecodeTokensPerSecond  float64 `json:"decode_tokens_per_second"`
	} `json:"timings"`
}

func TestTimings(t *testing.T) {
	fake := newFake()
	fake.step = 2 * time.Millisecond // every Append, the prefill included
	_, ts := testServer(t, Config{}, fake)
	check := func(t *testing.T, tm *timingsResp, generated int) {
		t.Helper()
		g := tm.Timings
		if g == nil {
			t.Fatal("no timings")
		}
		if g.PromptTokens != userPromptLen(2) || g.GeneratedTokens != generated {
			t.Errorf("timings counts %+v", g)
		}
		// The fake sleeps 2ms per Append: the prefill is one Append, the
		// decode generated-1 of them.
		if g.PrefillMS < 2 || g.TimeToFirstTokenMS < g.PrefillMS || g.DecodeMS < 2*float64(generated-1) {
			t.Errorf("timings durations %+v", g)
		}
		// Rates follow from counts and durations (to the rounding of ms).
		if want := float64(g.PromptTokens) / (g.PrefillMS / 1000); g.PrefillTokensPerSecond < want*0.99 || g.PrefillTokensPerSecond > want*1.01 {
			t.Errorf("prefill rate %v, want about %v", g.PrefillTokensPerSecond, want)
		}
		if want := float64(g.GeneratedTokens-1) / (g.DecodeMS / 1000); g.DecodeTokensPerSecond < want*0.99 || g.DecodeTokensPerSecond > want*1.01 {
			t.Errorf("decode rate %v, want about %v", g.DecodeTokensPerSecond, want)
		}
	}
	t.Run("response", func(t *testing.T) {
		_, body := post(t, ts.URL+"/v1/chat/completions", hiBody)
		var r timingsResp
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			t.Fatal(err)
		}
		check(t, &r, 14)
	})
	t.Run("stream finish chunk", func(t *testing.T) {
		_, body := post(t, ts.URL+"/v1/chat/completions", strings.Replace(hiStream, `"stream":true`, `"stream":true,"stream_options":{"include_usage":true}`, 1))
		n := 0
		for _, ev := range sseEvents(t, body) {
			var r timingsResp
			_ = json.Unmarshal([]byte(ev), &r)
			if r.Timings == nil {
				continue
			}
			n++
			if len(r.Choices) != 1 || r.Choices[0].FinishReason == nil {
				t.Errorf("timings outside the finish chunk: %s", ev)
			}
			check(t, &r, 14)
		}
		if n != 1 {
			t.Errorf("%d chunks with timings, want 1", n)
		}
	})
}

func TestNoHTMLEscaping(t *testing.T) {
	fake := newFake()
	fake.answer = "a<b>&c"
	_, ts := testServer(t, Config{}, fake)
	for _, body := range []string{hiBody, hiStream} {
		_, b := post(t, ts.URL+"/v1/chat/completions", body)
		if strings.Contains(b, `\u003c`) || strings.Contains(b, `\u0026`) {
			t.Errorf("HTML-escaped JSON: %s", b)
		}
	}
	_, b := post(t, ts.URL+"/v1/chat/completions", hiBody)
	if !strings.Contains(b, `"content":"a<b>&c"`) {
		t.Errorf("content not verbatim: %s", b)
	}
}
