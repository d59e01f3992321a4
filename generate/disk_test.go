package generate

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// The fake model saves a sequence as "fakeseq" and its history as u32s.
func (s *fakeSeq) SaveSequence(w io.Writer) error {
	if s.closed {
		return errors.New("save after close")
	}
	b := []byte("fakeseq")
	for _, t := range s.h {
		b = binary.LittleEndian.AppendUint32(b, uint32(t))
	}
	_, err := w.Write(b)
	return err
}

func (m *fakeModel) SequenceID() string { return "fake" + m.seqID }

func (m *fakeModel) RestoreSequence(r io.Reader) (Sequence, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	if m.restoreFail != nil {
		return nil, m.restoreFail
	}
	if !bytes.HasPrefix(b, []byte("fakeseq")) || (len(b)-7)%4 != 0 {
		return nil, fmt.Errorf("%w: fake model: not a saved sequence", ErrBadState)
	}
	b = b[7:]
	h := make([]int, len(b)/4)
	for i := range h {
		h[i] = int(binary.LittleEndian.Uint32(b[4*i:]))
	}
	m.mu.Lock()
	m.open++
	m.mu.Unlock()
	return &fakeSeq{m: m, h: h}, nil
}

// diskCache returns a cache of n sequences with a disk tier in dir for m;
// errors reported in the background are collected in *errs.
func diskCache(t *testing.T, m *fakeModel, n int, opts DiskOptions, errs *[]error) (*Cache, int) {
	t.Helper()
	c := NewCache(n)
	var mu sync.Mutex
	opts.OnError = func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if errs != nil {
			*errs = append(*errs, err)
		}
	}
	found, err := c.UseDisk(opts, m)
	if err != nil {
		t.Fatal(err)
	}
	return c, found
}

func mxseqFiles(t *testing.T, dir string) []string {
	t.Helper()
	f, err := filepath.Glob(filepath.Join(dir, "*"+diskExt))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// savedTurn runs prompt3 for 3 tokens with a disk cache in dir, closes the
// cache (writing the sequence), and returns the next turn's prompt: prompt3,
// the tokens generated, then tC.
func savedTurn(t *testing.T, m *fakeModel, dir string) []int {
	t.Helper()
	c, _ := diskCache(t, m, 1, DiskOptions{Dir: dir}, nil)
	r := cachedRun(t, m, c, prompt3, 3, nil)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	return append(append(slices.Clone(prompt3), r.Tokens...), tC)
}

// TestDiskCacheAcrossRestarts: a conversation's sequence written at Close
// is restored by the next process's cache: the next turn prefills only its
// new tokens and generates what a fresh sequence would.
func TestDiskCacheAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}
	c1, found := diskCache(t, m, 1, DiskOptions{Dir: dir}, nil)
	if found != 0 {
		t.Fatalf("an empty directory indexed %d files", found)
	}
	r1 := cachedRun(t, m, c1, prompt3, 5, nil)
	if len(mxseqFiles(t, dir)) != 0 {
		t.Fatal("a file was written while the sequence is still in memory")
	}
	if err := c1.Close(); err != nil {
		t.Fatal(err)
	}
	if n := len(mxseqFiles(t, dir)); n != 1 {
		t.Fatalf("Close wrote %d files, want 1", n)
	}
	turn2 := append(append(append([]int(nil), prompt3...), r1.Tokens...), tNL, tC)
	m2 := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}
	c2, found := diskCache(t, m2, 1, DiskOptions{Dir: dir}, nil)
	defer c2.Close()
	if found != 1 {
		t.Fatalf("the second cache indexed %d files, want 1", found)
	}
	r2 := cachedRun(t, m2, c2, turn2, 6, nil)
	if !r2.CachedFromDisk || r2.CachedTokens != 7 {
		t.Errorf("second turn: %d cached tokens, from disk %v; want 7 from disk", r2.CachedTokens, r2.CachedFromDisk)
	}
	if m2.appended != 3+5 {
		t.Errorf("second turn fed %d tokens to the model, want %d", m2.appended, 3+5)
	}
	checkFresh(t, r2.Tokens, turn2, 6)
	// The file stays: another conversation with the same start uses it too.
	other := append(append(append([]int(nil), prompt3...), r1.Tokens...), tNL, tD)
	if r := cachedRun(t, m2, c2, other, 2, nil); !r.CachedFromDisk || r.CachedTokens != 7 {
		t.Errorf("a second branch: %d cached tokens, from disk %v; want 7 from disk", r.CachedTokens, r.CachedFromDisk)
	}
}

