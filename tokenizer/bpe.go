package tokenizer

import (
	"container/heap"
	"sync"
)

// merge is one entry of the BPE merge table: the rank (priority, lower
// first) of merging a left and right token, and the id of the result.
type merge struct {
	rank int32
	id   int32
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// bpeModel is the byte-level BPE model: tokens are raw byte strings.
type bpeModel struct {
	vocab        map[string]int32 // raw bytes -> id, for tokens reachable from bytes
	byteID       [256]int32       // id of each single byte, -1 when absent
	merges       map[uint64]merge
	unk          int32 // -1 when there is no unk token
	ignoreMerges bool

	mu    sync.Mutex
	cache map[string][]int32 // pieces of 8..cacheMaxWordLen bytes
	small map[uint64][]int32 // pieces of 2..7 bytes, keyed by smallKey
}

// smallKey packs a piece of at most 7 bytes and its length into a uint64.
func smallKey(w string) uint64 {
	k := uint64(len(w)) << 56
	for i := 0; i < len(w); i++ {
		k |= uint64(w[i]) << (8 * i)
	}
	return k
}

const (
	cacheMaxEntries = 1 << 16
	cacheMaxWordLen = 256 // longer pieces are not cached
	naiveMaxSymbols = 48  // shorter words use the quadratic merge loop
)

// encodeWord appends the ids of one pre-tokenized piece to out.
func (m *bpeModel) encodeWord(word string, out []int) []int {
	if len(word) == 1 {
		if id := m.byteID[word[0]]; id >= 0 {
			return append(out, int(id))
		} else if m.unk >= 0 {
			return append(out, int(m.unk))
		}
		return out
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[word]; ok {
			return append(out, int(id))
		}
	}
	cacheable := len(word) <= cacheMaxWordLen
	if cacheable {
		var ids []int32
		var ok bool
		m.mu.Lock()
		if len(word) < 8 {
			ids, ok = m.small[smallKey(word)]
		} else {
			ids, ok = m.cache[word]
		}
		m.mu.Unlock()
		if ok {
			for _, id := range ids {
				out = append(out, int(id))
			}
			return out
		}
	}
	syms := make([]int32, 0, len(word))
	for i := 0; i < len(word); i++ {
		if id := m.byteID[word[i]]; id >= 0 {
			syms = append(syms, id)
		} else if m.unk >= 0 {
			syms = append(syms, m.unk)
		}
	}
	if len(syms) <= naiveMaxSymbols {
		syms = m.mergeNaive(syms)
	} else {
		syms = m.mergeHeap(syms)
	}
	if cacheable {
		m.mu.Lock()
		if len(word) < 8 {
			if len(m.small) >= cacheMaxEntries {
				clear(m.small)
			}
			m.small[smallKey(word)] = syms
		} else {
			if len(m.cache) >= cacheMaxEntries {
				clear(m.cache)
			}
			m.cache[word] = syms
		}
		m.mu.Unlock()
	}
	for _, id := range syms {
		out = append(out, int(id))
	}
	return out
}

// mergeNaive repeatedly merges the adjacent pair of lowest rank (leftmost on
// ties) until no pair is in the merge table.
func (m *bpeModel) mergeNaive(syms []int32) []int32 {
	for len(syms) > 1 {
		best, bestAt := merge{rank: -1}, -1
		for i := 0; i+1 < len(syms); i++ {
			if g, ok := m.merges[pairKey(syms[i], syms[i+1])]; ok && (bestAt < 0 || g.rank < best.rank) {
				best, bestAt = g, i
			}
		}
		if bestAt < 0 {
			break
		}
		syms[bestAt] = best.id
		syms = append(syms[:bestAt+1], syms[bestAt+2:]...)
	}
	return syms
}

type candidate struct {
	rank       int32
	pos        int32 // index of the left symbol
	left, rght int32 // ids the pair had when queued
}

type candHeap []candidate

func (h candHeap) Len() int { return len(h) }
func (h candHeap) Less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].pos < h[j].pos
}
func (h candHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *candHeap) Push(x any)   { *h = append(*h, x.(candidate)) }
func (h *candHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// mergeHeap gives the same result as mergeNaive in O(n log n): symbols form
// a linked list and candidate pairs wait in a priority queue ordered by
// (rank, position); stale entries are skipped when popped.
func (m *bpeModel) mergeHeap(syms []int32) []int32 {
	n := len(syms)
	next := make([]int32, n)
	prev := make([]int32, n)
	alive := make([]bool, n)
	for i := range syms {
		next[i] = int32(i + 1)
		prev[i] = int32(i - 1)
		alive[i] = true
	}
	next[n-1] = -1
	h := make(candHeap, 0, n)
	push := func(i int32) {
		if i < 0 || next[i] < 0 {
			return
		}
		j := next[i]
		if g, ok := m.merges[pairKey(syms[i], syms[j])]; ok {
			heap.Push(&h, candidate{g.rank, i, syms[i], syms[j]})
		}
	}
	for i := 0; i+1 < n; i++ {
		if g, ok := m.merges[pairKey(syms[i], syms[i+1])]; ok {
			h = append(h, candidate{g.rank, int32(i), syms[i], syms[i+1]})
		}
	}
	heap.Init(&h)
	for h.Len() > 0 {
		c := heap.Pop(&h).(candidate)
		i := c.pos
		if !alive[i] || syms[i] != c.left {
			continue
		}
		j := next[i]
		if j < 0 || syms[j] != c.rght {
			continue
		}
		g := m.merges[pairKey(c.left, c.rght)]
		syms[i] = g.id
		alive[j] = false
		next[i] = next[j]
		if next[j] >= 0 {
			prev[next[j]] = i
		}
		if prev[i] >= 0 {
			push(prev[i])
		}
		push(i)
	}
	out := syms[:0]
	for i := int32(0); i >= 0; i = next[i] {
		out = append(out, syms[i])
	}
	return out
}
