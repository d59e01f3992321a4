package dsv4

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"

	"moxie/checkpoint"
	"moxie/compute"
	"moxie/compute/cuda"
	"moxie/dsv4/config"
	"moxie/internal/progress"
)

// DefaultDeviceContext is the context a device session is allocated for when
// Options.DeviceContext is 0.
const DefaultDeviceContext = 4096

// ResidentWeights returns the device memory that holds the model's resident
// weights (the arena's allocated span, from its base), or ok false when the
// model is not on a GPU. The memory is the model's: read it only (moxie
// bench measures the read bandwidth over it), and not after Close.
func (m *Model) ResidentWeights() (p cuda.DevicePtr, n int, ok bool) {
	if m.dev == nil || m.dev.arena == nil {
		return 0, 0, false
	}
	return m.dev.arena.Base(), m.dev.arena.Live(), true
}

// deviceModel is the model's copy resident on one GPU (Options.Device): every
// dense weight of the main layers, the embedding and head, all routed experts
// (stored formats, uploaded unchanged) and the small vectors decoded to
// float32. It lives in one arena, freed by close. The MTP block is not
// uploaded (the forward pass does not run it).
type deviceModel struct {
	dev    *cuda.Device
	arena  *cuda.Arena
	fwd    *cuda.Fwd
	idx    *cuda.IdxDec // the indexer's scores and top-k
	maxCtx int
	bytes  int // arena bytes in use after the upload
	// budget is Options.DeviceMemory (0: none): sessions choosing their
	// chunk count only what it leaves beside the upload as free.
	budget int64
	// tableErr is why some layer's experts cannot be selected on the device
	// (nil when every layer's can).
	tableErr error
	// tier caches the routed experts when they do not all fit (nil: all
	// resident in db.experts, or mapped).
	tier *expertTier
	// mapped, in MOXIE_DEVICE_EXPERTS=mapped mode, owns the routed experts
	// when they do not all fit: some static in GPU memory, the rest in
	// mapped pinned host memory that the kernels read in place over PCIe.
	// db.experts and db.table point at both, so sessions run as if every
	// expert were resident (nil otherwise).
	mapped *expertTier
	// ahead is the session with a decode step run ahead in flight (see
	// DeviceSession.Pipeline), nil when none; guarded by Model.pass. Any
	// other session's pass first waits for that step and drops it.
	ahead *DeviceSession

	embed  cuda.DevicePtr // BF16 [V, D]
	head   *cuda.DeviceWeight
	norm   cuda.DevicePtr
	hcHead cuda.HC
	layers []*devBlock

	freqPlain, freqCompress cuda.DevicePtr // [RopeHeadDim/2]
	nfreq                   int
}

type devComp struct {
	wkv, wgate *cuda.DeviceWeight
	ape, norm  cuda.DevicePtr // [R, c·dw], [dw]
	ratio, c   int
	dw         int
}

type devExpert struct{ w1, w3, w2 *cuda.DeviceWeight }

type devBlock struct {
	layer int
	kind  config.LayerKind
	ratio int
	hash  bool

	attnNorm, ffnNorm cuda.DevicePtr
	hcAttn, hcFFN     cuda.HC
	sink              cuda.DevicePtr
	wqA, wqB, wkv     *cuda.DeviceWeight
	woA, woB          *cuda.DeviceWeight
	qNorm, kvNorm     cuda.DevicePtr
	comp              *devComp
	idxWqB, idxProj   *cuda.DeviceWeight
	icomp             *devComp

	gate    *cuda.DeviceWeight
	bias    cuda.DevicePtr // score-routed layers; 0 for hash layers
	tid2eid cuda.DevicePtr // hash layers: int32 [V, topk]
	shared  *devExpert
	experts []devExpert
	// table lets a decode step select its experts on the device; nil when the
	// experts' format or shape does not fit the multi-linear kernels (then
	// every step routes through the host).
	table *cuda.ExpertTable
}

// uploader is the backend the binder binds device weights with: Bind uploads
// the stored bytes into the arena. The binder calls nothing else; the
// embedded Backend is nil and any other method would panic.
type uploader struct {
	compute.Backend
	c *cuda.Ctx
	a *cuda.Arena
}

type devWeight struct{ w *cuda.DeviceWeight }

func (d devWeight) Rows() int { return d.w.Rows }
func (d devWeight) Cols() int { return d.w.Cols }

func (u *uploader) Bind(d compute.WeightData) (compute.Weight, error) {
	w, err := u.c.UploadWeight(u.a, d)
	if err != nil {
		return nil, err
	}
	return devWeight{w}, nil
}

