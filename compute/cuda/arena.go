package cuda

import (
	"fmt"
	"sort"
)

// ArenaAlign is the alignment of every arena allocation in bytes (enough for
// 16-byte vector loads and for cudaMalloc-like coalescing).
const ArenaAlign = 256

// Arena sub-allocates one block of device memory: first fit over a free list
// sorted by address, with neighbours merged on Free (a bump allocator while
// nothing is freed). It does only bookkeeping, so it is not tied to the device
// thread; it is not safe for concurrent use.
type Arena struct {
	base DevicePtr
	size int
	free []span      // sorted by off, non-adjacent
	used map[int]int // off → size of live allocations
	peak int
	live int
}

type span struct{ off, n int }

// NewArenaAt returns an arena managing [base, base+size). The caller owns the
// block (Ctx.NewArena allocates it and Ctx.ReleaseArena frees it).
func NewArenaAt(base DevicePtr, size int) *Arena {
	a := &Arena{base: base, size: size, used: map[int]int{}}
	a.Reset()
	return a
}

// Base returns the block's start address.
func (a *Arena) Base() DevicePtr { return a.base }

// Size returns the block's size in bytes.
func (a *Arena) Size() int { return a.size }

// Live returns the bytes currently allocated (after alignment).
func (a *Arena) Live() int { return a.live }

// Peak returns the largest Live seen since the last Reset.
func (a *Arena) Peak() int { return a.peak }

// Reset frees every allocation at once.
func (a *Arena) Reset() {
	a.free = append(a.free[:0], span{0, a.size - a.size%ArenaAlign})
	clear(a.used)
	a.live, a.peak = 0, 0
}

// Alloc returns n bytes (n > 0), aligned to ArenaAlign. The error says how
// much was asked for and how much is free.
func (a *Arena) Alloc(n int) (DevicePtr, error) {
	if n <= 0 {
		return 0, fmt.Errorf("cuda arena: allocation of %d bytes", n)
	}
	need := (n + ArenaAlign - 1) / ArenaAlign * ArenaAlign
	for i, s := range a.free {
		if s.n < need {
			continue
		}
		off := s.off
		if s.n == need {
			a.free = append(a.free[:i], a.free[i+1:]...)
		} else {
			a.free[i] = span{s.off + need, s.n - need}
		}
		a.used[off] = need
		a.live += need
		a.peak = max(a.peak, a.live)
		return a.base + DevicePtr(off), nil
	}
	return 0, fmt.Errorf("cuda arena: out of memory: %d bytes asked, %d of %d free (largest piece %d)",
		n, a.size-a.live, a.size, a.largest())
}

func (a *Arena) largest() int {
	m := 0
	for _, s := range a.free {
		m = max(m, s.n)
	}
	return m
}

// Free returns an allocation to the arena; freeing anything that Alloc did
// not return (or freeing twice) is an error.
func (a *Arena) Free(p DevicePtr) error {
	if p < a.base || p >= a.base+DevicePtr(a.size) {
		return fmt.Errorf("cuda arena: free of %#x outside [%#x, %#x)", uint64(p), uint64(a.base), uint64(a.base)+uint64(a.size))
	}
	off := int(p - a.base)
	n, ok := a.used[off]
	if !ok {
		return fmt.Errorf("cuda arena: free of %#x, which is not a live allocation", uint64(p))
	}
	delete(a.used, off)
	a.live -= n
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].off > off })
	a.free = append(a.free, span{})
	copy(a.free[i+1:], a.free[i:])
	a.free[i] = span{off, n}
	// Merge with the next, then the previous neighbour.
	if i+1 < len(a.free) && a.free[i].off+a.free[i].n == a.free[i+1].off {
		a.free[i].n += a.free[i+1].n
		a.free = append(a.free[:i+1], a.free[i+2:]...)
	}
	if i > 0 && a.free[i-1].off+a.free[i-1].n == a.free[i].off {
		a.free[i-1].n += a.free[i].n
		a.free = append(a.free[:i], a.free[i+1:]...)
	}
	return nil
}
