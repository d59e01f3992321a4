package dsv4

import (
	"fmt"
	"io"

	"moxie/compute/cuda"
	"moxie/dsv4/config"
	"moxie/generate"
)

// SaveSequence implements generate.Saver: the session's state read back
// from the device in Session's saved format (seqstate.go), so that a CPU
// session or another device session of this model can continue it. It
// holds what a Session would: the window ring's last Window positions,
// each compressor's rows of its open window (and, overlapping, of the
// window before it) and the entries; the device's extra rows (its rings
// keep a prefill chunk more) are not needed to continue.
func (s *DeviceSession) SaveSequence(w io.Writer) error {
	h, err := s.hostState()
	if err != nil {
		return err
	}
	return h.SaveSequence(w)
}

// CloneSequence implements generate.Cloner (the snapshot a thinking chat's
// next turn continues from): a new device session holding this one's
// state, copied through host memory as SaveSequence and RestoreSequence
// copy it, without the file. The copy is a second session with the
// smallest prefill chunk (snapshotSession), opened only where it leaves a
// margin of GPU memory free; when it fails, s is unchanged and the caller
// goes without the snapshot.
func (s *DeviceSession) CloneSequence() (generate.Sequence, error) {
	h, err := s.hostState()
	if err != nil {
		return nil, err
	}
	c, err := s.m.snapshotSession()
	if err != nil {
		return nil, err
	}
	if err := s.m.fillDevice(c, h); err != nil {
		return nil, err
	}
	return c, nil
}

// hostState reads the session's state back into a host Session of its
// model (what a CPU session at the same position would hold).
func (s *DeviceSession) hostState() (*Session, error) {
	if err := s.Settle(); err != nil { // a step run ahead may still write the state
		return nil, err
	}
	if s.failed != nil {
		return nil, s.failed
	}
	h := s.m.blankState()
	h.pos = s.pos
	if err := s.d.dev.Do(func(c *cuda.Ctx) error { return transferState(c, s.m.Cfg, s.layers, h, false) }); err != nil {
		return nil, fmt.Errorf("dsv4: reading the device session's state: %w", err)
	}
	return h, nil
}

var (
	_ generate.Saver  = (*DeviceSession)(nil)
	_ generate.Cloner = (*DeviceSession)(nil)
)

// restoreDevice returns a new device session holding h's state (h from
// readState).
func (m *Model) restoreDevice(h *Session) (generate.Sequence, error) {
	s, err := m.NewDeviceSession()
	if err != nil {
		return nil, err
	}
	if err := m.fillDevice(s, h); err != nil {
		return nil, err
	}
	return s, nil
}

// fillDevice uploads h's state into s, a new device session of m; on error
// s is closed.
func (m *Model) fillDevice(s *DeviceSession, h *Session) error {
	if h.pos > s.limit {
		_ = s.Close()
		return fmt.Errorf("dsv4: the saved sequence holds %d tokens, more than the device session's context limit of %d (--ctx)", h.pos, s.limit)
	}
	if err := m.dev.dev.Do(func(c *cuda.Ctx) error { return transferState(c, m.Cfg, s.layers, h, true) }); err != nil {
		_ = s.Close()
		return fmt.Errorf("dsv4: uploading a saved sequence: %w", err)
	}
	s.pos = h.pos
	return nil
}

// floatCopier is the two copies transferState makes (*cuda.Ctx's, after
// the work queued on its compute stream; tests use a fake device).
type floatCopier interface {
	CopyFloatsToDevice(dst cuda.DevicePtr, src []float32) error
	CopyFloatsFromDevice(dst []float32, src cuda.DevicePtr) error
}

