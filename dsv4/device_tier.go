package dsv4

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"moxie/checkpoint"
	"moxie/compute"
	"moxie/compute/cuda"
	"moxie/dsv4/config"
	"moxie/internal/progress"
)

// expertTier holds the routed experts when they do not all fit in GPU
// memory, in three places:
//   - static slots: experts uploaded at Load and never evicted (the first
//     static[l] experts of layer l);
//   - dynamic slots: a GPU cache of the other experts, least recently used
//     evicted, filled on a miss;
//   - pinned host memory (one page-locked buffer per layer) holding every
//     expert that is not static, filled at Load straight from the source;
//     a miss is one asynchronous host→device copy of the expert's slot image
//     on the tier's copy stream.
//
// Each layer's ExpertTable records point a resident expert at its slot; the
// host makes every expert a launch uses resident before the launch (ensure),
// so decode steps synchronise once per layer (the routing comes down) and are
// not captured in graphs. A miss never blocks the host: the copy waits on the
// GPU (an event) for the compute work queued before it, which may still read
// the victim slot; the layer table's record of the expert is overwritten by
// a device→device copy of the slot's record on the compute stream; and the
// compute stream waits (an event) for the copy before the launches that use
// it. Consecutive misses' copies run back to back on the copy stream.
type expertTier struct {
	lay       slotLayout
	slotBytes int
	slots     []tierSlot // nStatic static slots, then the dynamic ones
	nStatic   int
	where     [][]int // [layer][expert] → slot, -1 when not on the GPU
	host      []*cuda.HostBuffer
	hostOff   [][]int // [layer][expert] → offset in host[layer], -1 when static
	nHost     int
	hasMapped bool // the host buffers are mapped and read in place (no cache)
	hostBytes int64
	arena     *cuda.Arena // the slots, plus the slot table
	// slotTable holds the argument records of the dynamic slots (slot
	// nStatic+j is its expert j): a miss copies its slot's records over the
	// layer table's record of the expert, on the device.
	slotTable *cuda.ExpertTable
	copy      cuda.Stream
	evCompute cuda.Event // recorded on the compute stream before a copy
	evCopy    cuda.Event // recorded on the copy stream after a copy
	hasCopy   bool       // copy, evCompute and evCopy exist
	stamp     int64      // use clock
	gen       int64      // a slot used in the current generation is pinned
	hits      int
	misses    int
	pcie      int64 // bytes copied host→device
}

type tierSlot struct {
	owner [2]int // (layer, expert), or (-1, -1)
	used  int64
	gen   int64
	base  cuda.DevicePtr
	x     devExpert // views of the slot's memory
}

// slotLayout is where one expert's tensors sit inside its slot image (the
// same offsets in GPU slots and in pinned host memory): w1, w3 and w2 with
// their scales, each aligned to arenaAlign.
type slotLayout struct {
	pieces []slotPiece
	// w[i] (w1, w3, w2): the weight's format and shape, and the pieces
	// holding its data and scale (-1: none).
	w [3]struct {
		tmpl        compute.WeightData // no data
		data, scale int
	}
}

type slotPiece struct {
	suffix string // e.g. "w1.weight"
	info   checkpoint.TensorInfo
	off    int
}

// size is the bytes of one slot image.
func (s *slotLayout) size() int {
	if len(s.pieces) == 0 {
		return 0
	}
	p := s.pieces[len(s.pieces)-1]
	return p.off + alignUp(int(p.info.Size))
}

// expertPrefix names the tensors of routed expert e of layer l.
func expertPrefix(l, e int) string { return fmt.Sprintf("layers.%d.ffn.experts.%d.", l, e) }

// zeroSource serves zero bytes of each tensor's size (formats and shapes are
// bound without reading or generating the data).
type zeroSource struct{ checkpoint.Source }

func (z zeroSource) TensorData(name string) ([]byte, error) {
	t, ok := z.Lookup(name)
	if !ok {
		return nil, fmt.Errorf("no tensor %q", name)
	}
	return make([]byte, t.Size), nil
}

