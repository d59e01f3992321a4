package sample

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
)

// softmax64 is the reference distribution, computed independently in float64.
func softmax64(logits []float64, temp float64) []float64 {
	m := math.Inf(-1)
	for _, l := range logits {
		m = math.Max(m, l/temp)
	}
	out := make([]float64, len(logits))
	var z float64
	for i, l := range logits {
		out[i] = math.Exp(l/temp - m)
		z += out[i]
	}
	for i := range out {
		out[i] /= z
	}
	return out
}

func f32(xs ...float64) []float32 {
	out := make([]float32, len(xs))
	for i, x := range xs {
		out[i] = float32(x)
	}
	return out
}

// chiSquare draws n samples and returns Pearson's statistic against want
// (cells with want 0 must never be drawn) and the degrees of freedom.
func chiSquare(t *testing.T, s *Sampler, logits []float32, want []float64, n int) (float64, int) {
	t.Helper()
	counts := make([]int, len(logits))
	for range n {
		id, err := s.Sample(logits, nil)
		if err != nil {
			t.Fatal(err)
		}
		counts[id]++
	}
	var chi float64
	df := -1
	for i, p := range want {
		if p == 0 {
			if counts[i] != 0 {
				t.Fatalf("token %d has probability 0 but was drawn %d times", i, counts[i])
			}
			continue
		}
		e := p * float64(n)
		chi += (float64(counts[i]) - e) * (float64(counts[i]) - e) / e
		df++
	}
	return chi, df
}

// chiCritical999 holds the 0.999 quantiles of the chi-square distribution
// (standard tables) by degrees of freedom.
var chiCritical999 = map[int]float64{1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322}

func renorm(p []float64, keep []int) []float64 {
	out := make([]float64, len(p))
	var z float64
	for _, i := range keep {
		z += p[i]
	}
	for _, i := range keep {
		out[i] = p[i] / z
	}
	return out
}

func TestDistributions(t *testing.T) {
	raw := []float64{2.0, 1.5, 0.3, -0.5, 1.0, -2.0}
	logits := f32(raw...)
	for i := range raw {
		raw[i] = float64(logits[i]) // the reference uses the same float32 inputs
	}
	p07 := softmax64(raw, 0.7)
	p10 := softmax64(raw, 1.0)
	// p10 sorted: ids 0 (.41), 1 (.25), 4 (.15), 2 (.08), 3 (.03), 5 (.01)
	tests := []struct {
		name   string
		params Params
		want   []float64
	}{
		{"temperature 0.7", Params{Temperature: 0.7}, p07},
		{"temperature 1", Params{Temperature: 1}, p10},
		{"top-k 2", Params{Temperature: 1, TopK: 2}, renorm(p10, []int{0, 1})},
		{"top-k 3 at T=0.7", Params{Temperature: 0.7, TopK: 3}, renorm(p07, []int{0, 1, 4})},
		{"top-p 0.75", Params{Temperature: 1, TopP: 0.75}, renorm(p10, []int{0, 1, 4})},
		{"top-p 0.3", Params{Temperature: 1, TopP: 0.3}, renorm(p10, []int{0})},
		{"min-p 0.3", Params{Temperature: 1, MinP: 0.3}, renorm(p10, []int{0, 1, 4})},
		{"top-k 4 + top-p 0.9 + min-p 0.1", Params{Temperature: 1, TopK: 4, TopP: 0.9, MinP: 0.1}, renorm(p10, []int{0, 1, 4})},
		{"top-k 4 + top-p 0.95 + min-p 0.1", Params{Temperature: 1, TopK: 4, TopP: 0.95, MinP: 0.1}, renorm(p10, []int{0, 1, 4, 2})},
		{"top-k 4 + top-p 0.95 + min-p 0.2", Params{Temperature: 1, TopK: 4, TopP: 0.95, MinP: 0.2}, renorm(p10, []int{0, 1, 4})},
		{"top-p 1 is off", Params{Temperature: 1, TopP: 1}, p10},
		{"k larger than vocab", Params{Temperature: 1, TopK: 1000}, p10},
	}
	for _, c := range tests {
		t.Run(c.name, func(t *testing.T) {
			c.params.Seed = 12345
			s, err := New(c.params)
			if err != nil {
				t.Fatal(err)
			}
			chi, df := chiSquare(t, s, logits, c.want, 200_000)
			if df == 0 {
				return // a single possible outcome, checked by chiSquare
			}
			if chi > chiCritical999[df] {
				t.Errorf("chi-square %.2f with %d df exceeds %.2f (p=0.001)", chi, df, chiCritical999[df])
			}
		})
	}
}