// dw returns the device weight behind a binder result (nil stays nil).
func dw(w compute.Weight) *cuda.DeviceWeight {
	if d, ok := w.(devWeight); ok {
		return d.w
	}
	return nil
}

const arenaAlign = cuda.ArenaAlign

func alignUp(n int) int { return (n + arenaAlign - 1) / arenaAlign * arenaAlign }

// deviceWeightBytes bounds the arena bytes loadDevice uses for src: stored
// bytes of every main-stack tensor (float32 for the vectors it decodes),
// each aligned, plus the expert tables and rope frequencies.
func deviceWeightBytes(src checkpoint.Source, cfg *config.Config) int {
	n := 0
	for _, t := range src.Tensors() {
		if strings.HasPrefix(t.Name, "mtp.") {
			continue
		}
		b := int(t.Size)
		if len(t.Shape) == 1 || strings.HasSuffix(t.Name, ".ape") {
			b = max(b, 4*int(t.Elements()))
		}
		n += alignUp(b)
	}
	const linArgsBytes = 80 // struct LinArgs in kernels/linear.cu
	n += cfg.NLayers * 2 * alignUp(3*cfg.NRoutedExperts*linArgsBytes)
	n += 2*alignUp(4*cfg.RopeHeadDim) + 1<<20
	return n
}

// deviceDenseBytes is deviceWeightBytes without the routed experts: the
// arena bytes of a load that caches them (expertTier).
func deviceDenseBytes(src checkpoint.Source, cfg *config.Config) int {
	n := deviceWeightBytes(src, cfg)
	for _, t := range src.Tensors() {
		if isRoutedExpert(t.Name) {
			n -= alignUp(int(t.Size))
		}
	}
	return n
}

// loadDevice uploads m's main stack to dev (see deviceModel).
func loadDevice(m *Model, src checkpoint.Source, opts Options) (*deviceModel, error) {
	if opts.Experts != nil {
		return nil, errors.New("device: Options.Experts (an expert store) cannot be combined with Options.Device yet: the device session uploads every routed expert from the source")
	}
	cfg := m.Cfg
	d := &deviceModel{dev: opts.Device, maxCtx: opts.DeviceContext, budget: opts.DeviceMemory}
	if d.maxCtx <= 0 {
		d.maxCtx = DefaultDeviceContext
	}
	d.maxCtx = min(d.maxCtx, cfg.MaxPositions)
	need := deviceWeightBytes(src, cfg)
	dense := deviceDenseBytes(src, cfg)
	var lay slotLayout
	err := d.dev.Do(func(c *cuda.Ctx) error {
		free, total, err := c.MemInfo()
		if err != nil {
			return err
		}
		if opts.DeviceMemory > 0 {
			free = min(free, uint64(opts.DeviceMemory))
		}
		N, K := cfg.NLayers*cfg.NRoutedExperts, cfg.NActivatedExperts
		var plan *tierPlan
		switch {
		case opts.deviceExpertSlots > 0:
			// Forced (tests): a cache of that many slots, nothing static.
			plan = &tierPlan{static: make([]int, cfg.NLayers), dynamic: min(max(opts.deviceExpertSlots, K), N)}
		case uint64(need)+DeviceReserve+tierMargin > free:
			// The experts do not all fit with DeviceReserve left for session
			// state: keep the dense weights resident, and as many experts as
			// fit (static or cached); the rest wait in pinned host memory.
			if lay, err = newSlotLayout(src, cfg); err != nil {
				return fmt.Errorf("device: %w", err)
			}
			slotBytes := lay.size()
			avail := int64(free) - int64(dense) - DeviceReserve - tierMargin
			gpu := 0
			if slotBytes > 0 {
				gpu = int(max(avail, 0) / int64(slotBytes))
			}
			if gpu < K {
				return fmt.Errorf("device: the weights need %s (%d bytes) of GPU memory and %s (%d bytes) of %s are free on %s; even an expert cache needs %s dense + %d experts of %s + %s reserved",
					progress.FormatBytes(int64(need)), need, progress.FormatBytes(int64(free)), free, progress.FormatBytes(int64(total)), d.dev.Info().Name,
					progress.FormatBytes(int64(dense)), K, progress.FormatBytes(int64(slotBytes)), progress.FormatBytes(DeviceReserve))
			}
			mode, err := deviceExpertMode()
			if err != nil {
				return fmt.Errorf("device: %w", err)
			}
			p := planTier(gpu, cfg.NLayers, cfg.NRoutedExperts, K)
			if mode == "mapped" {
				p = planMapped(gpu, cfg.NLayers, cfg.NRoutedExperts)
			}
			plan = &p
		}
		if plan != nil {
			need = dense
			if lay.pieces == nil {
				if lay, err = newSlotLayout(src, cfg); err != nil {
					return fmt.Errorf("device: %w", err)
				}
			}
			// Refuse before the long upload when the host cannot pin them.
			if err := checkPinnable(plan.hostBytes(cfg.NRoutedExperts, lay.size()), hostAvailable(), N-plan.nStatic()); err != nil {
				return fmt.Errorf("device: %w", err)
			}
		}
		if d.fwd, err = c.Fwd(); err != nil {
			return err
		}
		if d.idx, err = c.IdxDec(); err != nil {
			return err
		}
		if d.arena, err = c.NewArena(need); err != nil {
			return fmt.Errorf("device: reserving %d bytes for the weights: %w", need, err)
		}
		usrc := src
		if src.Synthetic() {
			// Generated weights cost CPU per tensor: generate ahead on every
			// core (the tier's experts after the dense weights).
			order := uploadOrder(src, cfg, plan == nil)
			if plan != nil {
				order = append(order, tierOrder(lay, cfg)...)
			}
			// Two workers per core: a worker asking for a scale tensor often
			// waits for the one generating its weight (one generation gives
			// both, checkpoint.Synth), and should not leave its core idle.
			p := checkpoint.Prefetch(src, order, 2*runtime.NumCPU(), 2<<30)
			defer p.Close()
			usrc = p
		}
		if err := d.upload(c, m, usrc, plan == nil); err != nil {
			return err
		}
		if plan != nil {
			t, err := newExpertTier(c, d, lay, usrc, cfg, *plan)
			if err != nil {
				return fmt.Errorf("device: %w", err)
			}
			if plan.mapped {
				d.mapped = t
			} else {
				d.tier = t
			}
			d.bytes += t.arena.Live()
		}
		d.bytes += d.arena.Live()
		return nil
	})
	if err != nil {
		d.close()
		return nil, err
	}
	return d, nil
}

