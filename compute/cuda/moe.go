package cuda

import (
	_ "embed"
	"fmt"
	"math/bits"
	"structs"
	"sync"
	"unsafe"

	"moxie/compute"
)

//go:embed kernels/moe.cu
var moeSrc string

// MoESource returns the CUDA source of the fused MoE decode kernels and
// the Gemv MMA kernels: the whole of kernels/moe.cu, both modules'
// sections (nvcc compiles it as one unit).
func MoESource() string { return moeSrc }

// MoEModuleSources returns the sources of the two moe modules: def, the
// default module (the kernels of MoEPreferred and the gemvm_f4 Gemv MMA
// kernel), compiled on the first PrepareMoEDecode or MMA PrepareGemv;
// bench, every other variant's kernels, compiled only when one of them is
// first asked for (moeKernels).
func MoEModuleSources() (def, bench string, err error) {
	srcs, err := moeModuleSources()
	return srcs[0], srcs[1], err
}

// moeModuleSources is splitMoESource(moeSrc), computed once (a decode
// session prepares its MoE decodes and Gemv launches layer by layer).
var moeModuleSources = sync.OnceValues(func() ([2]string, error) {
	def, bench, err := splitMoESource(moeSrc)
	return [2]string{def, bench}, err
})

// splitMoESource splits a moe.cu text at its "//@module NAME" lines into
// the default module's source (common + moe) and the benchmark module's
// (common + bench). Text before the first marker is dropped.
func splitMoESource(src string) (def, bench string, err error) {
	sec, err := splitSections("moe.cu", src, "common", "moe", "bench")
	if err != nil {
		return "", "", err
	}
	return sec["common"] + sec["moe"], sec["common"] + sec["bench"], nil
}

// moeKernels stores each referenced kernel in its dst, taken from the
// default moe module (compiled, or read from the disk cache, on first use)
// or, for a kernel that module lacks, from the benchmark module, which is
// compiled only then. Errors name the module and the kernel.
func (c *Ctx) moeKernels(refs ...kernelRef) error {
	def, bench, err := MoEModuleSources()
	if err != nil {
		return err
	}
	m, err := c.Module("moe", def)
	if err != nil {
		return fmt.Errorf("cuda moe module: %w", err)
	}
	var bm *Module
	for _, r := range refs {
		k, err := m.Kernel(r.name)
		if err != nil {
			if bm == nil {
				if bm, err = c.Module("moe_bench", bench); err != nil {
					return fmt.Errorf("cuda moe_bench module (for kernel %s): %w", r.name, err)
				}
			}
			if k, err = bm.Kernel(r.name); err != nil {
				return fmt.Errorf("cuda moe: no kernel %s in either moe module: %w", r.name, err)
			}
		}
		*r.dst = k
	}
	return nil
}

// SharedExpert is an always-active expert of a MoE layer in FP8Block format:
// W1 and W3 [Is, D], W2 [D, Is], one FP8 block edge (a power of two of at
// least 64 that divides D and Is).
type SharedExpert struct {
	W1, W3, W2 *DeviceWeight
}

// MoEVariant picks the kernels of a fused MoE decode (see moeVariants).
type MoEVariant int

