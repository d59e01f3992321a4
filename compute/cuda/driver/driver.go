// Package driver binds the CUDA driver API (libcuda.so.1) and NVRTC
// (libnvrtc.so.*) through purego, so that moxie builds with CGO_ENABLED=0 and
// finds the libraries at run time. Every binding lives in one table per
// library (driverSyms, nvrtcSyms); the driver symbols are the explicit `_v2`
// entry points where cuda.h renames them.
//
// All calls are thin: a non-zero result becomes an *Error naming the call and
// carrying CUDA's own error name and text. The driver API's current context is
// per OS thread; this package does not manage threads (package cuda does).
package driver

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Error is a failed driver or NVRTC call.
type Error struct {
	Call string // the C function, e.g. "cuMemAlloc_v2"
	Code int    // CUresult or nvrtcResult
	Name string // e.g. "CUDA_ERROR_OUT_OF_MEMORY" (empty for NVRTC)
	Text string // CUDA's description of the code
}

func (e *Error) Error() string {
	if e.Name != "" {
		return fmt.Sprintf("%s: %s (%s = %d)", e.Call, e.Text, e.Name, e.Code)
	}
	return fmt.Sprintf("%s: %s (%d)", e.Call, e.Text, e.Code)
}

// ErrNoDriver is wrapped by Load's error when libcuda.so.1 cannot be opened.
var ErrNoDriver = errors.New("no CUDA driver")

// ErrNoNVRTC is wrapped by LoadNVRTC's error when no NVRTC library is found.
var ErrNoNVRTC = errors.New("no NVRTC library")

// Driver API handle types (opaque pointers in C).
type (
	Context  uintptr
	Module   uintptr
	Function uintptr
	Stream   uintptr
	Event    uintptr
	Graph    uintptr
	GraphExe uintptr
	// DevicePtr is a CUdeviceptr: an address in device memory.
	DevicePtr uint64
)

// Device attributes used by moxie (CUdevice_attribute values).
const (
	AttrMaxThreadsPerBlock     = 1
	AttrClockRate              = 13 // kHz
	AttrMultiprocessorCount    = 16
	AttrMemoryClockRate        = 36 // kHz
	AttrGlobalMemoryBusWidth   = 37 // bits
	AttrL2CacheSize            = 38 // bytes
	AttrComputeCapabilityMajor = 75
	AttrComputeCapabilityMinor = 76
	AttrMaxSharedPerBlockOptin = 97
)

// Stream capture modes (CUstreamCaptureMode).
const (
	CaptureGlobal      = 0
	CaptureThreadLocal = 1
	CaptureRelaxed     = 2
)

// Event flags.
const (
	EventDefault       = 0
	EventDisableTiming = 2
)

// MemHostAlloc flags (CU_MEMHOSTALLOC_*).
const (
	// HostAllocPortable makes the memory pinned for every context.
	HostAllocPortable = 1
	// HostAllocDeviceMap maps the memory into the device's address space
	// (MemHostGetDevicePointer), so kernels can read it over PCIe.
	HostAllocDeviceMap = 2
)

// FuncAttrMaxDynamicShared is CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES.
const FuncAttrMaxDynamicShared = 8

// Lib is the loaded driver API. Its methods may be called from any goroutine,
// but context-dependent calls act on the calling OS thread's current context.
type Lib struct {
	handle uintptr

	cuGetErrorName, cuGetErrorString                                 uintptr
	cuInit, cuDriverGetVersion                                       uintptr
	cuDeviceGet, cuDeviceGetCount, cuDeviceGetName                   uintptr
	cuDeviceGetAttribute, cuDeviceTotalMem                           uintptr
	cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRelease              uintptr
	cuCtxSetCurrent, cuCtxSynchronize                                uintptr
	cuMemGetInfo, cuMemAlloc, cuMemFree                              uintptr
	cuMemHostAlloc, cuMemFreeHost                                    uintptr
	cuMemHostRegister, cuMemHostUnregister                           uintptr
	cuMemcpyHtoD, cuMemcpyDtoH, cuMemcpyHtoDAsync, cuMemcpyDtoHAsync uintptr
	cuMemcpyDtoDAsync, cuMemsetD8Async                               uintptr
	cuStreamCreate, cuStreamDestroy, cuStreamSynchronize             uintptr
	cuEventCreate, cuEventDestroy, cuEventRecord, cuEventSynchronize uintptr
	cuEventElapsedTime                                               uintptr
	cuStreamWaitEvent, cuMemHostGetDevicePointer                     uintptr
	cuModuleLoadData, cuModuleUnload, cuModuleGetFunction            uintptr
	cuFuncSetAttribute, cuFuncGetAttribute, cuLaunchKernel           uintptr
	cuStreamBeginCapture, cuStreamEndCapture                         uintptr
	cuGraphInstantiateWithFlags, cuGraphLaunch, cuGraphExecDestroy   uintptr
	cuGraphDestroy, cuOccupancyMaxActiveBlocksPerMultiprocessor      uintptr

	// Optional (newer drivers); 0 when absent.
	cuLaunchKernelEx uintptr
}

