package experts

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"moxie/checkpoint"
	"moxie/compute/cpu"
	"moxie/dsv4"
	"moxie/dsv4/config"
)

var (
	_ dsv4.Experts          = (*Store)(nil)
	_ dsv4.ExpertPrefetcher = (*Store)(nil)
)

// writeTiny writes synth:tiny as a checkpoint directory (what `moxie synth`
// does), with small shards so that experts spread over several files.
func writeTiny(t testing.TB) string {
	t.Helper()
	src, err := checkpoint.OpenSynth("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	aux, err := checkpoint.AuxFiles(src)
	if err != nil {
		t.Fatal(err)
	}
	var ts []checkpoint.OutTensor
	for _, l := range config.Layout(src.Config()) {
		ts = append(ts, checkpoint.OutTensor{Name: l.Name, DType: l.DType, Shape: l.Shape,
			Data: func() ([]byte, error) { return src.TensorData(l.Name) }})
	}
	dir := filepath.Join(t.TempDir(), "tiny")
	if err := checkpoint.WriteDir(dir, aux, ts, checkpoint.WriteOptions{ShardSize: 256 << 10,
		Metadata: map[string]string{"format": "pt", checkpoint.SyntheticKey: src.Name()}}); err != nil {
		t.Fatal(err)
	}
	return dir
}

var testTokens = []int{5, 77, 200, 9, 31, 140, 250, 12, 64, 3, 101}

// run prefills testTokens[:6] and decodes the rest, returning all logits.
func run(t *testing.T, m *dsv4.Model) ([]float32, error) {
	t.Helper()
	s := m.NewSession()
	out, err := s.PrefillAll(testTokens[:6])
	if err != nil {
		return nil, err
	}
	for _, tok := range testTokens[6:] {
		l, err := s.Decode(tok)
		if err != nil {
			return nil, err
		}
		out = append(out, l...)
	}
	return out, nil
}

func cfgOf(t *testing.T, src checkpoint.Source) *config.Config {
	t.Helper()
	raw, err := src.File("config.json")
	if err != nil {
		t.Fatal(err)
	}
	c, err := config.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func uniform(c *config.Config, n int) []int {
	s := make([]int, c.NLayers+c.NMTPLayers)
	for i := range s {
		s[i] = n
	}
	return s
}

// TestLogitsBitIdentical is the store's contract: whatever is resident, the
// model computes exactly the logits it computes with every expert bound from
// the source (prefill with all logits, then decode steps).
func TestLogitsBitIdentical(t *testing.T) {
	be := cpu.New(0)
	dir := writeTiny(t)
	sources := map[string]string{"synth": "synth:tiny", "dir": dir}
	freq := NewFrequencies()
	for l := range 5 {
		for e := range 8 {
			freq.Set(l, e, float64((e*5+l)%8))
		}
	}
	for _, sname := range []string{"synth", "dir"} {
		src, err := checkpoint.Open(sources[sname])
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		if _, isLoc := src.(checkpoint.Locator); isLoc != (sname == "dir") {
			t.Fatalf("%s: Locator = %v", sname, isLoc)
		}
		ref, err := dsv4.Load(src, dsv4.Options{Backend: be})
		if err != nil {
			t.Fatal(err)
		}
		want, err := run(t, ref)
		if err != nil {
			t.Fatal(err)
		}
		c := ref.Cfg
		eb := config.ExpertBytes(c)
		policies := map[string]PolicyFunc{
			"lru":    nil,
			"decay":  func(_, n, _ int) Policy { return NewDecay(n, DecayParams{HalfLife: 4, Ratio: 1.25, Margin: 1}) },
			"static": StaticFunc(freq),
		}
		// One model per source (binding synth:tiny's dense weights is the slow
		// part); each case swaps in its own store.
		sw := &switchStore{}
		m, err := dsv4.Load(src, dsv4.Options{Backend: be, Experts: sw})
		if err != nil {
			t.Fatal(err)
		}
		for _, budget := range []struct {
			name  string
			slots []int
		}{
			{"100%", uniform(c, c.NRoutedExperts)},
			{"50%", uniform(c, c.NRoutedExperts/2)},
			{"1 per layer", uniform(c, 1)},
			{"none", uniform(c, 0)},
		} {
			for _, pname := range []string{"lru", "decay", "static"} {
				if sname == "synth" && (pname != "lru" || budget.name == "none") {
					continue // synth generates each missed tensor anew: keep its cases few
				}
				t.Run(sname+"/"+budget.name+"/"+pname, func(t *testing.T) {
					st, err := New(src, c, Options{Backend: be, Slots: budget.slots, Policy: policies[pname], Readers: 3, ChunkSize: 1000})
					if err != nil {
						t.Fatal(err)
					}
					defer st.Close()
					sw.st = st
					for pass := range 2 { // the second pass runs on a warm store
						got, err := run(t, m)
						if err != nil {
							t.Fatal(err)
						}
						if !slices.Equal(got, want) {
							t.Fatalf("pass %d: logits differ from the all-resident model", pass)
						}
					}
					s := st.Stats()
					// Every miss is served by exactly one read of one whole expert.
					if s.Total.BytesRead != s.Total.Misses*eb || s.Total.ReadErrors != 0 {
						t.Fatalf("read %d bytes for %d misses of %d bytes (%d errors)", s.Total.BytesRead, s.Total.Misses, eb, s.Total.ReadErrors)
					}
					// At most capacity slots (plus one scratch) per layer are allocated.
					var limit int64
					for _, n := range budget.slots {
						limit += int64(n+1) * eb
					}
					if s.ResidentBytes > limit {
						t.Fatalf("store holds %d bytes, more than slots+scratch %d", s.ResidentBytes, limit)
					}
					// Layers announce their experts before asking: with any slots,
					// misses are read ahead and those reads are used.
					if budget.slots[0] > 0 && (s.Total.PrefetchIssued == 0 || s.Total.PrefetchUseful == 0) {
						t.Fatalf("no useful prefetches: %v", s.Total)
					}
					switch budget.name {
					case "100%":
						// All resident: only first uses miss, at most every expert once.
						if s.Total.Misses > int64(c.NLayers*c.NRoutedExperts) || s.Total.Bypassed != 0 || s.Total.PrefetchWasted != 0 {
							t.Fatalf("all-resident store: %+v", s.Total)
						}
						if s.Total.Hits == 0 {
							t.Fatal("no hits with everything resident")
						}
					case "none":
						if s.Total.Hits != 0 || s.Total.Bypassed != s.Total.Misses {
							t.Fatalf("zero-slot store: %+v", s.Total)
						}
					}
				})
			}
		}
	}
}

// switchStore forwards to the store of the running test case.
type switchStore struct{ st *Store }

func (w *switchStore) Expert(l, e int) (dsv4.ExpertWeights, error) { return w.st.Expert(l, e) }
func (w *switchStore) Prefetch(l int, es []int)                    { w.st.Prefetch(l, es) }

// faultySource redirects chosen tensors to another file (a truncated copy of
// their shard) or makes locating them fail.
type faultySource struct {
	*checkpoint.Dir
	mu       sync.Mutex
	redirect map[string]string // tensor -> file path ("" = Locate fails)
}

var errLocate = errors.New("injected locate failure")

func (f *faultySource) Locate(name string) (string, int64, int64, error) {
	path, off, size, err := f.Dir.Locate(name)
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.redirect[name]; ok {
		if p == "" {
			return "", 0, 0, errLocate
		}
		path = p
	}
	return path, off, size, err
}

func (f *faultySource) set(name, path string, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if on {
		f.redirect[name] = path
	} else {
		delete(f.redirect, name)
	}
}

func TestReadFailureIsReportedAndStoreRecovers(t *testing.T) {
	be := cpu.New(0)
	dir := writeTiny(t)
	d, err := checkpoint.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	src := &faultySource{Dir: d, redirect: map[string]string{}}
	ref, err := dsv4.Load(src, dsv4.Options{Backend: be})
	if err != nil {
		t.Fatal(err)
	}
	want, err := run(t, ref)
	if err != nil {
		t.Fatal(err)
	}
	c := ref.Cfg
	// A truncated copy of the shard holding layer 0's expert 3 w2, cut in the
	// middle of that tensor.
	bad := "layers.0.ffn.experts.3.w2.weight"
	shard, off, size, err := d.Locate(bad)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(shard)
	if err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(t.TempDir(), "truncated.safetensors")
	if err := os.WriteFile(short, data[:off+size/2], 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		wantErr    []string
	}{
		{"truncated file", short, []string{"layer 0 expert 3", bad, short, "file truncated?"}},
		{"locate error", "", []string{"layer 0 expert 3", bad, errLocate.Error()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := New(src, c, Options{Backend: be, Slots: uniform(c, 2)})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			src.set(bad, tc.path, true)
			_, err = st.Expert(0, 3)
			if err == nil {
				t.Fatal("reading from the faulty tier succeeded")
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not mention %q", err, w)
				}
			}
			// Other experts of the same layer still load.
			if _, err := st.Expert(0, 4); err != nil {
				t.Fatalf("expert 4 after a failed read: %v", err)
			}
			// A prefetch of the bad expert fails quietly; the Expert call reports it.
			st.Prefetch(0, []int{3, 5})
			if _, err := st.Expert(0, 3); err == nil || !strings.Contains(err.Error(), bad) {
				t.Fatalf("prefetched bad expert: err = %v", err)
			}
			if _, err := st.Expert(0, 5); err != nil {
				t.Fatalf("expert 5: %v", err)
			}
			m, err := dsv4.Load(src, dsv4.Options{Backend: be, Experts: st})
			if err != nil {
				t.Fatal(err)
			}
			// Whether or not this prompt routes to the bad expert, a failure
			// must surface as an error, never as wrong logits.
			if got, err := run(t, m); err == nil && !slices.Equal(got, want) {
				t.Fatal("logits differ while one expert is unreadable")
			}
			// Once the file is healthy again the same store serves the model exactly.
			src.set(bad, "", false)
			got, err := run(t, m)
			if err != nil {
				t.Fatalf("after repair: %v", err)
			}
			if !slices.Equal(got, want) {
				t.Fatal("after repair: logits differ")
			}
			if _, err := st.Expert(0, 3); err != nil {
				t.Fatalf("expert 3 after repair: %v", err)
			}
			if s := st.Stats(); s.Total.ReadErrors < 2 {
				t.Fatalf("ReadErrors = %d, want >= 2", s.Total.ReadErrors)
			}
		})
	}
}

// TestEvictionProtectsAnnouncedAndLastServed drives one layer by hand with
// two slots and LRU.
func TestEvictionProtectsAnnouncedAndLastServed(t *testing.T) {
	be := cpu.New(0)
	src, err := checkpoint.Open("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	c := cfgOf(t, src)
	st, err := New(src, c, Options{Backend: be, Slots: uniform(c, 2)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	get := func(e int) {
		t.Helper()
		if _, err := st.Expert(2, e); err != nil {
			t.Fatal(err)
		}
	}
	resident := func() []int {
		st.mu.Lock()
		defer st.mu.Unlock()
		var r []int
		for e := range st.layers[2].where {
			r = append(r, e)
		}
		slices.Sort(r)
		return r
	}
	// Step 1 announces {1, 2}: both prefetched into the two free slots.
	st.Prefetch(2, []int{1, 2})
	st.loads.Wait()
	get(1)
	get(2)
	if r := resident(); !slices.Equal(r, []int{1, 2}) {
		t.Fatalf("resident %v, want [1 2]", r)
	}
	// Step 2 announces {1, 6}: 6 may not evict 1 (announced), nor 2 (last served,
	// its weights may still be in use): the prefetch is skipped.
	st.Prefetch(2, []int{1, 6})
	if r := resident(); !slices.Equal(r, []int{1, 2}) {
		t.Fatalf("after prefetch: resident %v, want [1 2] (nothing evictable)", r)
	}
	get(1) // hit; ends 2's protection
	get(6) // miss: evicts 2, the only candidate (1 is last served)
	if r := resident(); !slices.Equal(r, []int{1, 6}) {
		t.Fatalf("resident %v, want [1 6]", r)
	}
	s := st.Stats().Layers[2]
	// Step 1: 2 misses (both prefetched and useful). Step 2: 1 hit, 6 missed.
	if s.Hits != 1 || s.Misses != 3 || s.PrefetchIssued != 2 || s.PrefetchUseful != 2 || s.PrefetchWasted != 0 || s.Bypassed != 0 {
		t.Fatalf("stats %+v", s)
	}
	// A prefetch that is evicted before use is wasted. Announce {3} (evicts 1,
	// the LRU candidate; 6 is last served), then ask for 4 and 5 only (a caller
	// breaking the protocol still gets correct weights): 3 stays protected for
	// the step, so 4 evicts 6 and 5 evicts 4. The next step's prefetch of 7 can
	// only evict 3 (5 is last served): 3 was never served.
	st.Prefetch(2, []int{3})
	get(4)
	get(5)
	if r := resident(); !slices.Equal(r, []int{3, 5}) {
		t.Fatalf("resident %v, want [3 5]", r)
	}
	st.loads.Wait() // 3's background read done: only ready experts are evictable
	st.Prefetch(2, []int{7})
	get(7)
	if r := resident(); !slices.Equal(r, []int{5, 7}) {
		t.Fatalf("resident %v, want [5 7]", r)
	}
	if s := st.Stats().Layers[2]; s.PrefetchWasted != 1 {
		t.Fatalf("PrefetchWasted = %d, want 1", s.PrefetchWasted)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	src, _ := checkpoint.Open("synth:tiny")
	c := cfgOf(t, src)
	for _, tc := range []struct {
		name    string
		opts    Options
		wantErr string
	}{
		{"no backend", Options{}, "Backend is required"},
		{"slots len", Options{Backend: cpu.New(1), Slots: []int{1}}, "1 slot counts, want 5"},
		{"slots range", Options{Backend: cpu.New(1), Slots: []int{1, 1, 9, 1, 1}}, "layer 2 has 9 slots"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(src, c, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
		})
	}
	st, err := New(src, c, Options{Backend: cpu.New(1)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Expert(4, 8); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Fatalf("out-of-range expert: %v", err)
	}
	st.Close()
	if _, err := st.Expert(0, 0); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("closed store: %v", err)
	}
}

// TestSlotsForBudget: 10 experts of 100 bytes over 4 layers -> 3,3,2,2; a
// per-layer cap and a budget below one expert.
func TestSlotsForBudget(t *testing.T) {
	for _, tc := range []struct {
		budget int64
		cap    int
		want   []int
	}{
		{1000, 8, []int{3, 3, 2, 2}},
		{1099, 8, []int{3, 3, 2, 2}},
		{100000, 5, []int{5, 5, 5, 5}},
		{99, 8, []int{0, 0, 0, 0}},
		{0, 8, []int{0, 0, 0, 0}},
	} {
		if got := SlotsForBudget(tc.budget, 100, 4, tc.cap); !slices.Equal(got, tc.want) {
			t.Fatalf("SlotsForBudget(%d, cap %d) = %v, want %v", tc.budget, tc.cap, got, tc.want)
		}
	}
	// Tiny: w1, w3 [64, 160] MXFP4 = 64·80 + 64·5 bytes each; w2 [160, 64] = 160·32 + 160·2.
	if got, want := config.ExpertBytes(config.Tiny()), int64(2*(64*80+64*5)+160*32+160*2); got != want {
		t.Fatalf("config.ExpertBytes(tiny) = %d, want %d", got, want)
	}
}
