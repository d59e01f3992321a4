package server

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestLoad runs many concurrent streaming clients against a live server on
// loopback serving the fake model, for a bounded number of requests, and
// checks that every request succeeds, that goroutines return to their
// baseline afterwards and that the heap in use stays flat. It logs requests/s,
// latency percentiles, goroutines and heap. Skipped with -short.
func TestLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("load test skipped in -short mode")
	}
	const clients, perClient = 64, 20
	s := newServer(t, Config{Concurrency: 8, QueueSize: clients}, newFake())
	url, stop := serveOn(t, s)
	tr := &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients}
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}

	// one streaming request; returns the content it read.
	streamOnce := func() (string, error) {
		resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(hiStream))
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			return "", fmt.Errorf("status %d", resp.StatusCode)
		}
		sc := bufio.NewScanner(resp.Body)
		var content strings.Builder
		done := false
		for sc.Scan() {
			line := sc.Text()
			if line == "data: [DONE]" {
				done = true
				continue
			}
			if i := strings.Index(line, `"content":"`); i >= 0 {
				rest := line[i+len(`"content":"`):]
				content.WriteString(rest[:strings.IndexByte(rest, '"')])
			}
		}
		if err := sc.Err(); err != nil {
			return "", err
		}
		if !done {
			return "", fmt.Errorf("no [DONE]")
		}
		return content.String(), nil
	}

	// Warm up (connection pool, lazily started runtime goroutines), then
	// take the baselines.
	for range 2 {
		if _, err := streamOnce(); err != nil {
			t.Fatal(err)
		}
	}
	tr.CloseIdleConnections()
	time.Sleep(50 * time.Millisecond)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()

	var mu sync.Mutex
	var lat []time.Duration
	var errs []error
	var wg sync.WaitGroup
	deadline := time.Now().Add(60 * time.Second)
	start := time.Now()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perClient {
				if time.Now().After(deadline) {
					return
				}
				t0 := time.Now()
				content, err := streamOnce()
				d := time.Since(t0)
				if err == nil && content != "Hello, world!" {
					err = fmt.Errorf("content %q", content)
				}
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					lat = append(lat, d)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if len(errs) > 0 {
		t.Fatalf("%d of %d requests failed, first: %v", len(errs), len(errs)+len(lat), errs[0])
	}
	if len(lat) != clients*perClient {
		t.Errorf("%d requests completed, want %d (time bound hit?)", len(lat), clients*perClient)
	}

	tr.CloseIdleConnections()
	var g1 int
	for wait := time.Now().Add(5 * time.Second); ; {
		g1 = runtime.NumGoroutine()
		if g1 <= g0 || time.Now().After(wait) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	slices.Sort(lat)
	pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	t.Logf("%d streaming requests from %d clients in %v: %.0f req/s, latency p50 %v p99 %v max %v",
		len(lat), clients, elapsed.Round(time.Millisecond), float64(len(lat))/elapsed.Seconds(), pct(0.50), pct(0.99), lat[len(lat)-1])
	t.Logf("goroutines before %d after %d; heap in use before %.1f MiB after %.1f MiB",
		g0, g1, float64(before.HeapInuse)/(1<<20), float64(after.HeapInuse)/(1<<20))
	if g1 > g0 {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines leaked: %d before, %d after\n%s", g0, g1, buf[:runtime.Stack(buf, true)])
	}
	const heapSlack = 16 << 20
	if after.HeapInuse > before.HeapInuse+heapSlack {
		t.Errorf("heap in use grew from %d to %d bytes (slack %d)", before.HeapInuse, after.HeapInuse, heapSlack)
	}
	if s.waiting.Load() != 0 || len(s.slots) != 0 {
		t.Errorf("after load: %d waiting, %d slots held", s.waiting.Load(), len(s.slots))
	}
	if err := stop(); err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// BenchmarkStreamingChat measures one streaming chat request over loopback
// against the fake model (14 generated tokens, so the figure is the server's
// per-request overhead: parsing, template, SSE framing, flushes).
func BenchmarkStreamingChat(b *testing.B) {
	s, err := New(Config{}, Backend{Name: "moxie-test", Model: newFake(), Tokenizer: FromTokenizer(tinyTokenizer(b)),
		Chat: DeepSeekV4Chat(tinyTokenizer(b)), StopTokens: []int{idEOS}})
	if err != nil {
		b.Fatal(err)
	}
	ts := httptest.NewServer(s)
	defer ts.Close()
	client := ts.Client()
	b.ReportAllocs()
	for b.Loop() {
		resp, err := client.Post(ts.URL+"/v1/chat/completions", "application/json", strings.NewReader(hiStream))
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || n == 0 {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/14, "ns/token")
}
