package safetensors

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"moxie/format"
)

// MaxHeaderSize is the largest JSON header accepted, in bytes (100 MiB). The
// shipped DeepSeek-V4-Flash shards have headers of a few hundred KiB.
const MaxHeaderSize = 100 << 20

// maxRank bounds the number of dimensions of one tensor.
const maxRank = 64

// metadataKey is the reserved header key holding free-form string metadata.
const metadataKey = "__metadata__"

// FormatError reports a malformed safetensors file or shard index: which file,
// which tensor (when the problem concerns one), which field, and what was
// expected.
type FormatError struct {
	Path   string // the file
	Tensor string // the tensor concerned, or ""
	Field  string // e.g. "header length", "json", "dtype", "shape", "data_offsets", "__metadata__", "weight_map"
	Msg    string // what is wrong and what was expected
}

func (e *FormatError) Error() string {
	var b strings.Builder
	b.WriteString("safetensors: ")
	b.WriteString(e.Path)
	if e.Tensor != "" {
		b.WriteString(": tensor ")
		b.WriteString(strconv.Quote(e.Tensor))
	}
	if e.Field != "" {
		b.WriteString(": ")
		b.WriteString(e.Field)
	}
	b.WriteString(": ")
	b.WriteString(e.Msg)
	return b.String()
}

// wrap turns a scanner error into a FormatError with context; FormatErrors pass
// through unchanged.
func wrap(err error, path, tensor, field string) error {
	if err == nil {
		return nil
	}
	var fe *FormatError
	if errors.As(err, &fe) {
		return err
	}
	return &FormatError{Path: path, Tensor: tensor, Field: field, Msg: err.Error()}
}

// headerLen validates the 8-byte little-endian header length prefix of a file of
// the given size and returns the JSON header length.
func headerLen(path string, prefix []byte, size int64) (int64, error) {
	if size < 8 {
		return 0, &FormatError{Path: path, Field: "header length",
			Msg: fmt.Sprintf("file is %d bytes, want at least 8 (the little-endian u64 header length)", size)}
	}
	u := binary.LittleEndian.Uint64(prefix)
	switch {
	case u == 0:
		return 0, &FormatError{Path: path, Field: "header length", Msg: "is 0, want a JSON object of at least 2 bytes"}
	case u > uint64(size-8):
		return 0, &FormatError{Path: path, Field: "header length",
			Msg: fmt.Sprintf("is %d bytes, but only %d bytes follow the 8-byte prefix", u, size-8)}
	case u > MaxHeaderSize:
		return 0, &FormatError{Path: path, Field: "header length",
			Msg: fmt.Sprintf("is %d bytes, more than the %d-byte limit", u, MaxHeaderSize)}
	}
	return int64(u), nil
}

// parseHeader validates the JSON header hdr of a file whose data section starts
// at absolute offset dataStart and is dataLen bytes long. It returns the tensors
// sorted by offset (ties by name), the metadata (nil if absent) and, if wantIndex,
// a map from name to position in the returned slice.
func parseHeader(path string, hdr []byte, dataStart, dataLen int64, wantIndex bool) ([]TensorInfo, map[string]string, map[string]int, error) {
	p := &headerParser{
		s:         scanner{b: hdr},
		path:      path,
		dataStart: dataStart,
		dataLen:   dataLen,
	}
	s := &p.s
	// Capacity hints from the header length: an entry takes at least ~50 bytes.
	est := min(len(hdr)/96+1, 1<<16)
	p.tensors = make([]TensorInfo, 0, est)
	p.names = make(map[string]int, est)
	p.slab = make([]int64, 0, 2*est)
	if s.peek() != '{' {
		return nil, nil, nil, &FormatError{Path: path, Field: "json",
			Msg: fmt.Sprintf("header must be one JSON object starting with '{', found %s", s.found())}
	}
	err := s.object("the header", p.member)
	if err == nil {
		err = s.end()
	}
	if err != nil {
		return nil, nil, nil, wrap(err, path, "", "json")
	}
	moved, err := checkOverlap(path, p.tensors, dataStart)
	if err != nil {
		return nil, nil, nil, err
	}
	p.tensors = slices.Clip(p.tensors) // callers' appends must not share our array
	if !wantIndex {
		return p.tensors, p.meta, nil, nil
	}
	if moved {
		for i, t := range p.tensors {
			p.names[t.Name] = i
		}
	}
	return p.tensors, p.meta, p.names, nil
}

