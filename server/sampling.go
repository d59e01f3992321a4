package server

import (
	"crypto/rand"
	"encoding/binary"

	"moxie/generate"
	"moxie/sample"
)

// DefaultSampler builds a package sample sampler for p. Without a seed it
// draws one from crypto/rand, so unseeded requests differ.
func DefaultSampler(p SamplingParams) (generate.Sampler, error) {
	seed := uint64(p.Seed)
	if !p.Seeded {
		var b [8]byte
		_, _ = rand.Read(b[:])
		seed = binary.LittleEndian.Uint64(b[:])
	}
	return sample.New(sample.Params{
		Temperature:       p.Temperature,
		TopK:              p.TopK,
		TopP:              p.TopP,
		MinP:              p.MinP,
		RepetitionPenalty: p.RepetitionPenalty,
		Seed:              seed,
	})
}
