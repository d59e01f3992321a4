package dsv4

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"math"
	"slices"

	"moxie/generate"
)

// A saved session state (Session.SaveSequence, Model.RestoreSequence) is,
// little-endian:
//
//	magic "MXSTATE\x00", u32 version (1)
//	u32 layers, u32 window, u32 head_dim, u32 index_head_dim, u64 pos
//	per layer: u32 compressor ratio (0: none), u32 indexer ratio (0: none),
//	           u8 flags (bit 0: the compressor holds a previous window,
//	           bit 1: the indexer's compressor does)
//	per layer, float32 arrays whose lengths the model and pos fix (none is
//	stored): the window ring [window, head_dim]; the compressor's current
//	window κ and z [ratio, c·dw] each, and for the overlapping (CSA)
//	compressor the previous window's; the same for the indexer's
//	compressor; the compressed entries [pos/ratio, head_dim]; the indexer
//	keys [pos/index_ratio, index_head_dim]
//	u32 CRC-32 (Castagnoli) of every byte before it
//
// Nothing in the file sizes an allocation: every length is the model's,
// checked against the header, and arrays are read in bounded pieces, so a
// truncated or hostile file costs at most its own length in memory.
const (
	stateMagic   = "MXSTATE\x00"
	stateVersion = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// SaveSequence implements generate.Saver: it writes the session's state
// (position and every layer's caches) to w in the format above. The
// session is unchanged. It fails on a failed or closed session.
func (s *Session) SaveSequence(w io.Writer) error {
	if s.failed != nil {
		return s.failed
	}
	c := s.m.Cfg
	crc := crc32.New(castagnoli)
	bw := bufio.NewWriterSize(io.MultiWriter(w, crc), 1<<16)
	var buf [8]byte
	u32 := func(v uint32) {
		binary.LittleEndian.PutUint32(buf[:4], v)
		bw.Write(buf[:4])
	}
	bw.WriteString(stateMagic)
	u32(stateVersion)
	u32(uint32(len(s.layers)))
	u32(uint32(c.Window))
	u32(uint32(c.HeadDim))
	u32(uint32(c.IndexHeadDim))
	binary.LittleEndian.PutUint64(buf[:], uint64(s.pos))
	bw.Write(buf[:])
	for i, ls := range s.layers {
		b := s.m.layers[i]
		var flags byte
		if ls.comp != nil && ls.comp.hasPrev {
			flags |= 1
		}
		if ls.icomp != nil && ls.icomp.hasPrev {
			flags |= 2
		}
		u32(uint32(compRatio(b.comp)))
		u32(uint32(compRatio(idxComp(b))))
		bw.WriteByte(flags)
	}
	for _, ls := range s.layers {
		for _, a := range ls.arrays() {
			writeFloats(bw, a)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("dsv4: saving the session: %w", err)
	}
	binary.LittleEndian.PutUint32(buf[:4], crc.Sum32())
	if _, err := w.Write(buf[:4]); err != nil {
		return fmt.Errorf("dsv4: saving the session: %w", err)
	}
	return nil
}

// arrays lists the layer's state in the file's order.
func (ls *layerState) arrays() [][]float32 {
	out := [][]float32{ls.ring}
	for _, cs := range []*compState{ls.comp, ls.icomp} {
		if cs != nil {
			out = append(out, cs.cur, cs.curZ)
			if cs.c.c == 2 {
				out = append(out, cs.prev, cs.prevZ)
			}
		}
	}
	return append(out, ls.ckv, ls.ikeys)
}

func compRatio(cp *compressor) int {
	if cp == nil {
		return 0
	}
	return cp.ratio
}

func idxComp(b *block) *compressor {
	if b.idx == nil {
		return nil
	}
	return b.idx.comp
}

func writeFloats(w *bufio.Writer, a []float32) {
	var b [4]byte
	for _, v := range a {
		binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
		w.Write(b[:])
	}
}

// RestoreSequence implements generate.Restorer: it reads a state written by
// SaveSequence of a session of this model (the same configuration; the
// caller checks the weights' identity, SequenceID) and returns a Session in
// that state, which continues exactly as the saved one would have. r must
// hold the state and nothing more. Errors name the field that does not
// match what this model expects. A GPU-loaded model restores nothing: its
// sequences live on the device.
func (m *Model) RestoreSequence(r io.Reader) (generate.Sequence, error) {
	s, err := m.restoreSession(r)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (m *Model) restoreSession(r io.Reader) (*Session, error) {
	if m.dev != nil || m.hostUnbound {
		return nil, errors.New("dsv4: a saved session is restored only on the CPU; this model runs on the GPU")
	}
	c := m.Cfg
	sr := &stateReader{r: bufio.NewReaderSize(r, 1<<16), crc: crc32.New(castagnoli)}
	magic := make([]byte, len(stateMagic))
	if err := sr.full(magic, "magic"); err != nil {
		return nil, err
	}
	if string(magic) != stateMagic {
		return nil, fmt.Errorf("dsv4: not a saved session (magic %q, want %q)", magic, stateMagic)
	}
	want := []struct {
		name string
		v    uint32
	}{{"version", stateVersion}, {"layers", uint32(len(m.layers))}, {"window", uint32(c.Window)},
		{"head_dim", uint32(c.HeadDim)}, {"index_head_dim", uint32(c.IndexHeadDim)}}
	for _, f := range want {
		v, err := sr.u32(f.name)
		if err != nil {
			return nil, err
		}
		if v != f.v {
			return nil, fmt.Errorf("dsv4: saved session's %s is %d, this model's %d", f.name, v, f.v)
		}
	}
	var b8 [8]byte
	if err := sr.full(b8[:], "pos"); err != nil {
		return nil, err
	}
	pos := binary.LittleEndian.Uint64(b8[:])
	if pos > uint64(c.MaxPositions) {
		return nil, fmt.Errorf("dsv4: saved session's pos %d exceeds max_position_embeddings %d", pos, c.MaxPositions)
	}
	s := m.NewSession()
	s.pos = int(pos)
	for i, b := range m.layers {
		for _, f := range []struct {
			name string
			want int
		}{{"compressor ratio", compRatio(b.comp)}, {"indexer ratio", compRatio(idxComp(b))}} {
			v, err := sr.u32(fmt.Sprintf("layer %d %s", i, f.name))
			if err != nil {
				return nil, err
			}
			if int64(v) != int64(f.want) {
				return nil, fmt.Errorf("dsv4: saved session's layer %d %s is %d, this model's %d", i, f.name, v, f.want)
			}
		}
		var fl [1]byte
		if err := sr.full(fl[:], fmt.Sprintf("layer %d flags", i)); err != nil {
			return nil, err
		}
		ls := s.layers[i]
		for k, cs := range []*compState{ls.comp, ls.icomp} {
			has := fl[0]&(1<<k) != 0
			switch {
			case cs == nil && has:
				return nil, fmt.Errorf("dsv4: saved session's layer %d flags %#x name a compressor this layer lacks", i, fl[0])
			case cs == nil:
			case has != (cs.c.c == 2 && s.pos >= cs.c.ratio):
				return nil, fmt.Errorf("dsv4: saved session's layer %d flags %#x disagree with pos %d", i, fl[0], s.pos)
			default:
				cs.hasPrev = has
			}
		}
		if fl[0]&^3 != 0 {
			return nil, fmt.Errorf("dsv4: saved session's layer %d flags %#x has unknown bits", i, fl[0])
		}
	}
	for i, ls := range s.layers {
		b := m.layers[i]
		fixed := ls.arrays()
		fixed = fixed[:len(fixed)-2] // the ring and compressor windows: model-sized, allocated
		for k, a := range fixed {
			if err := sr.floats(a, fmt.Sprintf("layer %d array %d", i, k)); err != nil {
				return nil, err
			}
		}
		// The entries grow with pos: read before they are allocated.
		var err error
		if b.comp != nil {
			if ls.ckv, err = sr.grow(s.pos/b.comp.ratio*b.comp.dw, fmt.Sprintf("layer %d compressed entries", i)); err != nil {
				return nil, err
			}
		}
		if ic := idxComp(b); ic != nil {
			if ls.ikeys, err = sr.grow(s.pos/ic.ratio*ic.dw, fmt.Sprintf("layer %d indexer keys", i)); err != nil {
				return nil, err
			}
		}
	}
	sum := sr.crc.Sum32()
	var b4 [4]byte
	if err := sr.full(b4[:], "checksum"); err != nil {
		return nil, err
	}
	if got := binary.LittleEndian.Uint32(b4[:]); got != sum {
		return nil, fmt.Errorf("dsv4: saved session is corrupt (checksum %08x, contents give %08x)", got, sum)
	}
	if n, _ := sr.r.Read(b4[:1]); n != 0 {
		return nil, errors.New("dsv4: saved session has bytes after its checksum")
	}
	return s, nil
}

// stateReader reads a saved state's fields, naming the one that ends
// early, and sums what it has read.
type stateReader struct {
	r   *bufio.Reader
	crc hash.Hash32
}

func (sr *stateReader) full(b []byte, field string) error {
	if _, err := io.ReadFull(sr.r, b); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("dsv4: saved session ends inside %s (truncated)", field)
		}
		return fmt.Errorf("dsv4: reading saved session's %s: %w", field, err)
	}
	sr.crc.Write(b)
	return nil
}

func (sr *stateReader) u32(field string) (uint32, error) {
	var b [4]byte
	if err := sr.full(b[:], field); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b[:]), nil
}

