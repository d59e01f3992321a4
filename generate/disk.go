package generate

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Saver is implemented by sequences that can write their state out (the
// CPU session; a GPU session's state lives on the device). A Cache with a
// disk tier (UseDisk) stores them.
type Saver interface {
	// SaveSequence writes the sequence's state to w. The sequence is
	// unchanged and stays usable.
	SaveSequence(w io.Writer) error
}

// Restorer is implemented by models that can read a saved sequence back.
type Restorer interface {
	// SequenceID identifies the model's weights: a state saved by a
	// sequence of a model with another ID is never restored.
	SequenceID() string
	// RestoreSequence reads one state, all of r, written by SaveSequence
	// of a sequence of this model, and returns a sequence in that state
	// (it continues exactly as the saved one would have). An error that
	// means the state itself is unusable (malformed, truncated, not this
	// model's) wraps ErrBadState; any other (no memory for a new
	// sequence) leaves a cache's file in place for a later try.
	RestoreSequence(r io.Reader) (Sequence, error)
}

// ErrBadState marks a saved sequence that cannot be restored whatever the
// circumstances (see Restorer).
var ErrBadState = errors.New("unusable saved sequence")

// DiskOptions configure a Cache's disk tier (Cache.UseDisk).
type DiskOptions struct {
	// Dir holds the saved sequences, a file each (*.mxseq); it is created
	// if missing. Files of other models (another SequenceID) are left alone.
	Dir string
	// Budget is the most bytes the files of this model may take; the least
	// recently used are removed beyond it. 0 means DefaultDiskBudget.
	Budget int64
	// MinTokens: shorter sequences are not written (they prefill quickly).
	MinTokens int
	// Every, if > 0, also checkpoints a prefill every Every prompt tokens
	// (Options.Checkpoints at its multiples), so that a later prompt that
	// shares any long start with this one (a document, then another
	// question) restores the last checkpoint inside the shared part.
	Every int
	// OnError, if set, hears what failed in the background (a write, a
	// corrupt file that was then removed); the cache carries on without it.
	OnError func(error)
}

// DefaultDiskBudget is DiskOptions.Budget's default: 16 GiB.
const DefaultDiskBudget = 16 << 30

// A saved sequence's file is, little-endian:
//
//	magic "moxieseq", u32 version (1)
//	u32 n, n bytes: the model's SequenceID (n <= 256)
//	u32 t, t × u32: the tokens the sequence holds (t <= 1<<24)
//	the state, as the sequence's SaveSequence wrote it (all bytes up to
//	the last four)
//	u32 CRC-32 (Castagnoli) of every byte before it
const (
	diskMagic   = "moxieseq"
	diskVersion = 1
	diskExt     = ".mxseq"
	maxDiskID   = 256
	maxDiskToks = 1 << 24
)

var diskCRC = crc32.MakeTable(crc32.Castagnoli)

// diskHeader is a saved sequence's file up to its state.
type diskHeader struct {
	id     string
	tokens []int
	size   int64 // the header's bytes
}

// readDiskHeader reads the header of a file of size bytes (magic,
// version, ID, tokens), checking every length against what is left of
// the file before reading it.
func readDiskHeader(r io.Reader, size int64) (diskHeader, error) {
	var h diskHeader
	br := bufio.NewReader(io.LimitReader(r, size))
	var b [12]byte
	if _, err := io.ReadFull(br, b[:12]); err != nil {
		return h, fmt.Errorf("truncated header (%d bytes)", size)
	}
	if string(b[:8]) != diskMagic {
		return h, fmt.Errorf("not a saved sequence (magic %q, want %q)", b[:8], diskMagic)
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != diskVersion {
		return h, fmt.Errorf("version %d, want %d", v, diskVersion)
	}
	left := size - 12 - 4 // less the checksum
	u32 := func(field string) (uint32, error) {
		if _, err := io.ReadFull(br, b[:4]); err != nil || left < 4 {
			return 0, fmt.Errorf("truncated inside %s", field)
		}
		left -= 4
		return binary.LittleEndian.Uint32(b[:4]), nil
	}
	n, err := u32("the ID's length")
	if err != nil {
		return h, err
	}
	if n > maxDiskID || int64(n) > left {
		return h, fmt.Errorf("ID length %d (at most %d, and %d bytes left)", n, maxDiskID, left)
	}
	id := make([]byte, n)
	if _, err := io.ReadFull(br, id); err != nil {
		return h, errors.New("truncated inside the ID")
	}
	left -= int64(n)
	t, err := u32("the token count")
	if err != nil {
		return h, err
	}
	if t > maxDiskToks || int64(t)*4 > left {
		return h, fmt.Errorf("token count %d (at most %d, and %d bytes left)", t, maxDiskToks, left)
	}
	toks := make([]int, t)
	for i := range toks {
		v, err := u32("the tokens")
		if err != nil {
			return h, err
		}
		if v > 1<<31-1 {
			return h, fmt.Errorf("token %d is %d", i, v)
		}
		toks[i] = int(v)
	}
	return diskHeader{id: string(id), tokens: toks, size: 12 + 4 + int64(n) + 4 + 4*int64(t)}, nil
}

// appendDiskHeader appends h's encoding (h.size is not used).
func appendDiskHeader(b []byte, id string, tokens []int) []byte {
	b = append(b, diskMagic...)
	b = binary.LittleEndian.AppendUint32(b, diskVersion)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(id)))
	b = append(b, id...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(tokens)))
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint32(b, uint32(t))
	}
	return b
}

