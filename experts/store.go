// Package experts serves DeepSeek-V4 routed experts from tiers under a memory
// budget: a Store keeps, per layer, a set of resident experts in process memory
// (the fast tier) and reads the rest from the checkpoint's own files (the slow
// tier), so that the model runs in less memory than its weights occupy with
// exactly the outputs it has with everything resident. Residency is decided by
// a Policy (LRU, decayed counts with hysteresis, a static hot set). The package
// also plans memory budgets from checkpoint headers (Plan) and holds the
// frequency-file format of static hot sets.
package experts

import (
	"context"
	"errors"
	"fmt"
	"io"
	"moxie/internal/progress"
	"os"
	"slices"
	"sync"
	"time"

	"moxie/checkpoint"
	"moxie/compute"
	"moxie/dsv4"
	"moxie/dsv4/config"
	"moxie/format"
)

// Options configure a Store.
type Options struct {
	// Backend binds expert weights; it must be the model's backend
	// (dsv4.Options.Backend). Required.
	Backend compute.Backend
	// Budget is the fast-tier memory for resident experts, in bytes. It is split
	// into whole experts, as evenly as possible over all layers (main layers,
	// then MTP blocks; earlier layers get the remainder). Ignored when Slots is set.
	Budget int64
	// Slots, if non-nil, gives each layer's capacity in experts directly
	// (length NLayers+NMTPLayers).
	Slots []int
	// Policy makes each layer's residency policy; nil means LRU.
	Policy PolicyFunc
	// Readers is the number of concurrent slow-tier reads (goroutines issuing
	// pread); 0 means 8.
	Readers int
	// ChunkSize is the largest single read, in bytes; 0 means 4 MiB.
	ChunkSize int
}

// Store serves routed experts (it implements dsv4.Experts and
// dsv4.ExpertPrefetcher). Resident experts live in store-owned memory outside
// the Go heap: one block holding every slot, allocated and backed by physical
// pages (pre-faulted) when the store is made, and reused as experts are
// evicted, so that a miss costs the read alone. Misses are read from the
// source into their slot (pread on the shard files for sources implementing
// checkpoint.Locator, TensorData otherwise) by a pool of reader goroutines,
// and are never dropped. The weights Expert returns are
// valid until the next Expert call for the same layer: the expert last served
// in a layer, and the experts a layer announced by Prefetch and has not yet
// asked for, are never evicted. A read that fails (I/O error, truncated file)
// fails that Expert call with an error naming the layer, expert, tensor and
// file; the store stays usable. Its methods may be called from several
// goroutines, but the validity guarantee assumes one forward pass at a time
// (as dsv4 runs a model's Sessions). Policy time advances once per Prefetch
// of a layer (or, without Prefetch, when a layer asks again for an expert
// index not above the last one). The store must outlive the model using it;
// Close releases its memory.
type Store struct {
	src     checkpoint.Source
	loc     checkpoint.Locator // nil: read through TensorData
	be      compute.Backend
	cfg     *config.Config
	proj    [3]projShape
	eb      int64 // bytes of one expert
	stride  int64 // bytes between slots in mem: eb rounded up to whole pages
	chunk   int64
	mem     []byte // every layer's slots (from allocBuf); nil with no slots
	layers  []*layerState
	readers int
	reqs    chan readReq
	readWG  sync.WaitGroup

	mu     sync.Mutex
	loads  sync.WaitGroup
	closed bool
}

// projShape is the stored form of one projection (w1, w3 or w2), the same for
// every expert, and where its data and scale sit in an expert buffer.
type projShape struct {
	wd              compute.WeightData // Format, Rows, Cols, Block (no bytes)
	dataOff, dataN  int64
	scaleOff, scale int64 // scale bytes (0 if none)
	dt, sdt         format.DType
}

// projection names in buffer order.
var projNames = [3]string{"w1", "w3", "w2"}

