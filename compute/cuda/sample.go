package cuda

import (
	_ "embed"
	"encoding/binary"
	"fmt"
	"math"
	"structs"
	"unsafe"

	"moxie/sample"
)

//go:embed kernels/sample.cu
var sampleSrc string

// SampleSource returns the CUDA source of the sampler reduction module.
func SampleSource() string { return sampleSrc }

// The sampler reduction's shapes (kernels/sample.cu).
const (
	smpChunk   = 8192 // SMP_CHUNK: ids per block
	smpThreads = 256  // SMP_THREADS
	smpPartB   = 32   // sizeof(SmpPart)
	smpIDsOff  = 32   // SMP_IDS_OFF: where the candidates' ids start
	// smpDrawThreads is SMP_DRAW_THREADS, smp_draw's block.
	smpDrawThreads = 1024
	// SampleKeep is the most candidates a SampleReducer returns (more make
	// the reduction incomplete: the host sampler then reads the logits).
	SampleKeep = 16384
	// sampleFirst is how many candidates every reduction downloads with
	// its head; Read fetches the rest of a larger set in a second copy.
	sampleFirst = 2048
)

// SampleReducer computes sample.Reductions of logits rows that stay in
// device memory: the argmax, the NaN check and, for random sampling, the
// sum of e and up to SampleKeep candidates (see package sample's
// ReduceSpec), so that a decode step downloads a few kilobytes instead of
// the whole row (24.6 KB with up to 2,048 candidates; a second copy
// brings the rest of a larger set); for a larger one Draw makes the draw
// on the device. It owns device scratch and a pinned host buffer; it is
// used on one stream at a time. Close frees it.
type SampleReducer struct {
	n     int // vocabulary
	nb    int // blocks (chunks)
	dev   DevicePtr
	part  DevicePtr   // nb SmpPart
	cid   DevicePtr   // nb*smpChunk int32
	ce    DevicePtr   // nb*smpChunk float64
	out   DevicePtr   // head + ids + e
	drawn DevicePtr   // smp_draw's id (int32)
	host  *HostBuffer // the result's layout: head, SampleKeep ids, SampleKeep e
	greed bool        // the last Enqueue was greedy
}

// SampleReducerBytes is the device memory NewSampleReducer(n) allocates,
// bytes (with 196,680 bytes of pinned host memory besides).
func SampleReducerBytes(n int) int {
	nb := (max(n, 1) + smpChunk - 1) / smpChunk
	return nb*smpPartB + nb*smpChunk*12 + smpIDsOff + 12*SampleKeep + 8
}

// NewSampleReducer allocates a reducer for rows of n logits (1 <= n <=
// 256*8192).
func (c *Ctx) NewSampleReducer(n int) (*SampleReducer, error) {
	if n < 1 || n > smpThreads*smpChunk {
		return nil, fmt.Errorf("cuda: sampler reduction of %d logits: want 1 to %d", n, smpThreads*smpChunk)
	}
	r := &SampleReducer{n: n, nb: (n + smpChunk - 1) / smpChunk}
	outB := smpIDsOff + 12*SampleKeep
	size := SampleReducerBytes(n)
	p, err := c.MemAlloc(size)
	if err != nil {
		return nil, fmt.Errorf("cuda: sampler reduction scratch (%d bytes): %w", size, err)
	}
	r.dev = p
	r.part = p
	r.ce = p + DevicePtr(r.nb*smpPartB) // 8-byte aligned first
	r.cid = r.ce + DevicePtr(8*r.nb*smpChunk)
	r.out = r.cid + DevicePtr(4*r.nb*smpChunk)
	r.drawn = r.out + DevicePtr(outB)
	if r.host, err = c.NewHostBuffer(outB + 8 + smpIDsOff); err != nil {
		_ = c.MemFree(p)
		return nil, err
	}
	return r, nil
}