type headerParser struct {
	s                  scanner
	path               string
	dataStart, dataLen int64
	tensors            []TensorInfo
	names              map[string]int
	slab               []int64 // backing store for all shapes
	meta               map[string]string
	sawMeta            bool
	cur                entry              // the tensor entry being parsed
	entryFn            func([]byte) error // p.entryMember, bound once
}

// member parses one top-level member: __metadata__ or a tensor entry.
func (p *headerParser) member(key []byte) error {
	if string(key) == metadataKey {
		if p.sawMeta {
			return &FormatError{Path: p.path, Field: metadataKey, Msg: "appears twice, want at most once"}
		}
		p.sawMeta = true
		m, err := parseMetadata(&p.s, p.path)
		p.meta = m
		return err
	}
	if len(key) == 0 {
		return &FormatError{Path: p.path, Field: "name", Msg: "empty tensor name, want a non-empty string"}
	}
	if _, dup := p.names[string(key)]; dup {
		return &FormatError{Path: p.path, Tensor: string(key), Field: "name", Msg: "duplicate tensor name, want each name once"}
	}
	name := string(key)
	p.names[name] = len(p.tensors)
	t, err := p.tensor(name)
	if err != nil {
		return err
	}
	p.tensors = append(p.tensors, t)
	return nil
}

func parseMetadata(s *scanner, path string) (map[string]string, error) {
	if s.peek() == 'n' {
		return nil, wrap(s.literal("null"), path, "", metadataKey)
	}
	meta := make(map[string]string)
	err := s.object("__metadata__", func(kb []byte) error {
		k := string(kb)
		if _, dup := meta[k]; dup {
			return &FormatError{Path: path, Field: metadataKey, Msg: fmt.Sprintf("key %q appears twice, want each key once", k)}
		}
		if s.peek() != '"' {
			return &FormatError{Path: path, Field: metadataKey,
				Msg: fmt.Sprintf("value of key %q must be a string, found %s", k, s.found())}
		}
		v, err := s.str()
		if err != nil {
			return wrap(err, path, "", metadataKey)
		}
		meta[k] = v
		return nil
	})
	return meta, wrap(err, path, "", metadataKey)
}

// parseDType maps a dtype spelling to a DType without allocating.
func parseDType(b []byte) (format.DType, error) {
	for d := format.DType(1); d.Size() != 0; d++ {
		if string(b) == d.String() {
			return d, nil
		}
	}
	d, err := format.ParseDType(string(b))
	if err == nil && d.Size() == 0 {
		err = fmt.Errorf("dtype %q has no fixed element size", b)
	}
	return d, err
}

// entryMember parses one member of a tensor entry into p.cur.
func (p *headerParser) entryMember(key []byte) error {
	s, e := &p.s, &p.cur
	switch string(key) {
	case "dtype":
		e.field = "dtype"
		if e.haveDT {
			return s.errf("key appears twice")
		}
		e.haveDT = true
		v, err := s.strBytes()
		if err != nil {
			return err
		}
		if e.t.DType, err = parseDType(v); err != nil {
			return err
		}
	case "shape":
		e.field = "shape"
		if e.haveShape {
			return s.errf("key appears twice")
		}
		e.haveShape = true
		start := len(p.slab)
		var err error
		if p.slab, err = s.uintArray(p.slab, maxRank); err != nil {
			return err
		}
		e.t.Shape = p.slab[start:len(p.slab):len(p.slab)]
	case "data_offsets":
		e.field = "data_offsets"
		if e.haveOff {
			return s.errf("key appears twice")
		}
		e.haveOff = true
		var buf [2]int64
		off, err := s.uintArray(buf[:0], 2)
		if err != nil {
			return err
		}
		if len(off) != 2 {
			return fmt.Errorf("has %d entries, want exactly 2 [begin, end]", len(off))
		}
		e.begin, e.end = off[0], off[1]
	default:
		return fmt.Errorf("unknown key %q, want only dtype, shape, data_offsets", key)
	}
	e.field = "entry"
	return nil
}