// upload binds every main-stack tensor through the uploader (the same
// binder, names and checks as Load) and converts the result.
func (d *deviceModel) upload(c *cuda.Ctx, m *Model, src checkpoint.Source, experts bool) error {
	cfg := m.Cfg
	b := &binder{src: src, be: &uploader{c: c, a: d.arena}, cfg: cfg}
	var errs []error
	vec := func(v []float32) cuda.DevicePtr {
		if len(v) == 0 {
			return 0
		}
		p, err := d.arena.Alloc(4 * len(v))
		if err == nil {
			err = c.CopyFloatsToDevice(p, v)
		}
		if err != nil {
			errs = append(errs, err)
			return 0
		}
		return p
	}
	hc := func(p compute.HCParams) cuda.HC {
		return cuda.HC{Fn: dw(p.Fn), Base: vec(p.Base), Scale: vec(p.Scale), HC: p.HC, Iters: p.Iters, Eps: p.Eps, NormEps: p.NormEps}
	}
	comp := func(cp *compressor) *devComp {
		if cp == nil {
			return nil
		}
		return &devComp{wkv: dw(cp.wkv), wgate: dw(cp.wgate), ape: vec(cp.ape), norm: vec(cp.norm), ratio: cp.ratio, c: cp.c, dw: cp.dw}
	}
	if raw := b.bytes("embed.weight"); raw != nil {
		p, err := d.arena.Alloc(len(raw))
		if err == nil {
			err = c.CopyToDevice(p, raw)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("tensor embed.weight: %w", err))
		}
		d.embed = p
	}
	d.head = dw(b.weight("head.weight"))
	d.norm = vec(b.vec("norm.weight"))
	d.hcHead = hc(b.hc("hc_head", cfg.HCMult))
	for i := range cfg.NLayers {
		p := fmt.Sprintf("layers.%d.", i)
		bl := b.block(p, i)
		db := &devBlock{layer: i, kind: bl.kind, ratio: bl.ratio, hash: bl.hash,
			attnNorm: vec(bl.attnNorm), ffnNorm: vec(bl.ffnNorm), hcAttn: hc(bl.hcAttn), hcFFN: hc(bl.hcFFN),
			sink: vec(bl.sink), wqA: dw(bl.wqA), wqB: dw(bl.wqB), wkv: dw(bl.wkv), woA: dw(bl.woA), woB: dw(bl.woB),
			qNorm: vec(bl.qNorm), kvNorm: vec(bl.kvNorm), comp: comp(bl.comp), gate: dw(bl.gate), bias: vec(bl.bias)}
		if bl.idx != nil {
			db.idxWqB, db.idxProj, db.icomp = dw(bl.idx.wqB), dw(bl.idx.wproj), comp(bl.idx.comp)
		}
		if bl.tid2eid != nil {
			buf := make([]byte, 4*len(bl.tid2eid))
			for j, e := range bl.tid2eid {
				binary.LittleEndian.PutUint32(buf[4*j:], uint32(int32(e)))
			}
			ptr, err := d.arena.Alloc(len(buf))
			if err == nil {
				err = c.CopyToDevice(ptr, buf)
			}
			if err != nil {
				errs = append(errs, err)
			}
			db.tid2eid = ptr
		}
		if bl.shared != nil {
			db.shared = &devExpert{dw(bl.shared.W1), dw(bl.shared.W3), dw(bl.shared.W2)}
		}
		for e := range cfg.NRoutedExperts {
			if !experts {
				break // the expert cache loads them on demand
			}
			ew := b.expert(fmt.Sprintf("%sffn.experts.%d.", p, e))
			db.experts = append(db.experts, devExpert{dw(ew.W1), dw(ew.W3), dw(ew.W2)})
		}
		d.layers = append(d.layers, db)
		if err := errors.Join(b.err(), errors.Join(errs...)); err != nil {
			return fmt.Errorf("device: uploading layer %d: %w", i, err)
		}
	}
	if err := errors.Join(b.err(), errors.Join(errs...)); err != nil {
		return fmt.Errorf("device: %w", err)
	}
	d.freqPlain = vec(m.freqPlain)
	d.freqCompress = vec(m.freqCompress)
	d.nfreq = len(m.freqPlain)
	if len(m.freqCompress) != d.nfreq {
		return fmt.Errorf("device: rope tables of %d and %d frequencies", d.nfreq, len(m.freqCompress))
	}
	for _, db := range d.layers {
		if !experts {
			break
		}
		w1, w3, w2 := make([]*cuda.DeviceWeight, len(db.experts)), make([]*cuda.DeviceWeight, len(db.experts)), make([]*cuda.DeviceWeight, len(db.experts))
		for e, x := range db.experts {
			w1[e], w3[e], w2[e] = x.w1, x.w3, x.w2
		}
		// An unsupported format or shape leaves table nil: decode then routes
		// through the host (correct, one sync per layer); tableErr says why.
		var err error
		if db.table, err = c.PrepareExpertTable(d.arena, w1, w3, w2); err != nil && d.tableErr == nil {
			d.tableErr = fmt.Errorf("layer %d: %w", db.layer, err)
		}
	}
	return errors.Join(errs...)
}

