package kern

import "testing"

// fuzzBytes hands out bytes of the fuzz input, cycling (zeros if empty).
type fuzzBytes struct {
	d []byte
	i int
}

func (f *fuzzBytes) next() byte {
	if len(f.d) == 0 {
		return 0
	}
	b := f.d[f.i%len(f.d)]
	f.i++
	return b
}

func (f *fuzzBytes) fill(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = f.next()
	}
	return b
}

// inputs returns batch rows of small exact floats (k/16, |k| < 128).
func (f *fuzzBytes) inputs(n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(int8(f.next())) / 16
	}
	return x
}

// fuzzCheck compares every path with the reference when the weights' scales
// keep all values well inside float32's normal range; otherwise (hostile
// scales) it only requires that nothing panics.
func fuzzCheck(t *testing.T, m Matrix, ref refMatrix, x []float32, batch, r0, r1 int, compare bool) {
	p := NewPool(2)
	defer p.Close()
	for _, path := range paths {
		for _, pp := range []*Pool{nil, p} {
			if compare {
				checkProduct(t, path.mul, m, ref, pp, x, batch, r0, r1)
			} else {
				y := make([]float32, batch*(r1-r0))
				path.mul(m, pp, y, x, batch, r0, r1)
			}
		}
	}
}

func FuzzMatMulFP8(f *testing.F) {
	f.Add([]byte{3, 160, 0, 1, 0, 0, 0, 0x38, 0x81, 0x7F, 0x44})
	f.Add([]byte{0, 32, 0, 0, 1, 0, 0})
	f.Add([]byte{128, 1, 1, 2, 0, 5, 3, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Fuzz(func(t *testing.T, data []byte) {
		fb := &fuzzBytes{d: data}
		rows := 1 + int(fb.next())%160
		cols := 1 + (int(fb.next())|int(fb.next())<<8)%300
		batch := 1 + int(fb.next())%4
		block := 128
		if b := fb.next(); b%4 == 1 {
			block = 1 + int(b)%70
		}
		r0 := int(fb.next()) % (rows + 1)
		r1 := r0 + int(fb.next())%(rows-r0+1)
		hostile := fb.next()%8 == 0
		q := fb.fill(rows * cols)
		s := fb.fill(ceilDiv(rows, block) * ceilDiv(cols, block))
		if !hostile {
			for i := range s {
				s[i] = 100 + s[i]%50
			}
		}
		m := FP8Block{Q: q, Scale: s, Rows: rows, Cols: cols, Block: block}
		x := fb.inputs(batch * cols)
		fuzzCheck(t, m, refFP8(m), x, batch, r0, r1, !hostile)
	})
}

func FuzzMatMulMXFP4(f *testing.F) {
	f.Add([]byte{3, 5, 1, 0, 0, 0x12, 0x9F, 0xF0, 0x77})
	f.Add([]byte{0, 0, 0, 0, 0})
	f.Add([]byte{200, 40, 2, 7, 9, 1, 0xFF, 0x80, 0x08})
	f.Fuzz(func(t *testing.T, data []byte) {
		fb := &fuzzBytes{d: data}
		rows := 1 + int(fb.next())%160
		cols := 32 * (1 + int(fb.next())%40)
		batch := 1 + int(fb.next())%4
		r0 := int(fb.next()) % (rows + 1)
		r1 := r0 + int(fb.next())%(rows-r0+1)
		hostile := fb.next()%8 == 0
		packed := fb.fill(rows * cols / 2)
		s := fb.fill(rows * cols / 32)
		if !hostile {
			for i := range s {
				s[i] = 100 + s[i]%50
			}
		}
		m := MXFP4{Packed: packed, Scale: s, Rows: rows, Cols: cols}
		x := fb.inputs(batch * cols)
		fuzzCheck(t, m, refMX(m), x, batch, r0, r1, !hostile)
	})
}