// diskTier is a Cache's second tier: sequences evicted from memory are
// written to files, and a prompt that extends a file's tokens further
// than any sequence in memory restores it.
type diskTier struct {
	opts DiskOptions
	m    Restorer
	id   string

	mu      sync.Mutex
	files   []diskFile     // least recently used first
	total   int64          // bytes in files
	reading map[string]int // files claimed by best and not yet restored: never evicted

	queue   chan cacheEntry // evicted entries for the writer
	pending sync.WaitGroup  // entries queued and not yet written
	done    chan struct{}   // closed when the writer has drained the queue
}

type diskFile struct {
	name   string // base name in opts.Dir
	tokens []int
	size   int64
}

// UseDisk gives the cache a disk tier in opts.Dir for sequences of model m:
// a sequence evicted from memory (and every cached one at Close) is written
// there when it implements Saver and holds at least opts.MinTokens tokens,
// and a later prompt that extends a file's tokens further than any
// sequence in memory restores it instead of prefilling, in this process
// or a later one. The files written by earlier processes for this model
// are indexed now (the least recently used beyond the budget removed); it
// returns how many it keeps. Call it once, before the cache is used.
func (c *Cache) UseDisk(opts DiskOptions, m Restorer) (int, error) {
	if opts.Budget == 0 {
		opts.Budget = DefaultDiskBudget
	}
	if opts.Budget < 0 {
		return 0, fmt.Errorf("generate: disk cache budget %d bytes", opts.Budget)
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return 0, fmt.Errorf("generate: disk cache: %w", err)
	}
	d := &diskTier{opts: opts, m: m, id: m.SequenceID(), queue: make(chan cacheEntry, 4), done: make(chan struct{})}
	ents, err := os.ReadDir(opts.Dir)
	if err != nil {
		return 0, fmt.Errorf("generate: disk cache: %w", err)
	}
	type aged struct {
		f   diskFile
		mod time.Time
	}
	var found []aged
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".tmp-") { // a write that did not finish
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > time.Hour {
				_ = os.Remove(filepath.Join(opts.Dir, name))
			}
			continue
		}
		if !strings.HasSuffix(name, diskExt) || !e.Type().IsRegular() {
			continue
		}
		f, mod, err := d.index(name)
		if err != nil {
			d.report(err)
			continue
		}
		if f.tokens != nil {
			found = append(found, aged{f, mod})
		}
	}
	sort.SliceStable(found, func(i, j int) bool { return found[i].mod.Before(found[j].mod) })
	for _, a := range found {
		d.files = append(d.files, a.f)
		d.total += a.f.size
	}
	d.mu.Lock()
	evict := d.overBudget()
	d.mu.Unlock()
	d.remove(evict)
	c.mu.Lock()
	c.disk = d
	c.mu.Unlock()
	go d.writer()
	return len(d.files), nil
}

