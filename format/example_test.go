package format_test

import (
	"fmt"

	"moxie/format"
)

func ExampleQuantizeMXFP4() {
	w := make([]float32, 32) // one row, one 32-group
	w[0], w[1], w[2], w[3], w[31] = 1, -3, 2.5, 5, 6
	packed, scale := format.QuantizeMXFP4(w, 1, 32)
	// amax 6 fits E2M1's range, so the scale is 2^0 (byte 127); 2.5 and 5 are
	// ties and round to the even codes 2 and 4.
	fmt.Printf("scale byte %d, packed[0:2] % x\n", scale[0], packed[:2])
	back, _ := format.DequantMXFP4(packed, scale, 1, 32)
	fmt.Println(back[:4], back[31])
	// Output:
	// scale byte 127, packed[0:2] d2 64
	// [1 -3 2 4] 6
}

func ExampleRepackFP8BlockToMXFP8() {
	t := format.FP8BlockTensor{
		Name: "layers.0.attn.wq_a.weight", Rows: 2, Cols: 256, Block: 128,
		Q:     make([]byte, 2*256),
		Scale: []byte{120, 130}, ScaleDType: format.F8E8M0, // one row of 128x128 blocks
	}
	mx, err := format.RepackFP8BlockToMXFP8(t)
	fmt.Println(mx, err)

	t.Cols, t.Q = 240, make([]byte, 2*240)
	_, err = format.RepackFP8BlockToMXFP8(t)
	fmt.Println(err)
	// Output:
	// [120 120 120 120 130 130 130 130 120 120 120 120 130 130 130 130] <nil>
	// repack FP8-block tensor "layers.0.attn.wq_a.weight" to MXFP8: cols=240 is not a multiple of 32: a 32-group would run past the row
}