// driverSyms is the one table of driver API bindings: C symbol → slot.
func (l *Lib) driverSyms() []struct {
	name string
	slot *uintptr
} {
	return []struct {
		name string
		slot *uintptr
	}{
		{"cuGetErrorName", &l.cuGetErrorName},
		{"cuGetErrorString", &l.cuGetErrorString},
		{"cuInit", &l.cuInit},
		{"cuDriverGetVersion", &l.cuDriverGetVersion},
		{"cuDeviceGet", &l.cuDeviceGet},
		{"cuDeviceGetCount", &l.cuDeviceGetCount},
		{"cuDeviceGetName", &l.cuDeviceGetName},
		{"cuDeviceGetAttribute", &l.cuDeviceGetAttribute},
		{"cuDeviceTotalMem_v2", &l.cuDeviceTotalMem},
		{"cuDevicePrimaryCtxRetain", &l.cuDevicePrimaryCtxRetain},
		{"cuDevicePrimaryCtxRelease_v2", &l.cuDevicePrimaryCtxRelease},
		{"cuCtxSetCurrent", &l.cuCtxSetCurrent},
		{"cuCtxSynchronize", &l.cuCtxSynchronize},
		{"cuMemGetInfo_v2", &l.cuMemGetInfo},
		{"cuMemAlloc_v2", &l.cuMemAlloc},
		{"cuMemFree_v2", &l.cuMemFree},
		{"cuMemHostAlloc", &l.cuMemHostAlloc},
		{"cuMemFreeHost", &l.cuMemFreeHost},
		{"cuMemHostRegister_v2", &l.cuMemHostRegister},
		{"cuMemHostUnregister", &l.cuMemHostUnregister},
		{"cuMemcpyHtoD_v2", &l.cuMemcpyHtoD},
		{"cuMemcpyDtoH_v2", &l.cuMemcpyDtoH},
		{"cuMemcpyHtoDAsync_v2", &l.cuMemcpyHtoDAsync},
		{"cuMemcpyDtoHAsync_v2", &l.cuMemcpyDtoHAsync},
		{"cuMemcpyDtoDAsync_v2", &l.cuMemcpyDtoDAsync},
		{"cuMemsetD8Async", &l.cuMemsetD8Async},
		{"cuStreamCreate", &l.cuStreamCreate},
		{"cuStreamDestroy_v2", &l.cuStreamDestroy},
		{"cuStreamSynchronize", &l.cuStreamSynchronize},
		{"cuEventCreate", &l.cuEventCreate},
		{"cuEventDestroy_v2", &l.cuEventDestroy},
		{"cuEventRecord", &l.cuEventRecord},
		{"cuEventSynchronize", &l.cuEventSynchronize},
		{"cuEventElapsedTime", &l.cuEventElapsedTime},
		{"cuStreamWaitEvent", &l.cuStreamWaitEvent},
		{"cuMemHostGetDevicePointer_v2", &l.cuMemHostGetDevicePointer},
		{"cuModuleLoadData", &l.cuModuleLoadData},
		{"cuModuleUnload", &l.cuModuleUnload},
		{"cuModuleGetFunction", &l.cuModuleGetFunction},
		{"cuFuncSetAttribute", &l.cuFuncSetAttribute},
		{"cuFuncGetAttribute", &l.cuFuncGetAttribute},
		{"cuLaunchKernel", &l.cuLaunchKernel},
		{"cuStreamBeginCapture_v2", &l.cuStreamBeginCapture},
		{"cuStreamEndCapture", &l.cuStreamEndCapture},
		{"cuGraphInstantiateWithFlags", &l.cuGraphInstantiateWithFlags},
		{"cuGraphLaunch", &l.cuGraphLaunch},
		{"cuGraphExecDestroy", &l.cuGraphExecDestroy},
		{"cuGraphDestroy", &l.cuGraphDestroy},
		{"cuOccupancyMaxActiveBlocksPerMultiprocessor", &l.cuOccupancyMaxActiveBlocksPerMultiprocessor},
	}
}

