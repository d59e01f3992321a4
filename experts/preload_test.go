package experts

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"moxie/checkpoint"
	"moxie/compute/cpu"
	"moxie/dsv4"
)

// expertBytesFromSource is expert e of layer l as the store lays it out (w1,
// w3, w2, each weight then scale), read from an independently opened source.
func expertBytesFromSource(t *testing.T, src checkpoint.Source, st *Store, l, e int) []byte {
	t.Helper()
	var out []byte
	for _, p := range projNames {
		for _, suffix := range []string{".weight", ".scale"} {
			d, err := src.TensorData(expertPrefix(st.cfg, l, e) + p + suffix)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, d...)
		}
	}
	if int64(len(out)) != st.ExpertBytes() {
		t.Fatalf("source expert is %d bytes, store expert %d", len(out), st.ExpertBytes())
	}
	return out
}

// slotOf is the slot holding expert e of layer l (nil if none), after its read.
func slotOf(st *Store, l, e int) *slot {
	st.loads.Wait()
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.layers[l].where[e]
}

// within reports whether b lies inside mem.
func within(b, mem []byte) bool {
	if len(b) == 0 || len(mem) == 0 {
		return false
	}
	p, lo := uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&mem[0]))
	return p >= lo && p+uintptr(len(b)) <= lo+uintptr(len(mem))
}

// TestSlotReuseAcrossEvictions: experts evicted from a two-slot layer leave
// their slot's memory to the next miss, and every slot then holds exactly the
// bytes of the expert it serves (a stale byte of the evicted expert fails).
func TestSlotReuseAcrossEvictions(t *testing.T) {
	dir := writeTiny(t)
	ref, err := checkpoint.OpenDir(dir) // expected bytes come from here
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	for _, tc := range []struct {
		name, spec string
		chunk      int
	}{
		{"dir/pread", dir, 0},
		{"dir/small chunks", dir, 1000},
		{"synth/TensorData", "synth:tiny", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, err := checkpoint.Open(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			c := cfgOf(t, src)
			st, err := New(src, c, Options{Backend: cpu.New(1), Slots: uniform(c, 2), Readers: 3, ChunkSize: tc.chunk})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			const layer = 1
			addrs := map[uintptr]bool{}
			var prev []byte
			// Ascending requests in one step: each new expert evicts the
			// older of the two residents (the other was served last).
			for e := range c.NRoutedExperts {
				if _, err := st.Expert(layer, e); err != nil {
					t.Fatal(err)
				}
				sl := slotOf(st, layer, e)
				if sl == nil {
					t.Fatalf("expert %d not resident", e)
				}
				if !within(sl.buf, st.layers[layer].mem) {
					t.Fatalf("expert %d's slot is not in the layer's memory", e)
				}
				addrs[uintptr(unsafe.Pointer(&sl.buf[0]))] = true
				want := expertBytesFromSource(t, ref, st, layer, e)
				if prev != nil && bytes.Equal(prev, want) {
					t.Fatalf("experts %d and %d have the same bytes: the test cannot see stale data", e-1, e)
				}
				if !bytes.Equal(sl.buf, want) {
					t.Fatalf("slot of expert %d holds other bytes than the source's", e)
				}
				prev = want
			}
			if len(addrs) != 2 {
				t.Fatalf("%d experts went through %d slot buffers, want the 2 slots reused", c.NRoutedExperts, len(addrs))
			}
			if s := st.Stats(); s.ResidentBytes != int64(len(st.mem)) || s.Total.Misses != int64(c.NRoutedExperts) {
				t.Fatalf("stats %+v (resident %d, want %d)", s.Total, s.ResidentBytes, len(st.mem))
			}
		})
	}
}

// countingPolicy counts the calls a store makes to an LRU.
type countingPolicy struct {
	*LRU
	uses, admits *atomic.Int64
}

func (p countingPolicy) Use(e int, t int64) { p.uses.Add(1); p.LRU.Use(e, t) }
func (p countingPolicy) Admit(e int, t int64, free bool, c []int) (int, bool) {
	p.admits.Add(1)
	return p.LRU.Admit(e, t, free, c)
}

