package cuda

import (
	"fmt"
	"runtime"
	"unsafe"

	"moxie/compute/cuda/driver"
)

// DevicePtr is an address in device memory.
type DevicePtr = driver.DevicePtr

// Ctx is the device thread's handle, passed to the function given to
// Device.Do; it is valid only during that call and on that goroutine.
type Ctx struct {
	d      *Device
	lib    *driver.Lib
	stream Stream
}

// Device returns the device this context belongs to.
func (c *Ctx) Device() *Device { return c.d }

// Stream returns the device's compute stream.
func (c *Ctx) Stream() Stream { return c.stream }

// Stream is a CUDA stream; the zero value is the legacy default stream.
type Stream struct{ s driver.Stream }

// Event is a CUDA event.
type Event struct{ e driver.Event }

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z uint32 }

// MemAlloc allocates n bytes of device memory directly (use an Arena for
// many small buffers).
func (c *Ctx) MemAlloc(n int) (DevicePtr, error) { return c.lib.MemAlloc(uint64(n)) }

// MemFree frees memory from MemAlloc.
func (c *Ctx) MemFree(p DevicePtr) error { return c.lib.MemFree(p) }

// MemInfo returns free and total device memory in bytes.
func (c *Ctx) MemInfo() (free, total uint64, err error) { return c.lib.MemGetInfo() }

// NewArena allocates one block of n bytes and returns a sub-allocator over it.
// Free the block with Arena.Release.
func (c *Ctx) NewArena(n int) (*Arena, error) {
	p, err := c.lib.MemAlloc(uint64(n))
	if err != nil {
		return nil, err
	}
	return NewArenaAt(p, n), nil
}

// ReleaseArena frees an arena's block; every pointer from it becomes invalid.
func (c *Ctx) ReleaseArena(a *Arena) error { return c.lib.MemFree(a.Base()) }

// CopyToDevice copies src to dst after the work already queued on the
// compute stream and returns when the bytes are on the device (pageable
// source). A plain cuMemcpyHtoD from pageable memory may return before its
// DMA has finished and is not ordered with the compute stream (a
// non-blocking stream): a kernel queued right after it could read the old
// bytes, and the copy could overwrite a buffer a queued kernel still reads.
func (c *Ctx) CopyToDevice(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	err := c.lib.MemcpyHtoDAsync(dst, unsafe.Pointer(&src[0]), uint64(len(src)), c.stream.s)
	if err == nil {
		err = c.lib.StreamSynchronize(c.stream.s)
	}
	runtime.KeepAlive(src)
	return err
}

// CopyFromDevice copies len(dst) bytes from src synchronously, after waiting
// for work already queued on the compute stream.
func (c *Ctx) CopyFromDevice(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	if err := c.lib.StreamSynchronize(c.stream.s); err != nil {
		return err
	}
	err := c.lib.MemcpyDtoH(unsafe.Pointer(&dst[0]), src, uint64(len(dst)))
	runtime.KeepAlive(dst)
	return err
}

// CopyFloatsToDevice copies a float32 slice to device memory (synchronous).
func (c *Ctx) CopyFloatsToDevice(dst DevicePtr, src []float32) error {
	if len(src) == 0 {
		return nil
	}
	return c.CopyToDevice(dst, unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), 4*len(src)))
}

// CopyFloatsFromDevice copies len(dst) float32 values from device memory
// after the compute stream's queued work.
func (c *Ctx) CopyFloatsFromDevice(dst []float32, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	return c.CopyFromDevice(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*len(dst)), src)
}

// CopyAsync enqueues a device→device copy on s.
func (c *Ctx) CopyAsync(dst, src DevicePtr, n int, s Stream) error {
	return c.lib.MemcpyDtoDAsync(dst, src, uint64(n), s.s)
}

// Memset enqueues filling n bytes at p with v on s.
func (c *Ctx) Memset(p DevicePtr, v byte, n int, s Stream) error {
	return c.lib.MemsetD8Async(p, v, uint64(n), s.s)
}

// HostBuffer is page-locked host memory: C memory from NewHostBuffer or
// NewMappedHostBuffer, or Go memory registered by RegisterHost. Copies from
// it run at full PCIe speed and may be asynchronous.
type HostBuffer struct {
	p   unsafe.Pointer
	n   int
	dev DevicePtr // device address of a mapped buffer (0: not mapped)
	// registered: p is Go memory page-locked by RegisterHost (the pointer
	// keeps it alive); FreeHost unregisters it instead of freeing.
	registered bool
}

// Bytes returns the buffer's memory; it is valid until FreeHost.
func (h *HostBuffer) Bytes() []byte { return unsafe.Slice((*byte)(h.p), h.n) }

