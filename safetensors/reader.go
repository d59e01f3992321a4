// Package safetensors reads and writes safetensors files and the sharded index
// (model.safetensors.index.json) that ties a checkpoint's shards together.
//
// A safetensors file is an 8-byte little-endian u64 header length N, N bytes of
// JSON, then the data section. The JSON is one object mapping each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the start
// of the data section), plus an optional "__metadata__" object of string values.
//
// Readers validate the whole header before trusting any of it: the length prefix
// (non-zero, within the file, at most MaxHeaderSize), strict JSON (one object,
// no duplicate keys at any level, no unknown keys in a tensor entry, valid UTF-8,
// nesting at most 3 levels: the parser follows the fixed grammar, without
// recursion, and rejects the first unexpected '[' or '{'), known dtypes, non-negative shapes whose byte
// size fits int64 and equals end-begin, begin <= end, ranges inside the data
// section, and no two tensors sharing a byte. Gaps in the data section (bytes no
// tensor covers, including trailing bytes) are allowed. Zero-size tensors and
// scalars (shape []) are valid. Every failure is a *FormatError naming the file,
// the tensor and the field. Nothing is allocated in proportion to a claimed size
// before that claim has been checked against the real file size; parsing memory
// is proportional to the header length, itself at most MaxHeaderSize.
//
// Files are assumed immutable while open: Open maps the whole file, and if the
// file is truncated underneath the mapping, touching a view faults (SIGBUS).
package safetensors

import (
	"fmt"
	"io"
	"maps"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"moxie/format"
)

// TensorInfo describes one tensor stored in a file.
type TensorInfo struct {
	Name   string
	DType  format.DType
	Shape  []int64 // row-major, outermost first; [] for a scalar
	Offset int64   // absolute byte offset of the data in the file
	Size   int64   // byte length of the data: product(Shape) * DType.Size()
}

// File is an open, validated safetensors file. Its methods are safe for
// concurrent use; Close must not race with readers still using views from Data.
type File struct {
	path    string
	size    int64
	tensors []TensorInfo
	byName  map[string]int
	meta    map[string]string

	mu     sync.RWMutex
	closed bool
	mm     []byte      // the whole file, when memory-mapped
	r      io.ReaderAt // otherwise
}

// Open maps the file at path read-only and validates its header. Data returns
// zero-copy views of the mapping.
func Open(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, &FormatError{Path: path, Field: "file", Msg: fmt.Sprintf("is a %v, want a regular file", st.Mode().Type())}
	}
	size := st.Size()
	if size < 8 {
		_, err := headerLen(path, nil, size)
		return nil, err
	}
	if int64(int(size)) != size {
		return nil, &FormatError{Path: path, Field: "file", Msg: fmt.Sprintf("is %d bytes, too large to map", size)}
	}
	mm, err := unix.Mmap(int(fd.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("safetensors: mmap %s: %w", path, err)
	}
	f := &File{path: path, size: size, mm: mm}
	n, err := headerLen(path, mm[:8], size)
	if err == nil {
		err = f.init(mm[8 : 8+n])
	}
	if err != nil {
		unix.Munmap(mm)
		return nil, err
	}
	return f, nil
}

// OpenReaderAt validates the header of the size-byte safetensors file readable
// through r; path only names it in errors. Data and ReadAt read through r (with
// pread-style calls). The caller keeps ownership of r: Close does not close it,
// and r must stay usable until Close.
func OpenReaderAt(path string, r io.ReaderAt, size int64) (*File, error) {
	hdr, err := readHeaderBytes(path, r, size)
	if err != nil {
		return nil, err
	}
	f := &File{path: path, size: size, r: r}
	if err := f.init(hdr); err != nil {
		return nil, err
	}
	return f, nil
}

// ReadHeader reads and validates only the header of the file at path, without
// mapping it. Tensors are sorted by Offset; metadata is nil if absent.
func ReadHeader(path string) ([]TensorInfo, map[string]string, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("safetensors: %w", err)
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("safetensors: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, nil, &FormatError{Path: path, Field: "file", Msg: fmt.Sprintf("is a %v, want a regular file", st.Mode().Type())}
	}
	hdr, err := readHeaderBytes(path, fd, st.Size())
	if err != nil {
		return nil, nil, err
	}
	ts, meta, _, err := parseHeader(path, hdr, 8+int64(len(hdr)), st.Size()-8-int64(len(hdr)), false)
	return ts, meta, err
}

