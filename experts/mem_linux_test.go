//go:build linux

package experts

import (
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"moxie/checkpoint"
	"moxie/compute/cpu"
)

// residentPages counts the pages of b (page-aligned) the kernel reports as
// present in memory (mincore).
func residentPages(t *testing.T, b []byte) int {
	t.Helper()
	page := os.Getpagesize()
	vec := make([]byte, (len(b)+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

func TestPrefault(t *testing.T) {
	page := os.Getpagesize()
	for _, tc := range []struct {
		name     string
		size     int
		populate func([]byte) error
		wantErr  error
	}{
		{"madvise", 3*page + prefaultPiece, populateWrite, nil},
		{"unsupported: touch each page", 5*page + prefaultPiece, func([]byte) error { return errPopulateUnsupported }, nil},
		{"out of memory", 2 * prefaultPiece, func([]byte) error { return errOutOfMemory }, errOutOfMemory},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := allocBuf(tc.size)
			if err != nil {
				t.Fatal(err)
			}
			defer freeBuf(b)
			pages := (tc.size + page - 1) / page
			if n := residentPages(t, b); n != 0 {
				t.Fatalf("%d of %d pages present before prefault", n, pages)
			}
			var calls atomic.Int64
			err = prefault(b, 3, func(p []byte) error { calls.Add(1); return tc.populate(p) })
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if tc.wantErr != nil {
				return
			}
			if n := residentPages(t, b); n != pages {
				t.Fatalf("%d of %d pages present after prefault", n, pages)
			}
			if calls.Load() != int64((tc.size+prefaultPiece-1)/prefaultPiece) {
				t.Fatalf("%d populate calls for %d bytes", calls.Load(), tc.size)
			}
			for i, v := range b {
				if v != 0 {
					t.Fatalf("byte %d = %d after prefault, want 0", i, v)
				}
			}
		})
	}
}

// TestNewBacksSlotMemory: a store's slot memory is present from New on, and
// Close releases it.
func TestNewBacksSlotMemory(t *testing.T) {
	src, err := checkpoint.Open("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	c := cfgOf(t, src)
	slots := []int{8, 3, 0, 1, 2}
	st, err := New(src, c, Options{Backend: cpu.New(1), Slots: slots})
	if err != nil {
		t.Fatal(err)
	}
	page := int64(os.Getpagesize())
	stride := (st.ExpertBytes() + page - 1) / page * page
	if want := 14 * stride; int64(len(st.mem)) != want || st.Stats().ResidentBytes != want {
		t.Fatalf("slot memory %d bytes (stats %d), want 14 slots of %d", len(st.mem), st.Stats().ResidentBytes, stride)
	}
	if n, want := residentPages(t, st.mem), int(14*stride/page); n != want {
		t.Fatalf("%d of %d pages of slot memory present after New", n, want)
	}
	for l, n := range slots {
		if int64(len(st.layers[l].mem)) != int64(n)*stride {
			t.Fatalf("layer %d has %d bytes of slots, want %d", l, len(st.layers[l].mem), int64(n)*stride)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if st.mem != nil {
		t.Fatal("Close kept the slot memory")
	}
	if _, err := st.Expert(0, 0); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("closed store: %v", err)
	}
}
