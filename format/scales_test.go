package format

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// The scale-only functions must give exactly the scales the quantizers store
// (the quantizers' scale rule itself is checked against a search in block_test).
func TestScalesMatchQuantizers(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, sh := range []struct{ rows, cols, block int }{{1, 32, 128}, {129, 160, 128}, {3, 64, 32}, {256, 512, 128}} {
		w := make([]float32, sh.rows*sh.cols)
		for i := range w {
			w[i] = float32(r.NormFloat64() * float64(1+i%7) * 1e-2)
		}
		_, s := QuantizeFP8Block(w, sh.rows, sh.cols, sh.block)
		if got := ScalesFP8Block(w, sh.rows, sh.cols, sh.block); !bytes.Equal(got, s) {
			t.Fatalf("%v: ScalesFP8Block differs from QuantizeFP8Block's scales", sh)
		}
		_, s = QuantizeMXFP4(w, sh.rows, sh.cols)
		if got := ScalesMXFP4(w, sh.rows, sh.cols); !bytes.Equal(got, s) {
			t.Fatalf("%v: ScalesMXFP4 differs from QuantizeMXFP4's scales", sh)
		}
	}
}
