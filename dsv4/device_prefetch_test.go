package dsv4

import (
	"strings"
	"testing"

	"moxie/compute"
	"moxie/compute/cuda"
)

func TestParsePrefetch(t *testing.T) {
	for _, tc := range []struct {
		in      string
		q, o, s bool
		a, m    bool
		mode    cuda.PrefetchMode
		err     string
	}{
		{in: ""},
		{in: "off"},
		{in: "q", q: true},
		{in: "o,s", o: true, s: true},
		{in: "all", q: true, o: true, s: true},
		{in: "a,m:bulk_el", a: true, m: true, mode: cuda.PrefetchBulkEvictLast},
		{in: "m", m: true},
		{in: "q,o:lines_el", q: true, o: true, mode: cuda.PrefetchLinesEvictLast},
		{in: "x", err: `unknown set "x"`},
		{in: "q:warp", err: "MOXIE_CUDA_PREFETCH"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			p, err := parsePrefetch(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.q != tc.q || p.o != tc.o || p.s != tc.s || p.a != tc.a || p.m != tc.m || p.opt.Mode != tc.mode || p.ok != (tc.q || tc.o || tc.s || tc.a || tc.m) {
				t.Fatalf("got q %v o %v s %v a %v m %v mode %v ok %v", p.q, p.o, p.s, p.a, p.m, p.opt.Mode, p.ok)
			}
		})
	}
}

// TestWeightRanges checks the byte spans of each stored format against the
// formats' definitions (FP8: a byte per value; MXFP4: two values a byte;
// BF16: two bytes; scales after the data).
func TestWeightRanges(t *testing.T) {
	for _, tc := range []struct {
		w    cuda.DeviceWeight
		want []cuda.L2Range
	}{
		{cuda.DeviceWeight{Format: compute.FP8Block, Rows: 256, Cols: 512, Block: 128, Data: 0x1000, Scale: 0x30000, Bytes: 256*512 + 2*4},
			[]cuda.L2Range{{Ptr: 0x1000, Bytes: 256 * 512}, {Ptr: 0x30000, Bytes: 8}}},
		{cuda.DeviceWeight{Format: compute.MXFP4, Rows: 64, Cols: 256, Data: 0x2000, Scale: 0x9000, Bytes: 64*128 + 64*8},
			[]cuda.L2Range{{Ptr: 0x2000, Bytes: 64 * 128}, {Ptr: 0x9000, Bytes: 64 * 8}}},
		{cuda.DeviceWeight{Format: compute.BF16, Rows: 3, Cols: 64, Data: 0x4000, Scale: 0x4000, Bytes: 3 * 64 * 2},
			[]cuda.L2Range{{Ptr: 0x4000, Bytes: 384}}},
	} {
		t.Run(tc.w.Format.String(), func(t *testing.T) {
			got := weightRanges(&tc.w, nil)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("got %v, want %v", got, tc.want)
				}
			}
		})
	}
}
