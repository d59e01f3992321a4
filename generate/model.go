// Package generate runs the decode loop: it feeds a prompt to a model sequence,
// samples tokens, detokenizes them as they come, and stops on stop tokens, stop
// strings, a token limit or cancellation, reporting per-request statistics.
package generate

import "context"

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
// session; a GPU session would need a second copy of its device memory).
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

// Model creates sequences.
type Model interface {
	// NewSequence starts an empty sequence at position 0.
	NewSequence() (Sequence, error)
	// VocabSize is the length of every logits vector.
	VocabSize() int
	// MaxContext is the largest number of tokens a sequence may hold.
	MaxContext() int
}