// Close frees the reducer's memory.
func (r *SampleReducer) Close(c *Ctx) error {
	if r.dev == 0 {
		return nil
	}
	err := c.MemFree(r.dev)
	if e := c.FreeHost(r.host); err == nil {
		err = e
	}
	r.dev, r.host = 0, nil
	return err
}

// sampleModule returns the device's sampler reduction module.
func (c *Ctx) sampleModule() (*Module, error) { return c.namedModule("sample", sampleSrc, nil) }

// Enqueue launches the reduction of the row of n float32 logits at logits
// under spec (spec.OK must be set) on s, and the download of its result;
// after s is synchronised, Read returns it.
func (r *SampleReducer) Enqueue(c *Ctx, logits DevicePtr, spec sample.ReduceSpec, s Stream) error {
	if !spec.OK {
		return fmt.Errorf("cuda: sampler reduction: the sampler needs the logits (spec %+v)", spec)
	}
	if err := r.maxPass(c, logits, s); err != nil {
		return err
	}
	greedy := int32(0)
	if spec.Greedy {
		greedy = 1
	} else {
		n := int32(r.n)
		grid, block := Dim3{X: uint32(r.nb), Y: 1, Z: 1}, Dim3{X: smpThreads, Y: 1, Z: 1}
		invT, thr := spec.InvT, spec.Threshold
		if err := c.launchNamed(c.sampleModule, "smp_exp", grid, block, 0, s,
			unsafe.Pointer(&logits), unsafe.Pointer(&n), unsafe.Pointer(&invT), unsafe.Pointer(&thr),
			unsafe.Pointer(&r.part), unsafe.Pointer(&r.cid), unsafe.Pointer(&r.ce)); err != nil {
			return err
		}
	}
	if err := r.finish(c, greedy, 0, 0, s); err != nil {
		return err
	}
	r.greed = spec.Greedy
	if spec.Greedy {
		return c.DownloadAsync(r.host, 0, r.out, smpIDsOff, s)
	}
	return r.download(c, 0, sampleFirst, s)
}

// maxPass launches smp_max: each chunk's largest logit, its id and the
// NaN flag, into the parts.
func (r *SampleReducer) maxPass(c *Ctx, logits DevicePtr, s Stream) error {
	n := int32(r.n)
	return c.launchNamed(c.sampleModule, "smp_max", Dim3{X: uint32(r.nb), Y: 1, Z: 1}, Dim3{X: smpThreads, Y: 1, Z: 1}, 0, s,
		unsafe.Pointer(&logits), unsafe.Pointer(&n), unsafe.Pointer(&r.part))
}

// finish launches smp_fin, with the hand-off to tok and pos when they are
// set.
func (r *SampleReducer) finish(c *Ctx, greedy int32, tok, pos DevicePtr, s Stream) error {
	nb, keep := int32(r.nb), int32(SampleKeep)
	return c.launchNamed(c.sampleModule, "smp_fin", Dim3{X: 1, Y: 1, Z: 1}, Dim3{X: smpThreads, Y: 1, Z: 1}, 0, s,
		unsafe.Pointer(&r.part), unsafe.Pointer(&nb), unsafe.Pointer(&greedy), unsafe.Pointer(&r.cid),
		unsafe.Pointer(&r.ce), unsafe.Pointer(&keep), unsafe.Pointer(&r.out), unsafe.Pointer(&tok), unsafe.Pointer(&pos))
}

// GreedySlots is how many greedy results EnqueueGreedy keeps apart on the
// host: a step's result can be read while the next step's is on its way.
const GreedySlots = 2

