package generate

import (
	"errors"
	"slices"
	"sync"
)

// Cache keeps the sequences of finished generations, each with the tokens
// it holds, so that a later generation whose prompt extends one of them
// (the next turn of a chat: the conversation so far, the model's reply,
// then the new message) continues that sequence and prefills only the new
// tokens instead of the whole prompt. Pass it in Options.Cache.
//
// A sequence cannot be rewound: a cached sequence is used only when its
// tokens are a proper prefix of the new prompt, token for token (so the
// chat template must render the earlier turns as the model saw them). A
// template that renders the end of the previous prompt differently in the
// next one (DeepSeek's, once it drops a thinking turn's reasoning) is
// served by Options.Snapshot: a copy of the sequence from before the
// prompt's last token, for sequences that can copy their state (Cloner).
// The result is the same function of the prompt as a fresh prefill,
// computed in other chunks: equal up to the model's rounding (a greedy
// choice between two logits within rounding of each other can differ).
//
// All generations that share a Cache must use the same model. A Cache is
// safe for concurrent use: a sequence is taken out while a generation
// uses it, so no two generations share one. Cached sequences keep their
// memory (host, or GPU for a device session) until evicted or Close.
type Cache struct {
	mu      sync.Mutex
	max     int
	entries []cacheEntry // least recently stored first
	closed  bool
	disk    *diskTier      // UseDisk; nil: memory only
	sending sync.WaitGroup // evictions on their way to the disk tier's writer
}

// cacheEntry is a finished generation's sequence and the tokens it holds,
// and optionally a copy taken before its prompt's last token (snap, holding
// snapTokens; Options.Snapshot).
type cacheEntry struct {
	seq        Sequence
	tokens     []int
	snap       Sequence
	snapTokens []int
}

// NewCache returns a cache that keeps at most n finished generations (at
// least 1), each a sequence and, with Options.Snapshot, its copy.
func NewCache(n int) *Cache { return &Cache{max: max(n, 1)} }

// Len returns the number of cached generations.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// take removes and returns the cached sequence (an entry's sequence or its
// snapshot) whose tokens are the longest proper prefix of prompt, and how
// many tokens it holds; nil and 0 when none is. The entry's other sequence
// is closed. With a disk tier, a file whose tokens are a longer prefix
// than any entry's is restored instead (fromDisk; the entries stay).
func (c *Cache) take(prompt []int) (seq Sequence, held int, fromDisk bool) {
	c.mu.Lock()
	d := c.disk
	_, _, n := c.bestMem(prompt)
	c.mu.Unlock()
	if d != nil {
		if f, ok := d.best(prompt, n); ok {
			// A new sequence, like a miss's: room first (makeRoom).
			_ = c.makeRoom()
			if s, err := d.restore(f); err == nil {
				return s, len(f.tokens), true
			}
		}
	}
	c.mu.Lock()
	best, snap, n := c.bestMem(prompt)
	if best < 0 {
		c.mu.Unlock()
		return nil, 0, false
	}
	e := c.entries[best]
	c.entries = append(c.entries[:best], c.entries[best+1:]...)
	c.mu.Unlock()
	if snap {
		_ = e.seq.Close()
		return e.snap, n, false
	}
	if e.snap != nil {
		_ = e.snap.Close()
	}
	return e.seq, n, false
}

// bestMem returns the entry (and whether its snapshot) whose tokens are the
// longest proper prefix of prompt and their count: -1 and 0 when none is;
// c.mu must be held.
func (c *Cache) bestMem(prompt []int) (best int, snap bool, n int) {
	best, n = -1, 0
	// longer: tokens are a proper prefix of prompt, longer than the best.
	longer := func(tokens []int) bool {
		return len(tokens) > n && len(tokens) < len(prompt) && slices.Equal(tokens, prompt[:len(tokens)])
	}
	for i, e := range c.entries {
		if longer(e.tokens) {
			best, snap, n = i, false, len(e.tokens)
		}
		if e.snap != nil && longer(e.snapTokens) {
			best, snap, n = i, true, len(e.snapTokens)
		}
	}
	return best, snap, n
}

