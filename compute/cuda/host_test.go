package cuda

import (
	"bytes"
	"strings"
	"testing"
	"unsafe"

	"moxie/compute"
)

// TestCopyTableExpertRejects checks the argument errors (no GPU needed:
// they are found before anything is enqueued).
func TestCopyTableExpertRejects(t *testing.T) {
	mx := &DeviceWeight{Format: compute.MXFP4}
	fp := &DeviceWeight{Format: compute.FP8Block, Block: 128}
	a := &ExpertTable{E: 2, Inter: 64, Dim: 128, w1: mx}
	for _, c := range []struct {
		name    string
		dst     *ExpertTable
		e       int
		src     *ExpertTable
		se      int
		wantErr string
	}{
		{"expert past the end", a, 2, &ExpertTable{E: 3, Inter: 64, Dim: 128, w1: mx}, 0, "expert 2"},
		{"negative expert", a, -1, &ExpertTable{E: 3, Inter: 64, Dim: 128, w1: mx}, 0, "expert -1"},
		{"source past the end", a, 0, &ExpertTable{E: 3, Inter: 64, Dim: 128, w1: mx}, 3, "expert 3 of 3"},
		{"other shape", a, 0, &ExpertTable{E: 3, Inter: 32, Dim: 128, w1: mx}, 0, "[32, 128]"},
		{"other format", a, 0, &ExpertTable{E: 3, Inter: 64, Dim: 128, w1: fp}, 0, "tables of"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var ctx *Ctx // never reached
			err := ctx.CopyTableExpert(c.dst, c.e, c.src, c.se, Stream{})
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, c.wantErr)
			}
		})
	}
}

// pattern returns n bytes that differ from their neighbours and by seed.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*131+i>>8) ^ seed
	}
	return b
}