// NewHostBuffer allocates n bytes of pinned host memory.
func (c *Ctx) NewHostBuffer(n int) (*HostBuffer, error) {
	p, err := c.lib.MemHostAlloc(uint64(n), 0)
	if err != nil {
		return nil, err
	}
	return &HostBuffer{p: p, n: n}, nil
}

// Len returns the buffer's size in bytes.
func (h *HostBuffer) Len() int { return h.n }

// NewMappedHostBuffer allocates n bytes of pinned host memory that is also
// mapped into the device's address space: kernels can read it at
// DevicePtr (every read crosses PCIe). Free it with FreeHost.
func (c *Ctx) NewMappedHostBuffer(n int) (*HostBuffer, error) {
	p, err := c.lib.MemHostAlloc(uint64(n), driver.HostAllocPortable|driver.HostAllocDeviceMap)
	if err != nil {
		return nil, err
	}
	d, err := c.lib.MemHostGetDevicePointer(p)
	if err != nil {
		_ = c.lib.MemFreeHost(p)
		return nil, err
	}
	return &HostBuffer{p: p, n: n, dev: d}, nil
}

// DevicePtr returns the device address of a mapped buffer's byte off (0 for a
// buffer from NewHostBuffer).
func (h *HostBuffer) DevicePtr(off int) DevicePtr {
	if h.dev == 0 {
		return 0
	}
	return h.dev + DevicePtr(off)
}

// RegisterHost page-locks b's memory, which stays the caller's: the
// returned buffer's Bytes is b, asynchronous copies into it run at pinned
// speed, and FreeHost unregisters it (b must not be reused for another
// registration before that). The buffer keeps b alive. b must not be empty.
func (c *Ctx) RegisterHost(b []byte) (*HostBuffer, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("cuda: registering an empty host slice")
	}
	p := unsafe.Pointer(&b[0])
	if err := c.lib.MemHostRegister(p, uint64(len(b)), 0); err != nil {
		return nil, err
	}
	return &HostBuffer{p: p, n: len(b), registered: true}, nil
}

// FreeHost frees a pinned buffer (unregisters one from RegisterHost).
func (c *Ctx) FreeHost(h *HostBuffer) error {
	if h.registered {
		return c.lib.MemHostUnregister(h.p)
	}
	return c.lib.MemFreeHost(h.p)
}

// UploadAsync enqueues a copy of h[off:off+n] to dst on s; h must not be
// written until the stream passes this point.
func (c *Ctx) UploadAsync(dst DevicePtr, h *HostBuffer, off, n int, s Stream) error {
	if off < 0 || n < 0 || off+n > h.n {
		return fmt.Errorf("cuda: upload of [%d, %d) from a %d-byte host buffer", off, off+n, h.n)
	}
	return c.lib.MemcpyHtoDAsync(dst, unsafe.Add(h.p, off), uint64(n), s.s)
}

// DownloadAsync enqueues a copy of n bytes at src into h[off:off+n] on s.
func (c *Ctx) DownloadAsync(h *HostBuffer, off int, src DevicePtr, n int, s Stream) error {
	if off < 0 || n < 0 || off+n > h.n {
		return fmt.Errorf("cuda: download of [%d, %d) into a %d-byte host buffer", off, off+n, h.n)
	}
	return c.lib.MemcpyDtoHAsync(unsafe.Add(h.p, off), src, uint64(n), s.s)
}

// NewStream creates a non-blocking stream.
func (c *Ctx) NewStream() (Stream, error) {
	s, err := c.lib.StreamCreate(1)
	return Stream{s: s}, err
}

// DestroyStream destroys a stream made by NewStream.
func (c *Ctx) DestroyStream(s Stream) error { return c.lib.StreamDestroy(s.s) }

// Sync waits for all work queued on s.
func (c *Ctx) Sync(s Stream) error { return c.lib.StreamSynchronize(s.s) }

// NewEvent creates an event (with timing when timing is true).
func (c *Ctx) NewEvent(timing bool) (Event, error) {
	f := uint32(driver.EventDefault)
	if !timing {
		f = driver.EventDisableTiming
	}
	e, err := c.lib.EventCreate(f)
	return Event{e: e}, err
}

// DestroyEvent destroys an event.
func (c *Ctx) DestroyEvent(e Event) error { return c.lib.EventDestroy(e.e) }

// Record records e on s.
func (c *Ctx) Record(e Event, s Stream) error { return c.lib.EventRecord(e.e, s.s) }

