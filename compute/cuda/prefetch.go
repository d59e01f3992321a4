package cuda

import (
	_ "embed"
	"fmt"
	"unsafe"
)

//go:embed kernels/prefetch.cu
var prefetchSrc string

// PrefetchSource returns the CUDA source of the L2 prefetch kernels
// (kernels/prefetch.cu).
func PrefetchSource() string { return prefetchSrc }

// PrefetchMode selects the instruction the L2 prefetch kernels issue.
type PrefetchMode int

const (
	// PrefetchBulk issues one cp.async.bulk.prefetch.L2 per chunk (sm_90
	// with NVRTC 12 or later; elsewhere the kernel falls back to
	// PrefetchLines).
	PrefetchBulk PrefetchMode = iota
	// PrefetchBulkEvictLast is PrefetchBulk with an L2::evict_last cache
	// policy.
	PrefetchBulkEvictLast
	// PrefetchLines issues one prefetch.global.L2 per 128-byte line.
	PrefetchLines
	// PrefetchLinesEvictLast issues prefetch.global.L2::evict_last per line
	// (sm_80+; plain PrefetchLines below).
	PrefetchLinesEvictLast
)

var prefetchModeNames = [...]string{"bulk", "bulk_el", "lines", "lines_el"}

// prefetchKernelNames are the kernels of kernels/prefetch.cu, by mode.
var prefetchKernelNames = [...]string{"prefetch_l2_bulk", "prefetch_l2_bulk_el", "prefetch_l2_lines", "prefetch_l2_lines_el"}

// String returns the mode's name as ParsePrefetchMode reads it.
func (m PrefetchMode) String() string {
	if m < 0 || int(m) >= len(prefetchModeNames) {
		return fmt.Sprintf("PrefetchMode(%d)", int(m))
	}
	return prefetchModeNames[m]
}

// ParsePrefetchMode reads a mode name: bulk, bulk_el, lines or lines_el
// ("" is bulk). Errors list the names.
func ParsePrefetchMode(s string) (PrefetchMode, error) {
	if s == "" {
		return PrefetchBulk, nil
	}
	for i, n := range prefetchModeNames {
		if s == n {
			return PrefetchMode(i), nil
		}
	}
	return 0, fmt.Errorf("cuda prefetch: unknown mode %q (want one of %v)", s, prefetchModeNames)
}

// L2Range is a span of device memory to prefetch: Bytes bytes from Ptr.
type L2Range struct {
	Ptr   DevicePtr
	Bytes int
}

// PrefetchOptions tunes an L2 prefetch launch; the zero value is the
// default (PrefetchBulk, PrefetchDefaultBlocks blocks,
// PrefetchDefaultChunk-byte bulk requests).
type PrefetchOptions struct {
	Mode PrefetchMode
	// Blocks is the grid size (0: PrefetchDefaultBlocks; at most
	// PrefetchMaxBlocks). Each block has PrefetchThreads threads; fewer
	// blocks take fewer SMs from kernels running beside the prefetch.
	Blocks int
	// Chunk is the size in bytes of one bulk request (0:
	// PrefetchDefaultChunk; a multiple of 16 up to PrefetchMaxChunk).
	// The line modes ignore it.
	Chunk int
}

// Limits and defaults of PrefetchOptions and PrefetchL2Ranges.
const (
	PrefetchDefaultBlocks = 8
	PrefetchMaxBlocks     = 1024
	PrefetchThreads       = 128
	PrefetchDefaultChunk  = 16 << 10
	PrefetchMaxChunk      = 1 << 20
	// PrefetchMaxRanges is the number of ranges one kernel launch takes
	// (PF_MAX in kernels/prefetch.cu); PrefetchL2Ranges launches once per
	// PrefetchMaxRanges ranges.
	PrefetchMaxRanges = 16
	prefetchLine      = 128 // PF_LINE
)

// pfArgs mirrors struct PfArgs of kernels/prefetch.cu (passed by value).
type pfArgs struct {
	ptr   [PrefetchMaxRanges]uint64
	bytes [PrefetchMaxRanges]uint64
	end   [PrefetchMaxRanges]int64 // running item count through range r
	n     int32
	unit  uint32 // bytes per item
}

