//go:build !amd64

package kern

// cpuPause is a spin-wait hint; this architecture has none wired up.
func cpuPause() {}
