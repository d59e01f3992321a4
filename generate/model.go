// Package generate runs the decode loop: it feeds a prompt to a model sequence,
// samples tokens, detokenizes them as they come, and stops on stop tokens, stop
// strings, a token limit or cancellation, reporting per-request statistics.
package generate

import (
	"context"

	"moxie/sample"
)

// Sequence is one conversation's model state. It is not safe for concurrent use.
type Sequence interface {
	// Append feeds tokens at the next positions (a prefill when len(tokens) > 1,
	// a decode step when 1) and returns the logits that predict the token after
	// the last one, of length VocabSize. The returned slice is owned by the
	// caller. On error the sequence must not be used again.
	Append(ctx context.Context, tokens []int) ([]float32, error)
	// Len is the number of tokens appended so far.
	Len() int
	// Close releases the sequence's state.
	Close() error
}

// Cloner is implemented by sequences that can copy their state (the CPU
// session; the GPU session, into a second session's device memory).
// Generate uses it for Options.Snapshot.
type Cloner interface {
	// CloneSequence returns an independent sequence in the same state:
	// appending to either leaves the other unchanged.
	CloneSequence() (Sequence, error)
}

// IntoAppender is implemented by sequences that can write a decode step's
// logits into the caller's buffer instead of a new one (the GPU session:
// a step's logits are half a megabyte, and a fresh slice each step costs
// page faults and garbage collection on the step's critical path).
// Generate uses it for decode steps when present.
type IntoAppender interface {
	// AppendInto is Append with the logits written into dst when
	// cap(dst) >= VocabSize (the result is then dst[:VocabSize]) and into
	// a new slice otherwise. The caller owns dst and the result.
	AppendInto(ctx context.Context, tokens []int, dst []float32) ([]float32, error)
}

// Reducer is implemented by sequences whose logits stay where they are
// computed (the GPU session): a decode step reduces them there for the
// sampler (see sample.ReduceSpec), and only the reduction, a few kilobytes,
// comes back. Generate uses it for decode steps when the sampler is a
// ReducingSampler whose spec allows it.
type Reducer interface {
	// AppendReduce is Append with the new logits reduced under spec
	// (spec.OK set) into dst (its slices reused) instead of returned.
	AppendReduce(ctx context.Context, tokens []int, spec sample.ReduceSpec, dst *sample.Reduction) error
	// LastLogits returns the logits of the last call, which must have been
	// AppendReduce, in dst when cap(dst) >= VocabSize (else a new slice).
	LastLogits(dst []float32) ([]float32, error)
	// DrawReduced makes the draw d describes where the logits are, after
	// an AppendReduce whose candidates did not fit in its reduction, and
	// returns the drawn id.
	DrawReduced(d sample.DeviceDraw) (int, error)
}

// Pipeliner is implemented by Reducers that can run greedy decode steps
// ahead of the caller (the GPU session): while Pipeline is on, a greedy
// AppendReduce of one token may also start the step for its own argmax
// before it returns, so the device computes while the caller handles the
// token, and an AppendReduce of exactly that token then only waits for the
// step (starting the one after it in turn). Any other call first waits for
// a step in flight and drops it, leaving the sequence as if it had never
// run; Len never counts it. LastLogits and DrawReduced may fail after a
// greedy AppendReduce while Pipeline is on (a greedy sampler needs
// neither). Generate uses it with a greedy sampler.
type Pipeliner interface {
	// Pipeline switches starting steps ahead on or off. Off starts no
	// more steps; a step already in flight stays until a call confirms or
	// drops it.
	Pipeline(on bool)
	// Settle waits for a step in flight, if any, and drops it.
	Settle() error
}

// ReducingSampler is a Sampler that can draw from a reduction of the
// logits (*sample.Sampler).
type ReducingSampler interface {
	Sampler
	// Reduce is the reduction the next draw may use; it must not change
	// between calls.
	Reduce() sample.ReduceSpec
	// SampleReduced draws from r, or returns full = true without drawing
	// when it needs the logits (Sample is then called with them).
	SampleReduced(r *sample.Reduction) (id int, full bool, err error)
	// PrepareDeviceDraw returns, for an incomplete r, the draw a Reducer
	// makes itself (consuming the step's draw), or ok false when only the
	// logits will do.
	PrepareDeviceDraw(r *sample.Reduction) (d sample.DeviceDraw, ok bool)
}

// Model creates sequences.
type Model interface {
	// NewSequence starts an empty sequence at position 0.
	NewSequence() (Sequence, error)
	// VocabSize is the length of every logits vector.
	VocabSize() int
	// MaxContext is the largest number of tokens a sequence may hold.
	MaxContext() int
}
