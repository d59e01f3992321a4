package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"moxie/checkpoint"
	"moxie/dsv4/config"
	"moxie/format"
	"moxie/internal/progress"
)

func runRepack(args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlags("repack", "SRC --out DST", `
Losslessly repack the FP8 dense weights of SRC from 128x128 E8M0 block scales to
MXFP8 (the same E4M3 bytes, one E8M0 scale per 32 values of a row) and write a new
checkpoint directory DST. Every value dequantizes exactly as before; a tensor that
would need rounding (a scale that is not a power of two, a NaN scale, a 32-group
that straddles two blocks) stops the repack with an error naming it. SRC is only
read; DST must not exist. All other tensors and files are copied byte for byte.`, stderr)
	out := fs.String("out", "", "output directory (must not exist)")
	shard := fs.String("shard-size", "4GiB", "largest shard size")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 || *out == "" {
		return usagef("want one SRC model and --out DST")
	}
	shardSize, err := parseBytes(*shard)
	if err != nil {
		return usagef("--shard-size: %v", err)
	}
	src, err := checkpoint.Open(fs.Arg(0))
	if err != nil {
		return err
	}
	defer src.Close()
	cfgJSON, err := src.File("config.json")
	if err != nil {
		return err
	}
	cfg, err := config.Parse(cfgJSON)
	if err != nil {
		return fmt.Errorf("%s: %w", src.Name(), err)
	}
	if cfg.DenseFormat != "fp8" {
		return fmt.Errorf("%s: dense weights are already %s; nothing to repack", src.Name(), cfg.DenseFormat)
	}
	plan, err := planRepack(src, cfg)
	if err != nil {
		return err
	}
	aux, err := checkpoint.AuxFiles(src)
	if err != nil {
		return err
	}
	aux["config.json"], err = setConfigKey(cfgJSON, config.DenseFormatKey, "mxfp8")
	if err != nil {
		return err
	}
	var total int64
	for _, t := range plan.tensors {
		total += tensorBytes(t.DType, t.Shape)
	}
	bar := progress.New(stderr, "repack", total, true)
	err = checkpoint.WriteDir(*out, aux, plan.tensors, checkpoint.WriteOptions{
		ShardSize: shardSize, Metadata: map[string]string{"format": "pt"}, Progress: bar.Add,
	})
	bar.Done()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "repacked %d FP8 weights to MXFP8 (E4M3 bytes unchanged):\n", len(plan.repacked))
	for _, n := range plan.repacked {
		fmt.Fprintf(stdout, "  %s\n", n)
	}
	fmt.Fprintf(stdout, "created %d MXFP8 scale tensors (replacing the 128x128 block scales of the same names):\n", len(plan.scales))
	for _, n := range plan.scales {
		fmt.Fprintf(stdout, "  %s\n", n)
	}
	fmt.Fprintf(stdout, "copied %d other tensors byte for byte; wrote %s\n", len(plan.tensors)-len(plan.repacked)-len(plan.scales), *out)
	return nil
}

type repackPlan struct {
	tensors  []checkpoint.OutTensor
	repacked []string
	scales   []string
}

func tensorBytes(dt format.DType, shape []int64) int64 {
	n := int64(dt.Size())
	for _, d := range shape {
		n *= d
	}
	return n
}

// planRepack decides, for every tensor of src, what DST holds. Every FP8 weight
// with a block-scale tensor is checked up front (RepackFP8BlockToMXFP8 on the
// stored bytes), so nothing is written when any tensor would need rounding.
func planRepack(src checkpoint.Source, cfg *config.Config) (*repackPlan, error) {
	p := &repackPlan{}
	newScale := map[string][]byte{}
	for _, ti := range src.Tensors() {
		if ti.DType != format.F8E4M3 || !strings.HasSuffix(ti.Name, ".weight") {
			continue
		}
		scaleName := strings.TrimSuffix(ti.Name, ".weight") + ".scale"
		si, ok := src.Lookup(scaleName)
		if !ok {
			return nil, fmt.Errorf("%s: FP8 weight %s has no scale tensor %s", src.Name(), ti.Name, scaleName)
		}
		if len(ti.Shape) != 2 {
			return nil, fmt.Errorf("%s: FP8 weight %s has shape %v, want 2 dimensions", src.Name(), ti.Name, ti.Shape)
		}
		q, err := src.TensorData(ti.Name)
		if err != nil {
			return nil, err
		}
		sc, err := src.TensorData(scaleName)
		if err != nil {
			return nil, err
		}
		mx, err := format.RepackFP8BlockToMXFP8(format.FP8BlockTensor{
			Name: ti.Name, Rows: int(ti.Shape[0]), Cols: int(ti.Shape[1]), Block: cfg.BlockSize,
			Q: q, Scale: sc, ScaleDType: si.DType,
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", src.Name(), err)
		}
		newScale[scaleName] = mx
		p.repacked = append(p.repacked, ti.Name)
		p.scales = append(p.scales, scaleName)
	}
	for _, ti := range src.Tensors() {
		ti := ti
		if mx, ok := newScale[ti.Name]; ok {
			w, _ := src.Lookup(strings.TrimSuffix(ti.Name, ".scale") + ".weight")
			p.tensors = append(p.tensors, checkpoint.OutTensor{Name: ti.Name, DType: format.F8E8M0,
				Shape: []int64{w.Shape[0], w.Shape[1] / 32}, Data: func() ([]byte, error) { return mx, nil }})
			continue
		}
		p.tensors = append(p.tensors, checkpoint.OutTensor{Name: ti.Name, DType: ti.DType, Shape: ti.Shape,
			Data: func() ([]byte, error) { return src.TensorData(ti.Name) }})
	}
	return p, nil
}

// setConfigKey returns config.json with key set to value, other keys unchanged.
func setConfigKey(cfgJSON []byte, key, value string) ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(cfgJSON, &m); err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	m[key] = value
	out, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}