// Load opens libcuda.so.1 (never the unversioned dev symlink) and binds every
// symbol of the table. The error wraps ErrNoDriver when the library is absent
// and names the first missing symbol otherwise.
func Load() (*Lib, error) {
	h, err := purego.Dlopen("libcuda.so.1", purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, fmt.Errorf("%w: cannot load libcuda.so.1: %v", ErrNoDriver, err)
	}
	l := &Lib{handle: h}
	for _, s := range l.driverSyms() {
		p, err := purego.Dlsym(h, s.name)
		if err != nil || p == 0 {
			return nil, fmt.Errorf("libcuda.so.1 lacks %s (driver too old?): %v", s.name, err)
		}
		*s.slot = p
	}
	if p, err := purego.Dlsym(h, "cuLaunchKernelEx"); err == nil {
		l.cuLaunchKernelEx = p // CUDA 12.0 and later
	}
	return l, nil
}

// call invokes a C function with integer/pointer arguments and returns its
// int result. go:uintptrescapes keeps Go memory whose address is converted to
// uintptr in the argument list alive (and off the stack) for the call.
//
//go:uintptrescapes
func call(fn uintptr, args ...uintptr) int32 {
	r, _, _ := purego.SyscallN(fn, args...)
	return int32(r)
}

// cString returns the Go copy of a NUL-terminated C string.
func cString(p uintptr) string {
	if p == 0 {
		return ""
	}
	ptr := *(**byte)(unsafe.Pointer(&p))
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(ptr), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(ptr, n))
}

// cStr returns s as a NUL-terminated byte slice.
func cStr(s string) []byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return b
}

func (l *Lib) check(name string, r int32) error {
	if r == 0 {
		return nil
	}
	var pn, ps uintptr
	call(l.cuGetErrorName, uintptr(r), uintptr(unsafe.Pointer(&pn)))
	call(l.cuGetErrorString, uintptr(r), uintptr(unsafe.Pointer(&ps)))
	e := &Error{Call: name, Code: int(r), Name: cString(pn), Text: cString(ps)}
	if e.Text == "" {
		e.Text = "unknown CUDA error"
	}
	return e
}

// Init calls cuInit(0).
func (l *Lib) Init() error { return l.check("cuInit", call(l.cuInit, 0)) }

// DriverVersion returns the driver's CUDA version (e.g. 13000).
func (l *Lib) DriverVersion() (int, error) {
	var v int32
	err := l.check("cuDriverGetVersion", call(l.cuDriverGetVersion, uintptr(unsafe.Pointer(&v))))
	return int(v), err
}

// DeviceCount returns the number of CUDA devices.
func (l *Lib) DeviceCount() (int, error) {
	var n int32
	err := l.check("cuDeviceGetCount", call(l.cuDeviceGetCount, uintptr(unsafe.Pointer(&n))))
	return int(n), err
}

// Device returns the CUdevice of an ordinal.
func (l *Lib) Device(ordinal int) (int32, error) {
	var d int32
	err := l.check("cuDeviceGet", call(l.cuDeviceGet, uintptr(unsafe.Pointer(&d)), uintptr(ordinal)))
	return d, err
}

// DeviceName returns the device's marketing name.
func (l *Lib) DeviceName(dev int32) (string, error) {
	buf := make([]byte, 256)
	if err := l.check("cuDeviceGetName", call(l.cuDeviceGetName, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(dev))); err != nil {
		return "", err
	}
	return strings.TrimRight(string(buf[:clen(buf)]), " "), nil
}

