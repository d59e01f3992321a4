package cuda

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"testing"
	"time"

	"moxie/compute/cuda/driver"
)

// h200SharedOptin is the dynamic shared memory one block may opt in to on
// an H200: 227 KiB less the 1 KiB sm_90 reserves per block.
const h200SharedOptin = 227<<10 - 1<<10

// compileModuleForTest returns the sm_90 CUBIN of module name (source src,
// compiled as name.cu with the options Ctx.CompileOptions gives an H200)
// from the NVRTC found on this machine: no GPU needed; the test is skipped
// when no NVRTC loads (e.g. set
// MOXIE_NVRTC=/usr/lib/x86_64-linux-gnu/libnvrtc.so.11.2) and fails when
// the source does not compile. A CUBIN that the GPU tests already put in
// the disk cache under the same key (same source, options, NVRTC and
// sm_90) is used as is; nothing is written to the cache here.
func compileModuleForTest(t *testing.T, name, src string) []byte {
	t.Helper()
	nv, err := driver.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC: %v", err)
	}
	opts := []string{"--gpu-architecture=sm_90", "--std=c++17"}
	src = ModuleSource(src)
	if dir, err := CacheDir(); err == nil {
		if img, ok := readCache(dir, CacheKey(src, opts, nv.Major, nv.Minor, 9, 0)); ok {
			t.Logf("%s module: %d-byte CUBIN from the disk cache (NVRTC %d.%d)", name, len(img), nv.Major, nv.Minor)
			return img
		}
	}
	t0 := time.Now()
	img, err := nv.Compile(src, name+".cu", opts)
	if err != nil {
		t.Fatalf("%s.cu does not compile with NVRTC %d.%d (%s): %v", name, nv.Major, nv.Minor, nv.Path, err)
	}
	t.Logf("%s module: %d-byte CUBIN in %v (NVRTC %d.%d)", name, len(img), time.Since(t0).Round(time.Millisecond), nv.Major, nv.Minor)
	return img
}

// requireKernels fails t for each name that is not a global function
// (an extern "C" kernel, unmangled) of the CUBIN img.
func requireKernels(t *testing.T, img []byte, names ...string) {
	t.Helper()
	syms := kernelSymbols(t, img)
	for _, n := range names {
		if !syms[n] {
			t.Errorf("kernel %s is not in the compiled image", n)
		}
	}
}

// requireSharedFits fails t when kernel needs more dynamic shared memory
// than an H200 block may opt in to.
func requireSharedFits(t *testing.T, kernel string, need int) {
	t.Helper()
	if need > h200SharedOptin {
		t.Errorf("%s needs %d bytes of shared memory, more than the H200 allows (%d)", kernel, need, h200SharedOptin)
	}
}

// kernelSymbols returns the global function symbols of a CUBIN; it fails t
// when img is not ELF.
func kernelSymbols(t *testing.T, cubin []byte) map[string]bool {
	t.Helper()
	// CUBINs carry the CUDA ABI version in the ELF version fields, which
	// debug/elf rejects: read a copy with those set to EV_CURRENT.
	if len(cubin) < 24 {
		t.Fatalf("CUBIN of %d bytes", len(cubin))
	}
	img := bytes.Clone(cubin)
	img[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	binary.LittleEndian.PutUint32(img[20:], uint32(elf.EV_CURRENT))
	f, err := elf.NewFile(bytes.NewReader(img))
	if err != nil {
		t.Fatalf("NVRTC output is not ELF: %v", err)
	}
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && elf.ST_BIND(s.Info) == elf.STB_GLOBAL {
			out[s.Name] = true
		}
	}
	return out
}
