package safetensors

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"unicode/utf8"

	"moxie/format"
)

// TensorSpec declares one tensor to be written.
type TensorSpec struct {
	Name  string
	DType format.DType
	Shape []int64
}

// Writer streams a safetensors file. The header is written first, from the specs
// given to Create; tensor data then follows contiguously in spec order. Nothing
// appears at the destination path until Close succeeds. A Writer is not safe for
// concurrent use.
type Writer struct {
	path, tmp string
	f         *os.File
	bw        *bufio.Writer
	specs     []TensorSpec
	sizes     []int64
	next      int   // index of the next tensor to write
	err       error // sticky: the temp file's contents are unusable
	state     int   // writerOpen, writerClosed, writerAborted
}

const (
	writerOpen = iota
	writerClosed
	writerAborted
)

// writeBuffer is the size of the buffer that coalesces small tensors.
const writeBuffer = 4 << 20

// Create starts writing a safetensors file to path, through a temporary file in
// the same directory. Specs fix the header: names must be unique, non-empty,
// valid UTF-8 and not "__metadata__"; dtypes valid; shapes non-negative with a
// byte size that fits int64. Metadata (nil for none) must be valid UTF-8. The
// JSON header is padded with spaces to a multiple of 8 bytes. Tensors must then
// be written with Write or WriteFrom in spec order, and the file finished with
// Close or discarded with Abort.
func Create(path string, specs []TensorSpec, metadata map[string]string) (*Writer, error) {
	sizes := make([]int64, len(specs))
	seen := make(map[string]struct{}, len(specs))
	cp := make([]TensorSpec, len(specs))
	for i, s := range specs {
		n, err := checkSpec(s)
		if err != nil {
			return nil, fmt.Errorf("safetensors: create %s: %w", path, err)
		}
		if _, dup := seen[s.Name]; dup {
			return nil, fmt.Errorf("safetensors: create %s: duplicate tensor name %q", path, s.Name)
		}
		seen[s.Name] = struct{}{}
		sizes[i] = n
		cp[i] = TensorSpec{Name: s.Name, DType: s.DType, Shape: append([]int64(nil), s.Shape...)}
	}
	for k, v := range metadata {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return nil, fmt.Errorf("safetensors: create %s: metadata %q: key and value must be valid UTF-8", path, k)
		}
	}
	hdr := encodeHeader(cp, sizes, metadata)
	if len(hdr)-8 > MaxHeaderSize {
		return nil, fmt.Errorf("safetensors: create %s: header is %d bytes, more than the %d-byte limit", path, len(hdr)-8, MaxHeaderSize)
	}
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".*.tmp")
	if err != nil {
		return nil, fmt.Errorf("safetensors: create %s: %w", path, err)
	}
	w := &Writer{path: path, tmp: f.Name(), f: f, bw: bufio.NewWriterSize(f, writeBuffer), specs: cp, sizes: sizes}
	if _, err := w.bw.Write(hdr); err != nil {
		w.Abort()
		return nil, fmt.Errorf("safetensors: create %s: %w", path, err)
	}
	return w, nil
}

// check verifies that name may be written next.
func (w *Writer) check(name string) error {
	switch {
	case w.state != writerOpen:
		return fmt.Errorf("safetensors: write %s: tensor %q: writer already closed or aborted", w.path, name)
	case w.err != nil:
		return w.err
	case w.next >= len(w.specs):
		return fmt.Errorf("safetensors: write %s: tensor %q: all %d tensors already written", w.path, name, len(w.specs))
	case w.specs[w.next].Name != name:
		return fmt.Errorf("safetensors: write %s: tensor %q written out of order: want %q next (spec order)", w.path, name, w.specs[w.next].Name)
	}
	return nil
}

