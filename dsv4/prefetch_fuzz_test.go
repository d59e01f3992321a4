package dsv4

import (
	"strconv"
	"strings"
	"testing"
)

// FuzzParsePrefetch: $MOXIE_CUDA_PREFETCH's parser refuses with an error
// quoting the value, or turns prefetching on exactly when it names a set.
func FuzzParsePrefetch(f *testing.F) {
	for _, s := range []string{"", "off", "q", "q,o,s", "a,m", "all", "all:bulk", "q:lines_el", "q:", ":bulk", "q,,o", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		p, err := parsePrefetch(v)
		if err != nil {
			if !strings.Contains(err.Error(), strconv.Quote(v)) {
				t.Errorf("parsePrefetch(%q): error %q does not quote the value", v, err)
			}
			return
		}
		if p.ok != (p.q || p.o || p.s || p.a || p.m) {
			t.Errorf("parsePrefetch(%q) = %+v: on without a set, or a set without on", v, p)
		}
		if v != "" && v != "off" && !p.ok {
			t.Errorf("parsePrefetch(%q) accepted a value that turns nothing on", v)
		}
	})
}
