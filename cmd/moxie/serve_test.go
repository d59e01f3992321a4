package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
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
func TestServeTinyModel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb lockedBuffer
	addrc := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- serve(ctx, []string{"--model", "synth:tiny", "--addr", "127.0.0.1:0", "--api-key", "k", "--quiet"}, &out, &errb, func(a string) { addrc <- a })
	}()
	var addr string
	select {
	case addr = <-addrc:
	case err := <-errc:
		t.Fatalf("serve: %v\n%s", err, errb.String())
	case <-time.After(60 * time.Second):
		t.Fatal("server did not start")
	}
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
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Errorf("serve returned %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop")
	}
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
