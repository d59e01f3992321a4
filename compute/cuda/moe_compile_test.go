package cuda

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"testing"
	"unsafe"
)

// TestMoECompile compiles kernels/moe.cu for sm_90 (compileModuleForTest:
// no GPU needed, skipped without NVRTC) and checks that the CUBIN defines
// both kernels of every MoEVariant, with their register counts and stack
// frames logged (NVRTC 11.8: the stage 1 kernels at 128 registers keep
// 8-32 bytes of frame, spilled around the double-precision sigmoid's
// slow-path call). The .cu file's static_asserts check the MoeArgs/LinRec
// sizes at compile time.
func TestMoECompile(t *testing.T) {
	img := compileModuleForTest(t, "moe", MoESource())
	res := cubinResources(t, img)
	for v := range moeVariantCount {
		n1, n2 := moeKernelNames(v)
		requireKernels(t, img, n1, n2)
		for _, n := range []string{n1, n2} {
			r, ok := res[n]
			if !ok {
				t.Errorf("%v: %s has no register count in the CUBIN's .nv.info", v, n)
				continue
			}
			t.Logf("%v: %s: %d registers, %d-byte stack frame", v, n, r.regs, r.frame)
		}
	}
}

// kernelResources is what a CUBIN's .nv.info section records of a kernel.
type kernelResources struct{ regs, frame int }

// The .nv.info attributes read (EIATTR_*: 4-byte symbol index, 4-byte value).
const (
	eiattrFrameSize = 0x11
	eiattrRegCount  = 0x2f
)

// cubinResources reads every kernel's register count and stack frame size
// from the CUBIN's global .nv.info section; it fails t when img is not ELF.
func cubinResources(t *testing.T, cubin []byte) map[string]kernelResources {
	t.Helper()
	if len(cubin) < 24 {
		t.Fatalf("CUBIN of %d bytes", len(cubin))
	}
	img := bytes.Clone(cubin)
	img[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	binary.LittleEndian.PutUint32(img[20:], uint32(elf.EV_CURRENT))
	f, err := elf.NewFile(bytes.NewReader(img))
	if err != nil {
		t.Fatalf("CUBIN: %v", err)
	}
	syms, err := f.Symbols()
	if err != nil {
		t.Fatalf("CUBIN symbols: %v", err)
	}
	sec := f.Section(".nv.info")
	if sec == nil {
		t.Fatalf("CUBIN has no .nv.info section")
	}
	b, err := sec.Data()
	if err != nil {
		t.Fatalf("CUBIN .nv.info: %v", err)
	}
	out := map[string]kernelResources{}
	for len(b) >= 2 {
		format, attr := b[0], b[1]
		b = b[2:]
		var val []byte
		switch format {
		case 1: // no value
		case 2: // one byte
			if len(b) < 1 {
				t.Fatalf(".nv.info truncated")
			}
			b = b[1:]
		case 3: // two bytes
			if len(b) < 2 {
				t.Fatalf(".nv.info truncated")
			}
			b = b[2:]
		case 4: // sized value
			if len(b) < 2 || len(b) < 2+int(binary.LittleEndian.Uint16(b)) {
				t.Fatalf(".nv.info truncated")
			}
			n := int(binary.LittleEndian.Uint16(b))
			val, b = b[2:2+n], b[2+n:]
		default:
			t.Fatalf(".nv.info: unknown attribute format %#x", format)
		}
		if (attr != eiattrRegCount && attr != eiattrFrameSize) || len(val) != 8 {
			continue
		}
		// Symbol indexes count from the ELF's null symbol, which
		// debug/elf's Symbols drops.
		i := int(binary.LittleEndian.Uint32(val)) - 1
		if i < 0 || i >= len(syms) {
			continue
		}
		r := out[syms[i].Name]
		if attr == eiattrRegCount {
			r.regs = int(binary.LittleEndian.Uint32(val[4:]))
		} else {
			r.frame = int(binary.LittleEndian.Uint32(val[4:]))
		}
		out[syms[i].Name] = r
	}
	return out
}

// TestMoEArgsMirror checks the Go mirror of MoeArgs: its size is the one
// kernels/moe.cu asserts, and E and Limit sit after 13 pointers and 6 ints
// as C lays them out.
func TestMoEArgsMirror(t *testing.T) {
	var a moeArgs
	if s := unsafe.Sizeof(a); s != 136 {
		t.Errorf("moeArgs is %d bytes, kernels/moe.cu's MoeArgs 136", s)
	}
	if o := unsafe.Offsetof(a.E); o != 104 {
		t.Errorf("moeArgs.E at %d, MoeArgs.E at 104", o)
	}
	if o := unsafe.Offsetof(a.Limit); o != 128 {
		t.Errorf("moeArgs.Limit at %d, MoeArgs.limit at 128", o)
	}
	for _, want := range []string{"sizeof(MoeArgs) == 136", "sizeof(LinRec) == 80"} {
		if !bytes.Contains([]byte(MoESource()), []byte(want)) {
			t.Errorf("kernels/moe.cu no longer asserts %q", want)
		}
	}
	if s := unsafe.Sizeof(linArgs{}); s != 80 {
		t.Errorf("linArgs is %d bytes, LinRec mirrors 80", s)
	}
}