// StreamWait makes work enqueued on s after this call wait until the work
// captured by e's latest Record has completed; the host does not block.
func (c *Ctx) StreamWait(s Stream, e Event) error { return c.lib.StreamWaitEvent(s.s, e.e) }

// WaitEvent blocks until e has completed.
func (c *Ctx) WaitEvent(e Event) error { return c.lib.EventSynchronize(e.e) }

// Elapsed returns the milliseconds between two completed timing events.
func (c *Ctx) Elapsed(start, end Event) (float64, error) {
	ms, err := c.lib.EventElapsed(start.e, end.e)
	return float64(ms), err
}

// Launch enqueues kernel f on s with the given shapes and dynamic shared
// memory. args are pointers to the kernel's argument values, in order (e.g.
// unsafe.Pointer(&n) for an int32 n); they are pinned for the call, and the
// driver copies the values before Launch returns.
func (c *Ctx) Launch(f *Kernel, grid, block Dim3, shared int, s Stream, args ...unsafe.Pointer) error {
	if knockedOut(f.name) {
		return nil
	}
	f.launches++
	f.threads, f.shared = int(block.X*max(block.Y, 1)*max(block.Z, 1)), shared
	var pin runtime.Pinner
	defer pin.Unpin()
	var params unsafe.Pointer
	if len(args) > 0 {
		for _, a := range args {
			pin.Pin(a)
		}
		pin.Pin(&args[0])
		params = unsafe.Pointer(&args[0])
	}
	launch := c.lib.LaunchKernel
	if f.pdl && c.d.pdl {
		launch = c.lib.LaunchKernelPDL
	}
	if err := launch(f.fn, grid.X, max(grid.Y, 1), max(grid.Z, 1), block.X, max(block.Y, 1), max(block.Z, 1), uint32(shared), s.s, params); err != nil {
		return fmt.Errorf("launching %s grid %v block %v: %w", f.name, grid, block, err)
	}
	return nil
}

// Graph is an instantiated CUDA graph.
type Graph struct {
	g driver.Graph
	e driver.GraphExe
}

// BeginCapture starts recording the work enqueued on s (relaxed mode) instead
// of running it; EndCapture turns it into a Graph.
func (c *Ctx) BeginCapture(s Stream) error {
	return c.lib.StreamBeginCapture(s.s, driver.CaptureRelaxed)
}

// EndCapture ends the capture on s and instantiates the graph.
func (c *Ctx) EndCapture(s Stream) (*Graph, error) {
	g, err := c.lib.StreamEndCapture(s.s)
	if err != nil {
		return nil, err
	}
	e, err := c.lib.GraphInstantiate(g)
	if err != nil {
		_ = c.lib.GraphDestroy(g)
		return nil, err
	}
	return &Graph{g: g, e: e}, nil
}

// LaunchGraph enqueues g on s.
func (c *Ctx) LaunchGraph(g *Graph, s Stream) error { return c.lib.GraphLaunch(g.e, s.s) }

// DestroyGraph frees g.
func (c *Ctx) DestroyGraph(g *Graph) error {
	err := c.lib.GraphExecDestroy(g.e)
	if err2 := c.lib.GraphDestroy(g.g); err == nil {
		err = err2
	}
	return err
}

// CopyTableExpert enqueues on s, without waiting, a copy of expert se's
// argument records in table src over expert e's records in table dst, so
// that launches through dst enqueued after it use src's expert se for
// expert e (a device→device copy of three records; no host copy, no
// synchronisation). The tables must hold experts of one format and shape.
func (c *Ctx) CopyTableExpert(dst *ExpertTable, e int, src *ExpertTable, se int, s Stream) error {
	if e < 0 || e >= dst.E || se < 0 || se >= src.E {
		return fmt.Errorf("cuda expert table: copy of expert %d of %d over expert %d of %d", se, src.E, e, dst.E)
	}
	if dst.Inter != src.Inter || dst.Dim != src.Dim || dst.w1.Format != src.w1.Format || dst.w1.Block != src.w1.Block {
		return fmt.Errorf("cuda expert table: copy between tables of %v [%d, %d] and %v [%d, %d] experts", src.w1.Format, src.Inter, src.Dim, dst.w1.Format, dst.Inter, dst.Dim)
	}
	rec := DevicePtr(unsafe.Sizeof(linArgs{}))
	if err := c.CopyAsync(dst.all13.args+DevicePtr(2*e)*rec, src.all13.args+DevicePtr(2*se)*rec, int(2*rec), s); err != nil {
		return err
	}
	return c.CopyAsync(dst.all2.args+DevicePtr(e)*rec, src.all2.args+DevicePtr(se)*rec, int(rec), s)
}