// newSlotLayout derives the slot image from layer 0's expert 0 (bound as the
// model binds experts) and checks that every routed expert's tensors have the
// same dtypes and shapes, so that any expert fits any slot.
func newSlotLayout(src checkpoint.Source, cfg *config.Config) (slotLayout, error) {
	var s slotLayout
	b := &binder{src: zeroSource{src}, be: recorder{}, cfg: cfg}
	w := b.expert(expertPrefix(0, 0))
	if err := b.err(); err != nil {
		return s, err
	}
	off := 0
	add := func(suffix string) int {
		t, ok := src.Lookup(expertPrefix(0, 0) + suffix)
		if !ok {
			return -1
		}
		s.pieces = append(s.pieces, slotPiece{suffix: suffix, info: t, off: off})
		off += alignUp(int(t.Size))
		return len(s.pieces) - 1
	}
	for i, x := range []compute.Weight{w.W1, w.W3, w.W2} {
		d := recorded(x)
		d.Data, d.Scale = nil, nil
		name := [3]string{"w1", "w3", "w2"}[i]
		s.w[i].tmpl = d
		s.w[i].data = add(name + ".weight")
		s.w[i].scale = add(name + ".scale")
	}
	for l := range cfg.NLayers {
		for e := range cfg.NRoutedExperts {
			for _, p := range s.pieces {
				name := expertPrefix(l, e) + p.suffix
				t, ok := src.Lookup(name)
				if !ok {
					return s, fmt.Errorf("tensor %s: missing", name)
				}
				if !sameStorage(t.DType, p.info.DType) && !sameStorage(p.info.DType, t.DType) || !equalShape(t.Shape, p.info.Shape) {
					return s, fmt.Errorf("tensor %s: %s%v, want %s%v like %s", name, t.DType, t.Shape, p.info.DType, p.info.Shape, expertPrefix(0, 0)+p.suffix)
				}
			}
		}
	}
	return s, nil
}

// expertAt returns the weights of a slot image at base (device addresses).
func (s *slotLayout) expertAt(base cuda.DevicePtr) devExpert {
	var ws [3]*cuda.DeviceWeight
	for i, w := range s.w {
		d := w.tmpl
		dw := &cuda.DeviceWeight{Format: d.Format, Rows: d.Rows, Cols: d.Cols, Block: d.Block}
		dw.Data = base + cuda.DevicePtr(s.pieces[w.data].off)
		dw.Bytes = int(s.pieces[w.data].info.Size)
		dw.Scale = dw.Data
		if w.scale >= 0 {
			dw.Scale = base + cuda.DevicePtr(s.pieces[w.scale].off)
			dw.Bytes += int(s.pieces[w.scale].info.Size)
		}
		ws[i] = dw
	}
	return devExpert{ws[0], ws[1], ws[2]}
}

// tierPlan is where the routed experts go: static[l] experts of layer l
// (experts 0..static[l]-1) stay in GPU memory for good, dynamic GPU slots
// cache the others, which are all held in pinned host memory.
type tierPlan struct {
	static  []int
	dynamic int
	// mapped: no cache; the host memory is mapped into the device's address
	// space and the kernels read the non-static experts in place.
	mapped bool
}

func (p tierPlan) nStatic() int {
	n := 0
	for _, s := range p.static {
		n += s
	}
	return n
}

// planTier splits gpuSlots expert slots of GPU memory (gpuSlots >= k, the
// experts one token uses per layer) for layers×experts routed experts: every
// expert static when all fit; otherwise a dynamic cache of max(4k,
// gpuSlots/16) slots (at most gpuSlots) and the rest static, spread evenly
// over the layers. With routing that picks experts uniformly both kinds of
// slot hit equally often, so the split trades host memory (every non-static
// expert is held there) for a cache that follows the routing's locality.
func planTier(gpuSlots, layers, experts, k int) tierPlan {
	p := tierPlan{static: make([]int, layers)}
	if gpuSlots >= layers*experts {
		for l := range p.static {
			p.static[l] = experts
		}
		return p
	}
	p.dynamic = min(gpuSlots, max(4*k, gpuSlots/16))
	s := gpuSlots - p.dynamic
	for l := range p.static {
		p.static[l] = s / layers
		if l < s%layers {
			p.static[l]++
		}
	}
	return p
}

// hostBytes is the pinned host memory plan p needs with slots of slotBytes.
func (p tierPlan) hostBytes(experts, slotBytes int) int64 {
	n := int64(0)
	for _, s := range p.static {
		n += int64(experts-s) * int64(slotBytes)
	}
	return n
}