func clen(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return len(b)
}

// Attribute reads one device attribute.
func (l *Lib) Attribute(dev int32, attr int) (int, error) {
	var v int32
	err := l.check("cuDeviceGetAttribute", call(l.cuDeviceGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(attr), uintptr(dev)))
	return int(v), err
}

// TotalMem returns the device's memory in bytes.
func (l *Lib) TotalMem(dev int32) (uint64, error) {
	var v uint64
	err := l.check("cuDeviceTotalMem_v2", call(l.cuDeviceTotalMem, uintptr(unsafe.Pointer(&v)), uintptr(dev)))
	return v, err
}

// PrimaryCtxRetain retains the device's primary context.
func (l *Lib) PrimaryCtxRetain(dev int32) (Context, error) {
	var c Context
	err := l.check("cuDevicePrimaryCtxRetain", call(l.cuDevicePrimaryCtxRetain, uintptr(unsafe.Pointer(&c)), uintptr(dev)))
	return c, err
}

// PrimaryCtxRelease releases a retain of the primary context.
func (l *Lib) PrimaryCtxRelease(dev int32) error {
	return l.check("cuDevicePrimaryCtxRelease_v2", call(l.cuDevicePrimaryCtxRelease, uintptr(dev)))
}

// CtxSetCurrent binds c to the calling OS thread.
func (l *Lib) CtxSetCurrent(c Context) error {
	return l.check("cuCtxSetCurrent", call(l.cuCtxSetCurrent, uintptr(c)))
}

// CtxSynchronize waits for all work of the current context.
func (l *Lib) CtxSynchronize() error {
	return l.check("cuCtxSynchronize", call(l.cuCtxSynchronize))
}

// MemGetInfo returns free and total device memory in bytes.
func (l *Lib) MemGetInfo() (free, total uint64, err error) {
	err = l.check("cuMemGetInfo_v2", call(l.cuMemGetInfo, uintptr(unsafe.Pointer(&free)), uintptr(unsafe.Pointer(&total))))
	return
}

// MemAlloc allocates n bytes of device memory.
func (l *Lib) MemAlloc(n uint64) (DevicePtr, error) {
	var p DevicePtr
	if err := l.check("cuMemAlloc_v2", call(l.cuMemAlloc, uintptr(unsafe.Pointer(&p)), uintptr(n))); err != nil {
		return 0, fmt.Errorf("allocating %d bytes: %w", n, err)
	}
	return p, nil
}

// MemFree frees device memory from MemAlloc.
func (l *Lib) MemFree(p DevicePtr) error {
	return l.check("cuMemFree_v2", call(l.cuMemFree, uintptr(p)))
}

// MemHostAlloc allocates n bytes of page-locked host memory; the returned
// pointer is C memory, freed with MemFreeHost.
func (l *Lib) MemHostAlloc(n uint64, flags uint32) (unsafe.Pointer, error) {
	var p uintptr
	if err := l.check("cuMemHostAlloc", call(l.cuMemHostAlloc, uintptr(unsafe.Pointer(&p)), uintptr(n), uintptr(flags))); err != nil {
		return nil, fmt.Errorf("pinning %d bytes: %w", n, err)
	}
	return *(*unsafe.Pointer)(unsafe.Pointer(&p)), nil
}

// MemFreeHost frees memory from MemHostAlloc.
func (l *Lib) MemFreeHost(p unsafe.Pointer) error {
	return l.check("cuMemFreeHost", call(l.cuMemFreeHost, uintptr(p)))
}

// MemHostRegister page-locks n bytes of existing host memory at p (flags:
// CU_MEMHOSTREGISTER_*, 0 for a plain registration), so that asynchronous
// copies into and out of it run as from MemHostAlloc memory. The memory
// must stay allocated until MemHostUnregister.
func (l *Lib) MemHostRegister(p unsafe.Pointer, n uint64, flags uint32) error {
	if err := l.check("cuMemHostRegister_v2", call(l.cuMemHostRegister, uintptr(p), uintptr(n), uintptr(flags))); err != nil {
		return fmt.Errorf("registering %d bytes of host memory: %w", n, err)
	}
	return nil
}

