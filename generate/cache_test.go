package generate

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
)

// Ids of the test vocabulary (pieces) past tB.
const (
	tC = tB + 1 + iota
	tD
	tE
)

// The fake model's logits are a function of the sequence's whole history
// (a hash of every token appended), and the seeded sampler draws from the
// background those logits make: a reused sequence that held other tokens
// than the ones Generate believes, or a suffix fed twice or not at all,
// changes the draws.

// cachedRun generates from prompt with a fresh seeded sampler (seed 7),
// up to max tokens, with cache (nil: none); emit may be nil.
func cachedRun(t *testing.T, m *fakeModel, cache *Cache, prompt []int, max int, emit func(Event) error) Result {
	t.Helper()
	res, err := Generate(context.Background(), m, prompt, Options{MaxTokens: max, IgnoreEOS: true, Sampler: newSeeded(7), Cache: cache}, emit)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// checkFresh fails t unless got is what a fresh sequence of the script(3,
// tA) model generates from prompt (cachedRun, max tokens): what a cached
// or restored sequence must reproduce.
func checkFresh(t *testing.T, got, prompt []int, max int) {
	t.Helper()
	fresh := cachedRun(t, &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}, nil, prompt, max, nil)
	if !slices.Equal(got, fresh.Tokens) {
		t.Errorf("generated %v, a fresh sequence %v", got, fresh.Tokens)
	}
}

func TestCacheChatTurns(t *testing.T) {
	m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}
	cache := NewCache(1)
	defer cache.Close()
	r1 := cachedRun(t, m, cache, prompt3, 5, nil)
	if r1.CachedTokens != 0 {
		t.Fatalf("first turn: %d cached tokens from an empty cache", r1.CachedTokens)
	}
	if cache.Len() != 1 {
		t.Fatalf("after the first turn the cache holds %d sequences, want 1", cache.Len())
	}
	// The sequence holds the prompt and every generated token but the last
	// (sampled, never fed back): 3 + 4.
	turn2 := append(append(append([]int(nil), prompt3...), r1.Tokens...), tNL, tC)
	m.appended = 0
	r2 := cachedRun(t, m, cache, turn2, 6, nil)
	if r2.CachedTokens != 7 {
		t.Errorf("second turn: %d cached tokens, want 7 (the first prompt and four fed-back tokens)", r2.CachedTokens)
	}
	// Fed: the prompt's 3 new tokens, then 5 decode steps.
	if m.appended != 3+5 {
		t.Errorf("second turn fed %d tokens to the model, want %d", m.appended, 3+5)
	}
	checkFresh(t, r2.Tokens, turn2, 6)
	if open, closed := m.stats(); open != 1 || closed != 0 {
		t.Errorf("%d sequences opened and %d closed over two turns, want 1 and 0", open, closed)
	}
	// A third turn that extends the second continues the same sequence.
	turn3 := append(append(append([]int(nil), turn2...), r2.Tokens...), tD)
	r3 := cachedRun(t, m, cache, turn3, 3, nil)
	if want := len(turn2) + 5; r3.CachedTokens != want {
		t.Errorf("third turn: %d cached tokens, want %d", r3.CachedTokens, want)
	}
	if err := cache.Close(); err != nil {
		t.Fatal(err)
	}
	if open, closed := m.stats(); open != 1 || closed != 1 || cache.Len() != 0 {
		t.Errorf("after Close: %d opened, %d closed, %d cached; want 1, 1, 0", open, closed, cache.Len())
	}
}