func TestTopPCheckSums(t *testing.T) {
	// The keep sets in TestDistributions were worked out from these float64
	// probabilities; check the premises so that a wrong premise fails here.
	raw := []float64{2.0, 1.5, 0.3, -0.5, 1.0, -2.0}
	p := softmax64(raw, 1)
	// Descending: ids 0, 1, 4, 2, 3, 5.
	if !(p[0] > p[1] && p[1] > p[4] && p[4] > p[2] && p[2] > p[3] && p[3] > p[5]) {
		t.Fatalf("order premise broken: %v", p)
	}
	if !(p[0] < 0.75 && p[0]+p[1] < 0.75 && p[0]+p[1]+p[4] >= 0.75 && p[0] >= 0.3) {
		t.Errorf("top-p premise broken: %v", p)
	}
	z4 := p[0] + p[1] + p[4] + p[2] // top-4 mass
	if c := (p[0] + p[1] + p[4]) / z4; !(c >= 0.9 && c < 0.95) {
		t.Errorf("top-k 4 + top-p premise broken: %v", c)
	}
	if !(p[4] >= 0.3*p[0] && p[2] < 0.3*p[0] && p[2] >= 0.1*p[0] && p[2] < 0.2*p[0]) {
		t.Errorf("min-p premise broken: %v", p)
	}
}

func TestGreedy(t *testing.T) {
	inf := math.Inf(-1)
	tests := []struct {
		name    string
		logits  []float32
		history []int
		params  Params
		want    int
	}{
		{"argmax", f32(0.1, 3, 2), nil, Params{}, 1},
		{"tie takes lowest id", f32(1, 5, 5), nil, Params{}, 1},
		{"masked", f32(inf, inf, -100), nil, Params{}, 2},
		{"penalty divides positive", f32(2, 1.9, -1), []int{0}, Params{RepetitionPenalty: 1.5}, 1},
		{"penalty multiplies negative", f32(-1, -1.2, -5), []int{0}, Params{RepetitionPenalty: 1.5}, 1},
		{"penalty window excludes old ids", f32(2, 1.9, -1), []int{0, 2, 2}, Params{RepetitionPenalty: 1.5, RepetitionWindow: 2}, 0},
		{"penalty 1 is off", f32(2, 1.9), []int{0}, Params{RepetitionPenalty: 1}, 0},
		{"penalty below 1 stays finite", f32(3e38, 1), []int{0}, Params{RepetitionPenalty: 0.25}, 0},
		{"penalty below 1 sampled", f32(3e38, 1), []int{0}, Params{RepetitionPenalty: 0.25, Temperature: 1, TopK: 5}, 0},
		{"subnormal temperature is greedy", f32(1, 2, 0), nil, Params{Temperature: 5e-324, TopP: 0.5}, 1},
		{"history ids out of range ignored", f32(2, 1.9), []int{-1, 99}, Params{RepetitionPenalty: 2}, 0},
	}
	for _, c := range tests {
		t.Run(c.name, func(t *testing.T) {
			s, err := New(c.params)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := s.Sample(c.logits, c.history); err != nil || got != c.want {
				t.Errorf("Sample = %d, %v; want %d", got, err, c.want)
			}
		})
	}
}

func TestOnlyOneFinite(t *testing.T) {
	inf := math.Inf(-1)
	logits := f32(inf, inf, inf, 0.5, inf)
	for _, p := range []Params{{Temperature: 1}, {Temperature: 2, TopP: 0.5}, {Temperature: 0.5, TopK: 3, MinP: 0.9}} {
		s, _ := New(p)
		for range 100 {
			if id, err := s.Sample(logits, nil); err != nil || id != 3 {
				t.Fatalf("%+v: Sample = %d, %v", p, id, err)
			}
		}
	}
}

func TestSampleErrors(t *testing.T) {
	inf := math.Inf(-1)
	for _, c := range []struct {
		name   string
		logits []float32
		want   error
	}{
		{"empty", nil, ErrEmpty},
		{"nan", f32(1, math.NaN()), ErrNaN},
		{"+inf", f32(1, math.Inf(1)), ErrNaN},
		{"all masked", f32(inf, inf), ErrAllMasked},
	} {
		for _, temp := range []float64{0, 1} {
			t.Run(fmt.Sprintf("%s/T=%v", c.name, temp), func(t *testing.T) {
				s, _ := New(Params{Temperature: temp, TopP: 0.9})
				if _, err := s.Sample(c.logits, nil); !errors.Is(err, c.want) {
					t.Errorf("err = %v, want %v", err, c.want)
				}
			})
		}
	}
}

