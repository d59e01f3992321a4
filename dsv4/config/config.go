// Package config parses a DeepSeek-V4 model configuration (the hub config.json,
// or the reference code's inference/config.json key names), derives the per-layer
// schedule, and lists the exact tensor layout of a checkpoint with that
// configuration (names, dtypes, shapes and roles; dsv4-flash.md sections 2 and 5).
package config

import (
	"encoding/json"
	"fmt"
	"math"
)

// Config is a validated DeepSeek-V4 configuration. Sizes are element counts.
type Config struct {
	ModelType string // "deepseek_v4"

	VocabSize      int
	Dim            int // hidden size D
	NLayers        int // main stack, without MTP
	NHeads         int // query heads H
	HeadDim        int // head and KV width d
	RopeHeadDim    int // RoPE on the last RopeHeadDim dims of each head
	QLoraRank      int
	OGroups        int
	OLoraRank      int
	Window         int   // sliding window, including the current token
	CompressRatios []int // one per layer, then one per MTP layer; 0 window-only, 4 CSA, other >0 HCA

	RopeTheta         float64 // ratio-0 layers, no YaRN
	CompressRopeTheta float64 // ratio>0 layers, with YaRN
	RopeFactor        float64 // YaRN factor
	OriginalSeqLen    int     // YaRN original_max_position_embeddings
	BetaFast          float64
	BetaSlow          float64
	MaxPositions      int

	IndexNHeads  int
	IndexHeadDim int
	IndexTopK    int

	NRoutedExperts    int
	NActivatedExperts int
	NSharedExperts    int
	MoEInterDim       int
	NHashLayers       int
	ScoreFunc         string // "sqrtsoftplus"
	NormTopKProb      bool
	RouteScale        float64
	SwigluLimit       float64

	HCMult          int
	HCSinkhornIters int
	HCEps           float64
	NormEps         float64

	NMTPLayers int
	BOS, EOS   int

	// ExpertDType is "fp4" (MXFP4 routed experts, the shipped form) or "fp8"
	// (FP8 128x128 blocks like the dense weights).
	ExpertDType string
	// BlockSize is the FP8 weight block edge (128 for V4-Flash).
	BlockSize int
	// DenseFormat is how the FP8 (E4M3) dense weights are scaled: "fp8" (one
	// E8M0 scale per BlockSize x BlockSize block, as shipped) or "mxfp8" (one E8M0
	// scale per 32 consecutive values of a row, as written by moxie repack).
	DenseFormat string
}

// DenseFormatKey is the config.json key moxie writes for a repacked checkpoint.
const DenseFormatKey = "moxie_dense_format"

// LayerKind is the attention type of a layer.
type LayerKind int

const (
	Window LayerKind = iota // sliding window only (ratio 0)
	CSA                     // compressed sparse attention: overlapping ratio-4 compressor + indexer
	HCA                     // heavily compressed attention: non-overlapping compressor, all entries
)

func (k LayerKind) String() string {
	switch k {
	case Window:
		return "window"
	case CSA:
		return "csa"
	case HCA:
		return "hca"
	}
	return fmt.Sprintf("LayerKind(%d)", int(k))
}

// CSARatio is the compression ratio that makes a layer CSA (overlapping windows and
// a lightning indexer), as in DeepSeek's reference code. Any other positive ratio
// is HCA.
const CSARatio = 4

// Ratio is the compression ratio of layer i (0..NLayers-1 main, NLayers.. MTP).
func (c *Config) Ratio(i int) int { return c.CompressRatios[i] }

// Kind is the attention type of layer i.
func (c *Config) Kind(i int) LayerKind {
	switch r := c.CompressRatios[i]; {
	case r == 0:
		return Window
	case r == CSARatio:
		return CSA
	default:
		return HCA
	}
}

// HashRouted reports whether main layer i routes by the token-id table tid2eid.
// MTP layers are always score-routed.
func (c *Config) HashRouted(i int) bool { return i < c.NHashLayers && i < c.NLayers }

// HCDim is the width of the hyper-connection mixer output: (2+hc)·hc.
func (c *Config) HCDim() int { return (2 + c.HCMult) * c.HCMult }

