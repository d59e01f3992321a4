//go:build amd64

package kern

// cpuPause executes one spin-wait hint (PAUSE).
func cpuPause()
