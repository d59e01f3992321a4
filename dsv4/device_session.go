package dsv4

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"
	"unsafe"

	"moxie/compute"
	"moxie/compute/cuda"
	"moxie/dsv4/config"
	"moxie/generate"
	"moxie/sample"
)

// DeviceSession is one sequence whose forward pass runs resident on the GPU
// of Options.Device: activations, per-layer state and weights stay in device
// memory; per chunk only the token ids and positions go up and the logits
// come down (a decode step synchronises once, for its logits). It computes
// the same function as Session (dsv4-flash.md §4, the order in the package
// comment) for any chunking, up to float32 rounding.
//
// Per-layer state, allocated for the session's context limit at creation:
//   - window ring [Window + MaxChunk, HeadDim]: position p in slot p mod rows
//     (room for a whole chunk's queries plus their window);
//   - compressor rings [2R + MaxChunk, c·dw] of κ and z + ape, and the
//     closed entries [limit/R, dw] (main KV and indexer keys);
//   - the indexer's scores [MaxChunk, limit/4] and selections [MaxChunk, topk].
//
// A chunk of T tokens runs every matrix product batched over T. Within a
// layer the stateful steps are batched too: all T window rows enter the
// ring, all compressor rows are stored and the windows they close are
// pooled, then each query attends to exactly its own key set (window
// positions ≤ t, entries < ⌊(t+1)/R⌋, the indexer's top-k over entries
// < ⌊(t+1)/R⌋ computed per query) — which is the token-by-token order of
// Session, since nothing a query reads is written by a later token.
//
// Attention: a chunk of several queries uses the tensor-core kernel
// (Fwd.AttentionPrefill) where the head shape fits it, else the grouped
// kernel (up to 8 heads per block share each key read; UseGroupedAttention);
// a one-token step splits its keys over many blocks (Ctx.AttentionDecode)
// where the shape fits, else runs one block per head.
//
// MoE: routing runs on the device, and so does the choice of experts. A
// one-token step runs the chosen experts and the shared expert as the fused
// two-kernel decode (Ctx.RunMoEDecode) where the shapes fit, else writes the
// chosen experts' records into the multi-linear argument tables with a
// kernel; a longer chunk lays its (token, k) entries out expert-major on the
// device and runs tiles of rows per expert as two multi-linear launches
// (UseDeviceExperts). A model with
// Options.Routes (or UseDeviceExperts(false) for chunks) downloads the
// routing, groups tokens by expert on the host and runs each used expert on
// its gathered rows (one synchronisation per layer).
//
// Decode steps are captured once per session as a CUDA graph and replayed
// (UseGraphs): every kernel reads the position and token from device
// buffers, which the host updates before each replay, and grids are sized
// for the session's context limit.
//
// Fused paths (each with a MOXIE_CUDA_* switch for A/B runs, see
// compute/cuda/NOTES.md): sublayer boundaries and row operations (fused),
// merged one-token projections (multi, gemvSets), the compressors' chain on
// a second stream (side).
//
// Not safe for concurrent use; sessions of one model run one pass at a time.
type DeviceSession struct {
	m     *Model
	d     *deviceModel
	pos   int
	limit int // context limit (tokens)
	chunk int // tokens per pass (Model.maxChunk, or chosen by NewDeviceSession)
	// headRows is how many rows of logits the device holds (the LM head's
	// output); PrefillAll of a longer chunk runs the head in blocks.
	headRows int
	failed   error

	arena *cuda.Arena
	// host: tokens and positions, int32 [chunk] each, then (pinnedLogits)
	// one row of logits at logitsOff.
	host *cuda.HostBuffer
	// pinnedLogits: a one-row result is downloaded into host (pinned)
	// and copied into the returned slice, instead of one synchronous copy
	// from device memory into the slice (pageable, $MOXIE_CUDA_LOGITS=pageable).
	pinnedLogits bool
	logitsOff    int
	// registerDst: with pinnedLogits, a caller's dst (AppendInto) is
	// page-locked once (dstHost) and each step's logits are downloaded
	// straight into it, no copy ($MOXIE_CUDA_LOGITS=pinned: always
	// through host). Off for good after a failed registration.
	registerDst bool
	dstHost     *cuda.HostBuffer
	// reducer reduces a step's logits for the sampler on the device
	// (AppendReduce); allocated by open. reduced: the last call's logits
	// are still in s.logits, for LastLogits.
	reducer *cuda.SampleReducer
	reduced bool

	// Steps run ahead (Pipeline, generate.Pipeliner): with pipe on, a
	// greedy AppendReduce of a captured decode step has its reduction hand
	// the argmax to the next step on the device (cuda.SampleReducer.
	// EnqueueGreedy) and replays the graph for it before returning. pend:
	// such a step is in flight at position pos, for token pendTok (-1: one
	// no call can confirm), its reduction due in host slot pendSlot once
	// evAhead[pendSlot] has passed. logitsGone: a step ran ahead over the
	// last call's logits (LastLogits and DrawReduced then fail). aheadOK
	// false: $MOXIE_CUDA_AHEAD=off, Pipeline does nothing.
	pipe, aheadOK, pend, logitsGone bool
	pendTok, pendSlot               int
	evAhead                         [cuda.GreedySlots]cuda.Event
	evAheadOK                       bool
	// With timing, the steps run ahead are bracketed by the events of
	// aheadT[i] (i the step's count mod 4; aheadPrev[i]: the end event of
	// the step before it, for the GPU's idle time between them); lastEnd
	// is the end event of the last step enqueued; pendRing the pending
	// step's i.
	aheadT    [4][2]cuda.Event
	aheadPrev [4]cuda.Event
	aheadTOK  bool
	lastEnd   cuda.Event
	hasEnd    bool
	aheadN    int
	pendRing  int
	// ranAhead counts the steps run ahead that a call confirmed, dropped
	// those that were waited for and dropped (Describe).
	ranAhead, dropped int

	// timing: each call's last chunk is timed into lastTiming (TimeSteps);
	// evStep brackets the chunk's device work.
	timing     bool
	evStep     [2]cuda.Event
	evStepOK   bool
	lastTiming StepTiming

	// graphs: decode steps replay one captured CUDA graph (see graphable);
	// warm: a decode step has run uncaptured; graphErr: why capture failed.
	graphs   bool
	warm     bool
	graph    *cuda.Graph
	graphErr error
	runErr   error // why a layer's experts cannot be selected on the device
	tiles    *cuda.ExpertTiles
	devMoE   bool // chunks of several tokens group their experts on the device
	grouped  bool // prefill chunks use the grouped attention kernel
	layers   []*devLayerState
	runs     []*cuda.ExpertRun // per layer; nil: host-routed
	// moeDec: per layer, the fused one-token MoE (routed experts, SwiGLU,
	// shared expert and sum in two kernels; compute/cuda moe.go); nil where
	// it does not apply or with MOXIE_CUDA_MOE=off. moeErr says why not.
	moeDec []*cuda.MoEDecode
	moeErr error
	moeVar cuda.MoEVariant // $MOXIE_CUDA_MOE (moeOn false: off)
	moeOn  bool
	// gateRoute: a one-token step with the fused MoE computes the gate
	// projection and the expert choice in one kernel (Ctx.GateRoute, the
	// same bits); off with MOXIE_CUDA_GATEROUTE=off or a gate it does not
	// take (not BF16, too many experts).
	gateRoute bool
	// multi: decode steps merge the projections that share an input into
	// one launch per format (see decodeSets); multiErr says why not.
	multi    bool
	multiErr error
	// gemvSets: which merged sets take the one-token Gemv kernels ("a":
	// wq_a+wkv, "q": wq_b+indexer wq_b, "bf": the BF16 compressor set, "wo":
	// wo_a and wo_b); $MOXIE_CUDA_GEMV lists them (default "a,wo"; "off" none).
	gemvSets map[string]bool
	// gemvMMA: which of those sets take the tensor-core Gemv kernels
	// (cuda.GemvVariant.MMA) where their shapes allow ("a", "q", "wo", as
	// gemvSets names them; "q" then needs no "q" in gemvSets), the kernel
	// ("u1", "u2", "u4": GemvVariant.U, default 2) and "qnorm" (wq_b's
	// launch normalizes qlat itself: measured slower, off).
	// $MOXIE_CUDA_GEMVM lists them (default "a,q,wo,u4"; "off" none: the
	// sets then take the Gemv or multi-linear kernels).
	gemvMMA map[string]bool
	// fused: the sublayer boundaries (expand, HC mix, collapse, norm) and
	// the attention's row operations run as fused kernels (compute/cuda
	// fuse.go); off with MOXIE_CUDA_FUSE=off and while a layer hook is set.
	fused bool
	// hcEpi: in a fused decode step, each MoE but the last layer's begins
	// the next layer's attention-side boundary in its stage 2 (its expand
	// and mix partials: cuda.RunMoEDecodeHC), and that boundary is only its
	// finish (cuda.HCMixNormTiles); off with MOXIE_CUDA_HCEPI=off.
	// Likewise wo_b's one-token product begins the layer's FFN-side
	// boundary (cuda.LaunchGemvHC) where its Gemv can (decodeSets.woBHC):
	// ffnNext is that boundary's mix site while stepFused runs the
	// attention. hcTiles: the producer just enqueued began the next
	// boundary, which is then only its finish.
	hcEpi, hcTiles bool
	ffnNext        *cuda.HC
	// hcCol (MOXIE_CUDA_HCCOL=on, with hcEpi; off by default: 1.8% slower
	// on the H200, session 13): the MoE's epilogue also leaves the Gram rows, and
	// wq_a+wkv's Gemv forms the attention-side boundary's output itself
	// (cuda.LaunchGemvCollapse, decodeSets.byAC) without waiting for the
	// finish; attnCol is its input while stepFused runs the attention.
	hcCol   bool
	attnCol *cuda.HCCollapse
	// epi counts the launches enqueued on those paths (for tests: the MoE
	// and wo_b epilogues, the collapse in wq_a+wkv).
	epi       struct{ moe, woB, col int }
	hcScratch cuda.DevicePtr // HCNormScratchBytes for a chunk (at least HCEpiloguePartBytes)
	// hcCounters: the one-kernel boundaries' arrival counters
	// (HCNormCounterBytes for a chunk; zeroed once, left zero by each),
	// used with MOXIE_CUDA_HCFUSE=one (cuda.HCNorm.Counters).
	hcCounters cuda.DevicePtr
	// side: a decode step with merged projections runs the compressors'
	// chain (their projections, stores and closes) on a second stream,
	// forked after wq_a+wkv and joined before the indexer scores, so it
	// overlaps the query path (a fork in the captured graph); sideOK false:
	// one stream (MOXIE_CUDA_FORK=off, or the stream could not be made).
	// sideEarly: the fork is at the layer's attention input instead, so
	// the compressors' projections also overlap wq_a+wkv
	// (MOXIE_CUDA_FORK=early; not with byQ normalizing qlat, whose
	// window-KV ops then run on the side stream and read wkv's output).
	side           cuda.Stream
	sideOK         bool
	sideEarly      bool
	evFork, evJoin cuda.Event
	// tcAttn: chunks of several queries use the tensor-core attention
	// (Fwd.AttentionPrefill); MOXIE_CUDA_ATTN=ring keeps AttentionRing.
	tcAttn bool
	// attnDec: a one-token step's attention is split over its keys
	// (Ctx.AttentionDecode, partials in attnScratch); MOXIE_CUDA_ATTNDEC=off
	// keeps AttentionRing.
	attnDec bool
	// attnDecV: the decode attention's tiling and key splits
	// ($MOXIE_CUDA_ATTNDECV, "NAME[:SPLITS]", cuda.ParseAttnDecChoice;
	// unset: the default), for A/B measurements.
	attnDecV cuda.AttnDecChoice
	// attnEarly: decode attention reads the positions and its first ring
	// rows (and, where the compressors run on the side stream, the HCA
	// entries) before it waits for the launch before it
	// (cuda.AttnDecChoice.Early; on unless $MOXIE_CUDA_ATTNEARLY=off;
	// session 17: the 8-layer step faster in three pairs). The promises
	// hold in this step's order: the ring is written by the row ops after
	// wq_a+wkv (or on the side stream, joined by an event), two or more
	// launches before attention; the positions by the step's upload; the
	// entries on the side stream when forked.
	attnEarly bool
	// invRoPE: with attnDec, the combine kernel applies the inverse RoPE
	// of the output as it writes it (Ctx.AttentionDecodeInvRoPE) instead of
	// a separate rope launch; MOXIE_CUDA_INVROPE=off keeps the launch.
	invRoPE bool
	// qPrep: with invRoPE, decode attention also normalizes and rotates
	// the queries as it stages them (Ctx.AttentionDecodeNormQ), and the
	// indexer's scores kernel rotates its queries and scales its weights
	// (IdxDec.IndexScoresPrep), instead of the row-op kernel after wq_b.
	// Off unless MOXIE_CUDA_QPREP=on: six 8-layer A/Bs (session 8) found
	// no gain (664.8 against 666.7 tok/s, mean of three each).
	qPrep bool
	// compOne: a one-token step stores and closes its compressors in one
	// Fwd.CompStep launch (both in a CSA layer) instead of a CompStore and
	// a CompClose each; MOXIE_CUDA_COMPSTEP=off keeps the four launches.
	compOne bool
	// woPair: a one-token step runs wo_a and wo_b as one cuda.GemvPair
	// launch ($MOXIE_CUDA_WOPAIR=on).
	woPair      bool
	attnScratch cuda.DevicePtr
	// pf: a one-token step's L2 prefetches on a third stream
	// ($MOXIE_CUDA_PREFETCH; see l2Prefetch).
	pf l2Prefetch

	// scratch (device)
	tok, posBuf                cuda.DevicePtr // int32 [chunk]
	x, xmid                    cuda.DevicePtr // [chunk, hc, D]
	pre, post, comb            cuda.DevicePtr
	a, attnOut, moeOut         cuda.DevicePtr // [chunk, D]
	qlat, q, kv, o, u          cuda.DevicePtr
	cin, zin                   cuda.DevicePtr // compressor inputs [chunk, 2·HeadDim]
	cin1, zin1                 cuda.DevicePtr // the indexer compressor's in a decode step [1, 2·HeadDim]
	qi, wts, scores, idx       cuda.DevicePtr
	glog, ids, rw, hash        cuda.DevicePtr
	xe, eg, eu, eh, ey         cuda.DevicePtr
	rows, roww, inv            cuda.DevicePtr // int32 / float / int32 [chunk·K]
	tileBuf                    cuda.DevicePtr // int32 [max tiles, 3]
	logits                     cuda.DevicePtr // [headRows, V]
	entries                    int            // limit / 4: indexer score row stride
	expertRows, interMax, topk int

	// selHook, if set (tests only), sees the indexer's selection for each CSA
	// layer and query position (downloaded; the slice is reused).
	selHook func(layer, pos int, sel []int)
	// layerHook, if set (tests only), sees the streams [T, hc, D] after each
	// layer (downloaded; the slice is reused).
	layerHook func(layer int, X []float32)
}

