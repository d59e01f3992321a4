package main

import (
	"fmt"
	"io"
	"strconv"
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

// byteUnits are parseBytes's suffixes, matched without regard to case,
// longer ones first where one ends another.
var byteUnits = []struct {
	suf string
	mul int64
}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}}

// parseBytes reads a size such as "4GiB", "16MiB", "500MB", "1.5 TB" or
// "1024" (bytes): a decimal number and an optional unit (KiB, MiB, GiB,
// TiB, KB, MB, GB, TB, B; any case). The whole string must be that: "80gib"
// is 80 GiB, "12GiBs" and "4x" are errors. The size is rounded down to
// whole bytes and must come to 1 byte or more and at most 2^62.
func parseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mul := int64(1)
	for _, u := range byteUnits {
		if n := len(t) - len(u.suf); n >= 0 && strings.EqualFold(t[n:], u.suf) {
			t, mul = strings.TrimSpace(t[:n]), u.mul
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || strings.ContainsAny(t, "xXpP_") { // decimal only: no hex floats or digit separators
		return 0, fmt.Errorf("%q is not a size like 16MiB, 4GiB or 1024 (bytes)", s)
	}
	b := v * float64(mul)
	if !(b >= 1) || b > 1<<62 { // NaN fails the first test
		return 0, fmt.Errorf("%q: a size must be at least 1 byte and at most 4 EiB", s)
	}
	return int64(b), nil
}
