// Package npy reads and writes NumPy .npy files of little-endian float32
// arrays (the logits format of moxie's golden files and `moxie logits`).
// Reading accepts format versions 1.0, 2.0 and 3.0, dtypes '<f4' and '<f8'
// (converted to float32), C order only.
package npy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Array is a decoded array: Data row-major with len(Data) = product of Shape.
type Array struct {
	Shape []int
	Data  []float32
}

var magic = []byte("\x93NUMPY")

// maxElements bounds what Parse will allocate (1<<31 floats = 8 GiB).
const maxElements = 1 << 31

var (
	reDescr   = regexp.MustCompile(`'descr'\s*:\s*'([^']*)'`)
	reFortran = regexp.MustCompile(`'fortran_order'\s*:\s*(True|False)`)
	reShape   = regexp.MustCompile(`'shape'\s*:\s*\(([^)]*)\)`)
)

// Parse decodes a .npy file held in memory. name is used in error messages.
func Parse(name string, b []byte) (*Array, error) {
	fail := func(f string, a ...any) (*Array, error) {
		return nil, fmt.Errorf("npy %s: %s", name, fmt.Sprintf(f, a...))
	}
	if len(b) < 10 || !bytes.Equal(b[:6], magic) {
		return fail("not a .npy file (missing \\x93NUMPY magic)")
	}
	major := b[6]
	var hlen, off int
	switch major {
	case 1:
		hlen, off = int(binary.LittleEndian.Uint16(b[8:10])), 10
	case 2, 3:
		if len(b) < 12 {
			return fail("truncated header")
		}
		h := binary.LittleEndian.Uint32(b[8:12])
		if h > 1<<20 {
			return fail("header length %d too large", h)
		}
		hlen, off = int(h), 12
	default:
		return fail("unsupported format version %d.%d (want 1.0, 2.0 or 3.0)", major, b[7])
	}
	if off+hlen > len(b) {
		return fail("header of %d bytes runs past the end of the %d-byte file", hlen, len(b))
	}
	hdr := string(b[off : off+hlen])
	m := reDescr.FindStringSubmatch(hdr)
	if m == nil {
		return fail("header has no 'descr': %q", hdr)
	}
	descr := m[1]
	var esize int
	switch descr {
	case "<f4":
		esize = 4
	case "<f8":
		esize = 8
	default:
		return fail("dtype %q, want '<f4' or '<f8'", descr)
	}
	if m := reFortran.FindStringSubmatch(hdr); m == nil || m[1] != "False" {
		return fail("fortran_order must be False (header %q)", hdr)
	}
	m = reShape.FindStringSubmatch(hdr)
	if m == nil {
		return fail("header has no 'shape': %q", hdr)
	}
	var shape []int
	n := 1
	for _, f := range strings.Split(m[1], ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		d, err := strconv.Atoi(f)
		if err != nil || d < 0 {
			return fail("bad shape dimension %q", f)
		}
		if d > 0 && n > maxElements/d {
			return fail("shape %s has more than %d elements", m[1], maxElements)
		}
		n *= d
		shape = append(shape, d)
	}
	body := b[off+hlen:]
	if len(body) != n*esize {
		return fail("data has %d bytes, want %d for shape %v of %s", len(body), n*esize, shape, descr)
	}
	a := &Array{Shape: shape, Data: make([]float32, n)}
	for i := range a.Data {
		if esize == 4 {
			a.Data[i] = math.Float32frombits(binary.LittleEndian.Uint32(body[4*i:]))
		} else {
			a.Data[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(body[8*i:])))
		}
	}
	return a, nil
}

// ReadFile reads and parses a .npy file.
func ReadFile(path string) (*Array, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, b)
}

// Write encodes data with the given shape as a version 1.0 '<f4' .npy stream.
// len(data) must equal the product of shape.
func Write(w io.Writer, data []float32, shape []int) error {
	n := 1
	dims := make([]string, len(shape))
	for i, d := range shape {
		if d < 0 {
			return fmt.Errorf("npy: negative dimension %d in shape %v", d, shape)
		}
		n *= d
		dims[i] = strconv.Itoa(d)
	}
	if n != len(data) {
		return fmt.Errorf("npy: %d values for shape %v (want %d)", len(data), shape, n)
	}
	st := strings.Join(dims, ", ")
	if len(shape) == 1 {
		st += ","
	}
	hdr := fmt.Sprintf("{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }", st)
	// Pad so that magic(6)+version(2)+len(2)+header+'\n' is a multiple of 64.
	total := 10 + len(hdr) + 1
	hdr += strings.Repeat(" ", (64-total%64)%64) + "\n"
	if len(hdr) > 65535 {
		return fmt.Errorf("npy: header too long")
	}
	buf := make([]byte, 0, 10+len(hdr)+4*len(data))
	buf = append(buf, magic...)
	buf = append(buf, 1, 0)
	buf = binary.LittleEndian.AppendUint16(buf, uint16(len(hdr)))
	buf = append(buf, hdr...)
	for _, v := range data {
		buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
	}
	_, err := w.Write(buf)
	return err
}

// WriteFile writes a .npy file atomically (a temporary file in the same
// directory, then rename).
func WriteFile(path string, data []float32, shape []int) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err = Write(f, data, shape); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