type devCompState struct {
	ringKV, ringZ cuda.DevicePtr // [rows, c·dw]
	rows          int
	entries       cuda.DevicePtr // [limit/R, dw]
}

type devLayerState struct {
	ring     cuda.DevicePtr // [ringRows, HeadDim]
	ringRows int
	comp     *devCompState
	icomp    *devCompState
	dec      *decodeSets // nil: one launch per projection
}

// decodeSets are a layer's one-token projections merged by shared input
// into multi-linear launches (prepared once per session, batch 1):
// byA: wq_a → qlat and wkv → kv, both FP8 reading the attention input a;
// byQ: wq_b → q and the indexer's wq_b → qi, reading the normed qlat
// (without an indexer wq_b alone, where a Gemv takes it; else nil); bf: the BF16 compressor projections (κ and z of the
// main compressor into cin/zin, of the indexer's into cin1/zin1) and the
// indexer's weights_proj → wts, reading a (nil when the layer has none).
type decodeSets struct {
	byA, byQ, bf launchFn
	// woA, woB: the output projections as one-token Gemv launches (nil:
	// GroupedLinear and Linear).
	woA, woB launchFn
	// wo: both output projections in one persistent launch (cuda.GemvPair;
	// $MOXIE_CUDA_WOPAIR); when set, woA and woB are not run.
	wo launchFn
	// qNormed: byQ reads the raw qlat and applies its RMSNorm itself
	// (cuda.GemvProj.Norm), so the step does not normalize qlat.
	qNormed bool
	// woBHC: wo_b's MMA Gemv where it can begin the FFN-side boundary in
	// its epilogue (cuda.LaunchGemvHC; DeviceSession.hcEpi), else nil.
	// byAC: wq_a+wkv's MMA Gemv where it can form its x from the boundary's
	// x' and partials (cuda.LaunchGemvCollapse; DeviceSession.hcCol).
	woBHC, byAC *cuda.Gemv
}

// launchFn enqueues a prepared launch on a stream.
type launchFn func(c *cuda.Ctx, st cuda.Stream) error

// gemvLaunch is the launchFn of a prepared Gemv.
func gemvLaunch(g *cuda.Gemv) launchFn {
	return func(c *cuda.Ctx, st cuda.Stream) error { return c.LaunchGemv(g, st) }
}

// allocPlan collects device buffers and allocates them from one arena.
type allocPlan struct {
	items []struct {
		p *cuda.DevicePtr
		n int
	}
	total int
}

func (pl *allocPlan) add(p *cuda.DevicePtr, n int) {
	n = max(n, 4)
	pl.items = append(pl.items, struct {
		p *cuda.DevicePtr
		n int
	}{p, n})
	pl.total += alignUp(n)
}

func (pl *allocPlan) alloc(a *cuda.Arena) error {
	for _, it := range pl.items {
		var err error
		if *it.p, err = a.Alloc(it.n); err != nil {
			return err
		}
	}
	return nil
}

// NewDeviceSession starts an empty device sequence at position 0, allocating
// its state for the model's device context limit. It fails without
// Options.Device, or when the device lacks the memory (the error says how
// much was needed). With Options.MaxChunk 0 the prefill chunk is the
// largest of autoDeviceChunks (at most the context) whose state fits in the
// free GPU memory with sessionMargin to spare.
func (m *Model) NewDeviceSession() (*DeviceSession, error) {
	d := m.dev
	if d == nil {
		return nil, fmt.Errorf("dsv4: the model was loaded without Options.Device")
	}
	chunks := []int{min(m.maxChunk, d.maxCtx)}
	var free uint64
	if m.autoChunk {
		chunks = chunks[:0]
		for _, T := range autoDeviceChunks {
			if T = min(T, d.maxCtx); len(chunks) == 0 || chunks[len(chunks)-1] != T {
				chunks = append(chunks, T)
			}
		}
		var err error
		if free, err = m.sessionMemory(); err != nil {
			return nil, err
		}
	}
	for i, T := range chunks {
		s, pl, size, err := m.planDeviceSession(T)
		if err != nil {
			return nil, err
		}
		if i < len(chunks)-1 && uint64(size)+sessionMargin > free {
			continue // a smaller chunk
		}
		return s.open(pl, size)
	}
	return nil, fmt.Errorf("dsv4: no prefill chunk to try (context %d)", d.maxCtx)
}

// sessionMemory is the GPU memory free for sessions' state: what the
// device has free, and no more than --gpu-mem leaves beside the weights.
func (m *Model) sessionMemory() (uint64, error) {
	d := m.dev
	var free uint64
	err := d.dev.Do(func(cc *cuda.Ctx) error {
		var err error
		free, _, err = cc.MemInfo()
		return err
	})
	if err != nil {
		return 0, err
	}
	if d.budget > 0 {
		free = min(free, uint64(max(d.budget-int64(d.bytes), 0)))
	}
	return free, nil
}

// snapshotSession opens a device session for a copy of another's state
// (CloneSequence) with the smallest prefill chunk (DefaultMaxChunk, or the
// model's own when smaller), and only where that leaves sessionMargin of
// GPU memory free: a snapshot must not take the memory the next prompt's
// session needs.
func (m *Model) snapshotSession() (*DeviceSession, error) {
	T := min(DefaultMaxChunk, m.dev.maxCtx)
	if !m.autoChunk {
		T = min(T, m.maxChunk)
	}
	s, pl, size, err := m.planDeviceSession(T)
	if err != nil {
		return nil, err
	}
	free, err := m.sessionMemory()
	if err != nil {
		return nil, err
	}
	if uint64(size)+sessionMargin > free {
		return nil, fmt.Errorf("dsv4: no GPU memory for a snapshot session: it needs %d bytes and %d to spare, %d free", size, sessionMargin, free)
	}
	return s.open(pl, size)
}

// autoDeviceChunks are the prefill chunks NewDeviceSession tries, largest
// first, when Options.MaxChunk is 0. On the H200 (2026-11-30, 2 layers of
// synth:flash with 192 experts, 4,096-token prompt) prefill ran at 28.4k
// tok/s in chunks of 512, 43.2k in chunks of 2048 and 47.4k in one chunk
// of 4096: the expert GEMMs get more rows per tile.
var autoDeviceChunks = []int{4096, DefaultDeviceChunk, 1024, DefaultMaxChunk}

// sessionMargin is the GPU memory an automatically chunked session leaves
// free beyond its own state.
const sessionMargin = 1 << 30

// planDeviceSession lays out a session's state for chunks of T tokens: the
// session with its fields' places in pl, and the bytes it needs.
func (m *Model) planDeviceSession(T int) (*DeviceSession, *allocPlan, int, error) {
	d := m.dev
	c := m.Cfg
	s := &DeviceSession{m: m, d: d, limit: d.maxCtx, chunk: T, graphs: true, grouped: true, devMoE: true,
		fused: os.Getenv("MOXIE_CUDA_FUSE") != "off", tcAttn: os.Getenv("MOXIE_CUDA_ATTN") != "ring",
		attnDec: os.Getenv("MOXIE_CUDA_ATTNDEC") != "off" && cuda.DecodeAttentionFits(m.Cfg.NHeads, m.Cfg.HeadDim),
		invRoPE: os.Getenv("MOXIE_CUDA_INVROPE") != "off", attnEarly: os.Getenv("MOXIE_CUDA_ATTNEARLY") != "off", qPrep: os.Getenv("MOXIE_CUDA_QPREP") == "on",
		compOne: os.Getenv("MOXIE_CUDA_COMPSTEP") != "off", woPair: os.Getenv("MOXIE_CUDA_WOPAIR") == "on",
		pinnedLogits: os.Getenv("MOXIE_CUDA_LOGITS") != "pageable", registerDst: os.Getenv("MOXIE_CUDA_LOGITS") == "",
		hcEpi: os.Getenv("MOXIE_CUDA_HCEPI") != "off", aheadOK: os.Getenv("MOXIE_CUDA_AHEAD") != "off"}
	s.hcCol = s.hcEpi && os.Getenv("MOXIE_CUDA_HCCOL") == "on"
	D, hc, K := c.Dim, c.HCMult, c.NActivatedExperts
	s.topk = c.IndexTopK
	s.entries = max(s.limit/config.CSARatio, 1)
	s.interMax = max(c.MoEInterDim, c.MoEInterDim*c.NSharedExperts)
	s.expertRows = T * K // the tiled MoE's rows; ≥ T (host path) and ≥ K (decode)
	pl := &allocPlan{}
	f := 4
	pl.add(&s.tok, 4*T)
	pl.add(&s.posBuf, 4*T)
	pl.add(&s.x, f*T*hc*D)
	pl.add(&s.xmid, f*T*hc*D)
	pl.add(&s.pre, f*T*hc)
	pl.add(&s.post, f*T*hc)
	pl.add(&s.comb, f*T*hc*hc)
	pl.add(&s.a, f*T*D)
	pl.add(&s.attnOut, f*T*D)
	pl.add(&s.moeOut, f*T*D)
	pl.add(&s.qlat, f*T*c.QLoraRank)
	pl.add(&s.q, f*T*c.NHeads*c.HeadDim)
	pl.add(&s.kv, f*T*c.HeadDim)
	pl.add(&s.o, f*T*c.NHeads*c.HeadDim)
	pl.add(&s.u, f*T*c.OGroups*c.OLoraRank)
	pl.add(&s.cin, f*T*2*max(c.HeadDim, c.IndexHeadDim))
	pl.add(&s.zin, f*T*2*max(c.HeadDim, c.IndexHeadDim))
	pl.add(&s.cin1, f*2*max(c.HeadDim, c.IndexHeadDim))
	pl.add(&s.zin1, f*2*max(c.HeadDim, c.IndexHeadDim))
	pl.add(&s.qi, f*T*c.IndexNHeads*c.IndexHeadDim)
	pl.add(&s.wts, f*T*c.IndexNHeads)
	pl.add(&s.scores, f*T*s.entries)
	pl.add(&s.idx, 4*T*max(s.topk, 1))
	pl.add(&s.glog, f*T*c.NRoutedExperts)
	pl.add(&s.ids, 4*T*K)
	pl.add(&s.rw, f*T*K)
	pl.add(&s.hash, 4*T*K)
	pl.add(&s.xe, f*s.expertRows*D)
	pl.add(&s.eg, f*s.expertRows*s.interMax)
	pl.add(&s.eu, f*s.expertRows*s.interMax)
	pl.add(&s.eh, f*s.expertRows*s.interMax)
	pl.add(&s.ey, f*s.expertRows*D)
	pl.add(&s.rows, 4*T*K)
	pl.add(&s.roww, f*T*K)
	pl.add(&s.inv, 4*T*K)
	maxTiles := (T*K+15)/16 + c.NRoutedExperts
	pl.add(&s.tileBuf, 4*3*maxTiles)
	s.headRows = min(T, maxHeadRows)
	pl.add(&s.logits, f*s.headRows*c.VocabSize)
	pl.add(&s.hcScratch, max(cuda.HCNormScratchBytes(hc, D, T), cuda.HCEpiloguePartBytes(D)))
	pl.add(&s.hcCounters, cuda.HCNormCounterBytes(T))
	if s.attnDec {
		// Keys per query are at most the window plus every entry (HCA) or
		// the top-k (CSA); the split count, and so the scratch, is capped.
		pl.add(&s.attnScratch, cuda.AttentionDecodeScratchBytes(c.NHeads, c.HeadDim, 1, c.Window+max(s.topk, s.limit)))
	}
	for _, b := range d.layers {
		ls := &devLayerState{ringRows: c.Window + T}
		pl.add(&ls.ring, f*ls.ringRows*c.HeadDim)
		comp := func(cp *devComp) *devCompState {
			if cp == nil {
				return nil
			}
			cs := &devCompState{rows: 2*cp.ratio + T}
			pl.add(&cs.ringKV, f*cs.rows*cp.c*cp.dw)
			pl.add(&cs.ringZ, f*cs.rows*cp.c*cp.dw)
			pl.add(&cs.entries, f*max(s.limit/cp.ratio, 1)*cp.dw)
			return cs
		}
		ls.comp, ls.icomp = comp(b.comp), comp(b.icomp)
		s.layers = append(s.layers, ls)
	}
	var err error
	if s.moeVar, s.moeOn, err = moeVariantFromEnv(); err != nil {
		return nil, nil, 0, err
	}
	if s.attnDecV, err = cuda.ParseAttnDecChoice(os.Getenv("MOXIE_CUDA_ATTNDECV")); err != nil {
		return nil, nil, 0, fmt.Errorf("dsv4: MOXIE_CUDA_ATTNDECV: %w", err)
	}
	if s.attnDec && !s.attnDecV.Fits(c.NHeads, c.HeadDim) {
		return nil, nil, 0, fmt.Errorf("dsv4: MOXIE_CUDA_ATTNDECV=%q does not take %d heads of width %d", os.Getenv("MOXIE_CUDA_ATTNDECV"), c.NHeads, c.HeadDim)
	}
	if s.pf, err = prefetchFromEnv(); err != nil {
		return nil, nil, 0, err
	}
	s.gateRoute = os.Getenv("MOXIE_CUDA_GATEROUTE") != "off" && c.NRoutedExperts <= cuda.GateRouteMaxExperts
	for _, b := range d.layers {
		s.gateRoute = s.gateRoute && b.gate != nil && b.gate.Format == compute.BF16
	}
	// Beyond the buffers: the expert runs' argument tables (PrepareExpertRun:
	// 3K records of 80 bytes per layer; PrepareExpertTiles: 3 per tile), the
	// decode sets' (at most 2 + 2 + 5 records per layer) and the fused MoE's
	// h scratch.
	moeBytes := 0
	for _, b := range d.layers {
		if b.table != nil && s.moeOn {
			moeBytes += alignUp(cuda.MoEDecodeScratch(b.table, K, sharedOf(b)))
		}
	}
	size := pl.total + len(d.layers)*2*alignUp(3*K*80) + 2*alignUp(3*maxTiles*80) + len(d.layers)*3*alignUp(5*80) + moeBytes + len(d.layers)*alignUp(64) + 1<<16
	return s, pl, size, nil
}

