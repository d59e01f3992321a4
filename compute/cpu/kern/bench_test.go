package kern

import (
	"fmt"
	"math/rand/v2"
	"moxie/internal/cputime"
	"runtime"
	"testing"
	"time"
)

// Speed benchmarks (never assertions). Weight benchmarks rotate over enough
// distinct copies that their total (>= 512 MiB) exceeds the last-level cache
// (260 MiB on the development machine), so they measure DRAM reads. The
// GB/s metric counts stored weight bytes (codes + scales) read per second;
// compare it with BenchmarkMemRead, the machine's read bandwidth.

const benchTotal = 512 << 20

func fillBytes(rng *rand.Rand, b []byte) {
	for i := 0; i+8 <= len(b); i += 8 {
		v := rng.Uint64()
		for k := range 8 {
			b[i+k] = byte(v >> (8 * k))
		}
	}
}

func workerCounts() []int {
	if n := runtime.NumCPU(); n > 1 {
		return []int{1, n}
	}
	return []int{1}
}

// BenchmarkMemRead sums a 1 GiB float32 buffer split over the pool's
// workers: the read-bandwidth ceiling for the matvec kernels.
func BenchmarkMemRead(b *testing.B) {
	buf := make([]float32, (1<<30)/4)
	for i := range buf {
		buf[i] = float32(i & 1023)
	}
	for _, w := range workerCounts() {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			p := NewPool(w)
			defer p.Close()
			const unit = 1 << 16
			sums := make([]float32, len(buf)/unit)
			b.SetBytes(int64(len(buf) * 4))
			c := startCPU()
			for b.Loop() {
				p.Run(len(buf)/unit, func(lo, hi int) {
					for u := lo; u < hi; u++ {
						sums[u] = ReadSum(buf[u*unit : (u+1)*unit])
					}
				})
			}
			reportGBs(b, c, w, len(buf)*4)
		})
	}
}

// cpuClock measures the CPU time a benchmark loop receives.
type cpuClock struct {
	t0 time.Duration
	ok bool
}

func startCPU() cpuClock {
	t := cputime.Process()
	ok := t > 0
	return cpuClock{t, ok}
}

// reportGBs adds "GB/s" (bytes per wall-clock second) and, where the OS
// reports CPU time, "GB/s-cpu": bytes per second of CPU time received times
// the number of workers, i.e. the rate if every worker had a core to itself
// (the development machine is shared with other jobs; when it is idle the
// two agree).
func reportGBs(b *testing.B, c cpuClock, workers, bytesPerOp int) {
	total := float64(bytesPerOp) * float64(b.N)
	b.ReportMetric(total/b.Elapsed().Seconds()/1e9, "GB/s")
	if t1 := cputime.Process(); c.ok && t1 > c.t0 {
		b.ReportMetric(total/(t1-c.t0).Seconds()*float64(workers)/1e9, "GB/s-cpu")
	}
}

// benchMatVec runs m[i%len(m)].MatMul over the copies with batch 1.
func benchMatVec(b *testing.B, ms []Matrix, bytesPer int) {
	_, cols := ms[0].Dims()
	rows, _ := ms[0].Dims()
	x := randX(rand.New(rand.NewPCG(3, 4)), cols)
	y := make([]float32, rows)
	for _, w := range workerCounts() {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			p := NewPool(w)
			defer p.Close()
			b.SetBytes(int64(bytesPer))
			i := 0
			c := startCPU()
			for b.Loop() {
				ms[i%len(ms)].MatMul(p, y, x, 1)
				i++
			}
			reportGBs(b, c, w, bytesPer)
		})
	}
}

func fp8Copies(rows, cols int) ([]Matrix, int) {
	size := rows*cols + ceilDiv(rows, 128)*ceilDiv(cols, 128)
	return fp8CopiesN(rows, cols, max(2, ceilDiv(benchTotal, size)))
}

func fp8CopiesN(rows, cols, n int) ([]Matrix, int) {
	rng := rand.New(rand.NewPCG(5, 6))
	size := rows*cols + ceilDiv(rows, 128)*ceilDiv(cols, 128)
	ms := make([]Matrix, n)
	for i := range ms {
		q := make([]byte, rows*cols)
		fillBytes(rng, q)
		s := make([]byte, ceilDiv(rows, 128)*ceilDiv(cols, 128))
		for j := range s {
			s[j] = byte(115 + rng.IntN(8))
		}
		ms[i] = FP8Block{Q: q, Scale: s, Rows: rows, Cols: cols, Block: 128}
	}
	return ms, size
}

func mxCopies(rows, cols int) ([]Matrix, int) {
	size := rows*cols/2 + rows*cols/32
	return mxCopiesN(rows, cols, max(2, ceilDiv(benchTotal, size)))
}

func mxCopiesN(rows, cols, n int) ([]Matrix, int) {
	rng := rand.New(rand.NewPCG(7, 8))
	size := rows*cols/2 + rows*cols/32
	ms := make([]Matrix, n)
	for i := range ms {
		p := make([]byte, rows*cols/2)
		fillBytes(rng, p)
		s := make([]byte, rows*cols/32)
		for j := range s {
			s[j] = byte(115 + rng.IntN(8))
		}
		ms[i] = MXFP4{Packed: p, Scale: s, Rows: rows, Cols: cols}
	}
	return ms, size
}

