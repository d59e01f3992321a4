// Package trace reads and writes route traces: every routing decision a forward
// pass makes (token position, layer, selected experts and their weights), with a
// header describing the model, so that residency policies can be replayed
// offline (package experts/sim, `moxie residency`).
//
// # File format (version 1, all integers little-endian)
//
//	offset  size  field
//	0       8     magic "MOXROUTE"
//	8       4     version (1)
//	12      4     layers: number of MoE layers (main layers, then MTP blocks), 1..4096
//	16      4     experts: routed experts per layer, 1..65535
//	20      4     topk: experts selected per token, 1..experts (and <= 64)
//	24      8     expert bytes: stored bytes of one routed expert (0 = unknown)
//	32      8     dense bytes per token: non-expert weight bytes one decode step reads (0 = unknown)
//	40      2     name length n, 0..1024
//	42      n     model name, UTF-8
//
// followed by records, each 6 + 6·topk bytes:
//
//	4       position (absolute token position, uint32)
//	2       layer (< layers)
//	2·topk  expert ids (uint16, each < experts, distinct within a record)
//	4·topk  weights (float32, finite)
//
// A file ends after a whole record; a partial record is an error.
//
// Recording (`--record-routes FILE`):
//
//	w, err := trace.Create(path, trace.HeaderFor(src.Name(), cfg))
//	m, err := dsv4.Load(src, dsv4.Options{Routes: w, ...})
//	... run the model ...
//	err = w.Close() // reports the first write error; the file appears only on success
package trace

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"unicode/utf8"

	"moxie/dsv4/config"
)

// Magic starts every route trace file.
const Magic = "MOXROUTE"

// Version is the format version this package writes and reads.
const Version = 1

// Limits on header fields.
const (
	MaxLayers  = 4096
	MaxExperts = 65535
	MaxTopK    = 64
	MaxName    = 1024
)

const fixedHeader = 42

// Header describes the model a trace was recorded from.
type Header struct {
	Name    string // model name (a directory or synth:... spec)
	Layers  int    // MoE layers, main then MTP
	Experts int    // routed experts per layer
	TopK    int    // experts per token
	// ExpertBytes is the stored size of one routed expert (w1, w3, w2 and their
	// scales); 0 if unknown.
	ExpertBytes int64
	// DenseBytesPerToken is what one decode step reads besides routed experts
	// (dense weights, one embedding row, the head); 0 if unknown.
	DenseBytesPerToken int64
}

// HeaderFor describes a model with configuration c: layers counts the main
// stack and the MTP blocks; ExpertBytes is config.ExpertBytes and
// DenseBytesPerToken is config.DenseBytesPerToken.
func HeaderFor(name string, c *config.Config) Header {
	return Header{Name: name, Layers: c.NLayers + c.NMTPLayers, Experts: c.NRoutedExperts, TopK: c.NActivatedExperts,
		ExpertBytes: config.ExpertBytes(c), DenseBytesPerToken: config.DenseBytesPerToken(c)}
}

// Validate checks the header's fields against the format's limits.
func (h Header) Validate() error {
	switch {
	case h.Layers < 1 || h.Layers > MaxLayers:
		return fmt.Errorf("layers is %d, want 1..%d", h.Layers, MaxLayers)
	case h.Experts < 1 || h.Experts > MaxExperts:
		return fmt.Errorf("experts is %d, want 1..%d", h.Experts, MaxExperts)
	case h.TopK < 1 || h.TopK > h.Experts || h.TopK > MaxTopK:
		return fmt.Errorf("topk is %d, want 1..%d", h.TopK, min(h.Experts, MaxTopK))
	case h.ExpertBytes < 0:
		return fmt.Errorf("expert bytes is %d, want >= 0", h.ExpertBytes)
	case h.DenseBytesPerToken < 0:
		return fmt.Errorf("dense bytes per token is %d, want >= 0", h.DenseBytesPerToken)
	case len(h.Name) > MaxName:
		return fmt.Errorf("name is %d bytes, want at most %d", len(h.Name), MaxName)
	case !utf8.ValidString(h.Name):
		return fmt.Errorf("name %q is not valid UTF-8", h.Name)
	}
	return nil
}

// RecordSize is the byte length of one record.
func (h Header) RecordSize() int { return 6 + 6*h.TopK }

// Record is one routing decision: the token at Pos, in Layer, went to Experts
// with Weights (selection order).
type Record struct {
	Pos     int
	Layer   int
	Experts []int
	Weights []float32
}