func TestNewRejectsBadParams(t *testing.T) {
	for _, p := range []Params{
		{Temperature: -1}, {Temperature: math.NaN()}, {Temperature: math.Inf(1)}, {TopK: -1},
		{TopP: 1.5}, {TopP: -0.1}, {TopP: math.NaN()}, {MinP: 2}, {RepetitionPenalty: -1},
		{RepetitionPenalty: math.NaN()}, {RepetitionWindow: -3},
	} {
		if _, err := New(p); err == nil {
			t.Errorf("New(%+v) accepted", p)
		}
	}
}

func TestReproducible(t *testing.T) {
	logits := f32(1, 2, 3, 2.5, 0, -1, 1.7)
	draw := func(seed uint64) []int {
		s, _ := New(Params{Temperature: 1.3, TopP: 0.95, Seed: seed})
		var out []int
		for range 64 {
			id, _ := s.Sample(logits, nil)
			out = append(out, id)
		}
		return out
	}
	if a, b := draw(7), draw(7); !slices.Equal(a, b) {
		t.Errorf("same seed, different draws:\n%v\n%v", a, b)
	}
	if a, b := draw(7), draw(8); slices.Equal(a, b) {
		t.Errorf("different seeds gave identical draws %v", a)
	}
}

// bigVocab returns n logits of background value bg with the given hot ids
// set, spread over several of Sample's chunks.
func bigVocab(n int, bg float32, hot map[int]float32) []float32 {
	l := make([]float32, n)
	for i := range l {
		l[i] = bg
	}
	for id, v := range hot {
		l[id] = v
	}
	return l
}

func TestLargeVocabGreedyAndErrors(t *testing.T) {
	// Across chunk boundaries: the argmax anywhere, the lowest id on ties
	// between chunks, NaN or +Inf in a late chunk, every chunk but one
	// masked.
	const n = 5*chunkIDs + 123
	inf := float32(math.Inf(-1))
	masked := bigVocab(n, inf, map[int]float32{n - 1: -3})
	for _, c := range []struct {
		name    string
		logits  []float32
		want    int
		wantErr error
	}{
		{"max in the first id", bigVocab(n, 0, map[int]float32{0: 9}), 0, nil},
		{"max at a chunk's last id", bigVocab(n, 0, map[int]float32{chunkIDs - 1: 9, 3 * chunkIDs: 8}), chunkIDs - 1, nil},
		{"max at a chunk's first id", bigVocab(n, 0, map[int]float32{2 * chunkIDs: 9, 5: 8}), 2 * chunkIDs, nil},
		{"max in the short last chunk", bigVocab(n, 0, map[int]float32{n - 1: 9}), n - 1, nil},
		{"tie across chunks takes the lowest id", bigVocab(n, 0, map[int]float32{4*chunkIDs + 7: 9, chunkIDs + 3: 9}), chunkIDs + 3, nil},
		{"only the last id unmasked", masked, n - 1, nil},
		{"NaN in a late chunk", bigVocab(n, 0, map[int]float32{4*chunkIDs + 1: float32(math.NaN())}), 0, ErrNaN},
		{"+Inf in a late chunk", bigVocab(n, 0, map[int]float32{n - 2: float32(math.Inf(1))}), 0, ErrNaN},
		{"all masked", bigVocab(n, inf, nil), 0, ErrAllMasked},
	} {
		for _, p := range []Params{{}, {Temperature: 0.8, TopP: 0.9}, {Temperature: 1}} {
			t.Run(fmt.Sprintf("%s/T=%v,top-p=%v", c.name, p.Temperature, p.TopP), func(t *testing.T) {
				s, _ := New(p)
				id, err := s.Sample(c.logits, nil)
				switch {
				case c.wantErr != nil:
					if !errors.Is(err, c.wantErr) {
						t.Errorf("err = %v, want %v", err, c.wantErr)
					}
				case err != nil:
					t.Fatal(err)
				case p.Temperature == 0 && id != c.want:
					t.Errorf("greedy = %d, want %d", id, c.want)
				case c.logits[id] == inf:
					t.Errorf("drew masked id %d", id)
				}
			})
		}
	}
}

