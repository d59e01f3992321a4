package config

import "encoding/json"

// Flash returns the exact DeepSeek-V4-Flash configuration (dsv4-flash.md §2.1).
func Flash() *Config {
	ratios := []int{0, 0}
	for range 20 {
		ratios = append(ratios, 4, 128)
	}
	ratios = append(ratios, 4, 0) // layer 42, then the MTP block
	return &Config{
		ModelType: "deepseek_v4", VocabSize: 129280, Dim: 4096, NLayers: 43, NHeads: 64,
		HeadDim: 512, RopeHeadDim: 64, QLoraRank: 1024, OGroups: 8, OLoraRank: 1024,
		Window: 128, CompressRatios: ratios,
		RopeTheta: 10000, CompressRopeTheta: 160000, RopeFactor: 16, OriginalSeqLen: 65536,
		BetaFast: 32, BetaSlow: 1, MaxPositions: 1048576,
		IndexNHeads: 64, IndexHeadDim: 128, IndexTopK: 512,
		NRoutedExperts: 256, NActivatedExperts: 6, NSharedExperts: 1, MoEInterDim: 2048,
		NHashLayers: 3, ScoreFunc: "sqrtsoftplus", NormTopKProb: true, RouteScale: 1.5,
		SwigluLimit: 10, HCMult: 4, HCSinkhornIters: 20, HCEps: 1e-6, NormEps: 1e-6,
		NMTPLayers: 1, BOS: 0, EOS: 1, ExpertDType: "fp4", BlockSize: 128, DenseFormat: "fp8",
	}
}

// TinyVocab is the vocabulary size of the tiny preset: 3 control tokens, 256
// byte tokens, the chat special tokens, and placeholders up to a round size.
const TinyVocab = 288

// Tiny returns the small configuration used by tests and the built-in demo. It has
// every V4 block type: window-only (layer 0), CSA (layers 1 and 3, ratio 4, 16
// indexer heads, top-4), HCA (layer 2, ratio 8 so that short prompts close several
// windows), hash routing (layers 0 and 1), four hyper-connection streams, routed
// experts with the SwiGLU clamp, a shared expert, and one MTP block. Widths cross
// the 128-element FP8 block edge so that partial blocks are exercised.
func Tiny() *Config {
	return &Config{
		ModelType: "deepseek_v4", VocabSize: TinyVocab, Dim: 160, NLayers: 4, NHeads: 4,
		HeadDim: 48, RopeHeadDim: 16, QLoraRank: 96, OGroups: 2, OLoraRank: 48,
		Window: 8, CompressRatios: []int{0, 4, 8, 4, 0},
		RopeTheta: 10000, CompressRopeTheta: 160000, RopeFactor: 16, OriginalSeqLen: 64,
		BetaFast: 32, BetaSlow: 1, MaxPositions: 4096,
		IndexNHeads: 16, IndexHeadDim: 32, IndexTopK: 4,
		NRoutedExperts: 8, NActivatedExperts: 2, NSharedExperts: 1, MoEInterDim: 64,
		NHashLayers: 2, ScoreFunc: "sqrtsoftplus", NormTopKProb: true, RouteScale: 1.5,
		SwigluLimit: 10, HCMult: 4, HCSinkhornIters: 20, HCEps: 1e-6, NormEps: 1e-6,
		NMTPLayers: 1, BOS: 0, EOS: 1, ExpertDType: "fp4", BlockSize: 128, DenseFormat: "fp8",
	}
}

// HubJSON renders c as a hub-form config.json (the keys DeepSeek ships), plus
// expert_dtype, which the hub file lacks but the reference's inference config has.
func (c *Config) HubJSON() []byte {
	m := map[string]any{
		"architectures":            []string{"DeepseekV4ForCausalLM"},
		"model_type":               c.ModelType,
		"vocab_size":               c.VocabSize,
		"hidden_size":              c.Dim,
		"num_hidden_layers":        c.NLayers,
		"num_attention_heads":      c.NHeads,
		"num_key_value_heads":      1,
		"head_dim":                 c.HeadDim,
		"qk_rope_head_dim":         c.RopeHeadDim,
		"q_lora_rank":              c.QLoraRank,
		"o_groups":                 c.OGroups,
		"o_lora_rank":              c.OLoraRank,
		"sliding_window":           c.Window,
		"compress_ratios":          c.CompressRatios,
		"compress_rope_theta":      c.CompressRopeTheta,
		"rope_theta":               c.RopeTheta,
		"max_position_embeddings":  c.MaxPositions,
		"index_n_heads":            c.IndexNHeads,
		"index_head_dim":           c.IndexHeadDim,
		"index_topk":               c.IndexTopK,
		"n_routed_experts":         c.NRoutedExperts,
		"num_experts_per_tok":      c.NActivatedExperts,
		"n_shared_experts":         c.NSharedExperts,
		"moe_intermediate_size":    c.MoEInterDim,
		"num_hash_layers":          c.NHashLayers,
		"scoring_func":             c.ScoreFunc,
		"topk_method":              "noaux_tc",
		"norm_topk_prob":           c.NormTopKProb,
		"routed_scaling_factor":    c.RouteScale,
		"swiglu_limit":             c.SwigluLimit,
		"hc_mult":                  c.HCMult,
		"hc_sinkhorn_iters":        c.HCSinkhornIters,
		"hc_eps":                   c.HCEps,
		"rms_norm_eps":             c.NormEps,
		"num_nextn_predict_layers": c.NMTPLayers,
		"hidden_act":               "silu",
		"attention_bias":           false,
		"tie_word_embeddings":      false,
		"bos_token_id":             c.BOS,
		"eos_token_id":             c.EOS,
		"torch_dtype":              "bfloat16",
		"expert_dtype":             c.ExpertDType,
		"quantization_config": map[string]any{
			"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
			"weight_block_size": []int{c.BlockSize, c.BlockSize}, "activation_scheme": "dynamic",
		},
	}
	if c.DenseFormat != "fp8" {
		m[DenseFormatKey] = c.DenseFormat
	}
	if c.RopeFactor > 1 {
		m["rope_scaling"] = map[string]any{
			"type": "yarn", "factor": c.RopeFactor, "original_max_position_embeddings": c.OriginalSeqLen,
			"beta_fast": c.BetaFast, "beta_slow": c.BetaSlow,
		}
	}
	out, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		panic(err) // only plain values above; cannot fail
	}
	return append(out, '\n')
}