type layerState struct {
	idx     int
	cap     int
	pol     Policy
	mem     []byte        // this layer's part of Store.mem: cap slots
	slots   []*slot       // made on first use, each with its own part of mem
	where   map[int]*slot // resident: ready or loading
	step    int64
	rounds  bool         // a round is open
	used    map[int]bool // experts already counted (Use, hit/miss) this round
	pending map[int]bool // announced by Prefetch, not yet served
	bypass  map[int]bool // experts the policy chose not to install this round
	lastE   int          // last expert served this round
	last    *slot        // last served slot: protected until the next Expert call
	scratch *slot
	stats   LayerStats
}

type slot struct {
	buf        []byte // a slot's part of Store.mem, or the scratch buffer
	e          int    // expert held or being loaded; -1 empty
	ld         *load  // current load (nil for an empty slot)
	ready      bool
	w          dsv4.ExpertWeights
	bound      bool
	prefetched bool // loaded by Prefetch
	served     bool // served since loaded
}

type load struct {
	done chan struct{}
	err  error
}

// readReq is one read of one chunk of one tensor of an expert load.
type readReq struct {
	job        *loadJob
	name       string
	path       string // shard file (Locator); "" reads through TensorData
	off        int64  // file offset
	dst        []byte
	tensorSize int64
}

type loadJob struct {
	mu      sync.Mutex
	pending int
	err     error
	bytes   int64
	start   time.Time
	finish  func(err error, bytes int64, d time.Duration)
}

// SlotsForBudget splits budget bytes into whole experts of size expertBytes
// over n layers, as evenly as possible (earlier layers get the remainder), at
// most perLayer each.
func SlotsForBudget(budget, expertBytes int64, n, perLayer int) []int {
	slots := make([]int, n)
	if budget <= 0 || expertBytes <= 0 || n == 0 {
		return slots
	}
	total := min(budget/expertBytes, int64(n)*int64(perLayer))
	for l := range slots {
		slots[l] = int(total / int64(n))
		if int64(l) < total%int64(n) {
			slots[l]++
		}
	}
	return slots
}

// expertPrefix is the tensor-name prefix of expert e of layer l.
func expertPrefix(cfg *config.Config, l, e int) string {
	if l >= cfg.NLayers {
		return fmt.Sprintf("mtp.%d.ffn.experts.%d.", l-cfg.NLayers, e)
	}
	return fmt.Sprintf("layers.%d.ffn.experts.%d.", l, e)
}