// MemHostUnregister undoes MemHostRegister (p is the registered address).
func (l *Lib) MemHostUnregister(p unsafe.Pointer) error {
	return l.check("cuMemHostUnregister", call(l.cuMemHostUnregister, uintptr(p)))
}

// MemHostGetDevicePointer returns the device address of host memory
// allocated with HostAllocDeviceMap (p may point inside the allocation).
func (l *Lib) MemHostGetDevicePointer(p unsafe.Pointer) (DevicePtr, error) {
	var d DevicePtr
	err := l.check("cuMemHostGetDevicePointer_v2", call(l.cuMemHostGetDevicePointer, uintptr(unsafe.Pointer(&d)), uintptr(p), 0))
	return d, err
}

// MemcpyHtoD copies n bytes from host src to device dst (synchronous).
func (l *Lib) MemcpyHtoD(dst DevicePtr, src unsafe.Pointer, n uint64) error {
	return l.check("cuMemcpyHtoD_v2", call(l.cuMemcpyHtoD, uintptr(dst), uintptr(src), uintptr(n)))
}

// MemcpyDtoH copies n bytes from device src to host dst (synchronous).
func (l *Lib) MemcpyDtoH(dst unsafe.Pointer, src DevicePtr, n uint64) error {
	return l.check("cuMemcpyDtoH_v2", call(l.cuMemcpyDtoH, uintptr(dst), uintptr(src), uintptr(n)))
}

// MemcpyHtoDAsync enqueues a host→device copy on s. src must stay valid (and
// should be pinned) until the copy completes.
func (l *Lib) MemcpyHtoDAsync(dst DevicePtr, src unsafe.Pointer, n uint64, s Stream) error {
	return l.check("cuMemcpyHtoDAsync_v2", call(l.cuMemcpyHtoDAsync, uintptr(dst), uintptr(src), uintptr(n), uintptr(s)))
}

// MemcpyDtoHAsync enqueues a device→host copy on s.
func (l *Lib) MemcpyDtoHAsync(dst unsafe.Pointer, src DevicePtr, n uint64, s Stream) error {
	return l.check("cuMemcpyDtoHAsync_v2", call(l.cuMemcpyDtoHAsync, uintptr(dst), uintptr(src), uintptr(n), uintptr(s)))
}

// MemcpyDtoDAsync enqueues a device→device copy on s.
func (l *Lib) MemcpyDtoDAsync(dst, src DevicePtr, n uint64, s Stream) error {
	return l.check("cuMemcpyDtoDAsync_v2", call(l.cuMemcpyDtoDAsync, uintptr(dst), uintptr(src), uintptr(n), uintptr(s)))
}

// MemsetD8Async enqueues setting n bytes at dst to v.
func (l *Lib) MemsetD8Async(dst DevicePtr, v byte, n uint64, s Stream) error {
	return l.check("cuMemsetD8Async", call(l.cuMemsetD8Async, uintptr(dst), uintptr(v), uintptr(n), uintptr(s)))
}

// StreamCreate creates a stream (flags 1 = non-blocking).
func (l *Lib) StreamCreate(flags uint32) (Stream, error) {
	var s Stream
	err := l.check("cuStreamCreate", call(l.cuStreamCreate, uintptr(unsafe.Pointer(&s)), uintptr(flags)))
	return s, err
}

// StreamDestroy destroys a stream.
func (l *Lib) StreamDestroy(s Stream) error {
	return l.check("cuStreamDestroy_v2", call(l.cuStreamDestroy, uintptr(s)))
}

// StreamSynchronize waits for s.
func (l *Lib) StreamSynchronize(s Stream) error {
	return l.check("cuStreamSynchronize", call(l.cuStreamSynchronize, uintptr(s)))
}

// StreamWaitEvent makes future work on s wait for the completion of the
// work captured by e's most recent EventRecord (the host does not wait).
func (l *Lib) StreamWaitEvent(s Stream, e Event) error {
	return l.check("cuStreamWaitEvent", call(l.cuStreamWaitEvent, uintptr(s), uintptr(e), 0))
}

// EventCreate creates an event.
func (l *Lib) EventCreate(flags uint32) (Event, error) {
	var e Event
	err := l.check("cuEventCreate", call(l.cuEventCreate, uintptr(unsafe.Pointer(&e)), uintptr(flags)))
	return e, err
}

