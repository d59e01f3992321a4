package format

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// f32Scales encodes E8M0 scale bytes as little-endian float32 multipliers.
func f32Scales(e8 []byte) []byte {
	out := make([]byte, 4*len(e8))
	for i, b := range e8 {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(float32(math.Ldexp(1, int(b)-127))))
	}
	return out
}

// checkRepackExact repacks t and asserts (1) the MX scale layout formula and (2)
// every element of DequantMXFP8(t.Q, mx) equals the FP8-block dequantization
// bit for bit, where the latter is computed independently from the reference
// decoders with t's own scales (E8M0 bytes or float32 values).
func checkRepackExact(t *testing.T, tn FP8BlockTensor) {
	t.Helper()
	mx, err := RepackFP8BlockToMXFP8(tn)
	if err != nil {
		t.Fatalf("repack: %v", err)
	}
	gpr := tn.Cols / 32
	cb := (tn.Cols + tn.Block - 1) / tn.Block
	if len(mx) != tn.Rows*gpr {
		t.Fatalf("len(mxScale)=%d, want %d", len(mx), tn.Rows*gpr)
	}
	blockScale := func(bi, bj int) float64 { // reference value of source scale [bi, bj]
		k := bi*cb + bj
		if tn.ScaleDType == F32 {
			return float64(math.Float32frombits(binary.LittleEndian.Uint32(tn.Scale[4*k:])))
		}
		v, _ := refE8M0(tn.Scale[k])
		return v
	}
	for r := 0; r < tn.Rows; r++ {
		for g := 0; g < gpr; g++ {
			got, _ := refE8M0(mx[r*gpr+g])
			if want := blockScale(r/tn.Block, 32*g/tn.Block); got != want {
				t.Fatalf("mxScale[%d,%d] = 2^%d, want %g", r, g, int(mx[r*gpr+g])-127, want)
			}
		}
	}
	after, err := DequantMXFP8(tn.Q, mx, tn.Rows, tn.Cols)
	if err != nil {
		t.Fatal(err)
	}
	if tn.ScaleDType == F8E8M0 {
		before, err := DequantFP8Block(tn.Q, tn.Scale, tn.Rows, tn.Cols, tn.Block)
		if err != nil {
			t.Fatal(err)
		}
		for i := range before {
			if math.Float32bits(before[i]) != math.Float32bits(after[i]) {
				t.Fatalf("element %d: FP8-block %v (bits %#08x) != MXFP8 %v (bits %#08x)", i, before[i], math.Float32bits(before[i]), after[i], math.Float32bits(after[i]))
			}
		}
	}
	for i := range after {
		r, c := i/max(tn.Cols, 1), i%max(tn.Cols, 1)
		v, nan := refE4M3(tn.Q[i])
		want := refProduct(v, blockScale(r/tn.Block, c/tn.Block))
		if nan {
			if after[i] == after[i] {
				t.Fatalf("element %d: NaN code decoded to %v", i, after[i])
			}
			continue
		}
		if math.Float32bits(after[i]) != math.Float32bits(want) {
			t.Fatalf("element [%d,%d]: MXFP8 %v, reference FP8-block %v", r, c, after[i], want)
		}
	}
}

func TestRepackFP8BlockToMXFP8Exact(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	shapes := []shape{
		{1, 32, 128}, {5, 64, 128}, {128, 128, 128}, {129, 160, 128}, {257, 416, 128},
		{3, 32, 32}, {200, 96, 64}, {64, 4096, 128}, {0, 0, 128}, {0, 64, 128}, {7, 0, 128}, {300, 256, 256},
	}
	for _, s := range shapes {
		rb, cb := (s.rows+s.block-1)/s.block, (s.cols+s.block-1)/s.block
		name := fmt.Sprintf("%dx%d/b%d", s.rows, s.cols, s.block)
		t.Run("quantized/"+name, func(t *testing.T) {
			q, sc := QuantizeFP8Block(randWeights(rng, s.rows*s.cols), s.rows, s.cols, s.block)
			checkRepackExact(t, FP8BlockTensor{Name: "w", Rows: s.rows, Cols: s.cols, Block: s.block, Q: q, Scale: sc, ScaleDType: F8E8M0})
		})
		t.Run("random-bytes/"+name, func(t *testing.T) {
			// Arbitrary codes (incl. NaN) and every legal scale byte, including the
			// extremes where the float32 product overflows or goes subnormal.
			q := randBytes(rng, s.rows*s.cols)
			sc := make([]byte, rb*cb)
			for i := range sc {
				sc[i] = byte(rng.IntN(255))
			}
			if len(sc) > 0 {
				sc[0] = 0
				sc[len(sc)-1] = 254
			}
			tn := FP8BlockTensor{Name: "w", Rows: s.rows, Cols: s.cols, Block: s.block, Q: q, Scale: sc, ScaleDType: F8E8M0}
			checkRepackExact(t, tn)
			tn.Scale, tn.ScaleDType = f32Scales(sc), F32
			checkRepackExact(t, tn)
		})
	}
}

