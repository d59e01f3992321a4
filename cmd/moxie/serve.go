package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"moxie/checkpoint"
	"moxie/server"
)

const serveAbout = `
Serve MODEL over an OpenAI-compatible HTTP API, and Anthropic's Messages API:

  POST /v1/chat/completions   chat (set "stream": true for server-sent events)
  POST /v1/completions        raw prompt -> text
  POST /v1/messages           Anthropic Messages (thinking, tool use, streaming)
  POST /v1/messages/count_tokens
  GET  /v1/models             the served model
  GET  /health                liveness (503 while shutting down)
  GET  /metrics               Prometheus metrics

Thinking mode: send "thinking": {"type": "enabled"} or "reasoning_effort":
"high"; the reasoning comes back in reasoning_content, apart from content.
Tool calling: "tools" are described to the model in DeepSeek's DSML format
and its calls come back as tool_calls.

Requests beyond --concurrency wait in a queue of --queue; when it is full the
server answers 503 with Retry-After. SIGINT or SIGTERM stop accepting
requests, let running ones finish for --grace, then cancel them and exit; a
second signal exits at once.

The server binds to loopback by default. Before binding to another address set
--api-key (or MOXIE_API_KEY): clients then send "Authorization: Bearer KEY"
(or "x-api-key: KEY", as Anthropic's clients do).

Example:
  moxie serve --model synth:tiny
  curl -s localhost:8080/v1/chat/completions \
    -d '{"model":"synth:tiny","messages":[{"role":"user","content":"Hi"}],"max_tokens":8}'`

func runServe(args []string, _ io.Reader, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// After the first signal, restore the default handling: a second one
	// ends the process at once instead of waiting for the grace period.
	announced := make(chan struct{})
	unannounce := context.AfterFunc(ctx, func() {
		stop()
		fmt.Fprintln(stderr, "moxie serve: shutting down (signal again to exit at once)")
		close(announced)
	})
	err := serve(ctx, args, stdout, stderr, nil)
	// Returning cancels ctx (the deferred stop): the message is for a
	// signal only. If one came, its message runs on its own goroutine: let
	// it finish first.
	if !unannounce() {
		<-announced
	}
	return err
}