// New makes a store for the routed experts of src (configuration cfg). It
// checks that every expert tensor exists with the shape and dtype of expert 0
// of layer 0, and that the source can locate it when it is a Locator. It
// allocates the memory of every slot (the sum of the layers' capacities times
// ExpertBytes, each slot rounded up to whole pages) and backs it with physical
// memory before it returns, so that this memory is in use from the start (an
// error if the system cannot provide it, where the system says so).
func New(src checkpoint.Source, cfg *config.Config, opts Options) (*Store, error) {
	if opts.Backend == nil {
		return nil, errors.New("experts: Options.Backend is required (the model's backend)")
	}
	nl := cfg.NLayers + cfg.NMTPLayers
	slots := opts.Slots
	if slots == nil {
		slots = SlotsForBudget(opts.Budget, config.ExpertBytes(cfg), nl, cfg.NRoutedExperts)
	}
	if len(slots) != nl {
		return nil, fmt.Errorf("experts: %d slot counts, want %d (one per layer and MTP block)", len(slots), nl)
	}
	for l, n := range slots {
		if n < 0 || n > cfg.NRoutedExperts {
			return nil, fmt.Errorf("experts: layer %d has %d slots, want 0..%d", l, n, cfg.NRoutedExperts)
		}
	}
	s := &Store{src: src, be: opts.Backend, cfg: cfg, chunk: int64(opts.ChunkSize)}
	if s.chunk <= 0 {
		s.chunk = 4 << 20
	}
	s.loc, _ = src.(checkpoint.Locator)
	if err := s.shapes(); err != nil {
		return nil, err
	}
	// Every expert must look like expert 0 of layer 0.
	for l := range nl {
		for e := range cfg.NRoutedExperts {
			p := expertPrefix(cfg, l, e)
			for i, ps := range s.proj {
				for _, part := range []struct {
					suffix string
					dt     format.DType
					n      int64
				}{{".weight", ps.dt, ps.dataN}, {".scale", ps.sdt, ps.scale}} {
					if part.n == 0 {
						continue
					}
					name := p + projNames[i] + part.suffix
					ti, ok := src.Lookup(name)
					if !ok {
						return nil, fmt.Errorf("experts: %s: missing tensor %s", src.Name(), name)
					}
					if ti.DType != part.dt || ti.Size != part.n {
						return nil, fmt.Errorf("experts: %s: tensor %s is %s with %d bytes, want %s with %d bytes like expert 0 of layer 0", src.Name(), name, ti.DType, ti.Size, part.dt, part.n)
					}
				}
			}
		}
	}
	readers := opts.Readers
	if readers <= 0 {
		readers = 8
	}
	s.readers = readers
	pf := opts.Policy
	if pf == nil {
		pf = func(_, n, _ int) Policy { return NewLRU(n) }
	}
	page := int64(os.Getpagesize())
	s.stride = (s.eb + page - 1) / page * page
	var total int64
	for _, n := range slots {
		total += int64(n) * s.stride
	}
	if total > 0 {
		if int64(int(total)) != total {
			return nil, fmt.Errorf("experts: %d bytes of expert slots do not fit in this system's address space", total)
		}
		mem, err := allocBuf(int(total))
		if err != nil {
			return nil, fmt.Errorf("experts: allocating %d bytes for %d expert slots: %w", total, total/s.stride, err)
		}
		if err := prefault(mem, prefaultWorkers(), populateWrite); err != nil {
			freeBuf(mem)
			return nil, fmt.Errorf("experts: backing %d bytes of expert slots with memory: %w", total, err)
		}
		s.mem = mem
	}
	var off int64
	for l := range nl {
		n := int64(slots[l]) * s.stride
		s.layers = append(s.layers, &layerState{idx: l, cap: slots[l], pol: pf(l, cfg.NRoutedExperts, slots[l]),
			mem:   s.mem[off : off+n : off+n],
			where: map[int]*slot{}, used: map[int]bool{}, pending: map[int]bool{}, bypass: map[int]bool{}, lastE: -1})
		off += n
	}
	s.reqs = make(chan readReq, 4*readers)
	for range readers {
		s.readWG.Add(1)
		go s.reader()
	}
	return s, nil
}

// shapes reads the stored form of expert 0 of layer 0.
func (s *Store) shapes() error {
	var off int64
	for i, name := range projNames {
		wname := expertPrefix(s.cfg, 0, 0) + name + ".weight"
		ti, ok := s.src.Lookup(wname)
		if !ok || len(ti.Shape) != 2 {
			return fmt.Errorf("experts: %s: expert tensor %s missing or not 2-D", s.src.Name(), wname)
		}
		ps := projShape{dt: ti.DType, dataN: ti.Size}
		ps.wd = compute.WeightData{Rows: int(ti.Shape[0]), Cols: int(ti.Shape[1]), Block: s.cfg.BlockSize}
		needScale := true
		switch ti.DType {
		case format.I8, format.U8:
			ps.wd.Format = compute.MXFP4
			ps.wd.Cols *= 2
		case format.F8E4M3:
			ps.wd.Format = compute.FP8Block
			if s.cfg.DenseFormat == "mxfp8" {
				ps.wd.Format = compute.MXFP8
			}
		case format.BF16:
			ps.wd.Format, needScale = compute.BF16, false
		case format.F32:
			ps.wd.Format, needScale = compute.F32, false
		default:
			return fmt.Errorf("experts: %s: tensor %s has dtype %s, not an expert weight format", s.src.Name(), wname, ti.DType)
		}
		ps.dataOff = off
		off += ti.Size
		if needScale {
			sname := expertPrefix(s.cfg, 0, 0) + name + ".scale"
			si, ok := s.src.Lookup(sname)
			if !ok {
				return fmt.Errorf("experts: %s: missing tensor %s", s.src.Name(), sname)
			}
			ps.sdt, ps.scale, ps.scaleOff = si.DType, si.Size, off
			off += si.Size
		}
		s.proj[i] = ps
	}
	s.eb = off
	return nil
}

// ExpertBytes is the size of one expert buffer.
func (s *Store) ExpertBytes() int64 { return s.eb }