// planMapped spreads gpuSlots static experts evenly over the layers (all of
// them when they fit) for the mapped mode: no cache, the other experts read
// in place from mapped host memory.
func planMapped(gpuSlots, layers, experts int) tierPlan {
	p := tierPlan{static: make([]int, layers), mapped: true}
	s := min(gpuSlots, layers*experts)
	for l := range p.static {
		p.static[l] = s / layers
		if l < s%layers {
			p.static[l]++
		}
	}
	return p
}

// DeviceExpertsEnv selects how a GPU-resident model serves the routed
// experts that do not fit in GPU memory: "copy" (the default) caches them
// in GPU slots, copied from pinned host memory on a miss (one host
// synchronisation per layer for the routing); "mapped" keeps none in slots
// and lets the kernels read them in place from mapped pinned host memory
// over PCIe (no host synchronisation; decode graphs stay possible; hits and
// misses are not counted).
const DeviceExpertsEnv = "MOXIE_DEVICE_EXPERTS"

// deviceExpertMode returns $MOXIE_DEVICE_EXPERTS ("copy" when unset).
func deviceExpertMode() (string, error) {
	switch v := os.Getenv(DeviceExpertsEnv); v {
	case "", "copy":
		return "copy", nil
	case "mapped":
		return v, nil
	default:
		return "", fmt.Errorf("%s=%q: want copy or mapped", DeviceExpertsEnv, v)
	}
}

// tierOrder lists the expert tensors newExpertTier reads, in its order.
func tierOrder(lay slotLayout, cfg *config.Config) []string {
	var order []string
	for l := range cfg.NLayers {
		for e := range cfg.NRoutedExperts {
			for _, p := range lay.pieces {
				order = append(order, expertPrefix(l, e)+p.suffix)
			}
		}
	}
	return order
}

// HostMemoryReserve is the host memory left unpinned when the device expert
// tier checks that its pinned buffers fit (the process, the source and the
// prefetch of the load itself need some).
const HostMemoryReserve = 4 << 30

// memAvailable parses MemAvailable from /proc/meminfo contents (bytes).
func memAvailable(meminfo []byte) (int64, bool) {
	for line := range bytes.Lines(meminfo) {
		f := strings.Fields(string(line))
		if len(f) >= 2 && f[0] == "MemAvailable:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil || kb < 0 {
				return 0, false
			}
			return kb << 10, true
		}
	}
	return 0, false
}

// checkPinnable refuses to pin ask bytes when the host reports less than ask
// + HostMemoryReserve available (available < 0: unknown, no check); pinning
// past that would push the process or others out of memory rather than fail.
func checkPinnable(ask, available int64, experts int) error {
	if ask <= 0 || available < 0 || ask+HostMemoryReserve <= available {
		return nil
	}
	return fmt.Errorf("the %d routed experts not kept in GPU memory need %s (%d bytes) of pinned host memory, and the host has %s available (%s kept free); give the GPU a larger budget (--gpu-mem) or use a model with fewer experts",
		experts, progress.FormatBytes(ask), ask, progress.FormatBytes(available), progress.FormatBytes(HostMemoryReserve))
}

// hostAvailable returns the host's MemAvailable, or -1 when unknown.
func hostAvailable() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return -1
	}
	if n, ok := memAvailable(b); ok {
		return n
	}
	return -1
}