// The fused MoE decode variants. All use tensor cores (mma.sync with the
// weights as exact f16 and the activations split into f16 hi and lo parts);
// they differ in the MXFP4 spans (32-column scale groups) each lane loads
// before using any (U1 in stage 1, where a span means four words: w1 and w3,
// rows g and g+8; U2 in stage 2, two words), in the blocks of 256 threads
// the kernels are compiled to fit on an SM, in the E2M1 decoder, and in
// stage 1's block scheduling.
const (
	// MoEDefault: U1 8, U2 8, 2 blocks per SM, one block per 16-row tile,
	// E2M1 codes placed into f16 bits (two shift/mask steps per word, one
	// PRMT per pair; values ×2^-14, code 0.5 an f16 subnormal).
	MoEDefault MoEVariant = iota
	// MoEOcc3: U1 4, U2 16, 3 blocks per SM (at most 80 registers; more
	// warps to cover latency, fewer loads each).
	MoEOcc3
	// MoECvt: MoEDefault with the codes placed into E4M3 bytes and
	// converted by cvt.rn.f16x2.e4m3x2 (values ×2^-6, all normal f16: the
	// choice if the tensor cores' handling of f16 subnormals were to fail
	// MoEDefault's tests).
	MoECvt
	// MoEPersist: stage 1 as persistent blocks (2 per SM) that take tiles
	// from a device counter, stage x once, read the experts' records once,
	// and ask L2 for their next tile while working on the current one (U1
	// 8, FP8 spans 1); stage 2 as MoEDefault. Needs D ≤ 5632 with a shared
	// expert (x staged in both layouts: 8·D bytes of shared memory).
	MoEPersist
	// MoEPersistPF: MoEPersist whose blocks, once no tile is left, ask L2
	// for an even share of stage 2's weights (K·w2 + shared w2: 35 MB at V4
	// shapes, in a 60 MB L2), so HBM keeps streaming through stage 1's tail
	// and stage 2 reads from L2.
	MoEPersistPF
	// MoEWide: the wide family (kernels/moe.cu): each lane loads a whole
	// MXFP4 span (16 bytes) of rows g and g+8, a warp 8 rows x 64 contiguous
	// bytes per load (the others: 8 rows x 16 bytes with 4-byte loads), the
	// four spans of a 128-column group kept apart in the mma's N dimension
	// (one scale FMA per group and row instead of per span), two chunks of
	// loads in flight per warp. Stage 1: G 2 groups a chunk (a routed tile's
	// warp issues its whole share, 16 spans at D 4096, before computing);
	// stage 2: G 4, with h copied into shared memory once per block (4·(K·I
	// + Is) bytes: K·I + Is up to 40,960). FP8 shared expert as MoEDefault.
	// 128 registers a thread in both kernels.
	MoEWide
	// MoEWide1: MoEWide with half the loads in flight per warp (stage 1 G
	// 1, stage 2 G 2; 105 and 90 registers), should MoEWide's register
	// pressure cost more than the deeper queue gains.
	MoEWide1
	// MoEWidePF: MoEWide whose stage 1 last wave (the last 2·SMs blocks)
	// asks L2 for stage 2's weights after its tiles (K·w2 + shared w2: 35
	// MB at V4 shapes), so HBM streams through stage 1's tail and stage 2
	// reads from L2 (the same idea as MoEPersistPF without the persistent
	// blocks). Only the pair of stages gains: time it with both.
	MoEWidePF
	// MoEWideP: MoEPersist's stage 1 (persistent blocks taking tiles from
	// a counter, x staged once per block, the next tile asked into L2) with
	// the wide family's routed tiles (G 1, FP8 spans 1); stage 2 as
	// MoEWide. Same model-dim limit as MoEPersist.
	MoEWideP
	// MoEWide3: MoEWide's stage 1 compiled for 3 blocks an SM (G 1, FP8
	// spans 1, at most 80 registers: more warps and blocks to overlap each
	// block's setup and latency, fewer loads each); stage 2 as MoEWide.
	MoEWide3
	// MoEWide1S: MoEWide1 whose routed stage-1 tiles stage their E8M0
	// scales (16 rows of w1 and w3: D bytes) in shared memory once per
	// block, coalesced and transposed so that a lane reads the four scale
	// bytes it needs for a group (w1 and w3, rows g and g+8) with one 4-byte
	// shared load, instead of four 1-byte global loads per group (as many
	// as its 16-byte weight loads); stage 2 as MoEWide1. Dynamic shared
	// memory 5·D bytes: D up to 8,960.
	MoEWide1S
	// MoEWide1SS: MoEWide1S whose stage 2 stages the K experts' w2 scales
	// of its 16 rows in shared memory too (K·ceil(I/256)·128 bytes beside
	// h, transposed: one 4-byte shared load per lane and pair of groups
	// instead of four 1-byte global loads).
	MoEWide1SS
	// MoEWide1A: MoEWide1SS whose routed stage-1 tiles copy their weights
	// into shared memory by cp.async (each lane the 16-byte spans it reads,
	// its warp's whole range in flight at once: the tile's 64 KB at V4
	// shapes, against 32 KB of register loads in MoEWide1) and compute each
	// group once its copies land. Dynamic shared memory 5·D + 8·ceil(D/1024)
	// ·2048 bytes (86 KB at D 4096; two blocks an SM). Its stage 2 is
	// MoEWide1SS's whose warps first ask L2 for their whole routed range
	// (the block's 96 KB of routed w2 requested at once).
	MoEWide1A
	// MoEWide1P: MoEWide1SS whose warps, in both stages, first ask L2 for
	// their whole routed range (prefetch hints: stage 1 a warp's 16 rows
	// of w1 and w3, 8 KB at V4 shapes; stage 2 as MoEWide1A's), then load
	// from it as MoEWide1SS: MoEWide1A's deeper queue without its shared
	// memory.
	MoEWide1P
	// MoELean: the lean family (kernels/moe.cu): the wide family's
	// fragments without block-wide setup before the weights stream. Stage 1
	// in blocks of 4 warps, one per 16-row tile, compiled for 7 blocks an
	// SM (at most 72 registers: the 896 blocks of V4 shapes all resident at
	// once on an H200), each warp converting only its own quarter of x to
	// hi/lo f16, and staging its scales, in its own shared memory (no
	// barrier) while its first two chunks of weights fly; stage 2 in blocks of 16 warps (one per 16
	// output rows, two an SM, at most 64 registers), each warp a contiguous
	// share of the block's 1 KB units (K experts' MXFP4 groups, then the
	// shared expert's FP8 spans), the h columns of each chunk copied by
	// cp.async into the warp's ring slot as the chunk's weight loads issue
	// (no per-block copy of h). Dynamic shared memory of stage 1: x's
	// hi/lo and the routed scales, 20 KB at D 4096 (moeLean1Smem).
	MoELean
	// MoELeanPF: MoELean whose warps, in both stages, first ask L2 for
	// their whole routed range (prefetch hints, a few a lane), so every
	// byte of a warp's share is in flight at once rather than two chunks
	// (plus each row's 256-byte L2 fetch) at a time.
	MoELeanPF
	// MoELeanX: MoELean whose stage-1 shared-expert tiles do not wait for
	// the kernel launched just before on the stream (programmatic
	// dependent launch; MOXIE_PDL_UNLESS in module.go), so the shared
	// expert's w1 and w3 stream while that kernel (the routing) still runs.
	// Contract: x must not be written by the kernel launched just before
	// the MoE decode on its stream (in a decode step x is the HC
	// boundary's output, two or more kernels back), and that kernel must
	// start every block with a wait (MOXIE_PDL or MOXIE_PDL_PF), as every
	// moxie kernel but this one does.
	MoELeanX
	// MoELeanX2: MoELeanX whose stage 2 spreads each 16-row group's units
	// over 3 blocks of 4 warps (moe2s: 768 blocks at V4 shapes, all
	// resident at 6 an SM, at most 85 registers) taking 2 units a chunk (4
	// KB in flight a warp against MoELean's 2 KB), the blocks' partial
	// sums combined in a fixed order by the group's last block to arrive
	// (an atomic ticket a group that it resets). Scratch: h plus
	// moeSplitBytes(D) (partials and tickets; MoEDecodeScratch counts it).
	MoELeanX2
	// MoELeanX2P: MoELeanX2 whose stage-2 warps first ask L2 for their
	// whole routed range (as MoELeanPF's).
	MoELeanX2P
	// MoELeanXG2: MoELeanX whose stage 2 takes 2 units a chunk (two
	// chunks, 4 KB a warp, in flight; one block of 16 warps an SM, at most
	// 128 registers), the lesson of the Gemv MMA kernels (gemvm_f4, 256
	// bytes a lane in flight, beat 64 and 128). (4 units a chunk would
	// need 66 KB of static shared memory for the h ring: not built.)
	MoELeanXG2
	// MoELeanX1G2: MoELeanX whose stage 1 takes 2 routed groups (and 2
	// shared FP8 spans) a chunk (two chunks, 256 bytes a lane, in flight),
	// compiled for 4 blocks an SM (119 registers; at 5 it spills);
	// MoELeanX1G4: 4 a chunk, 2 blocks an SM (193 registers; at 3 it
	// spills); MoELeanX1G2G2: MoELeanX1G2's stage 1 with MoELeanXG2's stage 2.
	MoELeanX1G2
	MoELeanX1G4
	MoELeanX1G2G2
	// MoELeanXE: MoELeanX whose stage 2 (moe2le) reads the ids and expert
	// records and asks L2 for each warp's whole range before it waits for
	// stage 1, so that prologue overlaps stage 1's tail. The ids are read
	// two kernels after the routing wrote them: the stage 1 in front must
	// have blocks that wait (moe1lx's routed tiles do).
	MoELeanXE
	// MoELeanXW8G4: MoELeanX whose stage 2 has 8-warp blocks, one per 16
	// output rows (a warp 16 units at V4 shapes), 4 units a chunk (256
	// bytes a lane in flight), two blocks an SM: the shape of the
	// tensor-core Gemv's best kernel (gemvm_f4). MoELeanXW8G2: 2 units a
	// chunk. On the H200 (session 6) stage 2 took 18.58 and 17.83 us
	// against MoELeanX's 17.27: not adopted. Checked in the host
	// emulation; TestMoEDecode has not yet run them on a GPU.
	MoELeanXW8G4
	MoELeanXW8G2
	// MoELeanXW: MoELeanX whose stage 2 (moe2lw; moe2lhw with the
	// boundary's epilogue) waits inside: its blocks read the expert ids
	// and records, and each routed warp issues its first two chunks of
	// weight loads, before the PDL wait, as the tensor-core Gemv does; h
	// is copied after it. The ids are read two kernels after the routing
	// wrote them, as MoELeanXE's are. In a microbenchmark on the H200
	// (session 14: both stages in a PDL graph, V4-Flash shapes, per-launch
	// weights beyond L2) the pair took 41.9 us against MoELeanX's 44.7.
	MoELeanXW
	// MoELeanXWR: MoELeanXW whose stage 1 (moe1lxr) loads each routed
	// warp's first scale words into registers before it stages x and
	// stores them after, so that the two latencies overlap (in the
	// knock-out microbenchmark, session 14, stage 1 without its scale
	// staging took 24.5 us against 27.0; loading the scales beside every
	// chunk's weights instead, leanxws, was slower: 30.0). Measured in
	// session 15: slower (stage 1 28.12 against 27.51 us, the 8-layer step
	// 1.2925 against 1.2735 ms); kept for the benchmark.
	MoELeanXWR
	// MoELeanXWH: MoELeanXW whose stage 1 (moe1lxh) splits each
	// shared-expert tile into two column halves, one a block, so that a
	// shared warp's range (FP8: twice a routed row's bytes a column) is as
	// long as a routed warp's; the second half to arrive adds the two
	// halves' sums (in half order: bitwise reproducible, though not
	// MoELeanXW's bits, whose warps sum a quarter of the columns each).
	// Scratch: h plus sh1HalfBytes (partials and tickets). Measured in
	// session 15: slower (stage 1 28.09 against 27.42 us; the 8-layer step
	// slower in three pairs): the routed tiles, not the shared ones, are
	// stage 1's critical path. Kept for the benchmark.
	MoELeanXWH
	moeVariantCount
)