// Write writes the data of the next tensor, which must be name, with exactly its
// byte size. A wrong name or size is an error that leaves the writer usable.
func (w *Writer) Write(name string, data []byte) error {
	if err := w.check(name); err != nil {
		return err
	}
	if int64(len(data)) != w.sizes[w.next] {
		return fmt.Errorf("safetensors: write %s: tensor %q: got %d bytes, want %d (shape %v of %s)",
			w.path, name, len(data), w.sizes[w.next], w.specs[w.next].Shape, w.specs[w.next].DType)
	}
	if _, err := w.bw.Write(data); err != nil {
		w.err = fmt.Errorf("safetensors: write %s: tensor %q: %w", w.path, name, err)
		return w.err
	}
	w.next++
	return nil
}

// WriteFrom copies the bytes of the next tensor, which must be name, from r
// without interpreting them. r must yield exactly the tensor's byte size: fewer
// or more bytes are an error (checking for more reads one extra byte), after
// which the writer only accepts Abort or Close (which fails).
func (w *Writer) WriteFrom(name string, r io.Reader) error {
	if err := w.check(name); err != nil {
		return err
	}
	want := w.sizes[w.next]
	n, err := io.CopyN(w.bw, r, want)
	if n != want {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		w.err = fmt.Errorf("safetensors: write %s: tensor %q: source gave %d of %d bytes: %w", w.path, name, n, want, err)
		return w.err
	}
	var extra [1]byte
	if k, _ := io.ReadFull(r, extra[:]); k != 0 {
		w.err = fmt.Errorf("safetensors: write %s: tensor %q: source holds more than the %d bytes wanted", w.path, name, want)
		return w.err
	}
	w.next++
	return nil
}

// Close finishes the file: if every tensor was written it flushes and fsyncs the
// temporary file, renames it over path (mode 0644) and fsyncs the directory.
// Otherwise, or on any error before the rename, it removes the temporary file,
// leaves path untouched and returns an error (if only the directory fsync after
// the rename fails, the file is in place and the error says so). Close after a
// successful Close returns nil.
func (w *Writer) Close() error {
	switch w.state {
	case writerClosed:
		return nil
	case writerAborted:
		return fmt.Errorf("safetensors: close %s: writer was aborted", w.path)
	}
	err := w.err
	if err == nil && w.next < len(w.specs) {
		err = fmt.Errorf("safetensors: close %s: only %d of %d tensors written, next missing is %q",
			w.path, w.next, len(w.specs), w.specs[w.next].Name)
	}
	if err == nil {
		err = w.finish()
	}
	if err != nil {
		w.Abort()
		return err
	}
	w.state = writerClosed
	return nil
}

func (w *Writer) finish() error {
	wrapErr := func(err error) error { return fmt.Errorf("safetensors: close %s: %w", w.path, err) }
	if err := w.bw.Flush(); err != nil {
		return wrapErr(err)
	}
	if err := w.f.Chmod(0o644); err != nil {
		return wrapErr(err)
	}
	if err := w.f.Sync(); err != nil {
		return wrapErr(err)
	}
	err := w.f.Close()
	w.f = nil
	if err != nil {
		return wrapErr(err)
	}
	if err := os.Rename(w.tmp, w.path); err != nil {
		return wrapErr(err)
	}
	if err := syncDir(filepath.Dir(w.path)); err != nil {
		return wrapErr(fmt.Errorf("file renamed into place, but %w", err))
	}
	return nil
}

// Abort discards the file: it removes the temporary file and leaves path
// untouched. Abort after Close (or a second Abort) does nothing, so
// `defer w.Abort()` is safe.
func (w *Writer) Abort() error {
	if w.state != writerOpen {
		return nil
	}
	w.state = writerAborted
	var errs []error
	if w.f != nil {
		errs = append(errs, w.f.Close())
		w.f = nil
	}
	if err := os.Remove(w.tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("safetensors: abort %s: %w", w.path, err)
	}
	return nil
}

// syncDir fsyncs a directory so a rename inside it is durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("safetensors: sync dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("safetensors: sync dir %s: %w", dir, err)
	}
	return nil
}

// writeFileAtomic writes data to path through a temporary file in the same
// directory, fsyncs it, renames it over path (mode 0644) and fsyncs the directory.
func writeFileAtomic(path string, data []byte) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err = f.Write(data); err != nil {
		return err
	}
	if err = f.Chmod(0o644); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(dir)
}
