package cuda

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// TestPrefetchCompile compiles kernels/prefetch.cu for sm_90
// (compileModuleForTest: no GPU needed, skipped without NVRTC) and checks
// that the CUBIN defines every kernel PrefetchL2Ranges launches. With NVRTC
// 11.x the bulk kernels compile to their line fallback; the
// cp.async.bulk.prefetch path needs NVRTC 12+ (the GPU machine's).
func TestPrefetchCompile(t *testing.T) {
	requireKernels(t, compileModuleForTest(t, "prefetch", PrefetchSource()), prefetchKernelNames[:]...)
}

// TestPrefetchPlanErrors checks that bad ranges and options are refused
// with an error naming the fault.
func TestPrefetchPlanErrors(t *testing.T) {
	ok := []L2Range{{Ptr: 1 << 20, Bytes: 4096}}
	cases := []struct {
		name   string
		ranges []L2Range
		opt    PrefetchOptions
		want   string
	}{
		{"no ranges", nil, PrefetchOptions{}, "no ranges"},
		{"null pointer", []L2Range{{Ptr: 0, Bytes: 16}}, PrefetchOptions{}, "range 0 of 1 has a null pointer"},
		{"unaligned pointer", []L2Range{{Ptr: 1 << 20, Bytes: 16}, {Ptr: 1<<20 + 8, Bytes: 16}}, PrefetchOptions{}, "range 1 of 2 starts at 0x100008, not 16-byte aligned"},
		{"zero bytes", []L2Range{{Ptr: 1 << 20, Bytes: 0}}, PrefetchOptions{}, "range 0 of 1 has 0 bytes"},
		{"negative bytes", []L2Range{{Ptr: 1 << 20, Bytes: -5}}, PrefetchOptions{}, "has -5 bytes"},
		{"wraps", []L2Range{{Ptr: ^DevicePtr(0) &^ 15, Bytes: 32}}, PrefetchOptions{}, "wraps the address space"},
		{"negative blocks", ok, PrefetchOptions{Blocks: -1}, "-1 blocks"},
		{"too many blocks", ok, PrefetchOptions{Blocks: PrefetchMaxBlocks + 1}, "1025 blocks"},
		{"chunk not a multiple of 16", ok, PrefetchOptions{Chunk: 1000}, "chunk of 1000 bytes"},
		{"negative chunk", ok, PrefetchOptions{Chunk: -16}, "chunk of -16 bytes"},
		{"chunk too big", ok, PrefetchOptions{Chunk: PrefetchMaxChunk + 16}, "chunk of 1048592 bytes"},
		{"unknown mode", ok, PrefetchOptions{Mode: 7}, "unknown mode 7"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, err := prefetchPlan(tc.ranges, tc.opt)
			if err == nil {
				t.Fatalf("no error, want one containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

// TestPrefetchPlanCoverage checks the launch plans: ranges in order, at
// most PrefetchMaxRanges per launch, and items of the plan's unit that
// cover each range exactly (the last item non-empty, none past the end).
func TestPrefetchPlanCoverage(t *testing.T) {
	// struct PfArgs: three arrays of PF_MAX 8-byte values, an int, an
	// unsigned; the kernel reads the argument with this layout.
	if got, want := unsafe.Sizeof(pfArgs{}), uintptr(3*8*PrefetchMaxRanges+4+4); got != want {
		t.Fatalf("pfArgs is %d bytes, struct PfArgs %d", got, want)
	}
	rng := rand.New(rand.NewPCG(5, 9))
	var many []L2Range
	for i := range 37 {
		many = append(many, L2Range{Ptr: DevicePtr(1<<30 + i<<24), Bytes: 1 + rng.IntN(3<<20)})
	}
	cases := []struct {
		name     string
		ranges   []L2Range
		opt      PrefetchOptions
		unit     int
		blocks   int
		kernel   string
		launches int
	}{
		{"one range defaults", []L2Range{{Ptr: 256, Bytes: 33554432}}, PrefetchOptions{}, PrefetchDefaultChunk, PrefetchDefaultBlocks, "prefetch_l2_bulk", 1},
		{"tail not a multiple of 16", []L2Range{{Ptr: 256, Bytes: 100003}}, PrefetchOptions{Mode: PrefetchBulkEvictLast, Chunk: 4096, Blocks: 3}, 4096, 3, "prefetch_l2_bulk_el", 1},
		{"lines ignore chunk", []L2Range{{Ptr: 16, Bytes: 1}, {Ptr: 4096, Bytes: 129}}, PrefetchOptions{Mode: PrefetchLines, Chunk: 4096}, 128, PrefetchDefaultBlocks, "prefetch_l2_lines", 1},
		{"37 ranges", many, PrefetchOptions{Mode: PrefetchLinesEvictLast, Blocks: 64}, 128, 64, "prefetch_l2_lines_el", 3},
		{"16 ranges one launch", many[:16], PrefetchOptions{Chunk: 1 << 20}, 1 << 20, PrefetchDefaultBlocks, "prefetch_l2_bulk", 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			plan, kernel, blocks, err := prefetchPlan(tc.ranges, tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			if kernel != tc.kernel || blocks != tc.blocks || len(plan) != tc.launches {
				t.Fatalf("kernel %s, %d blocks, %d launches; want %s, %d, %d", kernel, blocks, len(plan), tc.kernel, tc.blocks, tc.launches)
			}
			next := 0
			for li, a := range plan {
				if int(a.unit) != tc.unit {
					t.Fatalf("launch %d: unit %d, want %d", li, a.unit, tc.unit)
				}
				if a.n < 1 || a.n > PrefetchMaxRanges {
					t.Fatalf("launch %d: %d ranges", li, a.n)
				}
				var prev int64
				for k := range int(a.n) {
					r := tc.ranges[next]
					next++
					if a.ptr[k] != uint64(r.Ptr) || a.bytes[k] != uint64(r.Bytes) {
						t.Fatalf("launch %d slot %d: %d bytes at %#x, want range %d (%d bytes at %#x)", li, k, a.bytes[k], a.ptr[k], next-1, r.Bytes, uint64(r.Ptr))
					}
					items := a.end[k] - prev
					prev = a.end[k]
					// Items cover [0, items·unit); the last one must
					// start inside the range and reach its end.
					if items < 1 || (items-1)*int64(a.unit) >= int64(r.Bytes) || items*int64(a.unit) < int64(r.Bytes) {
						t.Fatalf("range %d: %d items of %d bytes for %d bytes", next-1, items, a.unit, r.Bytes)
					}
				}
			}
			if next != len(tc.ranges) {
				t.Fatalf("plan holds %d ranges, want %d", next, len(tc.ranges))
			}
		})
	}
}

func TestParsePrefetchMode(t *testing.T) {
	for _, m := range []PrefetchMode{PrefetchBulk, PrefetchBulkEvictLast, PrefetchLines, PrefetchLinesEvictLast} {
		got, err := ParsePrefetchMode(m.String())
		if err != nil || got != m {
			t.Errorf("ParsePrefetchMode(%q) = %v, %v; want %v", m.String(), got, err, m)
		}
	}
	if m, err := ParsePrefetchMode(""); err != nil || m != PrefetchBulk {
		t.Errorf(`ParsePrefetchMode("") = %v, %v; want bulk`, m, err)
	}
	if _, err := ParsePrefetchMode("evict"); err == nil || !strings.Contains(err.Error(), `"evict"`) {
		t.Errorf(`ParsePrefetchMode("evict") error %v, want one naming "evict"`, err)
	}
}

// TestPrefetchL2 runs every mode over a random buffer (one whole range,
// and 21 ranges of odd sizes, some overlapping, one ending at the buffer's
// last byte) and checks that the buffer is unchanged afterwards and that
// bad arguments are refused without a launch.
func TestPrefetchL2(t *testing.T) {
	dev := testDevice(t)
	const size = 3<<20 + 48
	rng := rand.New(rand.NewPCG(8, 1))
	want := randomBytes(rng, size)
	err := dev.Do(func(c *Ctx) error {
		if err := c.LoadPrefetch(); err != nil {
			return err
		}
		buf, err := uploadBytes(c, want)
		if err != nil {
			return err
		}
		defer c.MemFree(buf)
		odd := []L2Range{{Ptr: buf + size - 32, Bytes: 32}, {Ptr: buf + size - 16, Bytes: 16}}
		for range 19 {
			off := 16 * rng.IntN((size-1)/16)
			odd = append(odd, L2Range{Ptr: buf + DevicePtr(off), Bytes: 1 + rng.IntN(size-off)})
		}
		s := c.Stream()
		for _, mode := range []PrefetchMode{PrefetchBulk, PrefetchBulkEvictLast, PrefetchLines, PrefetchLinesEvictLast} {
			for _, blocks := range []int{1, 8, 200} {
				opt := PrefetchOptions{Mode: mode, Blocks: blocks, Chunk: 4096}
				if err := c.PrefetchL2Ranges([]L2Range{{Ptr: buf, Bytes: size}}, opt, s); err != nil {
					return fmt.Errorf("%v, %d blocks, whole buffer: %w", mode, blocks, err)
				}
				if err := c.PrefetchL2Ranges(odd, opt, s); err != nil {
					return fmt.Errorf("%v, %d blocks, %d ranges: %w", mode, blocks, len(odd), err)
				}
			}
		}
		if err := c.PrefetchL2(buf, size, s); err != nil {
			return err
		}
		if err := c.Sync(s); err != nil {
			return fmt.Errorf("after the prefetch kernels: %w", err)
		}
		for _, bad := range []struct {
			p    DevicePtr
			n    int
			want string
		}{{buf + 4, 64, "not 16-byte aligned"}, {buf, 0, "0 bytes"}} {
			if err := c.PrefetchL2(bad.p, bad.n, s); err == nil || !strings.Contains(err.Error(), bad.want) {
				return fmt.Errorf("PrefetchL2(%#x, %d): error %v, want one containing %q", uint64(bad.p), bad.n, err, bad.want)
			}
		}
		got := make([]byte, size)
		if err := c.CopyFromDevice(got, buf); err != nil {
			return err
		}
		if i := firstDiff(got, want); i >= 0 {
			return fmt.Errorf("byte %d of the buffer is %#x after prefetching, was %#x", i, got[i], want[i])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestPrefetchL2Graph captures a prefetch forked onto a side stream and
// joined back (the pattern of a decode graph) beside a copy on the capture
// stream, replays the graph three times and checks the copy and that the
// prefetched source is unchanged.
func TestPrefetchL2Graph(t *testing.T) {
	dev := testDevice(t)
	const size = 1 << 20
	want := randomBytes(rand.New(rand.NewPCG(3, 3)), size)
	err := dev.Do(func(c *Ctx) error {
		if err := c.LoadPrefetch(); err != nil {
			return err
		}
		src, err := uploadBytes(c, want)
		if err != nil {
			return err
		}
		defer c.MemFree(src)
		dst, err := c.MemAlloc(size)
		if err != nil {
			return err
		}
		defer c.MemFree(dst)
		s := c.Stream()
		side, err := c.NewStream()
		if err != nil {
			return err
		}
		defer c.DestroyStream(side)
		fork, err := c.NewEvent(false)
		if err != nil {
			return err
		}
		defer c.DestroyEvent(fork)
		join, err := c.NewEvent(false)
		if err != nil {
			return err
		}
		defer c.DestroyEvent(join)
		if err := c.Sync(s); err != nil {
			return err
		}
		if err := c.BeginCapture(s); err != nil {
			return err
		}
		capture := func() error {
			if err := prefetchBeside(c, fork, s, side, []L2Range{{Ptr: src, Bytes: size}, {Ptr: src, Bytes: 4096}}, PrefetchOptions{Blocks: 2}); err != nil {
				return err
			}
			if err := c.Record(join, side); err != nil {
				return err
			}
			if err := c.Memset(dst, 0, size, s); err != nil {
				return err
			}
			if err := c.CopyAsync(dst, src, size, s); err != nil {
				return err
			}
			return c.StreamWait(s, join)
		}
		cerr := capture()
		g, err := c.EndCapture(s)
		if cerr != nil {
			if err == nil {
				c.DestroyGraph(g)
			}
			return cerr
		}
		if err != nil {
			return err
		}
		defer c.DestroyGraph(g)
		for range 3 {
			if err := c.LaunchGraph(g, s); err != nil {
				return err
			}
		}
		for _, b := range []struct {
			name string
			p    DevicePtr
		}{{"copy", dst}, {"source", src}} {
			got := make([]byte, size)
			if err := c.CopyFromDevice(got, b.p); err != nil {
				return err
			}
			if i := firstDiff(got, want); i >= 0 {
				return fmt.Errorf("%s byte %d is %#x after 3 replays, want %#x", b.name, i, got[i], want[i])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// randomBytes returns n bytes drawn from rng.
func randomBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// uploadBytes allocates a device buffer of len(data) bytes and copies data
// into it; the caller frees it (c.MemFree).
func uploadBytes(c *Ctx, data []byte) (DevicePtr, error) {
	p, err := c.MemAlloc(len(data))
	if err != nil {
		return 0, err
	}
	if err := c.CopyToDevice(p, data); err != nil {
		c.MemFree(p)
		return 0, err
	}
	return p, nil
}

// prefetchBeside forks side off s (records fork on s, makes side wait for
// it) and queues PrefetchL2Ranges(ranges, opt) on side.
func prefetchBeside(c *Ctx, fork Event, s, side Stream, ranges []L2Range, opt PrefetchOptions) error {
	if err := c.Record(fork, s); err != nil {
		return err
	}
	if err := c.StreamWait(side, fork); err != nil {
		return err
	}
	return c.PrefetchL2Ranges(ranges, opt, side)
}

// firstDiff returns the first index where a and b differ (equal lengths),
// or -1.
func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// prefetchBenchSrc holds the benchmark's kernels: pf_bench_read (every
// thread sums four float4 of p, n float4 in all, so a launch streams the
// buffer once) and pf_bench_wait.
const prefetchBenchSrc = `
extern "C" __global__ void pf_bench_read(const float4 *__restrict__ p, long long n, float *out) {
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < 4; k++) {
    long long i = ((long long)blockIdx.x * 4 + k) * blockDim.x + threadIdx.x;
    if (i < n) {
      float4 v = __ldg(p + i);
      s += v.x + v.y + v.z + v.w;
    }
  }
  if (s == 1234.5678f) out[0] = s;
}

// pf_bench_wait stands in for a latency-bound phase: one thread spins
// until ns nanoseconds of the global timer have passed.
extern "C" __global__ void pf_bench_wait(long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while ((long long)(t - t0) < ns);
}
`

// BenchmarkPrefetchL2 times one streaming read of a 16 or 32 MiB buffer
// (us/read, median over b.N) in these states:
//
//	cold            L2 flushed (a 256 MiB read of another buffer) before
//	hot             right after a read of the same buffer: the L2 ceiling
//	after/MODE/bB   flushed, then PrefetchL2Ranges of the buffer (mode
//	                MODE, B blocks; /cNk: bulk chunks of N KiB, else the
//	                default) on a second stream, waited for by the host;
//	                pf-us is the prefetch kernel's own time (a bulk
//	                kernel may end before its requests have landed)
//	conc/MODE/bB    flushed, then the prefetch on a second stream and the
//	                read on the first start together; us/read is from the
//	                fork to the read's end
//	during/MODE/bB  flushed, then a 20 us one-thread wait kernel (a
//	                latency-bound phase) on the first stream with the
//	                prefetch beside it on the second, then the read, timed
//	                from the wait's end: the decode graph's use
func BenchmarkPrefetchL2(b *testing.B) {
	dev := testDevice(b)
	const flushBytes = 256 << 20
	sizes := []int{16 << 20, 32 << 20}
	var (
		read, wait *Kernel
		flush, buf DevicePtr
		sink       DevicePtr
		side       Stream
	)
	err := dev.Do(func(c *Ctx) error {
		if err := c.LoadPrefetch(); err != nil {
			return err
		}
		m, err := c.Module("prefetch_bench", prefetchBenchSrc)
		if err != nil {
			return err
		}
		if read, err = m.Kernel("pf_bench_read"); err != nil {
			return err
		}
		if wait, err = m.Kernel("pf_bench_wait"); err != nil {
			return err
		}
		if flush, err = c.MemAlloc(flushBytes); err != nil {
			return err
		}
		if buf, err = c.MemAlloc(slices.Max(sizes)); err != nil {
			return err
		}
		if sink, err = c.MemAlloc(16); err != nil {
			return err
		}
		if err := c.Memset(flush, 1, flushBytes, c.Stream()); err != nil {
			return err
		}
		if err := c.Memset(buf, 2, slices.Max(sizes), c.Stream()); err != nil {
			return err
		}
		if side, err = c.NewStream(); err != nil {
			return err
		}
		return c.Sync(c.Stream())
	})
	if err != nil {
		b.Fatal(err)
	}
	defer dev.Do(func(c *Ctx) error {
		c.DestroyStream(side)
		c.MemFree(sink)
		c.MemFree(buf)
		return c.MemFree(flush)
	})
	readOn := func(c *Ctx, p DevicePtr, size int, s Stream) error {
		n := int64(size / 16)
		grid := uint32((n + 1023) / 1024)
		return c.Launch(read, Dim3{X: grid}, Dim3{X: 256}, 0, s, unsafe.Pointer(&p), unsafe.Pointer(&n), unsafe.Pointer(&sink))
	}
	type state struct {
		name string
		opt  PrefetchOptions
		kind string // cold, hot, after, conc, during
	}
	states := []state{{name: "cold", kind: "cold"}, {name: "hot", kind: "hot"}}
	var opts []PrefetchOptions
	for _, mode := range []PrefetchMode{PrefetchBulk, PrefetchBulkEvictLast, PrefetchLines, PrefetchLinesEvictLast} {
		for _, blocks := range []int{4, 32} {
			opts = append(opts, PrefetchOptions{Mode: mode, Blocks: blocks})
		}
	}
	opts = append(opts, PrefetchOptions{Mode: PrefetchBulk, Blocks: 4, Chunk: 128 << 10}, PrefetchOptions{Mode: PrefetchBulk, Blocks: 1, Chunk: 1 << 20})
	for _, kind := range []string{"after", "conc", "during"} {
		for _, o := range opts {
			name := fmt.Sprintf("%s/%v/b%d", kind, o.Mode, o.Blocks)
			if o.Chunk != 0 {
				name += fmt.Sprintf("/c%dk", o.Chunk>>10)
			}
			states = append(states, state{name, o, kind})
		}
	}
	for _, size := range sizes {
		for _, st := range states {
			b.Run(fmt.Sprintf("%dMiB/%s", size>>20, st.name), func(b *testing.B) {
				var us, pfus []float64
				err := dev.Do(func(c *Ctx) error {
					s := c.Stream()
					fork, err := c.NewEvent(false)
					if err != nil {
						return err
					}
					defer c.DestroyEvent(fork)
					p0, err := c.NewEvent(true)
					if err != nil {
						return err
					}
					defer c.DestroyEvent(p0)
					p1, err := c.NewEvent(true)
					if err != nil {
						return err
					}
					defer c.DestroyEvent(p1)
					rng := []L2Range{{Ptr: buf, Bytes: size}}
					for range b.N {
						if st.kind == "hot" {
							err = readOn(c, buf, size, s)
						} else {
							err = readOn(c, flush, flushBytes, s)
						}
						if err != nil {
							return err
						}
						if st.kind == "after" {
							if err := c.Record(fork, s); err != nil {
								return err
							}
							if err := c.StreamWait(side, fork); err != nil {
								return err
							}
							if err := c.Record(p0, side); err != nil {
								return err
							}
							if err := c.PrefetchL2Ranges(rng, st.opt, side); err != nil {
								return err
							}
							if err := c.Record(p1, side); err != nil {
								return err
							}
							if err := c.WaitEvent(p1); err != nil {
								return err
							}
							ms, err := c.Elapsed(p0, p1)
							if err != nil {
								return err
							}
							pfus = append(pfus, ms*1e3)
						}
						if st.kind == "during" {
							if err := prefetchBeside(c, fork, s, side, rng, st.opt); err != nil {
								return err
							}
							ns := int64(20_000)
							if err := c.Launch(wait, Dim3{X: 1}, Dim3{X: 1}, 0, s, unsafe.Pointer(&ns)); err != nil {
								return err
							}
						}
						ms, err := deviceMS(c, s, func() error {
							if st.kind == "conc" {
								if err := prefetchBeside(c, fork, s, side, rng, st.opt); err != nil {
									return err
								}
							}
							return readOn(c, buf, size, s)
						})
						if err != nil {
							return err
						}
						us = append(us, ms*1e3)
						if err := c.Sync(side); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				med := median(us)
				b.ReportMetric(med, "us/read")
				b.ReportMetric(float64(size)/med/1e3, "GB/s")
				if len(pfus) > 0 {
					b.ReportMetric(median(pfus), "pf-us")
				}
			})
		}
	}
}