// moeVariants: kernel parameters of each MoEVariant (U1, U2 routed spans
// per chunk, UF1, UF2 the FP8 shared expert's 64-column spans per chunk,
// DEC the decoder, B blocks per SM (B2 stage 2's when not 0), persist:
// stage 1 persistent, pf: and prefetching stage 2's weights (wide: from
// stage 1's last wave); wide: the wide family, U1 and U2 then its 4-span
// groups per chunk; ss, ss2: stage 1's routed scales, stage 2's, staged in
// shared memory; async: stage 1's routed weights copied into shared memory
// by cp.async, U1 unused; pfr: stage 2's warps, and without async stage
// 1's, ask L2 for their whole routed range first; lean: the lean family,
// stage 1 of blocks of moeLean1Threads, stage 2 of moeLean2Threads with U2
// its routed units a chunk and UF2 (at most 2·U2) its FP8 spans).
var moeVariants = [moeVariantCount]struct {
	name    string
	u1, uf1 int
	u2, uf2 int
	dec, b  int
	b2      int
	persist bool
	pf      bool
	wide    bool
	ss, ss2 bool
	async   bool
	pfr     bool
	lean    bool
	early   bool
	early2  bool // lean stage 2 that waits inside (moe2le)
	ew      bool // lean stage 2 with its first weights before the wait (moe2lw)
	sr      bool // lean stage 1 with its scale loads overlapping its x staging (moe1lxr)
	sh2     bool // lean stage 1 with the shared tiles in column halves (moe1lxh)
	split   int  // lean stage 2 split over this many blocks a row group (moe2s), of nw warps
	nw      int
}{
	MoEDefault:    {name: "u8", u1: 8, uf1: 2, u2: 8, uf2: 4, b: 2},
	MoEOcc3:       {name: "occ3", u1: 4, uf1: 1, u2: 16, uf2: 4, b: 3},
	MoECvt:        {name: "u8cvt", u1: 8, uf1: 2, u2: 8, uf2: 4, dec: 1, b: 2},
	MoEPersist:    {name: "persist", u1: 8, uf1: 1, u2: 8, uf2: 4, b: 2, persist: true},
	MoEPersistPF:  {name: "persistpf", u1: 8, uf1: 1, u2: 8, uf2: 4, b: 2, persist: true, pf: true},
	MoEWide:       {name: "wide", u1: 2, uf1: 2, u2: 4, uf2: 4, b: 2, wide: true},
	MoEWide1:      {name: "wide1", u1: 1, uf1: 2, u2: 2, uf2: 4, b: 2, wide: true},
	MoEWidePF:     {name: "widepf", u1: 2, uf1: 2, u2: 4, uf2: 4, b: 2, wide: true, pf: true},
	MoEWideP:      {name: "widep", u1: 1, uf1: 1, u2: 4, uf2: 4, b: 2, wide: true, persist: true},
	MoEWide3:      {name: "wide3", u1: 1, uf1: 1, u2: 4, uf2: 4, b: 3, b2: 2, wide: true},
	MoEWide1S:     {name: "wide1s", u1: 1, uf1: 2, u2: 2, uf2: 4, b: 2, wide: true, ss: true},
	MoEWide1SS:    {name: "wide1ss", u1: 1, uf1: 2, u2: 2, uf2: 4, b: 2, wide: true, ss: true, ss2: true},
	MoEWide1P:     {name: "wide1p", u1: 1, uf1: 2, u2: 2, uf2: 4, b: 2, wide: true, ss: true, ss2: true, pfr: true},
	MoEWide1A:     {name: "wide1a", u1: 1, uf1: 2, u2: 2, uf2: 4, b: 2, wide: true, ss: true, ss2: true, async: true, pfr: true},
	MoELean:       {name: "lean", u1: 1, uf1: 1, u2: 1, uf2: 1, b: 7, b2: 2, lean: true},
	MoELeanPF:     {name: "leanpf", u1: 1, uf1: 1, u2: 1, uf2: 1, b: 7, b2: 2, lean: true, pfr: true},
	MoELeanX:      {name: "leanx", u1: 1, uf1: 1, u2: 1, uf2: 1, b: 7, b2: 2, lean: true, early: true},
	MoELeanX2:     {name: "leanx2", u1: 1, uf1: 1, u2: 2, uf2: 2, b: 7, b2: 6, lean: true, early: true, split: 3, nw: 4},
	MoELeanX2P:    {name: "leanx2p", u1: 1, uf1: 1, u2: 2, uf2: 2, b: 7, b2: 6, lean: true, early: true, pfr: true, split: 3, nw: 4},
	MoELeanXG2:    {name: "leanxg2", u1: 1, uf1: 1, u2: 2, uf2: 2, b: 7, b2: 1, lean: true, early: true},
	MoELeanX1G2:   {name: "leanx1g2", u1: 2, uf1: 2, u2: 1, uf2: 1, b: 4, b2: 2, lean: true, early: true},
	MoELeanX1G4:   {name: "leanx1g4", u1: 4, uf1: 4, u2: 1, uf2: 1, b: 2, b2: 2, lean: true, early: true},
	MoELeanX1G2G2: {name: "leanx1g2g2", u1: 2, uf1: 2, u2: 2, uf2: 2, b: 4, b2: 1, lean: true, early: true},
	MoELeanXE:     {name: "leanxe", u1: 1, uf1: 1, u2: 1, uf2: 1, b: 7, b2: 2, lean: true, early: true, early2: true},
	MoELeanXW8G4:  {name: "leanxw8g4", u1: 1, uf1: 1, u2: 4, uf2: 4, b: 7, b2: 2, lean: true, early: true, split: 1, nw: 8},
	MoELeanXW8G2:  {name: "leanxw8g2", u1: 1, uf1: 1, u2: 2, uf2: 2, b: 7, b2: 2, lean: true, early: true, split: 1, nw: 8},
	MoELeanXW:     {name: "leanxw", u1: 1, uf1: 1, u2: 1, uf2: 1, b: 7, b2: 2, lean: true, early: true, ew: true},
	MoELeanXWR:    {name: "leanxwr", u1: 1, uf1: 1, u2: 1, uf2: 1, b: 7, b2: 2, lean: true, early: true, ew: true, sr: true},
	MoELeanXWH:    {name: "leanxwh", u1: 1, uf1: 1, u2: 1, uf2: 1, b: 7, b2: 2, lean: true, early: true, ew: true, sh2: true},
}