// Capacity is the number of resident experts layer l may hold.
func (s *Store) Capacity(l int) int { return s.layers[l].cap }

func (s *Store) checkIndex(layer, e int) error {
	if layer < 0 || layer >= len(s.layers) || e < 0 || e >= s.cfg.NRoutedExperts {
		return fmt.Errorf("experts: expert %d of layer %d out of range (%d layers, %d experts)", e, layer, len(s.layers), s.cfg.NRoutedExperts)
	}
	return nil
}

// newRound starts a new step of layer ls.
func (ls *layerState) newRound() {
	ls.step++
	ls.rounds = true
	clear(ls.used)
	clear(ls.pending)
	clear(ls.bypass)
	ls.lastE = -1
}

// count records a use of e in the current round: policy clock, hit or miss.
func (ls *layerState) count(e int) {
	if ls.used[e] {
		return
	}
	ls.used[e] = true
	ls.pol.Use(e, ls.step)
	if _, ok := ls.where[e]; ok {
		ls.stats.Hits++
	} else {
		ls.stats.Misses++
	}
}

// Prefetch announces the experts layer will use next (dsv4.ExpertPrefetcher):
// it counts them, and starts background reads for misses that the policy
// admits into slots not needed by the announced set. It never blocks on I/O.
func (s *Store) Prefetch(layer int, experts []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || layer < 0 || layer >= len(s.layers) {
		return
	}
	ls := s.layers[layer]
	ls.newRound()
	for _, e := range experts {
		if e >= 0 && e < s.cfg.NRoutedExperts {
			ls.pending[e] = true
		}
	}
	var misses []int
	for _, e := range experts {
		if e < 0 || e >= s.cfg.NRoutedExperts || ls.used[e] {
			continue
		}
		ls.count(e)
		if _, ok := ls.where[e]; !ok {
			misses = append(misses, e)
		}
	}
	// The forward pass asks in ascending order: read in that order too.
	slices.Sort(misses)
	for _, e := range misses {
		sl, decided := s.claim(ls, e)
		if sl == nil {
			if decided {
				ls.bypass[e] = true
			}
			continue
		}
		if _, err := s.startLoad(ls, sl, e, true); err != nil {
			continue // the Expert call will report it
		}
		ls.stats.PrefetchIssued++
	}
}

// claim finds a slot for missing expert e of ls: a free or empty slot, or a
// victim the policy picks among evictable residents. It returns nil, true when
// the policy chose to bypass, nil, false when no slot can be had now.
func (s *Store) claim(ls *layerState, e int) (*slot, bool) {
	if ls.cap == 0 {
		return nil, true
	}
	free := len(ls.slots) < ls.cap
	for _, sl := range ls.slots {
		if sl.e < 0 {
			free = true
			break
		}
	}
	var cands []int
	if !free {
		for x, sl := range ls.where {
			if sl.ready && !ls.pending[x] && sl != ls.last {
				cands = append(cands, x)
			}
		}
		if len(cands) == 0 {
			return nil, false
		}
		slices.Sort(cands) // map order must not leak into policy ties
	}
	victim, install := ls.pol.Admit(e, ls.step, free, cands)
	if !install {
		return nil, true
	}
	if free {
		return s.freeSlot(ls), true
	}
	sl, ok := ls.where[victim]
	if !ok || !sl.ready || ls.pending[victim] || sl == ls.last {
		panic(fmt.Sprintf("experts: policy chose victim %d of layer %d, not one of the candidates %v", victim, ls.idx, cands))
	}
	if sl.prefetched && !sl.served {
		ls.stats.PrefetchWasted++
	}
	delete(ls.where, victim)
	sl.e, sl.ready, sl.bound = -1, false, false
	return sl, true
}

// freeSlot returns an empty slot of ls, or a new one made on its part of the
// layer's memory, or nil when all ls.cap slots hold experts. Called with s.mu
// held.
func (s *Store) freeSlot(ls *layerState) *slot {
	for _, sl := range ls.slots {
		if sl.e < 0 {
			return sl
		}
	}
	i := int64(len(ls.slots))
	if i >= int64(ls.cap) {
		return nil
	}
	off := i * s.stride
	sl := &slot{e: -1, buf: ls.mem[off : off+s.eb : off+s.eb]}
	ls.slots = append(ls.slots, sl)
	return sl
}

