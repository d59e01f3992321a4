//go:build linux

package experts

import (
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"moxie/checkpoint"
	"moxie/compute/cpu"
	"moxie/dsv4"
	"moxie/dsv4/config"
)

// fileSource is a checkpoint.Source + Locator over one file holding the routed
// experts of cfg back to back (each expert's six tensors contiguous, as in the
// shipped shards). Only expert tensors exist.
type fileSource struct {
	path  string
	infos map[string]checkpoint.TensorInfo
	off   map[string]int64
	size  int64
}

func newFileSource(path string, cfg *config.Config) *fileSource {
	s := &fileSource{path: path, infos: map[string]checkpoint.TensorInfo{}, off: map[string]int64{}}
	for _, t := range config.Layout(cfg) {
		if t.Role != config.RoleRoutedExpert {
			continue
		}
		s.infos[t.Name] = checkpoint.TensorInfo{Name: t.Name, DType: t.DType, Shape: t.Shape, Size: t.Bytes()}
		s.off[t.Name] = s.size
		s.size += t.Bytes()
	}
	return s
}

func (s *fileSource) Name() string                      { return s.path }
func (s *fileSource) Synthetic() bool                   { return true }
func (s *fileSource) File(string) ([]byte, error)       { return nil, fs.ErrNotExist }
func (s *fileSource) Close() error                      { return nil }
func (s *fileSource) TensorData(string) ([]byte, error) { return nil, fs.ErrInvalid }
func (s *fileSource) Lookup(n string) (checkpoint.TensorInfo, bool) {
	t, ok := s.infos[n]
	return t, ok
}
func (s *fileSource) Tensors() []checkpoint.TensorInfo {
	var ts []checkpoint.TensorInfo
	for _, t := range s.infos {
		ts = append(ts, t)
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
	return ts
}
func (s *fileSource) Locate(n string) (string, int64, int64, error) {
	t, ok := s.infos[n]
	if !ok {
		return "", 0, 0, fmt.Errorf("no tensor %s", n)
	}
	return s.path, s.off[n], t.Size, nil
}

// dropCache asks the kernel to forget path's cached pages.
func dropCache(b *testing.B, path string) {
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		b.Fatal(err)
	}
}

// seqRead reads path front to back with 4 MiB preads (one goroutine) after
// dropping it from the page cache, and returns bytes per second.
func seqRead(b *testing.B, path string) float64 {
	dropCache(b, path)
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4<<20)
	var n int64
	t0 := time.Now()
	for {
		k, err := f.ReadAt(buf, n)
		n += int64(k)
		if err != nil {
			break
		}
	}
	return float64(n) / time.Since(t0).Seconds()
}

// BenchmarkExpertMiss reads one V4-Flash routed expert (MXFP4 w1, w3
// [2048, 4096], w2 [4096, 2048] with scales: 13,369,344 bytes) from a cold file
// through the store's miss path (zero slots, so every Expert call reads), and
// compares with the disk's sequential bandwidth measured on the same file
// (4 MiB preads after FADV_DONTNEED), measured just before each run. Run with
// -benchtime 96x so that one run reads the file once, like the baseline.
// Metrics: MB/s (the miss path), disk-MB/s, and ratio = miss path / disk.
func BenchmarkExpertMiss(b *testing.B) {
	cfg := config.Flash()
	cfg.NLayers, cfg.NMTPLayers, cfg.NRoutedExperts = 1, 0, 96 // 1.2 GiB of experts
	cfg.CompressRatios = cfg.CompressRatios[:1]
	path, src := writeExpertFile(b, cfg)
	for _, readers := range []int{1, 4, 8, 16} {
		b.Run(fmt.Sprintf("readers=%d", readers), func(b *testing.B) {
			st, err := New(src, cfg, Options{Backend: cpu.New(1), Slots: []int{0}, Readers: readers})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			// The disk's bandwidth right now (other processes share it).
			disk := seqRead(b, path)
			dropCache(b, path)
			b.SetBytes(st.ExpertBytes())
			b.ResetTimer()
			e := 0
			for b.Loop() {
				if e == cfg.NRoutedExperts {
					b.StopTimer()
					dropCache(b, path)
					b.StartTimer()
					e = 0
				}
				if _, err := st.Expert(0, e); err != nil {
					b.Fatal(err)
				}
				e++
			}
			el := b.Elapsed().Seconds()
			if el > 0 {
				rate := float64(b.N) * float64(st.ExpertBytes()) / el
				b.ReportMetric(disk/1e6, "disk-MB/s")
				b.ReportMetric(rate/disk, "ratio")
			}
		})
	}
}

