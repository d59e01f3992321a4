package driver

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

// NVRTC is the loaded run-time compiler.
type NVRTC struct {
	Path         string // the library that was opened
	Major, Minor int    // nvrtcVersion

	nvrtcGetErrorString, nvrtcVersion          uintptr
	nvrtcCreateProgram, nvrtcCompileProgram    uintptr
	nvrtcDestroyProgram                        uintptr
	nvrtcGetProgramLogSize, nvrtcGetProgramLog uintptr
	nvrtcGetCUBINSize, nvrtcGetCUBIN           uintptr
}

func (n *NVRTC) syms() []struct {
	name string
	slot *uintptr
} {
	return []struct {
		name string
		slot *uintptr
	}{
		{"nvrtcGetErrorString", &n.nvrtcGetErrorString},
		{"nvrtcVersion", &n.nvrtcVersion},
		{"nvrtcCreateProgram", &n.nvrtcCreateProgram},
		{"nvrtcCompileProgram", &n.nvrtcCompileProgram},
		{"nvrtcDestroyProgram", &n.nvrtcDestroyProgram},
		{"nvrtcGetProgramLogSize", &n.nvrtcGetProgramLogSize},
		{"nvrtcGetProgramLog", &n.nvrtcGetProgramLog},
		{"nvrtcGetCUBINSize", &n.nvrtcGetCUBINSize},
		{"nvrtcGetCUBIN", &n.nvrtcGetCUBIN},
	}
}

// LoadNVRTC opens the first NVRTC library found ($MOXIE_NVRTC, then
// libnvrtc.so.13, .12, unversioned, then /usr/local/cuda paths) and binds it.
// The error wraps ErrNoNVRTC and lists what was tried.
func LoadNVRTC() (*NVRTC, error) {
	var tried []string
	for _, p := range nvrtcCandidates() {
		h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			tried = append(tried, p)
			continue
		}
		n := &NVRTC{Path: p}
		for _, s := range n.syms() {
			f, err := purego.Dlsym(h, s.name)
			if err != nil || f == 0 {
				return nil, fmt.Errorf("%s lacks %s: %v", p, s.name, err)
			}
			*s.slot = f
		}
		var major, minor int32
		if err := n.check("nvrtcVersion", call(n.nvrtcVersion, uintptr(unsafe.Pointer(&major)), uintptr(unsafe.Pointer(&minor)))); err != nil {
			return nil, err
		}
		n.Major, n.Minor = int(major), int(minor)
		return n, nil
	}
	return nil, fmt.Errorf("%w: tried %s", ErrNoNVRTC, strings.Join(tried, ", "))
}

func (n *NVRTC) check(name string, r int32) error {
	if r == 0 {
		return nil
	}
	return &Error{Call: name, Code: int(r), Text: n.errorString(r)}
}

// cStringRet converts a returned C pointer; call's int32 result is too narrow
// for pointers, so nvrtcGetErrorString goes through SyscallN directly.
func (n *NVRTC) errorString(r int32) string {
	p, _, _ := purego.SyscallN(n.nvrtcGetErrorString, uintptr(r))
	return cString(p)
}

// Compile compiles one CUDA C++ source to a CUBIN for the architecture named
// in opts (e.g. "--gpu-architecture=sm_90"). On failure the error carries the
// compiler log.
func (n *NVRTC) Compile(src, name string, opts []string) ([]byte, error) {
	var prog uintptr
	s, nm := cStr(src), cStr(name)
	if r := call(n.nvrtcCreateProgram, uintptr(unsafe.Pointer(&prog)), uintptr(unsafe.Pointer(&s[0])), uintptr(unsafe.Pointer(&nm[0])), 0, 0, 0); r != 0 {
		return nil, &Error{Call: "nvrtcCreateProgram", Code: int(r), Text: n.errorString(r)}
	}
	defer call(n.nvrtcDestroyProgram, uintptr(unsafe.Pointer(&prog)))
	cs := make([][]byte, len(opts))
	ptrs := make([]*byte, len(opts)+1)
	for i, o := range opts {
		cs[i] = cStr(o)
		ptrs[i] = &cs[i][0]
	}
	r := call(n.nvrtcCompileProgram, prog, uintptr(len(opts)), uintptr(unsafe.Pointer(&ptrs[0])))
	var logSize uint64
	call(n.nvrtcGetProgramLogSize, prog, uintptr(unsafe.Pointer(&logSize)))
	log := ""
	if logSize > 1 {
		b := make([]byte, logSize)
		call(n.nvrtcGetProgramLog, prog, uintptr(unsafe.Pointer(&b[0])))
		log = strings.TrimSpace(string(b[:clen(b)]))
	}
	runtime.KeepAlive(cs) // the option strings were referenced from C through ptrs
	runtime.KeepAlive(ptrs)
	if r != 0 {
		return nil, fmt.Errorf("compiling %s with %v: %w\n%s", name, opts, &Error{Call: "nvrtcCompileProgram", Code: int(r), Text: n.errorString(r)}, log)
	}
	var size uint64
	if r := call(n.nvrtcGetCUBINSize, prog, uintptr(unsafe.Pointer(&size))); r != 0 {
		return nil, &Error{Call: "nvrtcGetCUBINSize", Code: int(r), Text: n.errorString(r)}
	}
	if size == 0 {
		return nil, errors.New("nvrtcGetCUBINSize: empty CUBIN (was a real sm_XX architecture given, not compute_XX?)")
	}
	cubin := make([]byte, size)
	if r := call(n.nvrtcGetCUBIN, prog, uintptr(unsafe.Pointer(&cubin[0]))); r != 0 {
		return nil, &Error{Call: "nvrtcGetCUBIN", Code: int(r), Text: n.errorString(r)}
	}
	return cubin, nil
}
