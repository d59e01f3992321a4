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
// loopback serving the fake model, two rounds of a bounded number of requests,
// and checks that every request succeeds, that goroutines return to their
// baseline after each round and that the heap in use stays flat. It logs
// requests/s, latency percentiles, goroutines and heap. Skipped with -short.
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
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()

	// round runs clients x perClient requests and returns the latencies.
	round := func() ([]time.Duration, time.Duration) {
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
		return lat, elapsed
	}
	// settle closes idle connections, waits for the goroutine count to come
	// back to g0 (up to 5s), and returns it with the heap in use after GC.
	settle := func() (int, uint64) {
		tr.CloseIdleConnections()
		var g int
		for wait := time.Now().Add(5 * time.Second); ; {
			g = runtime.NumGoroutine()
			if g <= g0 || time.Now().After(wait) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return g, ms.HeapInuse
	}
	mib := func(b uint64) float64 { return float64(b) / (1 << 20) }
	var heaps []uint64
	for r := 1; r <= 2; r++ {
		lat, elapsed := round()
		g, heap := settle()
		heaps = append(heaps, heap)
		slices.Sort(lat)
		pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
		t.Logf("round %d: %d streaming requests from %d clients in %v: %.0f req/s, latency p50 %v p99 %v max %v; goroutines %d (baseline %d); heap in use %.1f MiB (baseline %.1f MiB)",
			r, len(lat), clients, elapsed.Round(time.Millisecond), float64(len(lat))/elapsed.Seconds(),
			pct(0.50), pct(0.99), lat[len(lat)-1], g, g0, mib(heap), mib(before.HeapInuse))
		if g > g0 {
			buf := make([]byte, 1<<20)
			t.Fatalf("goroutines leaked: %d before, %d after round %d\n%s", g0, g, r, buf[:runtime.Stack(buf, true)])
		}
	}
	// Flat: the second round (same work, pools already warm) adds no more
	// than noise, and nothing grows far beyond the start.
	const roundSlack, totalSlack = 4 << 20, 16 << 20
	if heaps[1] > heaps[0]+roundSlack {
		t.Errorf("heap in use grew from %.1f MiB after round 1 to %.1f MiB after round 2", mib(heaps[0]), mib(heaps[1]))
	}
	if heaps[1] > before.HeapInuse+totalSlack {
		t.Errorf("heap in use grew from %.1f MiB to %.1f MiB", mib(before.HeapInuse), mib(heaps[1]))
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