func TestLargeVocabDistributions(t *testing.T) {
	// Five hot ids in different chunks and a background that carries a
	// real share of the mass (without truncation) spread over every chunk:
	// the draws' distribution over the cells {each hot id, the background}
	// against a float64 reference, and the nucleus/top-k keep sets worked
	// out independently.
	const n = 3*chunkIDs + 501
	hot := map[int]float32{3: 4.0, chunkIDs - 1: 3.4, chunkIDs: 3.0, 2*chunkIDs + 17: 2.2, n - 1: 1.1}
	ids := []int{3, chunkIDs - 1, chunkIDs, 2*chunkIDs + 17, n - 1} // descending logits
	const bg = -8.0
	logits := bigVocab(n, bg, hot)
	// Reference probabilities (float64) of the hot ids and the background.
	ref := func(temp float64, keep int) (cells []float64) {
		var z float64
		w := make([]float64, len(ids))
		for i, id := range ids {
			w[i] = math.Exp(float64(logits[id]) / temp)
			if i < keep {
				z += w[i]
			}
		}
		bgMass := 0.0
		if keep == len(ids)+1 { // no truncation: the background too
			bgMass = float64(n-len(ids)) * math.Exp(bg/temp)
			z += bgMass
		}
		for i := range w {
			if i < keep {
				cells = append(cells, w[i]/z)
			} else {
				cells = append(cells, 0)
			}
		}
		return append(cells, bgMass/z)
	}
	// The nucleus at T=1, p=0.8, over the full distribution: find the
	// keep count from the reference.
	full := ref(1, len(ids)+1)
	keepP := 0
	for cum := 0.0; cum < 0.8; keepP++ {
		cum += full[keepP]
	}
	if keepP < 2 || keepP > 4 || full[len(full)-1] < 0.05 {
		t.Fatalf("premise: nucleus of %d ids, background mass %.3f (want 2-4 ids and >= 0.05)", keepP, full[len(full)-1])
	}
	for _, c := range []struct {
		name   string
		params Params
		want   []float64
	}{
		{"temperature 1", Params{Temperature: 1}, full},
		{"temperature 0.7", Params{Temperature: 0.7}, ref(0.7, len(ids)+1)},
		{"top-k 3", Params{Temperature: 1, TopK: 3}, ref(1, 3)},
		{"top-p 0.8", Params{Temperature: 1, TopP: 0.8}, ref(1, keepP)},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.params.Seed = 99
			s, err := New(c.params)
			if err != nil {
				t.Fatal(err)
			}
			const draws = 6_000
			counts := make([]int, len(ids)+1)
			cell := map[int]int{}
			for i, id := range ids {
				cell[id] = i
			}
			for range draws {
				id, err := s.Sample(logits, nil)
				if err != nil {
					t.Fatal(err)
				}
				if i, ok := cell[id]; ok {
					counts[i]++
				} else {
					counts[len(ids)]++
				}
			}
			var chi float64
			df := -1
			for i, p := range c.want {
				if p == 0 {
					if counts[i] != 0 {
						t.Fatalf("cell %d has probability 0 but was drawn %d times", i, counts[i])
					}
					continue
				}
				e := p * draws
				chi += (float64(counts[i]) - e) * (float64(counts[i]) - e) / e
				df++
			}
			if chi > chiCritical999[df] {
				t.Errorf("chi-square %.2f with %d df exceeds %.2f (p=0.001); counts %v, want %v", chi, df, chiCritical999[df], counts, c.want)
			}
		})
	}
}

func TestLargeVocabIndependentOfCores(t *testing.T) {
	// The draws depend on the seed, not on how many goroutines scan.
	const n = 7*chunkIDs + 9
	logits := make([]float32, n)
	for i := range logits {
		logits[i] = float32(math.Sin(float64(i)*0.37)) * 3
	}
	draw := func(procs int, p Params) []int {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
		s, _ := New(p)
		var out []int
		for range 40 {
			id, err := s.Sample(logits, nil)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, id)
		}
		return out
	}
	for _, p := range []Params{{Temperature: 1, Seed: 4}, {Temperature: 0.6, TopP: 0.95, Seed: 5}, {Temperature: 1, MinP: 0.2, RepetitionPenalty: 1.3, Seed: 6}} {
		if a, b := draw(1, p), draw(4, p); !slices.Equal(a, b) {
			t.Errorf("%+v: one goroutine and four drew differently", p)
		}
	}
}

