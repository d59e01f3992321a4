package kern

import (
	"math/rand/v2"
	"testing"
)

// Cache-resident variants of the matvec benchmarks: Micro* fit in L2 (the
// kernels' compute rate), L3* in the last-level cache.

func BenchmarkMicroFP8(b *testing.B) {
	ms, size := fp8CopiesN(256, 1024, 1)
	x := randX(rand.New(rand.NewPCG(3, 4)), 1024)
	y := make([]float32, 256)
	b.SetBytes(int64(size))
	c := startCPU()
	for b.Loop() {
		ms[0].MatMul(nil, y, x, 1)
	}
	reportGBs(b, c, 1, size)
}

func BenchmarkMicroMX(b *testing.B) {
	ms, size := mxCopiesN(256, 2048, 1)
	x := randX(rand.New(rand.NewPCG(3, 4)), 2048)
	y := make([]float32, 256)
	b.SetBytes(int64(size))
	c := startCPU()
	for b.Loop() {
		ms[0].MatMul(nil, y, x, 1)
	}
	reportGBs(b, c, 1, size)
}
func BenchmarkMicroBF16(b *testing.B) {
	m := randBF(rand.New(rand.NewPCG(3, 4)), 256, 1024)
	x := randX(rand.New(rand.NewPCG(3, 4)), 1024)
	y := make([]float32, 256)
	size := len(m.W)
	b.SetBytes(int64(size))
	c := startCPU()
	for b.Loop() {
		m.MatMul(nil, y, x, 1)
	}
	reportGBs(b, c, 1, size)
}

func BenchmarkL3FP8(b *testing.B) {
	ms, size := fp8CopiesN(4096, 8192, 2)
	benchMatVec(b, ms, size)
}

func BenchmarkL3MX(b *testing.B) {
	ms, size := mxCopiesN(2048, 4096, 8)
	benchMatVec(b, ms, size)
}

func BenchmarkL3FP8WqB(b *testing.B) {
	ms, size := fp8CopiesN(32768, 1024, 2)
	benchMatVec(b, ms, size)
}