// serve is runServe with the stop signal as ctx; ready, if set, is called
// with the listening address once the server accepts connections.
func serve(ctx context.Context, args []string, stdout, stderr io.Writer, ready func(addr string)) error {
	fs := newFlags("serve", "[--model MODEL] [--addr HOST:PORT] [flags]", serveAbout, stderr)
	model := fs.String("model", defaultModel(), "the `MODEL` to serve: a checkpoint directory or synth:PRESET")
	addr := fs.String("addr", "127.0.0.1:8080", "listen address (`HOST:PORT`; port 0 picks a free one)")
	concurrency := fs.Int("concurrency", 1, "generations run at once")
	queue := fs.Int("queue", 16, "requests that may wait for a generation slot (0: none)")
	apiKey := fs.String("api-key", "", "require \"Authorization: Bearer `KEY`\" on every request (default $MOXIE_API_KEY)")
	name := fs.String("name", "", "model id clients must send (default: the MODEL spec, or the directory's base name)")
	maxTokens := fs.Int("max-tokens", 0, "default cap on generated tokens when a request sets none (0: up to the context)")
	thinking := fs.Bool("thinking", false, "use thinking mode for chat requests that do not choose")
	maxBody := fs.Int64("max-body", 8<<20, "largest request body in `BYTES`")
	grace := fs.Duration("grace", 30*time.Second, "how long running requests may finish after SIGINT/SIGTERM")
	keepAlive := fs.Duration("keep-alive", 15*time.Second, "send an SSE comment on streams idle this long, e.g. during a long prefill (0: never)")
	quiet := fs.Bool("quiet", false, "do not log each request")
	promptCache := fs.Int("prompt-cache", 0, "finished sequences kept so that a request whose prompt extends one (a chat's next turn) prefills only its new tokens; each keeps its memory (0: one per --concurrency slot; -1: off)")
	mf := addMemFlags(fs)
	df := addDiskFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usagef("unexpected arguments %q (the model is given with --model)", fs.Args())
	}
	switch {
	case *concurrency < 1:
		return usagef("--concurrency must be at least 1, got %d", *concurrency)
	case *queue < 0:
		return usagef("--queue must be >= 0, got %d", *queue)
	case *maxTokens < 0:
		return usagef("--max-tokens must be >= 0, got %d", *maxTokens)
	case *maxBody < 1:
		return usagef("--max-body must be positive, got %d", *maxBody)
	case *grace <= 0:
		return usagef("--grace must be positive, got %v", *grace)
	case *keepAlive < 0:
		return usagef("--keep-alive must be >= 0, got %v", *keepAlive)
	}
	if *keepAlive == 0 {
		*keepAlive = -1 // server.Config: negative disables
	}
	key := *apiKey
	if key == "" {
		key = os.Getenv("MOXIE_API_KEY")
	}
	host, _, err := net.SplitHostPort(*addr)
	if err != nil {
		return usagef("--addr %q: %v", *addr, err)
	}
	if !isLoopback(host) && key == "" {
		fmt.Fprintf(stderr, "moxie serve: warning: listening on %s without --api-key: anyone who can reach it can use it\n", *addr)
	}

	backend, lm, err := loadServeModel(*model, mf, stderr)
	if err != nil {
		return err
	}
	defer lm.Close()
	if *name != "" {
		backend.Name = *name
	}
	if df.dir != "" && *promptCache < 0 {
		return usagef("--cache-dir needs the prompt cache (--prompt-cache >= 0)")
	}
	dopts, err := df.options(stderr)
	if err != nil {
		return err
	}
	logLevel := slog.LevelInfo
	if *quiet {
		logLevel = slog.LevelWarn
	}
	s, err := server.New(server.Config{
		Concurrency: *concurrency, QueueSize: *queue, APIKey: key, MaxBodyBytes: *maxBody,
		DefaultMaxTokens: *maxTokens, DefaultThinking: *thinking, ShutdownGrace: *grace, KeepAlive: *keepAlive, PromptCache: *promptCache,
		DiskCache: dopts,
		Logger:    slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: logLevel})),
		Gauges:    lm.gauges,
	}, backend)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "moxie serve: model %q on http://%s (concurrency %d, queue %d)\n",
		backend.Name, ln.Addr(), *concurrency, *queue)
	if ready != nil {
		ready(ln.Addr().String())
	}
	if err := s.Serve(ctx, ln); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "moxie serve: stopped")
	return nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// loadServeModel opens MODEL under the memory flags (noting on stderr when it
// is synthetic) and builds what the server needs: the dsv4 model, its
// tokenizer (tokenizer.json and tokenizer_config.json from the checkpoint) and
// EOS as the stop token. Closing the returned model releases everything.
func loadServeModel(spec string, mf *memFlags, stderr io.Writer) (server.Backend, *loadedModel, error) {
	lm, err := loadModel(spec, mf, stderr)
	if err != nil {
		return server.Backend{}, nil, err
	}
	fail := func(err error) (server.Backend, *loadedModel, error) {
		lm.Close()
		return server.Backend{}, nil, err
	}
	tok, err := loadTokenizer(lm)
	if err != nil {
		return fail(err)
	}
	eos, ok := tok.EOS()
	if !ok {
		eos = lm.m.Cfg.EOS
	}
	if eos < 0 || eos >= lm.m.VocabSize() {
		return fail(errors.New("no end-of-sequence token inside the vocabulary"))
	}
	name := spec
	if !strings.HasPrefix(spec, checkpoint.SynthPrefix) {
		name = filepath.Base(filepath.Clean(spec))
	}
	return server.Backend{
		Name:       name,
		Model:      lm.m,
		Tokenizer:  server.FromTokenizer(tok),
		Chat:       server.DeepSeekV4Chat(tok),
		StopTokens: []int{eos},
	}, lm, nil
}
