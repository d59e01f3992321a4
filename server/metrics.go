package server

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"moxie/generate"
)

// metrics are the server's counters. Everything is safe for concurrent use.
type metrics struct {
	mu       sync.Mutex
	requests map[[2]string]uint64 // {endpoint, status} -> count
	finished map[string]uint64    // finish reason or "error" -> count

	promptTokens, generatedTokens atomic.Uint64
	cachedTokens                  atomic.Uint64 // prompt tokens a cached sequence already held
	diskTokens, diskRestores      atomic.Uint64 // of those, restored from the prompt cache's disk tier
	clientGone                    atomic.Uint64
	inflight                      atomic.Int64
	// last completed generation's rates, as float64 bits
	lastDecodeRate, lastPrefillRate atomic.Uint64
	decodeSeconds, prefillSeconds   atomic.Uint64 // float64 bits, cumulative
	ttft, duration                  *histogram
}

// latencyBuckets are the upper bounds (seconds) of the latency histograms.
var latencyBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

func newMetrics() *metrics {
	return &metrics{requests: map[[2]string]uint64{}, finished: map[string]uint64{},
		ttft: newHistogram(latencyBuckets), duration: newHistogram(latencyBuckets)}
}

// histogram is a Prometheus histogram with fixed buckets.
type histogram struct {
	mu     sync.Mutex
	bounds []float64
	counts []uint64 // per bucket, not cumulative; the last is +Inf
	sum    float64
	n      uint64
}

func newHistogram(bounds []float64) *histogram {
	return &histogram{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

func (h *histogram) observe(v float64) {
	i, _ := slices.BinarySearch(h.bounds, v) // first bound >= v
	h.mu.Lock()
	h.counts[i]++
	h.sum += v
	h.n++
	h.mu.Unlock()
}

func (h *histogram) write(w io.Writer, name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var cum uint64
	for i, b := range h.bounds {
		cum += h.counts[i]
		fmt.Fprintf(w, "%s_bucket{le=\"%s\"} %d\n", name, fmtFloat(b), cum)
	}
	fmt.Fprintf(w, "%s_bucket{le=\"+Inf\"} %d\n%s_sum %s\n%s_count %d\n", name, h.n, name, fmtFloat(h.sum), name, h.n)
}

func (m *metrics) request(endpoint string, status int) {
	m.mu.Lock()
	m.requests[[2]string{endpoint, strconv.Itoa(status)}]++
	m.mu.Unlock()
}

func addFloat(a *atomic.Uint64, d float64) {
	for {
		old := a.Load()
		if a.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+d)) {
			return
		}
	}
}

// generation records one finished (or failed) generation; reason is its
// finish reason or "error".
func (m *metrics) generation(r generate.Result, reason string) {
	m.promptTokens.Add(uint64(r.PromptTokens))
	m.cachedTokens.Add(uint64(r.CachedTokens))
	if r.CachedFromDisk {
		m.diskTokens.Add(uint64(r.CachedTokens))
		m.diskRestores.Add(1)
	}
	m.generatedTokens.Add(uint64(r.GeneratedTokens))
	m.mu.Lock()
	m.finished[reason]++
	m.mu.Unlock()
	if r.Prefill > 0 {
		addFloat(&m.prefillSeconds, r.Prefill.Seconds())
		m.lastPrefillRate.Store(math.Float64bits(r.PrefillTokensPerSecond()))
	}
	if r.TimeToFirstToken > 0 {
		m.ttft.observe(r.TimeToFirstToken.Seconds())
		m.duration.observe((r.TimeToFirstToken + r.Decode).Seconds())
	}
	if r.Decode > 0 {
		addFloat(&m.decodeSeconds, r.Decode.Seconds())
	}
	if rate := r.DecodeTokensPerSecond(); rate > 0 {
		m.lastDecodeRate.Store(math.Float64bits(rate))
	}
}

var metricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
var labelName = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// escapeLabel escapes a label value for the text exposition format.
func escapeLabel(v string) string {
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`).Replace(v)
}

func fmtFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	s.writeMetrics(w)
}

func (s *Server) writeMetrics(w io.Writer) {
	m := s.m
	head := func(name, typ, help string) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
	}
	m.mu.Lock()
	reqKeys := make([][2]string, 0, len(m.requests))
	for k := range m.requests {
		reqKeys = append(reqKeys, k)
	}
	slices.SortFunc(reqKeys, func(a, b [2]string) int { return strings.Compare(a[0]+" "+a[1], b[0]+" "+b[1]) })
	reqVals := make([]uint64, len(reqKeys))
	for i, k := range reqKeys {
		reqVals[i] = m.requests[k]
	}
	finKeys := make([]string, 0, len(m.finished))
	for k := range m.finished {
		finKeys = append(finKeys, k)
	}
	slices.Sort(finKeys)
	finVals := make([]uint64, len(finKeys))
	for i, k := range finKeys {
		finVals[i] = m.finished[k]
	}
	m.mu.Unlock()

	head("moxie_http_requests_total", "counter", "HTTP requests by endpoint and status code.")
	for i, k := range reqKeys {
		fmt.Fprintf(w, "moxie_http_requests_total{endpoint=%q,code=%q} %d\n", k[0], k[1], reqVals[i])
	}
	head("moxie_generations_total", "counter", "Finished generations by finish reason (stop, length, cancelled, error).")
	for i, k := range finKeys {
		fmt.Fprintf(w, "moxie_generations_total{reason=%q} %d\n", k, finVals[i])
	}
	head("moxie_client_disconnects_total", "counter", "Generations ended because the client went away.")
	fmt.Fprintf(w, "moxie_client_disconnects_total %d\n", m.clientGone.Load())
	head("moxie_prompt_tokens_total", "counter", "Prompt tokens processed.")
	fmt.Fprintf(w, "moxie_prompt_tokens_total %d\n", m.promptTokens.Load())
	head("moxie_prompt_cached_tokens_total", "counter", "Prompt tokens not prefilled because a cached sequence held them (the prompt cache).")
	fmt.Fprintf(w, "moxie_prompt_cached_tokens_total %d\n", m.cachedTokens.Load())
	head("moxie_prompt_disk_cached_tokens_total", "counter", "Of the cached prompt tokens, those restored from the prompt cache's disk tier (--cache-dir).")
	fmt.Fprintf(w, "moxie_prompt_disk_cached_tokens_total %d\n", m.diskTokens.Load())
	head("moxie_prompt_disk_restores_total", "counter", "Sequences restored from the prompt cache's disk tier.")
	fmt.Fprintf(w, "moxie_prompt_disk_restores_total %d\n", m.diskRestores.Load())
	head("moxie_generated_tokens_total", "counter", "Tokens generated.")
	fmt.Fprintf(w, "moxie_generated_tokens_total %d\n", m.generatedTokens.Load())
	head("moxie_prefill_seconds_total", "counter", "Time spent in prefill.")
	fmt.Fprintf(w, "moxie_prefill_seconds_total %s\n", fmtFloat(math.Float64frombits(m.prefillSeconds.Load())))
	head("moxie_decode_seconds_total", "counter", "Time spent decoding after the first token.")
	fmt.Fprintf(w, "moxie_decode_seconds_total %s\n", fmtFloat(math.Float64frombits(m.decodeSeconds.Load())))
	head("moxie_decode_tokens_per_second", "gauge", "Decode rate of the last generation with at least two tokens.")
	fmt.Fprintf(w, "moxie_decode_tokens_per_second %s\n", fmtFloat(math.Float64frombits(m.lastDecodeRate.Load())))
	head("moxie_prefill_tokens_per_second", "gauge", "Prefill rate of the last generation.")
	fmt.Fprintf(w, "moxie_prefill_tokens_per_second %s\n", fmtFloat(math.Float64frombits(m.lastPrefillRate.Load())))
	head("moxie_time_to_first_token_seconds", "histogram", "Time from the start of a generation to its first token (queueing excluded).")
	m.ttft.write(w, "moxie_time_to_first_token_seconds")
	head("moxie_generation_duration_seconds", "histogram", "Time from the start of a generation to its last token (queueing excluded).")
	m.duration.write(w, "moxie_generation_duration_seconds")
	head("moxie_queue_depth", "gauge", "Requests waiting for a generation slot.")
	fmt.Fprintf(w, "moxie_queue_depth %d\n", s.waiting.Load())
	head("moxie_inflight_requests", "gauge", "Generations running.")
	fmt.Fprintf(w, "moxie_inflight_requests %d\n", m.inflight.Load())
	head("moxie_concurrency_limit", "gauge", "Generations allowed to run at once.")
	fmt.Fprintf(w, "moxie_concurrency_limit %d\n", s.cfg.Concurrency)

	if s.cfg.Gauges == nil {
		return
	}
	gauges := s.cfg.Gauges()
	// Group by name so that each family has one HELP/TYPE header.
	order := []string{}
	byName := map[string][]Gauge{}
	for _, g := range gauges {
		if !metricName.MatchString(g.Name) || strings.HasPrefix(g.Name, "moxie_http_") {
			continue
		}
		if _, ok := byName[g.Name]; !ok {
			order = append(order, g.Name)
		}
		byName[g.Name] = append(byName[g.Name], g)
	}
	for _, name := range order {
		gs := byName[name]
		help := gs[0].Help
		if help == "" {
			help = name
		}
		head(name, "gauge", strings.ReplaceAll(help, "\n", " "))
		for _, g := range gs {
			fmt.Fprintf(w, "%s%s %s\n", name, labels(g.Labels), fmtFloat(g.Value))
		}
	}
}

// labels formats a label set in sorted order, dropping invalid names.
func labels(l map[string]string) string {
	if len(l) == 0 {
		return ""
	}
	keys := make([]string, 0, len(l))
	for k := range l {
		if labelName.MatchString(k) {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return ""
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `%s="%s"`, k, escapeLabel(l[k]))
	}
	b.WriteByte('}')
	return b.String()
}
