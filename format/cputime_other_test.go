//go:build !linux

package format

import "time"

func threadCPUTime() (time.Duration, bool) { return 0, false }