// startLoad begins reading expert e of ls into sl (a slot, or the layer's
// scratch when sl == ls.scratch). It returns the load, whose done channel
// closes when the bytes are in (or the read failed). Called with s.mu held.
func (s *Store) startLoad(ls *layerState, sl *slot, e int, prefetch bool) (*load, error) {
	if sl.buf == nil { // the scratch buffer, made on first use
		b, err := allocBuf(int(s.eb))
		if err != nil {
			return nil, fmt.Errorf("experts: layer %d expert %d: allocating %d bytes: %w", ls.idx, e, s.eb, err)
		}
		sl.buf = b
	}
	ld := &load{done: make(chan struct{})}
	sl.e, sl.ld, sl.ready, sl.bound, sl.prefetched, sl.served = e, ld, false, false, prefetch, false
	scratch := sl == ls.scratch
	if !scratch {
		ls.where[e] = sl
	}
	reqs, err := s.requests(ls.idx, e, sl.buf)
	if err != nil {
		if !scratch {
			delete(ls.where, e)
		}
		sl.e, sl.ld = -1, nil
		ls.stats.ReadErrors++
		return nil, err
	}
	job := &loadJob{pending: len(reqs), start: time.Now()}
	s.loads.Add(1)
	job.finish = func(err error, n int64, d time.Duration) {
		s.mu.Lock()
		ls.stats.BytesRead += n
		ls.stats.ReadTime += d
		if err != nil {
			ls.stats.ReadErrors++
			ld.err = err
			if sl.ld == ld {
				if !scratch && ls.where[e] == sl {
					delete(ls.where, e)
				}
				sl.e = -1
			}
		} else if sl.ld == ld {
			sl.ready = true
		}
		s.mu.Unlock()
		close(ld.done)
		s.loads.Done()
	}
	for i := range reqs {
		reqs[i].job = job
	}
	go func() {
		for _, r := range reqs {
			s.reqs <- r
		}
	}()
	return ld, nil
}

// requests splits the read of expert e of layer l into chunks writing buf.
func (s *Store) requests(l, e int, buf []byte) ([]readReq, error) {
	var reqs []readReq
	p := expertPrefix(s.cfg, l, e)
	for i, ps := range s.proj {
		for _, part := range []struct {
			suffix string
			off, n int64
		}{{".weight", ps.dataOff, ps.dataN}, {".scale", ps.scaleOff, ps.scale}} {
			if part.n == 0 {
				continue
			}
			name := p + projNames[i] + part.suffix
			dst := buf[part.off : part.off+part.n]
			if s.loc == nil {
				reqs = append(reqs, readReq{name: name, dst: dst, tensorSize: part.n})
				continue
			}
			path, off, size, err := s.loc.Locate(name)
			if err != nil {
				return nil, fmt.Errorf("experts: layer %d expert %d: locating tensor %s: %w", l, e, name, err)
			}
			if size != part.n {
				return nil, fmt.Errorf("experts: layer %d expert %d: tensor %s is %d bytes in %s, want %d", l, e, name, size, path, part.n)
			}
			for c := int64(0); c < part.n; c += s.chunk {
				n := min(s.chunk, part.n-c)
				reqs = append(reqs, readReq{name: name, path: path, off: off + c, dst: dst[c : c+n], tensorSize: part.n})
			}
		}
	}
	return reqs, nil
}

// reader serves read requests until the channel closes. Each reader has its
// own descriptor per shard, so that the kernel's readahead state follows one
// sequential stream per descriptor.
func (s *Store) reader() {
	defer s.readWG.Done()
	files := map[string]*os.File{}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for r := range s.reqs {
		n, err := s.read(r, files)
		j := r.job
		j.mu.Lock()
		j.bytes += int64(n)
		if err != nil && j.err == nil {
			j.err = err
		}
		j.pending--
		last := j.pending == 0
		j.mu.Unlock()
		if last {
			j.finish(j.err, j.bytes, time.Since(j.start))
		}
	}
}

