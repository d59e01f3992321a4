//go:build !linux

package cputime

import "time"

// Thread is 0: per-thread CPU time is read on Linux only.
func Thread() time.Duration { return 0 }
