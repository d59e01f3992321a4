package checkpoint

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"moxie/dsv4/config"
)

var (
	updateSynthHashes = flag.Bool("update-synth-hashes", false, "rewrite testdata/synth-hashes.txt from the current generator")
	synthHashesAll    = flag.Bool("synth-hashes-all", false, "check every golden synthetic tensor hash, including the 1 GB ones")
)

const synthHashesFile = "testdata/synth-hashes.txt"

// synthHashCase is one synthetic source whose every tensor has a golden hash.
type synthHashCase struct {
	label string // the spec, or a name for a custom configuration
	open  func() (*Synth, error)
}

func synthHashCases() []synthHashCase {
	custom := func(base func() *config.Config, seed uint64, mod func(*config.Config)) func() (*Synth, error) {
		return func() (*Synth, error) {
			c := base()
			mod(c)
			return NewSynth(c, seed)
		}
	}
	spec := func(s string) synthHashCase {
		return synthHashCase{s, func() (*Synth, error) { return OpenSynth(s) }}
	}
	return []synthHashCase{
		spec("synth:tiny"),
		spec("synth:tiny?experts=4&layers=3&mtp=2&seed=7&topk=3"),
		{"custom:tiny?dense=mxfp8&seed=3", custom(config.Tiny, 3, func(c *config.Config) { c.DenseFormat = "mxfp8" })},
		{"custom:tiny?expert_dtype=fp8&seed=5", custom(config.Tiny, 5, func(c *config.Config) { c.ExpertDType = "fp8" })},
		spec("synth:flash?layers=1&experts=2&mtp=1"),
		{"custom:flash?layers=1&experts=1&mtp=0&dense=mxfp8&expert_dtype=fp8&seed=11", custom(config.Flash, 11, func(c *config.Config) {
			c.CompressRatios = c.CompressRatios[:1]
			c.NLayers, c.NHashLayers, c.NMTPLayers = 1, 1, 0
			c.NRoutedExperts, c.NActivatedExperts = 1, 1
			c.DenseFormat, c.ExpertDType = "mxfp8", "fp8"
		})},
	}
}

// synthHashLimit is the largest tensor the test hashes by default: every tensor
// of the tiny sources and the flash tensors up to this size (the FP8 dense
// weights, the MXFP4 experts and the small BF16/F32 ones), so the race build
// stays quick. -synth-hashes-all checks the rest (the 1 GB embedding and head).
func synthHashLimit() int64 {
	switch {
	case *synthHashesAll || *updateSynthHashes:
		return 1 << 62
	case testing.Short():
		return 1 << 20
	}
	return 8 << 20
}

// TestSynthHashes checks every synthetic tensor against sha256 hashes recorded
// in testdata/synth-hashes.txt by the generator as it was before it was made
// fast (math/rand/v2 Float64 per value, format's quantizers on whole tensors),
// so the generator stays byte-identical: the oracle goldens and recorded
// benchmarks depend on these exact bytes.
func TestSynthHashes(t *testing.T) {
	want := map[string]string{}
	if !*updateSynthHashes {
		f, err := os.Open(synthHashesFile)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			parts := strings.Split(sc.Text(), "\t")
			if len(parts) != 3 {
				t.Fatalf("%s: bad line %q", synthHashesFile, sc.Text())
			}
			want[parts[0]+"\t"+parts[1]] = parts[2]
		}
		f.Close()
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
	}
	limit := synthHashLimit()
	var lines []string
	var mu sync.Mutex
	for _, tc := range synthHashCases() {
		s, err := tc.open()
		if err != nil {
			t.Fatal(err)
		}
		infos := s.Tensors()
		got := make([]string, len(infos))
		checked := 0
		var wg sync.WaitGroup
		sem := make(chan struct{}, runtime.GOMAXPROCS(0))
		for i, ti := range infos {
			if ti.Size > limit {
				continue
			}
			checked++
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				d, err := s.TensorData(ti.Name)
				if err != nil {
					t.Error(err)
					return
				}
				h := sha256.Sum256(d)
				mu.Lock()
				got[i] = hex.EncodeToString(h[:])
				mu.Unlock()
			}()
		}
		wg.Wait()
		if *updateSynthHashes {
			for i, ti := range infos {
				lines = append(lines, tc.label+"\t"+ti.Name+"\t"+got[i])
			}
			continue
		}
		t.Run(tc.label, func(t *testing.T) {
			bad := 0
			for i, ti := range infos {
				if got[i] == "" {
					continue
				}
				w, ok := want[tc.label+"\t"+ti.Name]
				if !ok {
					t.Errorf("%s: no golden hash for %s", tc.label, ti.Name)
				} else if w != got[i] {
					bad++
					if bad <= 10 {
						t.Errorf("%s: %s (%s %v) hashes to %s, golden %s", tc.label, ti.Name, ti.DType, ti.Shape, got[i], w)
					}
				}
			}
			if bad > 0 {
				t.Errorf("%s: %d of %d checked tensors differ", tc.label, bad, checked)
			}
			t.Logf("%s: %d of %d tensors checked", tc.label, checked, len(infos))
		})
	}
	if *updateSynthHashes {
		out := strings.Join(lines, "\n") + "\n"
		tmp := synthHashesFile + ".tmp"
		if err := os.MkdirAll(filepath.Dir(tmp), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(tmp, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, synthHashesFile); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %d hashes to %s", len(lines), synthHashesFile)
	}
}

// BenchmarkSynthTensor generates one tensor of each stored format at V4-Flash
// size. b.SetBytes is the generated tensor's size.
func BenchmarkSynthTensor(b *testing.B) {
	s, err := OpenSynth("synth:flash?layers=1")
	if err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{
		"layers.0.attn.wo_a.weight",             // FP8 E4M3 [8192 4096], 128x128 block scales
		"layers.0.attn.wo_a.scale",              // its scales (all values generated, none encoded)
		"layers.0.ffn.experts.0.w1.weight",      // MXFP4 [2048 4096]
		"layers.0.ffn.experts.0.w1.scale",       // its scales
		"head.weight",                           // BF16 [129280 4096]
		"layers.0.hc_attn_fn",                   // F32 [24 16384]
		"layers.0.ffn.shared_experts.w2.weight", // FP8 [4096 2048]
	} {
		ti, ok := s.Lookup(name)
		if !ok {
			b.Fatalf("no tensor %s", name)
		}
		b.Run(fmt.Sprintf("%s/%s", ti.DType, name), func(b *testing.B) {
			b.SetBytes(ti.Size)
			for b.Loop() {
				if _, err := s.TensorData(name); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