// readHeaderBytes reads the JSON header through r after validating its length.
func readHeaderBytes(path string, r io.ReaderAt, size int64) ([]byte, error) {
	var prefix [8]byte
	if size >= 8 {
		if _, err := r.ReadAt(prefix[:], 0); err != nil {
			return nil, fmt.Errorf("safetensors: %s: reading header length: %w", path, err)
		}
	}
	n, err := headerLen(path, prefix[:], size)
	if err != nil {
		return nil, err
	}
	hdr := make([]byte, n)
	if k, err := r.ReadAt(hdr, 8); k != len(hdr) {
		return nil, fmt.Errorf("safetensors: %s: reading %d-byte header: got %d bytes: %w", path, n, k, err)
	}
	return hdr, nil
}

func (f *File) init(hdr []byte) error {
	dataStart := 8 + int64(len(hdr))
	ts, meta, byName, err := parseHeader(f.path, hdr, dataStart, f.size-dataStart, true)
	if err != nil {
		return err
	}
	f.tensors, f.meta, f.byName = ts, meta, byName
	return nil
}

// Path returns the path the file was opened with.
func (f *File) Path() string { return f.path }

// Size returns the file size in bytes.
func (f *File) Size() int64 { return f.size }

// Tensors lists every tensor sorted by Offset (ties by name). The slice and the
// Shape slices are shared: do not modify them.
func (f *File) Tensors() []TensorInfo { return f.tensors }

// Lookup returns the description of the named tensor. Its Shape is shared: do
// not modify it.
func (f *File) Lookup(name string) (TensorInfo, bool) {
	i, ok := f.byName[name]
	if !ok {
		return TensorInfo{}, false
	}
	return f.tensors[i], true
}

// Metadata returns a copy of the header's __metadata__ (nil if absent).
func (f *File) Metadata() map[string]string { return maps.Clone(f.meta) }

// Data returns the raw stored bytes of the named tensor. For a mapped file the
// slice is a zero-copy read-only view (writing to it faults) valid until Close;
// for a file opened with OpenReaderAt it is a freshly read slice the caller owns.
func (f *File) Data(name string) ([]byte, error) {
	i, ok := f.byName[name]
	if !ok {
		return nil, fmt.Errorf("safetensors: %s: no tensor %q", f.path, name)
	}
	t := f.tensors[i]
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.closed {
		return nil, fmt.Errorf("safetensors: %s: Data(%q) after Close", f.path, name)
	}
	if f.mm != nil {
		return f.mm[t.Offset : t.Offset+t.Size : t.Offset+t.Size], nil
	}
	buf := make([]byte, t.Size)
	if k, err := f.r.ReadAt(buf, t.Offset); k != len(buf) {
		return nil, fmt.Errorf("safetensors: %s: tensor %q: read %d of %d bytes: %w", f.path, name, k, t.Size, err)
	}
	return buf, nil
}

// ReadAt reads len(p) bytes of the file starting at absolute offset off, with
// io.ReaderAt semantics (io.EOF when the file ends first). With
// io.NewSectionReader(f, t.Offset, t.Size) it gives a stream of one tensor.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.closed {
		return 0, fmt.Errorf("safetensors: %s: ReadAt after Close", f.path)
	}
	if off < 0 {
		return 0, fmt.Errorf("safetensors: %s: ReadAt at negative offset %d", f.path, off)
	}
	if off >= f.size {
		if len(p) == 0 {
			return 0, nil
		}
		return 0, io.EOF
	}
	if f.mm != nil {
		n := copy(p, f.mm[off:])
		if n < len(p) {
			return n, io.EOF
		}
		return n, nil
	}
	want := p
	if rem := f.size - off; int64(len(p)) > rem {
		want = p[:rem]
	}
	n, err := f.r.ReadAt(want, off)
	if err == nil && n < len(p) {
		err = io.EOF
	}
	if err == io.EOF && n == len(p) {
		err = nil
	}
	return n, err
}

// Close releases the mapping. Views returned by Data become invalid. Closing
// twice is a no-op.
func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	if f.mm != nil {
		mm := f.mm
		f.mm = nil
		if err := unix.Munmap(mm); err != nil {
			return fmt.Errorf("safetensors: munmap %s: %w", f.path, err)
		}
	}
	return nil
}
