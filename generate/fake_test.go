package generate

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"time"
)

// fakeModel is a deterministic automaton: after a history h its logits favour
// next(h) by a wide margin over a pseudo-random but history-determined
// background, so greedy decoding follows next while a random sampler at a
// high temperature wanders reproducibly.
type fakeModel struct {
	vocab, maxCtx int
	eos           int // -1: the model does not implement EOS (see fakeNoEOS)
	next          func(h []int) int
	step          time.Duration // sleep per Append, interrupted by ctx
	blockAt       int           // if > 0, Append blocks until ctx is done when Len() reaches it
	onBlock       func()        // called when Append starts blocking
	failAt        int           // if > 0, Append fails when Len() reaches it
	flat          bool          // all logits equal except the favourite (+0.5 only)
	nan           bool          // logit 0 is NaN

	mu       sync.Mutex
	open     int
	closed   int
	appended int // tokens passed to Append, over all sequences
	newFail  int // if > 0, NewSequence fails while more than this many sequences are open
	clones   int // sequences made by CloneSequence
	noClone  bool
	seqID    string // SequenceID's suffix (disk_test.go)
	// restoreFail, if set, is RestoreSequence's error (disk_test.go).
	restoreFail error
}

type fakeSeq struct {
	m      *fakeModel
	h      []int
	closed bool
}

func (m *fakeModel) NewSequence() (Sequence, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.newFail > 0 && m.open-m.closed >= m.newFail {
		return nil, errors.New("fake model: out of memory for sequences")
	}
	m.open++
	return &fakeSeq{m: m}, nil
}
func (m *fakeModel) VocabSize() int  { return m.vocab }
func (m *fakeModel) MaxContext() int { return m.maxCtx }
func (m *fakeModel) EOS() int        { return m.eos }

func (m *fakeModel) stats() (open, closed int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.open, m.closed
}

var errFake = errors.New("fake model failure")

func (s *fakeSeq) Append(ctx context.Context, tokens []int) ([]float32, error) {
	m := s.m
	if s.closed {
		return nil, errors.New("append after close")
	}
	if m.failAt > 0 && len(s.h) >= m.failAt {
		return nil, errFake
	}
	if m.blockAt > 0 && len(s.h) >= m.blockAt {
		if m.onBlock != nil {
			m.onBlock()
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if m.step > 0 {
		t := time.NewTimer(m.step)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
	s.h = append(s.h, tokens...)
	m.mu.Lock()
	m.appended += len(tokens)
	m.mu.Unlock()
	if len(s.h) > m.maxCtx {
		return nil, errors.New("context overflow")
	}
	var hash uint64 = 1469598103934665603
	for _, t := range s.h {
		hash = (hash ^ uint64(t)) * 1099511628211
	}
	r := rand.New(rand.NewPCG(hash, 7))
	logits := make([]float32, m.vocab)
	for i := range logits {
		if !m.flat {
			logits[i] = float32(r.Float64())
		}
	}
	if m.nan {
		logits[0] = float32(math.NaN())
	}
	if m.flat {
		logits[m.next(s.h)] = 0.5
	} else {
		logits[m.next(s.h)] += 20
	}
	return logits, nil
}

func (s *fakeSeq) Len() int { return len(s.h) }

// CloneSequence implements Cloner unless the model's noClone is set (then
// it fails, as a sequence that cannot copy its state would).
func (s *fakeSeq) CloneSequence() (Sequence, error) {
	if s.m.noClone {
		return nil, errors.New("fake model: cannot clone")
	}
	s.m.mu.Lock()
	s.m.open++
	s.m.clones++
	s.m.mu.Unlock()
	return &fakeSeq{m: s.m, h: append([]int(nil), s.h...)}, nil
}

func (s *fakeSeq) Close() error {
	s.m.mu.Lock()
	s.m.closed++
	s.m.mu.Unlock()
	s.closed = true
	return nil
}

// fakeNoEOS hides the EOS method.
type fakeNoEOS struct{ *fakeModel }

func (f fakeNoEOS) NewSequence() (Sequence, error) { return f.fakeModel.NewSequence() }
func (f fakeNoEOS) VocabSize() int                 { return f.fakeModel.VocabSize() }
func (f fakeNoEOS) MaxContext() int                { return f.fakeModel.MaxContext() }

// script returns a next function that, after a prompt of n tokens, produces
// the ids of out in order and then repeats the last id.
func script(n int, out ...int) func(h []int) int {
	return func(h []int) int {
		i := len(h) - n
		if i >= len(out) {
			i = len(out) - 1
		}
		return out[i]
	}
}

// tableDetok decodes id i as pieces[i] and holds nothing back.
type tableDetok struct {
	pieces []string
	tail   string // returned by Flush
}

func (d *tableDetok) Add(id int) string { return d.pieces[id] }
func (d *tableDetok) Flush() string {
	s := d.tail
	d.tail = ""
	return s
}

// seededSampler samples from softmax(logits) with its own PCG stream.
type seededSampler struct{ r *rand.Rand }

func newSeeded(seed uint64) *seededSampler {
	return &seededSampler{rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

func (s *seededSampler) Sample(logits []float32, _ []int) (int, error) {
	// temperature 1 over the background only: the scripted favourite is
	// ignored so that the draw depends on the seed.
	var total float64
	w := make([]float64, len(logits))
	for i, v := range logits {
		if v > 10 {
			continue
		}
		w[i] = float64(v) + 0.01
		total += w[i]
	}
	u := s.r.Float64() * total
	for i, x := range w {
		u -= x
		if u < 0 {
			return i, nil
		}
	}
	return len(logits) - 1, nil
}

// badSampler returns a fixed id.
type badSampler int

func (b badSampler) Sample([]float32, []int) (int, error) { return int(b), nil }

// failSampler always fails.
type failSampler struct{}

var errSample = errors.New("sampler failure")

func (failSampler) Sample([]float32, []int) (int, error) { return 0, errSample }

// recSampler records the histories it was shown.
type recSampler struct{ hist [][]int }

func (r *recSampler) Sample(l []float32, h []int) (int, error) {
	r.hist = append(r.hist, append([]int(nil), h...))
	best := 0
	for i, v := range l {
		if v > l[best] {
			best = i
		}
	}
	return best, nil
}
