package main

import (
	"fmt"
	"io"
	"strings"

	"moxie/checkpoint"
	"moxie/internal/progress"
)

func runSynth(args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlags("synth", "PRESET --out DIR", `
Write a synthetic model as a real checkpoint directory in the shipped V4-Flash
layout: config.json (marked synthetic), model.safetensors.index.json, shards, and
for the tiny preset a byte-level tokenizer. PRESET is tiny or flash, optionally
with options: "flash?layers=2&experts=16&seed=1" (keys: seed, layers, experts,
topk, mtp). Every tensor is generated deterministically from the seed and its
name, so reading the directory back gives the bytes "synth:PRESET" generates.
The weights are random: the model's text is meaningless.`, stderr)
	out := fs.String("out", "", "output directory (must not exist)")
	shard := fs.String("shard-size", "4GiB", "largest shard size (e.g. 16MiB, 4GiB)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 || *out == "" {
		return usagef("want one PRESET and --out DIR (e.g. moxie synth tiny --out ./tiny)")
	}
	shardSize, err := parseBytes(*shard)
	if err != nil {
		return usagef("--shard-size: %v", err)
	}
	spec := fs.Arg(0)
	if !strings.HasPrefix(spec, checkpoint.SynthPrefix) {
		spec = checkpoint.SynthPrefix + spec
	}
	src, err := checkpoint.OpenSynth(spec)
	if err != nil {
		return err
	}
	aux, err := checkpoint.AuxFiles(src)
	if err != nil {
		return err
	}
	tensors := src.OutTensors()
	var total int64
	for _, ti := range src.Tensors() {
		total += ti.Size
	}
	fmt.Fprintf(stderr, "writing %s (synthetic, random weights) to %s: %d tensors, %s\n", src.Name(), *out, len(tensors), progress.FormatBytes(total))
	bar := progress.New(stderr, "synth", total, true)
	err = checkpoint.WriteDir(*out, aux, tensors, checkpoint.WriteOptions{
		ShardSize: shardSize,
		Metadata:  map[string]string{"format": "pt", checkpoint.SyntheticKey: src.Name()},
		Progress:  bar.Add,
	})
	bar.Done()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s: %d tensors, %s\n", *out, len(tensors), commas(total)+" bytes")
	return nil
}

// parseBytes reads a size such as "4GiB", "16MiB", "500MB" or "1024".
func parseBytes(s string) (int64, error) {
	units := []struct {
		suf string
		mul int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}}
	t := strings.TrimSpace(s)
	mul := int64(1)
	for _, u := range units {
		if strings.HasSuffix(t, u.suf) {
			t, mul = strings.TrimSpace(strings.TrimSuffix(t, u.suf)), u.mul
			break
		}
	}
	var v float64
	if _, err := fmt.Sscanf(t, "%g", &v); err != nil || v <= 0 || v*float64(mul) > 1<<62 {
		return 0, fmt.Errorf("%q is not a positive size like 16MiB or 4GiB", s)
	}
	return int64(v * float64(mul)), nil
}