// open allocates the planned state (size bytes, laid out by pl) and
// prepares the session's launches.
func (s *DeviceSession) open(pl *allocPlan, size int) (*DeviceSession, error) {
	d, c := s.d, s.m.Cfg
	T, K := s.chunk, c.NActivatedExperts
	err := d.dev.Do(func(cc *cuda.Ctx) error {
		free, _, err := cc.MemInfo()
		if err != nil {
			return err
		}
		if need := size + cuda.SampleReducerBytes(c.VocabSize); uint64(need) > free {
			return fmt.Errorf("dsv4: a device session for %d tokens (chunks of %d) needs %d bytes of GPU memory, %d free", s.limit, s.chunk, need, free)
		}
		if s.arena, err = cc.NewArena(size); err != nil {
			return fmt.Errorf("dsv4: device session state (%d bytes): %w", size, err)
		}
		if err := pl.alloc(s.arena); err != nil {
			return fmt.Errorf("dsv4: device session state: %w", err)
		}
		if err := cc.Memset(s.hcCounters, 0, cuda.HCNormCounterBytes(T), cc.Stream()); err != nil {
			return err
		}
		hostBytes := 8 * T
		if s.pinnedLogits {
			s.logitsOff = alignUp(hostBytes)
			hostBytes = s.logitsOff + 4*c.VocabSize
		}
		if s.host, err = cc.NewHostBuffer(hostBytes); err != nil {
			return err
		}
		// The sampler's reduction scratch now, not at the first decode step,
		// so that a shortage of memory shows when the session opens.
		if s.reducer, err = cc.NewSampleReducer(c.VocabSize); err != nil {
			return fmt.Errorf("dsv4: the sampler's reduction scratch: %w", err)
		}
		s.pf.open(cc)
		if fk := os.Getenv("MOXIE_CUDA_FORK"); fk != "off" {
			s.sideOK, s.sideEarly = true, fk == "early"
			if s.side, err = cc.NewStream(); err != nil {
				s.sideOK = false
			} else if s.evFork, err = cc.NewEvent(false); err != nil {
				return err
			} else if s.evJoin, err = cc.NewEvent(false); err != nil {
				return err
			}
		}
		s.runs = make([]*cuda.ExpertRun, len(d.layers))
		for l, b := range d.layers {
			if b.table == nil {
				continue
			}
			if s.tiles == nil && s.runErr == nil {
				bufs := cuda.ExpertTileBufs{RowTok: s.rows, RowW: s.roww, Inv: s.inv, Tiles: s.tileBuf, XE: s.xe, G: s.eg, U: s.eu, H: s.eh, Y: s.ey}
				if s.tiles, err = cc.PrepareExpertTiles(s.arena, b.table, T, K, bufs); err != nil {
					s.runErr = fmt.Errorf("expert tiles: %w", err)
				}
			}
			// Without a run the layer routes through the host (correct,
			// slower); runErr keeps the reason for tests and diagnostics.
			if s.runs[l], err = cc.PrepareExpertRun(s.arena, b.table, K, s.a, s.eg, s.eu, s.eh, s.ey); err != nil && s.runErr == nil {
				s.runErr = fmt.Errorf("layer %d: %w", l, err)
			}
		}
		s.moeDec = make([]*cuda.MoEDecode, len(d.layers))
		for l, b := range d.layers {
			if b.table == nil || !s.moeOn {
				continue
			}
			if s.moeDec[l], err = cc.PrepareMoEDecode(s.arena, b.table, K, sharedOf(b), s.a, s.moeOut, float32(c.SwigluLimit), s.moeVar); err != nil {
				// The unfused kernels instead: correct, slower.
				s.moeDec[l] = nil
				if s.moeErr == nil {
					s.moeErr = fmt.Errorf("layer %d: %w", l, err)
				}
			}
		}
		s.gemvSets = gemvSetsFromEnv()
		// On the H200 (BenchmarkGemv, 2026-11-30, session 6) gemvm_f4 beat
		// the kernels these sets used: wo_b 10.4 against 13.8 µs, wo_a 10.6
		// against 13.3, wq_a+wkv 3.0 against 6.3, wq_b+indexer wq_b 13.3
		// against 16.6 (multi-linear vec); the 8-layer step 1.55 → 1.46 ms.
		s.gemvMMA = setListFromEnv("MOXIE_CUDA_GEMVM", "a,q,wo,u4")
		// MOXIE_CUDA_MERGE=off keeps one launch per projection (for A/B
		// measurements of the merged launches).
		s.multi = os.Getenv("MOXIE_CUDA_MERGE") != "off"
		for l, b := range d.layers {
			if !s.multi {
				break
			}
			if s.layers[l].dec, err = s.decodeSets(cc, b); err != nil {
				// One launch per projection instead: correct, a little slower.
				s.multi, s.multiErr = false, fmt.Errorf("layer %d: %w", l, err)
				for _, ls := range s.layers {
					ls.dec = nil
				}
				break
			}
		}
		return nil
	})
	if err != nil {
		s.release()
		return nil, err
	}
	return s, nil
}

func (s *DeviceSession) release() {
	a, h, g, dh, red := s.arena, s.host, s.graph, s.dstHost, s.reducer
	s.arena, s.host, s.graph, s.dstHost, s.reducer = nil, nil, nil, nil, nil
	s.reduced = false
	side, fork, join := s.sideOK, s.evFork, s.evJoin
	s.sideOK = false
	evs, evsOK := s.evStep, s.evStepOK
	s.evStepOK = false
	eva, evaOK, evt, evtOK := s.evAhead, s.evAheadOK, s.aheadT, s.aheadTOK
	s.evAheadOK, s.aheadTOK, s.hasEnd = false, false, false
	if a == nil && h == nil && g == nil && dh == nil && red == nil && !side && !s.pf.streamExists {
		return
	}
	_ = s.d.dev.Do(func(c *cuda.Ctx) error {
		if g != nil {
			_ = c.DestroyGraph(g)
		}
		if evaOK {
			for _, e := range eva {
				_ = c.DestroyEvent(e)
			}
		}
		if evtOK {
			for _, p := range evt {
				_ = c.DestroyEvent(p[0])
				_ = c.DestroyEvent(p[1])
			}
		}
		s.pf.close(c)
		if evsOK {
			_ = c.DestroyEvent(evs[0])
			_ = c.DestroyEvent(evs[1])
		}
		if side {
			_ = c.Sync(s.side)
			_ = c.DestroyEvent(fork)
			_ = c.DestroyEvent(join)
			_ = c.DestroyStream(s.side)
		}
		if h != nil {
			_ = c.FreeHost(h)
		}
		if dh != nil {
			_ = c.FreeHost(dh) // unregisters the caller's slice
		}
		if red != nil {
			_ = red.Close(c)
		}
		if a != nil {
			return c.ReleaseArena(a)
		}
		return nil
	})
}

// UseGroupedAttention switches the grouped attention kernel for chunks of
// several tokens on or off (on by default; off runs one block per head and
// query, as decode does).
func (s *DeviceSession) UseGroupedAttention(on bool) { s.grouped = on }

// UseDeviceExperts switches, for chunks of several tokens, between laying
// the routed experts' rows out on the device (on, the default: no host
// round trip, two multi-linear launches per layer) and grouping them on the
// host (off: one synchronisation and a few launches per used expert).
func (s *DeviceSession) UseDeviceExperts(on bool) { s.devMoE = on }

// UseGraphs switches the capture of decode steps into a CUDA graph on or off
// (on by default: the first decode step runs plainly, the second is captured
// and every later one replays the graph, about 0.7 µs per kernel instead of
// a ~4-5 µs launch). Switching off drops a captured graph.
func (s *DeviceSession) UseGraphs(on bool) {
	if !on {
		_ = s.Settle() // a step run ahead replays the graph
	}
	s.graphs = on
	if !on && s.graph != nil {
		g := s.graph
		s.graph = nil
		_ = s.d.dev.Do(func(c *cuda.Ctx) error { return c.DestroyGraph(g) })
	}
}

// moeVariantFromEnv reads $MOXIE_CUDA_MOE: unset for the default fused MoE
// decode kernels, "off" for the unfused ones, or a cuda.MoEVariant's name
// (A/B measurements).
func moeVariantFromEnv() (cuda.MoEVariant, bool, error) {
	v := os.Getenv("MOXIE_CUDA_MOE")
	if v == "off" {
		return 0, false, nil
	}
	mv, err := cuda.ParseMoEVariant(v)
	if err != nil {
		return 0, false, fmt.Errorf("dsv4: MOXIE_CUDA_MOE=%q (or off): %w", v, err)
	}
	return mv, true, nil
}

// sharedOf is layer b's shared expert for the fused MoE decode (nil: none,
// or not FP8 blocks, in which case it runs on its own).
func sharedOf(b *devBlock) *cuda.SharedExpert {
	if b.shared == nil || b.shared.w1.Format != compute.FP8Block || b.shared.w3.Format != compute.FP8Block || b.shared.w2.Format != compute.FP8Block {
		return nil
	}
	return &cuda.SharedExpert{W1: b.shared.w1, W3: b.shared.w3, W2: b.shared.w2}
}

// gemvSetsFromEnv reads $MOXIE_CUDA_GEMV (see DeviceSession.gemvSets):
// unset means "a,wo" (the measured winners), "off" none, else a comma-separated list; unknown
// names are ignored.
func gemvSetsFromEnv() map[string]bool {
	// On the H200 (BenchmarkGemv, 2026-11-30) Gemv beat the linear kernels
	// on wq_a+wkv (6.8 against 10.2 µs) and wo_a/wo_b (14.6/14.9 against
	// 19.2), and lost on wq_b (17.5 against 11.7) and the BF16 compressor
	// set (10.5 against 10.0).
	return setListFromEnv("MOXIE_CUDA_GEMV", "a,wo")
}

// setListFromEnv reads a comma-separated list of names from the variable
// name (def when unset or empty; "off" names none).
func setListFromEnv(name, def string) map[string]bool {
	v, ok := os.LookupEnv(name)
	if !ok || v == "" {
		v = def
	}
	return setList(v)
}

// setList is the names of a comma-separated list ("off" and "" are none).
func setList(v string) map[string]bool {
	m := map[string]bool{}
	for _, n := range strings.Split(v, ",") {
		if n = strings.TrimSpace(n); n != "" && n != "off" {
			m[n] = true
		}
	}
	return m
}

// gemvMMAVariant is the MMA Gemv kernel $MOXIE_CUDA_GEMVM names (see
// gemvMMA).
func (s *DeviceSession) gemvMMAVariant() cuda.GemvVariant {
	v := cuda.GemvVariant{MMA: true}
	for _, u := range []int{1, 2, 4} {
		if s.gemvMMA[fmt.Sprintf("u%d", u)] {
			v.U = u
		}
	}
	return v
}

// fusedOn reports whether this pass uses the fused kernels (see fused).
func (s *DeviceSession) fusedOn() bool { return s.fused && s.layerHook == nil }

