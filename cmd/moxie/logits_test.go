package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"moxie/dsv4/npy"
)

// TestLogitsCommandMatchesOracle runs `moxie logits` end to end on a checkpoint
// directory written by `moxie synth tiny` and compares with the transformers
// oracle's golden logits (dsv4/testdata/golden/tiny, made by reference/oracle.py).
func TestLogitsCommandMatchesOracle(t *testing.T) {
	golden := filepath.Join("..", "..", "dsv4", "testdata", "golden", "tiny")
	raw, err := os.ReadFile(filepath.Join(golden, "cases.json"))
	if err != nil {
		t.Fatalf("goldens missing: %v", err)
	}
	var cases []struct {
		Name    string `json:"name"`
		Tokens  []int  `json:"tokens"`
		Prefill int    `json:"prefill"`
		Logits  string `json:"logits"`
	}
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	model := filepath.Join(tmp, "tiny")
	if code, _, errs := moxie(t, "synth", "tiny", "--out", model); code != 0 {
		t.Fatal(errs)
	}
	for _, tc := range cases {
		if tc.Name != "decode17x23" && tc.Name != "prefill40" {
			continue // the dsv4 golden test covers the rest; two keep this test quick
		}
		t.Run(tc.Name, func(t *testing.T) {
			tokFile := filepath.Join(tmp, tc.Name+".json")
			b, _ := json.Marshal(tc.Tokens)
			os.WriteFile(tokFile, b, 0o644)
			out := filepath.Join(tmp, tc.Name+".npy")
			if code, _, errs := moxie(t, "logits", "--model", model, "--tokens", tokFile, "--prefill", itoa(tc.Prefill), "--out", out); code != 0 {
				t.Fatalf("exit %d: %s", code, errs)
			}
			got, err := npy.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			want, err := npy.ReadFile(filepath.Join(golden, tc.Logits))
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Shape) != 2 || got.Shape[0] != want.Shape[0] || got.Shape[1] != want.Shape[1] {
				t.Fatalf("shape %v, want %v", got.Shape, want.Shape)
			}
			V := want.Shape[1]
			for i := range want.Shape[0] {
				g, w := got.Data[i*V:(i+1)*V], want.Data[i*V:(i+1)*V]
				var maxDiff, maxRef float64
				am, aw := 0, 0
				for j := range w {
					maxDiff = math.Max(maxDiff, math.Abs(float64(g[j]-w[j])))
					maxRef = math.Max(maxRef, math.Abs(float64(w[j])))
					if g[j] > g[am] {
						am = j
					}
					if w[j] > w[aw] {
						aw = j
					}
				}
				if maxDiff/maxRef > 1e-4 || am != aw {
					t.Fatalf("row %d: relative error %.3g (limit 1e-4), argmax %d vs %d", i, maxDiff/maxRef, am, aw)
				}
			}
		})
	}
}

func TestLogitsCommandBadInput(t *testing.T) {
	tmp := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(tmp, name)
		os.WriteFile(p, []byte(s), 0o644)
		return p
	}
	out := filepath.Join(tmp, "o.npy")
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"id out of range", []string{"--tokens", write("a.json", "[1, 2, 9999]")}, "9999 at index 2"},
		{"negative id", []string{"--tokens", write("b.json", "[-1]")}, "-1 at index 0"},
		{"prefill too long", []string{"--tokens", write("c.json", "[1,2,3]"), "--prefill", "4"}, "--prefill 4"},
		{"not json", []string{"--tokens", write("d.json", "1 2 3")}, "JSON array"},
		{"empty", []string{"--tokens", write("e.json", "[]")}, "empty"},
		{"missing file", []string{"--tokens", filepath.Join(tmp, "nope.json")}, "nope.json"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"logits", "--out", out}, tc.args...)
			code, _, errs := moxie(t, args...)
			if code == 0 || !strings.Contains(errs, tc.want) {
				t.Fatalf("exit %d, stderr %q; want failure mentioning %q", code, errs, tc.want)
			}
			if _, err := os.Stat(out); err == nil {
				t.Fatal("a failed run left an output file")
			}
		})
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }
