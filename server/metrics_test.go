package server

import (
	"strings"
	"testing"
)

func TestHistogram(t *testing.T) {
	h := newHistogram([]float64{0.5, 1, 2})
	for _, v := range []float64{0.5, 0.7, 1, 3, 0.1} {
		h.observe(v)
	}
	var b strings.Builder
	h.write(&b, "x")
	// By hand: <=0.5: 0.5, 0.1 -> 2; <=1: +0.7, 1 -> 4; <=2: 4; +Inf: 5.
	want := `x_bucket{le="0.5"} 2
x_bucket{le="1"} 4
x_bucket{le="2"} 4
x_bucket{le="+Inf"} 5
x_sum 5.3
x_count 5
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

func TestLabels(t *testing.T) {
	cases := []struct {
		in   map[string]string
		want string
	}{
		{nil, ""},
		{map[string]string{"b": "2", "a": "1"}, `{a="1",b="2"}`},
		{map[string]string{"tier": "a\"b\\c\nd"}, `{tier="a\"b\\c\nd"}`},
		{map[string]string{"bad-name": "x"}, ""},
	}
	for _, c := range cases {
		if got := labels(c.in); got != c.want {
			t.Errorf("labels(%v) = %s, want %s", c.in, got, c.want)
		}
	}
}
