package main

import (
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"

	"moxie/checkpoint"
	"moxie/dsv4"
	"moxie/experts"
)

// TestConcurrentSessionsUnderTightBudget: several sessions decoding at once on
// one model whose store holds about one expert per layer give exactly the
// logits of the all-resident model (the model runs one forward pass at a time,
// so the store never evicts an expert a pass is using).
func TestConcurrentSessionsUnderTightBudget(t *testing.T) {
	src, err := checkpoint.Open("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ref, err := dsv4.Load(src, dsv4.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := ref.Cfg
	const ctx = 64
	big, err := experts.NewPlan(src, cfg, 1<<40, ctx)
	if err != nil {
		t.Fatal(err)
	}
	budget := big.Required() + int64(cfg.NLayers)*big.ExpertBytes
	lm, err := loadModel("synth:tiny", &memFlags{mem: fmt.Sprint(budget), ctx: ctx, policy: "lru"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer lm.Close()
	if r := lm.plan.Resident(); r >= cfg.NLayers*cfg.NRoutedExperts || r < 1 {
		t.Fatalf("budget %d keeps %d experts resident; want a tight plan", budget, r)
	}
	seqs := [][]int{{5, 9, 200, 31, 77, 14}, {100, 3, 3, 250, 8, 61}, {42, 42, 42, 7, 19, 230}}
	want := make([][]float32, len(seqs))
	for i, s := range seqs {
		if want[i], err = dsv4.Logits(ref, s, 2); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	got := make([][]float32, len(seqs))
	errs := make([]error, len(seqs))
	for i, s := range seqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = dsv4.Logits(lm.m, s, 2)
		}()
	}
	wg.Wait()
	for i := range seqs {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if !slices.Equal(got[i], want[i]) {
			t.Fatalf("sequence %d: logits under a tight budget differ from the all-resident model", i)
		}
	}
	if st := lm.store.Stats().Total; st.Misses == 0 || st.BytesRead == 0 {
		t.Fatalf("no misses under a tight budget (%+v): the test did not exercise the slow tier", st)
	}
}

// TestLoadPreloadSynthetic: a synthetic model's routed experts are made on
// first use unless the loader asks for them ahead (moxie bench), in which
// case every expert that fits is in before the first token.
func TestLoadPreloadSynthetic(t *testing.T) {
	for _, c := range []struct {
		name    string
		preload bool
	}{{"on use", false}, {"ahead", true}} {
		t.Run(c.name, func(t *testing.T) {
			lm, err := loadModel("synth:tiny", &memFlags{policy: "lru", backend: "cpu", ctx: 64, preloadSynthetic: c.preload}, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			defer lm.Close()
			resident := lm.plan.Resident()
			if resident < 1 {
				t.Fatalf("the plan keeps %d experts resident", resident)
			}
			got := lm.store.Stats().Total.Preloaded
			want := int64(0)
			if c.preload {
				want = int64(resident)
			}
			if int64(got) != want {
				t.Errorf("preloaded %d experts, want %d (%d resident)", got, want, resident)
			}
		})
	}
}
