package cuda

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"moxie/compute/cuda/driver"
)

// Module is a loaded kernel image.
type Module struct {
	Name        string
	Key         string        // cache key (see CacheKey)
	FromCache   bool          // the image came from the disk cache
	CompileTime time.Duration // NVRTC time when compiled now
	lib         *driver.Lib
	mod         driver.Module
	kernels     map[string]*Kernel
	pdl         bool // the source carries pdlMarker
	carve       []carveRule
}

// Kernel is one __global__ function of a Module.
type Kernel struct {
	name string
	fn   driver.Function
	pdl  bool // its module opts in to programmatic dependent launch
	// carve: the preferred shared-memory carveout set at lookup (percent),
	// -1 for the driver's choice.
	carve int
	// Owned by the device thread: launches so far and the last one's block
	// threads and dynamic shared memory (Ctx.KernelUses).
	launches, threads, shared int
}

// pdlMarker is the line a kernel source carries when every __global__
// function in it starts with MOXIE_PDL(); (pdl_test.go checks that): its
// kernels may then launch before the previous kernel on the stream has
// finished, and wait for it at that first statement.
const pdlMarker = "//@pdl"

// pdlPreamble is prepended to every module's source (ModuleSource):
// MOXIE_PDL() waits for the previous kernel on the stream (a no-op when the
// launch had no programmatic dependency) and then lets the next one launch,
// so that at most one kernel waits ahead of the running one. #line keeps
// compiler messages on the source's own line numbers.
//
// MOXIE_PDL_WAIT() and MOXIE_PDL_TRIGGER() are MOXIE_PDL()'s two halves,
// for a kernel whose blocks wait for each other (a grid-wide barrier): it
// starts with MOXIE_PDL_WAIT() and lets the next kernel launch only with
// MOXIE_PDL_TRIGGER() after the barrier, once all its blocks are resident
// (the next kernel's blocks could otherwise take the room a late block
// needs). pdl_test.go accepts MOXIE_PDL_WAIT(); as a kernel's first
// statement only when its body also contains MOXIE_PDL_TRIGGER().
//
// MOXIE_PDL_UNLESS(cond) is MOXIE_PDL() for the blocks where cond is
// false; a block where it holds does not wait for the previous kernel on
// the stream and only lets the next one launch. Such a block may read only
// memory written at least two kernels back on the stream, never what the
// previous kernel writes, and must not write what the previous kernel
// reads or writes: with a programmatic launch this kernel starts only once
// every block of the previous kernel has passed its own wait, so every
// kernel before that one has finished and its writes are visible; this
// holds when the previous kernel starts with MOXIE_PDL(), MOXIE_PDL_PF or
// MOXIE_PDL_WAIT in every block (not with a MOXIE_PDL_UNLESS that skips),
// or is not a programmatic launch at all. cond is computed from the
// kernel's arguments (by value), blockIdx, blockDim and constants alone,
// as MOXIE_PDL_PF's arguments are.
//
// MOXIE_PDL_INSIDE() (a no-op) marks a kernel that calls MOXIE_PDL()
// later in its body, every thread on every path before it reads anything
// another kernel writes, or writes anything: before that it reads only
// the kernel's arguments and weights (memory no kernel writes), so a
// programmatic launch lets its weight loads fly while the previous kernel
// still runs (the gemvm kernels of moe.cu issue their first weight chunks
// this way). pdl_test.go accepts it as a kernel's first statement; the
// wait inside is the kernel's own contract, checked by its tests.
//
// MOXIE_PF(...) asks L2 for what MOXIE_PDL_PF(...) would, with the same
// contract on its arguments, and does not wait: a MOXIE_PDL_INSIDE kernel's
// hints.
//
// MOXIE_PDL_PF(...) first asks L2 for weight bytes the block will read
// early (prefetch.global.L2, one hint per 128-byte line, the lines spread
// over the block's threads) and then does MOXIE_PDL(), so that with a
// programmatic launch those bytes stream in while the previous kernel
// still runs. Its arguments name the ranges, in one of three forms:
//
//	MOXIE_PDL_PF(ptr, bytes)               [ptr, ptr+bytes)
//	MOXIE_PDL_PF(ptr, bytes, stride, count) count such ranges, stride bytes apart
//	MOXIE_PDL_PF(MoxiePF{p, q, bytes, stride, count}) those of p, and the same of q (q may be null)
//
// The contract (the arguments run before the wait, while the previous
// kernel may still be writing): they are computed from the kernel's
// arguments (by value), blockIdx, blockDim and constants alone, never by
// reading device memory (another kernel may be writing it); every range
// lies inside one allocation the kernel reads and no kernel writes while
// it runs (weights); bytes or count 0 asks for nothing (null pointers are
// then allowed). Every hint address lies inside its range. A hint cannot
// change results (L2 is the point of coherence and a prefetch of a valid
// address never faults), only timing. MOXIE_PF_BYTES (default 1024) is the
// most bytes of one row, or of one warp's share of a row, a kernel asks
// for this way. Compiled with -DMOXIE_NO_PDLPF (CompileOptions adds it
// when $MOXIE_CUDA_PDLPF is "off") the hints are left out and MOXIE_PDL_PF
// is MOXIE_PDL().
const pdlPreamble = `#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MOXIE_PDL() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#define MOXIE_PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define MOXIE_PDL_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define MOXIE_PDL() do {} while (0)
#define MOXIE_PDL_WAIT() do {} while (0)
#define MOXIE_PDL_TRIGGER() do {} while (0)
#endif
#ifndef MOXIE_PF_BYTES
#define MOXIE_PF_BYTES 1024
#endif
#ifndef MOXIE_PF_HINT
#define MOXIE_PF_HINT(a) asm volatile("prefetch.global.L2 [%0];" ::"l"(a))
#endif
struct MoxiePF {
  const void *p, *q;
  long long bytes, stride;
  int count;
};
__device__ __forceinline__ void moxie_pdl_pf(const MoxiePF f) {
#ifndef MOXIE_NO_PDLPF
  if (f.bytes <= 0 || f.count <= 0 || !f.p) return;
  const unsigned long long p = (unsigned long long)f.p, q = (unsigned long long)f.q, st = (unsigned long long)f.stride;
  const int lpp = (int)((f.bytes + 127) >> 7) + (((p | q | st) & 127ull) ? 1 : 0), per = lpp * f.count, n = q ? 2 * per : per;
  const int nt = blockDim.x * blockDim.y * blockDim.z;
  for (int l = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); l < n; l += nt) {
    const int li = l < per ? l : l - per, pc = li / lpp, j = li - pc * lpp;
    const unsigned long long base = (l < per ? p : q) + (unsigned long long)pc * st, a = (base & ~127ull) + ((unsigned long long)j << 7);
    if (a < base + (unsigned long long)f.bytes) MOXIE_PF_HINT(a > base ? a : base);
  }
#endif
}
__device__ __forceinline__ void moxie_pdl_pf(const void *p, long long bytes, long long stride, int count) {
  moxie_pdl_pf(MoxiePF{p, nullptr, bytes, stride, count});
}
__device__ __forceinline__ void moxie_pdl_pf(const void *p, long long bytes) { moxie_pdl_pf(MoxiePF{p, nullptr, bytes, 0, 1}); }
#define MOXIE_PDL_PF(...) do { moxie_pdl_pf(__VA_ARGS__); MOXIE_PDL(); } while (0)
#define MOXIE_PDL_UNLESS(cond) do { if (!(cond)) MOXIE_PDL_WAIT(); MOXIE_PDL_TRIGGER(); } while (0)
#define MOXIE_PDL_INSIDE() do {} while (0)
#define MOXIE_PF(...) moxie_pdl_pf(__VA_ARGS__)
#line 1
`