func TestPreload(t *testing.T) {
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
	E := c.NRoutedExperts
	eb := int64(0)
	// Layers 0-2 hold every expert, layer 3 three, the MTP block none.
	slots := []int{E, E, E, 3, 0}
	newStore := func(t *testing.T) (*Store, *atomic.Int64, *atomic.Int64) {
		var uses, admits atomic.Int64
		st, err := New(src, c, Options{Backend: be, Slots: slots, Readers: 2, ChunkSize: 3000,
			Policy: func(_, n, _ int) Policy { return countingPolicy{NewLRU(n), &uses, &admits} }})
		if err != nil {
			t.Fatal(err)
		}
		eb = st.ExpertBytes()
		return st, &uses, &admits
	}

	t.Run("fills full layers only, counts no use", func(t *testing.T) {
		st, uses, admits := newStore(t)
		defer st.Close()
		var calls [][2]int
		if err := st.Preload(context.Background(), func(done, total int) { calls = append(calls, [2]int{done, total}) }); err != nil {
			t.Fatal(err)
		}
		total := 3 * E
		if len(calls) != total+1 {
			t.Fatalf("%d progress calls, want %d", len(calls), total+1)
		}
		for i, cl := range calls {
			if cl != [2]int{i, total} {
				t.Fatalf("progress call %d = %v, want (%d, %d)", i, cl, i, total)
			}
		}
		s := st.Stats()
		if s.Total.Hits != 0 || s.Total.Misses != 0 || s.Total.PrefetchIssued != 0 || s.Total.Preloaded != int64(total) ||
			s.Total.BytesRead != int64(total)*eb || s.Total.ReadErrors != 0 || uses.Load() != 0 || admits.Load() != 0 {
			t.Fatalf("after Preload: %+v, policy uses %d admits %d", s.Total, uses.Load(), admits.Load())
		}
		for l := range slots {
			for e := range E {
				sl := slotOf(st, l, e)
				if (sl != nil) != (slots[l] == E) {
					t.Fatalf("layer %d (%d slots) expert %d resident = %v", l, slots[l], e, sl != nil)
				}
				if sl != nil && !bytes.Equal(sl.buf, expertBytesFromSource(t, d, st, l, e)) {
					t.Fatalf("layer %d expert %d: slot bytes differ from the source's", l, e)
				}
			}
		}
		// A second Preload has nothing to read.
		calls = nil
		if err := st.Preload(context.Background(), func(done, total int) { calls = append(calls, [2]int{done, total}) }); err != nil || !slices.Equal(calls, [][2]int{{0, 0}}) {
			t.Fatalf("second Preload: %v, progress %v", err, calls)
		}
		// The model reads only the experts of the layers not preloaded.
		m, err := dsv4.Load(src, dsv4.Options{Backend: be, Experts: st})
		if err != nil {
			t.Fatal(err)
		}
		got, err := run(t, m)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatal("logits differ after Preload")
		}
		s = st.Stats()
		for l := range 3 {
			if ls := s.Layers[l]; ls.Misses != 0 || ls.Hits == 0 || ls.BytesRead != int64(E)*eb {
				t.Fatalf("preloaded layer %d: %+v", l, ls)
			}
		}
		if s.Layers[3].Misses == 0 {
			t.Fatalf("layer 3 (not preloaded) has no misses: %+v", s.Layers[3])
		}
	})

	t.Run("concurrent with the model", func(t *testing.T) {
		st, _, _ := newStore(t)
		defer st.Close()
		m, err := dsv4.Load(src, dsv4.Options{Backend: be, Experts: st})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var perr error
		wg.Go(func() { perr = st.Preload(context.Background(), nil) })
		got, err := run(t, m)
		wg.Wait()
		if err != nil || perr != nil {
			t.Fatalf("run: %v, Preload: %v", err, perr)
		}
		if !slices.Equal(got, want) {
			t.Fatal("logits differ with Preload running")
		}
		for l := range 3 {
			for e := range E {
				if slotOf(st, l, e) == nil {
					t.Fatalf("layer %d expert %d not resident", l, e)
				}
			}
		}
	})

	t.Run("cancelled", func(t *testing.T) {
		st, _, _ := newStore(t)
		defer st.Close()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := st.Preload(ctx, nil); !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if s := st.Stats(); s.Total.Preloaded != 0 {
			t.Fatalf("cancelled Preload read %d experts", s.Total.Preloaded)
		}
		// Cancelled part way: what was issued completes and stays usable.
		ctx, cancel = context.WithCancel(context.Background())
		err := st.Preload(ctx, func(done, _ int) {
			if done == 3 {
				cancel()
			}
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		st.loads.Wait()
		if n := st.Stats().Total.Preloaded; n < 3 || n >= int64(3*E) {
			t.Fatalf("Preloaded = %d after cancelling at 3 of %d", n, 3*E)
		}
	})

	t.Run("read error", func(t *testing.T) {
		bad := "layers.1.ffn.experts.5.w3.scale"
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
		st, _, _ := newStore(t)
		defer st.Close()
		src.set(bad, short, true)
		err = st.Preload(context.Background(), nil)
		src.set(bad, "", false)
		for _, w := range []string{"layer 1 expert 5", bad, short} {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Fatalf("error %v does not mention %q", err, w)
			}
		}
		if slotOf(st, 1, 5) != nil {
			t.Fatal("the unreadable expert is resident")
		}
		// Repaired: a second Preload completes the set.
		if err := st.Preload(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		for l := range 3 {
			for e := range E {
				if sl := slotOf(st, l, e); sl == nil || !bytes.Equal(sl.buf, expertBytesFromSource(t, d, st, l, e)) {
					t.Fatalf("layer %d expert %d missing or wrong after repair", l, e)
				}
			}
		}
	})

	t.Run("closed", func(t *testing.T) {
		st, _, _ := newStore(t)
		st.Close()
		if err := st.Preload(context.Background(), nil); err == nil || !strings.Contains(err.Error(), "closed") {
			t.Fatalf("err = %v", err)
		}
	})
}

// TestExpertSet: a layer held whole serves a set as Expert would (the same
// weights, a hit each); a layer with an expert not resident declines the
// set and counts nothing; bad indexes and a closed store are errors.
func TestExpertSet(t *testing.T) {
	be := cpu.New(1)
	defer be.Close()
	dir := writeTiny(t)
	d, err := checkpoint.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c, err := dsv4.Load(d, dsv4.Options{Backend: be})
	if err != nil {
		t.Fatal(err)
	}
	E := c.Cfg.NRoutedExperts
	st, err := New(d, c.Cfg, Options{Backend: be, Slots: []int{E, E, E, 3, 0}, Readers: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Preload(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	es := []int{0, 2, E - 1}
	dst := make([]dsv4.ExpertWeights, len(es))
	ok, err := st.ExpertSet(1, es, dst)
	if err != nil || !ok {
		t.Fatalf("ExpertSet on a preloaded layer = %v, %v; want true", ok, err)
	}
	if h := st.Stats().Total.Hits; h != int64(len(es)) {
		t.Fatalf("%d hits after the set, want %d", h, len(es))
	}
	for i, e := range es {
		w, err := st.Expert(1, e)
		if err != nil {
			t.Fatal(err)
		}
		if w != dst[i] {
			t.Fatalf("expert %d: the set's weights differ from Expert's", e)
		}
	}
	before := st.Stats().Total
	if ok, err := st.ExpertSet(4, []int{0, 1}, make([]dsv4.ExpertWeights, 2)); err != nil || ok {
		t.Fatalf("ExpertSet on a layer with no slots = %v, %v; want false, nil", ok, err)
	}
	if after := st.Stats().Total; after.Hits != before.Hits || after.Misses != before.Misses || after.Bypassed != before.Bypassed {
		t.Fatalf("a declined set counted: %+v then %+v", before, after)
	}
	if _, err := st.ExpertSet(1, []int{E}, make([]dsv4.ExpertWeights, 1)); err == nil {
		t.Fatal("ExpertSet with an expert out of range: no error")
	}
	if _, err := st.ExpertSet(1, []int{0, 1}, make([]dsv4.ExpertWeights, 1)); err == nil {
		t.Fatal("ExpertSet with a short dst: no error")
	}
	st.Close()
	if _, err := st.ExpertSet(1, []int{0}, make([]dsv4.ExpertWeights, 1)); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("ExpertSet after Close: %v, want the store closed", err)
	}
}
