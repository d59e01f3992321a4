package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const hiBody = `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}]}`
const hiStream = `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}],"stream":true}`

// metricValue reads one sample from a /metrics body; ok is false when absent.
func metricValue(body, sample string) (float64, bool) {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

// waitFor polls cond every 5ms for up to 5s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestQueueFull(t *testing.T) {
	fake := newFake()
	fake.block = make(chan struct{})
	s, ts := testServer(t, Config{Concurrency: 1, QueueSize: 1, RetryAfter: 2500 * time.Millisecond}, fake)

	type result struct {
		status int
		body   string
	}
	results := make(chan result, 2)
	go func() { // A: runs, blocks in decode
		st, b, _ := doPost(ts.URL+"/v1/chat/completions", hiBody)
		results <- result{st, b}
	}()
	<-fake.started
	go func() { // B: waits in the queue
		st, b, _ := doPost(ts.URL+"/v1/chat/completions", hiBody)
		results <- result{st, b}
	}()
	waitFor(t, "B queued", func() bool { return s.waiting.Load() == 1 })

	_, m := get(t, ts.URL+"/metrics")
	if v, _ := metricValue(m, "moxie_queue_depth"); v != 1 {
		t.Errorf("queue depth %v, want 1", v)
	}
	if v, _ := metricValue(m, "moxie_inflight_requests"); v != 1 {
		t.Errorf("in flight %v, want 1", v)
	}

	// C: queue full.
	resp, body := post(t, ts.URL+"/v1/chat/completions", hiBody)
	if resp.StatusCode != 503 {
		t.Fatalf("C: status %d, want 503: %s", resp.StatusCode, body)
	}
	if ra := resp.Header.Get("Retry-After"); ra != "3" {
		t.Errorf("Retry-After %q, want 3 (2.5s rounded up)", ra)
	}
	checkAPIError(t, body, "", "queue_full", "busy")
	// Validation happens before queueing: a bad request still gets its 400.
	if resp, _ := post(t, ts.URL+"/v1/chat/completions", `{"model":"x"}`); resp.StatusCode != 404 {
		t.Errorf("bad request while full: %d", resp.StatusCode)
	}

	close(fake.block)
	for range 2 {
		r := <-results
		if r.status != 200 || !strings.Contains(r.body, "Hello, world!") {
			t.Errorf("queued request: %d %s", r.status, r.body)
		}
	}
	if s.waiting.Load() != 0 || len(s.slots) != 0 {
		t.Errorf("after: %d waiting, %d slots held", s.waiting.Load(), len(s.slots))
	}
}