// decodeSets prepares layer b's merged one-token projections (decodeSets).
func (s *DeviceSession) decodeSets(c *cuda.Ctx, b *devBlock) (*decodeSets, error) {
	type proj struct {
		w      *cuda.DeviceWeight
		y, x   cuda.DevicePtr
		groups int
	}
	// set prepares one launch of the products: a Gemv where $MOXIE_CUDA_GEMV
	// lists the set (or by default) and the shapes allow, else a multi-linear
	// launch of two or more; nil for fewer than two products (single: a
	// Gemv when use allows one).
	set := func(name string, single bool, ps ...proj) (launchFn, error) {
		var ws []*cuda.DeviceWeight
		var ys, xs []cuda.DevicePtr
		var gp []cuda.GemvProj
		for _, p := range ps {
			if p.w != nil {
				ws, ys, xs = append(ws, p.w), append(ys, p.y), append(xs, p.x)
				gp = append(gp, cuda.GemvProj{W: p.w, Y: p.y, X: p.x, Groups: p.groups})
			}
		}
		if len(ws) == 0 || len(ws) < 2 && !single {
			return nil, nil
		}
		if s.gemvMMA[name] {
			if g, err := c.PrepareGemv(gp, s.gemvMMAVariant()); err == nil {
				return gemvLaunch(g), nil
			}
		}
		if s.gemvSets[name] {
			if g, err := c.PrepareGemv(gp, cuda.GemvVariant{U: 2}); err == nil {
				return gemvLaunch(g), nil
			}
		}
		if single {
			return nil, nil
		}
		m, err := c.PrepareMultiLinear(s.arena, ws, ys, xs, 1, cuda.LinearVariant{})
		if err != nil {
			return nil, err
		}
		return func(c *cuda.Ctx, st cuda.Stream) error { return c.LaunchMultiLinear(m, st) }, nil
	}
	var ds decodeSets
	var err error
	if ds.byA, err = set("a", false, proj{b.wqA, s.qlat, s.a, 1}, proj{b.wkv, s.kv, s.a, 1}); err != nil {
		return nil, fmt.Errorf("wq_a+wkv: %w", err)
	}
	// wq_b (and the indexer's) on the raw qlat with its RMSNorm in the
	// launch (the MMA Gemv), so that no kernel between wq_a and wq_b
	// normalizes it; else a merged set on the normalized qlat.
	if s.gemvMMA["q"] && s.gemvMMA["qnorm"] {
		ps := []cuda.GemvProj{{W: b.wqB, Y: s.q, X: s.qlat, Norm: b.qNorm, Eps: float32(s.m.Cfg.NormEps)}}
		if b.idxWqB != nil {
			ps = append(ps, cuda.GemvProj{W: b.idxWqB, Y: s.qi, X: s.qlat, Norm: b.qNorm, Eps: float32(s.m.Cfg.NormEps)})
		}
		if g, err := c.PrepareGemv(ps, s.gemvMMAVariant()); err == nil {
			ds.byQ = gemvLaunch(g)
			ds.qNormed = true
		}
	}
	// Without an indexer (the HCA layers) wq_b alone is the set: a Gemv
	// where the set takes one, else c.Linear as before.
	if !ds.qNormed {
		if ds.byQ, err = set("q", b.idxWqB == nil, proj{b.wqB, s.q, s.qlat, 1}, proj{b.idxWqB, s.qi, s.qlat, 1}); err != nil {
			return nil, fmt.Errorf("wq_b+indexer wq_b: %w", err)
		}
	}
	var bf []proj
	if cp := b.comp; cp != nil {
		bf = append(bf, proj{cp.wkv, s.cin, s.a, 1}, proj{cp.wgate, s.zin, s.a, 1})
	}
	if cp := b.icomp; cp != nil {
		bf = append(bf, proj{cp.wkv, s.cin1, s.a, 1}, proj{cp.wgate, s.zin1, s.a, 1}, proj{b.idxProj, s.wts, s.a, 1})
	}
	if ds.bf, err = set("bf", false, bf...); err != nil {
		return nil, fmt.Errorf("compressor projections: %w", err)
	}
	cfg := s.m.Cfg
	if s.woPair {
		p, err := c.PrepareGemvPair(s.arena, cuda.GemvProj{W: b.woA, Y: s.u, X: s.o, Groups: cfg.OGroups},
			cuda.GemvProj{W: b.woB, Y: s.attnOut, X: s.u, Groups: 1}, cuda.GemvPairVariant{})
		if err != nil {
			return nil, fmt.Errorf("wo_a+wo_b pair: %w", err)
		}
		ds.wo = func(c *cuda.Ctx, st cuda.Stream) error { return c.LaunchGemvPair(p, st) }
		return &ds, nil // woA and woB are not run
	}
	if ds.woA, err = set("wo", true, proj{b.woA, s.u, s.o, cfg.OGroups}); err != nil {
		return nil, fmt.Errorf("wo_a: %w", err)
	}
	if ds.woB, err = set("wo", true, proj{b.woB, s.attnOut, s.u, 1}); err != nil {
		return nil, fmt.Errorf("wo_b: %w", err)
	}
	if s.hcCol && s.gemvMMA["a"] {
		ps := []cuda.GemvProj{{W: b.wqA, Y: s.qlat, X: s.a, Groups: 1}, {W: b.wkv, Y: s.kv, X: s.a, Groups: 1}}
		if g, err := c.PrepareGemv(ps, s.gemvMMAVariant()); err == nil && g.HasCollapse() {
			ds.byAC = g
		}
	}
	if s.hcEpi && s.gemvMMA["wo"] {
		if g, err := c.PrepareGemv([]cuda.GemvProj{{W: b.woB, Y: s.attnOut, X: s.u, Groups: 1}}, s.gemvMMAVariant()); err == nil && g.HasHCEpilogue() {
			ds.woBHC = g
		}
	}
	return &ds, nil
}

// Describe summarises the session's device paths for logs and benchmark
// reports: context and chunk, decode graph state, how experts are chosen,
// and the expert cache if any.
func (s *DeviceSession) Describe() string {
	g := "decode graphs off"
	switch {
	case s.graphErr != nil:
		g = "decode graphs failed: " + s.graphErr.Error()
	case s.graph != nil:
		g = "decode graph captured"
	case s.graphs:
		g = "decode graphs on (not captured yet)"
	}
	e := "experts chosen on the device"
	switch {
	case s.runErr != nil:
		e = "experts partly routed through the host: " + s.runErr.Error()
	case s.m.routes != nil:
		e = "experts routed through the host (route recording)"
	}
	out := fmt.Sprintf("device session on %s: context %d, chunks of %d, %s, %s", s.d.dev.Info().Name, s.limit, s.chunk, g, e)
	if !s.fused {
		out += ", fused kernels off (MOXIE_CUDA_FUSE=off)"
	}
	if s.moeErr != nil {
		out += ", unfused MoE kernels: " + s.moeErr.Error()
	} else if s.moeDec == nil || !slices.ContainsFunc(s.moeDec, func(m *cuda.MoEDecode) bool { return m != nil }) {
		out += ", unfused MoE kernels"
	}
	switch {
	case s.multiErr != nil:
		out += ", one launch per decode projection: " + s.multiErr.Error()
	case !s.multi:
		out += ", one launch per decode projection (MOXIE_CUDA_MERGE=off)"
	}
	if t := s.d.tier; t != nil {
		out += ", " + t.describe()
	}
	switch {
	case !s.aheadOK:
		out += ", greedy steps not run ahead (MOXIE_CUDA_AHEAD=off)"
	case s.ranAhead+s.dropped > 0:
		out += fmt.Sprintf(", %d greedy steps run ahead of the host (%d more dropped)", s.ranAhead, s.dropped)
	}
	return out
}

// Pos is the number of tokens processed so far (the next token's position).
func (s *DeviceSession) Pos() int { return s.pos }

// Limit is the most tokens the session can hold.
func (s *DeviceSession) Limit() int { return s.limit }

// Prefill runs tokens at the next positions and returns the logits
// [VocabSize] predicting the token after the last one (owned by the caller).
func (s *DeviceSession) Prefill(tokens []int) ([]float32, error) {
	return s.forward(tokens, false, nil, nil)
}

// PrefillAll is Prefill returning every position's logits [len(tokens), VocabSize].
func (s *DeviceSession) PrefillAll(tokens []int) ([]float32, error) {
	return s.forward(tokens, true, nil, nil)
}

// Decode runs one token and returns its logits [VocabSize].
func (s *DeviceSession) Decode(tok int) ([]float32, error) {
	return s.forward([]int{tok}, false, nil, nil)
}

// Append implements generate.Sequence.
func (s *DeviceSession) Append(ctx context.Context, tokens []int) ([]float32, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s.Prefill(tokens)
}

// AppendInto implements generate.IntoAppender: Append with the logits
// written into dst when cap(dst) >= VocabSize.
func (s *DeviceSession) AppendInto(ctx context.Context, tokens []int, dst []float32) ([]float32, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s.forward(tokens, false, dst, nil)
}

// AppendReduce implements generate.Reducer: Append whose logits stay on
// the device, reduced there under spec (spec.OK set) into dst; LastLogits
// downloads them when the sampler needs them after all.
func (s *DeviceSession) AppendReduce(ctx context.Context, tokens []int, spec sample.ReduceSpec, dst *sample.Reduction) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !spec.OK {
		return fmt.Errorf("dsv4: AppendReduce with a spec that needs the logits (%+v)", spec)
	}
	if s.pend && spec.Greedy && len(tokens) == 1 && tokens[0] == s.pendTok && s.failed == nil {
		return s.confirm(dst)
	}
	_, err := s.forward(tokens, false, nil, &reduceReq{spec: spec, dst: dst, feed: s.pipe && spec.Greedy && len(tokens) == 1})
	return err
}

// Pipeline implements generate.Pipeliner: with it on, a greedy
// AppendReduce of one token that replays the captured decode graph also
// starts the step for its own argmax before returning (the reduction hands
// the token and position to it on the device), and an AppendReduce of
// that token then only waits for it, having started the step after it in
// turn. A step is started only while the session has room for it. Any
// other call first waits for a step in flight and drops it; the state is
// then as if it had never run (TestDeviceStrayStep: a one-token step
// writes only what the next real step at its position rewrites before
// anything reads it). LastLogits and DrawReduced fail after a greedy
// AppendReduce that started a step. Switching off starts no more steps
// and keeps one in flight. With $MOXIE_CUDA_AHEAD=off it does nothing.
func (s *DeviceSession) Pipeline(on bool) { s.pipe = on && s.aheadOK }

// Settle implements generate.Pipeliner: it waits for a step started
// ahead, if one is in flight, and drops it.
func (s *DeviceSession) Settle() error {
	s.m.pass.Lock()
	defer s.m.pass.Unlock()
	return s.settleLocked()
}

// settleLocked is Settle with Model.pass held.
func (s *DeviceSession) settleLocked() error {
	if !s.pend {
		return nil
	}
	s.pend = false
	s.dropped++
	if s.d.ahead == s {
		s.d.ahead = nil
	}
	slot := s.pendSlot
	err := s.d.dev.Do(func(c *cuda.Ctx) error { return c.WaitEvent(s.evAhead[slot]) })
	if err != nil && s.failed == nil {
		s.failed = fmt.Errorf("dsv4: waiting for the decode step run ahead at position %d: %w", s.pos, err)
	}
	return s.failed
}

// settleAll, with Model.pass held, drops this session's step run ahead and
// any other session's of the same model before a pass.
func (s *DeviceSession) settleAll() error {
	if o := s.d.ahead; o != nil && o != s {
		_ = o.settleLocked() // its failure is its own session's
	}
	return s.settleLocked()
}

// confirm is AppendReduce of the token whose step is in flight: it starts
// the step after it (when Pipeline is on and there is room), then waits for
// the confirmed step's reduction.
func (s *DeviceSession) confirm(dst *sample.Reduction) error {
	s.m.pass.Lock()
	defer s.m.pass.Unlock()
	slot, ring := s.pendSlot, s.pendRing
	next := (slot + 1) % cuda.GreedySlots
	more := s.pipe && s.pos+2 <= s.limit
	var tm *StepTiming
	t0 := time.Now()
	if s.timing {
		tm = &StepTiming{Ahead: true}
	}
	err := s.d.dev.Do(func(c *cuda.Ctx) error {
		tq := time.Now()
		if tm != nil {
			tm.Handoff = tq.Sub(t0)
		}
		if more {
			if err := s.launchAhead(c, next); err != nil {
				return err
			}
		}
		tw := time.Now()
		if err := c.WaitEvent(s.evAhead[slot]); err != nil {
			return err
		}
		if tm != nil {
			td := time.Now()
			tm.Enqueue, tm.Wait = tw.Sub(tq), td.Sub(tw)
			if err := s.aheadTiming(c, ring, tm); err != nil {
				return err
			}
		}
		return s.reducer.ReadGreedy(slot, dst)
	})
	s.pend = false
	if s.d.ahead == s {
		s.d.ahead = nil
	}
	if err != nil {
		s.failed = fmt.Errorf("dsv4: decode step run ahead at position %d: %w", s.pos, err)
		return s.failed
	}
	s.pos++
	s.ranAhead++
	s.reduced, s.logitsGone = !more, more
	if more {
		s.markAhead(next, dst)
	}
	if tm != nil {
		tm.Wall = time.Since(t0)
		s.lastTiming = *tm
	}
	return nil
}

// markAhead records the step launchAhead just started into slot, for the
// token of dst (the reduction that handed it over).
func (s *DeviceSession) markAhead(slot int, dst *sample.Reduction) {
	s.pend, s.pendSlot, s.pendTok = true, slot, dst.Best
	if dst.Bad || dst.Best < 0 {
		s.pendTok = -1 // it ran on token 0: nothing confirms it
	}
	s.d.ahead = s
}

