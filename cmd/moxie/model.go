package main

import (
	"fmt"
	"io"

	"moxie/checkpoint"
	"moxie/dsv4"
)

// loadedModel is a model with the source it reads from; Close releases both.
type loadedModel struct {
	src checkpoint.Source
	m   *dsv4.Model
}

func (l *loadedModel) Close() error { return l.src.Close() }

// loadModel opens spec (a directory or synth:...) and binds the model. It tells
// the user on stderr when the weights are synthetic.
func loadModel(spec string, opts dsv4.Options, stderr io.Writer) (*loadedModel, error) {
	src, err := checkpoint.Open(spec)
	if err != nil {
		return nil, err
	}
	if src.Synthetic() {
		fmt.Fprintf(stderr, "note: %s is a synthetic model with random weights; its output is meaningless.\n", src.Name())
	}
	m, err := dsv4.Load(src, opts)
	if err != nil {
		src.Close()
		return nil, err
	}
	return &loadedModel{src: src, m: m}, nil
}
