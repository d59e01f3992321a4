package format

import (
	"math/rand/v2"
	"moxie/internal/cputime"
	"runtime"
	"testing"
)

// loop runs fn b.N times and, where the OS reports per-thread CPU time, adds a
// "GB/s-cpu" metric: source bytes per second of CPU time this thread received
// (robust against other processes sharing the cores; wall-clock MB/s is the
// standard metric next to it).
func loop(b *testing.B, srcBytes int, fn func()) {
	b.SetBytes(int64(srcBytes))
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t0 := cputime.Thread()
	ok := t0 > 0
	for b.Loop() {
		fn()
	}
	if t1 := cputime.Thread(); ok && t1 > t0 {
		b.ReportMetric(float64(srcBytes)*float64(b.N)/(t1-t0).Seconds()/1e9, "GB/s-cpu")
	}
}

// Benchmarks decode one row of a DeepSeek-V4 shape into an L1/L2-resident
// buffer; b.SetBytes counts SOURCE bytes (elements plus scales).

// realScales returns n E8M0 scale bytes in the range trained weights use
// (2^-12 .. 2^-4 for block-scaled E4M3 / E2M1 weights), keeping products normal.
func realScales(rng *rand.Rand, n int) []byte {
	s := make([]byte, n)
	for i := range s {
		s[i] = byte(115 + rng.IntN(9))
	}
	return s
}

func BenchmarkDecodeFP8BlockRow(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	const cols, block = 4096, 128
	q := randBytes(rng, cols)
	sc := realScales(rng, cols/block)
	dst := make([]float32, cols)
	loop(b, len(q)+len(sc), func() { DecodeFP8BlockRow(dst, q, sc, block) })
}

func BenchmarkDecodeMXFP8Row(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	const cols = 4096
	q := randBytes(rng, cols)
	sc := realScales(rng, cols/32)
	dst := make([]float32, cols)
	loop(b, len(q)+len(sc), func() { DecodeMXFP8Row(dst, q, sc) })
}

func BenchmarkDecodeMXFP4Row(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 3))
	const cols = 2048
	p := randBytes(rng, cols/2)
	sc := realScales(rng, cols/32)
	dst := make([]float32, cols)
	loop(b, len(p)+len(sc), func() { DecodeMXFP4Row(dst, p, sc) })
}

func BenchmarkDecodeBF16(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 4))
	const cols = 4096
	src := randBytes(rng, 2*cols)
	dst := make([]float32, cols)
	loop(b, len(src), func() { DecodeBF16(dst, src) })
}

func BenchmarkDecodeE4M3(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 5))
	const cols = 4096
	src := randBytes(rng, cols)
	dst := make([]float32, cols)
	loop(b, len(src), func() { DecodeE4M3(dst, src) })
}
