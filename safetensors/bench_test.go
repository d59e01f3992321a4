package safetensors

import (
	"io"
	"moxie/internal/cputime"

	"fmt"
	"moxie/format"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"moxie/dsv4/config"
)

// flashShardCount is the number of shards of the shipped DeepSeek-V4-Flash.
const flashShardCount = 46

// buildFlashShards writes the DeepSeek-V4-Flash tensor inventory, in layout order,
// as 46 sparse shard files in dir: real headers, data sections of the full size
// but never written (the files hold holes). It returns the paths, the total data
// bytes and the total header bytes.
func buildFlashShards(tb testing.TB, dir string) (paths []string, dataBytes, headerBytes int64) {
	tb.Helper()
	layout := config.Layout(config.Flash())
	var total int64
	for _, t := range layout {
		total += t.Bytes()
	}
	// Cut in order at the k/46 points of the cumulative size.
	var start int
	var cum int64
	for k := range flashShardCount {
		limit := total * int64(k+1) / flashShardCount
		end := start
		for end < len(layout) && (cum < limit || k == flashShardCount-1) {
			cum += layout[end].Bytes()
			end++
		}
		specs := make([]TensorSpec, 0, end-start)
		sizes := make([]int64, 0, end-start)
		var shardData int64
		for _, t := range layout[start:end] {
			s := TensorSpec{Name: t.Name, DType: t.DType, Shape: t.Shape}
			n, err := checkSpec(s)
			if err != nil {
				tb.Fatal(err)
			}
			specs = append(specs, s)
			sizes = append(sizes, n)
			shardData += n
		}
		hdr := encodeHeader(specs, sizes, map[string]string{"format": "pt"})
		p := filepath.Join(dir, fmt.Sprintf("model-%05d-of-%05d.safetensors", k+1, flashShardCount))
		f, err := os.Create(p)
		if err != nil {
			tb.Fatal(err)
		}
		if _, err := f.Write(hdr); err != nil {
			tb.Fatal(err)
		}
		if err := f.Truncate(int64(len(hdr)) + shardData); err != nil {
			tb.Fatal(err)
		}
		if err := f.Close(); err != nil {
			tb.Fatal(err)
		}
		paths = append(paths, p)
		dataBytes += shardData
		headerBytes += int64(len(hdr))
		start = end
	}
	if start != len(layout) {
		tb.Fatalf("split left %d tensors", len(layout)-start)
	}
	return paths, dataBytes, headerBytes
}

// TestFlashShardsSparse checks the benchmark fixture itself: 46 valid shards
// whose tensors add up to the shipped index's total_size.
func TestFlashShardsSparse(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 46 shard headers")
	}
	paths, data, _ := buildFlashShards(t, t.TempDir())
	const flashTotal = 159609485896 // metadata.total_size of the shipped index
	if data != flashTotal {
		t.Fatalf("data bytes %d, want %d", data, flashTotal)
	}
	var n int
	var sum int64
	for _, p := range paths {
		ts, _, err := ReadHeader(p)
		if err != nil {
			t.Fatal(err)
		}
		n += len(ts)
		for _, ti := range ts {
			sum += ti.Size
		}
	}
	if n != len(config.Layout(config.Flash())) || sum != flashTotal {
		t.Fatalf("read %d tensors, %d bytes", n, sum)
	}
}

// reportCPU adds a cpu-ns/op metric (process CPU time, GC included), which is
// less sensitive than wall time to other load on the machine.
func reportCPU(b *testing.B, start int64) {
	b.ReportMetric(float64(int64(cputime.Process())-start)/float64(b.N), "cpu-ns/op")
}

// BenchmarkOpen46Shards times reading all 46 V4-Flash shard headers (one op =
// all 46 files): ReadHeader only, Open+Close (mmap), and ReadHeader on one
// goroutine per shard.
func BenchmarkOpen46Shards(b *testing.B) {
	paths, data, hdrBytes := buildFlashShards(b, b.TempDir())
	b.Logf("46 shards: %d data bytes (sparse), %d header bytes", data, hdrBytes)
	b.Run("ReadHeader", func(b *testing.B) {
		b.SetBytes(hdrBytes)
		defer reportCPU(b, int64(cputime.Process()))
		for b.Loop() {
			for _, p := range paths {
				if _, _, err := ReadHeader(p); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("Open", func(b *testing.B) {
		b.SetBytes(hdrBytes)
		defer reportCPU(b, int64(cputime.Process()))
		for b.Loop() {
			for _, p := range paths {
				f, err := Open(p)
				if err != nil {
					b.Fatal(err)
				}
				f.Close()
			}
		}
	})
	b.Run("ReadHeaderConcurrent", func(b *testing.B) {
		b.SetBytes(hdrBytes)
		defer reportCPU(b, int64(cputime.Process()))
		for b.Loop() {
			var wg sync.WaitGroup
			errs := make([]error, len(paths))
			for i, p := range paths {
				wg.Go(func() { _, _, errs[i] = ReadHeader(p) })
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}

// BenchmarkWrite times Create + Write of every tensor + Close (fsync and rename
// included) for a 64 MiB file, as big tensors and as many small ones, and a
// WriteFrom copy of the same file out of a mapped source.
func BenchmarkWrite(b *testing.B) {
	const total = 64 << 20
	for _, c := range []struct {
		name string
		n    int
	}{{"16x4MiB", 16}, {"8192x8KiB", 8192}} {
		specs := make([]TensorSpec, c.n)
		for i := range specs {
			specs[i] = TensorSpec{Name: fmt.Sprintf("layers.%d.w", i), DType: format.BF16, Shape: []int64{int64(total / c.n / 2)}}
		}
		data := make([]byte, total/c.n)
		for i := range data {
			data[i] = byte(i * 31)
		}
		dir := b.TempDir()
		p := filepath.Join(dir, "w.safetensors")
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(total)
			for b.Loop() {
				w, err := Create(p, specs, nil)
				if err != nil {
					b.Fatal(err)
				}
				for _, s := range specs {
					if err := w.Write(s.Name, data); err != nil {
						b.Fatal(err)
					}
				}
				if err := w.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/WriteFrom", func(b *testing.B) {
			src, err := Open(p)
			if err != nil {
				b.Fatal(err)
			}
			defer src.Close()
			q := filepath.Join(dir, "copy.safetensors")
			b.SetBytes(total)
			for b.Loop() {
				w, err := Create(q, specs, nil)
				if err != nil {
					b.Fatal(err)
				}
				for _, ti := range src.Tensors() {
					if err := w.WriteFrom(ti.Name, io.NewSectionReader(src, ti.Offset, ti.Size)); err != nil {
						b.Fatal(err)
					}
				}
				if err := w.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