// entry is the state of the tensor entry being parsed.
type entry struct {
	t                          TensorInfo
	haveDT, haveShape, haveOff bool
	begin, end                 int64
	field                      string
}

func (p *headerParser) tensor(name string) (TensorInfo, error) {
	p.cur = entry{t: TensorInfo{Name: name}, field: "entry"}
	if p.entryFn == nil {
		p.entryFn = p.entryMember
	}
	err := p.s.object("a tensor entry", p.entryFn)
	e := &p.cur
	t, haveDT, haveShape, haveOff, begin, end, field := e.t, e.haveDT, e.haveShape, e.haveOff, e.begin, e.end, e.field
	path := p.path
	if err != nil {
		return t, wrap(err, path, name, field)
	}
	switch {
	case !haveDT:
		return t, &FormatError{Path: path, Tensor: name, Field: "dtype", Msg: "missing, want a dtype string such as \"BF16\""}
	case !haveShape:
		return t, &FormatError{Path: path, Tensor: name, Field: "shape", Msg: "missing, want an array of non-negative integers"}
	case !haveOff:
		return t, &FormatError{Path: path, Tensor: name, Field: "data_offsets", Msg: "missing, want [begin, end] byte offsets into the data section"}
	case begin > end:
		return t, &FormatError{Path: path, Tensor: name, Field: "data_offsets",
			Msg: fmt.Sprintf("[%d, %d] has begin > end, want begin <= end", begin, end)}
	case end > p.dataLen:
		return t, &FormatError{Path: path, Tensor: name, Field: "data_offsets",
			Msg: fmt.Sprintf("[%d, %d] ends past the data section (%d bytes)", begin, end, p.dataLen)}
	}
	size, ok := byteSize(t.DType, t.Shape)
	if !ok {
		return t, &FormatError{Path: path, Tensor: name, Field: "shape",
			Msg: fmt.Sprintf("%v of %s overflows int64 bytes", t.Shape, t.DType)}
	}
	if size != end-begin {
		return t, &FormatError{Path: path, Tensor: name, Field: "data_offsets",
			Msg: fmt.Sprintf("[%d, %d] spans %d bytes, want %d (shape %v of %s)", begin, end, end-begin, size, t.Shape, t.DType)}
	}
	t.Offset = p.dataStart + begin
	t.Size = size
	return t, nil
}

// byteSize is the stored size of a tensor, or false if it (or the product of its
// non-zero dimensions times the element size) overflows int64.
func byteSize(dt format.DType, shape []int64) (int64, bool) {
	n := int64(dt.Size())
	zero := false
	for _, d := range shape {
		if d < 0 {
			return 0, false
		}
		if d == 0 {
			zero = true
			continue
		}
		if n > math.MaxInt64/d {
			return 0, false
		}
		n *= d
	}
	if zero {
		return 0, true
	}
	return n, true
}

// checkOverlap sorts tensors by (Offset, Name), reporting whether that moved
// any, and rejects two tensors whose non-empty byte ranges intersect. Empty
// tensors occupy no bytes.
// Ranges in errors are data_offsets, relative to dataStart.
func checkOverlap(path string, ts []TensorInfo, dataStart int64) (moved bool, err error) {
	byOffset := func(a, b TensorInfo) int {
		if c := cmp.Compare(a.Offset, b.Offset); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	}
	if !slices.IsSortedFunc(ts, byOffset) {
		slices.SortFunc(ts, byOffset)
		moved = true
	}
	var maxEnd int64
	owner := -1
	for i, t := range ts {
		if t.Size == 0 {
			continue
		}
		if owner >= 0 && t.Offset < maxEnd {
			o := ts[owner]
			return moved, &FormatError{Path: path, Tensor: t.Name, Field: "data_offsets",
				Msg: fmt.Sprintf("[%d, %d] overlaps tensor %q at [%d, %d], want disjoint byte ranges",
					t.Offset-dataStart, t.Offset+t.Size-dataStart, o.Name, o.Offset-dataStart, o.Offset+o.Size-dataStart)}
		}
		if e := t.Offset + t.Size; e > maxEnd {
			maxEnd, owner = e, i
		}
	}
	return moved, nil
}