// ModuleSource returns src as Ctx.Module compiles it (pdlPreamble first).
func ModuleSource(src string) string { return pdlPreamble + src }

// hasPDLMarker reports whether src opts in to programmatic dependent launch.
func hasPDLMarker(src string) bool {
	return strings.HasPrefix(src, pdlMarker+"\n") || strings.Contains(src, "\n"+pdlMarker+"\n")
}

// moduleMarker starts a "//@module NAME" line: a kernel file split into
// several NVRTC modules (linear.cu, moe.cu) names each section so, every
// section running to the next such line.
const moduleMarker = "//@module "

// splitSections splits the kernel file text src (file names it in errors)
// at its moduleMarker lines into the sections named names, returned by
// name without their marker lines. Text before the first marker is
// dropped. Every name must occur exactly once, and no other.
func splitSections(file, src string, names ...string) (map[string]string, error) {
	sec := map[string]string{}
	name := ""
	var b strings.Builder
	flush := func() error {
		if name == "" {
			return nil
		}
		if _, dup := sec[name]; dup {
			return fmt.Errorf("cuda: kernels/%s has two %q sections", file, name)
		}
		sec[name] = b.String()
		b.Reset()
		return nil
	}
	for line := range strings.Lines(src) {
		if rest, ok := strings.CutPrefix(line, moduleMarker); ok {
			if err := flush(); err != nil {
				return nil, err
			}
			name = strings.TrimSpace(rest)
			if !slices.Contains(names, name) {
				return nil, fmt.Errorf("cuda: kernels/%s has an unknown section %q (want %s)", file, name, strings.Join(names, ", "))
			}
			continue
		}
		if name != "" {
			b.WriteString(line)
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	for _, n := range names {
		if _, ok := sec[n]; !ok {
			return nil, fmt.Errorf("cuda: kernels/%s lacks its %q section", file, n)
		}
	}
	return sec, nil
}

// Name returns the kernel's symbol name.
func (k *Kernel) Name() string { return k.name }

// CompileOptions returns the NVRTC options used for this device (no -O3:
// NVRTC rejects it and optimises by default), with -DMOXIE_NO_PDLPF when
// $MOXIE_CUDA_PDLPF is "off" (MOXIE_PDL_PF then asks L2 for nothing: an
// A/B switch; the cache key includes the options).
func (c *Ctx) CompileOptions() []string {
	in := c.d.info
	opts := []string{fmt.Sprintf("--gpu-architecture=sm_%d%d", in.Major, in.Minor), "--std=c++17"}
	if os.Getenv("MOXIE_CUDA_PDLPF") == "off" {
		opts = append(opts, "-DMOXIE_NO_PDLPF")
	}
	return opts
}

// Module compiles (or loads from the disk cache) a CUDA C++ source for this
// device and loads it; the result is memoised per device by cache key.
// Compile errors carry NVRTC's log.
func (c *Ctx) Module(name, src string) (*Module, error) { return c.moduleWith(name, src, nil) }

// moduleWith is Module compiled with extra NVRTC options after
// CompileOptions' (e.g. -D definitions; a module of other options is
// another module: give it its own name).
func (c *Ctx) moduleWith(name, src string, extra []string) (*Module, error) {
	d := c.d
	opts := append(c.CompileOptions(), extra...)
	key := CacheKey(ModuleSource(src), opts, d.nvrtc.Major, d.nvrtc.Minor, d.info.Major, d.info.Minor)
	if m, ok := d.modules[key]; ok {
		return m, nil
	}
	m := &Module{Name: name, Key: key, lib: c.lib, kernels: map[string]*Kernel{}, pdl: hasPDLMarker(src), carve: c.d.carve}
	dir, dirErr := CacheDir()
	var img []byte
	if dirErr == nil {
		img, m.FromCache = readCache(dir, key)
	}
	if !m.FromCache {
		t0 := time.Now()
		var err error
		img, err = d.nvrtc.Compile(ModuleSource(src), name+".cu", opts)
		if err != nil {
			return nil, err
		}
		m.CompileTime = time.Since(t0)
		if dirErr == nil {
			_ = writeCache(dir, key, img) // a read-only cache only costs a recompile next time
		}
	}
	mod, err := c.lib.ModuleLoadData(img)
	if err != nil {
		return nil, fmt.Errorf("loading module %s: %w", name, err)
	}
	m.mod = mod
	d.modules[key] = m
	return m, nil
}

// Kernel returns the named extern "C" kernel of m.
func (m *Module) Kernel(name string) (*Kernel, error) {
	if k, ok := m.kernels[name]; ok {
		return k, nil
	}
	f, err := m.lib.ModuleGetFunction(m.mod, name)
	if err != nil {
		return nil, fmt.Errorf("module %s: %w", m.Name, err)
	}
	carve := -1
	for _, r := range m.carve {
		if strings.HasPrefix(name, r.prefix) {
			if err := m.lib.FuncSetAttribute(f, funcAttrCarveout, r.percent); err != nil {
				return nil, fmt.Errorf("module %s: %s's shared-memory carveout %d%%: %w", m.Name, name, r.percent, err)
			}
			carve = r.percent
			break
		}
	}
	k := &Kernel{name: name, fn: f, pdl: m.pdl, carve: carve}
	m.kernels[name] = k
	return k, nil
}

// KernelUse is one kernel's resources and its last launch on a device
// (Ctx.KernelUses): where its blocks fit, and so how much of the SM's
// unified L1/shared memory the driver can leave to L1.
type KernelUse struct {
	Name     string
	Launches int
	// Threads and DynamicShared (bytes) are the last launch's.
	Threads, DynamicShared int
	// Registers (a thread), StaticShared and LocalBytes (a thread) are the
	// compiled kernel's.
	Registers, StaticShared, LocalBytes int
	// BlocksPerSM is the occupancy API's most resident blocks an SM at the
	// last launch's shape (it assumes the largest carveout).
	BlocksPerSM int
	// Carveout is the preferred shared-memory carveout set ($MOXIE_CUDA_CARVE,
	// percent), or -1 for the driver's choice.
	Carveout int
}

// The function attributes the package reads or sets (CUfunction_attribute).
const (
	funcAttrSharedSize       = 1 // CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES (static shared memory)
	funcAttrLocalSize        = 3 // CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES
	funcAttrNumRegs          = 4 // CU_FUNC_ATTRIBUTE_NUM_REGS
	funcAttrMaxDynamicShared = 8 // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
	// funcAttrCarveout is CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
	// the share of the SM's unified L1/shared memory a kernel prefers as
	// shared memory, in percent of the most (the rest is L1 cache).
	funcAttrCarveout = 9
)

// KernelUses lists every kernel launched on the device so far, by name
// (a decode step's graph capture launches each of its kernels once).
func (c *Ctx) KernelUses() ([]KernelUse, error) {
	var out []KernelUse
	for _, m := range c.d.modules {
		for _, k := range m.kernels {
			if k.launches == 0 {
				continue
			}
			u := KernelUse{Name: k.name, Launches: k.launches, Threads: k.threads, DynamicShared: k.shared, Carveout: k.carve}
			var err error
			for _, a := range []struct {
				attr int
				dst  *int
			}{{funcAttrNumRegs, &u.Registers}, {funcAttrSharedSize, &u.StaticShared}, {funcAttrLocalSize, &u.LocalBytes}} {
				if *a.dst, err = c.lib.FuncGetAttribute(k.fn, a.attr); err != nil {
					return nil, fmt.Errorf("%s: %w", k.name, err)
				}
			}
			if u.BlocksPerSM, err = c.lib.OccupancyMaxActiveBlocks(k.fn, k.threads, k.shared); err != nil {
				return nil, fmt.Errorf("%s: %w", k.name, err)
			}
			out = append(out, u)
		}
	}
	slices.SortFunc(out, func(a, b KernelUse) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// carveRule gives the kernels whose names start with prefix a preferred
// shared-memory carveout of percent.
type carveRule struct {
	prefix  string
	percent int
}

// defaultCarve is the carveout rule set without $MOXIE_CUDA_CARVE on an
// sm_90 device: MoE stage 1 (moe1lx_*: 7 blocks of 21.5 KB of shared
// memory an SM by its registers, and the driver's 164 KB carveout, ~92 KB
// of L1) at 44% (100 KB of shared memory on an H200: 4 blocks an SM, ~156
// KB of L1 for the weight loads in flight; 6 blocks with ~124 KB gained
// nothing). Session 16: stage 1 alone 26.89 → 24.91 us, the whole model
// 169.43 → 172.27 tok/s in one call (docs/benchmarks.md).
var defaultCarve = []carveRule{{"moe1lx", 44}}

// parseCarve reads $MOXIE_CUDA_CARVE for a device of compute capability
// major.x: "" (defaultCarve on sm_90, where it was measured; else none),
// "off" (the driver's choice for every kernel) or comma-separated
// PREFIX:PERCENT rules (0..100; the first rule whose prefix starts a
// kernel's name applies), e.g. "moe1lx:44,gemvm:50". A smaller carveout
// leaves more L1 and fits fewer blocks an SM.
func parseCarve(v string, major int) ([]carveRule, error) {
	switch {
	case v == "" && major == 9:
		return defaultCarve, nil
	case v == "" || v == "off":
		return nil, nil
	}
	var rules []carveRule
	for item := range strings.SplitSeq(v, ",") {
		prefix, pc, ok := strings.Cut(item, ":")
		n, err := strconv.Atoi(pc)
		if !ok || prefix == "" || err != nil || n < 0 || n > 100 {
			return nil, fmt.Errorf("MOXIE_CUDA_CARVE=%q: item %q, want KERNEL-PREFIX:PERCENT with PERCENT 0..100", v, item)
		}
		rules = append(rules, carveRule{prefix, n})
	}
	return rules, nil
}

// namedModule returns the device's loaded module called name or, when there
// is none, compiles (or loads from the disk cache) src as that module and
// runs setup on it (nil: none), once. The device memoises modules by cache
// key; looking the module up by name first avoids hashing the source on
// every launch. A module whose setup failed stays loaded without it.
func (c *Ctx) namedModule(name, src string, setup func(*Module) error) (*Module, error) {
	for _, m := range c.d.modules {
		if m.Name == name {
			return m, nil
		}
	}
	m, err := c.Module(name, src)
	if err != nil {
		return nil, err
	}
	if setup != nil {
		if err := setup(m); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// launchNamed enqueues the kernel `name` of the module that mod returns
// (compiling or loading it on first use) on s.
func (c *Ctx) launchNamed(mod func() (*Module, error), name string, grid, block Dim3, shared int, s Stream, args ...unsafe.Pointer) error {
	m, err := mod()
	if err != nil {
		return err
	}
	k, err := m.Kernel(name)
	if err != nil {
		return err
	}
	return c.Launch(k, grid, block, shared, s, args...)
}

// kernelRef names a kernel and where to store it (see loadKernels).
type kernelRef struct {
	name string
	dst  **Kernel
}

// loadKernels compiles (or loads from the disk cache) src as module name
// and stores each referenced kernel in its dst. Errors name the module.
func (c *Ctx) loadKernels(name, src string, refs ...kernelRef) error {
	m, err := c.Module(name, src)
	if err != nil {
		return fmt.Errorf("cuda %s module: %w", name, err)
	}
	for _, r := range refs {
		if *r.dst, err = m.Kernel(r.name); err != nil {
			return err
		}
	}
	return nil
}

// raiseDynamicShared lets k's launches use need bytes of dynamic shared
// memory (need < 0: all the device's opt-in shared memory that k's static
// shared memory leaves). Errors name the kernel; asking for more than is
// left is one.
func (c *Ctx) raiseDynamicShared(k *Kernel, need int) error {
	static, err := c.lib.FuncGetAttribute(k.fn, funcAttrSharedSize)
	if err != nil {
		return fmt.Errorf("%s: %w", k.name, err)
	}
	room := c.d.info.SharedOptin - static
	if need < 0 {
		need = room
	}
	if need > room {
		return fmt.Errorf("%s needs %d bytes of shared memory, the device allows %d", k.name, need, room)
	}
	if err := c.lib.FuncSetAttribute(k.fn, funcAttrMaxDynamicShared, need); err != nil {
		return fmt.Errorf("%s: %w", k.name, err)
	}
	return nil
}