// launchAhead enqueues the decode step at position s.pos whose token and
// position the last greedy reduction handed over: the captured graph, then
// its own greedy reduction into slot (handing over to the next) and the
// slot's event. The caller records it with markAhead.
func (s *DeviceSession) launchAhead(c *cuda.Ctx, slot int) error {
	st := c.Stream()
	if err := s.aheadEvents(c); err != nil {
		return err
	}
	i := s.aheadN % len(s.aheadT)
	if s.timing {
		if !s.aheadTOK {
			for k := range s.aheadT {
				for j := range s.aheadT[k] {
					e, err := c.NewEvent(true)
					if err != nil {
						return err
					}
					s.aheadT[k][j] = e
				}
			}
			s.aheadTOK = true
		}
		if err := c.Record(s.aheadT[i][0], st); err != nil {
			return err
		}
	}
	if err := c.LaunchGraph(s.graph, st); err != nil {
		return err
	}
	if s.timing {
		if err := c.Record(s.aheadT[i][1], st); err != nil {
			return err
		}
		s.aheadPrev[i] = s.lastEnd
		if !s.hasEnd {
			s.aheadPrev[i] = s.aheadT[i][0] // no step before it was timed: no gap
		}
		s.lastEnd, s.hasEnd = s.aheadT[i][1], true
	}
	s.pendRing = i
	s.aheadN++
	if err := s.reducer.EnqueueGreedy(c, s.logits, slot, s.tok, s.posBuf, st); err != nil {
		return err
	}
	return c.Record(s.evAhead[slot], st)
}

// aheadEvents creates the slots' events on first use.
func (s *DeviceSession) aheadEvents(c *cuda.Ctx) error {
	if s.evAheadOK {
		return nil
	}
	for i := range s.evAhead {
		e, err := c.NewEvent(false)
		if err != nil {
			return err
		}
		s.evAhead[i] = e
	}
	s.evAheadOK = true
	return nil
}

// aheadTiming fills tm's device times for the step run ahead in ring slot
// i, which has completed.
func (s *DeviceSession) aheadTiming(c *cuda.Ctx, i int, tm *StepTiming) error {
	if !s.aheadTOK {
		return nil // started before TimeSteps
	}
	ms, err := c.Elapsed(s.aheadT[i][0], s.aheadT[i][1])
	if err != nil {
		return err
	}
	tm.Device = time.Duration(ms * float64(time.Millisecond))
	gap, err := c.Elapsed(s.aheadPrev[i], s.aheadT[i][0])
	if err != nil {
		return err
	}
	tm.Gap = time.Duration(gap * float64(time.Millisecond))
	return nil
}

// LastLogits implements generate.Reducer: the logits of the last call,
// when it was AppendReduce, into dst (when cap(dst) >= VocabSize) or a
// new slice.
func (s *DeviceSession) LastLogits(dst []float32) ([]float32, error) {
	if s.failed != nil {
		return nil, s.failed
	}
	if s.logitsGone {
		return nil, errRanAhead
	}
	if !s.reduced {
		return nil, fmt.Errorf("dsv4: LastLogits: the last call was not AppendReduce")
	}
	V := s.m.Cfg.VocabSize
	out := dst[:0]
	if cap(dst) < V {
		out = make([]float32, V)
	}
	out = out[:V]
	err := s.d.dev.Do(func(c *cuda.Ctx) error { return c.CopyFloatsFromDevice(out, s.logits) })
	if err != nil {
		s.failed = fmt.Errorf("dsv4: downloading the logits at position %d: %w", s.pos, err)
		return nil, s.failed
	}
	return out, nil
}

// DrawReduced implements generate.Reducer: the draw d over the last
// AppendReduce's candidates, made on the device.
func (s *DeviceSession) DrawReduced(d sample.DeviceDraw) (int, error) {
	if s.failed != nil {
		return 0, s.failed
	}
	if s.logitsGone {
		return 0, errRanAhead
	}
	if !s.reduced {
		return 0, fmt.Errorf("dsv4: DrawReduced: the last call was not AppendReduce")
	}
	var id int
	err := s.d.dev.Do(func(c *cuda.Ctx) error {
		var err error
		id, err = s.reducer.Draw(c, d, c.Stream())
		return err
	})
	if err != nil {
		s.failed = fmt.Errorf("dsv4: drawing the token at position %d on the device: %w", s.pos, err)
		return 0, s.failed
	}
	return id, nil
}

// errRanAhead is LastLogits' and DrawReduced's error after a greedy
// AppendReduce that started the next step.
var errRanAhead = errors.New("dsv4: the next decode step already runs ahead over the last call's logits (Pipeline is on; a greedy sampler needs no logits)")

// reduceReq asks forward for the last row's sampler reduction instead of
// its logits. feed (a greedy spec, one token, Pipeline on): if the step
// replays the captured graph, its reduction hands the argmax to the next
// step, which run starts ahead.
type reduceReq struct {
	spec sample.ReduceSpec
	dst  *sample.Reduction
	feed bool
}

// Len implements generate.Sequence.
func (s *DeviceSession) Len() int { return s.pos }

// Close implements generate.Sequence: it frees the session's device memory.
func (s *DeviceSession) Close() error {
	s.m.pass.Lock()
	_ = s.settleLocked()
	s.m.pass.Unlock()
	s.release()
	s.failed = fmt.Errorf("dsv4: device session closed")
	return nil
}

var (
	_ generate.Sequence     = (*DeviceSession)(nil)
	_ generate.IntoAppender = (*DeviceSession)(nil)
	_ generate.Reducer      = (*DeviceSession)(nil)
	_ generate.Pipeliner    = (*DeviceSession)(nil)
)

// forward runs tokens in chunks and returns the last position's logits
// (every position's with all). A one-row result goes into dst when
// cap(dst) >= VocabSize; with red set (and not all) the last row is
// reduced on the device into red.dst instead, and no logits are returned.
func (s *DeviceSession) forward(tokens []int, all bool, dst []float32, red *reduceReq) ([]float32, error) {
	if s.failed != nil {
		return nil, s.failed
	}
	s.reduced, s.logitsGone = false, false
	s.m.pass.Lock()
	defer s.m.pass.Unlock()
	if err := s.settleAll(); err != nil {
		return nil, err
	}
	if err := checkTokens(s.m.Cfg, tokens); err != nil {
		return nil, err
	}
	if s.pos+len(tokens) > s.limit {
		return nil, fmt.Errorf("dsv4: %d tokens at position %d exceed the device session's context of %d (Options.DeviceContext)", len(tokens), s.pos, s.limit)
	}
	var out []float32
	for at := 0; at < len(tokens); at += s.chunk {
		end := min(at+s.chunk, len(tokens))
		rows := 0
		switch {
		case all:
			rows = end - at
		case end == len(tokens):
			rows = 1
		}
		var l []float32
		var tm *StepTiming
		var t0, t1 time.Time
		if s.timing {
			tm = &StepTiming{}
			t0 = time.Now()
		}
		var rr *reduceReq
		if rows == 1 {
			rr = red
		}
		err := s.d.dev.Do(func(cc *cuda.Ctx) error {
			var err error
			l, err = s.run(cc, tokens[at:end], rows, dst, rr, tm, t0)
			if tm != nil {
				t1 = time.Now()
			}
			return err
		})
		if tm != nil && err == nil {
			tm.Return = time.Since(t1)
			tm.Wall = time.Since(t0)
			s.lastTiming = *tm
		}
		if err != nil {
			s.failed = fmt.Errorf("dsv4: device forward at position %d: %w", s.pos, err)
			return nil, s.failed
		}
		if all {
			out = append(out, l...)
		} else {
			out = l
		}
	}
	s.reduced = red != nil && !s.pend
	s.logitsGone = s.pend
	return out, nil
}

func off(p cuda.DevicePtr, floats int) cuda.DevicePtr { return p + cuda.DevicePtr(4*floats) }

// StepTiming is where one call's last chunk (a decode step is one chunk)
// spent its time on a device session with TimeSteps on. Host times are
// wall-clock; Device is the GPU's own, between CUDA events recorded before
// the token upload and after the chunk's last kernel. The GPU is idle for
// about Wall - Device of every call (plus whatever the caller does between
// calls).
type StepTiming struct {
	// Wall is the whole chunk, as the caller sees it.
	Wall time.Duration
	// Handoff runs from the call until the device thread has the chunk and
	// has found the stream idle (the hand-off to the locked OS thread).
	Handoff time.Duration
	// Enqueue is the tokens' upload and the chunk's launches (a decode
	// step's one graph launch).
	Enqueue time.Duration
	// Wait is the host blocked until the GPU has finished the chunk.
	Wait time.Duration
	// Download is the logits' copy into the returned slice after that,
	// or with AppendReduce the sampler reduction's kernels and copy (zero
	// without either).
	Download time.Duration
	// Return runs from the device thread's end of the chunk until the
	// caller resumes.
	Return time.Duration
	// Device is the GPU time from the token upload to the chunk's end
	// (for a step run ahead, its graph's).
	Device time.Duration
	// Ahead: the step was started ahead (DeviceSession.Pipeline) by an
	// earlier call, which this one confirmed; Wall then starts with this
	// call, not with the step, and Gap is the GPU's idle time between
	// the end of the step before it and its start (its reduction, the
	// hand-off, and anything else the stream ran between them).
	Ahead bool
	Gap   time.Duration
}

// TimeSteps switches per-call timing on or off (off by default: it costs
// two event records and a synchronisation a chunk). With it on,
// LastTiming reports each call's last chunk.
func (s *DeviceSession) TimeSteps(on bool) { s.timing = on }

// LastTiming returns the timing of the last successful call's last chunk
// while TimeSteps was on (ok false before one).
func (s *DeviceSession) LastTiming() (t StepTiming, ok bool) {
	return s.lastTiming, s.lastTiming.Wall > 0
}

// run is one chunk on the device thread: upload the tokens and positions,
// enqueue the step (or replay the captured decode graph), download logits
// (one row into dst when it has room). With tm set (TimeSteps) it fills
// tm's device-thread fields; t0 is when the caller handed the chunk over.
func (s *DeviceSession) run(c *cuda.Ctx, tokens []int, rows int, dst []float32, red *reduceReq, tm *StepTiming, t0 time.Time) ([]float32, error) {
	cfg := s.m.Cfg
	T := len(tokens)
	st := c.Stream()
	p0 := s.pos
	if err := c.Sync(st); err != nil { // the host buffer may be rewritten
		return nil, err
	}
	var tq time.Time
	if tm != nil {
		if !s.evStepOK {
			for i := range s.evStep {
				e, err := c.NewEvent(true)
				if err != nil {
					return nil, err
				}
				s.evStep[i] = e
			}
			s.evStepOK = true
		}
		tq = time.Now()
		tm.Handoff = tq.Sub(t0)
		if err := c.Record(s.evStep[0], st); err != nil {
			return nil, err
		}
	}
	hb := s.host.Bytes()
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(hb[4*i:], uint32(t))
		binary.LittleEndian.PutUint32(hb[4*(s.chunk+i):], uint32(p0+i))
	}
	if err := c.UploadAsync(s.tok, s.host, 0, 4*T, st); err != nil {
		return nil, err
	}
	if err := c.UploadAsync(s.posBuf, s.host, 4*s.chunk, 4*T, st); err != nil {
		return nil, err
	}
	var err error
	switch {
	case !s.graphable(T, rows):
		err = s.step(c, T, p0, rows, false)
	case s.graph != nil:
		err = c.LaunchGraph(s.graph, st)
	case !s.warm:
		// The first decode step runs uncaptured, so that every module and
		// kernel is loaded before a capture.
		err = s.step(c, T, p0, rows, false)
		s.warm = true
	default:
		err = s.capture(c, T, p0, rows)
	}
	if err != nil {
		return nil, err
	}
	s.pos += T
	if tm != nil {
		if err := c.Record(s.evStep[1], st); err != nil {
			return nil, err
		}
		tw := time.Now()
		tm.Enqueue = tw.Sub(tq)
		if err := c.Sync(st); err != nil {
			return nil, err
		}
		td := time.Now()
		tm.Wait = td.Sub(tw)
		ms, err := c.Elapsed(s.evStep[0], s.evStep[1])
		if err != nil {
			return nil, err
		}
		tm.Device = time.Duration(ms * float64(time.Millisecond))
		defer func() { tm.Download = time.Since(td) }()
	}
	if rows == 0 {
		return nil, c.Sync(st)
	}
	V := cfg.VocabSize
	if red != nil && red.feed && s.graph != nil && s.graphable(T, rows) {
		return nil, s.reduceAndRunAhead(c, red.dst, tm)
	}
	if red != nil { // s.reducer is open's while the session is usable
		if err := s.reducer.Enqueue(c, s.logits, red.spec, st); err != nil {
			return nil, err
		}
		if err := c.Sync(st); err != nil {
			return nil, err
		}
		return nil, s.reducer.Read(c, st, red.dst)
	}
	var out []float32
	if rows == 1 && cap(dst) >= V {
		out = dst[:V]
		if h := s.registered(c, out); h != nil {
			if err := c.DownloadAsync(h, 0, s.logits, 4*V, st); err != nil {
				return nil, err
			}
			return out, c.Sync(st)
		}
	} else {
		out = make([]float32, rows*V)
	}
	if rows <= s.headRows {
		if s.pinnedLogits && rows == 1 {
			if err := c.DownloadAsync(s.host, s.logitsOff, s.logits, 4*V, st); err != nil {
				return nil, err
			}
			if err := c.Sync(st); err != nil {
				return nil, err
			}
			hb := s.host.Bytes()[s.logitsOff : s.logitsOff+4*V]
			copy(out, unsafe.Slice((*float32)(unsafe.Pointer(&hb[0])), V))
			return out, nil
		}
		if err := c.CopyFloatsFromDevice(out, s.logits); err != nil {
			return nil, err
		}
		return out, nil
	}
	for b0 := 0; b0 < rows; b0 += s.headRows {
		n := min(s.headRows, rows-b0)
		if err := c.Linear(s.d.head, s.logits, off(s.a, b0*cfg.Dim), n, st); err != nil {
			return nil, err
		}
		if err := c.CopyFloatsFromDevice(out[b0*V:(b0+n)*V], s.logits); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// reduceAndRunAhead ends a greedy decode step that replayed the graph: its
// reduction, which hands the argmax to the next step, and, when the
// result has an argmax and the session room, that step started ahead
// (s.pos is already its position) before the result is read into dst.
func (s *DeviceSession) reduceAndRunAhead(c *cuda.Ctx, dst *sample.Reduction, tm *StepTiming) error {
	st := c.Stream()
	if err := s.aheadEvents(c); err != nil {
		return err
	}
	if err := s.reducer.EnqueueGreedy(c, s.logits, 0, s.tok, s.posBuf, st); err != nil {
		return err
	}
	if err := c.Record(s.evAhead[0], st); err != nil {
		return err
	}
	if tm != nil {
		s.lastEnd, s.hasEnd = s.evStep[1], true
	}
	// Whether the reduction has an argmax is known only after it: start
	// the step regardless (a reduction without one hands over token 0) and
	// mark it unconfirmable below if so.
	more := s.pos+1 <= s.limit
	if more {
		if err := s.launchAhead(c, 1); err != nil {
			return err
		}
		if err := c.WaitEvent(s.evAhead[0]); err != nil {
			return err
		}
	} else if err := c.Sync(st); err != nil {
		return err
	}
	if err := s.reducer.ReadGreedy(0, dst); err != nil {
		return err
	}
	if more {
		s.markAhead(1, dst)
	}
	return nil
}

// registered returns out (a caller's dst) page-locked for a direct
// download, registering it on first sight (and dropping the registration
// of a previous dst), or nil to copy through the session's buffers.
func (s *DeviceSession) registered(c *cuda.Ctx, out []float32) *cuda.HostBuffer {
	if !s.registerDst { // set only with the default, pinned, logits path
		return nil
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(&out[0])), 4*len(out))
	if h := s.dstHost; h != nil {
		if &h.Bytes()[0] == &b[0] && h.Len() == len(b) {
			return h
		}
		s.dstHost = nil
		if err := c.FreeHost(h); err != nil {
			s.registerDst = false
			return nil
		}
	}
	h, err := c.RegisterHost(b)
	if err != nil {
		s.registerDst = false // e.g. already registered by another session
		return nil
	}
	s.dstHost = h
	return h
}

