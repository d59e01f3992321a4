package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

func TestBenchWritesConsistentReport(t *testing.T) {
	out := filepath.Join(t.TempDir(), "bench.json")
	code, _, errs := moxie(t, "bench", "synth:tiny", "--prompt", "9", "--decode", "3", "--runs", "1", "--warmup", "1", "--bw-size", "16MiB", "--json", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var r benchReport
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if !r.Synthetic || r.PromptTokens != 9 || r.DecodeTokens != 3 || r.WarmupRuns != 1 || r.PrefillTokPerS <= 0 || r.DecodeTokPerS <= 0 || r.MemReadGBps <= 0 {
		t.Fatalf("implausible report %+v", r)
	}
	// The derived figures must follow from the measured ones.
	bound := r.MemReadGBps * 1e9 / float64(r.BytesPerToken)
	if d := r.DecodeBoundTokS/bound - 1; d > 1e-9 || d < -1e-9 {
		t.Fatalf("bound %g, want %g", r.DecodeBoundTokS, bound)
	}
	if d := r.Efficiency/(r.DecodeTokPerS/bound) - 1; d > 1e-9 || d < -1e-9 {
		t.Fatalf("efficiency %g inconsistent", r.Efficiency)
	}
	if code, _, _ := moxie(t, "bench", "--runs", "0"); code != 2 {
		t.Fatalf("--runs 0: exit %d, want 2", code)
	}
	if code, _, _ := moxie(t, "bench", "--warmup", "-1"); code != 2 {
		t.Fatalf("--warmup -1: exit %d, want 2", code)
	}
}
