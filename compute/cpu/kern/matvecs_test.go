package kern

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// otherMatrix is a Matrix of a type MatVecs does not know: it is
// multiplied through its own MatMul.
type otherMatrix struct{ F32 }

// TestMatVecs: every product of a joint split has the bits of its own
// MatMul, for each weight type, shapes that are not multiples of the split's
// unit, empty ones, a foreign Matrix, and pools of 1, 2 and 5 workers.
func TestMatVecs(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	mats := []Matrix{
		randFP8(rng, 130, 256, 128),
		randMX(rng, 37, 64),
		randBF(rng, 16, 96),
		randF32(rng, 5, 40),
		randMX(rng, 512, 128),
		randFP8(rng, 0, 128, 128),
		otherMatrix{randF32(rng, 9, 24)},
		randFP8(rng, 300, 384, 128),
	}
	for _, workers := range []int{1, 2, 5} {
		for _, set := range [][]int{{0}, {1, 2}, {0, 1, 2, 3, 4, 5, 6, 7}, {4, 4, 1}} {
			t.Run(fmt.Sprintf("workers=%d/set=%v", workers, set), func(t *testing.T) {
				p := NewPool(workers)
				defer p.Close()
				ms := make([]MatVec, len(set))
				want := make([][]float32, len(set))
				for i, k := range set {
					rows, cols := mats[k].Dims()
					x := randX(rng, cols)
					want[i] = make([]float32, rows)
					mats[k].MatMul(p, want[i], x, 1)
					y := make([]float32, rows+1) // one past the rows: must stay untouched
					y[rows] = 42
					ms[i] = MatVec{W: mats[k], Y: y, X: x}
				}
				MatVecs(p, ms)
				for i, m := range ms {
					rows, _ := m.W.Dims()
					for r := range rows {
						if math.Float32bits(m.Y[r]) != math.Float32bits(want[i][r]) {
							t.Fatalf("product %d (%T), row %d: %v, want MatMul's %v", i, m.W, r, m.Y[r], want[i][r])
						}
					}
					if m.Y[rows] != 42 {
						t.Errorf("product %d: wrote past its %d rows", i, rows)
					}
				}
			})
		}
	}
}

// TestMatVecsPanics: a product whose slices do not fit its weight panics
// with MatMul's message.
func TestMatVecsPanics(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	w := randMX(rng, 32, 64)
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "MatVecs") || !strings.Contains(fmt.Sprint(r), "len(y)") {
			t.Fatalf("panic %v, want one naming MatVecs and len(y)", r)
		}
	}()
	MatVecs(nil, []MatVec{{W: w, Y: make([]float32, 31), X: make([]float32, 64)}})
}

// BenchmarkMatVecsPair: an expert's w1 and w3 (MXFP4 2048×4096, 4.5 MB
// each) at batch 1, as two MatMul calls (two fan-outs) and as one MatVecs.
func BenchmarkMatVecsPair(b *testing.B) {
	ms, size := mxCopies(2048, 4096)
	x := randX(rand.New(rand.NewPCG(3, 4)), 4096)
	g, u := make([]float32, 2048), make([]float32, 2048)
	for _, w := range workerCounts() {
		for _, joint := range []bool{false, true} {
			b.Run(fmt.Sprintf("workers=%d/joint=%v", w, joint), func(b *testing.B) {
				p := NewPool(w)
				defer p.Close()
				b.SetBytes(int64(2 * size))
				i := 0
				c := startCPU()
				for b.Loop() {
					w1, w3 := ms[i%len(ms)], ms[(i+1)%len(ms)]
					if joint {
						MatVecs(p, []MatVec{{W: w1, Y: g, X: x}, {W: w3, Y: u, X: x}})
					} else {
						w1.MatMul(p, g, x, 1)
						w3.MatMul(p, u, x, 1)
					}
					i += 2
				}
				reportGBs(b, c, w, 2*size)
			})
		}
	}
}

// TestMXFP4SplitBits: a parallel MXFP4 product (its input prepared once and
// shared by the chunks of rows, in MatMul and in MatVecs) gives the bits of
// the single-threaded one, which transposes the input itself: shapes with
// more than one column chunk, a tail of columns and an odd number of rows.
func TestMXFP4SplitBits(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	p := NewPool(3)
	defer p.Close()
	for _, s := range []struct{ rows, cols int }{{257, 4096}, {130, 4096 + 512 + 96}, {64, 8704}, {33, 2048}} {
		t.Run(fmt.Sprintf("%dx%d", s.rows, s.cols), func(t *testing.T) {
			w1, w3 := randMX(rng, s.rows, s.cols), randMX(rng, s.rows, s.cols)
			x := randX(rng, s.cols)
			want1, want3 := make([]float32, s.rows), make([]float32, s.rows)
			w1.MatMul(nil, want1, x, 1)
			w3.MatMul(nil, want3, x, 1)
			got1, got3 := make([]float32, s.rows), make([]float32, s.rows)
			w1.MatMul(p, got1, x, 1)
			sameBits(t, "MatMul", got1, want1)
			clear(got1)
			MatVecs(p, []MatVec{{W: w1, Y: got1, X: x}, {W: w3, Y: got3, X: x}})
			sameBits(t, "MatVecs w1", got1, want1)
			sameBits(t, "MatVecs w3", got3, want3)
		})
	}
}

func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: row %d = %v (%#x), want %v (%#x)", what, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}