// BenchmarkFlashDecodeStore (opt-in: MOXIE_BENCH_FLASH=1) decodes with a
// `moxie synth flash?layers=2` directory (about 12 GiB, written once to
// $MOXIE_BENCH_FLASH_DIR, default /tmp/moxie-flash2; $MOXIE_BENCH_FLASH_SPEC
// overrides the preset, e.g. synth:flash?layers=2&experts=64 on small machines)
// with all routed experts of the main layers resident, half of them, and one
// per layer; the first case has room for all but starts empty (the first
// tokens of a run, every expert's first use a read into a slot never used);
// the -cold cases drop the routed experts' byte ranges from the page
// cache before every token, so that misses come from the disk rather than from
// memory the OS kept (dense weights stay cached). Metrics: tok/s, bytes read from the slow tier per
// token, hit rate, and the forward pass's wait for reads per token.
func BenchmarkFlashDecodeStore(b *testing.B) {
	if os.Getenv("MOXIE_BENCH_FLASH") == "" {
		b.Skip("set MOXIE_BENCH_FLASH=1 (writes a 12 GiB synthetic checkpoint under /tmp once)")
	}
	dir := os.Getenv("MOXIE_BENCH_FLASH_DIR")
	if dir == "" {
		dir = "/tmp/moxie-flash2"
	}
	if _, err := os.Stat(dir); err != nil {
		spec := os.Getenv("MOXIE_BENCH_FLASH_SPEC")
		if spec == "" {
			spec = "synth:flash?layers=2"
		}
		writeSynthDir(b, spec, dir)
	}
	src, err := checkpoint.OpenDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	raw, _ := src.File("config.json")
	cfg, err := config.Parse(raw)
	if err != nil {
		b.Fatal(err)
	}
	be := cpu.New(0)
	E := cfg.NRoutedExperts
	// Byte ranges of the main layers' routed experts, for the cold cases.
	type span struct {
		f         *os.File
		off, size int64
	}
	var spans []span
	fds := map[string]*os.File{}
	for _, t := range config.Layout(cfg) {
		if t.Role != config.RoleRoutedExpert || t.Layer >= cfg.NLayers {
			continue
		}
		path, off, size, err := src.Locate(t.Name)
		if err != nil {
			b.Fatal(err)
		}
		if fds[path] == nil {
			if fds[path], err = os.Open(path); err != nil {
				b.Fatal(err)
			}
			defer fds[path].Close()
		}
		spans = append(spans, span{fds[path], off, size})
	}
	dropExperts := func() {
		for _, sp := range spans {
			if err := unix.Fadvise(int(sp.f.Fd()), sp.off, sp.size, unix.FADV_DONTNEED); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name  string
		slots int
		cold  bool // drop the experts from the page cache before every token
		empty bool // do not fill the slots before the prompt
	}{{"all", E, false, false}, {"first", E, false, true}, {"half", E / 2, false, false}, {"one", 1, false, false},
		{"half-cold", E / 2, true, false}, {"one-cold", 1, true, false}} {
		b.Run(tc.name, func(b *testing.B) {
			slots := make([]int, cfg.NLayers+cfg.NMTPLayers)
			for l := range cfg.NLayers {
				slots[l] = tc.slots
			}
			st, err := New(src, cfg, Options{Backend: be, Slots: slots})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			// Fill the slots (not timed): the steady state of a long run.
			for l := range cfg.NLayers * btoi(!tc.empty) {
				for e := range tc.slots {
					if _, err := st.Expert(l, e); err != nil {
						b.Fatal(err)
					}
				}
			}
			m, err := dsv4.Load(src, dsv4.Options{Backend: be, Experts: st})
			if err != nil {
				b.Fatal(err)
			}
			s := m.NewSession()
			if _, err := s.Prefill([]int{0, 100, 2000, 30000, 7, 99, 1234, 5}); err != nil {
				b.Fatal(err)
			}
			before := st.Stats().Total
			cpu0 := cpuTime(b)
			b.ResetTimer()
			for b.Loop() {
				if tc.cold {
					b.StopTimer()
					dropExperts()
					b.StartTimer()
				}
				if _, err := s.Decode(s.Pos()*7919%cfg.VocabSize + 3); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			cpuUsed := cpuTime(b) - cpu0
			after := st.Stats().Total
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tok/s")
			b.ReportMetric(float64(after.BytesRead-before.BytesRead)/float64(b.N), "read-B/tok")
			win := LayerStats{Hits: after.Hits - before.Hits, Misses: after.Misses - before.Misses}
			b.ReportMetric(win.HitRate(), "hit-rate")
			b.ReportMetric(float64(after.Wait-before.Wait)/float64(b.N)/1e6, "wait-ms/tok")
			// CPU time of the process (all threads) per token: less disturbed
			// than wall time by other jobs on a shared machine.
			b.ReportMetric(float64(cpuUsed)/float64(b.N)/1e6, "cpu-ms/tok")
		})
	}
}

// cpuTime is the process's user+system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// writeSynthDir writes a synthetic checkpoint directory like `moxie synth`.
func writeSynthDir(b *testing.B, spec, dir string) {
	src, err := checkpoint.OpenSynth(spec)
	if err != nil {
		b.Fatal(err)
	}
	aux, err := checkpoint.AuxFiles(src)
	if err != nil {
		b.Fatal(err)
	}
	if err := checkpoint.WriteDir(dir, aux, src.OutTensors(), checkpoint.WriteOptions{Workers: 1,
		Metadata: map[string]string{"format": "pt", checkpoint.SyntheticKey: src.Name()}}); err != nil {
		b.Fatal(err)
	}
}

// writeExpertFile writes a file of random bytes holding the routed experts of
// cfg, and returns its path and a source over it.
func writeExpertFile(b *testing.B, cfg *config.Config) (string, *fileSource) {
	path := filepath.Join(b.TempDir(), "experts.bin")
	src := newFileSource(path, cfg)
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	chunk := make([]byte, 8<<20)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range chunk {
		chunk[i] = byte(r.Uint32())
	}
	for w := int64(0); w < src.size; w += int64(len(chunk)) {
		if _, err := f.Write(chunk[:min(int64(len(chunk)), src.size-w)]); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	return path, src
}

// BenchmarkExpertPreload preloads the 96 experts of one V4-Flash-shaped layer
// (1.2 GiB) from a file dropped from the page cache into a fresh store with a
// slot for each (made outside the timer), against the disk's sequential
// bandwidth (4 MiB preads, one goroutine) measured just before each run.
// Metrics: MB/s, disk-MB/s, ratio = preload / disk.
func BenchmarkExpertPreload(b *testing.B) {
	cfg := config.Flash()
	cfg.NLayers, cfg.NMTPLayers, cfg.NRoutedExperts = 1, 0, 96
	cfg.CompressRatios = cfg.CompressRatios[:1]
	path, src := writeExpertFile(b, cfg)
	for _, readers := range []int{4, 8} {
		b.Run(fmt.Sprintf("readers=%d", readers), func(b *testing.B) {
			disk := seqRead(b, path)
			for b.Loop() {
				b.StopTimer()
				dropCache(b, path)
				st, err := New(src, cfg, Options{Backend: cpu.New(1), Slots: []int{cfg.NRoutedExperts}, Readers: readers})
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if err := st.Preload(b.Context(), nil); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				st.Close()
				b.StartTimer()
			}
			rate := float64(b.N) * float64(src.size) / b.Elapsed().Seconds()
			b.ReportMetric(rate/1e6, "MB/s")
			b.ReportMetric(disk/1e6, "disk-MB/s")
			b.ReportMetric(rate/disk, "ratio")
		})
	}
}

// hotRead reads path front to back with 4 MiB preads (one goroutine) into one
// reused buffer after reading it once, so that it comes from the page cache:
// the ceiling of a miss served from memory the OS kept (a copy per byte).
func hotRead(b *testing.B, path string) float64 {
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4<<20)
	var n int64
	var t0 time.Time
	for range 2 {
		n, t0 = 0, time.Now()
		for {
			k, err := f.ReadAt(buf, n)
			n += int64(k)
			if err != nil {
				break
			}
		}
	}
	return float64(n) / time.Since(t0).Seconds()
}

// BenchmarkExpertFill loads every expert of one V4-Flash-shaped layer (96
// MXFP4 experts, 1.2 GiB, kept in the page cache) into a store with a slot
// for each, so that every load lands in a slot never used before: the first
// tokens of a run whose budget holds the experts. A fresh store is made per
// iteration outside the timer; its construction time is reported as new-ms.
// Metrics: MB/s of the loads, hot-MB/s (4 MiB preads of the same cached file
// into one reused buffer, measured just before), ratio = loads / hot-MB/s.
func BenchmarkExpertFill(b *testing.B) {
	cfg := config.Flash()
	cfg.NLayers, cfg.NMTPLayers, cfg.NRoutedExperts = 1, 0, 96
	cfg.CompressRatios = cfg.CompressRatios[:1]
	path, src := writeExpertFile(b, cfg)
	hot := hotRead(b, path)
	var newTime time.Duration
	for b.Loop() {
		b.StopTimer()
		t0 := time.Now()
		st, err := New(src, cfg, Options{Backend: cpu.New(1), Slots: []int{cfg.NRoutedExperts}})
		if err != nil {
			b.Fatal(err)
		}
		newTime += time.Since(t0)
		b.StartTimer()
		all := make([]int, cfg.NRoutedExperts)
		for e := range all {
			all[e] = e
		}
		st.Prefetch(0, all)
		for e := range all {
			if _, err := st.Expert(0, e); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		st.Close()
		b.StartTimer()
	}
	rate := float64(b.N) * float64(src.size) / b.Elapsed().Seconds()
	b.ReportMetric(rate/1e6, "MB/s")
	b.ReportMetric(hot/1e6, "hot-MB/s")
	b.ReportMetric(rate/hot, "ratio")
	b.ReportMetric(newTime.Seconds()*1e3/float64(b.N), "new-ms")
}