func TestRepackFP8BlockToMXFP8Refusals(t *testing.T) {
	ok := func() FP8BlockTensor {
		return FP8BlockTensor{Name: "layers.3.attn.wq_b.weight", Rows: 130, Cols: 256, Block: 128,
			Q: make([]byte, 130*256), Scale: []byte{127, 127, 120, 130}, ScaleDType: F8E8M0}
	}
	f32 := func(vals ...float32) []byte {
		b := make([]byte, 4*len(vals))
		for i, v := range vals {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
		return b
	}
	cases := []struct {
		name   string
		modify func(*FP8BlockTensor)
		reason string
	}{
		{"cols not multiple of 32", func(t *FP8BlockTensor) { t.Cols, t.Q = 240, make([]byte, 130*240) }, "not a multiple of 32"},
		{"block not multiple of 32", func(t *FP8BlockTensor) { t.Block, t.Scale = 48, make([]byte, 3*6) }, "straddle"},
		{"block zero", func(t *FP8BlockTensor) { t.Block = 0 }, "bad shape"},
		{"negative rows", func(t *FP8BlockTensor) { t.Rows = -1 }, "bad shape"},
		{"rows*cols overflows", func(t *FP8BlockTensor) { t.Rows, t.Cols = 1<<40, 1<<40 }, "bad shape"},
		{"Q short", func(t *FP8BlockTensor) { t.Q = t.Q[:100] }, "len(Q)=100"},
		{"Q long", func(t *FP8BlockTensor) { t.Q = make([]byte, 130*256+1) }, "len(Q)=33281"},
		{"E8M0 scale short", func(t *FP8BlockTensor) { t.Scale = t.Scale[:3] }, "scale size mismatch"},
		{"E8M0 scale long", func(t *FP8BlockTensor) { t.Scale = append(t.Scale, 127) }, "scale size mismatch"},
		{"F32 scale size", func(t *FP8BlockTensor) { t.Scale, t.ScaleDType = f32(1, 1, 1), F32 }, "scale size mismatch"},
		{"E8M0 NaN", func(t *FP8BlockTensor) { t.Scale[2] = 0xFF }, "0xFF"},
		{"F32 not power of two", func(t *FP8BlockTensor) { t.Scale, t.ScaleDType = f32(1, 3, 0.5, 2), F32 }, "not an exact power of two"},
		{"F32 below E8M0 range", func(t *FP8BlockTensor) {
			t.Scale, t.ScaleDType = f32(1, float32(math.Ldexp(1, -128)), 1, 1), F32
		}, "not an exact power of two"},
		{"F32 zero", func(t *FP8BlockTensor) { t.Scale, t.ScaleDType = f32(0, 1, 1, 1), F32 }, "not an exact power of two"},
		{"F32 negative", func(t *FP8BlockTensor) { t.Scale, t.ScaleDType = f32(1, 1, 1, -4), F32 }, "not an exact power of two"},
		{"F32 NaN", func(t *FP8BlockTensor) { t.Scale, t.ScaleDType = f32(1, float32(math.NaN()), 1, 1), F32 }, "not an exact power of two"},
		{"F32 Inf", func(t *FP8BlockTensor) { t.Scale, t.ScaleDType = f32(1, 1, float32(math.Inf(1)), 1), F32 }, "not an exact power of two"},
		{"BF16 scale dtype", func(t *FP8BlockTensor) { t.ScaleDType = BF16 }, "unsupported"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tn := ok()
			tc.modify(&tn)
			mx, err := RepackFP8BlockToMXFP8(tn)
			if err == nil || mx != nil {
				t.Fatalf("got (%d bytes, %v), want an error", len(mx), err)
			}
			if !strings.Contains(err.Error(), tn.Name) || !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("error %q should name %q and say %q", err, tn.Name, tc.reason)
			}
		})
	}
	// The unmodified tensor is accepted (the cases above fail for their stated reason only).
	if _, err := RepackFP8BlockToMXFP8(ok()); err != nil {
		t.Fatalf("valid tensor refused: %v", err)
	}
}

// FuzzRepackFP8BlockToMXFP8 feeds arbitrary shapes, scale bytes and dtypes: the
// repack must never panic, and whenever it succeeds the repacked tensor must
// dequantize bit-identically to the source.
func FuzzRepackFP8BlockToMXFP8(f *testing.F) {
	f.Add(uint8(3), uint8(2), uint8(1), false, []byte{127, 128, 0, 254}, uint64(1))
	f.Fuzz(func(t *testing.T, rows, cols32, block32 uint8, f32 bool, scale []byte, seed uint64) {
		r, c, b := int(rows)%300, 32*(int(cols32)%12), 32*(int(block32)%6)
		if cols32 >= 200 { // also exercise unaligned cols
			c = int(cols32)
		}
		rng := rand.New(rand.NewPCG(seed, 0))
		tn := FP8BlockTensor{Name: "fuzz.weight", Rows: r, Cols: c, Block: b, Q: randBytes(rng, r*c), Scale: scale, ScaleDType: F8E8M0}
		if f32 {
			tn.ScaleDType = F32
		}
		mx, err := RepackFP8BlockToMXFP8(tn)
		if err != nil {
			if !strings.Contains(err.Error(), "fuzz.weight") {
				t.Fatalf("error does not name the tensor: %v", err)
			}
			return
		}
		if len(mx) != r*c/32 {
			t.Fatalf("len(mx)=%d, want %d", len(mx), r*c/32)
		}
		checkRepackExact(t, tn)
	})
}
