package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"moxie/experts"
	"moxie/experts/trace"
)

func residencyCmd(args []string, in *strings.Reader, out, errb *bytes.Buffer) error {
	return runResidency(args, in, out, errb)
}

// TestResidencyCommand replays the cyclic trace A B C A B C (one layer, top-1)
// with 2 slots: LRU misses every access (hit rate 0), Bélády keeps A and B and
// bypasses C (2 hits of 6 = 0.3333). With 1000-byte experts, 500 dense bytes,
// fast 1000 B/s and slow 100 B/s, Bélády's token costs (500 + 1000/3)/1000 +
// (4000/6)/100 = 7.5 s: 0.13 tok/s.
func TestResidencyCommand(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cycle.trace")
	w, err := trace.Create(path, trace.Header{Name: "hand", Layers: 1, Experts: 3, TopK: 1, ExpertBytes: 1000, DenseBytesPerToken: 500})
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range []int{0, 1, 2, 0, 1, 2} {
		w.RecordRoute(i, 0, []int{e}, []float32{1})
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	freq := filepath.Join(dir, "freq.txt")
	out, _, err := runExpertsCmd(residencyCmd, path, "--slots", "2", "--fast-bw", "1000", "--slow-bw", "100", "--write-freq", freq)
	if err != nil {
		t.Fatal(err)
	}
	lines := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			lines[f[0]] = l
		}
	}
	for _, tc := range []struct{ row, want string }{
		{"lru", "0.0000"},
		{"belady", "0.3333"},
	} {
		if !strings.Contains(lines[tc.row], tc.want) {
			t.Errorf("%s row %q lacks %s\n%s", tc.row, lines[tc.row], tc.want, out)
		}
	}
	if !strings.Contains(lines["belady"], " 0.13 ") {
		t.Errorf("belady row %q lacks the 0.13 tok/s estimate", lines["belady"])
	}
	data, err := os.ReadFile(freq)
	if err != nil {
		t.Fatal(err)
	}
	fr, err := experts.ParseFrequencies(data)
	if err != nil || fr.Get(0, 0) != 2 || fr.Get(0, 2) != 2 {
		t.Fatalf("frequency file: %v\n%s", err, data)
	}
	// A single policy, and errors.
	out, _, err = runExpertsCmd(residencyCmd, path, "--slots", "1,3", "--policy", "decay:h=4")
	if err != nil || !strings.Contains(out, "decay:h=4,ratio=1.25,margin=4") || strings.Contains(out, "\n  lru") {
		t.Fatalf("single policy: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{path}, "--slots N is required"},
		{[]string{path, "--slots", "4"}, "exceeds the trace's 3 experts"},
		{[]string{path, "--slots", "x"}, "not a non-negative integer"},
		{[]string{path, "--slots", "1", "--policy", "nope"}, "unknown policy"},
		{[]string{filepath.Join(dir, "freq.txt"), "--slots", "1"}, "not a moxie route trace"},
	} {
		if _, _, err := runExpertsCmd(residencyCmd, tc.args...); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%v: err = %v, want %q", tc.args, err, tc.wantErr)
		}
	}
}