// EnqueueGreedy launches a greedy reduction (the argmax and the NaN check)
// of the row of n float32 logits at logits on s, and the download of its
// result into host slot (0 <= slot < GreedySlots); after s has passed it
// (an event recorded after this call, say), ReadGreedy(slot) returns it.
// With tok and pos set (device int32s, not 0) it also hands the argmax to
// a decode step enqueued after it that reads its token and position from
// device memory: tok = the argmax (0 when there is none), pos += 1. A slot
// must not be enqueued again before its last result has been read.
func (r *SampleReducer) EnqueueGreedy(c *Ctx, logits DevicePtr, slot int, tok, pos DevicePtr, s Stream) error {
	if slot < 0 || slot >= GreedySlots {
		return fmt.Errorf("cuda: greedy reduction into slot %d: want 0 to %d", slot, GreedySlots-1)
	}
	if (tok == 0) != (pos == 0) {
		return fmt.Errorf("cuda: greedy reduction's hand-off needs both the token and the position")
	}
	if err := r.maxPass(c, logits, s); err != nil {
		return err
	}
	if err := r.finish(c, 1, tok, pos, s); err != nil {
		return err
	}
	return c.DownloadAsync(r.host, r.slotOff(slot), r.out, smpIDsOff, s)
}

// slotOff is where greedy slot i lies in the host buffer: slot 0 is the
// head's place of Enqueue's layout, slot 1 after the drawn id.
func (r *SampleReducer) slotOff(slot int) int {
	if slot == 0 {
		return 0
	}
	return smpIDsOff + 12*SampleKeep + 8
}

// ReadGreedy fills dst with the result EnqueueGreedy left in slot, once s
// has passed it (dst's slices are reused; greedy: no candidates).
func (r *SampleReducer) ReadGreedy(slot int, dst *sample.Reduction) error {
	if slot < 0 || slot >= GreedySlots {
		return fmt.Errorf("cuda: greedy reduction from slot %d: want 0 to %d", slot, GreedySlots-1)
	}
	o := r.slotOff(slot)
	return decodeReduction(r.host.Bytes()[o:o+smpIDsOff], r.n, true, dst)
}

// download enqueues the copy of candidates [from, to) (with the head when
// from is 0) into the host buffer.
func (r *SampleReducer) download(c *Ctx, from, to int, s Stream) error {
	lo := smpIDsOff + 4*from
	if from == 0 {
		lo = 0
	}
	if err := c.DownloadAsync(r.host, lo, r.out+DevicePtr(lo), smpIDsOff+4*to-lo, s); err != nil {
		return err
	}
	e := smpIDsOff + 4*SampleKeep
	return c.DownloadAsync(r.host, e+8*from, r.out+DevicePtr(e+8*from), 8*(to-from), s)
}

// Read fills dst with the last Enqueue's result (s synchronised since);
// dst's slices are reused. With more than 2,048 candidates it copies the
// rest on s and waits for them. It errors on a result that cannot come
// from the kernels (a count or id out of range).
func (r *SampleReducer) Read(c *Ctx, s Stream, dst *sample.Reduction) error {
	b := r.host.Bytes()[:smpIDsOff+12*SampleKeep]
	if h := readSmpHead(b); !r.greed && h.complete && !h.bad && h.count > sampleFirst && h.count <= SampleKeep {
		if err := r.download(c, sampleFirst, h.count, s); err != nil {
			return err
		}
		if err := c.Sync(s); err != nil {
			return err
		}
	}
	return decodeReduction(b, r.n, r.greed, dst)
}

// smpHead is smp_fin's head (struct SmpHead in kernels/sample.cu).
type smpHead struct {
	z, cmass      float64
	best, count   int
	bad, complete bool
}

// readSmpHead parses the head at the start of b (at least smpIDsOff bytes).
func readSmpHead(b []byte) smpHead {
	le := binary.LittleEndian
	return smpHead{
		z:        math.Float64frombits(le.Uint64(b[0:])),
		best:     int(int32(le.Uint32(b[8:]))),
		bad:      le.Uint32(b[12:]) != 0,
		count:    int(int32(le.Uint32(b[16:]))),
		complete: le.Uint32(b[20:]) != 0,
		cmass:    math.Float64frombits(le.Uint64(b[24:])),
	}
}

