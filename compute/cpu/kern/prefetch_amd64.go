//go:build amd64 && goexperiment.simd

package kern

// prefetch asks the CPU to bring the n bytes at p into the cache. It is a
// hint: it never faults and has no visible effect but speed.
//
//go:noescape
func prefetch(p *byte, n int)
