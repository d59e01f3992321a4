package cuda

import (
	"fmt"
	"time"

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
}

// Kernel is one __global__ function of a Module.
type Kernel struct {
	name string
	fn   driver.Function
}

// Name returns the kernel's symbol name.
func (k *Kernel) Name() string { return k.name }

// CompileOptions returns the NVRTC options used for this device (no -O3:
// NVRTC rejects it and optimises by default).
func (c *Ctx) CompileOptions() []string {
	in := c.d.info
	return []string{fmt.Sprintf("--gpu-architecture=sm_%d%d", in.Major, in.Minor), "--std=c++17"}
}

// Module compiles (or loads from the disk cache) a CUDA C++ source for this
// device and loads it; the result is memoised per device by cache key.
// Compile errors carry NVRTC's log.
func (c *Ctx) Module(name, src string) (*Module, error) {
	d := c.d
	opts := c.CompileOptions()
	key := CacheKey(src, opts, d.nvrtc.Major, d.nvrtc.Minor, d.info.Major, d.info.Minor)
	if m, ok := d.modules[key]; ok {
		return m, nil
	}
	m := &Module{Name: name, Key: key, lib: c.lib, kernels: map[string]*Kernel{}}
	dir, dirErr := CacheDir()
	var img []byte
	if dirErr == nil {
		img, m.FromCache = readCache(dir, key)
	}
	if !m.FromCache {
		t0 := time.Now()
		var err error
		img, err = d.nvrtc.Compile(src, name+".cu", opts)
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
	k := &Kernel{name: name, fn: f}
	m.kernels[name] = k
	return k, nil
}
