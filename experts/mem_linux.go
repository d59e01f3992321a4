//go:build linux

package experts

import (
	"errors"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// allocBuf returns n bytes of zeroed, page-aligned anonymous memory outside
// the Go heap, so that tens of gigabytes of resident experts do not drive
// garbage-collector pacing (go-gpu-and-cpu.md §5.1). Its pages are not yet
// backed (see prefault). Release it with freeBuf.
func allocBuf(n int) ([]byte, error) {
	return syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
}

func freeBuf(b []byte) error { return syscall.Munmap(b) }

// populateWrite backs the pages of b (page-aligned, from allocBuf) with
// memory as a write fault would, in one call (MADV_POPULATE_WRITE, Linux
// 5.14+). errPopulateUnsupported means the kernel lacks it.
func populateWrite(b []byte) error {
	err := unix.Madvise(b, unix.MADV_POPULATE_WRITE)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ENOMEM):
		return errOutOfMemory
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM):
		return errPopulateUnsupported
	}
	return err
}

// adviseSequential tells the kernel that f is read in sequential runs
// (larger readahead); advice is best effort.
func adviseSequential(f *os.File) {
	_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_SEQUENTIAL)
}