func TestSelection(t *testing.T) {
	// selectTop and selectMass against a sort: random candidates with many
	// ties in p (multiples of 1/64, so that sums are exact), every cut.
	rank := func(c []cand) []cand {
		r := slices.Clone(c)
		sortRanked(r)
		return r
	}
	set := func(c []cand) map[int]bool {
		m := map[int]bool{}
		for _, x := range c {
			m[x.id] = true
		}
		return m
	}
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		n := 1 + r.IntN(300)
		c := make([]cand, n)
		for i := range c {
			c[i] = cand{id: r.IntN(1 << 20), p: float64(1+r.IntN(8)) / 64}
			if trial%3 == 0 {
				c[i].id = i // sorted ids: the median pivot's best case
			}
		}
		c = slices.CompactFunc(slices.SortedFunc(slices.Values(c), func(a, b cand) int { return a.id - b.id }), func(a, b cand) bool { return a.id == b.id })
		if trial%5 == 0 {
			sortRanked(c) // already ranked, and reversed below
			if trial%10 == 0 {
				slices.Reverse(c)
			}
		}
		want := rank(c)
		k := 1 + r.IntN(len(c))
		if k < len(c) {
			got := slices.Clone(c)
			selectTop(got, k)
			if !maps.Equal(set(got[:k]), set(want[:k])) {
				t.Fatalf("trial %d: selectTop(%d of %d) kept another set", trial, k, len(c))
			}
		}
		var total float64
		for _, x := range c {
			total += x.p
		}
		for _, target := range []float64{0, want[0].p, total / 2, total * 0.95, total, total + 1} {
			wantM := len(want)
			var cum float64
			for i, x := range want {
				if cum += x.p; cum >= target {
					wantM = i + 1
					break
				}
			}
			got := slices.Clone(c)
			m := selectMass(got, target)
			if m != wantM || !maps.Equal(set(got[:m]), set(want[:m])) {
				t.Fatalf("trial %d: selectMass(target %v of %v) kept %d ids, want %d (or another set)", trial, target, total, m, wantM)
			}
		}
	}
}

func TestStopTokens(t *testing.T) {
	s, _ := New(Params{StopTokens: []int{1, 128822}})
	for id, want := range map[int]bool{1: true, 128822: true, 0: false, 2: false} {
		if s.IsStop(id) != want {
			t.Errorf("IsStop(%d) = %v", id, !want)
		}
	}
}

func FuzzSample(f *testing.F) {
	f.Add([]byte{0, 0, 128, 63, 0, 0, 0, 64}, float64(1), 0, 0.9, 0.05, 1.1, uint64(1))
	f.Add([]byte{0, 0, 128, 255, 0, 0, 192, 127}, float64(0), 5, 0.0, 0.0, 0.0, uint64(2))
	f.Fuzz(func(t *testing.T, raw []byte, temp float64, topK int, topP, minP, pen float64, seed uint64) {
		s, err := New(Params{Temperature: temp, TopK: topK, TopP: topP, MinP: minP, RepetitionPenalty: pen, Seed: seed})
		if err != nil {
			return
		}
		var logits []float32
		finite := false
		for i := 0; i+4 <= len(raw); i += 4 {
			v := math.Float32frombits(uint32(raw[i]) | uint32(raw[i+1])<<8 | uint32(raw[i+2])<<16 | uint32(raw[i+3])<<24)
			logits = append(logits, v)
			if !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) {
				finite = true
			}
		}
		allFinite := true
		for _, v := range logits {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				allFinite = false
			}
		}
		id, err := s.Sample(logits, []int{0, 1, 2})
		if err == nil && (id < 0 || id >= len(logits)) {
			t.Fatalf("id %d outside [0, %d)", id, len(logits))
		}
		if allFinite && finite && err != nil {
			t.Fatalf("finite logits rejected: %v", err)
		}
	})
}

func BenchmarkSample(b *testing.B) {
	const vocab = 129280
	var x uint64 = 1
	next := func() float32 {
		x = x*6364136223846793005 + 1442695040888963407
		return float32(x>>40) / float32(1<<24)
	}
	peaked := make([]float32, vocab) // a peaked, reproducible spread of logits
	flat := make([]float32, vocab)   // nearly uniform (a random-weight model's): the nucleus holds most ids
	for i := range peaked {
		peaked[i] = next()*8 - 4
		if i%997 == 0 {
			peaked[i] += 8
		}
	}
	for i := range flat {
		flat[i] = next() * 0.5
	}
	for _, c := range []struct {
		name   string
		p      Params
		logits []float32
	}{
		{"greedy", Params{}, peaked},
		{"temperature", Params{Temperature: 0.8}, peaked},
		{"top-p-0.95", Params{Temperature: 0.8, TopP: 0.95}, peaked},
		{"top-k-40", Params{Temperature: 0.8, TopK: 40}, peaked},
		{"min-p-0.05", Params{Temperature: 0.8, MinP: 0.05}, peaked},
		{"flat/top-p-0.95", Params{Temperature: 0.6, TopP: 0.95}, flat},
		{"flat/top-k-50000", Params{Temperature: 0.6, TopK: 50000}, flat},
	} {
		b.Run(c.name, func(b *testing.B) {
			s, _ := New(c.p)
			for b.Loop() {
				if _, err := s.Sample(c.logits, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