// index reads the header of file name; tokens nil: another model's.
func (d *diskTier) index(name string) (diskFile, time.Time, error) {
	path := filepath.Join(d.opts.Dir, name)
	f, err := os.Open(path)
	if err != nil {
		return diskFile{}, time.Time{}, fmt.Errorf("disk cache: %w", err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return diskFile{}, time.Time{}, fmt.Errorf("disk cache: %w", err)
	}
	h, err := readDiskHeader(f, info.Size())
	if err != nil {
		return diskFile{}, time.Time{}, fmt.Errorf("disk cache: %s: %w", path, err)
	}
	if h.id != d.id {
		return diskFile{}, time.Time{}, nil
	}
	return diskFile{name: name, tokens: h.tokens, size: info.Size()}, info.ModTime(), nil
}

func (d *diskTier) report(err error) {
	if d.opts.OnError != nil && err != nil {
		d.opts.OnError(err)
	}
}

// writer saves and closes the entries evicted from memory, in order.
func (d *diskTier) writer() {
	defer close(d.done)
	for e := range d.queue {
		d.report(d.retire(e))
		d.pending.Done()
	}
}

// retire writes e's sequences (those that can be saved and are long
// enough) and closes them.
func (d *diskTier) retire(e cacheEntry) error {
	var errs []error
	for _, p := range []struct {
		s    Sequence
		toks []int
	}{{e.seq, e.tokens}, {e.snap, e.snapTokens}} {
		if p.s == nil {
			continue
		}
		if sv, ok := p.s.(Saver); ok && len(p.toks) >= max(d.opts.MinTokens, 1) && p.s.Len() == len(p.toks) {
			d.report(d.write(sv, p.toks))
		}
		errs = append(errs, p.s.Close())
	}
	return errors.Join(errs...)
}

// fileName is the file of a sequence holding tokens.
func (d *diskTier) fileName(tokens []int) string {
	h := sha256.New()
	h.Write([]byte(d.id))
	var b [4]byte
	for _, t := range tokens {
		binary.LittleEndian.PutUint32(b[:], uint32(t))
		h.Write(b[:])
	}
	return hex.EncodeToString(h.Sum(nil)[:16]) + diskExt
}

// write saves s, which holds tokens, to a temporary file renamed into
// place, then removes the least recently used files beyond the budget.
func (d *diskTier) write(s Saver, tokens []int) error {
	if len(tokens) > maxDiskToks {
		return nil
	}
	tmp, err := os.CreateTemp(d.opts.Dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("disk cache: %w", err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	crc := crc32.New(diskCRC)
	bw := bufio.NewWriterSize(io.MultiWriter(tmp, crc), 1<<20)
	_, err = bw.Write(appendDiskHeader(nil, d.id, tokens))
	if err == nil {
		err = s.SaveSequence(bw)
	}
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		_, err = tmp.Write(binary.LittleEndian.AppendUint32(nil, crc.Sum32()))
	}
	var size int64
	if err == nil {
		var info os.FileInfo
		if info, err = tmp.Stat(); err == nil {
			size = info.Size()
		}
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	name := d.fileName(tokens)
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(d.opts.Dir, name))
	}
	if err != nil {
		return fmt.Errorf("disk cache: saving a %d-token sequence: %w", len(tokens), err)
	}
	d.mu.Lock()
	d.drop(name)
	d.files = append(d.files, diskFile{name: name, tokens: slices.Clone(tokens), size: size})
	d.total += size
	evict := d.overBudget()
	d.mu.Unlock()
	d.remove(evict)
	return nil
}

// overBudget takes the least recently used files beyond the budget out of
// the index and returns their names; d.mu must be held. A file being
// restored is passed over (the total may stay above the budget until it is
// restored).
func (d *diskTier) overBudget() []string {
	var evict []string
	for i := 0; d.total > d.opts.Budget && i < len(d.files); {
		f := d.files[i]
		if d.reading[f.name] > 0 {
			i++
			continue
		}
		evict = append(evict, f.name)
		d.total -= f.size
		d.files = slices.Delete(d.files, i, i+1)
	}
	return evict
}

// remove deletes the named files.
func (d *diskTier) remove(names []string) {
	for _, n := range names {
		_ = os.Remove(filepath.Join(d.opts.Dir, n))
	}
}

// find returns the index entry of file name, or -1; d.mu must be held.
func (d *diskTier) find(name string) int {
	return slices.IndexFunc(d.files, func(f diskFile) bool { return f.name == name })
}

// drop removes name from the index; d.mu must be held.
func (d *diskTier) drop(name string) {
	if i := d.find(name); i >= 0 {
		d.total -= d.files[i].size
		d.files = slices.Delete(d.files, i, i+1)
	}
}

// has reports whether a file holds exactly tokens.
func (d *diskTier) has(tokens []int) bool {
	name := d.fileName(tokens)
	d.mu.Lock()
	defer d.mu.Unlock()
	i := d.find(name)
	return i >= 0 && slices.Equal(d.files[i].tokens, tokens)
}

// best returns the file whose tokens are the longest proper prefix of
// prompt longer than n tokens (ok false when none is). The file is claimed:
// marked most recently used and kept from eviction (by the writer, whose
// writes may push the tier over its budget meanwhile) until restore is
// called with it, which the caller must do.
func (d *diskTier) best(prompt []int, n int) (diskFile, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	at := -1
	for i, f := range d.files {
		if len(f.tokens) > n && len(f.tokens) < len(prompt) && slices.Equal(f.tokens, prompt[:len(f.tokens)]) {
			at, n = i, len(f.tokens)
		}
	}
	if at < 0 {
		return diskFile{}, false
	}
	f := d.files[at]
	d.files = append(slices.Delete(d.files, at, at+1), f)
	if d.reading == nil {
		d.reading = make(map[string]int)
	}
	d.reading[f.name]++
	return f, true
}

// restore reads f, claimed by best, back into a sequence, marks it
// recently used and releases the claim. A failure is reported; a file whose
// state is unusable (ErrBadState) is removed, one that has gone leaves the
// index, and any other keeps both.
func (d *diskTier) restore(f diskFile) (Sequence, error) {
	path := filepath.Join(d.opts.Dir, f.name)
	seq, err := d.read(path, f)
	bad, gone := errors.Is(err, ErrBadState), errors.Is(err, os.ErrNotExist)
	d.mu.Lock()
	if d.reading[f.name]--; d.reading[f.name] <= 0 {
		delete(d.reading, f.name)
	}
	switch i := d.find(f.name); {
	case bad || gone:
		d.drop(f.name)
	case err == nil && i >= 0: // most recently used last
		g := d.files[i]
		d.files = append(slices.Delete(d.files, i, i+1), g)
	}
	evict := d.overBudget() // what a write passed over while f was claimed
	d.mu.Unlock()
	d.remove(evict)
	switch {
	case bad:
		_ = os.Remove(path)
		err = fmt.Errorf("disk cache: %s (removed): %w", path, err)
	case err != nil:
		err = fmt.Errorf("disk cache: %s: %w", path, err)
	}
	if err != nil {
		d.report(err)
		return nil, err
	}
	now := time.Now()
	_ = os.Chtimes(path, now, now)
	return seq, nil
}

func (d *diskTier) read(path string, f diskFile) (Sequence, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	info, err := file.Stat()
	if err != nil {
		return nil, err
	}
	size := info.Size()
	h, err := readDiskHeader(file, size)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: %w", ErrBadState, err)
	case h.id != d.id || !slices.Equal(h.tokens, f.tokens):
		return nil, fmt.Errorf("%w: changed since it was indexed", ErrBadState)
	}
	// readDiskHeader buffers: the checksum starts from the header's
	// encoding (its bytes, as it accepted them), and reading goes on from
	// the header's end.
	crc := crc32.New(diskCRC)
	crc.Write(appendDiskHeader(nil, h.id, h.tokens))
	if _, err := file.Seek(h.size, io.SeekStart); err != nil {
		return nil, err
	}
	state := size - h.size - 4
	lr := io.LimitReader(io.TeeReader(file, crc), state)
	seq, err := d.m.RestoreSequence(lr)
	if err != nil {
		return nil, err
	}
	left, _ := io.Copy(io.Discard, lr)
	var b [4]byte
	_, err = io.ReadFull(file, b[:])
	switch {
	case left > 0:
		err = fmt.Errorf("%w: the model read %d bytes of a %d-byte state", ErrBadState, state-left, state)
	case err != nil:
		err = fmt.Errorf("%w: truncated inside the checksum", ErrBadState)
	case binary.LittleEndian.Uint32(b[:]) != crc.Sum32():
		err = fmt.Errorf("%w: corrupt (checksum %08x, contents give %08x)", ErrBadState, binary.LittleEndian.Uint32(b[:]), crc.Sum32())
	case seq.Len() != len(h.tokens):
		err = fmt.Errorf("%w: restored %d tokens, the file names %d", ErrBadState, seq.Len(), len(h.tokens))
	}
	if err != nil {
		_ = seq.Close()
		return nil, err
	}
	return seq, nil
}
