package server

import (
	"encoding/json"
	"testing"
)

func TestSeededSampling(t *testing.T) {
	fake := newFake()
	fake.flat = true
	_, ts := testServer(t, Config{}, fake)
	complete := func(body string) string {
		t.Helper()
		resp, b := post(t, ts.URL+"/v1/completions", body)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		var r chatResp
		if err := json.Unmarshal([]byte(b), &r); err != nil {
			t.Fatal(err)
		}
		return *r.Choices[0].Text
	}
	const base = `{"model":"moxie-test","prompt":"Once","max_tokens":24`
	a := complete(base + `,"temperature":1,"seed":42}`)
	b := complete(base + `,"temperature":1,"seed":42}`)
	c := complete(base + `,"temperature":1,"seed":43}`)
	if a != b {
		t.Errorf("seed 42 twice: %q vs %q", a, b)
	}
	if a == c {
		t.Errorf("seeds 42 and 43 gave the same text %q", a)
	}
	// Greedy follows the scripted favourite however flat the logits.
	if g := complete(base + `,"temperature":0}`); g != "Hello, world!" {
		t.Errorf("greedy: %q", g)
	}
	// top_k 1 is greedy too, whatever the seed.
	if g := complete(base + `,"temperature":1.5,"top_k":1,"seed":9}`); g != "Hello, world!" {
		t.Errorf("top_k 1: %q", g)
	}
}