// graphable reports whether a chunk is a decode step whose launches do not
// depend on the host (positions and tokens are read from device memory):
// one token with its logits, experts selected on the device, no hooks.
func (s *DeviceSession) graphable(T, rows int) bool {
	if !s.graphs || T != 1 || rows != 1 || s.m.routes != nil || s.selHook != nil || s.layerHook != nil || s.d.tier != nil {
		return false
	}
	for _, r := range s.runs {
		if r == nil {
			return false
		}
	}
	return true
}

// capture records one decode step into a CUDA graph and launches it; if the
// capture fails, graphs are switched off for the session (s.graphErr says
// why) and the step runs uncaptured.
func (s *DeviceSession) capture(c *cuda.Ctx, T, p0, rows int) error {
	st := c.Stream()
	if err := c.BeginCapture(st); err != nil {
		s.graphs, s.graphErr = false, fmt.Errorf("begin capture: %w", err)
		return s.step(c, T, p0, rows, false)
	}
	err := s.step(c, T, p0, rows, true)
	g, endErr := c.EndCapture(st)
	if err != nil || endErr != nil {
		if g != nil {
			_ = c.DestroyGraph(g)
		}
		s.graphs, s.graphErr = false, fmt.Errorf("capturing the decode step: %v; %v", err, endErr)
		return s.step(c, T, p0, rows, false)
	}
	s.graph = g
	return c.LaunchGraph(g, st)
}

// step enqueues the chunk's forward pass (embedding, layers, head for the
// last rows); tokens and positions are already in s.tok and s.posBuf. With
// graph set it must not synchronise nor depend on p0 (see graphable).
func (s *DeviceSession) step(c *cuda.Ctx, T, p0, rows int, graph bool) error {
	m, d := s.m, s.d
	cfg := m.Cfg
	D, hc := cfg.Dim, cfg.HCMult
	st := c.Stream()
	if err := c.EmbedBF16(s.x, d.embed, s.tok, T, D, hc, st); err != nil {
		return err
	}
	if s.fusedOn() {
		return s.stepFused(c, T, p0, rows, graph)
	}
	for l, b := range d.layers {
		if err := s.layer(c, b, s.layers[l], l, T, p0, graph); err != nil {
			return fmt.Errorf("layer %d: %w", l, err)
		}
		if s.layerHook != nil {
			X := make([]float32, T*hc*D)
			if err := c.CopyFloatsFromDevice(X, s.x); err != nil {
				return err
			}
			s.layerHook(l, X)
		}
	}
	if rows == 0 {
		return nil
	}
	first := T - rows
	xs := off(s.x, first*hc*D)
	eps := float32(cfg.NormEps)
	return errs(
		func() error { return c.HCHeadPre(s.pre, xs, &d.hcHead, rows, st) },
		func() error { return c.HCCollapse(s.a, xs, s.pre, hc, D, rows, st) },
		func() error { return c.RMSNorm(s.a, s.a, d.norm, rows, D, eps, st) },
		func() error { return s.head(c, rows, st) },
	)
}

// stepFused is step's layers and head with fused sublayer boundaries: each
// boundary expands the previous sublayer's output into the streams, mixes,
// collapses and normalises in two kernels (Ctx.HCMixNorm), so a layer ends
// with its MoE output still to be expanded: the next layer's first boundary
// (or the head's) does it.
func (s *DeviceSession) stepFused(c *cuda.Ctx, T, p0, rows int, graph bool) error {
	d := s.d
	cfg := s.m.Cfg
	D, hc := cfg.Dim, cfg.HCMult
	eps := float32(cfg.NormEps)
	st := c.Stream()
	s.hcTiles, s.attnCol = false, nil // no boundary begun by a MoE of an earlier, failed step
	bound := func(x, o, xout cuda.DevicePtr, hcp *cuda.HC, norm cuda.DevicePtr) error {
		a := &cuda.HCNorm{X: x, O: o, Post: s.post, Comb: s.comb, XOut: xout, Pre: s.pre, PostOut: s.post, CombOut: s.comb,
			A: s.a, Norm: norm, Eps: eps, Scratch: s.hcScratch, Counters: s.hcCounters, T: T}
		if s.hcTiles { // the producer just enqueued began it: x' in xout, the partials in the scratch
			s.hcTiles = false
			return c.HCMixNormTiles(a, hcp, st)
		}
		return c.HCMixNorm(a, hcp, st)
	}
	for l, b := range d.layers {
		// Into attention: layer 0 mixes the embedded streams; later layers
		// first expand the previous MoE output (xmid, moeOut → x).
		err := s.pf.at(c, s.pf.q, T, st, b.wqA, b.wkv, b.wqB, b.idxWqB)
		switch {
		case err != nil:
		case l == 0:
			err = bound(s.x, 0, 0, &b.hcAttn, b.attnNorm)
		default:
			col := s.hcTiles && s.hcCol // begun by the MoE with the Gram rows: wq_a+wkv may form a itself
			if err = bound(s.xmid, s.moeOut, s.x, &b.hcAttn, b.attnNorm); err == nil && col {
				s.attnCol = &cuda.HCCollapse{XS: s.x, Part: s.hcScratch, Site: &b.hcAttn, Norm: b.attnNorm, Eps: eps}
			}
		}
		if err == nil {
			s.ffnNext = &b.hcFFN
			err = s.attention(c, b, s.layers[l], T, p0, graph)
			s.ffnNext, s.attnCol = nil, nil
		}
		if err == nil { // into the MoE: x, attnOut → xmid (begun by wo_b where it could)
			err = bound(s.x, s.attnOut, s.xmid, &b.hcFFN, b.ffnNorm)
		}
		if err == nil {
			var next *cuda.HC
			if l+1 < len(d.layers) {
				next = &d.layers[l+1].hcAttn
			}
			err = s.moe(c, b, l, T, p0, next)
		}
		if err != nil {
			return fmt.Errorf("layer %d: %w", l, err)
		}
	}
	// The prefetch stream joins once (see l2Prefetch).
	if err := s.pf.joinTo(c, st); err != nil {
		return err
	}
	if rows == 0 {
		return nil
	}
	// The head: the last MoE output expanded for the rows wanted only.
	first := T - rows
	a := &cuda.HCNorm{X: off(s.xmid, first*hc*D), O: off(s.moeOut, first*D), Post: off(s.post, first*hc),
		Comb: off(s.comb, first*hc*hc), XOut: off(s.x, first*hc*D), Pre: s.pre, A: s.a, Norm: d.norm, Eps: eps,
		Scratch: s.hcScratch, Counters: s.hcCounters, T: rows}
	if err := c.HCHeadNorm(a, &d.hcHead, st); err != nil {
		return err
	}
	return s.head(c, rows, st)
}

// head enqueues the LM head over the rows normalised into s.a when they fit
// the logits buffer; more rows (PrefillAll of a long chunk) are done by run
// in blocks of headRows, each copied down before the next.
func (s *DeviceSession) head(c *cuda.Ctx, rows int, st cuda.Stream) error {
	if rows > s.headRows {
		return nil
	}
	return c.Linear(s.d.head, s.logits, s.a, rows, st)
}

// maxHeadRows bounds the rows of logits a session holds on the device
// (each is VocabSize floats, 517 KB for V4-Flash).
const maxHeadRows = 256

