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
	"strings"

	"moxie/dsv4/config"
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
	for _, ls := range s.layers {
		var flags byte
		if ls.comp != nil && ls.comp.hasPrev {
			flags |= 1
		}
		if ls.icomp != nil && ls.icomp.hasPrev {
			flags |= 2
		}
		u32(uint32(ls.comp.ratio()))
		u32(uint32(ls.icomp.ratio()))
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

// ratio is the compressor's ratio, 0 for none.
func (cs *compState) ratio() int {
	if cs == nil {
		return 0
	}
	return cs.c.ratio
}

// holdsPrev reports whether the compressor keeps a closed window's rows
// (prev) after pos tokens: the overlapping (CSA) one, once a window closed.
func (cs *compState) holdsPrev(pos int) bool { return cs.c.c == 2 && pos >= cs.c.ratio }

// entries is how many floats of entries a compressor holds after pos
// tokens.
func (cs *compState) entries(pos int) int {
	if cs == nil {
		return 0
	}
	return pos / cs.c.ratio * cs.c.dw
}

// writeFloats writes a little-endian, 16 Ki values at a time (errors
// stick in w).
func writeFloats(w *bufio.Writer, a []float32) {
	var buf [1 << 16]byte
	for len(a) > 0 {
		n := min(len(a), len(buf)/4)
		for i, v := range a[:n] {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(v))
		}
		w.Write(buf[:4*n])
		a = a[n:]
	}
}

// RestoreSequence implements generate.Restorer: it reads a state written by
// SaveSequence of a session of this model (the same configuration; the
// caller checks the weights' identity, SequenceID) and returns a session in
// that state: a Session, or on a GPU-loaded model a DeviceSession (the state
// uploaded; device_state.go), which continues as the saved one would have
// (a Session saved and restored on the CPU: exactly). r must hold the state
// and nothing more. Errors about the state name the field that does not
// match what this model expects and wrap generate.ErrBadState; a device
// session that cannot be made (memory, the context limit) fails without it.
func (m *Model) RestoreSequence(r io.Reader) (generate.Sequence, error) {
	s, err := m.readState(r)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", generate.ErrBadState, err)
	}
	if m.dev != nil {
		return m.restoreDevice(s)
	}
	return s, nil
}

// blankState returns an empty state at position 0 shaped by the model's
// configuration: NewSession for a model bound on the host; for a
// GPU-loaded one, a host copy whose compressors carry only their shapes (no
// weights), which is read and written but never run.
func (m *Model) blankState() *Session {
	if !m.hostUnbound {
		return m.NewSession()
	}
	c := m.Cfg
	s := &Session{m: m}
	for l := range c.NLayers {
		ls := &layerState{ring: make([]float32, c.Window*c.HeadDim)}
		r := c.Ratio(l)
		switch c.Kind(l) {
		case config.CSA:
			ls.comp = newCompState(&compressor{ratio: r, c: 2, dw: c.HeadDim})
			ls.icomp = newCompState(&compressor{ratio: r, c: 2, dw: c.IndexHeadDim})
		case config.HCA:
			ls.comp = newCompState(&compressor{ratio: r, c: 1, dw: c.HeadDim})
		}
		s.layers = append(s.layers, ls)
	}
	return s
}

// readState reads a saved state into blankState's session.
func (m *Model) readState(r io.Reader) (*Session, error) {
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
	}{{"version", stateVersion}, {"layers", uint32(m.Cfg.NLayers)}, {"window", uint32(c.Window)},
		{"head_dim", uint32(c.HeadDim)}, {"index_head_dim", uint32(c.IndexHeadDim)}}
	for _, f := range want {
		if err := sr.expect(f.name, f.v); err != nil {
			return nil, err
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
	s := m.blankState()
	s.pos = int(pos)
	for i, ls := range s.layers {
		if err := sr.expect(fmt.Sprintf("layer %d compressor ratio", i), uint32(ls.comp.ratio())); err != nil {
			return nil, err
		}
		if err := sr.expect(fmt.Sprintf("layer %d indexer ratio", i), uint32(ls.icomp.ratio())); err != nil {
			return nil, err
		}
		var fl [1]byte
		if err := sr.full(fl[:], fmt.Sprintf("layer %d flags", i)); err != nil {
			return nil, err
		}
		for k, cs := range []*compState{ls.comp, ls.icomp} {
			has := fl[0]&(1<<k) != 0
			switch {
			case cs == nil && has:
				return nil, fmt.Errorf("dsv4: saved session's layer %d flags %#x name a compressor this layer lacks", i, fl[0])
			case cs == nil:
			case has != cs.holdsPrev(s.pos):
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
		fixed := ls.arrays()
		fixed = fixed[:len(fixed)-2] // the ring and compressor windows: model-sized, allocated
		for k, a := range fixed {
			if err := sr.floats(a, fmt.Sprintf("layer %d array %d", i, k)); err != nil {
				return nil, err
			}
		}
		// The entries grow with pos: read before they are allocated.
		var err error
		if ls.ckv, err = sr.grow(ls.comp.entries(s.pos), fmt.Sprintf("layer %d compressed entries", i)); err != nil {
			return nil, err
		}
		if ls.ikeys, err = sr.grow(ls.icomp.entries(s.pos), fmt.Sprintf("layer %d indexer keys", i)); err != nil {
			return nil, err
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

// expect reads field, a u32, and fails unless it is want.
func (sr *stateReader) expect(field string, want uint32) error {
	v, err := sr.u32(field)
	if err != nil {
		return err
	}
	if v != want {
		return fmt.Errorf("dsv4: saved session's %s is %d, this model's %d", field, v, want)
	}
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
// and a sample of the stored weights (the final norm, the output mix's
// parameters, every router's gate bias, and 64 rows of the embedding
// spread over the vocabulary; for a synthetic source, whose weights its
// name and configuration fix, the name instead of the embedding), so that a
// state saved by a session of other weights, even of the same shapes, is
// not restored into this model. The biases make a model whose routers mask
// experts (a pruning mask served in place of the biases) another model.
// Each call hashes a few hundred kilobytes.
func (m *Model) SequenceID() string {
	h := sha256.New()
	h.Write([]byte("dsv4 session state 1\n"))
	cj, _ := json.Marshal(m.Cfg)
	h.Write(cj)
	if m.target != Exact { // another target's state (its KV simulated) is another sequence
		h.Write([]byte("target " + m.target.String() + "\n"))
	}
	for _, name := range []string{"norm.weight", "hc_head_base", "hc_head_scale"} {
		if d, err := m.src.TensorData(name); err == nil {
			h.Write(d)
		}
	}
	for _, t := range m.src.Tensors() { // sorted by name
		if strings.HasSuffix(t.Name, ".gate.bias") {
			if d, err := m.src.TensorData(t.Name); err == nil {
				h.Write([]byte(t.Name))
				h.Write(d)
			}
		}
	}
	if m.src.Synthetic() {
		h.Write([]byte(m.src.Name()))
	} else if d, err := m.src.TensorData("embed.weight"); err == nil {
		V := m.Cfg.VocabSize
		if row := len(d) / max(V, 1); row > 0 {
			for k := range 64 {
				r := k * V / 64
				h.Write(d[r*row : (r+1)*row])
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}