// TestHostBufferCopies checks the pinned-memory paths the expert tier uses:
// an upload from a pinned buffer on a second stream that the compute stream
// waits for through an event (the compute stream then copies the result on,
// so a missing wait would read stale bytes), and a mapped buffer read by
// the device at its device address.
func TestHostBufferCopies(t *testing.T) {
	d := testDevice(t)
	const n = 8 << 20
	err := d.Do(func(c *Ctx) error {
		a, err := c.NewArena(3 * n)
		if err != nil {
			return err
		}
		defer c.ReleaseArena(a)
		dst, _ := a.Alloc(n)
		dst2, _ := a.Alloc(n)
		dst3, _ := a.Alloc(n)
		h, err := c.NewHostBuffer(n + 4096)
		if err != nil {
			return err
		}
		defer c.FreeHost(h)
		if h.Len() != n+4096 || h.DevicePtr(0) != 0 {
			t.Errorf("pinned buffer: Len %d, DevicePtr %#x; want %d and 0", h.Len(), h.DevicePtr(0), n+4096)
		}
		want := pattern(n, 7)
		copy(h.Bytes()[4096:], want)
		cs, err := c.NewStream()
		if err != nil {
			return err
		}
		defer c.DestroyStream(cs)
		ev, err := c.NewEvent(false)
		if err != nil {
			return err
		}
		defer c.DestroyEvent(ev)
		if err := c.Memset(dst2, 0, n, c.Stream()); err != nil {
			return err
		}
		if err := c.UploadAsync(dst, h, 4096, n, cs); err != nil {
			return err
		}
		if err := c.Record(ev, cs); err != nil {
			return err
		}
		if err := c.StreamWait(c.Stream(), ev); err != nil {
			return err
		}
		if err := c.CopyAsync(dst2, dst, n, c.Stream()); err != nil {
			return err
		}
		got := make([]byte, n)
		if err := c.CopyFromDevice(got, dst2); err != nil {
			return err
		}
		if !bytes.Equal(got, want) {
			t.Errorf("upload on a copy stream, waited for by the compute stream: bytes differ")
		}
		if err := c.UploadAsync(dst, h, 4097, n, cs); err == nil {
			t.Errorf("an upload past the buffer's end was accepted")
		}
		m, err := c.NewMappedHostBuffer(n)
		if err != nil {
			return err
		}
		defer c.FreeHost(m)
		if m.DevicePtr(0) == 0 || m.DevicePtr(64) != m.DevicePtr(0)+64 {
			t.Errorf("mapped buffer at %#x, byte 64 at %#x", m.DevicePtr(0), m.DevicePtr(64))
		}
		want = pattern(n, 99)
		copy(m.Bytes(), want)
		if err := c.CopyAsync(dst3, m.DevicePtr(0), n, c.Stream()); err != nil {
			return err
		}
		if err := c.CopyFromDevice(got, dst3); err != nil {
			return err
		}
		if !bytes.Equal(got, want) {
			t.Errorf("mapped host buffer read at its device address: bytes differ")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRegisterHost downloads asynchronously into registered Go memory at
// an offset (the bytes around it untouched), unregisters it, registers the
// same memory again (the first registration is gone), and rejects an
// empty slice.
func TestRegisterHost(t *testing.T) {
	d := testDevice(t)
	const n = 517 << 10 // a decode step's logits
	err := d.Do(func(c *Ctx) error {
		a, err := c.NewArena(n)
		if err != nil {
			return err
		}
		defer c.ReleaseArena(a)
		src, _ := a.Alloc(n)
		want := pattern(n, 3)
		if err := c.CopyToDevice(src, want); err != nil {
			return err
		}
		buf := pattern(n+300, 200)
		around := bytes.Clone(buf)
		for round := range 2 {
			h, err := c.RegisterHost(buf[100 : 100+n])
			if err != nil {
				return err
			}
			if h.Len() != n || &h.Bytes()[0] != &buf[100] {
				t.Errorf("round %d: registered buffer of %d bytes at another address", round, h.Len())
			}
			if err := c.DownloadAsync(h, 0, src, n, c.Stream()); err != nil {
				return err
			}
			if err := c.Sync(c.Stream()); err != nil {
				return err
			}
			if !bytes.Equal(buf[100:100+n], want) || !bytes.Equal(buf[:100], around[:100]) || !bytes.Equal(buf[100+n:], around[100+n:]) {
				t.Errorf("round %d: the download into registered Go memory differs (or wrote outside it)", round)
			}
			if err := c.FreeHost(h); err != nil {
				t.Errorf("round %d: unregistering: %v", round, err)
			}
			clear(buf[100 : 100+n])
		}
		if _, err := c.RegisterHost(nil); err == nil {
			t.Error("an empty slice was registered")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestCopyTableExpert copies one expert's records between tables on the
// device and reads both tables back: the target's records of that expert
// equal the source's, the others are unchanged.
func TestCopyTableExpert(t *testing.T) {
	d := testDevice(t)
	const inter, dim = 64, 128
	err := d.Do(func(c *Ctx) error {
		a, err := c.NewArena(4 << 20)
		if err != nil {
			return err
		}
		defer c.ReleaseArena(a)
		weight := func(rows, cols int, seed byte) *DeviceWeight {
			w, err := c.UploadWeight(a, compute.WeightData{Format: compute.MXFP4, Rows: rows, Cols: cols,
				Data: pattern(rows*cols/2, seed), Scale: bytes.Repeat([]byte{127}, rows*cols/32)})
			if err != nil {
				t.Fatal(err)
			}
			return w
		}
		table := func(n int, seed byte) *ExpertTable {
			var w1, w3, w2 []*DeviceWeight
			for i := range n {
				s := seed + byte(3*i)
				w1, w3, w2 = append(w1, weight(inter, dim, s)), append(w3, weight(inter, dim, s+1)), append(w2, weight(dim, inter, s+2))
			}
			tb, err := c.PrepareExpertTable(a, w1, w3, w2)
			if err != nil {
				t.Fatal(err)
			}
			return tb
		}
		dst, src := table(2, 10), table(3, 50)
		rec := int(unsafe.Sizeof(linArgs{}))
		read := func(tb *ExpertTable) (r13, r2 []byte) {
			r13, r2 = make([]byte, 2*tb.E*rec), make([]byte, tb.E*rec)
			if err := c.CopyFromDevice(r13, tb.all13.args); err != nil {
				t.Fatal(err)
			}
			if err := c.CopyFromDevice(r2, tb.all2.args); err != nil {
				t.Fatal(err)
			}
			return
		}
		d13, d2 := read(dst)
		s13, s2 := read(src)
		if err := c.CopyTableExpert(dst, 1, src, 2, c.Stream()); err != nil {
			return err
		}
		g13, g2 := read(dst)
		if !bytes.Equal(g13[2*rec:4*rec], s13[4*rec:6*rec]) || !bytes.Equal(g2[rec:2*rec], s2[2*rec:3*rec]) {
			t.Errorf("expert 1's records are not the source's expert 2's")
		}
		if !bytes.Equal(g13[:2*rec], d13[:2*rec]) || !bytes.Equal(g2[:rec], d2[:rec]) {
			t.Errorf("expert 0's records changed")
		}
		if bytes.Equal(d13[2*rec:4*rec], s13[4*rec:6*rec]) {
			t.Errorf("the two tables' records were equal before the copy (the test shows nothing)")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
