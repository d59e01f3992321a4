package checkpoint

import (
	"bytes"
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"moxie/dsv4/config"
	"moxie/format"
)

func TestParseSynth(t *testing.T) {
	cases := []struct {
		spec      string
		canon     string
		layers    int
		experts   int
		topk      int
		mtp       int
		hashLayer int
	}{
		{"synth:tiny", "synth:tiny", 4, 8, 2, 1, 2},
		{"tiny", "synth:tiny", 4, 8, 2, 1, 2},
		{"synth:flash", "synth:flash", 43, 256, 6, 1, 3},
		{"synth:flash?layers=2", "synth:flash?layers=2", 2, 256, 6, 1, 2},
		{"synth:flash?experts=4&layers=5&seed=9", "synth:flash?experts=4&layers=5&seed=9", 5, 4, 4, 1, 3},
		{"synth:tiny?mtp=0&topk=3", "synth:tiny?mtp=0&topk=3", 4, 8, 3, 0, 2},
	}
	for _, tc := range cases {
		t.Run(tc.spec, func(t *testing.T) {
			s, err := ParseSynth(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			c := s.Config
			if s.String() != tc.canon || c.NLayers != tc.layers || c.NRoutedExperts != tc.experts ||
				c.NActivatedExperts != tc.topk || c.NMTPLayers != tc.mtp || c.NHashLayers != tc.hashLayer {
				t.Fatalf("got %s layers=%d experts=%d topk=%d mtp=%d hash=%d", s, c.NLayers, c.NRoutedExperts, c.NActivatedExperts, c.NMTPLayers, c.NHashLayers)
			}
			if len(c.CompressRatios) != c.NLayers+c.NMTPLayers {
				t.Fatalf("compress_ratios %v for %d+%d layers", c.CompressRatios, c.NLayers, c.NMTPLayers)
			}
		})
	}
	for _, bad := range []string{"synth:huge", "synth:tiny?layers=0", "synth:tiny?layers=99", "synth:tiny?bogus=1",
		"synth:tiny?seed=-1", "synth:tiny?experts=x", "synth:tiny?topk=9", "synth:tiny?seed=1&seed=2", "synth:tiny?%zz"} {
		t.Run("reject "+bad, func(t *testing.T) {
			if _, err := ParseSynth(bad); err == nil || !strings.Contains(err.Error(), bad) {
				t.Fatalf("ParseSynth(%q) err = %v, want an error quoting the spec", bad, err)
			}
		})
	}
}

func TestSynthMatchesLayoutAndIsDeterministic(t *testing.T) {
	a, err := OpenSynth("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := OpenSynth("synth:tiny")
	c, _ := OpenSynth("synth:tiny?seed=1")
	layout := config.Layout(a.Config())
	if len(a.Tensors()) != len(layout) {
		t.Fatalf("%d tensors, layout has %d", len(a.Tensors()), len(layout))
	}
	differ, values := 0, 0
	for _, lt := range layout {
		da, err := a.TensorData(lt.Name)
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(da)) != lt.Bytes() {
			t.Fatalf("%s: %d bytes, want %d", lt.Name, len(da), lt.Bytes())
		}
		db, _ := b.TensorData(lt.Name)
		if !bytes.Equal(da, db) {
			t.Fatalf("%s differs between two opens with the same seed", lt.Name)
		}
		if lt.ScaleOf != "" {
			continue // power-of-two block scales of uniform weights rarely depend on the seed
		}
		values++
		dc, _ := c.TensorData(lt.Name)
		if !bytes.Equal(da, dc) {
			differ++
		}
	}
	if differ != values {
		t.Fatalf("only %d of %d value tensors change with the seed", differ, values)
	}
}

func TestSynthValues(t *testing.T) {
	s, err := OpenSynth("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	c := s.Config()
	t.Run("tid2eid rows hold distinct valid experts", func(t *testing.T) {
		d, err := s.TensorData("layers.0.ffn.gate.tid2eid")
		if err != nil {
			t.Fatal(err)
		}
		k := c.NActivatedExperts
		for row := range c.VocabSize {
			seen := map[uint64]bool{}
			for i := range k {
				e := binary.LittleEndian.Uint64(d[(row*k+i)*8:])
				if e >= uint64(c.NRoutedExperts) || seen[e] {
					t.Fatalf("row %d: expert %d invalid or repeated", row, e)
				}
				seen[e] = true
			}
		}
	})
	t.Run("fp8 weights have unit fan-in gain", func(t *testing.T) {
		q, _ := s.TensorData("layers.1.attn.wq_a.weight")
		sc, _ := s.TensorData("layers.1.attn.wq_a.scale")
		w, err := format.DequantFP8Block(q, sc, c.QLoraRank, c.Dim, c.BlockSize)
		if err != nil {
			t.Fatal(err)
		}
		var ss float64
		for _, v := range w {
			ss += float64(v) * float64(v)
		}
		// Uniform with std 1/sqrt(fan-in): the mean square is 1/fan-in.
		got := ss / float64(len(w)) * float64(c.Dim)
		if math.Abs(got-1) > 0.1 {
			t.Fatalf("mean square x fan-in = %.3f, want about 1", got)
		}
	})
	t.Run("norm weights near one", func(t *testing.T) {
		d, _ := s.TensorData("layers.2.attn_norm.weight")
		for i := 0; i < len(d); i += 2 {
			v := format.BF16ToFloat32(binary.LittleEndian.Uint16(d[i:]))
			if v < 0.79 || v > 1.21 {
				t.Fatalf("norm weight %d = %g, want within 1±0.2", i/2, v)
			}
		}
	})
	t.Run("unknown tensor", func(t *testing.T) {
		if _, err := s.TensorData("layers.99.nothing"); err == nil {
			t.Fatal("no error for an unknown tensor")
		}
	})
	t.Run("config marks synthetic", func(t *testing.T) {
		cfg, _ := s.File("config.json")
		if !bytes.Contains(cfg, []byte(`"moxie_synthetic": "synth:tiny"`)) {
			t.Fatalf("config.json lacks the synthetic marker:\n%s", cfg)
		}
		if _, err := config.Parse(cfg); err != nil {
			t.Fatal(err)
		}
	})
}

func TestSynthFlashTotal(t *testing.T) {
	s, err := OpenSynth("synth:flash")
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, ti := range s.Tensors() {
		total += ti.Size
	}
	if total != 159_609_485_896 {
		t.Fatalf("synth:flash holds %d bytes, want 159609485896", total)
	}
}

// A synthetic source for any configuration matches its layout, including the
// repacked MXFP8 dense format and FP8 experts, and dequantizes to sane values.
func TestNewSynthMatchesLayout(t *testing.T) {
	for _, mod := range []func(*config.Config){
		func(c *config.Config) {},
		func(c *config.Config) { c.DenseFormat = "mxfp8" },
		func(c *config.Config) { c.ExpertDType = "fp8" },
	} {
		c := config.Tiny()
		mod(c)
		s, err := NewSynth(c, 3)
		if err != nil {
			t.Fatal(err)
		}
		for _, lt := range config.Layout(c) {
			d, err := s.TensorData(lt.Name)
			if err != nil {
				t.Fatal(err)
			}
			if int64(len(d)) != lt.Bytes() {
				t.Fatalf("dense %s experts %s: %s has %d bytes, layout wants %d", c.DenseFormat, c.ExpertDType, lt.Name, len(d), lt.Bytes())
			}
		}
		q, _ := s.TensorData("layers.0.attn.wq_a.weight")
		sc, _ := s.TensorData("layers.0.attn.wq_a.scale")
		var w []float32
		if c.DenseFormat == "mxfp8" {
			w, err = format.DequantMXFP8(q, sc, c.QLoraRank, c.Dim)
		} else {
			w, err = format.DequantFP8Block(q, sc, c.QLoraRank, c.Dim, c.BlockSize)
		}
		if err != nil {
			t.Fatal(err)
		}
		var ss float64
		for _, v := range w {
			ss += float64(v) * float64(v)
		}
		if got := ss / float64(len(w)) * float64(c.Dim); math.Abs(got-1) > 0.1 {
			t.Fatalf("dense %s: mean square x fan-in = %.3f, want about 1 (scales and codes disagree?)", c.DenseFormat, got)
		}
	}
	if _, err := NewSynth(&config.Config{}, 0); err == nil {
		t.Fatal("NewSynth accepted an invalid config")
	}
}