// transferState copies the state of positions [0, h.pos) between a device
// session's buffers dls and h, a host state of the same model: up uploads
// h, else it downloads into h (and sets what only the position decides).
// The device keeps position p of a ring in row p mod its rows (RingStore,
// CompStore), entry e in row e.
func transferState(c floatCopier, cfg *config.Config, dls []*devLayerState, h *Session, up bool) error {
	pos := h.pos
	if len(dls) != len(h.layers) {
		return fmt.Errorf("%d device layers, %d host layers", len(dls), len(h.layers))
	}
	for l, ds := range dls {
		hl := h.layers[l]
		if err := copyRows(c, up, ds.ring, ds.ringRows, hl.ring, cfg.Window, cfg.HeadDim, max(0, pos-cfg.Window), pos); err != nil {
			return fmt.Errorf("layer %d window: %w", l, err)
		}
		for _, p := range []struct {
			dev  *devCompState
			host *compState
			ent  *[]float32
			name string
		}{{ds.comp, hl.comp, &hl.ckv, "compressor"}, {ds.icomp, hl.icomp, &hl.ikeys, "indexer compressor"}} {
			if (p.dev == nil) != (p.host == nil) {
				return fmt.Errorf("layer %d %s: on one side only", l, p.name)
			}
			if p.dev == nil {
				continue
			}
			cp := p.host.c
			R, w := cp.ratio, cp.c*cp.dw
			e := pos / R // closed windows: entries
			err := copyRows(c, up, p.dev.ringKV, p.dev.rows, p.host.cur, R, w, e*R, pos)
			if err == nil {
				err = copyRows(c, up, p.dev.ringZ, p.dev.rows, p.host.curZ, R, w, e*R, pos)
			}
			if err == nil && p.host.holdsPrev(pos) { // the overlapping compressor's previous window
				if err = copyRows(c, up, p.dev.ringKV, p.dev.rows, p.host.prev, R, w, (e-1)*R, e*R); err == nil {
					err = copyRows(c, up, p.dev.ringZ, p.dev.rows, p.host.prevZ, R, w, (e-1)*R, e*R)
				}
			}
			if !up {
				p.host.hasPrev = p.host.holdsPrev(pos)
				*p.ent = make([]float32, e*cp.dw)
			}
			if err == nil {
				if up {
					err = c.CopyFloatsToDevice(p.dev.entries, *p.ent)
				} else {
					err = c.CopyFloatsFromDevice(*p.ent, p.dev.entries)
				}
			}
			if err != nil {
				return fmt.Errorf("layer %d %s: %w", l, p.name, err)
			}
		}
	}
	return nil
}

// copyRows copies positions [p0, p1), rows of width floats, between host
// (position p in row p mod hostRows) and the device buffer dev (row p mod
// devRows), in runs contiguous on both sides; up: host to device. At most
// hostRows positions (the host's rows must not alias).
func copyRows(c floatCopier, up bool, dev cuda.DevicePtr, devRows int, host []float32, hostRows, width, p0, p1 int) error {
	if p1-p0 > hostRows || p1-p0 > devRows {
		return fmt.Errorf("%d positions for %d host and %d device rows", p1-p0, hostRows, devRows)
	}
	for _, r := range rowRuns(p0, p1, hostRows, devRows) {
		hs := host[r.host*width : (r.host+r.n)*width]
		d := off(dev, r.dev*width)
		var err error
		if up {
			err = c.CopyFloatsToDevice(d, hs)
		} else {
			err = c.CopyFloatsFromDevice(hs, d)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// rowRun is n consecutive positions in host rows [host, host+n) and
// device rows [dev, dev+n).
type rowRun struct{ host, dev, n int }

// rowRuns splits positions [p0, p1) into runs that are contiguous in both
// rings (position p in host row p mod hostRows and device row p mod
// devRows).
func rowRuns(p0, p1, hostRows, devRows int) []rowRun {
	var out []rowRun
	for p := p0; p < p1; {
		hs, ds := p%hostRows, p%devRows
		n := min(p1-p, hostRows-hs, devRows-ds)
		out = append(out, rowRun{hs, ds, n})
		p += n
	}
	return out
}