func (v MoEVariant) String() string {
	if v < 0 || v >= moeVariantCount {
		return fmt.Sprintf("MoEVariant(%d)", int(v))
	}
	return moeVariants[v].name
}

// MoEPreferred is the variant ParseMoEVariant("") picks, i.e. the one a
// decode session runs unless told otherwise: the fastest variant measured
// correct on the GPU (promoting another is this one line). On the H200
// (2026-11-30, BenchmarkMoEDecode, V4-Flash shapes, both stages replayed as
// a graph) wide1 took 53.2 us against u8's 60.4 (43% of HBM against 38%);
// in session 5 lean 48.9 and leanx 45.9, and the 8-layer decode step 1.61
// ms (wide1), 1.59 (lean), 1.55 (leanx); in session 14 leanxw 41.9 against
// leanx's 44.9, the 8-layer step at a 4k context 1.284 against 1.308 ms
// (three alternating pairs, faster in each). leanxw carries leanx's
// contract on its caller (see MoELeanX: x is not written by the kernel
// just before) and MoELeanXE's (stage 1 and stage 2 launched back to back
// on one stream, nothing between them writing the ids or the tables).
const MoEPreferred = MoELeanXW

// ParseMoEVariant returns the variant named s (its String form: u8, occ3,
// u8cvt, persist, persistpf, wide, wide1, widepf, widep, wide3, wide1s,
// wide1ss, wide1a, wide1p, lean, leanpf, leanx, leanx2, leanx2p, leanxg2, leanx1g2, leanx1g4, leanx1g2g2, leanxe, leanxw8g4, leanxw8g2, leanxw, leanxwr; "" is MoEPreferred), e.g. from an environment
// variable.
func ParseMoEVariant(s string) (MoEVariant, error) {
	if s == "" {
		return MoEPreferred, nil
	}
	names := make([]string, 0, moeVariantCount)
	for v := range moeVariantCount {
		if moeVariants[v].name == s {
			return v, nil
		}
		names = append(names, moeVariants[v].name)
	}
	return 0, fmt.Errorf("cuda moe decode: unknown variant %q (want one of %v)", s, names)
}

// moeKernelNames returns the stage 1 and stage 2 kernel names of v.
func moeKernelNames(v MoEVariant) (string, string) {
	p := moeVariants[v]
	b2 := p.b
	if p.b2 != 0 {
		b2 = p.b2
	}
	if p.lean && p.split > 0 {
		s2 := "moe2s"
		if p.pfr {
			s2 = "moe2sp"
		}
		return fmt.Sprintf("moe1lx_d%d_b%d", p.dec, p.b), fmt.Sprintf("%s_g%d_f%d_d%d_w%d_s%d_b%d", s2, p.u2, p.uf2, p.dec, p.nw, p.split, b2)
	}
	if p.lean {
		s1, s2 := "moe1l", "moe2l"
		switch {
		case p.pfr:
			s1, s2 = "moe1lp", "moe2lp"
		case p.early && p.u1 > 1:
			s1 = fmt.Sprintf("moe1lx_g%d", p.u1)
		case p.early && p.sr:
			s1 = "moe1lxr"
		case p.early && p.sh2:
			s1 = "moe1lxh"
		case p.early:
			s1 = "moe1lx"
		}
		if p.early2 {
			s2 = "moe2le"
		}
		if p.ew {
			s2 = "moe2lw"
		}
		return fmt.Sprintf("%s_d%d_b%d", s1, p.dec, p.b), fmt.Sprintf("%s_g%d_f%d_d%d_b%d", s2, p.u2, p.uf2, p.dec, b2)
	}
	if p.wide {
		s1 := "moe1w"
		switch {
		case p.persist:
			s1 = "moe1wp"
		case p.pf:
			s1 = "moe1wpf"
		case p.ss && p.pfr:
			s1 = "moe1wsp"
		case p.ss:
			s1 = "moe1ws"
		}
		s2 := "moe2w"
		switch {
		case p.ss2 && p.pfr:
			s2 = "moe2wsp"
		case p.ss2:
			s2 = "moe2ws"
		}
		n2 := fmt.Sprintf("%s_g%d_f%d_d%d_b%d", s2, p.u2, p.uf2, p.dec, b2)
		if p.async {
			return fmt.Sprintf("moe1wa_f%d_d%d_b%d", p.uf1, p.dec, p.b), n2
		}
		return fmt.Sprintf("%s_g%d_f%d_d%d_b%d", s1, p.u1, p.uf1, p.dec, p.b), n2
	}
	s1 := "moe1"
	switch {
	case p.pf:
		s1 = "moe1pf"
	case p.persist:
		s1 = "moe1p"
	}
	return fmt.Sprintf("%s_u%d_f%d_d%d_b%d", s1, p.u1, p.uf1, p.dec, p.b), fmt.Sprintf("moe2_u%d_f%d_d%d_b%d", p.u2, p.uf2, p.dec, b2)
}

// moeThreads is MOE_THREADS in kernels/moe.cu.
const moeThreads = 256

// moeLean1Threads and moeLean2Threads are the lean family's block sizes
// (32·LEAN1_WARPS, 32·LEAN2_WARPS in kernels/moe.cu).
const (
	moeLean1Threads = 128
	moeLean2Threads = 512
)

// moeLean1Smem is the lean stage 1's dynamic shared memory, bytes: per
// warp (4) x as hi/lo f16 over lean1_width(D) columns (4 bytes each) and
// lean1_groups(D) groups of transposed scales (128 bytes each), as
// kernels/moe.cu lays it out. 16 KB + 4 KB at D 4096.
func moeLean1Smem(D int) int {
	w := max((D/128+3)/4*128, (D/64+3)/4*64)
	p := (D/128 + 3) / 4
	return 4 * (4*w + 128*p)
}

