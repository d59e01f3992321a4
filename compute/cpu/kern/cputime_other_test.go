//go:build !unix

package kern

import "time"

func processCPUTime() (time.Duration, bool) { return 0, false }
