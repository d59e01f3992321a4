package generate

import "strings"

// stopMatcher finds stop strings in text that arrives in pieces. It passes on
// text as soon as it can no longer be part of a stop string and holds back
// only the longest tail that is still a proper prefix of some stop string.
//
// When several stop strings occur, the one that completes first in the stream
// wins; among those completing at the same byte, the one starting earliest.
// Text from the start of the winning occurrence on is never passed on.
type stopMatcher struct {
	stops   []string
	pending string // held-back tail: a proper prefix of some stop string
	done    bool
}

func newStopMatcher(stops []string) *stopMatcher {
	return &stopMatcher{stops: stops}
}

// push appends s and returns the text now safe to emit. When a stop string
// completes, matched is its index in stops and no more text is accepted.
func (m *stopMatcher) push(s string) (emit string, matched int) {
	if m.done {
		return "", -1
	}
	if len(m.stops) == 0 {
		return s, -1
	}
	buf := m.pending + s
	bestEnd, bestStart, best := -1, -1, -1
	for k, stop := range m.stops {
		i := strings.Index(buf, stop)
		if i < 0 {
			continue
		}
		end := i + len(stop)
		if best < 0 || end < bestEnd || end == bestEnd && i < bestStart {
			bestEnd, bestStart, best = end, i, k
		}
	}
	if best >= 0 {
		m.done = true
		m.pending = ""
		return buf[:bestStart], best
	}
	hold := m.holdLen(buf)
	m.pending = buf[len(buf)-hold:]
	return buf[:len(buf)-hold], -1
}

// holdLen is the length of the longest suffix of buf that is a proper prefix
// of a stop string.
func (m *stopMatcher) holdLen(buf string) int {
	longest := 0
	for _, stop := range m.stops {
		n := min(len(stop)-1, len(buf))
		for ; n > longest; n-- {
			if strings.HasSuffix(buf, stop[:n]) {
				longest = n
				break
			}
		}
	}
	return longest
}

// flush returns the held-back text at the end of the stream (it never became
// a stop string).
func (m *stopMatcher) flush() string {
	s := m.pending
	m.pending = ""
	return s
}
