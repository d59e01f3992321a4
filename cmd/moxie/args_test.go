package main

import (
	"flag"
	"io"
	"slices"
	"testing"
)

func TestReorderArgs(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.String("out", "", "")
	fs.Int("n", 0, "")
	fs.Bool("raw", false, "")
	cases := []struct{ in, want []string }{
		{[]string{"tiny", "--out", "d"}, []string{"--out", "d", "--", "tiny"}},
		{[]string{"--raw", "hello", "-n", "3"}, []string{"--raw", "-n", "3", "--", "hello"}}, // a bool flag takes no value
		{[]string{"a", "--out=d", "b"}, []string{"--out=d", "--", "a", "b"}},
		{[]string{"--out", "d", "--", "-5 degrees", "--raw"}, []string{"--out", "d", "--", "-5 degrees", "--raw"}},
		{[]string{"--unknown", "x"}, []string{"--unknown", "--", "x"}},
		{nil, []string{"--"}},
	}
	for _, tc := range cases {
		if got := reorderArgs(fs, tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("reorderArgs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	// And parsing through it: positionals after "--" stay positional.
	if err := parseFlags(fs, []string{"x", "--n", "4", "--", "-y"}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fs.Args(), []string{"x", "-y"}) || fs.Lookup("n").Value.String() != "4" {
		t.Fatalf("args %q, n %s", fs.Args(), fs.Lookup("n").Value)
	}
}
