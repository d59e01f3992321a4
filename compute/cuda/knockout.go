//go:build moxie_knockout

package cuda

import (
	"os"
	"strings"
)

// knockedOut reports whether a launch of the kernel called name is to be
// skipped: $MOXIE_KO is a comma-separated list of kernel-name prefixes
// (for example fuse_hc_finish,attndec_combine). Only binaries built with
// -tags moxie_knockout have it. Skipping kernels gives wrong results; it
// exists to time what a group of kernels costs inside a decode step (the
// step without them against the step with them), never to run a model.
func knockedOut(name string) bool {
	for p := range strings.SplitSeq(os.Getenv("MOXIE_KO"), ",") {
		if p != "" && strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}