func (s *Store) read(r readReq, files map[string]*os.File) (int, error) {
	if r.path == "" {
		d, err := s.src.TensorData(r.name)
		if err != nil {
			return 0, fmt.Errorf("tensor %s: %w", r.name, err)
		}
		if int64(len(d)) != r.tensorSize {
			return 0, fmt.Errorf("tensor %s: source returned %d bytes, want %d", r.name, len(d), r.tensorSize)
		}
		return copy(r.dst, d), nil
	}
	f, ok := files[r.path]
	if !ok {
		var err error
		if f, err = os.Open(r.path); err != nil {
			return 0, fmt.Errorf("tensor %s: %w", r.name, err)
		}
		adviseSequential(f)
		files[r.path] = f
	}
	n, err := f.ReadAt(r.dst, r.off)
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = fmt.Errorf("%w (file truncated?)", io.ErrUnexpectedEOF)
		}
		return n, fmt.Errorf("tensor %s: %s: read %d of %d bytes at offset %d: %w", r.name, r.path, n, len(r.dst), r.off, err)
	}
	return n, nil
}

// ExpertSet implements dsv4.ExpertSet: when every expert of es is resident
// and loaded it serves each as Expert would (a hit each, in order) and
// reports true; otherwise it reports false and counts nothing, and the
// caller asks one at a time (a miss may need the layer's one scratch slot).
// Serving resident experts evicts nothing, so all of dst stays valid until
// the next call for the layer.
func (s *Store) ExpertSet(layer int, es []int, dst []dsv4.ExpertWeights) (bool, error) {
	if len(dst) != len(es) {
		return false, fmt.Errorf("experts: ExpertSet: %d experts, %d weights to fill", len(es), len(dst))
	}
	for _, e := range es {
		if err := s.checkIndex(layer, e); err != nil {
			return false, err
		}
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return false, errors.New("experts: store is closed")
	}
	ls := s.layers[layer]
	for _, e := range es {
		if sl, ok := ls.where[e]; !ok || !sl.ready {
			s.mu.Unlock()
			return false, nil
		}
	}
	s.mu.Unlock()
	if err := dsv4.EachExpert(s, layer, es, dst); err != nil {
		return false, err
	}
	return true, nil
}