// floats fills a from the stream, 64 KiB at a time.
func (sr *stateReader) floats(a []float32, field string) error {
	var buf [1 << 16]byte
	for len(a) > 0 {
		n := min(len(a), len(buf)/4)
		if err := sr.full(buf[:4*n], field); err != nil {
			return err
		}
		for i := range n {
			a[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
		}
		a = a[n:]
	}
	return nil
}

// grow reads n floats into a slice that grows as they arrive.
func (sr *stateReader) grow(n int, field string) ([]float32, error) {
	var out []float32
	for len(out) < n {
		k := min(n-len(out), 1<<20)
		out = slices.Grow(out, k)[:len(out)+k]
		if err := sr.floats(out[len(out)-k:], field); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// SequenceID implements generate.Restorer: a digest of the configuration
// and a sample of the weights (the final norm, the output mix's
// parameters and 64 rows of the embedding spread over the vocabulary), so
// that a state saved by a session of other weights, even of the same
// shapes, is not restored into this model. Computed once per call (a few
// hundred kilobytes hashed).
func (m *Model) SequenceID() string {
	h := sha256.New()
	h.Write([]byte("dsv4 session state 1\n"))
	cj, _ := json.Marshal(m.Cfg)
	h.Write(cj)
	hashFloats(h, m.norm)
	hashFloats(h, m.hcHead.Base)
	hashFloats(h, m.hcHead.Scale)
	V, D := m.Cfg.VocabSize, m.Cfg.Dim
	if row := 2 * D; len(m.embed) >= V*row {
		for k := range 64 {
			r := k * V / 64
			h.Write(m.embed[r*row : (r+1)*row])
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

func hashFloats(h hash.Hash, a []float32) {
	var b [4]byte
	for _, v := range a {
		binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
		h.Write(b[:])
	}
}