func TestCacheNoReuse(t *testing.T) {
	for _, c := range []struct {
		name   string
		prompt func(first []int, gen []int) []int
	}{
		{"the same prompt again", func(first, _ []int) []int { return first }},
		{"a prompt that differs inside the cached tokens", func(first, gen []int) []int {
			p := append(append([]int(nil), first...), gen...)
			p[1] = tE
			return p
		}},
		{"a prompt that stops inside the cached tokens", func(first, gen []int) []int {
			return append(append([]int(nil), first...), gen[0])
		}},
		{"exactly the cached tokens (nothing left to feed)", func(first, gen []int) []int {
			return append(append([]int(nil), first...), gen[:len(gen)-1]...)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}
			cache := NewCache(1)
			defer cache.Close()
			r1 := cachedRun(t, m, cache, prompt3, 4, nil)
			p := c.prompt(prompt3, r1.Tokens)
			r2 := cachedRun(t, m, cache, p, 4, nil)
			if r2.CachedTokens != 0 {
				t.Errorf("%d cached tokens, want 0", r2.CachedTokens)
			}
			checkFresh(t, r2.Tokens, p, 4)
			// Two sequences opened; the first was evicted (closed) when the
			// second was stored in the one-sequence cache.
			if open, closed := m.stats(); open != 2 || closed != 1 || cache.Len() != 1 {
				t.Errorf("%d opened, %d closed, %d cached; want 2, 1, 1", open, closed, cache.Len())
			}
		})
	}
}

func TestCacheLongestPrefix(t *testing.T) {
	m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}
	cache := NewCache(3)
	defer cache.Close()
	short := cachedRun(t, m, cache, prompt3, 2, nil)                        // holds prompt3 + 1
	long := cachedRun(t, m, cache, []int{tBOS, tA, tB, tC, tD, tE}, 2, nil) // holds 6 + 1
	other := cachedRun(t, m, cache, []int{tBOS, tE, tE}, 2, nil)            // holds 3 + 1
	if cache.Len() != 3 {
		t.Fatalf("cache holds %d, want 3", cache.Len())
	}
	_ = short
	_ = other
	p := append([]int{tBOS, tA, tB, tC, tD, tE}, long.Tokens...)
	p = append(p, tNL)
	r := cachedRun(t, m, cache, p, 2, nil)
	if r.CachedTokens != 7 {
		t.Errorf("%d cached tokens, want 7 (the longest cached prefix)", r.CachedTokens)
	}
	// A prompt that only the short one's tokens prefix.
	q := append(append(append([]int(nil), prompt3...), short.Tokens[0]), tNL)
	if r := cachedRun(t, m, cache, q, 2, nil); r.CachedTokens != 4 {
		t.Errorf("%d cached tokens, want 4", r.CachedTokens)
	}
}