// Writer writes a trace. It implements dsv4.RouteRecorder; since RecordRoute
// cannot return an error, the first error is kept and returned by Err and Close,
// and later records are dropped. A Writer is not safe for concurrent use.
type Writer struct {
	h    Header
	bw   *bufio.Writer
	buf  []byte
	err  error
	n    int64
	file *os.File // set by Create
	path string
}

// NewWriter writes h to w and returns a writer for records. Close flushes but
// does not close w.
func NewWriter(w io.Writer, h Header) (*Writer, error) {
	if err := h.Validate(); err != nil {
		return nil, fmt.Errorf("trace header: %w", err)
	}
	tw := &Writer{h: h, bw: bufio.NewWriterSize(w, 1<<16), buf: make([]byte, h.RecordSize())}
	hdr := make([]byte, fixedHeader, fixedHeader+len(h.Name))
	copy(hdr, Magic)
	le := binary.LittleEndian
	le.PutUint32(hdr[8:], Version)
	le.PutUint32(hdr[12:], uint32(h.Layers))
	le.PutUint32(hdr[16:], uint32(h.Experts))
	le.PutUint32(hdr[20:], uint32(h.TopK))
	le.PutUint64(hdr[24:], uint64(h.ExpertBytes))
	le.PutUint64(hdr[32:], uint64(h.DenseBytesPerToken))
	le.PutUint16(hdr[40:], uint16(len(h.Name)))
	hdr = append(hdr, h.Name...)
	if _, err := tw.bw.Write(hdr); err != nil {
		return nil, fmt.Errorf("trace header: %w", err)
	}
	return tw, nil
}

// Create writes a trace to path: records go to a temporary file beside it,
// renamed to path by a successful Close (so path appears complete or not at all).
func Create(path string, h Header) (*Writer, error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return nil, fmt.Errorf("route trace %s: %w", path, err)
	}
	w, err := NewWriter(f, h)
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, fmt.Errorf("route trace %s: %w", path, err)
	}
	w.file, w.path = f, path
	return w, nil
}

// RecordRoute appends one record (dsv4.RouteRecorder). experts and weights must
// have TopK entries, experts distinct and in range, weights finite; otherwise
// the writer fails (see Err).
func (w *Writer) RecordRoute(pos, layer int, experts []int, weights []float32) {
	if w.err != nil {
		return
	}
	if err := w.check(pos, layer, experts, weights); err != nil {
		w.err = fmt.Errorf("route trace record %d: %w", w.n, err)
		return
	}
	le := binary.LittleEndian
	b := w.buf
	le.PutUint32(b, uint32(pos))
	le.PutUint16(b[4:], uint16(layer))
	K := w.h.TopK
	for i, e := range experts {
		le.PutUint16(b[6+2*i:], uint16(e))
		le.PutUint32(b[6+2*K+4*i:], math.Float32bits(weights[i]))
	}
	if _, err := w.bw.Write(b); err != nil {
		w.err = fmt.Errorf("route trace: %w", err)
		return
	}
	w.n++
}

func (w *Writer) check(pos, layer int, experts []int, weights []float32) error {
	h := w.h
	if pos < 0 || pos > math.MaxUint32 {
		return fmt.Errorf("position %d out of range 0..%d", pos, uint32(math.MaxUint32))
	}
	if layer < 0 || layer >= h.Layers {
		return fmt.Errorf("layer %d out of range 0..%d", layer, h.Layers-1)
	}
	if len(experts) != h.TopK || len(weights) != h.TopK {
		return fmt.Errorf("%d experts and %d weights, want %d each", len(experts), len(weights), h.TopK)
	}
	return checkRoute(h, experts, weights)
}

func checkRoute(h Header, experts []int, weights []float32) error {
	for i, e := range experts {
		if e < 0 || e >= h.Experts {
			return fmt.Errorf("expert %d out of range 0..%d", e, h.Experts-1)
		}
		for _, f := range experts[:i] {
			if f == e {
				return fmt.Errorf("expert %d selected twice", e)
			}
		}
		if v := float64(weights[i]); math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("weight %d of expert %d is %v, want finite", i, e, weights[i])
		}
	}
	return nil
}

// Records is the number of records written so far.
func (w *Writer) Records() int64 { return w.n }

// Err is the first error the writer met, or nil.
func (w *Writer) Err() error { return w.err }

