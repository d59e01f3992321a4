package checkpoint

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"moxie/dsv4/config"
	"moxie/format"
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

// synthHashLimit is the largest tensor the test hashes by default (the FP8 dense
// weights up to [2048 4096], the MXFP4 experts and the small BF16/F32 ones), and
// of tensors of one dtype and shape beyond 64 KiB it hashes two, so the race
// build stays quick. -synth-hashes-all checks every tensor (the 1 GB embedding
// and head too).
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
		perKind := map[string]int{}
		for i, ti := range infos {
			kind := fmt.Sprint(ti.DType, ti.Shape)
			if ti.Size > limit || ti.Size > 64<<10 && limit < 1<<62 && perKind[kind] >= 2 {
				continue
			}
			perKind[kind]++
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

// The fast encoders against format's exported ones, over sampled bit patterns
// and every rounding boundary.
func TestSynthEncodersMatchFormat(t *testing.T) {
	var pats []uint32
	for b := uint64(0); b < 1<<32; b += 7919 { // a sample of every sign, exponent, mantissa
		pats = append(pats, uint32(b))
	}
	for top := uint32(0); top < 1<<12; top++ { // E4M3: each kept-bits pattern at and around the half
		for _, low := range []uint32{0, 1, 0x7ffff, 0x80000, 0x80001, 0xfffff} {
			pats = append(pats, top<<20|low)
		}
	}
	t.Run("e4m3Codes", func(t *testing.T) {
		src := make([]float32, len(pats))
		for i, p := range pats {
			src[i] = math.Float32frombits(p)
		}
		for _, inv := range []float32{1, 0.5, 1.0 / 1024, 64} {
			dst := make([]byte, len(src))
			e4m3Codes(dst, src, inv)
			for i, x := range src {
				if want := format.Float32ToE4M3(x * inv); dst[i] != want {
					t.Fatalf("e4m3Codes(%#08x * %g) = %#02x, format gives %#02x", pats[i], inv, dst[i], want)
				}
			}
		}
	})
	t.Run("e2m1Pack", func(t *testing.T) {
		var vals []float32
		for a := uint32(0); a <= 0x40c00000; a += 997 {
			vals = append(vals, math.Float32frombits(a), -math.Float32frombits(a))
		}
		for top := uint32(0); top <= 0x40c00000>>19; top++ { // every bucket start, and its neighbours
			for _, d := range []int64{-1, 0, 1} {
				if a := int64(top<<19) + d; a >= 0 && a <= 0x40c00000 {
					vals = append(vals, math.Float32frombits(uint32(a)), -math.Float32frombits(uint32(a)))
				}
			}
		}
		for len(vals)%format.MXGroup != 0 {
			vals = append(vals, 0)
		}
		dst := make([]byte, format.MXGroup/2)
		for g := 0; g < len(vals); g += format.MXGroup {
			v := (*[format.MXGroup]float32)(vals[g:])
			e2m1Pack(dst, v, 1)
			for i, x := range v {
				got := dst[i/2] >> (4 * (i % 2)) & 15
				if want := format.Float32ToE2M1(x); got != want {
					t.Fatalf("e2m1Pack code of %g (%#08x) = %d, format gives %d", x, math.Float32bits(x), got, want)
				}
			}
		}
	})
	t.Run("scale exponents", func(t *testing.T) {
		amaxes := append([]uint32{0, 1, 0x7fffff, 0x800000, 0x7f7fffff, 0x7f800000}, pats...)
		for e := uint32(1); e < 255; e++ { // around both limits' fraction thresholds in every binade
			for _, m := range []uint32{0, 0x3fffff, 0x400000, 0x400001, 0x5fffff, 0x600000, 0x600001, 0x7fffff} {
				amaxes = append(amaxes, e<<23|m)
			}
		}
		w := make([]float32, format.MXGroup)
		for _, a := range amaxes {
			a &= 0x7fffffff
			if a > 0x7f800000 {
				continue // NaN: never drawn
			}
			w[5] = -math.Float32frombits(a)
			if got, want := byte(e2m1Exp(a)+127), format.ScalesMXFP4(w, 1, format.MXGroup)[0]; got != want {
				t.Fatalf("E2M1 scale of amax %#08x = %d, format gives %d", a, got, want)
			}
			if got, want := byte(e4m3Exp(a)+127), format.ScalesFP8Block(w, 1, format.MXGroup, 128)[0]; got != want {
				t.Fatalf("E4M3 scale of amax %#08x = %d, format gives %d", a, got, want)
			}
		}
	})
}

// uniformGen draws what rand.Rand.Float64 on the same PCG gives, mapped to
// float32((f*2 - 1) * a) in float64, then rounded.
func TestUniformGenMatchesRand(t *testing.T) {
	for _, tc := range []struct {
		s1, s2 uint64
		a      float64
	}{{0, 0, 1}, {3, 0xcbf29ce484222325, math.Sqrt(3)}, {1 << 63, 12345, 0.1}, {7, 7, 1.5 * math.Sqrt(3.0/2048)}} {
		t.Run(fmt.Sprintf("%d_%d_%g", tc.s1, tc.s2, tc.a), func(t *testing.T) {
			r := rand.New(rand.NewPCG(tc.s1, tc.s2))
			g := newUniformGen(rand.NewPCG(tc.s1, tc.s2), tc.a)
			got := make([]float32, 5000)
			amax := make([]uint32, 1)
			g.fill(got[:1001])
			g.fillMax(got[1001:], len(got), amax)
			for i, v := range got {
				if want := float32((r.Float64()*2 - 1) * tc.a); math.Float32bits(v) != math.Float32bits(want) {
					t.Fatalf("value %d = %g, rand gives %g", i, v, want)
				}
			}
			var m uint32
			for _, v := range got[1001:] {
				m = max(m, math.Float32bits(float32(math.Abs(float64(v)))))
			}
			if amax[0] != m {
				t.Fatalf("fillMax max %#x, want %#x", amax[0], m)
			}
		})
	}
}

// TestSynthPairs asks for quantized weights and their scales from several
// goroutines at once, in shuffled order and some more than once, and checks
// every answer against a separate generation of that half alone: sharing one
// generation between the two halves (Synth.pairs) must change no byte and
// hand no slice out twice.
func TestSynthPairs(t *testing.T) {
	for _, twice := range []bool{false, true} {
		t.Run(fmt.Sprintf("twice=%v", twice), func(t *testing.T) { testSynthPairs(t, twice) })
	}
}

func testSynthPairs(t *testing.T, twice bool) {
	s, err := OpenSynth("synth:tiny?seed=7")
	if err != nil {
		t.Fatal(err)
	}
	type req struct {
		name  string
		w     config.Tensor
		scale bool
	}
	var reqs []req
	for _, ti := range s.Tensors() {
		tn := s.layout[ti.Name]
		if tn.ScaleOf != "" {
			w := s.layout[tn.ScaleOf]
			reqs = append(reqs, req{ti.Name, w, true}, req{tn.ScaleOf, w, false})
			if twice && len(reqs)%3 == 0 { // some halves asked for twice
				reqs = append(reqs, req{ti.Name, w, true})
			}
		}
	}
	if len(reqs) < 20 {
		t.Fatalf("only %d quantized requests in synth:tiny", len(reqs))
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })
	got := make([][]byte, len(reqs))
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < len(reqs); i += 4 {
				b, err := s.TensorData(reqs[i].name)
				if err != nil {
					t.Error(err)
					return
				}
				got[i] = b
			}
		}()
	}
	wg.Wait()
	seen := map[*byte]bool{}
	for i, r := range reqs {
		if want := s.quantized(r.w, r.scale); !bytes.Equal(got[i], want) {
			t.Errorf("%s: %d bytes differ from a generation of that half alone", r.name, len(got[i]))
		}
		if len(got[i]) > 0 {
			if seen[&got[i][0]] {
				t.Errorf("%s: a slice was handed out twice", r.name)
			}
			seen[&got[i][0]] = true
		}
	}
	if !twice && s.pairBytes != 0 {
		// Every pair had both halves asked for once: nothing should wait.
		t.Errorf("%d bytes of generated halves still waiting", s.pairBytes)
	}
}