// smpDrawArgs mirrors struct SmpDrawArgs in kernels/sample.cu.
type smpDrawArgs struct {
	_                    structs.HostLayout
	Part, CID, CE, Drawn uint64
	Z, TopP, U           float64
	NB, K                int32
}

// Draw makes the step's draw on the device (smp_draw) over the last
// Enqueue's candidates, which did not fit in its Reduction, as d says, and
// returns the drawn id. It waits for s.
func (r *SampleReducer) Draw(c *Ctx, d sample.DeviceDraw, s Stream) (int, error) {
	if !(d.U >= 0 && d.U < 1) || d.TopK < 0 || !(d.TopP >= 0 && d.TopP < 1) || !(d.Z >= 1) {
		return 0, fmt.Errorf("cuda: sampler draw with %+v: want U and TopP in [0, 1), TopK >= 0, Z >= 1", d)
	}
	k := int32(math.MaxInt32)
	if d.TopK > 0 {
		k = int32(min(d.TopK, math.MaxInt32))
	}
	a := smpDrawArgs{Part: uint64(r.part), CID: uint64(r.cid), CE: uint64(r.ce), Drawn: uint64(r.drawn),
		Z: d.Z, TopP: d.TopP, U: d.U, NB: int32(r.nb), K: k}
	n := int32(r.n)
	if err := c.launchNamed(c.sampleModule, "smp_draw", Dim3{X: 1, Y: 1, Z: 1}, Dim3{X: smpDrawThreads, Y: 1, Z: 1}, 0, s,
		unsafe.Pointer(&a), unsafe.Pointer(&n)); err != nil {
		return 0, err
	}
	off := smpIDsOff + 12*SampleKeep
	if err := c.DownloadAsync(r.host, off, r.drawn, 4, s); err != nil {
		return 0, err
	}
	if err := c.Sync(s); err != nil {
		return 0, err
	}
	id := int(int32(binary.LittleEndian.Uint32(r.host.Bytes()[off:])))
	if id < 0 || id >= r.n {
		return 0, fmt.Errorf("cuda: sampler draw returned id %d outside the vocabulary of %d", id, r.n)
	}
	return id, nil
}

// decodeReduction parses smp_fin's output b for a row of n logits into
// dst: the head, and unless greedy the candidates (b holds the head, then
// the ids and then the e of (len(b)-32)/12 candidates).
func decodeReduction(b []byte, n int, greedy bool, dst *sample.Reduction) error {
	if len(b) < smpIDsOff {
		return fmt.Errorf("cuda: sampler reduction result of %d bytes: want at least %d", len(b), smpIDsOff)
	}
	le := binary.LittleEndian
	h := readSmpHead(b)
	count := h.count
	*dst = sample.Reduction{
		N:        n,
		Count:    max(count, 0),
		CandMass: h.cmass,
		Best:     h.best,
		Bad:      h.bad,
		Z:        h.z,
		IDs:      dst.IDs[:0],
		E:        dst.E[:0],
		Complete: !greedy && h.complete,
	}
	if dst.Best < -1 || dst.Best >= n {
		return fmt.Errorf("cuda: sampler reduction's argmax %d outside the vocabulary of %d", dst.Best, n)
	}
	if greedy || dst.Bad || dst.Best < 0 || !dst.Complete {
		dst.Complete = dst.Complete && !dst.Bad && dst.Best >= 0
		return nil
	}
	keep := (len(b) - smpIDsOff) / 12
	if count < 1 || count > keep {
		return fmt.Errorf("cuda: sampler reduction's %d candidates: want 1 to %d when complete", count, keep)
	}
	for i := range count {
		dst.IDs = append(dst.IDs, int32(le.Uint32(b[smpIDsOff+4*i:])))
		dst.E = append(dst.E, math.Float64frombits(le.Uint64(b[smpIDsOff+4*keep+8*i:])))
	}
	return nil
}
