//go:build amd64 && goexperiment.simd

package kern

import "testing"

func BenchmarkDotFP8Only(b *testing.B) {
	q := make([]byte, 16384)
	xs := make([]float32, 16384)
	for i := range q {
		q[i] = byte(i * 7)
		xs[i] = 1
	}
	c := startCPU()
	var acc fp8Acc
	for b.Loop() {
		fp8Dot(q, xs, &acc)
	}
	reportGBs(b, c, 1, len(q))
}

func BenchmarkDotMXOnly(b *testing.B) {
	p := make([]byte, 8192+3)
	sc := make([]byte, 512)
	xs := make([]float32, 16384)
	for i := range p {
		p[i] = byte(i * 7)
	}
	for i := range sc {
		sc[i] = 120
	}
	for i := range xs {
		xs[i] = 1
	}
	c := startCPU()
	var s float32
	for b.Loop() {
		s += mxfp4Dot(p, sc, xs)
	}
	reportGBs(b, c, 1, len(p)-3+len(sc))
}

func BenchmarkDotF32Only(b *testing.B) {
	a := make([]float32, 4096)
	xs := make([]float32, 4096)
	c := startCPU()
	var s float32
	for b.Loop() {
		s += dotF32AVX512(a, xs)
	}
	reportGBs(b, c, 1, 4*len(a))
}
