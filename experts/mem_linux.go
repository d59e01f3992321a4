//go:build linux

package experts

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// allocBuf returns n bytes of zeroed anonymous memory outside the Go heap, so
// that tens of gigabytes of resident experts do not drive garbage-collector
// pacing (go-gpu-and-cpu.md §5.1). Release it with freeBuf.
func allocBuf(n int) ([]byte, error) {
	return syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
}

func freeBuf(b []byte) error { return syscall.Munmap(b) }

// adviseSequential tells the kernel that f is read in sequential runs
// (larger readahead); advice is best effort.
func adviseSequential(f *os.File) {
	_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_SEQUENTIAL)
}