// close frees the device copy (weights become invalid), the expert tier's
// slots and pinned host memory included.
func (d *deviceModel) close() {
	if d == nil {
		return
	}
	a, t, mt := d.arena, d.tier, d.mapped
	d.arena, d.tier, d.mapped = nil, nil, nil
	if a == nil && t == nil && mt == nil {
		return
	}
	_ = d.dev.Do(func(c *cuda.Ctx) error {
		if t != nil {
			_ = t.release(c)
		}
		if mt != nil {
			_ = mt.release(c)
		}
		if a != nil {
			return c.ReleaseArena(a)
		}
		return nil
	})
}

// DeviceReserve is the GPU memory Load leaves free for sessions: when the
// weights plus DeviceReserve exceed the memory it plans with, the routed
// experts go to the expert tier (expertTier), sized to leave DeviceReserve.
const DeviceReserve = 4 << 30

// tierMargin is room Load keeps beyond DeviceReserve for the tier's own
// arena rounding and table records; the all-resident test and the tier's
// sizing both count it, so a budget the tier fills exactly is a tier budget.
const tierMargin = 1 << 20

// DeviceBytes returns the bytes of device memory the model's weights occupy
// (0 without Options.Device).
func (m *Model) DeviceBytes() int {
	if m.dev == nil {
		return 0
	}
	return m.dev.bytes
}

// uploadOrder lists the tensors upload binds, roughly in its order: the
// embedding and head, then each main layer's tensors (routed experts only if
// experts is set).
func uploadOrder(src checkpoint.Source, cfg *config.Config, experts bool) []string {
	order := []string{"embed.weight", "head.weight"}
	byLayer := make([][]string, cfg.NLayers)
	for _, t := range src.Tensors() {
		var l int
		if _, err := fmt.Sscanf(t.Name, "layers.%d.", &l); err != nil || l < 0 || l >= cfg.NLayers {
			continue
		}
		if !experts && isRoutedExpert(t.Name) {
			continue
		}
		byLayer[l] = append(byLayer[l], t.Name)
	}
	for _, names := range byLayer {
		order = append(order, names...)
	}
	return order
}