// errs runs steps in order and returns the first error.
func errs(steps ...func() error) error {
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// layer runs decoder block b on s.x [T, hc, D] (the result replaces s.x).
func (s *DeviceSession) layer(c *cuda.Ctx, b *devBlock, ls *devLayerState, l, T, p0 int, graph bool) error {
	cfg := s.m.Cfg
	D, hc := cfg.Dim, cfg.HCMult
	eps := float32(cfg.NormEps)
	st := c.Stream()
	if err := errs(
		func() error { return c.HCMix(s.pre, s.post, s.comb, s.x, &b.hcAttn, T, st) },
		func() error { return c.HCCollapse(s.a, s.x, s.pre, hc, D, T, st) },
		func() error { return c.RMSNorm(s.a, s.a, b.attnNorm, T, D, eps, st) },
	); err != nil {
		return err
	}
	if err := s.attention(c, b, ls, T, p0, graph); err != nil {
		return err
	}
	if err := errs(
		func() error { return c.HCExpand(s.xmid, s.x, s.attnOut, s.post, s.comb, hc, D, T, st) },
		func() error { return c.HCMix(s.pre, s.post, s.comb, s.xmid, &b.hcFFN, T, st) },
		func() error { return c.HCCollapse(s.a, s.xmid, s.pre, hc, D, T, st) },
		func() error { return c.RMSNorm(s.a, s.a, b.ffnNorm, T, D, eps, st) },
	); err != nil {
		return err
	}
	if err := s.moe(c, b, l, T, p0, nil); err != nil {
		return err
	}
	if err := s.pf.joinTo(c, st); err != nil {
		return err
	}
	return c.HCExpand(s.x, s.xmid, s.moeOut, s.post, s.comb, hc, D, T, st)
}

// attention is §4.4 for the chunk's T queries (input s.a, output s.attnOut).
// p0 only sizes grids (graph: the largest size instead).
func (s *DeviceSession) attention(c *cuda.Ctx, b *devBlock, ls *devLayerState, T, p0 int, graph bool) error {
	m, d := s.m, s.d
	cfg := m.Cfg
	st := c.Stream()
	H, hd := cfg.NHeads, cfg.HeadDim
	eps := float32(cfg.NormEps)
	nf := d.nfreq
	freq := d.freqPlain
	if b.ratio > 0 {
		freq = d.freqCompress
	}
	// A decode step with merged projections (decodeSets) computes qlat and
	// kv in one launch, q and qi in another and every BF16 compressor and
	// indexer-weight projection of a in a third; the results are the same
	// products, read by the same steps below.
	var dec *decodeSets
	if T == 1 && s.multi {
		dec = ls.dec
	}
	merged := func(m launchFn, plain func() error) func() error {
		if m == nil {
			return plain
		}
		return func() error { return m(c, st) }
	}
	var byA, byQ, bf, woA, woB launchFn
	qNormed := false // byQ normalizes qlat itself (decodeSets.qNormed)
	if dec != nil {
		byA, byQ, bf, woA, woB = dec.byA, dec.byQ, dec.bf, dec.woA, dec.woB
		qNormed = dec.qNormed
		if dec.wo != nil { // both in one launch
			woA, woB = dec.wo, func(*cuda.Ctx, cuda.Stream) error { return nil }
		}
	}
	var IH, ID int
	var wsc float32
	if b.icomp != nil {
		IH, ID = cfg.IndexNHeads, cfg.IndexHeadDim
		wsc = float32(1 / math.Sqrt(float64(ID)) / math.Sqrt(float64(IH)))
	}
	// The projections of a (and of the normed qlat), by merged launches or
	// one by one.
	proj := []func() error{
		func() error {
			// wq_a+wkv forming a itself from the boundary's x' and partials
			// (stepFused set attnCol); wkv is in the same launch.
			if s.attnCol != nil && T == 1 && dec != nil && dec.byAC != nil && byA != nil {
				s.epi.col++
				return c.LaunchGemvCollapse(dec.byAC, s.attnCol, st)
			}
			return merged(byA, func() error { return c.Linear(b.wqA, s.qlat, s.a, T, st) })()
		},
		func() error {
			if byA != nil {
				return nil // computed with qlat
			}
			return c.Linear(b.wkv, s.kv, s.a, T, st)
		},
	}
	projQ := []func() error{
		merged(byQ, func() error { return c.Linear(b.wqB, s.q, s.qlat, T, st) }),
		func() error {
			if b.icomp == nil || byQ != nil {
				return nil // none, or computed with q
			}
			return c.Linear(b.idxWqB, s.qi, s.qlat, T, st)
		},
		merged(bf, func() error {
			if b.icomp == nil {
				return nil // the compressors project in compStep
			}
			return c.Linear(b.idxProj, s.wts, s.a, T, st)
		}),
	}
	// forked: this decode step runs the compressors' chain on the side
	// stream (see DeviceSession.side); it needs the merged BF16 launch.
	forked := bf != nil && s.sideOK && s.fusedOn()
	// qPrep: decode attention normalizes and rotates the queries as it
	// stages them (Ctx.AttentionDecodeNormQ), so no row-op kernel does.
	qPrep := s.qPrep && T == 1 && s.attnDec && s.invRoPE && s.fusedOn()
	// idxPrep: likewise the indexer's scores kernel rotates its queries and
	// scales its head weights as it loads them (IdxDec.IndexScoresPrep).
	idxPrep := s.qPrep && T == 1 && s.fusedOn() && b.icomp != nil && cuda.IndexScoresPrepFits(cfg.IndexNHeads, cfg.IndexHeadDim)
	var steps []func() error
	if s.fusedOn() {
		// Row operations fused: the qlat norm with the window KV's norm,
		// RoPE and ring store; the queries' norm and RoPE with the indexer
		// queries' RoPE and the scaling of its head weights.
		var qOps []cuda.RowOp
		if !qPrep {
			qOps = append(qOps, cuda.RowOp{Y: s.q, X: s.q, Rows: T * H, Dim: hd, Heads: H, Norm: true, Eps: eps, NFreq: nf, Freq: freq, Pos: s.posBuf})
		}
		// The window KV's norm, RoPE and ring store (attention reads the
		// ring after the side stream's join).
		kvOp := cuda.RowOp{Y: ls.ring, X: s.kv, Rows: T, Dim: hd, Norm: true, W: b.kvNorm, Eps: eps, NFreq: nf, Freq: freq, Pos: s.posBuf, RingRows: ls.ringRows}
		if b.icomp != nil && !idxPrep {
			qOps = append(qOps,
				cuda.RowOp{Y: s.qi, X: s.qi, Rows: T * IH, Dim: ID, Heads: IH, NFreq: nf, Freq: freq, Pos: s.posBuf},
				cuda.RowOp{Y: s.wts, X: s.wts, Rows: T, Dim: IH, Scale: true, A: wsc}) // a row per token: T blocks
		}
		early := s.sideEarly && !qNormed
		fork := func() error {
			if !forked {
				return nil
			}
			// The compressors' chain on the side stream: the merged BF16
			// projections of a, then each compressor's store and close.
			side := s.side
			return errs(
				func() error { return c.Record(s.evFork, st) },
				func() error { return c.StreamWait(side, s.evFork) },
				func() error { return bf(c, side) },
				func() error { return s.compSteps(c, b, ls, freq, side) },
				func() error {
					if !qNormed {
						return nil // with the qlat norm on the main stream, below
					}
					return c.RowOps([]cuda.RowOp{kvOp}, side)
				},
				func() error { return c.Record(s.evJoin, side) })
		}
		if early {
			steps = append([]func() error{fork}, proj...)
		} else {
			steps = append(proj, fork)
		}
		steps = append(steps,
			func() error {
				switch {
				case !qNormed:
					return c.RowOps([]cuda.RowOp{{Y: s.qlat, X: s.qlat, Rows: T, Dim: cfg.QLoraRank, Norm: true, W: b.qNorm, Eps: eps}, kvOp}, st)
				case !forked:
					return c.RowOps([]cuda.RowOp{kvOp}, st)
				}
				return nil // the window KV on the side stream; qlat normalized by byQ
			})
		if forked {
			steps = append(steps, projQ[:2]...) // bf ran on the side stream
			steps = append(steps, func() error { return c.StreamWait(st, s.evJoin) })
		} else {
			steps = append(steps, projQ...)
		}
		steps = append(steps, func() error {
			if len(qOps) == 0 {
				return nil // the queries are prepared by decode attention and the indexer (qPrep, idxPrep)
			}
			return c.RowOps(qOps, st)
		})
	} else {
		steps = append(proj,
			func() error {
				if qNormed {
					return nil // byQ normalizes qlat itself
				}
				return c.RMSNorm(s.qlat, s.qlat, b.qNorm, T, cfg.QLoraRank, eps, st)
			},
			func() error { return c.RMSNorm(s.kv, s.kv, b.kvNorm, T, hd, eps, st) },
			func() error { return c.RoPE(s.kv, s.posBuf, freq, T, hd, hd, nf, false, st) },
			func() error { return d.fwd.RingStore(c, ls.ring, s.kv, s.posBuf, T, ls.ringRows, hd, st) })
		steps = append(steps, projQ...)
		steps = append(steps,
			func() error { return c.RMSNorm(s.q, s.q, 0, T*H, hd, eps, st) },
			func() error { return c.RoPE(s.q, s.posBuf, freq, T, H*hd, hd, nf, false, st) },
			func() error {
				if b.icomp == nil {
					return nil
				}
				return errs(
					func() error { return c.RoPE(s.qi, s.posBuf, freq, T, IH*ID, ID, nf, false, st) },
					func() error { return c.Scale(s.wts, wsc, T*IH, st) })
			})
	}
	steps = append(steps, func() error { return s.pf.at(c, s.pf.o || s.pf.a, T, st, b.woA) })
	if err := errs(steps...); err != nil {
		return err
	}
	// The compressors' inputs: merged, main into cin/zin and the indexer's
	// into cin1/zin1, already computed; otherwise each compStep projects.
	ccin, czin, icin, izin := s.cin, s.zin, s.cin, s.zin
	if bf != nil {
		icin, izin = s.cin1, s.zin1
	}
	var idx cuda.DevicePtr
	if b.icomp != nil {
		R := b.icomp.ratio
		if err := errs(
			func() error {
				switch {
				case forked:
					return nil // on the side stream, joined above
				case bf != nil: // one token, projected: both compressors now
					return s.compSteps(c, b, ls, freq, st)
				}
				return s.compStep(c, b.icomp, ls.icomp, T, freq, icin, izin, true, st)
			},
			func() error {
				maxN := (p0 + T) / R
				if graph {
					maxN = s.entries
				}
				if idxPrep {
					return d.idx.IndexScoresPrep(c, s.scores, s.qi, s.wts, ls.icomp.entries, s.posBuf, T, maxN, R, IH, ID, s.entries, freq, nf, wsc, st)
				}
				return d.idx.IndexScores(c, s.scores, s.qi, s.wts, ls.icomp.entries, s.posBuf, T, maxN, R, IH, ID, s.entries, st)
			},
			func() error { return d.idx.TopKRows(c, s.idx, s.scores, s.posBuf, T, R, s.topk, s.entries, st) },
		); err != nil {
			return err
		}
		idx = s.idx
		if s.selHook != nil {
			if err := s.reportSelections(c, b, T, p0, R); err != nil {
				return err
			}
		}
	}
	var comp cuda.DevicePtr
	maxKeys := cfg.Window
	if b.comp != nil {
		var err error
		switch {
		case forked, bf != nil && b.icomp != nil: // on the side stream, or with the indexer's above
		case bf != nil:
			err = s.compSteps(c, b, ls, freq, st)
		default:
			err = s.compStep(c, b.comp, ls.comp, T, freq, ccin, czin, true, st)
		}
		if err != nil {
			return err
		}
		comp = ls.comp.entries
		if b.kind == config.CSA {
			maxKeys += s.topk
		} else {
			maxKeys += s.limit / b.comp.ratio
		}
	}
	// fold: the inverse RoPE of the output happens in decode attention's
	// combine kernel.
	fold := T == 1 && s.attnDec && s.invRoPE
	return errs(
		func() error {
			// Chunks of several queries take the tensor-core kernel
			// (MOXIE_CUDA_ATTN=ring keeps the CUDA-core one).
			attn := d.fwd.AttentionRing
			switch {
			case qPrep:
				attn = func(c *cuda.Ctx, p cuda.AttnParams, st cuda.Stream) error {
					return c.AttentionDecodeNormQ(p, eps, freq, nf, s.attnScratch, st)
				}
			case fold:
				ch := s.attnDecV
				if s.attnEarly {
					ch.Early = cuda.AttnEarlyKeys
					if forked {
						ch.Early |= cuda.AttnEarlyComp
					}
				}
				attn = func(c *cuda.Ctx, p cuda.AttnParams, st cuda.Stream) error {
					return c.AttentionDecodeInvRoPEWith(p, freq, nf, s.attnScratch, ch, st)
				}
			case T == 1 && s.attnDec:
				attn = func(c *cuda.Ctx, p cuda.AttnParams, st cuda.Stream) error {
					return c.AttentionDecode(p, s.attnScratch, st)
				}
			case T > 1 && s.tcAttn && cuda.PrefillAttentionFits(H, hd):
				attn = d.fwd.AttentionPrefill
			}
			return attn(c, cuda.AttnParams{O: s.o, Q: s.q, Ring: ls.ring, Comp: comp, Idx: idx, Sinks: b.sink,
				Pos: s.posBuf, RingRows: ls.ringRows, Window: cfg.Window, T: T, Ratio: b.ratio, IdxStride: s.topk, TopK: s.topk,
				Heads: H, Dim: hd, MaxKeys: maxKeys, Scale: float32(1 / math.Sqrt(float64(hd))), HeadsPerBlock: s.headsPerBlock(T)}, st)
		},
		func() error {
			if fold {
				return nil // applied by the attention kernel
			}
			return c.RoPE(s.o, s.posBuf, freq, T, H*hd, hd, nf, true, st)
		},
		func() error { return s.pf.at(c, s.pf.o, T, st, b.woB) },
		merged(woA, func() error { return c.GroupedLinear(b.woA, s.u, s.o, T, cfg.OGroups, st) }),
		func() error {
			// wo_b that also begins the FFN-side boundary (stepFused reads
			// s.hcTiles next).
			if s.ffnNext != nil && s.hcEpi && T == 1 && dec != nil && dec.wo == nil && dec.woBHC != nil &&
				cuda.HCEpilogueFits(s.ffnNext, cfg.Dim) {
				h := &cuda.HCEpilogue{X: s.x, Post: s.post, Comb: s.comb, XOut: s.xmid, Part: s.hcScratch, Fn: s.ffnNext}
				if err := c.LaunchGemvHC(dec.woBHC, h, st); err != nil {
					return err
				}
				s.hcTiles = true
				s.epi.woB++
				return nil
			}
			return merged(woB, func() error { return c.Linear(b.woB, s.attnOut, s.u, T, st) })()
		},
		func() error {
			ws := []*cuda.DeviceWeight{b.gate}
			if b.shared != nil {
				ws = append(ws, b.shared.w1, b.shared.w3)
				if s.pf.s {
					ws = append(ws, b.shared.w2)
				}
			}
			return s.pf.at(c, s.pf.s || s.pf.m, T, st, ws...)
		},
	)
}

// headsPerBlock picks the attention kernel: for a chunk of several queries
// (prefill) the grouped kernel with the largest group that fits, which reads
// each key once per group of heads; for one query (decode) one block per
// head, which spreads the keys over more blocks.
func (s *DeviceSession) headsPerBlock(T int) int {
	c := s.m.Cfg
	if T > 1 && s.grouped {
		for _, g := range []int{8, 4, 2} {
			if cuda.GroupedAttentionFits(g, c.NHeads, c.HeadDim) {
				return g
			}
		}
	}
	return 1
}

// compStep stores the chunk's compressor rows (κ = wkv·a into cin, z =
// wgate·a into zin, then + ape) and closes the windows that end inside the
// chunk; project false means cin and zin already hold the products.
func (s *DeviceSession) compStep(c *cuda.Ctx, cp *devComp, cs *devCompState, T int, freq, cin, zin cuda.DevicePtr, project bool, st cuda.Stream) error {
	w := cp.c * cp.dw
	R := cp.ratio
	return errs(
		func() error {
			if !project {
				return nil
			}
			return errs(
				func() error { return c.Linear(cp.wkv, cin, s.a, T, st) },
				func() error { return c.Linear(cp.wgate, zin, s.a, T, st) })
		},
		func() error {
			return s.d.fwd.CompStore(c, cs.ringKV, cs.ringZ, cin, zin, cp.ape, s.posBuf, T, R, cs.rows, w, st)
		},
		func() error {
			return s.d.fwd.CompClose(c, cuda.CompCloseParams{Out: cs.entries, RingKV: cs.ringKV, RingZ: cs.ringZ, RingRows: cs.rows,
				Ratio: R, Width: w, DW: cp.dw, Overlap: cp.c == 2, Pos: s.posBuf, T: T, Norm: cp.norm,
				Eps: float32(s.m.Cfg.NormEps), Freq: freq, NFreq: s.d.nfreq}, st)
		},
	)
}

// compSteps enqueues a one-token step's store and close for the block's
// compressors (the indexer's, then the main one), their projections
// already in cin1/zin1 and cin/zin (the merged BF16 launch): in one
// Fwd.CompStep launch, or with compOne off a compStep for each.
func (s *DeviceSession) compSteps(c *cuda.Ctx, b *devBlock, ls *devLayerState, freq cuda.DevicePtr, st cuda.Stream) error {
	var jobs []cuda.CompJob
	for _, j := range []struct {
		cp       *devComp
		cs       *devCompState
		cin, zin cuda.DevicePtr
	}{{b.icomp, ls.icomp, s.cin1, s.zin1}, {b.comp, ls.comp, s.cin, s.zin}} {
		if j.cp == nil {
			continue
		}
		if !s.compOne {
			if err := s.compStep(c, j.cp, j.cs, 1, freq, j.cin, j.zin, false, st); err != nil {
				return err
			}
			continue
		}
		jobs = append(jobs, cuda.CompJob{Out: j.cs.entries, RingKV: j.cs.ringKV, RingZ: j.cs.ringZ, KV: j.cin, Z: j.zin, APE: j.cp.ape,
			Norm: j.cp.norm, RingRows: j.cs.rows, Ratio: j.cp.ratio, Width: j.cp.c * j.cp.dw, DW: j.cp.dw, Overlap: j.cp.c == 2})
	}
	if len(jobs) == 0 {
		return nil
	}
	return s.d.fwd.CompStep(c, jobs, s.posBuf, freq, s.d.nfreq, float32(s.m.Cfg.NormEps), st)
}

// reportSelections downloads the chunk's indexer selections for selHook.
func (s *DeviceSession) reportSelections(c *cuda.Ctx, b *devBlock, T, p0, R int) error {
	buf := make([]byte, 4*T*s.topk)
	if err := c.CopyFromDevice(buf, s.idx); err != nil {
		return err
	}
	sel := make([]int, 0, s.topk)
	for i := range T {
		n := min(s.topk, (p0+i+1)/R)
		if n == 0 {
			continue
		}
		sel = sel[:0]
		for j := range n {
			sel = append(sel, int(int32(binary.LittleEndian.Uint32(buf[4*(i*s.topk+j):]))))
		}
		s.selHook(b.layer, p0+i, sel)
	}
	return nil
}

// moe is §4.7 for the chunk (input s.a, output s.moeOut). With next (the
// next layer's attention-side mix site; nil for none) and s.hcEpi, a fused
// one-token MoE with its shared expert in the launch also begins that
// boundary (cuda.RunMoEDecodeHC: x' of s.xmid into s.x, the partials into
// s.hcScratch) and sets s.hcTiles.
func (s *DeviceSession) moe(c *cuda.Ctx, b *devBlock, l, T, p0 int, next *cuda.HC) error {
	m := s.m
	cfg := m.Cfg
	st := c.Stream()
	D, E, K, I := cfg.Dim, cfg.NRoutedExperts, cfg.NActivatedExperts, cfg.MoEInterDim
	limit := float32(cfg.SwigluLimit)
	var hash cuda.DevicePtr
	if b.hash {
		if err := s.d.fwd.GatherI32(c, s.hash, b.tid2eid, s.tok, T, K, st); err != nil {
			return err
		}
		hash = s.hash
	}
	tier := s.d.tier
	var dec *cuda.MoEDecode
	if T == 1 && m.routes == nil && s.moeDec != nil {
		dec = s.moeDec[l]
	}
	gateRoute := dec != nil && s.gateRoute
	if err := errs(
		func() error {
			if gateRoute { // gate and route in one kernel
				return c.GateRoute(s.ids, s.rw, s.glog, b.gate, s.a, b.bias, hash, E, K, float32(cfg.RouteScale), st)
			}
			return c.Linear(b.gate, s.glog, s.a, T, st)
		},
		func() error {
			if gateRoute {
				return nil
			}
			return c.Route(s.ids, s.rw, s.glog, b.bias, hash, T, E, K, float32(cfg.RouteScale), st)
		},
		func() error {
			if dec != nil {
				return nil // the fused MoE writes moeOut
			}
			return c.Memset(s.moeOut, 0, 4*T*D, st)
		},
	); err != nil {
		return err
	}
	if dec != nil {
		// Routed experts, SwiGLU, shared expert and the sum in two kernels
		// (with the expert cache, the chosen experts made resident first).
		if err := s.ensureChosen(c, b, l); err != nil {
			return err
		}
		// The default variant (cuda.MoELeanXW) starts the shared expert
		// before the routing kernel just launched has finished: its input
		// s.a must come from further back (the HC boundary), which holds
		// on every path here (gate and route, or GateRoute, launch after
		// it). Its stage 2 reads the expert ids and tables before it waits
		// for stage 1: nothing between the two launches writes them
		// (ensureChosen's copies come before stage 1).
		if next != nil && s.hcEpi && T == 1 && dec.HasHCEpilogue() && (b.shared == nil || sharedOf(b) != nil) &&
			cuda.HCEpilogueFits(next, cfg.Dim) {
			h := &cuda.HCEpilogue{X: s.xmid, Post: s.post, Comb: s.comb, XOut: s.x, Part: s.hcScratch, Fn: next, Gram: s.hcCol}
			if err := c.RunMoEDecodeHC(dec, s.ids, s.rw, h, st); err != nil {
				return err
			}
			s.hcTiles = true
			s.epi.moe++
			return nil
		}
		if err := c.RunMoEDecode(dec, s.ids, s.rw, st); err != nil {
			return err
		}
		if b.shared == nil || sharedOf(b) != nil {
			return nil // the shared expert, if any, was in the launch
		}
		return s.sharedExpert(c, b, T)
	}
	if T > 1 && s.devMoE && s.tiles != nil && b.table != nil && m.routes == nil && tier == nil {
		// Expert-major tiles laid out on the device: no host round trip.
		n := T * K
		if err := errs(
			func() error { return s.d.fwd.PlanExperts(c, s.tiles, s.ids, s.rw, T, st) },
			func() error { return s.d.fwd.GatherRows(c, s.xe, s.a, s.rows, n, D, st) },
			func() error { return s.d.fwd.RunExpertTiles13(c, s.tiles, b.table, st) },
			func() error { return c.SwiGLU(s.eh, s.eg, s.eu, s.roww, n, I, limit, st) },
			func() error { return s.d.fwd.RunExpertTiles2(c, s.tiles, st) },
			func() error { return s.d.fwd.CombineExperts(c, s.moeOut, s.tiles, T, st) },
		); err != nil {
			return err
		}
	} else if run := s.runs[l]; T == 1 && run != nil && m.routes == nil {
		// Device-selected experts: no host round trip (with the expert
		// cache, one: the chosen experts are made resident first).
		if err := s.ensureChosen(c, b, l); err != nil {
			return err
		}
		if err := errs(
			func() error { return s.d.fwd.RunExperts13(c, run, s.ids, st) },
			func() error { return c.SwiGLU(s.eh, s.eg, s.eu, s.rw, K, I, limit, st) },
			func() error { return s.d.fwd.RunExperts2(c, run, st) },
			func() error { return s.d.fwd.AddRows(c, s.moeOut, s.ey, K, D, st) },
		); err != nil {
			return err
		}
	} else if err := s.moeHost(c, b, T, p0); err != nil {
		return err
	}
	if b.shared == nil {
		return nil
	}
	return s.sharedExpert(c, b, T)
}

// ensureChosen makes the experts a one-token step's routing chose for
// layer l resident in the expert cache, if there is one (the routing comes
// down: one synchronisation).
func (s *DeviceSession) ensureChosen(c *cuda.Ctx, b *devBlock, l int) error {
	tier := s.d.tier
	if tier == nil {
		return nil
	}
	ids, _, err := s.routing(c, 1, s.m.Cfg.NActivatedExperts)
	if err != nil {
		return err
	}
	tier.pin()
	for _, e := range ids {
		if _, err := tier.ensure(c, b, l, e); err != nil {
			return err
		}
	}
	return nil
}

// sharedExpert adds the shared expert of layer b's MoE on s.a to s.moeOut.
func (s *DeviceSession) sharedExpert(c *cuda.Ctx, b *devBlock, T int) error {
	cfg := s.m.Cfg
	st := c.Stream()
	D, I := cfg.Dim, cfg.MoEInterDim
	Is := I * cfg.NSharedExperts
	return errs(
		func() error { return c.Linear(b.shared.w1, s.eg, s.a, T, st) },
		func() error { return c.Linear(b.shared.w3, s.eu, s.a, T, st) },
		func() error { return c.SwiGLU(s.eh, s.eg, s.eu, 0, T, Is, 0, st) },
		func() error { return c.Linear(b.shared.w2, s.ey, s.eh, T, st) },
		func() error { return c.Axpy(s.moeOut, s.ey, 1, T*D, st) },
	)
}

// routing downloads the chunk's routing (ids, weights [T, K]); the copy
// synchronises the stream.
func (s *DeviceSession) routing(c *cuda.Ctx, T, K int) ([]int, []float32, error) {
	E := s.m.Cfg.NRoutedExperts
	idsB := make([]byte, 4*T*K)
	wts := make([]float32, T*K)
	if err := c.CopyFromDevice(idsB, s.ids); err != nil {
		return nil, nil, err
	}
	if err := c.CopyFloatsFromDevice(wts, s.rw); err != nil {
		return nil, nil, err
	}
	ids := make([]int, T*K)
	for i := range ids {
		ids[i] = int(int32(binary.LittleEndian.Uint32(idsB[4*i:])))
		if ids[i] < 0 || ids[i] >= E {
			return nil, nil, fmt.Errorf("router chose expert %d (token %d), want 0..%d", ids[i], i/K, E-1)
		}
	}
	return ids, wts, nil
}

// moeHost downloads the routing, records it (Options.Routes), and runs each
// used expert, in index order, on the rows routed to it.
func (s *DeviceSession) moeHost(c *cuda.Ctx, b *devBlock, T, p0 int) error {
	m := s.m
	cfg := m.Cfg
	st := c.Stream()
	D, E, K, I := cfg.Dim, cfg.NRoutedExperts, cfg.NActivatedExperts, cfg.MoEInterDim
	limit := float32(cfg.SwigluLimit)
	ids, wts, err := s.routing(c, T, K)
	if err != nil {
		return err
	}
	if m.routes != nil {
		for i := range T {
			m.routes.RecordRoute(p0+i, b.layer, ids[i*K:(i+1)*K], wts[i*K:(i+1)*K])
		}
	}
	// Rows and weights grouped by expert (index order), packed in one upload.
	start := make([]int, E+1)
	for _, e := range ids {
		start[e+1]++
	}
	for e := range E {
		start[e+1] += start[e]
	}
	fill := append([]int(nil), start[:E]...)
	rows := make([]int32, T*K)
	rw := make([]float32, T*K)
	for i := range T {
		for k := range K {
			e := ids[i*K+k]
			rows[fill[e]] = int32(i)
			rw[fill[e]] = wts[i*K+k]
			fill[e]++
		}
	}
	// The stream is idle (the download above synchronised it), so the
	// synchronous copies cannot race with kernels reading these buffers.
	if err := c.CopyToDevice(s.rows, unsafe.Slice((*byte)(unsafe.Pointer(&rows[0])), 4*len(rows))); err != nil {
		return err
	}
	if err := c.CopyFloatsToDevice(s.roww, rw); err != nil {
		return err
	}
	for e := range E {
		// A segment has distinct rows (a hash row naming an expert twice
		// puts the same token twice in a row: it starts a new segment), so
		// its scatter-add has no conflicting writes.
		for a := start[e]; a < start[e+1]; {
			z := a + 1
			for z < start[e+1] && rows[z] != rows[z-1] {
				z++
			}
			n := z - a
			var x *devExpert
			if s.d.tier != nil {
				s.d.tier.pin()
				var err error
				if x, err = s.d.tier.ensure(c, b, b.layer, e); err != nil {
					return err
				}
			} else {
				x = &b.experts[e]
			}
			r, w := off(s.rows, a), off(s.roww, a)
			if err := errs(
				func() error { return s.d.fwd.GatherRows(c, s.xe, s.a, r, n, D, st) },
				func() error { return c.Linear(x.w1, s.eg, s.xe, n, st) },
				func() error { return c.Linear(x.w3, s.eu, s.xe, n, st) },
				func() error { return c.SwiGLU(s.eh, s.eg, s.eu, w, n, I, limit, st) },
				func() error { return c.Linear(x.w2, s.ey, s.eh, n, st) },
				func() error { return s.d.fwd.ScatterAdd(c, s.moeOut, s.ey, r, n, D, st) },
			); err != nil {
				return fmt.Errorf("expert %d: %w", e, err)
			}
			a = z
		}
	}
	return nil
}