func BenchmarkMatVecFP8(b *testing.B) {
	for _, s := range []struct {
		name       string
		rows, cols int
	}{{"wq_b_32768x1024", 32768, 1024}, {"wo_b_4096x8192", 4096, 8192}} {
		b.Run(s.name, func(b *testing.B) {
			ms, size := fp8Copies(s.rows, s.cols)
			benchMatVec(b, ms, size)
		})
	}
}

func BenchmarkMatVecMXFP4(b *testing.B) {
	for _, s := range []struct {
		name       string
		rows, cols int
	}{{"w13_2048x4096", 2048, 4096}, {"w2_4096x2048", 4096, 2048}} {
		b.Run(s.name, func(b *testing.B) {
			ms, size := mxCopies(s.rows, s.cols)
			benchMatVec(b, ms, size)
		})
	}
}

func BenchmarkMatVecBF16(b *testing.B) {
	const rows, cols = 4096, 4096
	rng := rand.New(rand.NewPCG(9, 10))
	size := 2 * rows * cols
	ms := make([]Matrix, ceilDiv(benchTotal, size))
	for i := range ms {
		w := make([]byte, size)
		fillBytes(rng, w)
		for j := 1; j < len(w); j += 2 {
			// Random sign and mantissa, exponent 2^-5 or 2^-4: normal
			// values like trained weights (subnormal weights would measure
			// the CPU's slow path for denormal multiply inputs instead).
			w[j] = w[j]&0x80 | 0x3D
		}
		ms[i] = BF16{W: w, Rows: rows, Cols: cols}
	}
	benchMatVec(b, ms, size)
}

// BenchmarkMatMulFP8 is the prefill case: batch 16 against wo_b's shape.
// The metric is GFLOP/s (2 flops per weight per batch row).
func BenchmarkMatMulFP8(b *testing.B) {
	const rows, cols, batch = 4096, 8192, 16
	ms, _ := fp8Copies(rows, cols)
	ms = ms[:4]
	x := randX(rand.New(rand.NewPCG(3, 4)), batch*cols)
	y := make([]float32, batch*rows)
	for _, w := range workerCounts() {
		b.Run(fmt.Sprintf("batch=%d/workers=%d", batch, w), func(b *testing.B) {
			p := NewPool(w)
			defer p.Close()
			i := 0
			c := startCPU()
			for b.Loop() {
				ms[i%len(ms)].MatMul(p, y, x, batch)
				i++
			}
			flops := 2 * float64(rows*cols*batch) * float64(b.N)
			b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			if t1 := cputime.Process(); c.ok && t1 > c.t0 {
				b.ReportMetric(flops/(t1-c.t0).Seconds()*float64(w)/1e9, "GFLOP/s-cpu")
			}
		})
	}
}

// BenchmarkMatMulBatch times batched products (prefill, MoE experts with
// the tokens routed to them) in GFLOP/s (2·rows·cols·batch per op). The
// weights are a few copies, so they are partly cache-resident: this measures
// the arithmetic, not DRAM.
func BenchmarkMatMulBatch(b *testing.B) {
	rng := rand.New(rand.NewPCG(11, 12))
	bf := func(rows, cols int) []Matrix {
		w := make([]byte, 2*rows*cols)
		fillBytes(rng, w)
		for j := 1; j < len(w); j += 2 {
			w[j] = w[j]&0x80 | 0x3D // normal values (see BenchmarkMatVecBF16)
		}
		return []Matrix{BF16{W: w, Rows: rows, Cols: cols}}
	}
	fp8, _ := fp8CopiesN(4096, 4096, 2)
	mx, _ := mxCopiesN(2048, 4096, 2)
	mx256, _ := mxCopiesN(256, 384, 2)
	mx384, _ := mxCopiesN(384, 256, 2)
	cases := []struct {
		name    string
		ms      []Matrix
		batches []int
	}{
		{"FP8_4096x4096", fp8, []int{16, 64, 256}},
		{"MXFP4_2048x4096", mx, []int{16, 64, 256}},
		{"BF16_8192x384", bf(8192, 384), []int{512}},
		{"BF16_384x384", bf(384, 384), []int{4, 8, 64}},
		// brown-mini's routed experts (w1/w3, w2) at their average batch.
		{"MXFP4_256x384", mx256, []int{64}},
		{"MXFP4_384x256", mx384, []int{64}},
	}
	for _, cs := range cases {
		rows, cols := cs.ms[0].Dims()
		for _, batch := range cs.batches {
			x := randX(rand.New(rand.NewPCG(3, 4)), batch*cols)
			y := make([]float32, batch*rows)
			for _, w := range workerCounts() {
				b.Run(fmt.Sprintf("%s/batch=%d/workers=%d", cs.name, batch, w), func(b *testing.B) {
					p := NewPool(w)
					defer p.Close()
					i := 0
					c := startCPU()
					for b.Loop() {
						cs.ms[i%len(cs.ms)].MatMul(p, y, x, batch)
						i++
					}
					flops := 2 * float64(rows*cols*batch) * float64(b.N)
					b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, "GFLOP/s")
					if t1 := cputime.Process(); c.ok && t1 > c.t0 {
						b.ReportMetric(flops/(t1-c.t0).Seconds()*float64(w)/1e9, "GFLOP/s-cpu")
					}
				})
			}
		}
	}
}