// threads returns the block sizes of v's stage 1 and stage 2 kernels.
func (v MoEVariant) threads() (uint32, uint32) {
	if p := moeVariants[v]; p.split > 0 {
		return moeLean1Threads, uint32(32 * p.nw)
	} else if p.lean {
		return moeLean1Threads, moeLean2Threads
	}
	return moeThreads, moeThreads
}

// moeStatic bounds the stage 1 kernels' static shared memory (red; the
// persistent one also the records and the tile ring: 3600 bytes), bytes.
const moeStatic = 4 << 10

// moeMaxK bounds the experts of one fused launch.
const moeMaxK = 64

// moeWideH bounds the wide stage 2's copy of h in dynamic shared memory,
// bytes (4·(K·I + Is); 57,344 at V4-Flash shapes): below sm_90's 227 KiB
// opt-in with the static part beside it (two blocks an SM fit up to about
// 110 KiB, one above).
const moeWideH = 160 << 10

// moeArgs mirrors struct MoeArgs in kernels/moe.cu (200 bytes; the .cu
// file asserts the size).
type moeArgs struct {
	_                                                   structs.HostLayout
	T13, T2, Ids, Rw, X, H, Out, S1, S3, S2, C1, C3, C2 uint64
	E, K, D, I, Is, Bshift                              int32
	Limit                                               float32
	Part                                                uint64
	HC                                                  hcEpiArgs // the boundary's epilogue (moe2lh; HC.NM 0 elsewhere): see HCEpilogue
}

// moeSplitMax bounds the blocks a row group of any split stage-2 variant
// (moeVariants' split), for MoEDecodeScratch.
const moeSplitMax = 3

// moeSplitBytes is a split stage 2's scratch beyond h, bytes: sp·D float32
// partial sums, then D/16 uint32 tickets.
func moeSplitBytes(sp, D int) int { return 4*sp*D + 4*(D/16) }

// sh1HalfBytes is the scratch beyond h of a stage 1 with the shared tiles in
// column halves (MoELeanXWH), bytes: 32 float32 sums a half (16 rows of w1,
// then of w3), two halves a 16-row tile of the shared expert's is rows,
// then a uint32 ticket a tile (kernels/moe.cu stage1_finish_half).
func sh1HalfBytes(is int) int { return 4*64*(is/16) + 4*(is/16) }

// MoEDecode is a prepared fused MoE decode step for one token: the routed
// experts of an ExpertTable selected on the device (ids), SwiGLU with the
// route weights, and the optional shared expert, in two kernel launches
// (RunMoEDecode). It holds no host state that a run changes, so runs can be
// captured in a CUDA graph.
type MoEDecode struct {
	args         moeArgs
	k1, k2       *Kernel
	kh           *Kernel // stage 2 with the boundary's epilogue (moe2lh), where the variant has one
	grid1, grid2 Dim3
	smem1, smem2 int
	ctr          DevicePtr // persistent stage 1: its tile counter (two int32)
	h            DevicePtr
	hBytes       int
	variant      MoEVariant
	// Bytes1 and Bytes2 are the weight bytes (data and scales) one run's
	// stage 1 (w1, w3) and stage 2 (w2) read, for bandwidth figures.
	Bytes1, Bytes2 int
}

// moeShapes validates a fused MoE decode's inputs without a device and
// returns the shared expert's width Is (0 without one) and FP8 block shift.
func moeShapes(t *ExpertTable, K int, sh *SharedExpert, limit float32, v MoEVariant) (is, bshift int, err error) {
	switch {
	case t == nil || t.w1 == nil || t.w3 == nil || t.w2 == nil:
		return 0, 0, fmt.Errorf("cuda moe decode: no expert table")
	case v < 0 || v >= moeVariantCount:
		return 0, 0, fmt.Errorf("cuda moe decode: unknown variant %d (want 0..%d)", int(v), int(moeVariantCount)-1)
	case t.w1.Format != compute.MXFP4 || t.w3.Format != compute.MXFP4 || t.w2.Format != compute.MXFP4:
		return 0, 0, fmt.Errorf("cuda moe decode: routed experts are %v/%v/%v, want %v", t.w1.Format, t.w3.Format, t.w2.Format, compute.MXFP4)
	case K <= 0 || K > moeMaxK:
		return 0, 0, fmt.Errorf("cuda moe decode: K %d, want 1..%d", K, moeMaxK)
	case t.Dim <= 0 || t.Dim%128 != 0 || 4*t.Dim+moeStatic > maxStaticShared:
		return 0, 0, fmt.Errorf("cuda moe decode: model dim %d, want a positive multiple of 128 up to %d", t.Dim, (maxStaticShared-moeStatic)/4/128*128)
	case t.Inter <= 0 || t.Inter%128 != 0:
		return 0, 0, fmt.Errorf("cuda moe decode: expert width %d, want a positive multiple of 128", t.Inter)
	case !(limit >= 0) || limit > 3.4e38:
		return 0, 0, fmt.Errorf("cuda moe decode: limit %g, want a finite value >= 0 (0: no clamp)", limit)
	}
	if moeVariants[v].ss && 5*t.Dim+moeStatic > maxStaticShared {
		return 0, 0, fmt.Errorf("cuda moe decode: variant %v stages x and the scales (5·D bytes): model dim up to %d, not %d", v, (maxStaticShared-moeStatic)/5/128*128, t.Dim)
	}
	if sh == nil {
		return 0, 0, moeWideFits(v, K, t.Inter, 0)
	}
	if sh.W1 == nil || sh.W3 == nil || sh.W2 == nil {
		return 0, 0, fmt.Errorf("cuda moe decode: shared expert lacks a weight (w1 %v, w3 %v, w2 %v)", sh.W1 != nil, sh.W3 != nil, sh.W2 != nil)
	}
	D := t.Dim
	is = sh.W1.Rows
	blk := sh.W1.Block
	for i, w := range []*DeviceWeight{sh.W1, sh.W3, sh.W2} {
		name := [...]string{"w1", "w3", "w2"}[i]
		rows, cols := is, D
		if i == 2 {
			rows, cols = D, is
		}
		switch {
		case w.Format != compute.FP8Block:
			return 0, 0, fmt.Errorf("cuda moe decode: shared expert %s is %v, want %v", name, w.Format, compute.FP8Block)
		case w.Block != blk:
			return 0, 0, fmt.Errorf("cuda moe decode: shared expert %s has FP8 blocks of %d, w1 of %d", name, w.Block, blk)
		case w.Rows != rows || w.Cols != cols:
			return 0, 0, fmt.Errorf("cuda moe decode: shared expert %s is [%d, %d], want [%d, %d]", name, w.Rows, w.Cols, rows, cols)
		}
	}
	if moeVariants[v].persist && 8*D+moeStatic > maxStaticShared {
		return 0, 0, fmt.Errorf("cuda moe decode: variant %v with a shared expert takes a model dim up to %d, not %d", v, (maxStaticShared-moeStatic)/8/128*128, D)
	}
	switch {
	case blk < 64 || blk&(blk-1) != 0 || D%blk != 0:
		return 0, 0, fmt.Errorf("cuda moe decode: shared expert FP8 block %d, want a power of two >= 64 dividing the model dim %d", blk, D)
	case is <= 0 || is%128 != 0 || is%blk != 0:
		return 0, 0, fmt.Errorf("cuda moe decode: shared expert width %d, want a positive multiple of 128 and of its block %d", is, blk)
	}
	if err := moeWideFits(v, K, t.Inter, is); err != nil {
		return 0, 0, err
	}
	return is, bits.TrailingZeros(uint(blk)), nil
}