// TestDiskCacheEviction: a sequence evicted from memory is written in the
// background; memory is preferred when it holds the longer prefix.
func TestDiskCacheEviction(t *testing.T) {
	dir := t.TempDir()
	m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}
	var errs []error
	c, _ := diskCache(t, m, 1, DiskOptions{Dir: dir}, &errs)
	defer c.Close()
	rA := cachedRun(t, m, c, prompt3, 4, nil)
	pB := []int{tC, tD, tE, tC}
	cachedRun(t, m, c, pB, 4, nil) // evicts A
	c.disk.pending.Wait()
	if n := len(mxseqFiles(t, dir)); n != 1 {
		t.Fatalf("after one eviction %d files, want 1", n)
	}
	turnA := append(append(append([]int(nil), prompt3...), rA.Tokens...), tC)
	r := cachedRun(t, m, c, turnA, 3, nil)
	if !r.CachedFromDisk || r.CachedTokens != len(prompt3)+3 {
		t.Errorf("A's next turn: %d cached, from disk %v; want %d from disk", r.CachedTokens, r.CachedFromDisk, len(prompt3)+3)
	}
	c.disk.pending.Wait() // B, evicted by A's turn, is on disk too
	// A's turn is in memory and on disk only as its shorter first turn:
	// memory wins.
	turnA3 := append(append(append([]int(nil), turnA...), r.Tokens[:2]...), tD)
	if r3 := cachedRun(t, m, c, turnA3, 2, nil); r3.CachedFromDisk || r3.CachedTokens != len(turnA)+2 {
		t.Errorf("A's third turn: %d cached, from disk %v; want %d from memory", r3.CachedTokens, r3.CachedFromDisk, len(turnA)+2)
	}
	if len(errs) != 0 {
		t.Errorf("errors reported: %v", errs)
	}
	open, closed := m.stats()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if o, cl := m.stats(); o != open || cl != o {
		t.Errorf("after Close %d sequences opened, %d closed (before: %d, %d)", o, cl, open, closed)
	}
}