// Expert returns the weights of expert e of layer (dsv4.Experts), reading it
// from the slow tier if it is not resident; it blocks until the bytes are in.
func (s *Store) Expert(layer, e int) (dsv4.ExpertWeights, error) {
	if err := s.checkIndex(layer, e); err != nil {
		return dsv4.ExpertWeights{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return dsv4.ExpertWeights{}, errors.New("experts: store is closed")
	}
	ls := s.layers[layer]
	if !ls.rounds || (!ls.used[e] && e <= ls.lastE) {
		ls.newRound() // no Prefetch: experts come in ascending order within a step
	}
	ls.count(e)
	ls.last = nil
	delete(ls.pending, e)
	ls.lastE = e
	sl, ok := ls.where[e]
	if !ok {
		if !ls.bypass[e] {
			sl, _ = s.claim(ls, e)
		}
		if sl == nil {
			// The policy declined e, or every slot holds an expert this step
			// still needs: serve e from the layer's scratch buffer.
			ls.stats.Bypassed++
			if ls.scratch == nil {
				ls.scratch = &slot{e: -1}
			}
			sl = ls.scratch
		}
		if _, err := s.startLoad(ls, sl, e, false); err != nil {
			return dsv4.ExpertWeights{}, err
		}
	}
	if !sl.ready {
		ld := sl.ld
		t0 := time.Now()
		s.mu.Unlock()
		<-ld.done
		s.mu.Lock()
		ls.stats.Wait += time.Since(t0)
		if ld.err != nil {
			return dsv4.ExpertWeights{}, fmt.Errorf("experts: layer %d expert %d: %w", layer, e, ld.err)
		}
		if s.closed {
			return dsv4.ExpertWeights{}, errors.New("experts: store is closed")
		}
		if sl != ls.scratch {
			sl.ready = true
		}
	}
	if sl == ls.scratch {
		sl.bound = false
	}
	if !sl.bound {
		w, err := s.bind(sl.buf)
		if err != nil {
			return dsv4.ExpertWeights{}, fmt.Errorf("experts: layer %d expert %d: %w", layer, e, err)
		}
		sl.w, sl.bound = w, true
	}
	if sl.prefetched && !sl.served {
		ls.stats.PrefetchUseful++
	}
	sl.served = true
	if sl != ls.scratch {
		ls.last = sl
	}
	return sl.w, nil
}

// Preload reads every expert of each layer whose capacity holds all of that
// layer's experts (a plan with room for every expert gives every main layer
// that capacity) into its slot, so that the first tokens do not wait for the
// slow tier; layers with fewer slots are left to their residency policy.
// Experts already resident or loading are skipped. Up to Options.Readers
// experts are read at a time, through the store's readers, in layer then
// expert order. Preloading is not a use: it changes no hit, miss or prefetch
// count and calls no Policy method (a layer holding every expert never
// evicts, so its policy has no choice to make); Stats count the experts it
// read in Preloaded and their bytes in BytesRead and ReadTime. It may run
// while a model uses the store: an expert the model asks for while it is
// being preloaded is served once its read completes (and counts as a hit, its
// wait in Wait).
//
// progress, if non-nil, is called on the caller's goroutine with (0, total)
// first and then after each expert is in, total being the number of experts
// Preload reads. Preload returns when all are in, with the first read error
// (naming the layer, expert, tensor and file; the expert stays absent and is
// read again on use), with ctx.Err() when ctx ends first (reads already
// issued complete in the background), or with an error if the store is closed.
func (s *Store) Preload(ctx context.Context, progress func(done, total int)) error {
	type job struct{ l, e int }
	var jobs []job
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errors.New("experts: store is closed")
	}
	for _, ls := range s.layers {
		if ls.cap < s.cfg.NRoutedExperts {
			continue
		}
		for e := range s.cfg.NRoutedExperts {
			if _, ok := ls.where[e]; !ok {
				jobs = append(jobs, job{ls.idx, e})
			}
		}
	}
	s.mu.Unlock()
	if progress != nil {
		progress(0, len(jobs))
	}
	type inflight struct {
		job
		ld *load
	}
	var (
		window []inflight
		done   int
		first  error
	)
	// wait waits for the oldest read in flight.
	wait := func() error {
		f := window[0]
		select {
		case <-f.ld.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		window = window[1:]
		if f.ld.err != nil {
			if first == nil {
				first = fmt.Errorf("experts: preloading layer %d expert %d: %w", f.l, f.e, f.ld.err)
			}
			return nil
		}
		done++
		if progress != nil {
			progress(done, len(jobs))
		}
		return nil
	}
	for _, j := range jobs {
		if first != nil {
			break
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		for len(window) >= s.readers {
			if err := wait(); err != nil {
				return err
			}
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return errors.New("experts: store is closed")
		}
		ls := s.layers[j.l]
		if _, ok := ls.where[j.e]; ok { // the model got there first
			s.mu.Unlock()
			done++
			if progress != nil {
				progress(done, len(jobs))
			}
			continue
		}
		sl := s.freeSlot(ls)
		if sl == nil { // cannot happen: the layer has a slot per expert
			s.mu.Unlock()
			first = fmt.Errorf("experts: preloading layer %d expert %d: no free slot", j.l, j.e)
			break
		}
		ld, err := s.startLoad(ls, sl, j.e, false)
		if err == nil {
			ls.stats.Preloaded++
		}
		s.mu.Unlock()
		if err != nil {
			first = fmt.Errorf("experts: preloading: %w", err)
			break
		}
		window = append(window, inflight{j, ld})
	}
	for len(window) > 0 {
		if err := wait(); err != nil {
			return err
		}
	}
	return first
}

// bind binds the three projections held in buf.
func (s *Store) bind(buf []byte) (dsv4.ExpertWeights, error) {
	var w [3]compute.Weight
	for i, ps := range s.proj {
		d := ps.wd
		d.Data = buf[ps.dataOff : ps.dataOff+ps.dataN]
		if ps.scale > 0 {
			d.Scale = buf[ps.scaleOff : ps.scaleOff+ps.scale]
		}
		b, err := s.be.Bind(d)
		if err != nil {
			return dsv4.ExpertWeights{}, fmt.Errorf("binding %s: %w", projNames[i], err)
		}
		w[i] = b
	}
	return dsv4.ExpertWeights{W1: w[0], W3: w[1], W2: w[2]}, nil
}

// LayerStats count one layer's activity. Hits and misses count each expert
// once per step (forward pass through the layer), when it is first announced
// or asked for; a miss is served by a read, never dropped.
type LayerStats struct {
	Hits, Misses int64
	// Bypassed counts misses served from the layer's scratch buffer without
	// being installed (policy decision, or no slot free of current-step experts).
	Bypassed int64
	// BytesRead and ReadTime sum the slow-tier reads (ReadTime per expert, from
	// the first request to the last byte; concurrent reads overlap).
	BytesRead int64
	ReadTime  time.Duration
	// Wait is the time the forward pass spent blocked in Expert on reads.
	Wait time.Duration
	// Prefetches started, and of those, served before eviction (useful) or
	// evicted unserved (wasted).
	PrefetchIssued, PrefetchUseful, PrefetchWasted int64
	ReadErrors                                     int64
	// Preloaded counts the experts Preload started reading (not uses: they
	// are in no hit or miss count).
	Preloaded int64
}

func (a *LayerStats) add(b LayerStats) {
	a.Hits += b.Hits
	a.Misses += b.Misses
	a.Bypassed += b.Bypassed
	a.BytesRead += b.BytesRead
	a.ReadTime += b.ReadTime
	a.Wait += b.Wait
	a.PrefetchIssued += b.PrefetchIssued
	a.PrefetchUseful += b.PrefetchUseful
	a.PrefetchWasted += b.PrefetchWasted
	a.ReadErrors += b.ReadErrors
	a.Preloaded += b.Preloaded
}

// HitRate is hits per counted use (0 with none).
func (a LayerStats) HitRate() float64 {
	if a.Hits+a.Misses == 0 {
		return 0
	}
	return float64(a.Hits) / float64(a.Hits+a.Misses)
}

// Stats is a snapshot of the store's counters.
type Stats struct {
	Layers []LayerStats
	Total  LayerStats
	// ResidentBytes is the memory held in expert slots (all of it from the
	// store's creation on) and scratch buffers.
	ResidentBytes int64
}

// Stats returns a snapshot of the counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Layers: make([]LayerStats, len(s.layers)), ResidentBytes: int64(len(s.mem))}
	for l, ls := range s.layers {
		st.Layers[l] = ls.stats
		st.Total.add(ls.stats)
		if ls.scratch != nil && ls.scratch.buf != nil {
			st.ResidentBytes += int64(len(ls.scratch.buf))
		}
	}
	return st
}

// Close waits for reads in flight, stops the readers (closing their shard files)
// and releases the buffers. Weights returned earlier become invalid.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.loads.Wait()
	close(s.reqs)
	s.readWG.Wait()
	var first error
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ls := range s.layers {
		for _, sl := range ls.slots {
			sl.buf = nil
		}
		ls.mem = nil
		if sl := ls.scratch; sl != nil && sl.buf != nil {
			if err := freeBuf(sl.buf); err != nil && first == nil {
				first = err
			}
			sl.buf = nil
		}
	}
	if s.mem != nil {
		if err := freeBuf(s.mem); err != nil && first == nil {
			first = err
		}
		s.mem = nil
	}
	return first
}

// String summarises the counters on one line, for logs and `--stats` output.
func (a LayerStats) String() string {
	rate := ""
	if a.ReadTime > 0 {
		rate = fmt.Sprintf(" (%.0f MB/s per read)", float64(a.BytesRead)/a.ReadTime.Seconds()/1e6)
	}
	return fmt.Sprintf("hits %d, misses %d (hit rate %.4f, %d bypassed), read %s in %v%s, forward pass waited %v, prefetches %d issued / %d useful / %d wasted, %d read errors",
		a.Hits, a.Misses, a.HitRate(), a.Bypassed, progress.FormatBytes(a.BytesRead), a.ReadTime.Round(time.Millisecond), rate,
		a.Wait.Round(time.Millisecond), a.PrefetchIssued, a.PrefetchUseful, a.PrefetchWasted, a.ReadErrors)
}