// newExpertTier builds the tier of plan p for d's layers: the slots in an
// arena of their own, the pinned host buffers, and every expert read once
// from src (in tierOrder) into its static slot or its host buffer. It
// prepares each layer's ExpertTable (static experts at their slots, the
// others at the first dynamic slot until they are loaded).
func newExpertTier(c *cuda.Ctx, d *deviceModel, lay slotLayout, src checkpoint.Source, cfg *config.Config, p tierPlan) (t *expertTier, err error) {
	L, E := cfg.NLayers, cfg.NRoutedExperts
	t = &expertTier{lay: lay, slotBytes: lay.size(), nStatic: p.nStatic(), hasMapped: p.mapped}
	defer func() {
		if err != nil {
			t.release(c)
			t = nil
		}
	}()
	n := t.nStatic + p.dynamic
	if n == 0 || t.slotBytes == 0 {
		return nil, fmt.Errorf("device expert cache: %d slots of %d bytes", n, t.slotBytes)
	}
	if p.dynamic == 0 && !p.mapped && t.nStatic < L*E {
		return nil, fmt.Errorf("device expert cache: %d static experts of %d and no cache slots", t.nStatic, L*E)
	}
	const recordBytes = 128 // ≥ one multi-linear argument record
	if t.arena, err = c.NewArena(n*t.slotBytes + 2*alignUp(3*p.dynamic*recordBytes) + 1<<20); err != nil {
		return nil, fmt.Errorf("device expert cache of %d slots (%d bytes): %w", n, n*t.slotBytes, err)
	}
	for range n {
		base, err := t.arena.Alloc(t.slotBytes)
		if err != nil {
			return nil, err
		}
		t.slots = append(t.slots, tierSlot{owner: [2]int{-1, -1}, gen: -1, base: base, x: lay.expertAt(base)})
	}
	if p.dynamic > 0 {
		w1, w3, w2 := make([]*cuda.DeviceWeight, p.dynamic), make([]*cuda.DeviceWeight, p.dynamic), make([]*cuda.DeviceWeight, p.dynamic)
		for j := range p.dynamic {
			x := t.slots[t.nStatic+j].x
			w1[j], w3[j], w2[j] = x.w1, x.w3, x.w2
		}
		if t.slotTable, err = c.PrepareExpertTable(t.arena, w1, w3, w2); err != nil {
			return nil, fmt.Errorf("device expert cache: the experts do not fit the multi-linear kernels: %w", err)
		}
		if t.copy, err = c.NewStream(); err != nil {
			return nil, err
		}
		if t.evCompute, err = c.NewEvent(false); err != nil {
			_ = c.DestroyStream(t.copy)
			return nil, err
		}
		if t.evCopy, err = c.NewEvent(false); err != nil {
			_ = c.DestroyEvent(t.evCompute)
			_ = c.DestroyStream(t.copy)
			return nil, err
		}
		t.hasCopy = true
	}
	// Where each expert lives.
	t.where = make([][]int, L)
	t.hostOff = make([][]int, L)
	next := 0
	for l := range L {
		t.where[l] = make([]int, E)
		t.hostOff[l] = make([]int, E)
		h := 0
		for e := range E {
			t.where[l][e], t.hostOff[l][e] = -1, -1
			if e < p.static[l] {
				t.where[l][e] = next
				t.slots[next].owner = [2]int{l, e}
				next++
			} else {
				t.hostOff[l][e] = h * t.slotBytes
				h++
			}
		}
		t.nHost += h
		t.hostBytes += int64(h) * int64(t.slotBytes)
	}
	if err := checkPinnable(t.hostBytes, hostAvailable(), t.nHost); err != nil {
		return nil, fmt.Errorf("device expert cache: %w", err)
	}
	t.host = make([]*cuda.HostBuffer, L)
	for l := range L {
		h := (E - p.static[l]) * t.slotBytes
		if h == 0 {
			continue
		}
		alloc := c.NewHostBuffer
		if p.mapped {
			alloc = c.NewMappedHostBuffer
		}
		if t.host[l], err = alloc(h); err != nil {
			return nil, fmt.Errorf("device expert cache: pinned host memory for the %d experts of layer %d not kept on the GPU (%s; %s for all %d such experts): %w",
				E-p.static[l], l, progress.FormatBytes(int64(h)), progress.FormatBytes(t.hostBytes), t.nHost, err)
		}
	}
	// Every expert read once, into its static slot or its host image.
	for l := range L {
		for e := range E {
			for _, pc := range lay.pieces {
				name := expertPrefix(l, e) + pc.suffix
				data, err := src.TensorData(name)
				if err != nil {
					return nil, fmt.Errorf("tensor %s: %w", name, err)
				}
				if int64(len(data)) != pc.info.Size {
					return nil, fmt.Errorf("tensor %s: source returned %d bytes, want %d", name, len(data), pc.info.Size)
				}
				if s := t.where[l][e]; s >= 0 {
					err = c.CopyToDevice(t.slots[s].base+cuda.DevicePtr(pc.off), data)
				} else {
					copy(t.host[l].Bytes()[t.hostOff[l][e]+pc.off:], data)
				}
				if err != nil {
					return nil, fmt.Errorf("tensor %s: %w", name, err)
				}
			}
		}
	}
	// Tables: static experts at their slots, the rest at the first dynamic
	// slot (never launched before ensure points them at their own) or, when
	// mapped, at their host memory (then db.experts lists them all too).
	for l, db := range d.layers {
		w1, w3, w2 := make([]*cuda.DeviceWeight, E), make([]*cuda.DeviceWeight, E), make([]*cuda.DeviceWeight, E)
		for e := range E {
			var x devExpert
			switch s := t.where[l][e]; {
			case s >= 0:
				x = t.slots[s].x
			case p.mapped:
				x = lay.expertAt(t.host[l].DevicePtr(t.hostOff[l][e]))
			default:
				x = t.slots[t.nStatic].x
			}
			w1[e], w3[e], w2[e] = x.w1, x.w3, x.w2
			if p.mapped {
				db.experts = append(db.experts, x)
			}
		}
		if db.table, err = c.PrepareExpertTable(d.arena, w1, w3, w2); err != nil {
			return nil, fmt.Errorf("device expert cache: layer %d: the experts do not fit the multi-linear kernels: %w", db.layer, err)
		}
	}
	return t, nil
}