func TestCacheFailures(t *testing.T) {
	t.Run("a failed model call is not cached", func(t *testing.T) {
		m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA), failAt: 6}
		cache := NewCache(1)
		defer cache.Close()
		_, err := Generate(context.Background(), m, prompt3, Options{MaxTokens: 10, IgnoreEOS: true, Cache: cache}, nil)
		if !errors.Is(err, errFake) {
			t.Fatalf("error %v, want the model's failure", err)
		}
		if open, closed := m.stats(); open != 1 || closed != 1 || cache.Len() != 0 {
			t.Errorf("%d opened, %d closed, %d cached; want 1, 1, 0", open, closed, cache.Len())
		}
	})
	t.Run("cancelled inside a model call: not cached", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA), blockAt: 5, onBlock: cancel}
		cache := NewCache(1)
		defer cache.Close()
		res, err := Generate(ctx, m, prompt3, Options{MaxTokens: 10, IgnoreEOS: true, Cache: cache}, nil)
		if !errors.Is(err, context.Canceled) || res.Finish != FinishCancelled {
			t.Fatalf("error %v, finish %q; want cancelled", err, res.Finish)
		}
		if cache.Len() != 0 {
			t.Errorf("a sequence whose call was cancelled was cached")
		}
	})
	t.Run("cancelled between steps: cached and continued", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}
		cache := NewCache(1)
		defer cache.Close()
		n := 0
		res, err := Generate(ctx, m, prompt3, Options{MaxTokens: 10, IgnoreEOS: true, Sampler: newSeeded(7), Cache: cache}, func(Event) error {
			if n++; n == 3 {
				cancel()
			}
			return nil
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("error %v, want cancelled", err)
		}
		if cache.Len() != 1 {
			t.Fatalf("cache holds %d, want the cancelled generation's sequence", cache.Len())
		}
		// It holds the prompt and the first two tokens (the third was
		// sampled, then the loop saw the cancellation).
		p := append(append(append([]int(nil), prompt3...), res.Tokens...), tC)
		r := cachedRun(t, m, cache, p, 3, nil)
		if r.CachedTokens != 5 {
			t.Errorf("%d cached tokens, want 5", r.CachedTokens)
		}
		checkFresh(t, r.Tokens, p, 3)
	})
	for _, size := range []int{1, 2} {
		// A model that holds one sequence at a time: with one slot the miss
		// closes the sequence its put would evict before making its own;
		// with two, making one fails until the cached ones are freed.
		t.Run(fmt.Sprintf("a new sequence that needs the cached ones' memory, cache of %d", size), func(t *testing.T) {
			m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA), newFail: 1}
			cache := NewCache(size)
			defer cache.Close()
			cachedRun(t, m, cache, prompt3, 3, nil)
			r := cachedRun(t, m, cache, []int{tBOS, tE, tE}, 3, nil)
			if r.CachedTokens != 0 || len(r.Tokens) != 3 {
				t.Errorf("result %+v", r)
			}
			if open, closed := m.stats(); open != 2 || closed != 1 || cache.Len() != 1 {
				t.Errorf("%d opened, %d closed, %d cached; want 2, 1, 1", open, closed, cache.Len())
			}
		})
	}
	t.Run("a sequence whose length is not what was stored", func(t *testing.T) {
		m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}
		cache := NewCache(1)
		defer cache.Close()
		seq, _ := m.NewSequence()
		if _, err := seq.Append(context.Background(), []int{tBOS, tA, tB, tC}); err != nil {
			t.Fatal(err)
		}
		if err := cache.put(seq, prompt3, nil, nil); err != nil { // claims 3 tokens, holds 4
			t.Fatal(err)
		}
		r := cachedRun(t, m, cache, append(append([]int(nil), prompt3...), tC), 2, nil)
		if r.CachedTokens != 0 {
			t.Errorf("used a sequence holding %d tokens as one holding 3", seq.Len())
		}
		if open, closed := m.stats(); open != 2 || closed != 1 {
			t.Errorf("%d opened, %d closed; want 2, 1 (the bad one closed)", open, closed)
		}
	})
}

func TestCacheTakeIsExclusive(t *testing.T) {
	m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}
	cache := NewCache(2)
	res := cachedRun(t, m, cache, prompt3, 2, nil)
	p := append(append(append([]int(nil), prompt3...), res.Tokens...), tC)
	s1, n1, _ := cache.take(p)
	s2, n2, _ := cache.take(p)
	if s1 == nil || n1 != 4 || s2 != nil || n2 != 0 {
		t.Errorf("two takes: (%v, %d) then (%v, %d); want the sequence once", s1, n1, s2, n2)
	}
	if err := cache.Close(); err != nil {
		t.Fatal(err)
	}
	// After Close a stored sequence is closed at once.
	if err := cache.put(s1, prompt3, nil, nil); err != nil {
		t.Fatal(err)
	}
	if cache.Len() != 0 || !s1.(*fakeSeq).closed {
		t.Errorf("put after Close: %d cached, sequence closed %v", cache.Len(), s1.(*fakeSeq).closed)
	}
}

func TestCachePrefillRate(t *testing.T) {
	r := Result{PromptTokens: 100, CachedTokens: 60, Prefill: 2e9}
	if got := r.PrefillTokensPerSecond(); got != 20 {
		t.Errorf("prefill rate %v, want 20 (40 prefilled tokens in 2 s)", got)
	}
	if !reflect.DeepEqual(NewCache(0).max, 1) {
		t.Error("NewCache(0) keeps no sequence")
	}
}

