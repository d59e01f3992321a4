package dsv4

import (
	"fmt"
	"strings"

	"moxie/checkpoint"
	"moxie/compute"
	"moxie/compute/cuda"
	"moxie/dsv4/config"
)

// expertTier is the device's routed-expert cache when the experts do not all
// fit in GPU memory: a fixed number of slots, each holding one expert's
// stored bytes (w1, w3, w2 with their scales), filled from host memory (the
// checkpoint's tensors) on a miss and evicted least recently used. Each
// layer's ExpertTable records point a resident expert at its slot; the host
// makes every expert a launch uses resident before the launch, so decode
// steps synchronise once per layer (the routing comes down) and are not
// captured in graphs.
type expertTier struct {
	host      [][]hostExpert // [layer][expert]: stored bytes (source views)
	slots     []tierSlot
	where     map[[2]int]int // (layer, expert) → slot
	slotBytes int
	arena     *cuda.Arena // the slots, plus scratch for table records
	stamp     int64       // use clock
	gen       int64       // a slot used in the current generation is pinned
	hits      int
	misses    int
}

type hostExpert struct{ w1, w3, w2 compute.WeightData }

type tierSlot struct {
	owner      [2]int // (layer, expert), or (-1, -1)
	used       int64
	gen        int64
	w1, w3, w2 *cuda.DeviceWeight // views of the slot's memory
}

// recorder is a binder backend that keeps the stored form of each weight
// instead of binding it (the tier uploads experts on demand).
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

// expertSlotBytes is the arena bytes one slot needs: the aligned stored
// bytes of one expert's six tensors (experts all have the same shapes).
func expertSlotBytes(src checkpoint.Source) int {
	n := 0
	for _, suffix := range []string{"w1.weight", "w1.scale", "w3.weight", "w3.scale", "w2.weight", "w2.scale"} {
		if t, ok := src.Lookup("layers.0.ffn.experts.0." + suffix); ok {
			n += alignUp(int(t.Size))
		}
	}
	return n
}

// newExpertTier records every routed expert's stored bytes and allocates n
// slots (n >= the experts a token uses), plus a table per layer whose
// records all start at slot 0.
func newExpertTier(c *cuda.Ctx, d *deviceModel, src checkpoint.Source, cfg *config.Config, n int) (*expertTier, error) {
	t := &expertTier{where: map[[2]int]int{}, slotBytes: expertSlotBytes(src)}
	b := &binder{src: src, be: recorder{}, cfg: cfg}
	for l := range cfg.NLayers {
		row := make([]hostExpert, cfg.NRoutedExperts)
		for e := range row {
			w := b.expert(fmt.Sprintf("layers.%d.ffn.experts.%d.", l, e))
			row[e] = hostExpert{recorded(w.W1), recorded(w.W3), recorded(w.W2)}
		}
		t.host = append(t.host, row)
	}
	if err := b.err(); err != nil {
		return nil, err
	}
	var err error
	if t.arena, err = c.NewArena(n*t.slotBytes + 1<<20); err != nil {
		return nil, fmt.Errorf("device expert cache of %d slots (%d bytes): %w", n, n*t.slotBytes, err)
	}
	h := t.host[0][0]
	for range n {
		s := tierSlot{owner: [2]int{-1, -1}, gen: -1}
		for _, p := range []struct {
			dst **cuda.DeviceWeight
			d   compute.WeightData
		}{{&s.w1, h.w1}, {&s.w3, h.w3}, {&s.w2, h.w2}} {
			w := &cuda.DeviceWeight{Format: p.d.Format, Rows: p.d.Rows, Cols: p.d.Cols, Block: p.d.Block, Bytes: len(p.d.Data) + len(p.d.Scale)}
			if w.Data, err = t.arena.Alloc(len(p.d.Data)); err != nil {
				return nil, err
			}
			w.Scale = w.Data
			if len(p.d.Scale) > 0 {
				if w.Scale, err = t.arena.Alloc(len(p.d.Scale)); err != nil {
					return nil, err
				}
			}
			*p.dst = w
		}
		t.slots = append(t.slots, s)
	}
	s0 := t.slots[0]
	for _, db := range d.layers {
		w1, w3, w2 := make([]*cuda.DeviceWeight, cfg.NRoutedExperts), make([]*cuda.DeviceWeight, cfg.NRoutedExperts), make([]*cuda.DeviceWeight, cfg.NRoutedExperts)
		for e := range w1 {
			w1[e], w3[e], w2[e] = s0.w1, s0.w3, s0.w2
		}
		if db.table, err = c.PrepareExpertTable(d.arena, w1, w3, w2); err != nil {
			return nil, fmt.Errorf("device expert cache: layer %d: the experts do not fit the multi-linear kernels: %w", db.layer, err)
		}
	}
	return t, nil
}

// pin starts a generation: the experts made resident until the next pin
// cannot evict each other.
func (t *expertTier) pin() { t.gen++ }

// ensure makes expert e of layer l resident and returns its weights. A miss
// waits for the compute stream (a queued launch may still read the victim
// slot), copies the expert's bytes into the least recently used unpinned
// slot and repoints the layer's table records.
func (t *expertTier) ensure(c *cuda.Ctx, b *devBlock, l, e int) (*devExpert, error) {
	t.stamp++
	if i, ok := t.where[[2]int{l, e}]; ok {
		s := &t.slots[i]
		s.used, s.gen = t.stamp, t.gen
		t.hits++
		return &devExpert{s.w1, s.w3, s.w2}, nil
	}
	t.misses++
	v := -1
	for i := range t.slots {
		if t.slots[i].gen == t.gen {
			continue
		}
		if v < 0 || t.slots[i].used < t.slots[v].used {
			v = i
		}
	}
	if v < 0 {
		return nil, fmt.Errorf("device expert cache: all %d slots hold experts of the current step", len(t.slots))
	}
	s := &t.slots[v]
	if err := c.Sync(c.Stream()); err != nil {
		return nil, err
	}
	if s.owner[0] >= 0 {
		delete(t.where, s.owner)
	}
	s.owner = [2]int{-1, -1}
	h := t.host[l][e]
	for _, p := range []struct {
		w *cuda.DeviceWeight
		d compute.WeightData
	}{{s.w1, h.w1}, {s.w3, h.w3}, {s.w2, h.w2}} {
		if err := c.CopyToDevice(p.w.Data, p.d.Data); err != nil {
			return nil, err
		}
		if len(p.d.Scale) > 0 {
			if err := c.CopyToDevice(p.w.Scale, p.d.Scale); err != nil {
				return nil, err
			}
		}
	}
	if err := c.SetTableExpert(t.arena, b.table, e, s.w1, s.w3, s.w2); err != nil {
		return nil, fmt.Errorf("device expert cache: layer %d expert %d: %w", l, e, err)
	}
	s.owner, s.used, s.gen = [2]int{l, e}, t.stamp, t.gen
	t.where[s.owner] = v
	return &devExpert{s.w1, s.w3, s.w2}, nil
}

// DeviceExpertStats reports the device expert cache: slots (0 when every
// routed expert is resident), and the hits and misses since Load.
func (m *Model) DeviceExpertStats() (slots, hits, misses int) {
	if m.dev == nil || m.dev.tier == nil {
		return 0, 0, 0
	}
	t := m.dev.tier
	return len(t.slots), t.hits, t.misses
}