// put stores seq, which holds tokens, with snap holding snapTokens (snap
// may be nil; the cache keeps its own copies of the token slices), and
// closes the least recently stored entries beyond the cache's size; after
// Close it closes seq and snap instead. The error joins the Close errors.
func (c *Cache) put(seq Sequence, tokens []int, snap Sequence, snapTokens []int) error {
	e := cacheEntry{seq: seq, tokens: slices.Clone(tokens)}
	if snap != nil {
		e.snap, e.snapTokens = snap, slices.Clone(snapTokens)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return closeAll([]cacheEntry{e})
	}
	c.entries = append(c.entries, e)
	evict := c.trim(c.max)
	d := c.async(evict)
	c.mu.Unlock()
	return c.retire(d, evict)
}

// async returns the disk tier that the evicted entries es go to in the
// background (nil: none, they are closed at once) and counts them as on
// their way; c.mu must be held.
func (c *Cache) async(es []cacheEntry) *diskTier {
	if c.disk == nil || len(es) == 0 || c.closed {
		return nil
	}
	c.sending.Add(1)
	return c.disk
}

// retire hands evicted entries to d's writer (which saves, then closes
// them), or closes them when d is nil.
func (c *Cache) retire(d *diskTier, es []cacheEntry) error {
	if d == nil {
		return closeAll(es)
	}
	defer c.sending.Done()
	for _, e := range es {
		d.pending.Add(1)
		d.queue <- e
	}
	return nil
}

// trim removes and returns the least recently stored entries beyond keep;
// c.mu must be held.
func (c *Cache) trim(keep int) []cacheEntry {
	n := len(c.entries) - keep
	if n <= 0 {
		return nil
	}
	evict := slices.Clone(c.entries[:n])
	c.entries = slices.Clone(c.entries[n:])
	return evict
}

// makeRoom closes the least recently stored sequences until storing one
// more would evict none: a generation that takes no cached sequence calls
// it before making its own, so that the sequence its put would evict does
// not hold memory while the new one is made and used.
func (c *Cache) makeRoom() error {
	c.mu.Lock()
	evict := c.trim(c.max - 1)
	d := c.async(evict)
	c.mu.Unlock()
	return c.retire(d, evict)
}

// Clear closes every cached sequence (freeing their memory) and empties
// the cache, which stays usable; with a disk tier each is written first,
// before Clear returns. The error joins the Close errors.
func (c *Cache) Clear() error {
	c.mu.Lock()
	evict := c.entries
	c.entries = nil
	d := c.disk
	c.mu.Unlock()
	if d == nil {
		return closeAll(evict)
	}
	var errs []error
	for _, e := range evict {
		errs = append(errs, d.retire(e))
	}
	return errors.Join(errs...)
}

// Close clears the cache (with a disk tier, once every sequence evicted
// earlier has been written too); sequences stored after it are closed at
// once.
func (c *Cache) Close() error {
	c.mu.Lock()
	first := !c.closed
	c.closed = true
	d := c.disk
	c.mu.Unlock()
	err := c.Clear()
	if d != nil && first {
		c.sending.Wait()
		close(d.queue)
		<-d.done
	}
	return err
}

func closeAll(es []cacheEntry) error {
	var errs []error
	for _, e := range es {
		errs = append(errs, e.seq.Close())
		if e.snap != nil {
			errs = append(errs, e.snap.Close())
		}
	}
	return errors.Join(errs...)
}

// checkpoints returns the prompt lengths to checkpoint at: cps, and with a
// disk tier whose DiskOptions.Every is set, its multiples below n.
func (c *Cache) checkpoints(cps []int, n int) []int {
	d := c.tier()
	if d == nil || d.opts.Every <= 0 {
		return cps
	}
	out := slices.Clone(cps)
	for k := d.opts.Every; k < n; k += d.opts.Every {
		out = append(out, k)
	}
	return out
}

// wantsCheckpoint reports whether a checkpoint of seq holding tokens would
// be written (Options.Checkpoints): a disk tier, a Saver, enough tokens,
// and no file with exactly these tokens yet.
func (c *Cache) wantsCheckpoint(seq Sequence, tokens []int) bool {
	d := c.tier()
	if d == nil || len(tokens) < max(d.opts.MinTokens, 1) {
		return false
	}
	if _, ok := seq.(Saver); !ok {
		return false
	}
	return !d.has(tokens)
}

// checkpoint writes seq, which holds tokens, to the disk tier now; a
// failure is reported to DiskOptions.OnError and otherwise ignored.
func (c *Cache) checkpoint(seq Sequence, tokens []int) {
	d := c.tier()
	if sv, ok := seq.(Saver); ok && d != nil {
		d.report(d.write(sv, tokens))
	}
}

// tier returns the disk tier (nil: none).
func (c *Cache) tier() *diskTier {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.disk
}