// release frees the tier's GPU and host memory, stream and events.
func (t *expertTier) release(c *cuda.Ctx) error {
	var errs []error
	if t.hasCopy {
		errs = append(errs, c.Sync(t.copy), c.DestroyEvent(t.evCompute), c.DestroyEvent(t.evCopy), c.DestroyStream(t.copy))
		t.hasCopy = false
	}
	for i, h := range t.host {
		if h != nil {
			errs = append(errs, c.FreeHost(h))
			t.host[i] = nil
		}
	}
	if t.arena != nil {
		errs = append(errs, c.ReleaseArena(t.arena))
		t.arena = nil
	}
	return errors.Join(errs...)
}

// pin starts a generation: the experts made resident until the next pin
// cannot evict each other.
func (t *expertTier) pin() { t.gen++ }

// ensure makes expert e of layer l resident and returns its weights. A miss
// takes the least recently used dynamic slot not used in the current
// generation, enqueues the expert's copy from pinned host memory on the copy
// stream (after the compute work already queued, which may read the victim),
// repoints the layer's table record on the compute stream, and makes the
// compute stream wait for the copy; nothing waits on the host.
func (t *expertTier) ensure(c *cuda.Ctx, b *devBlock, l, e int) (*devExpert, error) {
	t.stamp++
	if i := t.where[l][e]; i >= 0 {
		s := &t.slots[i]
		s.used, s.gen = t.stamp, t.gen
		t.hits++
		return &s.x, nil
	}
	t.misses++
	v := -1
	for i := t.nStatic; i < len(t.slots); i++ {
		if t.slots[i].gen == t.gen {
			continue
		}
		if v < 0 || t.slots[i].used < t.slots[v].used {
			v = i
		}
	}
	if v < 0 {
		return nil, fmt.Errorf("device expert cache: all %d cache slots hold experts of the current step", len(t.slots)-t.nStatic)
	}
	s := &t.slots[v]
	if s.owner[0] >= 0 {
		t.where[s.owner[0]][s.owner[1]] = -1
	}
	s.owner = [2]int{-1, -1}
	st := c.Stream()
	if err := errs(
		func() error { return c.Record(t.evCompute, st) },
		func() error { return c.StreamWait(t.copy, t.evCompute) },
		func() error { return c.UploadAsync(s.base, t.host[l], t.hostOff[l][e], t.slotBytes, t.copy) },
	); err != nil {
		return nil, fmt.Errorf("device expert cache: layer %d expert %d: %w", l, e, err)
	}
	t.pcie += int64(t.slotBytes)
	if err := errs(
		func() error { return c.CopyTableExpert(b.table, e, t.slotTable, v-t.nStatic, st) },
		func() error { return c.Record(t.evCopy, t.copy) },
		func() error { return c.StreamWait(st, t.evCopy) },
	); err != nil {
		return nil, fmt.Errorf("device expert cache: layer %d expert %d: %w", l, e, err)
	}
	s.owner, s.used, s.gen = [2]int{l, e}, t.stamp, t.gen
	t.where[l][e] = v
	return &s.x, nil
}

// stats returns the tier's figures (see DeviceExpertCache).
func (t *expertTier) stats() DeviceExpertCache {
	return DeviceExpertCache{Static: t.nStatic, Slots: len(t.slots) - t.nStatic, Host: t.nHost, HostBytes: t.hostBytes, Mapped: t.hasMapped,
		ExpertBytes: t.slotBytes, Hits: int64(t.hits), Misses: int64(t.misses), PCIeBytes: t.pcie}
}

// describe summarises the tier for DeviceSession.Describe.
func (t *expertTier) describe() string {
	st := t.stats()
	return st.String()
}

