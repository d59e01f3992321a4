package server

import (
	"moxie/generate"
)

// DefaultSampler builds a sampler for p.
func DefaultSampler(p SamplingParams) (generate.Sampler, error) {
	if p.Temperature == 0 {
		return generate.Greedy{}, nil
	}
	return generate.Greedy{}, nil // TEMP until package sample lands
}