// prefetchPlan checks ranges and opt and returns the kernel arguments of
// each launch, the kernel's name and the grid size. Errors name the range
// (by index) or option and what was wrong.
func prefetchPlan(ranges []L2Range, opt PrefetchOptions) ([]pfArgs, string, int, error) {
	if opt.Mode < 0 || int(opt.Mode) >= len(prefetchKernelNames) {
		return nil, "", 0, fmt.Errorf("cuda prefetch: unknown mode %d", int(opt.Mode))
	}
	blocks := opt.Blocks
	if blocks == 0 {
		blocks = PrefetchDefaultBlocks
	}
	if blocks < 0 || blocks > PrefetchMaxBlocks {
		return nil, "", 0, fmt.Errorf("cuda prefetch: %d blocks (want 1..%d, or 0 for %d)", opt.Blocks, PrefetchMaxBlocks, PrefetchDefaultBlocks)
	}
	unit := opt.Chunk
	if unit == 0 {
		unit = PrefetchDefaultChunk
	}
	if unit < 0 || unit%16 != 0 || unit > PrefetchMaxChunk {
		return nil, "", 0, fmt.Errorf("cuda prefetch: chunk of %d bytes (want a multiple of 16 up to %d, or 0 for %d)", opt.Chunk, PrefetchMaxChunk, PrefetchDefaultChunk)
	}
	if opt.Mode == PrefetchLines || opt.Mode == PrefetchLinesEvictLast {
		unit = prefetchLine
	}
	if len(ranges) == 0 {
		return nil, "", 0, fmt.Errorf("cuda prefetch: no ranges")
	}
	var out []pfArgs
	for i, r := range ranges {
		switch {
		case r.Ptr == 0:
			return nil, "", 0, fmt.Errorf("cuda prefetch: range %d of %d has a null pointer", i, len(ranges))
		case r.Ptr%16 != 0:
			return nil, "", 0, fmt.Errorf("cuda prefetch: range %d of %d starts at %#x, not 16-byte aligned", i, len(ranges), uint64(r.Ptr))
		case r.Bytes <= 0:
			return nil, "", 0, fmt.Errorf("cuda prefetch: range %d of %d has %d bytes (want > 0)", i, len(ranges), r.Bytes)
		case uint64(r.Ptr)+uint64(r.Bytes) < uint64(r.Ptr):
			return nil, "", 0, fmt.Errorf("cuda prefetch: range %d of %d (%d bytes at %#x) wraps the address space", i, len(ranges), r.Bytes, uint64(r.Ptr))
		}
		if i%PrefetchMaxRanges == 0 {
			out = append(out, pfArgs{unit: uint32(unit)})
		}
		a := &out[len(out)-1]
		k := int(a.n)
		a.ptr[k], a.bytes[k] = uint64(r.Ptr), uint64(r.Bytes)
		a.end[k] = int64((r.Bytes + unit - 1) / unit)
		if k > 0 {
			a.end[k] += a.end[k-1]
		}
		a.n++
	}
	return out, prefetchKernelNames[opt.Mode], blocks, nil
}

// prefetchModule returns the loaded prefetch module, compiling (or loading
// from the disk cache) it on first use.
func (c *Ctx) prefetchModule() (*Module, error) {
	m, err := c.namedModule("prefetch", prefetchSrc, nil)
	if err != nil {
		return nil, fmt.Errorf("cuda prefetch module: %w", err)
	}
	return m, nil
}

// LoadPrefetch compiles (or loads from the disk cache) the prefetch module
// and its kernels. PrefetchL2 does so itself on first use; call this before
// capturing a graph that prefetches, so no module loads during the capture.
func (c *Ctx) LoadPrefetch() error {
	m, err := c.prefetchModule()
	if err != nil {
		return err
	}
	for _, n := range prefetchKernelNames {
		if _, err := m.Kernel(n); err != nil {
			return err
		}
	}
	return nil
}

// PrefetchL2 enqueues on s a small kernel (PrefetchOptions defaults) that
// asks the L2 cache to fetch bytes bytes of device memory from p, so that
// kernels reading them soon after (on any stream) find them in L2. p must be
// 16-byte aligned and bytes > 0; the memory is not read into registers nor
// changed, and p need only stay allocated until the kernel has run. It is a
// hint: how much of the range is still in L2 when a reader runs depends on
// the L2 size (about 50 MB on an H100/H200, less in practice) and on what
// else runs. It may be captured in a graph (after LoadPrefetch).
func (c *Ctx) PrefetchL2(p DevicePtr, bytes int, s Stream) error {
	return c.PrefetchL2Ranges([]L2Range{{Ptr: p, Bytes: bytes}}, PrefetchOptions{}, s)
}

// PrefetchL2Ranges is PrefetchL2 for several ranges with explicit options:
// one launch per PrefetchMaxRanges ranges, its items (Chunk bytes for the
// bulk modes, a 128-byte line for the line modes) spread over the grid in
// the order of ranges. Errors name the bad range by index or the bad
// option; nothing is enqueued then.
func (c *Ctx) PrefetchL2Ranges(ranges []L2Range, opt PrefetchOptions, s Stream) error {
	plan, name, blocks, err := prefetchPlan(ranges, opt)
	if err != nil {
		return err
	}
	m, err := c.prefetchModule()
	if err != nil {
		return err
	}
	k, err := m.Kernel(name)
	if err != nil {
		return err
	}
	for _, a := range plan {
		if err := c.Launch(k, Dim3{X: uint32(blocks)}, Dim3{X: PrefetchThreads}, 0, s, unsafe.Pointer(&a)); err != nil {
			return err
		}
	}
	return nil
}