// checkSpec validates one tensor spec for writing and returns its byte size.
func checkSpec(s TensorSpec) (int64, error) {
	switch {
	case s.Name == "":
		return 0, errors.New("empty tensor name")
	case s.Name == metadataKey:
		return 0, fmt.Errorf("tensor name %q is reserved", s.Name)
	case !utf8.ValidString(s.Name):
		return 0, fmt.Errorf("tensor name %q is not valid UTF-8", s.Name)
	case s.DType.Size() == 0:
		return 0, fmt.Errorf("tensor %q: invalid dtype %v", s.Name, s.DType)
	case len(s.Shape) > maxRank:
		return 0, fmt.Errorf("tensor %q: rank %d exceeds %d", s.Name, len(s.Shape), maxRank)
	}
	for _, d := range s.Shape {
		if d < 0 {
			return 0, fmt.Errorf("tensor %q: shape %v has a negative dimension", s.Name, s.Shape)
		}
	}
	n, ok := byteSize(s.DType, s.Shape)
	if !ok {
		return 0, fmt.Errorf("tensor %q: shape %v of %s overflows int64 bytes", s.Name, s.Shape, s.DType)
	}
	return n, nil
}

// encodeHeader returns the complete file prefix (8-byte length plus JSON header)
// for specs laid out contiguously in order; sizes are their byte sizes. The JSON
// is padded with spaces to a multiple of 8 bytes so the data section starts
// 8-byte aligned. Metadata keys are sorted; tensors appear in spec order.
func encodeHeader(specs []TensorSpec, sizes []int64, meta map[string]string) []byte {
	b := make([]byte, 8, 8+64+len(specs)*96)
	b = append(b, '{')
	first := true
	if meta != nil {
		b = appendString(b, metadataKey)
		b = append(b, ":{"...)
		keys := make([]string, 0, len(meta))
		for k := range meta {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, ':')
			b = appendString(b, meta[k])
		}
		b = append(b, '}')
		first = false
	}
	var off int64
	for i, s := range specs {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendString(b, s.Name)
		b = append(b, `:{"dtype":`...)
		b = appendString(b, s.DType.String())
		b = append(b, `,"shape":[`...)
		for j, d := range s.Shape {
			if j > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, d, 10)
		}
		b = append(b, `],"data_offsets":[`...)
		b = strconv.AppendInt(b, off, 10)
		b = append(b, ',')
		off += sizes[i]
		b = strconv.AppendInt(b, off, 10)
		b = append(b, "]}"...)
	}
	b = append(b, '}')
	for len(b)%8 != 0 {
		b = append(b, ' ')
	}
	binary.LittleEndian.PutUint64(b, uint64(len(b)-8))
	return b
}

// EncodeHeader returns the file prefix (8-byte length and JSON header) of a
// safetensors file holding specs contiguously in order, and the size of the data
// section that must follow it. Writing that many bytes after the prefix, or
// extending the file to that length, gives a valid file. Errors name the spec.
func EncodeHeader(specs []TensorSpec, metadata map[string]string) (prefix []byte, dataSize int64, err error) {
	sizes := make([]int64, len(specs))
	seen := make(map[string]bool, len(specs))
	for i, s := range specs {
		if seen[s.Name] {
			return nil, 0, fmt.Errorf("safetensors: tensor %q given twice", s.Name)
		}
		seen[s.Name] = true
		n, err := checkSpec(s)
		if err != nil {
			return nil, 0, err
		}
		sizes[i] = n
		dataSize += n
	}
	return encodeHeader(specs, sizes, metadata), dataSize, nil
}