func TestQueueZeroRejectsAtOnce(t *testing.T) {
	fake := newFake()
	fake.block = make(chan struct{})
	_, ts := testServer(t, Config{Concurrency: 1, QueueSize: 0}, fake)
	done := make(chan struct{})
	go func() {
		doPost(ts.URL+"/v1/chat/completions", hiBody)
		close(done)
	}()
	<-fake.started
	resp, body := post(t, ts.URL+"/v1/chat/completions", hiBody)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("status %d Retry-After %q: %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	close(fake.block)
	<-done
}

// streamUntilFirstEvent opens a streaming request and returns after reading
// its first event; cancel disconnects the client.
func streamUntilFirstEvent(t *testing.T, url, body string) (cancel func(), rest *bufio.Reader) {
	t.Helper()
	ctx, cancelCtx := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancelCtx()
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		cancelCtx()
		t.Fatalf("status %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		cancelCtx()
		t.Fatalf("first line %q %v", line, err)
	}
	return func() { cancelCtx(); resp.Body.Close() }, br
}

func TestDisconnectCancels(t *testing.T) {
	t.Run("streaming", func(t *testing.T) {
		fake := newFake()
		// The prefill never proceeds on its own, so nothing is written
		// between the first (role) event and the disconnect.
		fake.block, fake.blockPrefill = make(chan struct{}), true
		s, ts := testServer(t, Config{Concurrency: 1}, fake)
		cancel, _ := streamUntilFirstEvent(t, ts.URL+"/v1/chat/completions", hiStream)
		<-fake.started // the prefill is running (the role event comes before it)
		cancel()
		select {
		case <-fake.seen:
		case <-time.After(5 * time.Second):
			t.Fatal("the model never saw the cancellation")
		}
		waitFor(t, "slot released", func() bool { return len(s.slots) == 0 })
		_, m := get(t, ts.URL+"/metrics")
		if v, _ := metricValue(m, "moxie_client_disconnects_total"); v != 1 {
			t.Errorf("client disconnects %v, want 1", v)
		}
		if v, _ := metricValue(m, `moxie_generations_total{reason="cancelled"}`); v != 1 {
			t.Errorf("cancelled generations %v, want 1", v)
		}
		// The slot is free again: a new request runs.
		close(fake.block)
		if resp, b := post(t, ts.URL+"/v1/chat/completions", hiBody); resp.StatusCode != 200 {
			t.Errorf("next request: %d %s", resp.StatusCode, b)
		}
	})
	t.Run("non-streaming", func(t *testing.T) {
		fake := newFake()
		// Block from the prefill on: the cancellation reaches the model
		// however fast it propagates.
		fake.block, fake.blockPrefill = make(chan struct{}), true
		_, ts := testServer(t, Config{Concurrency: 1}, fake)
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/chat/completions", strings.NewReader(hiBody))
			_, err := http.DefaultClient.Do(req)
			errc <- err
		}()
		<-fake.started
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("client error %v", err)
		}
		select {
		case <-fake.seen:
		case <-time.After(5 * time.Second):
			t.Fatal("the model never saw the cancellation")
		}
	})
	t.Run("while queued", func(t *testing.T) {
		fake := newFake()
		fake.block = make(chan struct{})
		s, ts := testServer(t, Config{Concurrency: 1, QueueSize: 4}, fake)
		go doPost(ts.URL+"/v1/chat/completions", hiBody)
		<-fake.started
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/chat/completions", strings.NewReader(hiBody))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		waitFor(t, "queued", func() bool { return s.waiting.Load() == 1 })
		cancel()
		waitFor(t, "left the queue", func() bool { return s.waiting.Load() == 0 })
		close(fake.block)
	})
}

func TestPanicRecovered(t *testing.T) {
	fake := newFake()
	fake.panicOnAppend = true
	_, ts := testServer(t, Config{}, fake)
	resp, body := post(t, ts.URL+"/v1/chat/completions", hiBody)
	if resp.StatusCode != 500 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	checkAPIError(t, body, "", "internal_error", "internal error")
	fake.panicOnAppend = false
	if resp, _ := post(t, ts.URL+"/v1/chat/completions", hiBody); resp.StatusCode != 200 {
		t.Errorf("server unusable after a panic: %d", resp.StatusCode)
	}
}

