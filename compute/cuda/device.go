// Package cuda runs moxie's compute on an NVIDIA GPU from pure Go (no cgo):
// the driver API and NVRTC are bound at run time (package driver), kernels are
// CUDA C++ sources embedded in the binary and compiled by NVRTC for the
// device's compute capability on first use, then cached on disk.
//
// Threading: the CUDA context is current on one OS thread only. A Device owns
// one goroutine locked to its OS thread, which holds the device's primary
// context; all device work runs there, submitted with Device.Do. The *Ctx that
// Do passes is valid only inside that call.
//
// With no driver or no GPU, Open returns an error that says so (wrapping
// ErrUnavailable); callers fall back to the CPU backend.
package cuda

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"

	"moxie/compute/cuda/driver"
)

// ErrUnavailable is wrapped by Open's error when this machine has no usable
// CUDA driver, GPU or NVRTC.
var ErrUnavailable = errors.New("cuda unavailable")

// Info describes an opened device.
type Info struct {
	Ordinal       int
	Name          string
	Major, Minor  int    // compute capability
	SMs           int    // multiprocessors
	L2Bytes       int    // L2 cache size
	SharedOptin   int    // max dynamic shared memory per block (opt-in), bytes
	TotalMem      uint64 // bytes
	DriverVersion int    // e.g. 13000
	NVRTC         string // library path and version
	NVRTCMajor    int
	NVRTCMinor    int
}

func (i Info) String() string {
	return fmt.Sprintf("%s (sm_%d%d, %d SMs, %.1f GiB, L2 %d MiB, driver %d, nvrtc %d.%d)",
		i.Name, i.Major, i.Minor, i.SMs, float64(i.TotalMem)/(1<<30), i.L2Bytes>>20, i.DriverVersion, i.NVRTCMajor, i.NVRTCMinor)
}

// Device is one GPU with its primary context, owned by a locked OS thread.
// Its methods are safe for concurrent use; work is serialised on the device
// thread.
type Device struct {
	info  Info
	lib   *driver.Lib
	nvrtc *driver.NVRTC
	dev   int32

	work    *handoff
	closeMu sync.Mutex
	closed  bool
	exited  chan struct{}

	// Owned by the device thread.
	ctx        *Ctx
	modules    map[string]*Module
	linear     *Module
	linKernels map[linKey]*Kernel

	// linWidth is the linear kernel family that WidthAuto selects on this
	// device when not WidthAuto itself ($MOXIE_CUDA_LINEAR; experiments).
	linWidth int

	// pdl: kernels of modules that opt in (see pdlMarker) launch with
	// programmatic dependent launch (sm_90+, cuLaunchKernelEx;
	// $MOXIE_CUDA_PDL=off disables it).
	pdl bool

	// hcMix is the HCMix/HCHeadPre path choice ($MOXIE_CUDA_HCMIX) and the
	// split path's scratch buffer (ops.go).
	hcMix hcMixState

	// carve: kernels' preferred shared-memory carveouts ($MOXIE_CUDA_CARVE,
	// parseCarve), set as each kernel is looked up.
	carve []carveRule
}

// Open loads the driver and NVRTC, retains the primary context of GPU
// `ordinal` on a new locked OS thread and creates its compute stream.
func Open(ordinal int) (*Device, error) {
	lib, err := driver.Load()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	nv, err := driver.LoadNVRTC()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	d := &Device{lib: lib, nvrtc: nv, work: newHandoff(), exited: make(chan struct{}), modules: map[string]*Module{}, linKernels: map[linKey]*Kernel{}}
	started := make(chan error, 1)
	go d.loop(ordinal, started)
	if err := <-started; err != nil {
		return nil, err
	}
	return d, nil
}

func (d *Device) loop(ordinal int, started chan<- error) {
	runtime.LockOSThread()
	defer close(d.exited)
	if err := d.init(ordinal); err != nil {
		started <- err
		return // the thread dies with its lock; the context (if any) is dropped
	}
	started <- nil
	for {
		t, ok := d.work.next()
		if !ok {
			break
		}
		t.run()
	}
	d.shutdown()
	runtime.UnlockOSThread()
}

