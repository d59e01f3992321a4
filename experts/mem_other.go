//go:build !linux

package experts

import "os"

// allocBuf returns n zeroed bytes (Go heap on systems without the mmap path).
func allocBuf(n int) ([]byte, error) { return make([]byte, n), nil }

func freeBuf([]byte) error { return nil }

// populateWrite is not available here: prefault touches the pages instead.
func populateWrite([]byte) error { return errPopulateUnsupported }

func adviseSequential(*os.File) {}