// EventDestroy destroys an event.
func (l *Lib) EventDestroy(e Event) error {
	return l.check("cuEventDestroy_v2", call(l.cuEventDestroy, uintptr(e)))
}

// EventRecord records e on s.
func (l *Lib) EventRecord(e Event, s Stream) error {
	return l.check("cuEventRecord", call(l.cuEventRecord, uintptr(e), uintptr(s)))
}

// EventSynchronize waits for e.
func (l *Lib) EventSynchronize(e Event) error {
	return l.check("cuEventSynchronize", call(l.cuEventSynchronize, uintptr(e)))
}

// EventElapsed returns the milliseconds between two recorded events.
func (l *Lib) EventElapsed(start, end Event) (float32, error) {
	var ms float32
	err := l.check("cuEventElapsedTime", call(l.cuEventElapsedTime, uintptr(unsafe.Pointer(&ms)), uintptr(start), uintptr(end)))
	return ms, err
}

// ModuleLoadData loads a CUBIN image into the current context.
func (l *Lib) ModuleLoadData(image []byte) (Module, error) {
	if len(image) == 0 {
		return 0, errors.New("cuModuleLoadData: empty image")
	}
	var m Module
	err := l.check("cuModuleLoadData", call(l.cuModuleLoadData, uintptr(unsafe.Pointer(&m)), uintptr(unsafe.Pointer(&image[0]))))
	return m, err
}

// ModuleUnload unloads a module.
func (l *Lib) ModuleUnload(m Module) error {
	return l.check("cuModuleUnload", call(l.cuModuleUnload, uintptr(m)))
}

// ModuleGetFunction looks up a kernel by its (extern "C") name.
func (l *Lib) ModuleGetFunction(m Module, name string) (Function, error) {
	var f Function
	n := cStr(name)
	if err := l.check("cuModuleGetFunction", call(l.cuModuleGetFunction, uintptr(unsafe.Pointer(&f)), uintptr(m), uintptr(unsafe.Pointer(&n[0])))); err != nil {
		return 0, fmt.Errorf("kernel %q: %w", name, err)
	}
	return f, nil
}

// FuncGetAttribute reads a function attribute (e.g. 1, the static shared
// memory of the function in bytes).
func (l *Lib) FuncGetAttribute(f Function, attr int) (int, error) {
	var v int32
	err := l.check("cuFuncGetAttribute", call(l.cuFuncGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(attr), uintptr(f)))
	return int(v), err
}

// FuncSetAttribute sets a function attribute.
func (l *Lib) FuncSetAttribute(f Function, attr, value int) error {
	return l.check("cuFuncSetAttribute", call(l.cuFuncSetAttribute, uintptr(f), uintptr(attr), uintptr(value)))
}

// OccupancyMaxActiveBlocks returns how many blocks of f, each of block
// threads and dynamicShared bytes of dynamic shared memory, one
// multiprocessor holds at once (0: such a block does not fit at all).
func (l *Lib) OccupancyMaxActiveBlocks(f Function, block, dynamicShared int) (int, error) {
	var n int32
	err := l.check("cuOccupancyMaxActiveBlocksPerMultiprocessor", call(l.cuOccupancyMaxActiveBlocksPerMultiprocessor,
		uintptr(unsafe.Pointer(&n)), uintptr(f), uintptr(block), uintptr(dynamicShared)))
	return int(n), err
}

// LaunchKernel enqueues f on s. params points at an array of pointers, one
// per kernel argument, each pointing at the argument's value; the caller keeps
// (and pins) them for the duration of the call, after which the driver has
// copied the values.
func (l *Lib) LaunchKernel(f Function, gx, gy, gz, bx, by, bz, shared uint32, s Stream, params unsafe.Pointer) error {
	r, _, _ := purego.SyscallN(l.cuLaunchKernel, uintptr(f), uintptr(gx), uintptr(gy), uintptr(gz),
		uintptr(bx), uintptr(by), uintptr(bz), uintptr(shared), uintptr(s), uintptr(params), 0)
	return l.check("cuLaunchKernel", int32(r))
}