// TestDiskCacheBudgetAndFilters: the least recently used files go beyond
// the budget; short sequences and other models' files are left alone.
func TestDiskCacheBudgetAndFilters(t *testing.T) {
	dir := t.TempDir()
	// Another model's file.
	om := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA), seqID: "-other"}
	oc, _ := diskCache(t, om, 1, DiskOptions{Dir: dir}, nil)
	cachedRun(t, om, oc, []int{tA, tB, tC, tD, tE, tA}, 2, nil)
	if err := oc.Close(); err != nil {
		t.Fatal(err)
	}
	otherFile := mxseqFiles(t, dir)
	if len(otherFile) != 1 {
		t.Fatalf("%d files, want the other model's 1", len(otherFile))
	}
	info, err := os.Stat(otherFile[0])
	if err != nil {
		t.Fatal(err)
	}
	m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}
	// Room for about two files of this size.
	opts := DiskOptions{Dir: dir, Budget: 2*info.Size() + 10, MinTokens: 5}
	c, found := diskCache(t, m, 1, opts, nil)
	if found != 0 {
		t.Errorf("indexed %d files, want 0 (the one there is another model's)", found)
	}
	cachedRun(t, m, c, []int{tA, tB, tC}, 1, nil) // 3 tokens held: under MinTokens
	prompts := [][]int{{tA, tB, tC, tD, tE, tA}, {tB, tB, tC, tD, tE, tA}, {tC, tB, tC, tD, tE, tA}, {tD, tD, tE}}
	var held [][]int // what each prompt's sequence holds: the prompt and the first token generated
	for _, p := range prompts {
		r := cachedRun(t, m, c, p, 2, nil)
		held = append(held, append(slices.Clone(p), r.Tokens[0]))
	}
	c.disk.pending.Wait()
	// Written: the three long ones (the short first and last are not);
	// the budget keeps two.
	files := mxseqFiles(t, dir)
	if len(files) != 3 || !slices.Contains(files, otherFile[0]) {
		t.Fatalf("files %v, want two of this model's and the other model's", files)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// A new process: the two files left serve their prompts' next turns
	// (newest first, so that the turns' own files, written as each is
	// evicted, push out nothing still to be checked).
	c2, found := diskCache(t, m, 1, opts, nil)
	defer c2.Close()
	if found != 2 {
		t.Errorf("the second cache indexed %d files, want 2", found)
	}
	// A smaller budget applies at once to what is there.
	tight := opts
	tight.Dir = t.TempDir()
	for _, f := range mxseqFiles(t, dir) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tight.Dir, filepath.Base(f)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tight.Budget = info.Size() + 10
	c3, n3 := diskCache(t, m, 1, tight, nil)
	defer c3.Close()
	if left := len(mxseqFiles(t, tight.Dir)); n3 != 1 || left != 2 { // this model's newer file and the other model's
		t.Errorf("a budget of one file: %d kept, %d files left; want 1 kept, 2 left", n3, left)
	}
	for i := 2; i >= 0; i-- {
		r := cachedRun(t, m, c2, append(slices.Clone(held[i]), tE), 1, nil)
		if want := i > 0; r.CachedFromDisk != want {
			t.Errorf("prompt %d: from disk %v (%d cached, generated %v), want %v (the first was evicted by the budget)", i, r.CachedFromDisk, r.CachedTokens, r.Tokens, want)
		}
	}
}

// TestDiskCacheClaimedFileKept: a file chosen for a prompt is not evicted
// by a write that pushes the tier over its budget before the file is read
// (the writer runs beside the generation that restores it); the next
// least recently used file goes instead, and the claimed one restores.
func TestDiskCacheClaimedFileKept(t *testing.T) {
	for _, c := range []struct {
		name  string
		files int64  // budget, in files of the size written here
		left  []bool // after the restore: A, B, C still on disk
	}{
		{"room for two", 2, []bool{true, false, true}},
		{"room for one", 1, []bool{true, false, false}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}
			cache, _ := diskCache(t, m, 1, DiskOptions{Dir: t.TempDir()}, nil)
			defer cache.Close()
			d := cache.disk
			seqs := [][]int{{tA, tB, tC, tD}, {tB, tB, tC, tD}, {tC, tB, tC, tD}} // A, B, C: files of one size
			save := func(toks []int) {
				t.Helper()
				if err := d.write(&fakeSeq{m: m, h: toks}, toks); err != nil {
					t.Fatal(err)
				}
			}
			save(seqs[0])
			save(seqs[1])
			d.mu.Lock()
			d.opts.Budget = c.files * d.files[0].size
			d.mu.Unlock()
			f, ok := d.best(append(slices.Clone(seqs[0]), tE), 0) // A, the least recently used
			if !ok {
				t.Fatal("no file for a prompt extending A's tokens")
			}
			save(seqs[2]) // over the budget while A is claimed
			seq, err := d.restore(f)
			if err != nil {
				t.Fatalf("restoring the claimed file: %v", err)
			}
			defer seq.Close()
			if seq.Len() != len(seqs[0]) {
				t.Errorf("restored %d tokens, want %d", seq.Len(), len(seqs[0]))
			}
			for i, toks := range seqs {
				_, err := os.Stat(filepath.Join(d.opts.Dir, d.fileName(toks)))
				if on := err == nil; on != c.left[i] || d.has(toks) != c.left[i] {
					t.Errorf("file %c: on disk %v, indexed %v; want %v", 'A'+i, on, d.has(toks), c.left[i])
				}
			}
			d.mu.Lock()
			claims := len(d.reading)
			d.mu.Unlock()
			if claims != 0 {
				t.Errorf("%d claims left after the restore", claims)
			}
		})
	}
}

