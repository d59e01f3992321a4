package format

import (
	"syscall"
	"time"
	"unsafe"
)

// threadCPUTime returns the CPU time consumed by the calling OS thread
// (CLOCK_THREAD_CPUTIME_ID), so benchmarks on a shared machine can report
// throughput per core-second actually received.
func threadCPUTime() (time.Duration, bool) {
	var ts syscall.Timespec
	const clockThreadCPUTimeID = 3
	_, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0)
	if errno != 0 {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