// moeWideFits checks that the wide stage 2's copy of h (K routed rows of
// width I, the shared row of width is), and with ss2 the staged scales,
// fits moeWideH; other variants fit.
func moeWideFits(v MoEVariant, K, I, is int) error {
	if n := moeWideSmem2(v, K, I, is); moeVariants[v].wide && n > moeWideH {
		return fmt.Errorf("cuda moe decode: variant %v keeps h in shared memory, %d bytes for K %d x width %d + shared %d, over %d", v, n, K, I, is, moeWideH)
	}
	return nil
}

// moeWideSmem2 is the wide stage 2's dynamic shared memory, bytes: h
// (4·(K·I + is)) and with ss2 the K experts' staged scales (K·ceil(I/256)
// pairs of groups, 128 bytes each).
func moeWideSmem2(v MoEVariant, K, I, is int) int {
	n := 4 * (K*I + is)
	if moeVariants[v].ss2 {
		n += K * ((I + 255) / 256) * 128
	}
	return n
}

// moeAligned checks the alignment the kernels' wide loads need: weight data
// 16 bytes, MXFP4 scales 4 bytes (expert 0 of t stands for every expert).
func moeAligned(t *ExpertTable, sh *SharedExpert) error {
	ws := []*DeviceWeight{t.w1, t.w3, t.w2}
	if sh != nil {
		ws = append(ws, sh.W1, sh.W3, sh.W2)
	}
	for i, w := range ws {
		if w.Data%16 != 0 || w.Scale%4 != 0 {
			return fmt.Errorf("cuda moe decode: weight %d (%v [%d, %d]) at data %#x, scales %#x: want data 16-byte and scales 4-byte aligned", i, w.Format, w.Rows, w.Cols, w.Data, w.Scale)
		}
	}
	return nil
}

// MoEDecodeScratch returns the most bytes of device scratch a fused MoE
// decode of K experts over t (and shared expert sh, or nil) allocates in
// one allocation, for any variant: h, and for a split stage 2 (MoELeanX2,
// MoELeanX2P) its partial sums and tickets.
func MoEDecodeScratch(t *ExpertTable, K int, sh *SharedExpert) int {
	is := 0
	if sh != nil && sh.W1 != nil {
		is = sh.W1.Rows
	}
	return moeHBytes(t, K, sh) + max(moeSplitBytes(moeSplitMax, t.Dim), sh1HalfBytes(is))
}

// moeHBytes is h's bytes: K routed rows of I and the shared row of Is,
// each as hi/lo f16.
func moeHBytes(t *ExpertTable, K int, sh *SharedExpert) int {
	is := 0
	if sh != nil && sh.W1 != nil {
		is = sh.W1.Rows
	}
	return 4 * (K*t.Inter + is)
}

