package main

import (
	"fmt"
	"io"

	"moxie/checkpoint"
	"moxie/internal/progress"
)

func runImportHF(args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlags("import-hf", "SRC --out DIR", `
Convert a transformers DeepseekV4ForCausalLM checkpoint into the shipped
DeepSeek-V4 layout. SRC is a directory with the transformers config.json (the
full form, e.g. config.to_json_file(path, use_diff=False)) and safetensors
holding the model's state dict under its transformers names, in F32, BF16 or
F16. The output has a hub-form config.json, FP8 E4M3 weights in 128x128 blocks
with E8M0 scales, MXFP4 routed experts, BF16 and F32 tensors where DeepSeek
ships them, tid2eid as I64, no MTP block, and SRC's tokenizer.json and
tokenizer_config.json when present. Every missing, unmapped or mis-shaped
tensor, and every NaN or infinity, is an error naming it.`, stderr)
	out := fs.String("out", "", "output directory (must not exist)")
	shard := fs.String("shard-size", "16MiB", "largest shard size (e.g. 16MiB, 4GiB)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 || *out == "" {
		return usagef("want one SRC directory and --out DIR (e.g. moxie import-hf ./hf --out ./model)")
	}
	shardSize, err := parseBytes(*shard)
	if err != nil {
		return usagef("--shard-size: %v", err)
	}
	src, err := checkpoint.OpenDir(fs.Arg(0))
	if err != nil {
		return err
	}
	defer src.Close()
	conv, err := checkpoint.ConvertHF(src)
	if err != nil {
		return err
	}
	var total int64
	for _, t := range conv.Tensors {
		n := int64(t.DType.Size())
		for _, d := range t.Shape {
			n *= d
		}
		total += n
	}
	c := conv.Config
	fmt.Fprintf(stderr, "converting %s to %s: %d layers, ratios %v, %d hash layers, %d experts (top %d), %d tensors, %s\n",
		fs.Arg(0), *out, c.NLayers, c.CompressRatios, c.NHashLayers, c.NRoutedExperts, c.NActivatedExperts,
		len(conv.Tensors), progress.FormatBytes(total))
	bar := progress.New(stderr, "import-hf", total, true)
	err = checkpoint.WriteDir(*out, conv.Aux, conv.Tensors, checkpoint.WriteOptions{
		ShardSize: shardSize,
		Metadata:  map[string]string{"format": "pt"},
		Progress:  bar.Add,
	})
	bar.Done()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s: %d tensors, %s\n", *out, len(conv.Tensors), commas(total)+" bytes")
	return nil
}