// TestDiskCacheCorruptFile: a file that fails to restore is reported,
// removed and not used; the generation prefills instead and is right.
func TestDiskCacheCorruptFile(t *testing.T) {
	for _, c := range []struct {
		name string
		bad  func(b []byte) []byte
		want string
	}{
		{"flipped", func(b []byte) []byte { b[len(b)-6] ^= 1; return b }, "corrupt"},
		{"truncated", func(b []byte) []byte { return b[:len(b)-3] }, ""},
		{"garbage state", func(b []byte) []byte {
			h, _ := readDiskHeader(bytes.NewReader(b), int64(len(b)))
			copy(b[h.size:], "XXXX")
			return b
		}, "not a saved sequence"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}
			turn := savedTurn(t, m, dir)
			f := mxseqFiles(t, dir)[0]
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(f, c.bad(b), 0o644); err != nil {
				t.Fatal(err)
			}
			var errs []error
			c2, found := diskCache(t, m, 1, DiskOptions{Dir: dir}, &errs)
			defer c2.Close()
			r := cachedRun(t, m, c2, turn, 3, nil)
			if r.CachedTokens != 0 {
				t.Errorf("%d tokens taken from a damaged file", r.CachedTokens)
			}
			checkFresh(t, r.Tokens, turn, 3)
			if found == 1 { // indexed, then failed at restore
				if len(errs) != 1 || !strings.Contains(errs[0].Error(), c.want) || !strings.Contains(errs[0].Error(), "removed") {
					t.Errorf("reported %v, want one error containing %q and \"removed\"", errs, c.want)
				}
				if _, err := os.Stat(f); !os.IsNotExist(err) {
					t.Errorf("the damaged file is still there (%v)", err)
				}
			}
		})
	}
}

// FuzzDiskHeader: no header panics the reader, and what it accepts encodes
// back to the same bytes.
func FuzzDiskHeader(f *testing.F) {
	f.Add(appendDiskHeader(nil, "fake", []int{1, 2, 3}))
	f.Add(appendDiskHeader(nil, "0123456789abcdef0123456789abcdef", nil))
	f.Add([]byte("moxieseq\x01\x00\x00\x00\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, data []byte) {
		full := append(slices.Clone(data), 0, 0, 0, 0) // a checksum's room
		h, err := readDiskHeader(bytes.NewReader(full), int64(len(full)))
		if err != nil {
			return
		}
		enc := appendDiskHeader(nil, h.id, h.tokens)
		if int64(len(enc)) != h.size || !bytes.Equal(enc, data[:len(enc)]) {
			t.Fatalf("accepted %q (size %d), encodes back as %q", data, h.size, enc)
		}
	})
}