// PrepareMoEDecode validates and prepares the fused MoE decode of one token
// over table t (MXFP4 experts, w1/w3 [I, D], w2 [D, I]; D and I multiples of
// 128, D at most 11,264): each run computes, for the K experts ids[k],
//
//	out[d] = Σ_k (w2_{ids[k]} · h_k)[d] + (sh.W2 · h_s)[d]
//	h_k = SwiGLU(w1_{ids[k]}·x, w3_{ids[k]}·x) · rw[k]  (SwiGLU op semantics, clamp limit)
//	h_s = silu(sh.W1·x)·(sh.W3·x)                        (no clamp, no route weight)
//
// with x [D] and out [D] float32 device buffers the caller owns (out is
// written, not accumulated; x and out must not overlap; the sum's order is
// fixed, so results are bitwise reproducible). limit 0 means no clamp; sh
// nil means no shared expert. The h scratch (at most MoEDecodeScratch bytes, plus 8
// for a persistent variant's tile counter: MoEPersist, MoEPersistPF,
// MoEWideP) is allocated in a and lives as long as the arena allocation.
// The kernels read t's records at run time, so SetTableExpert /
// CopyTableExpert repointing works, provided every weight put into t is
// MXFP4 of t's shape with its data 16-byte and its scales 4-byte aligned
// (arena allocations are). The wide variants (MoEWide, MoEWide1,
// MoEWidePF, MoEWideP, MoEWide3, MoEWide1S) take K·I + Is up to 40,960
// (MoEWide1SS, MoEWide1A and MoEWide1P a little less: 4·(K·I + Is) +
// K·ceil(I/256)·128 bytes up to 160 KiB); MoEWide1S, MoEWide1SS, MoEWide1A
// and MoEWide1P take D up to 8,960. MoELean and MoELeanPF take every shape
// above (no copy of h in shared memory; stage 1's shared memory is
// moeLean1Smem(D), above the default 48 KiB from D 9,856, then opted in).
// Activations x and h must stay below 65504 in magnitude (f16 hi parts).
func (c *Ctx) PrepareMoEDecode(a *Arena, t *ExpertTable, K int, sh *SharedExpert, x, out DevicePtr, limit float32, v MoEVariant) (*MoEDecode, error) {
	is, bshift, err := moeShapes(t, K, sh, limit, v)
	if err != nil {
		return nil, err
	}
	if x == 0 || out == 0 || x%16 != 0 || out%4 != 0 {
		return nil, fmt.Errorf("cuda moe decode: x %#x, out %#x: want non-null buffers, x 16-byte aligned", x, out)
	}
	if err := moeAligned(t, sh); err != nil {
		return nil, err
	}
	n1, n2 := moeKernelNames(v)
	m := &MoEDecode{variant: v, hBytes: moeHBytes(t, K, sh)}
	split := moeVariants[v].split
	if split > 1 { // a partial sum a block, then tickets (split 1: moe2s's body, one block a row group)
		m.hBytes += moeSplitBytes(split, t.Dim)
	}
	sh2 := moeVariants[v].sh2 && is > 0
	if sh2 {
		m.hBytes += sh1HalfBytes(is)
	}
	refs := []kernelRef{{n1, &m.k1}, {n2, &m.k2}}
	if nh := moeHCKernelName(v); nh != "" {
		refs = append(refs, kernelRef{nh, &m.kh})
	}
	if err := c.moeKernels(refs...); err != nil {
		return nil, err
	}
	if m.h, err = a.Alloc(m.hBytes); err != nil {
		return nil, fmt.Errorf("cuda moe decode: scratch h of %d bytes: %w", m.hBytes, err)
	}
	D, I := t.Dim, t.Inter
	m.args = moeArgs{T13: uint64(t.all13.args), T2: uint64(t.all2.args), X: uint64(x), H: uint64(m.h), Out: uint64(out),
		E: int32(t.E), K: int32(K), D: int32(D), I: int32(I), Is: int32(is), Bshift: int32(bshift), Limit: limit}
	m.Bytes1 = K * (t.w1.Bytes + t.w3.Bytes)
	m.Bytes2 = K * t.w2.Bytes
	if sh != nil {
		m.args.S1, m.args.S3, m.args.S2 = uint64(sh.W1.Data), uint64(sh.W3.Data), uint64(sh.W2.Data)
		m.args.C1, m.args.C3, m.args.C2 = uint64(sh.W1.Scale), uint64(sh.W3.Scale), uint64(sh.W2.Scale)
		m.Bytes1 += sh.W1.Bytes + sh.W3.Bytes
		m.Bytes2 += sh.W2.Bytes
	}
	tiles := is/16 + K*I/16
	m.grid1 = Dim3{X: uint32(tiles)}
	if sh2 {
		m.grid1.X += uint32(is / 16) // each shared tile in two blocks
		hb := moeHBytes(t, K, sh)
		m.args.Part = uint64(m.h) + uint64(hb)
		// The tickets start at zero; the kernel leaves them so.
		if err := c.CopyToDevice(m.h+DevicePtr(hb), make([]byte, sh1HalfBytes(is))); err != nil {
			_ = a.Free(m.h)
			return nil, err
		}
	}
	m.grid2 = Dim3{X: uint32(D / 16)}
	if split > 1 {
		m.grid2.X *= uint32(split)
		hb := moeHBytes(t, K, sh)
		m.args.Part = uint64(m.h) + uint64(hb)
		// The tickets (and partials) start at zero; the kernel leaves them so.
		if err := c.CopyToDevice(m.h+DevicePtr(hb), make([]byte, moeSplitBytes(split, D))); err != nil {
			_ = a.Free(m.h)
			return nil, err
		}
	}
	m.smem1 = 4 * D
	if p := moeVariants[v]; p.async {
		m.smem1 = 5*D + 8*((D+1023)/1024)*2048
		if err := c.raiseDynamicShared(m.k1, m.smem1); err != nil {
			_ = a.Free(m.h)
			return nil, fmt.Errorf("cuda moe decode: %w", err)
		}
	} else if p.ss {
		m.smem1 = 5 * D
	} else if p.lean {
		// Above the default 48 KiB (D from 9,856) all the opt-in room, so
		// that a decode prepared later with a smaller D does not lower the
		// limit under this one.
		if m.smem1 = moeLean1Smem(D); m.smem1 > maxStaticShared {
			if err := c.raiseDynamicShared(m.k1, -1); err != nil {
				_ = a.Free(m.h)
				return nil, fmt.Errorf("cuda moe decode: %w", err)
			}
		}
	}
	if moeVariants[v].wide {
		// All the opt-in shared memory the kernel's static part leaves, so
		// decodes of any K prepared later launch too (moeWideH is below it).
		m.smem2 = moeWideSmem2(v, K, I, is)
		if err := c.raiseDynamicShared(m.k2, -1); err != nil {
			_ = a.Free(m.h)
			return nil, fmt.Errorf("cuda moe decode: %w", err)
		}
	}
	if p := moeVariants[v]; p.persist {
		m.grid1.X = uint32(min(tiles, p.b*c.d.info.SMs))
		if is > 0 {
			m.smem1 = 8 * D
		}
		if m.ctr, err = a.Alloc(8); err != nil {
			_ = a.Free(m.h)
			return nil, fmt.Errorf("cuda moe decode: tile counter: %w", err)
		}
		if err := c.CopyToDevice(m.ctr, make([]byte, 8)); err != nil {
			_ = m.Free(a)
			return nil, err
		}
	}
	return m, nil
}

// Free returns m's device scratch to the arena it was prepared with; m must
// not be run afterwards.
func (m *MoEDecode) Free(a *Arena) error {
	err := a.Free(m.h)
	if m.ctr != 0 {
		if err2 := a.Free(m.ctr); err == nil {
			err = err2
		}
	}
	m.h, m.ctr = 0, 0
	return err
}

// Variant returns the variant m was prepared with.
func (m *MoEDecode) Variant() MoEVariant { return m.variant }

// RunMoEDecode enqueues on s the fused MoE decode m for the experts ids
// (int32 [K], device; an id outside the table makes out all NaN) with route
// weights rw ([K] float32, device; 0 means weight 1). It reads ids and rw
// only on the device, so it can be captured in a CUDA graph. Runs of one
// MoEDecode must not overlap (one stream, or ordered by events): the
// persistent variant's tile counter, and a split variant's tickets,
// belong to m.
func (c *Ctx) RunMoEDecode(m *MoEDecode, ids, rw DevicePtr, s Stream) error {
	if err := c.runMoEStage1(m, ids, rw, s); err != nil {
		return err
	}
	return c.runMoEStage2(m, ids, s)
}

func (c *Ctx) runMoEStage1(m *MoEDecode, ids, rw DevicePtr, s Stream) error {
	if m == nil || m.h == 0 || ids == 0 {
		return fmt.Errorf("cuda moe decode: nil or freed decode, or nil ids")
	}
	a := m.args
	a.Ids, a.Rw = uint64(ids), uint64(rw)
	t1, _ := m.variant.threads()
	if m.ctr != 0 {
		return c.Launch(m.k1, m.grid1, Dim3{X: t1}, m.smem1, s, unsafe.Pointer(&a), unsafe.Pointer(&m.ctr))
	}
	return c.Launch(m.k1, m.grid1, Dim3{X: t1}, m.smem1, s, unsafe.Pointer(&a))
}

// HCEpilogue is the sublayer boundary that follows a producer of a
// model-width output o [D] (a fused MoE decode before the next layer's
// attention-side mix, wo_b's one-token product before the FFN-side one:
// HCMixNorm with O = o), begun in the producer's epilogue
// (RunMoEDecodeHC, LaunchGemvHC): each block of 16 output rows also forms
// those rows' expanded streams x' = Post·o + Combᵀ·X (HCExpand's float32
// operations in its order, so the bits fuse_hc_dots4 gives) into XOut and
// its tile's partials of the boundary's split-K mix into Part: row m < 24
// the tile's Σ Fn[m, k·D + i]·x'[k][i] over its 16 rows i and 4 streams k,
// row 24 its Σ x'², column r0/16 (so [25, D/16] float32, or [35, D/16]
// with Gram: HCEpiloguePartBytes). HCMixNormTiles then finishes the boundary from
// them. All buffers are the caller's float32 device memory: X [4, D],
// Post [4], Comb [4, 4], XOut [4, D] and Part 16-byte aligned; XOut must
// not overlap X, Post, Comb, Part or the producer's input and output. Fn
// is the boundary's mix site (HC 4, Fn F32 [24, 4·D], 16-byte aligned).
type HCEpilogue struct {
	X, Post, Comb, XOut, Part DevicePtr
	Fn                        *HC
	// Gram also leaves the streams' Gram partials Σ_i x'_j[i]·x'_k[i] (j
	// <= k, pairs in the order (0,0), (0,1), (0,2), (0,3), (1,1), (1,2),
	// (1,3), (2,2), (2,3), (3,3)) in rows 25-34 of Part, for a consumer
	// that forms the boundary's output itself (LaunchGemvCollapse).
	Gram bool
}

