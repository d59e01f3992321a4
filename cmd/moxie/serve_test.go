package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// lockedBuffer is a bytes.Buffer safe for the server's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestServeFlags(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		help    bool
		mention string
	}{
		{"help", []string{"--help"}, true, "/v1/chat/completions"},
		{"zero concurrency", []string{"--concurrency", "0"}, false, "--concurrency"},
		{"negative queue", []string{"--queue", "-1"}, false, "--queue"},
		{"bad addr", []string{"--addr", "nowhere"}, false, "--addr"},
		{"stray argument", []string{"synth:tiny"}, false, "--model"},
		{"unknown flag", []string{"--port", "1"}, false, "port"},
		{"negative keep-alive", []string{"--keep-alive", "-1s"}, false, "--keep-alive"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb lockedBuffer
			err := serve(context.Background(), tc.args, &out, &errb, nil)
			if tc.help {
				if !errors.Is(err, flag.ErrHelp) || !strings.Contains(errb.String(), tc.mention) || !strings.Contains(errb.String(), "--api-key") {
					t.Errorf("help: err %v, output:\n%s", err, errb.String())
				}
				return
			}
			var ue usageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error()+errb.String(), tc.mention) {
				t.Errorf("err %v (stderr %q), want a usage error mentioning %q", err, errb.String(), tc.mention)
			}
		})
	}
	t.Run("unknown model", func(t *testing.T) {
		var out, errb lockedBuffer
		if err := serve(context.Background(), []string{"--model", t.TempDir() + "/none", "--addr", "127.0.0.1:0"}, &out, &errb, nil); err == nil {
			t.Error("serving a missing directory succeeded")
		}
	})
}

// TestServeTinyModel serves the real synth:tiny model, answers a completion
// and shuts down cleanly when its context is cancelled.
// startServe runs moxie serve with args (and --addr 127.0.0.1:0) and
// returns its address, its stdout and stderr, and stop, which cancels it
// and checks that it returned nil.
func startServe(t *testing.T, args ...string) (addr string, out, errb *lockedBuffer, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, errb = &lockedBuffer{}, &lockedBuffer{}
	addrc := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- serve(ctx, append(args, "--addr", "127.0.0.1:0"), out, errb, func(a string) { addrc <- a })
	}()
	select {
	case addr = <-addrc:
	case err := <-errc:
		cancel()
		t.Fatalf("serve: %v\n%s", err, errb.String())
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatal("server did not start")
	}
	stop = func() {
		t.Helper()
		cancel()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("serve returned %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("serve did not stop")
		}
	}
	return addr, out, errb, stop
}

func TestServeTinyModel(t *testing.T) {
	addr, out, errb, stop := startServe(t, "--model", "synth:tiny", "--api-key", "k", "--quiet")
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/completions",
		strings.NewReader(`{"model":"synth:tiny","prompt":"Hi","max_tokens":4,"temperature":0}`))
	req.Header.Set("Authorization", "Bearer k")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var r struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(body, &r) != nil || len(r.Choices) != 1 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	// "Hi" is two byte tokens in the tiny vocabulary; 4 tokens were asked
	// for and random weights rarely pick EOS first.
	if r.Usage.PromptTokens != 2 {
		t.Errorf("usage: %s", body)
	}
	// Chat goes through the DeepSeek-V4 template: "Hi" from the user is
	// BOS, <｜User｜>, H, i, <｜Assistant｜>, </think>.
	req, _ = http.NewRequest("POST", "http://"+addr+"/v1/chat/completions",
		strings.NewReader(`{"model":"synth:tiny","messages":[{"role":"user","content":"Hi"}],"max_tokens":3,"temperature":0}`))
	req.Header.Set("Authorization", "Bearer k")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || json.Unmarshal(body, &r) != nil || r.Usage.PromptTokens != 6 {
		t.Errorf("chat: status %d: %s", resp.StatusCode, body)
	}
	if !strings.Contains(errb.String(), "synthetic model") {
		t.Errorf("no synthetic-model note on stderr: %q", errb.String())
	}
	stop()
	if !strings.Contains(out.String(), "moxie serve: stopped") {
		t.Errorf("stdout: %q", out.String())
	}
}

// TestRunServeSignal sends SIGTERM to the test process while runServe is
// serving: it must stop gracefully and return nil.
func TestRunServeSignal(t *testing.T) {
	var out, errb lockedBuffer
	errc := make(chan error, 1)
	go func() {
		errc <- runServe([]string{"--addr", "127.0.0.1:0", "--quiet"}, nil, &out, &errb)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(out.String(), "on http://") {
		if time.Now().After(deadline) {
			t.Fatalf("server did not start: %s %s", out.String(), errb.String())
		}
		select {
		case err := <-errc:
			t.Fatalf("runServe returned early: %v\n%s", err, errb.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Errorf("runServe: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("runServe did not stop on SIGTERM")
	}
	if !strings.Contains(out.String(), "moxie serve: stopped") || !strings.Contains(errb.String(), "shutting down") {
		t.Errorf("stdout %q stderr %q", out.String(), errb.String())
	}
}

// TestServeDiskCache: with --cache-dir, a chat request whose system prompt
// an earlier one had (in this server, or in one before a restart) reuses
// that part of the prompt (usage.prompt_tokens_details.cached_tokens).
func TestServeDiskCache(t *testing.T) {
	dir := t.TempDir()
	sys := strings.Repeat("You answer in one short sentence. ", 4)
	var lastAddr string
	// start runs a server on the cache directory and returns its chat
	// function (the cached tokens of a request) and its stop.
	start := func() (func(user string) (prompt, cached int), func()) {
		addr, _, _, stop := startServe(t, "--model", "synth:tiny", "--quiet", "--cache-dir", dir)
		lastAddr = addr
		chat := func(user string) (int, int) {
			body, _ := json.Marshal(map[string]any{"model": "synth:tiny", "max_tokens": 2, "temperature": 0,
				"messages": []map[string]string{{"role": "system", "content": sys}, {"role": "user", "content": user}}})
			resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var r struct {
				Usage struct {
					PromptTokens int `json:"prompt_tokens"`
					Details      struct {
						Cached int `json:"cached_tokens"`
					} `json:"prompt_tokens_details"`
				} `json:"usage"`
			}
			if resp.StatusCode != 200 || json.Unmarshal(b, &r) != nil {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			return r.Usage.PromptTokens, r.Usage.Details.Cached
		}
		return chat, stop
	}
	chat, stop := start()
	p1, c1 := chat("Hi")
	p2, c2 := chat("Yo")
	stop()
	// BOS and the system text: all but <｜User｜>, H, i, <｜Assistant｜>,
	// </think> (the tiny vocabulary spells text byte by byte).
	want := p1 - 5
	if c1 != 0 || c2 != want || p2 != p1 {
		t.Errorf("first server: cached %d then %d of %d and %d prompt tokens; want 0 then %d", c1, c2, p1, p2, want)
	}
	chat, stop = start()
	defer stop()
	if p, c := chat("Hey"); c != want {
		t.Errorf("after a restart: cached %d of %d prompt tokens, want %d", c, p, want)
	}
	resp, err := http.Get("http://" + lastAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range []string{fmt.Sprintf("moxie_prompt_disk_cached_tokens_total %d\n", want), "moxie_prompt_disk_restores_total 1\n"} {
		if !strings.Contains(string(b), line) {
			t.Errorf("/metrics lacks %q", line)
		}
	}
}