// Close flushes the records. For a writer from Create it also syncs, closes and
// renames the file into place, or removes it when an error occurred.
func (w *Writer) Close() error {
	err := w.err
	if ferr := w.bw.Flush(); err == nil && ferr != nil {
		err = fmt.Errorf("route trace: %w", ferr)
	}
	if w.file == nil {
		return err
	}
	f := w.file
	w.file = nil
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), w.path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("route trace %s: %w", w.path, err)
	}
	return nil
}

// Reader reads a trace record by record, validating every field.
type Reader struct {
	h   Header
	r   *bufio.Reader
	buf []byte
	n   int64
	off int64
}

// NewReader reads and validates the header.
func NewReader(r io.Reader) (*Reader, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	hdr := make([]byte, fixedHeader)
	if _, err := io.ReadFull(br, hdr); err != nil {
		return nil, fmt.Errorf("route trace header: %w (want %d bytes)", noEOF(err), fixedHeader)
	}
	if string(hdr[:8]) != Magic {
		return nil, fmt.Errorf("route trace header: magic %q, want %q (not a moxie route trace)", hdr[:8], Magic)
	}
	le := binary.LittleEndian
	if v := le.Uint32(hdr[8:]); v != Version {
		return nil, fmt.Errorf("route trace header: version %d, want %d", v, Version)
	}
	u32 := func(o int) int { return int(le.Uint32(hdr[o:])) }
	h := Header{Layers: u32(12), Experts: u32(16), TopK: u32(20)}
	eb, db := le.Uint64(hdr[24:]), le.Uint64(hdr[32:])
	if eb > math.MaxInt64 || db > math.MaxInt64 {
		return nil, fmt.Errorf("route trace header: expert bytes %d or dense bytes %d too large", eb, db)
	}
	h.ExpertBytes, h.DenseBytesPerToken = int64(eb), int64(db)
	nl := int(le.Uint16(hdr[40:]))
	if nl > MaxName {
		return nil, fmt.Errorf("route trace header: name is %d bytes, want at most %d", nl, MaxName)
	}
	name := make([]byte, nl)
	if _, err := io.ReadFull(br, name); err != nil {
		return nil, fmt.Errorf("route trace header: name of %d bytes: %w", nl, noEOF(err))
	}
	h.Name = string(name)
	if err := h.Validate(); err != nil {
		return nil, fmt.Errorf("route trace header: %w", err)
	}
	return &Reader{h: h, r: br, buf: make([]byte, h.RecordSize()), off: int64(fixedHeader + nl)}, nil
}

// Header is the trace's header.
func (r *Reader) Header() Header { return r.h }

// Next reads one record. It returns io.EOF after the last whole record, and an
// error naming the record and byte offset for a partial or invalid one. The
// record's slices are freshly allocated.
func (r *Reader) Next() (Record, error) {
	n, err := io.ReadFull(r.r, r.buf)
	if err == io.EOF {
		return Record{}, io.EOF
	}
	if err != nil {
		return Record{}, fmt.Errorf("route trace record %d at byte %d: %d of %d bytes: %w (truncated file?)", r.n, r.off, n, len(r.buf), noEOF(err))
	}
	le := binary.LittleEndian
	b := r.buf
	h := r.h
	rec := Record{Pos: int(le.Uint32(b)), Layer: int(le.Uint16(b[4:])), Experts: make([]int, h.TopK), Weights: make([]float32, h.TopK)}
	for i := range h.TopK {
		rec.Experts[i] = int(le.Uint16(b[6+2*i:]))
		rec.Weights[i] = math.Float32frombits(le.Uint32(b[6+2*h.TopK+4*i:]))
	}
	if rec.Layer >= h.Layers {
		err = fmt.Errorf("layer %d out of range 0..%d", rec.Layer, h.Layers-1)
	} else {
		err = checkRoute(h, rec.Experts, rec.Weights)
	}
	if err != nil {
		return Record{}, fmt.Errorf("route trace record %d at byte %d: %w", r.n, r.off, err)
	}
	r.n++
	r.off += int64(len(b))
	return rec, nil
}

// Trace is a whole trace in memory.
type Trace struct {
	Header  Header
	Records []Record
}

// Read reads a whole trace from r.
func Read(r io.Reader) (*Trace, error) {
	tr, err := NewReader(r)
	if err != nil {
		return nil, err
	}
	t := &Trace{Header: tr.Header()}
	for {
		rec, err := tr.Next()
		if err == io.EOF {
			return t, nil
		}
		if err != nil {
			return nil, err
		}
		t.Records = append(t.Records, rec)
	}
}

// ReadFile reads a whole trace file; errors name the file.
func ReadFile(path string) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t, err := Read(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