// hcEpiRows is MOE_HC_NM in kernels/moe.cu: the mix site's Fn rows.
const hcEpiRows = 24

// hcEpiArgs mirrors struct HcEpi in kernels/moe.cu (56 bytes).
type hcEpiArgs struct {
	_                             structs.HostLayout
	X, Post, Comb, Fn, XOut, Part uint64
	NM, Gram                      int32
}

// hcGramRows is the Gram partial rows after the mix's (HCEpilogue.Gram).
const hcGramRows = 10

// HCEpiloguePartBytes is the size of HCEpilogue.Part at model width D
// (with the Gram rows).
func HCEpiloguePartBytes(D int) int { return 4 * (hcEpiRows + 1 + hcGramRows) * (D / 16) }

// moeHCKernelName names v's stage 2 with the boundary's epilogue, or ""
// where v has none (only the lean stage 2 of one block a row group, as
// MoELeanX's and MoELeanXW's; the default module holds moe2lh_g1_f1_d0_b2
// and moe2lhw_g1_f1_d0_b2).
func moeHCKernelName(v MoEVariant) string {
	p := moeVariants[v]
	if !p.lean || p.split > 0 || p.pfr || p.early2 || p.u2 != 1 || p.uf2 != 1 {
		return ""
	}
	b2 := p.b
	if p.b2 != 0 {
		b2 = p.b2
	}
	name := "moe2lh"
	if p.ew {
		name = "moe2lhw"
	}
	return fmt.Sprintf("%s_g%d_f%d_d%d_b%d", name, p.u2, p.uf2, p.dec, b2)
}

// HasHCEpilogue reports whether m's stage 2 can begin the boundary after
// it (RunMoEDecodeHC).
func (m *MoEDecode) HasHCEpilogue() bool { return m != nil && m.kh != nil }

// HCEpilogueFits reports whether p, a boundary's mix site at stream width
// D, is one the epilogue kernels and LaunchGemvCollapse take: HC 4, Fn F32
// [24, 4·D], D a multiple of 16.
func HCEpilogueFits(p *HC, D int) bool { return hcEpiSite("", p, D) == nil }

// hcEpiSite is HCEpilogueFits's check, its error starting with what.
func hcEpiSite(what string, p *HC, D int) error {
	switch {
	case p == nil || p.Fn == nil:
		return fmt.Errorf("%s: nil boundary or mix site", what)
	case p.HC != 4 || p.Fn.Rows != hcEpiRows || p.Fn.Cols != 4*D:
		return fmt.Errorf("%s: boundary's mix site: HC %d, Fn [%d, %d], want HC 4, Fn [%d, %d]", what, p.HC, p.Fn.Rows, p.Fn.Cols, hcEpiRows, 4*D)
	case p.Fn.Format != compute.F32:
		return fmt.Errorf("%s: boundary's Fn is %v, want %v", what, p.Fn.Format, compute.F32)
	case D%16 != 0:
		return fmt.Errorf("%s: boundary at width %d: want a multiple of 16", what, D)
	}
	return nil
}

// hcEpilogueArgs validates h for a producer of D rows whose input and
// output are in and out, and returns the kernels' argument block; errors
// start with what.
func hcEpilogueArgs(what string, h *HCEpilogue, D int, in, out DevicePtr) (hcEpiArgs, error) {
	if h == nil {
		return hcEpiArgs{}, fmt.Errorf("%s: nil boundary or mix site", what)
	}
	if err := hcEpiSite(what, h.Fn, D); err != nil {
		return hcEpiArgs{}, err
	}
	switch {
	case !nonNull(h.X, h.Post, h.Comb, h.XOut, h.Part):
		return hcEpiArgs{}, fmt.Errorf("%s: boundary: null X %#x, Post %#x, Comb %#x, XOut %#x or Part %#x", what, h.X, h.Post, h.Comb, h.XOut, h.Part)
	case (h.X|h.Post|h.Comb|h.XOut|h.Part|h.Fn.Fn.Data)%16 != 0:
		return hcEpiArgs{}, fmt.Errorf("%s: boundary: X %#x, Post %#x, Comb %#x, XOut %#x, Part %#x and Fn %#x must be 16-byte aligned", what, h.X, h.Post, h.Comb, h.XOut, h.Part, h.Fn.Fn.Data)
	case h.XOut == h.X || h.XOut == h.Post || h.XOut == h.Comb || h.XOut == h.Part || h.XOut == in || h.XOut == out:
		return hcEpiArgs{}, fmt.Errorf("%s: boundary: XOut %#x aliases X, Post, Comb, Part or the product's input or output", what, h.XOut)
	}
	var gram int32
	if h.Gram {
		gram = 1
	}
	return hcEpiArgs{X: uint64(h.X), Post: uint64(h.Post), Comb: uint64(h.Comb), Fn: uint64(h.Fn.Fn.Data), XOut: uint64(h.XOut),
		Part: uint64(h.Part), NM: hcEpiRows, Gram: gram}, nil
}

// RunMoEDecodeHC is RunMoEDecode whose stage 2 also begins the sublayer
// boundary h (see HCEpilogue); m's variant must have the epilogue
// (HasHCEpilogue). It can be captured in a CUDA graph.
func (c *Ctx) RunMoEDecodeHC(m *MoEDecode, ids, rw DevicePtr, h *HCEpilogue, s Stream) error {
	if !m.HasHCEpilogue() {
		return fmt.Errorf("cuda moe decode: variant %v has no boundary epilogue", m.Variant())
	}
	ha, err := hcEpilogueArgs("cuda moe decode", h, int(m.args.D), DevicePtr(m.args.X), DevicePtr(m.args.Out))
	if err != nil {
		return err
	}
	if err := c.runMoEStage1(m, ids, rw, s); err != nil {
		return err
	}
	a := m.args
	a.Ids = uint64(ids)
	a.HC = ha
	_, t2 := m.variant.threads()
	return c.Launch(m.kh, m.grid2, Dim3{X: t2}, m.smem2, s, unsafe.Pointer(&a))
}

func (c *Ctx) runMoEStage2(m *MoEDecode, ids DevicePtr, s Stream) error {
	if m == nil || m.h == 0 || ids == 0 {
		return fmt.Errorf("cuda moe decode: nil or freed decode, or nil ids")
	}
	a := m.args
	a.Ids = uint64(ids)
	_, t2 := m.variant.threads()
	return c.Launch(m.k2, m.grid2, Dim3{X: t2}, m.smem2, s, unsafe.Pointer(&a))
}