// launchConfig mirrors CUlaunchConfig (cuda.h, CUDA 12.0+).
type launchConfig struct {
	gx, gy, gz, bx, by, bz, shared uint32
	stream                         Stream
	attrs                          *launchAttr
	numAttrs                       uint32
}

// launchAttr mirrors CUlaunchAttribute: a 4-byte id, padding to 8, a 64-byte
// value union.
type launchAttr struct {
	id    uint32
	_     uint32
	value [64]byte
}

// attrProgrammaticStreamSerialization is
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION.
const attrProgrammaticStreamSerialization = 6

// HasLaunchEx reports whether the driver has cuLaunchKernelEx (CUDA 12.0+),
// which LaunchKernelPDL needs.
func (l *Lib) HasLaunchEx() bool { return l.cuLaunchKernelEx != 0 }

// LaunchKernelPDL is LaunchKernel with programmatic dependent launch: f may
// start before the kernel enqueued on s before it has finished, so f must
// execute griddepcontrol.wait before it reads that kernel's results or
// writes anything that kernel reads (sm_90+; a dependency on anything other
// than a kernel stays a full one). It needs HasLaunchEx.
func (l *Lib) LaunchKernelPDL(f Function, gx, gy, gz, bx, by, bz, shared uint32, s Stream, params unsafe.Pointer) error {
	if l.cuLaunchKernelEx == 0 {
		return fmt.Errorf("cuLaunchKernelEx: not in this driver (CUDA 12.0 or later needed)")
	}
	attr := launchAttr{id: attrProgrammaticStreamSerialization}
	attr.value[0] = 1 // programmaticStreamSerializationAllowed
	cfg := launchConfig{gx: gx, gy: gy, gz: gz, bx: bx, by: by, bz: bz, shared: shared, stream: s, attrs: &attr, numAttrs: 1}
	err := l.check("cuLaunchKernelEx", call(l.cuLaunchKernelEx, uintptr(unsafe.Pointer(&cfg)), uintptr(f), uintptr(params), 0))
	runtime.KeepAlive(&attr)
	return err
}

// StreamBeginCapture starts capturing s into a graph.
func (l *Lib) StreamBeginCapture(s Stream, mode int) error {
	return l.check("cuStreamBeginCapture_v2", call(l.cuStreamBeginCapture, uintptr(s), uintptr(mode)))
}

// StreamEndCapture ends the capture of s and returns the graph.
func (l *Lib) StreamEndCapture(s Stream) (Graph, error) {
	var g Graph
	err := l.check("cuStreamEndCapture", call(l.cuStreamEndCapture, uintptr(s), uintptr(unsafe.Pointer(&g))))
	return g, err
}

// GraphInstantiate makes an executable graph.
func (l *Lib) GraphInstantiate(g Graph) (GraphExe, error) {
	var e GraphExe
	err := l.check("cuGraphInstantiateWithFlags", call(l.cuGraphInstantiateWithFlags, uintptr(unsafe.Pointer(&e)), uintptr(g), 0))
	return e, err
}

// GraphLaunch enqueues an executable graph on s.
func (l *Lib) GraphLaunch(e GraphExe, s Stream) error {
	return l.check("cuGraphLaunch", call(l.cuGraphLaunch, uintptr(e), uintptr(s)))
}

// GraphExecDestroy destroys an executable graph.
func (l *Lib) GraphExecDestroy(e GraphExe) error {
	return l.check("cuGraphExecDestroy", call(l.cuGraphExecDestroy, uintptr(e)))
}

// GraphDestroy destroys a graph.
func (l *Lib) GraphDestroy(g Graph) error {
	return l.check("cuGraphDestroy", call(l.cuGraphDestroy, uintptr(g)))
}

// nvrtcCandidates lists where NVRTC is looked for, in order; $MOXIE_NVRTC
// (a path) comes first when set.
func nvrtcCandidates() []string {
	c := []string{}
	if p := os.Getenv("MOXIE_NVRTC"); p != "" {
		c = append(c, p)
	}
	return append(c,
		"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so",
		"/usr/local/cuda/lib64/libnvrtc.so.13", "/usr/local/cuda/lib64/libnvrtc.so.12", "/usr/local/cuda/lib64/libnvrtc.so",
		"/usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so.13", "/usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so.12",
	)
}
