package cputime

import (
	"syscall"
	"time"
	"unsafe"
)

// Thread is the CPU time the calling OS thread has used
// (CLOCK_THREAD_CPUTIME_ID), or 0 where it cannot be read. Callers should lock
// the goroutine to its thread for the measured span.
func Thread() time.Duration {
	var ts syscall.Timespec
	const clockThreadCPUTimeID = 3
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		return 0
	}
	return time.Duration(ts.Nano())
}
