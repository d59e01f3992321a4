//go:build unix

package tokenizer

import (
	"syscall"
	"time"
)

// processCPU is the user+system CPU time this process has used. Benchmarks
// report bytes per CPU-second next to wall-clock MB/s, because the shared
// test machine is often oversubscribed.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