// DeviceExpertCache describes where the routed experts of a GPU-resident
// model live when they do not all fit in GPU memory, and what the cache has
// done since Load. Counts are experts; a hit is an expert use served from GPU
// memory (static or cached), a miss one that was first copied from pinned
// host memory (ExpertBytes over PCIe).
type DeviceExpertCache struct {
	Static      int   // experts kept in GPU memory for good
	Slots       int   // GPU cache slots, filled on a miss (least recently used evicted)
	Host        int   // experts held in pinned host memory (every non-static one)
	HostBytes   int64 // pinned host memory holding them
	ExpertBytes int   // bytes of one expert's slot image (one copy per miss)
	Hits        int64
	Misses      int64
	PCIeBytes   int64 // bytes copied host→device
	// Mapped: the host-held experts are read in place over PCIe by the
	// kernels (MOXIE_DEVICE_EXPERTS=mapped); Hits, Misses and PCIeBytes are
	// not counted then.
	Mapped bool
}

// HitRate is Hits / (Hits + Misses), 0 before any use.
func (s DeviceExpertCache) HitRate() float64 {
	if s.Hits+s.Misses == 0 {
		return 0
	}
	return float64(s.Hits) / float64(s.Hits+s.Misses)
}

// Sub returns the counters of s minus those of an earlier snapshot o (the
// sizes are s's): the work between the two.
func (s DeviceExpertCache) Sub(o DeviceExpertCache) DeviceExpertCache {
	s.Hits -= o.Hits
	s.Misses -= o.Misses
	s.PCIeBytes -= o.PCIeBytes
	return s
}

// Add returns s with o's counters added (sums of intervals).
func (s DeviceExpertCache) Add(o DeviceExpertCache) DeviceExpertCache {
	s.Hits += o.Hits
	s.Misses += o.Misses
	s.PCIeBytes += o.PCIeBytes
	return s
}

func (s DeviceExpertCache) String() string {
	if s.Mapped {
		return fmt.Sprintf("experts: %d static on the GPU, %d in mapped pinned host memory (%s) read in place over PCIe",
			s.Static, s.Host, progress.FormatBytes(s.HostBytes))
	}
	return fmt.Sprintf("experts: %d static on the GPU, %d cache slots, %d in pinned host memory (%s); %d hits, %d misses (%.1f%%), %s copied over PCIe",
		s.Static, s.Slots, s.Host, progress.FormatBytes(s.HostBytes), s.Hits, s.Misses, 100*s.HitRate(), progress.FormatBytes(s.PCIeBytes))
}

// DeviceExpertCache reports the device expert tier; ok is false when every
// routed expert is resident in GPU memory (or the model has no device).
// Call it between passes, not during one.
func (m *Model) DeviceExpertCache() (s DeviceExpertCache, ok bool) {
	switch {
	case m.dev == nil:
		return DeviceExpertCache{}, false
	case m.dev.tier != nil:
		return m.dev.tier.stats(), true
	case m.dev.mapped != nil:
		return m.dev.mapped.stats(), true
	}
	return DeviceExpertCache{}, false
}

// DeviceExpertStats reports the device expert cache: GPU slots (static and
// cache; 0 when every routed expert is resident), and the hits and misses
// since Load (in the mapped mode: the static experts, and no counts).
func (m *Model) DeviceExpertStats() (slots, hits, misses int) {
	if m.dev == nil {
		return 0, 0, 0
	}
	if m.dev.mapped != nil {
		return m.dev.mapped.nStatic, 0, 0
	}
	if m.dev.tier == nil {
		return 0, 0, 0
	}
	t := m.dev.tier
	return len(t.slots), t.hits, t.misses
}

// recorder is a binder backend that keeps the stored form of each weight
// instead of binding it.
type recorder struct{ compute.Backend }

type recordedWeight struct{ d compute.WeightData }

func (r recordedWeight) Rows() int { return r.d.Rows }
func (r recordedWeight) Cols() int { return r.d.Cols }

func (recorder) Bind(d compute.WeightData) (compute.Weight, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return recordedWeight{d}, nil
}

func recorded(w compute.Weight) compute.WeightData {
	if r, ok := w.(recordedWeight); ok {
		return r.d
	}
	return compute.WeightData{}
}

// isRoutedExpert reports whether a main-stack tensor belongs to a routed expert.
func isRoutedExpert(name string) bool {
	return strings.HasPrefix(name, "layers.") && strings.Contains(name, ".ffn.experts.")
}