// promLine is one sample line of the text exposition format.
var promLine = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? -?[0-9.eE+\-]+$|^[a-zA-Z_:][a-zA-Z0-9_:]* (NaN|\+Inf|-Inf)$`)

func TestMetrics(t *testing.T) {
	gauges := func() []Gauge {
		return []Gauge{
			{Name: "moxie_expert_hit_rate", Help: "Expert cache hits / lookups.", Value: 0.75},
			{Name: "moxie_memory_bytes", Help: "Memory in use.", Labels: map[string]string{"tier": "gpu"}, Value: 1.5e9},
			{Name: "moxie_memory_bytes", Labels: map[string]string{"tier": `host "dram"`}, Value: 2e9},
			{Name: "bad name!", Value: 1},
		}
	}
	_, ts := testServer(t, Config{Gauges: gauges}, newFake())
	post(t, ts.URL+"/v1/chat/completions", hiBody)
	post(t, ts.URL+"/v1/chat/completions", `{"model":"moxie-test","messages":[{"role":"user","content":"Hi"}],"max_tokens":3}`)
	post(t, ts.URL+"/v1/chat/completions", `{"model":"nope","messages":[]}`)
	get(t, ts.URL+"/nowhere")
	resp, body := get(t, ts.URL+"/metrics")
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4") {
		t.Fatalf("status %d type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	for _, line := range strings.Split(strings.TrimSuffix(body, "\n"), "\n") {
		if strings.HasPrefix(line, "# HELP ") || strings.HasPrefix(line, "# TYPE ") {
			continue
		}
		if !promLine.MatchString(line) {
			t.Errorf("not a valid sample line: %q", line)
		}
	}
	want := map[string]float64{
		`moxie_http_requests_total{endpoint="/v1/chat/completions",code="200"}`: 2,
		`moxie_http_requests_total{endpoint="/v1/chat/completions",code="404"}`: 1,
		`moxie_http_requests_total{endpoint="other",code="404"}`:                1,
		`moxie_generations_total{reason="stop"}`:                                1,
		`moxie_generations_total{reason="length"}`:                              1,
		`moxie_prompt_tokens_total`:                                             2 * float64(userPromptLen(2)),
		`moxie_generated_tokens_total`:                                          14 + 3,
		`moxie_queue_depth`:                                                     0,
		`moxie_inflight_requests`:                                               0,
		`moxie_concurrency_limit`:                                               1,
		`moxie_expert_hit_rate`:                                                 0.75,
		`moxie_memory_bytes{tier="gpu"}`:                                        1.5e9,
		`moxie_memory_bytes{tier="host \"dram\""}`:                              2e9,
		`moxie_time_to_first_token_seconds_count`:                               2,
		`moxie_time_to_first_token_seconds_bucket{le="+Inf"}`:                   2,
		`moxie_generation_duration_seconds_count`:                               2,
	}
	for sample, v := range want {
		got, ok := metricValue(body, sample)
		if !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", sample, got, ok, v)
		}
	}
	for _, positive := range []string{"moxie_decode_tokens_per_second", "moxie_prefill_tokens_per_second", "moxie_time_to_first_token_seconds_sum", "moxie_decode_seconds_total"} {
		if v, ok := metricValue(body, positive); !ok || v <= 0 {
			t.Errorf("%s = %v, want > 0", positive, v)
		}
	}
	// Buckets are cumulative and end at the count.
	var prev float64
	for _, b := range latencyBuckets {
		v, ok := metricValue(body, `moxie_time_to_first_token_seconds_bucket{le="`+fmtFloat(b)+`"}`)
		if !ok || v < prev || v > 2 {
			t.Errorf("bucket le=%g: %v (present %v) after %v", b, v, ok, prev)
		}
		prev = v
	}
	if strings.Contains(body, "bad name") {
		t.Error("an invalid gauge name was exported")
	}
	if n := strings.Count(body, "# TYPE moxie_memory_bytes gauge"); n != 1 {
		t.Errorf("moxie_memory_bytes has %d TYPE lines, want 1", n)
	}
}

// serveOn starts s.Serve on a loopback listener; stop cancels its context and
// returns Serve's result.
func serveOn(t *testing.T, s *Server) (url string, stop func() error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(ctx, ln) }()
	var once sync.Once
	var res error
	stop = func() error {
		once.Do(func() { cancel(); res = <-errc })
		return res
	}
	t.Cleanup(func() { stop() })
	return "http://" + ln.Addr().String(), stop
}

func newServer(t *testing.T, cfg Config, fake *fakeModel) *Server {
	t.Helper()
	s, err := New(cfg, Backend{Name: "moxie-test", Model: fake, Tokenizer: FromTokenizer(tinyTokenizer(t)),
		Chat: DeepSeekV4Chat(tinyTokenizer(t)), StopTokens: []int{idEOS}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestGracefulShutdown(t *testing.T) {
	t.Run("in-flight request finishes within the grace period", func(t *testing.T) {
		fake := newFake()
		fake.step = 20 * time.Millisecond // ~14 tokens: ~300ms
		s := newServer(t, Config{ShutdownGrace: 10 * time.Second}, fake)
		url, stop := serveOn(t, s)
		_, rest := streamUntilFirstEvent(t, url+"/v1/chat/completions", hiStream)
		start := time.Now()
		stopped := make(chan error, 1)
		go func() { stopped <- stop() }()
		tail, err := io.ReadAll(rest)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(string(tail), "data: [DONE]\n\n") || !strings.Contains(string(tail), `"finish_reason":"stop"`) {
			t.Errorf("stream did not finish normally: %q", tail)
		}
		if err := <-stopped; err != nil {
			t.Errorf("Serve returned %v", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("shutdown took %v", d)
		}
		if _, err := http.Get(url + "/health"); err == nil {
			t.Error("server still accepts connections after shutdown")
		}
	})
	t.Run("request past the grace period is cancelled", func(t *testing.T) {
		fake := newFake()
		fake.block, fake.blockPrefill = make(chan struct{}), true // never finishes on its own
		s := newServer(t, Config{ShutdownGrace: 100 * time.Millisecond}, fake)
		url, stop := serveOn(t, s)
		_, rest := streamUntilFirstEvent(t, url+"/v1/chat/completions", hiStream)
		<-fake.started
		start := time.Now()
		if err := stop(); err != nil {
			t.Errorf("Serve returned %v", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("shutdown took %v", d)
		}
		select {
		case <-fake.seen:
		default:
			t.Error("the model never saw the cancellation")
		}
		tail, _ := io.ReadAll(rest)
		if !strings.Contains(string(tail), `"code":"shutting_down"`) {
			t.Errorf("stream tail %q lacks the shutdown error", tail)
		}
	})
	t.Run("draining answers 503", func(t *testing.T) {
		fake := newFake()
		s := newServer(t, Config{}, fake)
		s.draining.Store(true)
		h := httptestRecorder(s, "POST", "/v1/chat/completions", hiBody)
		if h.Code != 503 || h.Header().Get("Retry-After") == "" {
			t.Errorf("chat while draining: %d", h.Code)
		}
		if h := httptestRecorder(s, "GET", "/health", ""); h.Code != 503 {
			t.Errorf("health while draining: %d", h.Code)
		}
	})
}

func TestKeepAlive(t *testing.T) {
	fake := newFake()
	fake.prefillDelay = 300 * time.Millisecond
	_, ts := testServer(t, Config{KeepAlive: 20 * time.Millisecond}, fake)
	resp, body := post(t, ts.URL+"/v1/chat/completions", hiStream)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// The comments come during the prefill: after the role event, before
	// any content; the stream is otherwise intact.
	first := strings.Index(body, ": keep-alive\n\n")
	content := strings.Index(body, `"content":"H"`)
	if first < 0 || content < 0 || first > content {
		t.Errorf("keep-alive at %d, first content at %d:\n%s", first, content, body)
	}
	if n := strings.Count(body, ": keep-alive"); n < 3 {
		t.Errorf("%d keep-alive comments in a 300ms prefill at 20ms", n)
	}
	var text strings.Builder
	for _, ev := range sseEvents(t, body) {
		var c chatResp
		_ = json.Unmarshal([]byte(ev), &c)
		if len(c.Choices) > 0 && c.Choices[0].Delta.Content != nil {
			text.WriteString(*c.Choices[0].Delta.Content)
		}
	}
	if text.String() != "Hello, world!" {
		t.Errorf("content %q", text.String())
	}
	// Non-streaming responses get no comments.
	_, body = post(t, ts.URL+"/v1/chat/completions", hiBody)
	if strings.Contains(body, "keep-alive") {
		t.Errorf("keep-alive in a JSON response: %s", body)
	}
}
