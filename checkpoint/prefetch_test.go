package checkpoint

import (
	"bytes"
	"math/rand/v2"
	"sync"
	"testing"
)

// TestPrefetchServesSourceBytes checks that a Prefetcher hands out exactly the
// source's bytes whatever the request order, budget and worker count, including
// repeated requests, names outside the prefetch list, and concurrent callers.
func TestPrefetchServesSourceBytes(t *testing.T) {
	src, err := Open("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var names []string
	for _, ti := range src.Tensors() {
		names = append(names, ti.Name)
	}
	want := map[string][]byte{}
	for _, n := range names {
		b, err := src.TensorData(n)
		if err != nil {
			t.Fatal(err)
		}
		want[n] = bytes.Clone(b)
	}
	for _, tc := range []struct {
		name    string
		workers int
		budget  int64
		callers int
	}{
		{"one worker, tiny budget", 1, 1, 1},
		{"eight workers, 64 KiB", 8, 64 << 10, 1},
		{"four workers, no limit, 4 callers", 4, 1 << 40, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			order := append([]string{"no.such.tensor"}, names[:len(names)*3/4]...)
			p := Prefetch(src, order, tc.workers, tc.budget)
			defer p.Close()
			r := rand.New(rand.NewPCG(1, uint64(tc.workers)))
			req := append([]string(nil), names...)
			r.Shuffle(len(req), func(i, j int) { req[i], req[j] = req[j], req[i] })
			req = append(req, names[:5]...) // asked twice
			var wg sync.WaitGroup
			errs := make(chan string, len(req))
			for c := range tc.callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := c; i < len(req); i += tc.callers {
						got, err := p.TensorData(req[i])
						if err != nil || !bytes.Equal(got, want[req[i]]) {
							errs <- req[i]
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for n := range errs {
				t.Errorf("%s: bytes differ from the source's", n)
			}
			if _, err := p.TensorData("no.such.tensor"); err == nil {
				t.Error("an unknown tensor gave no error")
			}
		})
	}
	t.Run("close while prefetching", func(t *testing.T) {
		p := Prefetch(src, names, 4, 1<<40)
		got, err := p.TensorData(names[len(names)-1])
		p.Close()
		if err != nil || !bytes.Equal(got, want[names[len(names)-1]]) {
			t.Fatal("wrong bytes before Close")
		}
		got, err = p.TensorData(names[len(names)/2])
		if err != nil || !bytes.Equal(got, want[names[len(names)/2]]) {
			t.Fatal("wrong bytes after Close")
		}
	})
}