// TestDiskCacheCheckpoint: a checkpoint at the end of a shared start (a
// system prompt) is written during the first prefill and serves another
// conversation with that start, in this process and the next.
func TestDiskCacheCheckpoint(t *testing.T) {
	dir := t.TempDir()
	sys := []int{tBOS, tA, tB, tC, tD, tE}
	p1 := append(slices.Clone(sys), tA, tA, tB)
	p2 := append(slices.Clone(sys), tB, tC, tC, tD)
	m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}
	opts := DiskOptions{Dir: dir, MinTokens: 4}
	c, _ := diskCache(t, m, 1, opts, nil)
	run := func(c *Cache, m *fakeModel, p []int) Result {
		t.Helper()
		res, err := Generate(context.Background(), m, p, Options{MaxTokens: 3, IgnoreEOS: true, Sampler: newSeeded(7), Cache: c,
			Checkpoints: []int{len(sys), 2, len(p) - 1, len(p) + 5}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	run(c, m, p1)
	if f := mxseqFiles(t, dir); len(f) != 1 {
		t.Fatalf("after the first prefill %d files, want the checkpoint's 1", len(f))
	}
	m.appended = 0
	r2 := run(c, m, p2)
	if !r2.CachedFromDisk || r2.CachedTokens != len(sys) {
		t.Errorf("second conversation: %d cached, from disk %v; want %d from disk", r2.CachedTokens, r2.CachedFromDisk, len(sys))
	}
	if want := len(p2) - len(sys) + 2; m.appended != want {
		t.Errorf("second conversation fed %d tokens, want %d", m.appended, want)
	}
	checkFresh(t, r2.Tokens, p2, 3)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c2, found := diskCache(t, m, 4, opts, nil)
	defer c2.Close()
	if found != 3 { // the checkpoint and the two conversations
		t.Errorf("the next process indexed %d files, want 3", found)
	}
	p3 := append(slices.Clone(sys), tE, tE, tE)
	if r3 := run(c2, m, p3); !r3.CachedFromDisk || r3.CachedTokens != len(sys) {
		t.Errorf("third conversation: %d cached, from disk %v; want %d from disk", r3.CachedTokens, r3.CachedFromDisk, len(sys))
	}
	if n := len(mxseqFiles(t, dir)); n != 3 {
		t.Errorf("%d files after the third conversation, want 3 (no second checkpoint of the same start)", n)
	}
}

// TestDiskCacheEvery: DiskOptions.Every checkpoints a prefill at its
// multiples; a later prompt that shares a long start restores the last
// checkpoint inside it.
func TestDiskCacheEvery(t *testing.T) {
	dir := t.TempDir()
	m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}
	c, _ := diskCache(t, m, 1, DiskOptions{Dir: dir, Every: 4}, nil)
	defer c.Close()
	doc := []int{tBOS, tA, tB, tC, tD, tE, tA, tB, tC, tD, tE}
	cachedRun(t, m, c, doc, 2, nil)
	if n := len(mxseqFiles(t, dir)); n != 2 { // at 4 and 8 (not 12: the prompt has 11)
		t.Fatalf("%d files after an 11-token prefill, want the checkpoints at 4 and 8", n)
	}
	other := append(slices.Clone(doc[:9]), tA, tA, tE)
	r2 := cachedRun(t, m, c, other, 2, nil)
	if !r2.CachedFromDisk || r2.CachedTokens != 8 {
		t.Errorf("a prompt sharing 9 tokens: %d cached, from disk %v; want the checkpoint of 8", r2.CachedTokens, r2.CachedFromDisk)
	}
	checkFresh(t, r2.Tokens, other, 2)
}

// TestDiskCacheRestoreFailsForNow: a restore that fails for want of
// resources (not ErrBadState) keeps the file, and a later restore uses it.
func TestDiskCacheRestoreFailsForNow(t *testing.T) {
	dir := t.TempDir()
	m := &fakeModel{vocab: 16, maxCtx: 1000, eos: -1, next: script(3, tA)}
	turn := savedTurn(t, m, dir)
	m.restoreFail = errors.New("fake model: out of device memory")
	var errs []error
	c2, _ := diskCache(t, m, 1, DiskOptions{Dir: dir}, &errs)
	defer c2.Close()
	if r := cachedRun(t, m, c2, turn, 2, nil); r.CachedTokens != 0 {
		t.Errorf("%d cached tokens from a failed restore", r.CachedTokens)
	}
	if len(errs) != 1 || strings.Contains(errs[0].Error(), "removed") {
		t.Errorf("reported %v, want one error that keeps the file", errs)
	}
	m.restoreFail = nil
	if r := cachedRun(t, m, c2, turn, 2, nil); !r.CachedFromDisk {
		t.Errorf("after the failure cleared: %d cached, from disk %v; want the file restored", r.CachedTokens, r.CachedFromDisk)
	}
}