// Parse reads a config.json in the hub form (hidden_size, num_hidden_layers, ...)
// or the reference inference form (dim, n_layers, ...) and validates it.
func Parse(data []byte) (*Config, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	g := getter{raw: raw}
	c := &Config{}
	c.ModelType = g.str("deepseek_v4", "model_type")
	c.VocabSize = g.int(-1, "vocab_size")
	c.Dim = g.int(-1, "hidden_size", "dim")
	c.NLayers = g.int(-1, "num_hidden_layers", "n_layers")
	c.NHeads = g.int(-1, "num_attention_heads", "n_heads")
	kvHeads := g.int(1, "num_key_value_heads")
	c.HeadDim = g.int(-1, "head_dim")
	c.RopeHeadDim = g.int(-1, "qk_rope_head_dim", "rope_head_dim")
	c.QLoraRank = g.int(-1, "q_lora_rank")
	c.OGroups = g.int(-1, "o_groups")
	c.OLoraRank = g.int(-1, "o_lora_rank")
	c.Window = g.int(-1, "sliding_window", "window_size")
	c.CompressRatios = g.ints("compress_ratios")
	c.RopeTheta = g.float(10000, "rope_theta")
	c.CompressRopeTheta = g.float(160000, "compress_rope_theta")
	c.MaxPositions = g.int(1048576, "max_position_embeddings", "max_seq_len")
	// YaRN: hub keeps it nested in rope_scaling; the inference form is flat.
	c.RopeFactor, c.OriginalSeqLen, c.BetaFast, c.BetaSlow = 1, 0, 32, 1
	if rs, ok := raw["rope_scaling"]; ok && string(rs) != "null" {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(rs, &m); err != nil {
			g.fail("rope_scaling", "an object", err)
		} else {
			sg := getter{raw: m, prefix: "rope_scaling."}
			if t := sg.str("yarn", "type", "rope_type"); t != "yarn" {
				g.errs = append(g.errs, fmt.Errorf("rope_scaling.type is %q, want \"yarn\"", t))
			}
			c.RopeFactor = sg.float(1, "factor")
			c.OriginalSeqLen = sg.int(0, "original_max_position_embeddings")
			c.BetaFast = sg.float(32, "beta_fast")
			c.BetaSlow = sg.float(1, "beta_slow")
			g.errs = append(g.errs, sg.errs...)
		}
	} else {
		c.RopeFactor = g.float(1, "rope_factor")
		c.OriginalSeqLen = g.int(0, "original_seq_len")
		c.BetaFast = g.float(32, "beta_fast")
		c.BetaSlow = g.float(1, "beta_slow")
	}
	c.IndexNHeads = g.int(-1, "index_n_heads")
	c.IndexHeadDim = g.int(-1, "index_head_dim")
	c.IndexTopK = g.int(-1, "index_topk")
	c.NRoutedExperts = g.int(-1, "n_routed_experts")
	c.NActivatedExperts = g.int(-1, "num_experts_per_tok", "n_activated_experts")
	c.NSharedExperts = g.int(1, "n_shared_experts")
	c.MoEInterDim = g.int(-1, "moe_intermediate_size", "moe_inter_dim")
	c.NHashLayers = g.int(0, "num_hash_layers", "n_hash_layers")
	c.ScoreFunc = g.str("sqrtsoftplus", "scoring_func", "score_func")
	c.NormTopKProb = g.bool(true, "norm_topk_prob")
	c.RouteScale = g.float(1, "routed_scaling_factor", "route_scale")
	c.SwigluLimit = g.float(0, "swiglu_limit")
	c.HCMult = g.int(4, "hc_mult")
	c.HCSinkhornIters = g.int(20, "hc_sinkhorn_iters")
	c.HCEps = g.float(1e-6, "hc_eps")
	c.NormEps = g.float(1e-6, "rms_norm_eps", "norm_eps")
	c.NMTPLayers = g.int(1, "num_nextn_predict_layers", "n_mtp_layers")
	c.BOS = g.int(0, "bos_token_id")
	c.EOS = g.int(1, "eos_token_id")
	c.ExpertDType = g.str("fp4", "expert_dtype")
	c.BlockSize = 128
	c.DenseFormat = g.str("fp8", DenseFormatKey)
	if qc, ok := raw["quantization_config"]; ok && string(qc) != "null" {
		var q struct {
			WeightBlockSize []int `json:"weight_block_size"`
		}
		if err := json.Unmarshal(qc, &q); err != nil {
			g.fail("quantization_config", "an object", err)
		} else if len(q.WeightBlockSize) > 0 {
			if len(q.WeightBlockSize) != 2 || q.WeightBlockSize[0] != q.WeightBlockSize[1] {
				g.errs = append(g.errs, fmt.Errorf("quantization_config.weight_block_size is %v, want two equal edges", q.WeightBlockSize))
			} else {
				c.BlockSize = q.WeightBlockSize[0]
			}
		}
	}
	if len(g.errs) > 0 {
		return nil, fmt.Errorf("config.json: %w", joinErrs(g.errs))
	}
	if kvHeads != 1 {
		return nil, fmt.Errorf("config.json: num_key_value_heads is %d, want 1 (DeepSeek-V4 shares one K=V vector)", kvHeads)
	}
	// A hub config may omit the MTP entries of compress_ratios; pad with window-only.
	for len(c.CompressRatios) < c.NLayers+c.NMTPLayers && len(c.CompressRatios) >= c.NLayers {
		c.CompressRatios = append(c.CompressRatios, 0)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	return c, nil
}

// Validate checks that the sizes are positive and consistent with each other.
func (c *Config) Validate() error {
	if c.ModelType != "deepseek_v4" {
		return fmt.Errorf("model_type is %q: moxie runs deepseek_v4 (DeepSeek-V4-Flash) only", c.ModelType)
	}
	pos := []struct {
		name string
		v    int
	}{
		{"vocab_size", c.VocabSize}, {"hidden_size", c.Dim}, {"num_hidden_layers", c.NLayers},
		{"num_attention_heads", c.NHeads}, {"head_dim", c.HeadDim}, {"qk_rope_head_dim", c.RopeHeadDim},
		{"q_lora_rank", c.QLoraRank}, {"o_groups", c.OGroups}, {"o_lora_rank", c.OLoraRank},
		{"sliding_window", c.Window}, {"n_routed_experts", c.NRoutedExperts},
		{"num_experts_per_tok", c.NActivatedExperts}, {"moe_intermediate_size", c.MoEInterDim},
		{"hc_mult", c.HCMult}, {"hc_sinkhorn_iters", c.HCSinkhornIters}, {"weight_block_size", c.BlockSize},
	}
	for _, p := range pos {
		if p.v <= 0 {
			return fmt.Errorf("%s is %d, want a positive value", p.name, p.v)
		}
	}
	switch {
	case c.NMTPLayers < 0:
		return fmt.Errorf("num_nextn_predict_layers is %d, want >= 0", c.NMTPLayers)
	case c.NSharedExperts < 0 || c.NSharedExperts > 1:
		return fmt.Errorf("n_shared_experts is %d, want 0 or 1", c.NSharedExperts)
	case c.NHashLayers < 0 || c.NHashLayers > c.NLayers:
		return fmt.Errorf("num_hash_layers is %d, want 0..%d", c.NHashLayers, c.NLayers)
	case len(c.CompressRatios) != c.NLayers+c.NMTPLayers:
		return fmt.Errorf("compress_ratios has %d entries, want %d (num_hidden_layers + num_nextn_predict_layers)", len(c.CompressRatios), c.NLayers+c.NMTPLayers)
	case c.RopeHeadDim%2 != 0 || c.RopeHeadDim > c.HeadDim:
		return fmt.Errorf("qk_rope_head_dim is %d, want an even value <= head_dim %d", c.RopeHeadDim, c.HeadDim)
	case c.NHeads%c.OGroups != 0:
		return fmt.Errorf("num_attention_heads %d is not a multiple of o_groups %d", c.NHeads, c.OGroups)
	case c.NActivatedExperts > c.NRoutedExperts:
		return fmt.Errorf("num_experts_per_tok %d exceeds n_routed_experts %d", c.NActivatedExperts, c.NRoutedExperts)
	case c.ScoreFunc != "sqrtsoftplus":
		return fmt.Errorf("scoring_func is %q, want \"sqrtsoftplus\"", c.ScoreFunc)
	case c.ExpertDType != "fp4" && c.ExpertDType != "fp8":
		return fmt.Errorf("expert_dtype is %q, want \"fp4\" or \"fp8\"", c.ExpertDType)
	case c.ExpertDType == "fp4" && (c.Dim%32 != 0 || c.MoEInterDim%32 != 0):
		return fmt.Errorf("MXFP4 experts need hidden_size %d and moe_intermediate_size %d to be multiples of 32", c.Dim, c.MoEInterDim)
	case c.DenseFormat != "fp8" && c.DenseFormat != "mxfp8":
		return fmt.Errorf("%s is %q, want \"fp8\" or \"mxfp8\"", DenseFormatKey, c.DenseFormat)
	case c.NormEps <= 0 || c.HCEps <= 0:
		return fmt.Errorf("rms_norm_eps %g and hc_eps %g must be positive", c.NormEps, c.HCEps)
	case c.RopeTheta <= 1 || c.CompressRopeTheta <= 1:
		return fmt.Errorf("rope_theta %g and compress_rope_theta %g must exceed 1", c.RopeTheta, c.CompressRopeTheta)
	case c.RopeFactor < 1:
		return fmt.Errorf("rope_scaling.factor is %g, want >= 1", c.RopeFactor)
	case c.RopeFactor > 1 && c.OriginalSeqLen <= 0:
		return fmt.Errorf("rope_scaling.original_max_position_embeddings is %d, want > 0 with YaRN factor %g", c.OriginalSeqLen, c.RopeFactor)
	case c.BOS < 0 || c.BOS >= c.VocabSize || c.EOS < 0 || c.EOS >= c.VocabSize:
		return fmt.Errorf("bos_token_id %d / eos_token_id %d outside the vocabulary of %d", c.BOS, c.EOS, c.VocabSize)
	}
	hasCSA := false
	for i, r := range c.CompressRatios {
		if r < 0 {
			return fmt.Errorf("compress_ratios[%d] is %d, want >= 0", i, r)
		}
		if i >= c.NLayers && r != 0 {
			return fmt.Errorf("compress_ratios[%d] (MTP layer) is %d, want 0", i, r)
		}
		if r == CSARatio {
			hasCSA = true
		}
	}
	if hasCSA {
		if c.IndexNHeads <= 0 || c.IndexHeadDim <= 0 || c.IndexTopK <= 0 {
			return fmt.Errorf("CSA layers need index_n_heads, index_head_dim and index_topk > 0 (have %d, %d, %d)", c.IndexNHeads, c.IndexHeadDim, c.IndexTopK)
		}
		if c.IndexHeadDim&(c.IndexHeadDim-1) != 0 || c.IndexHeadDim < c.RopeHeadDim {
			return fmt.Errorf("index_head_dim %d must be a power of two (Hadamard) and >= qk_rope_head_dim %d", c.IndexHeadDim, c.RopeHeadDim)
		}
	}
	return nil
}

type getter struct {
	raw    map[string]json.RawMessage
	prefix string
	errs   []error
}

func (g *getter) find(keys []string) (string, json.RawMessage, bool) {
	for _, k := range keys {
		if v, ok := g.raw[k]; ok && string(v) != "null" {
			return k, v, true
		}
	}
	return "", nil, false
}

func (g *getter) fail(key, want string, err error) {
	g.errs = append(g.errs, fmt.Errorf("%s%s: want %s (%v)", g.prefix, key, want, err))
}

func (g *getter) missing(keys []string) {
	g.errs = append(g.errs, fmt.Errorf("%s%s is missing", g.prefix, keys[0]))
}

func (g *getter) int(def int, keys ...string) int {
	k, v, ok := g.find(keys)
	if !ok {
		if def < 0 {
			g.missing(keys)
		}
		return def
	}
	var f float64
	if err := json.Unmarshal(v, &f); err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<40 {
		g.fail(k, "an integer", err)
		return 0
	}
	return int(f)
}

func (g *getter) float(def float64, keys ...string) float64 {
	k, v, ok := g.find(keys)
	if !ok {
		return def
	}
	var f float64
	if err := json.Unmarshal(v, &f); err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		g.fail(k, "a number", err)
		return 0
	}
	return f
}

func (g *getter) str(def string, keys ...string) string {
	k, v, ok := g.find(keys)
	if !ok {
		return def
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		g.fail(k, "a string", err)
	}
	return s
}

func (g *getter) bool(def bool, keys ...string) bool {
	k, v, ok := g.find(keys)
	if !ok {
		return def
	}
	var b bool
	if err := json.Unmarshal(v, &b); err != nil {
		g.fail(k, "true or false", err)
	}
	return b
}

func (g *getter) ints(keys ...string) []int {
	k, v, ok := g.find(keys)
	if !ok {
		g.missing(keys)
		return nil
	}
	var s []int
	if err := json.Unmarshal(v, &s); err != nil {
		g.fail(k, "an array of integers", err)
	}
	return s
}

func joinErrs(errs []error) error {
	if len(errs) == 1 {
		return errs[0]
	}
	msg := errs[0].Error()
	for _, e := range errs[1:] {
		msg += "; " + e.Error()
	}
	return fmt.Errorf("%s", msg)
}