// linearFamilies are the values of $MOXIE_CUDA_LINEAR.
var linearFamilies = map[string]int{"": WidthAuto, "narrow": WidthNarrow, "wide": WidthWide, "vec": WidthVec, "mma": WidthMMA}

func (d *Device) init(ordinal int) error {
	l := d.lib
	w, ok := linearFamilies[os.Getenv("MOXIE_CUDA_LINEAR")]
	if !ok {
		return fmt.Errorf("MOXIE_CUDA_LINEAR=%q: want narrow, wide, vec or mma (or unset for the default)", os.Getenv("MOXIE_CUDA_LINEAR"))
	}
	d.linWidth = w
	if err := l.Init(); err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	n, err := l.DeviceCount()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if ordinal < 0 || ordinal >= n {
		return fmt.Errorf("%w: GPU %d requested, %d present", ErrUnavailable, ordinal, n)
	}
	dev, err := l.Device(ordinal)
	if err != nil {
		return err
	}
	d.dev = dev
	in := Info{Ordinal: ordinal, NVRTC: d.nvrtc.Path, NVRTCMajor: d.nvrtc.Major, NVRTCMinor: d.nvrtc.Minor}
	if in.Name, err = l.DeviceName(dev); err != nil {
		return err
	}
	for _, a := range []struct {
		attr int
		dst  *int
	}{
		{driver.AttrComputeCapabilityMajor, &in.Major}, {driver.AttrComputeCapabilityMinor, &in.Minor},
		{driver.AttrMultiprocessorCount, &in.SMs}, {driver.AttrL2CacheSize, &in.L2Bytes},
		{driver.AttrMaxSharedPerBlockOptin, &in.SharedOptin},
	} {
		if *a.dst, err = l.Attribute(dev, a.attr); err != nil {
			return err
		}
	}
	if in.TotalMem, err = l.TotalMem(dev); err != nil {
		return err
	}
	if in.DriverVersion, err = l.DriverVersion(); err != nil {
		return err
	}
	if d.carve, err = parseCarve(os.Getenv("MOXIE_CUDA_CARVE"), in.Major); err != nil {
		return err
	}
	c, err := l.PrimaryCtxRetain(dev)
	if err != nil {
		return err
	}
	if err := l.CtxSetCurrent(c); err != nil {
		return err
	}
	s, err := l.StreamCreate(1)
	if err != nil {
		return err
	}
	d.info = in
	d.pdl = in.Major >= 9 && l.HasLaunchEx() && os.Getenv("MOXIE_CUDA_PDL") != "off"
	d.ctx = &Ctx{d: d, lib: l, stream: Stream{s: s}}
	return nil
}

func (d *Device) shutdown() {
	l := d.lib
	_ = l.CtxSynchronize()
	for _, m := range d.modules {
		_ = l.ModuleUnload(m.mod)
	}
	_ = l.StreamDestroy(d.ctx.stream.s)
	_ = l.PrimaryCtxRelease(d.dev)
}

// Info returns the device's description.
func (d *Device) Info() Info { return d.info }

// ErrClosed is returned by Do after Close.
var ErrClosed = errors.New("cuda: device closed")

// Do runs f on the device thread and returns its error. f must not keep c
// after returning, and must not call Do (that would deadlock). A panic in f is
// re-raised in the caller.
func (d *Device) Do(f func(c *Ctx) error) error {
	d.closeMu.Lock()
	if d.closed {
		d.closeMu.Unlock()
		return ErrClosed
	}
	var err error
	var pan any
	t := d.work.send(func() {
		defer func() { pan = recover() }()
		err = f(d.ctx)
	})
	d.closeMu.Unlock()
	t.await(d.work.wait)
	if pan != nil {
		panic(pan)
	}
	return err
}

// Close waits for pending work, unloads modules, releases the context and
// ends the device thread. Device memory and pinned buffers not freed by their
// owners are released with the context.
func (d *Device) Close() error {
	d.closeMu.Lock()
	if d.closed {
		d.closeMu.Unlock()
		return nil
	}
	d.closed = true
	d.work.close()
	d.closeMu.Unlock()
	<-d.exited
	return nil
}