// TestCacheSnapshot: with Options.Snapshot the cache also keeps a copy of
// the sequence taken before the prompt's last token, so that a next prompt
// that replaces that token (as a thinking chat's template does once the
// reasoning is dropped) continues from the copy.
func TestCacheSnapshot(t *testing.T) {
	p1 := []int{tBOS, tA, tB, tC, tD} // ends in the "marker" tD
	gen := func(m *fakeModel, cache *Cache, p []int, snapshot bool) Result {
		t.Helper()
		res, err := Generate(context.Background(), m, p, Options{MaxTokens: 4, IgnoreEOS: true, Sampler: newSeeded(7), Cache: cache, Snapshot: snapshot}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// The next turn: p1 without its marker, another token, more text.
	p2 := []int{tBOS, tA, tB, tC, tE, tA, tB}
	t.Run("continues from the copy", func(t *testing.T) {
		m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}
		cache := NewCache(1)
		defer cache.Close()
		first := gen(m, cache, p1, true)
		fresh := gen(&fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}, nil, p1, false)
		if !slices.Equal(first.Tokens, fresh.Tokens) {
			t.Errorf("feeding the prompt in two calls changed the tokens: %v, fresh %v", first.Tokens, fresh.Tokens)
		}
		if m.clones != 1 {
			t.Errorf("%d clones, want 1", m.clones)
		}
		m.appended = 0
		r := gen(m, cache, p2, true)
		if r.CachedTokens != 4 {
			t.Errorf("%d cached tokens, want 4 (the first prompt without its last token)", r.CachedTokens)
		}
		// Fed: the 3 new prompt tokens (2 + 1 around the new copy), then 3 decode steps.
		if m.appended != 3+3 {
			t.Errorf("fed %d tokens, want 6", m.appended)
		}
		want := gen(&fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}, nil, p2, false)
		if !slices.Equal(r.Tokens, want.Tokens) {
			t.Errorf("continued from the copy: %v, fresh %v", r.Tokens, want.Tokens)
		}
		// Opened: the first sequence, its copy (which the second turn
		// continued) and that one's copy. The first sequence (not a prefix
		// of p2) was closed when its copy was taken; the second turn's
		// sequence and copy are cached, as one entry.
		if open, closed := m.stats(); open != 3 || closed != 1 || cache.Len() != 1 {
			t.Errorf("%d opened, %d closed, %d cached; want 3, 1, 1", open, closed, cache.Len())
		}
	})
	t.Run("the sequence itself when the prompt extends it", func(t *testing.T) {
		m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}
		cache := NewCache(1)
		defer cache.Close()
		first := gen(m, cache, p1, true)
		p := append(append(append([]int(nil), p1...), first.Tokens...), tE)
		if r := gen(m, cache, p, true); r.CachedTokens != len(p1)+3 {
			t.Errorf("%d cached tokens, want %d", r.CachedTokens, len(p1)+3)
		}
	})
	t.Run("without Snapshot", func(t *testing.T) {
		m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}
		cache := NewCache(1)
		defer cache.Close()
		gen(m, cache, p1, false)
		if r := gen(m, cache, p2, false); r.CachedTokens != 0 || m.clones != 0 {
			t.Errorf("%d cached tokens, %d clones; want 0, 0", r.CachedTokens, m.clones)
		}
	})
	t.Run("a sequence that cannot clone", func(t *testing.T) {
		m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA), noClone: true}
		cache := NewCache(1)
		defer cache.Close()
		gen(m, cache, p1, true)
		if r := gen(m, cache, p2, true); r.CachedTokens != 0 {
			t.Errorf("%d cached tokens, want 0", r.CachedTokens)
		}
		if open, closed := m.stats(); open != 2 || closed != 1 {
			t.Errorf("%d opened, %d closed; want 2, 1", open, closed)
		}
	})
}
