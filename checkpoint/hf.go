package checkpoint

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"moxie/dsv4/config"
	"moxie/format"
)

// This file converts between the shipped DeepSeek-V4 layout and a transformers
// DeepseekV4ForCausalLM state dict (dsv4-flash.md §0c). The name pairs are the
// ones reference/oracle.py loads into transformers 5.17.0 with strict=True;
// hf_test.go checks them against the mapping that oracle run recorded.

// hfLayerRules maps a per-layer checkpoint suffix (after "layers.{i}.") to the
// transformers suffix (after "model.layers.{i}."). Routed experts are stacked
// and handled apart.
var hfLayerRules = [][2]string{
	{"attn_norm.weight", "input_layernorm.weight"},
	{"ffn_norm.weight", "post_attention_layernorm.weight"},
	{"hc_attn_fn", "attn_hc.fn"},
	{"hc_attn_base", "attn_hc.base"},
	{"hc_attn_scale", "attn_hc.scale"},
	{"hc_ffn_fn", "ffn_hc.fn"},
	{"hc_ffn_base", "ffn_hc.base"},
	{"hc_ffn_scale", "ffn_hc.scale"},
	{"attn.attn_sink", "self_attn.sinks"},
	{"attn.wq_a.weight", "self_attn.q_a_proj.weight"},
	{"attn.q_norm.weight", "self_attn.q_a_norm.weight"},
	{"attn.wq_b.weight", "self_attn.q_b_proj.weight"},
	{"attn.wkv.weight", "self_attn.kv_proj.weight"},
	{"attn.kv_norm.weight", "self_attn.kv_norm.weight"},
	{"attn.wo_a.weight", "self_attn.o_a_proj.weight"},
	{"attn.wo_b.weight", "self_attn.o_b_proj.weight"},
	{"attn.compressor.wkv.weight", "self_attn.compressor.kv_proj.weight"},
	{"attn.compressor.wgate.weight", "self_attn.compressor.gate_proj.weight"},
	{"attn.compressor.ape", "self_attn.compressor.position_bias"},
	{"attn.compressor.norm.weight", "self_attn.compressor.kv_norm.weight"},
	{"attn.indexer.wq_b.weight", "self_attn.compressor.indexer.q_b_proj.weight"},
	{"attn.indexer.weights_proj.weight", "self_attn.compressor.indexer.scorer.weights_proj.weight"},
	{"attn.indexer.compressor.wkv.weight", "self_attn.compressor.indexer.kv_proj.weight"},
	{"attn.indexer.compressor.wgate.weight", "self_attn.compressor.indexer.gate_proj.weight"},
	{"attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias"},
	{"attn.indexer.compressor.norm.weight", "self_attn.compressor.indexer.kv_norm.weight"},
	{"ffn.gate.weight", "mlp.gate.weight"},
	{"ffn.gate.bias", "mlp.gate.e_score_correction_bias"},
	{"ffn.gate.tid2eid", "mlp.gate.tid2eid"},
	{"ffn.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"},
	{"ffn.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"},
	{"ffn.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"},
}

// hfGlobalRules maps the global checkpoint tensors to transformers names.
var hfGlobalRules = [][2]string{
	{"embed.weight", "model.embed_tokens.weight"},
	{"head.weight", "lm_head.weight"},
	{"norm.weight", "model.norm.weight"},
	{"hc_head_fn", "model.hc_head.hc_fn"},
	{"hc_head_base", "model.hc_head.hc_base"},
	{"hc_head_scale", "model.hc_head.hc_scale"},
}

var (
	hfLayerRE  = regexp.MustCompile(`^layers\.(\d+)\.(.+)$`)
	hfExpertRE = regexp.MustCompile(`^layers\.(\d+)\.ffn\.experts\.(\d+)\.(w1|w2|w3)\.weight$`)
)

// HFPart says which part of a transformers tensor holds a checkpoint tensor.
type HFPart int

const (
	HFWhole    HFPart = iota // the whole tensor
	HFGateHalf               // gate_up_proj[e, :I, :] (checkpoint w1)
	HFUpHalf                 // gate_up_proj[e, I:, :] (checkpoint w3)
	HFExpert                 // down_proj[e] (checkpoint w2)
)

// HFRef locates a checkpoint tensor in a transformers DeepseekV4ForCausalLM
// state dict: the parameter Name, and for routed experts the Expert index and
// the Part of the stacked tensor (Expert is -1 otherwise).
type HFRef struct {
	Name   string
	Expert int
	Part   HFPart
}

// HFTensorFor returns where the transformers state dict holds the checkpoint
// weight name (main layers and globals; scales, mtp.* and unknown names have no
// counterpart and give ok=false).
func HFTensorFor(name string) (ref HFRef, ok bool) {
	for _, r := range hfGlobalRules {
		if r[0] == name {
			return HFRef{Name: r[1], Expert: -1}, true
		}
	}
	if m := hfExpertRE.FindStringSubmatch(name); m != nil {
		e, err := strconv.Atoi(m[2])
		if err != nil {
			return HFRef{}, false
		}
		p := "model.layers." + m[1] + ".mlp.experts."
		switch m[3] {
		case "w1":
			return HFRef{Name: p + "gate_up_proj", Expert: e, Part: HFGateHalf}, true
		case "w3":
			return HFRef{Name: p + "gate_up_proj", Expert: e, Part: HFUpHalf}, true
		default:
			return HFRef{Name: p + "down_proj", Expert: e, Part: HFExpert}, true
		}
	}
	if m := hfLayerRE.FindStringSubmatch(name); m != nil {
		for _, r := range hfLayerRules {
			if r[0] == m[2] {
				return HFRef{Name: "model.layers." + m[1] + "." + r[1], Expert: -1}, true
			}
		}
	}
	return HFRef{}, false
}

// ---------------------------------------------------------------------------
// config
// ---------------------------------------------------------------------------

// hfConfigJSON holds the DeepseekV4Config fields moxie reads. Pointers tell a
// missing field from a zero one.
type hfConfigJSON struct {
	ModelType             *string           `json:"model_type"`
	VocabSize             *int              `json:"vocab_size"`
	HiddenSize            *int              `json:"hidden_size"`
	NumHiddenLayers       *int              `json:"num_hidden_layers"`
	NumAttentionHeads     *int              `json:"num_attention_heads"`
	NumKeyValueHeads      *int              `json:"num_key_value_heads"`
	HeadDim               *int              `json:"head_dim"`
	QKRopeHeadDim         *int              `json:"qk_rope_head_dim"`
	PartialRotaryFactor   *float64          `json:"partial_rotary_factor"`
	QLoraRank             *int              `json:"q_lora_rank"`
	OGroups               *int              `json:"o_groups"`
	OLoraRank             *int              `json:"o_lora_rank"`
	SlidingWindow         *int              `json:"sliding_window"`
	LayerTypes            []string          `json:"layer_types"`
	MLPLayerTypes         []string          `json:"mlp_layer_types"`
	CompressRates         map[string]int    `json:"compress_rates"`
	CompressRatios        []int             `json:"compress_ratios"`
	CompressRateCSA       *int              `json:"compress_rate_csa"`
	CompressRateHCA       *int              `json:"compress_rate_hca"`
	NumHashLayers         *int              `json:"num_hash_layers"`
	RopeTheta             *float64          `json:"rope_theta"`
	CompressRopeTheta     *float64          `json:"compress_rope_theta"`
	RopeParameters        map[string]hfRope `json:"rope_parameters"`
	RopeScaling           *hfRope           `json:"rope_scaling"`
	MaxPositionEmbeddings *int              `json:"max_position_embeddings"`
	IndexNHeads           *int              `json:"index_n_heads"`
	IndexHeadDim          *int              `json:"index_head_dim"`
	IndexTopK             *int              `json:"index_topk"`
	NRoutedExperts        *int              `json:"n_routed_experts"`
	NumExpertsPerTok      *int              `json:"num_experts_per_tok"`
	NSharedExperts        *int              `json:"n_shared_experts"`
	MoEIntermediateSize   *int              `json:"moe_intermediate_size"`
	ScoringFunc           *string           `json:"scoring_func"`
	NormTopKProb          *bool             `json:"norm_topk_prob"`
	RoutedScalingFactor   *float64          `json:"routed_scaling_factor"`
	SwigluLimit           *float64          `json:"swiglu_limit"`
	HCMult                *int              `json:"hc_mult"`
	HCSinkhornIters       *int              `json:"hc_sinkhorn_iters"`
	HCEps                 *float64          `json:"hc_eps"`
	RMSNormEps            *float64          `json:"rms_norm_eps"`
	HiddenAct             *string           `json:"hidden_act"`
	BOS                   json.RawMessage   `json:"bos_token_id"`
	EOS                   json.RawMessage   `json:"eos_token_id"`
	TieWordEmbeddings     *bool             `json:"tie_word_embeddings"`
}

// hfRope is one RoPE parameter set (rope_parameters.main / .compress, or the
// legacy rope_scaling).
type hfRope struct {
	RopeType            string   `json:"rope_type"`
	Type                string   `json:"type"`
	RopeTheta           *float64 `json:"rope_theta"`
	PartialRotaryFactor *float64 `json:"partial_rotary_factor"`
	Factor              *float64 `json:"factor"`
	OriginalMaxPos      *int     `json:"original_max_position_embeddings"`
	BetaFast            *float64 `json:"beta_fast"`
	BetaSlow            *float64 `json:"beta_slow"`
	AttentionFactor     *float64 `json:"attention_factor"`
}

func (r *hfRope) kind() string {
	if r.RopeType != "" {
		return r.RopeType
	}
	if r.Type != "" {
		return r.Type
	}
	return "default"
}

// ConfigFromHF translates a transformers DeepseekV4Config config.json (the
// full form, as written by to_json_file(use_diff=False); both the layer_types /
// compress_rates / rope_parameters keys of transformers 5.x and the legacy
// compress_ratios / num_hash_layers / qk_rope_head_dim / rope_scaling keys are
// read) into a moxie Config in the shipped form: MXFP4 routed experts, FP8
// 128x128 dense blocks and no MTP block (transformers does not hold one).
// Every field that changes the numerics is required; a missing or inconsistent
// one is an error naming it.
func ConfigFromHF(data []byte) (*config.Config, error) {
	var h hfConfigJSON
	if err := json.Unmarshal(data, &h); err != nil {
		return nil, fmt.Errorf("HF config.json: %w", err)
	}
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	req := func(name string, p *int) int {
		if p == nil {
			fail("%s is missing", name)
			return 0
		}
		return *p
	}
	reqF := func(name string, p *float64) float64 {
		if p == nil {
			fail("%s is missing", name)
			return 0
		}
		return *p
	}
	c := &config.Config{ModelType: "deepseek_v4", ExpertDType: "fp4", BlockSize: 128, DenseFormat: "fp8",
		ScoreFunc: "sqrtsoftplus", NormTopKProb: true, NSharedExperts: 1}
	if h.ModelType == nil || *h.ModelType != "deepseek_v4" {
		got := "missing"
		if h.ModelType != nil {
			got = strconv.Quote(*h.ModelType)
		}
		fail("model_type is %s, want \"deepseek_v4\"", got)
	}
	c.VocabSize = req("vocab_size", h.VocabSize)
	c.Dim = req("hidden_size", h.HiddenSize)
	c.NLayers = req("num_hidden_layers", h.NumHiddenLayers)
	c.NHeads = req("num_attention_heads", h.NumAttentionHeads)
	if h.NumKeyValueHeads != nil && *h.NumKeyValueHeads != 1 {
		fail("num_key_value_heads is %d, want 1", *h.NumKeyValueHeads)
	}
	c.HeadDim = req("head_dim", h.HeadDim)
	c.QLoraRank = req("q_lora_rank", h.QLoraRank)
	c.OGroups = req("o_groups", h.OGroups)
	c.OLoraRank = req("o_lora_rank", h.OLoraRank)
	c.Window = req("sliding_window", h.SlidingWindow)
	c.IndexNHeads = req("index_n_heads", h.IndexNHeads)
	c.IndexHeadDim = req("index_head_dim", h.IndexHeadDim)
	c.IndexTopK = req("index_topk", h.IndexTopK)
	c.NRoutedExperts = req("n_routed_experts", h.NRoutedExperts)
	c.NActivatedExperts = req("num_experts_per_tok", h.NumExpertsPerTok)
	c.MoEInterDim = req("moe_intermediate_size", h.MoEIntermediateSize)
	c.NSharedExperts = req("n_shared_experts", h.NSharedExperts)
	c.MaxPositions = req("max_position_embeddings", h.MaxPositionEmbeddings)
	c.RouteScale = reqF("routed_scaling_factor", h.RoutedScalingFactor)
	c.SwigluLimit = reqF("swiglu_limit", h.SwigluLimit)
	c.HCMult = req("hc_mult", h.HCMult)
	c.HCSinkhornIters = req("hc_sinkhorn_iters", h.HCSinkhornIters)
	c.HCEps = reqF("hc_eps", h.HCEps)
	c.NormEps = reqF("rms_norm_eps", h.RMSNormEps)
	if h.ScoringFunc == nil {
		fail("scoring_func is missing")
	} else {
		c.ScoreFunc = *h.ScoringFunc
	}
	if h.NormTopKProb == nil {
		fail("norm_topk_prob is missing")
	} else {
		c.NormTopKProb = *h.NormTopKProb
	}
	if h.HiddenAct != nil && *h.HiddenAct != "silu" {
		fail("hidden_act is %q, want \"silu\"", *h.HiddenAct)
	}
	var err error
	if c.BOS, err = hfTokenID(h.BOS, 0); err != nil {
		fail("bos_token_id: %v", err)
	}
	if c.EOS, err = hfTokenID(h.EOS, 1); err != nil {
		fail("eos_token_id: %v", err)
	}

	// Per-layer attention kinds and compression ratios.
	n := c.NLayers
	switch {
	case h.LayerTypes != nil:
		if len(h.LayerTypes) != n {
			fail("layer_types has %d entries, want num_hidden_layers = %d", len(h.LayerTypes), n)
			break
		}
		rate := func(kind string, legacy *int, def int) int {
			if r, ok := h.CompressRates[kind]; ok {
				return r
			}
			if legacy != nil {
				return *legacy
			}
			return def
		}
		csa := rate("compressed_sparse_attention", h.CompressRateCSA, config.CSARatio)
		hca := rate("heavily_compressed_attention", h.CompressRateHCA, -1)
		if csa != config.CSARatio {
			fail("compress_rates.compressed_sparse_attention is %d, want %d", csa, config.CSARatio)
		}
		for i, t := range h.LayerTypes {
			switch t {
			case "sliding_attention":
				c.CompressRatios = append(c.CompressRatios, 0)
			case "compressed_sparse_attention":
				c.CompressRatios = append(c.CompressRatios, csa)
			case "heavily_compressed_attention":
				if hca <= 0 || hca == config.CSARatio {
					fail("layer_types[%d] is heavily_compressed_attention but the HCA rate is %d (compress_rates.heavily_compressed_attention, want > 0 and != %d)", i, hca, config.CSARatio)
				}
				c.CompressRatios = append(c.CompressRatios, hca)
			default:
				fail("layer_types[%d] is %q, want sliding_attention, compressed_sparse_attention or heavily_compressed_attention", i, t)
			}
		}
	case h.CompressRatios != nil:
		if len(h.CompressRatios) < n {
			fail("compress_ratios has %d entries, want at least num_hidden_layers = %d", len(h.CompressRatios), n)
			break
		}
		c.CompressRatios = append([]int(nil), h.CompressRatios[:n]...)
		for i, r := range c.CompressRatios {
			if r < 0 {
				fail("compress_ratios[%d] is %d, want >= 0", i, r)
			}
		}
	default:
		fail("neither layer_types nor compress_ratios is present")
	}

	// Hash-routed layers: a prefix of the stack.
	switch {
	case h.MLPLayerTypes != nil:
		if len(h.MLPLayerTypes) != n {
			fail("mlp_layer_types has %d entries, want num_hidden_layers = %d", len(h.MLPLayerTypes), n)
			break
		}
		for i, t := range h.MLPLayerTypes {
			switch {
			case t == "hash_moe" && i == c.NHashLayers:
				c.NHashLayers++
			case t == "hash_moe":
				fail("mlp_layer_types[%d] is hash_moe after a moe layer; moxie needs the hash-routed layers first", i)
			case t != "moe":
				fail("mlp_layer_types[%d] is %q, want hash_moe or moe", i, t)
			}
		}
	case h.NumHashLayers != nil:
		c.NHashLayers = *h.NumHashLayers
	default:
		fail("neither mlp_layer_types nor num_hash_layers is present")
	}

	// RoPE: plain on window layers, optionally YaRN on compressed ones.
	main, hasMain := h.RopeParameters["main"]
	comp, hasComp := h.RopeParameters["compress"]
	switch {
	case hasMain && main.RopeTheta != nil:
		c.RopeTheta = *main.RopeTheta
	case h.RopeTheta != nil:
		c.RopeTheta = *h.RopeTheta
	default:
		fail("rope_theta is missing (neither rope_parameters.main.rope_theta nor rope_theta)")
	}
	if hasMain && main.kind() != "default" {
		fail("rope_parameters.main.rope_type is %q, want \"default\"", main.kind())
	}
	switch {
	case hasComp && comp.RopeTheta != nil:
		c.CompressRopeTheta = *comp.RopeTheta
	case h.CompressRopeTheta != nil:
		c.CompressRopeTheta = *h.CompressRopeTheta
	default:
		fail("compress_rope_theta is missing (neither rope_parameters.compress.rope_theta nor compress_rope_theta)")
	}
	yarn, yarnPath := (*hfRope)(nil), ""
	switch {
	case hasComp:
		if k := comp.kind(); k == "yarn" {
			yarn, yarnPath = &comp, "rope_parameters.compress"
		} else if k != "default" {
			fail("rope_parameters.compress.rope_type is %q, want \"yarn\" or \"default\"", k)
		}
	case h.RopeScaling != nil:
		if k := h.RopeScaling.kind(); k == "yarn" {
			yarn, yarnPath = h.RopeScaling, "rope_scaling"
		} else if k != "default" {
			fail("rope_scaling type is %q, want \"yarn\"", k)
		}
	}
	c.RopeFactor, c.OriginalSeqLen, c.BetaFast, c.BetaSlow = 1, 0, 32, 1
	if yarn != nil {
		c.RopeFactor = reqF(yarnPath+".factor", yarn.Factor)
		c.OriginalSeqLen = req(yarnPath+".original_max_position_embeddings", yarn.OriginalMaxPos)
		c.BetaFast = reqF(yarnPath+".beta_fast", yarn.BetaFast)
		c.BetaSlow = reqF(yarnPath+".beta_slow", yarn.BetaSlow)
		if yarn.AttentionFactor != nil && *yarn.AttentionFactor != 1 {
			fail("%s.attention_factor is %v, want 1 (DeepSeek-V4 does not scale attention under YaRN)", yarnPath, *yarn.AttentionFactor)
		}
		if c.RopeFactor <= 1 {
			fail("%s.factor is %v, want > 1", yarnPath, c.RopeFactor)
		}
	}
	// Rotary width: qk_rope_head_dim, or partial_rotary_factor x head_dim.
	prf := h.PartialRotaryFactor
	if prf == nil && hasMain {
		prf = main.PartialRotaryFactor
	}
	switch {
	case h.QKRopeHeadDim != nil:
		c.RopeHeadDim = *h.QKRopeHeadDim
		if prf != nil && c.HeadDim > 0 && math.Abs(*prf*float64(c.HeadDim)-float64(c.RopeHeadDim)) > 1e-6 {
			fail("qk_rope_head_dim %d disagrees with partial_rotary_factor %v x head_dim %d", c.RopeHeadDim, *prf, c.HeadDim)
		}
	case prf != nil:
		d := *prf * float64(c.HeadDim)
		if r := math.Round(d); math.Abs(d-r) > 1e-6 || r <= 0 || r > float64(c.HeadDim) {
			fail("partial_rotary_factor %v x head_dim %d = %v is not a positive whole rotary width", *prf, c.HeadDim, d)
		} else {
			c.RopeHeadDim = int(r)
		}
	default:
		fail("neither qk_rope_head_dim nor partial_rotary_factor is present")
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("HF config.json: %w", errors.Join(errs...))
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("HF config.json: %w", err)
	}
	return c, nil
}

// hfTokenID reads a token id that may be absent (def), an integer, or a list
// of integers (the first is used).
func hfTokenID(raw json.RawMessage, def int) (int, error) {
	s := strings.TrimSpace(string(raw))
	if s == "" || s == "null" {
		return def, nil
	}
	var id int
	if err := json.Unmarshal(raw, &id); err == nil {
		return id, nil
	}
	var ids []int
	if err := json.Unmarshal(raw, &ids); err != nil || len(ids) == 0 {
		return 0, fmt.Errorf("%s is not an integer or a non-empty list of integers", s)
	}
	return ids[0], nil
}

// ---------------------------------------------------------------------------
// HF -> shipped layout
// ---------------------------------------------------------------------------

// HFConversion is a transformers DeepseekV4ForCausalLM checkpoint translated to
// the shipped layout: the moxie Config, the auxiliary files to write
// (config.json in hub form, and tokenizer.json / tokenizer_config.json when the
// source has them) and every tensor of config.Layout(Config), in layout order,
// produced on demand (quantized on the call of Data). The tensors read from the
// source, which must stay open until they are written.
type HFConversion struct {
	Config  *config.Config
	Aux     map[string][]byte
	Tensors []OutTensor
}

// hfFloatDType reports whether d is accepted for a floating-point source tensor.
func hfFloatDType(d format.DType) bool { return d == format.F32 || d == format.BF16 || d == format.F16 }

// maxHFErrors bounds how many tensor problems one error lists.
const maxHFErrors = 30

// ConvertHF translates a transformers-format DeepseekV4ForCausalLM checkpoint
// (src: config.json from DeepseekV4Config, safetensors with the transformers
// parameter names in F32, BF16 or F16, tid2eid in I64 or I32) into the shipped
// layout. Before anything is produced it checks that every tensor the layout
// needs is present with the expected shape and a usable dtype, and that every
// source tensor is used; the error lists each problem by tensor name. Values are
// checked when produced: a NaN or infinity, or a tid2eid entry outside
// [0, n_routed_experts), fails that tensor's Data. If tie_word_embeddings is set
// and lm_head.weight is absent, the head is the embedding.
func ConvertHF(src Source) (*HFConversion, error) {
	raw, err := src.File("config.json")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", src.Name(), err)
	}
	cfg, err := ConfigFromHF(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", src.Name(), err)
	}
	var tied struct {
		Tie bool `json:"tie_word_embeddings"`
	}
	_ = json.Unmarshal(raw, &tied) // already parsed above; a type error there would have failed

	layout := config.Layout(cfg)
	byName := make(map[string]config.Tensor, len(layout))
	for _, t := range layout {
		byName[t.Name] = t
	}
	// Expected transformers tensors: name -> shape, and dtype class.
	type want struct {
		shape []int64
		ints  bool
	}
	wants := map[string]want{}
	I, D, E := int64(cfg.MoEInterDim), int64(cfg.Dim), int64(cfg.NRoutedExperts)
	refs := map[string]HFRef{}
	for _, t := range layout {
		if t.ScaleOf != "" {
			continue
		}
		ref, ok := HFTensorFor(t.Name)
		if !ok {
			return nil, fmt.Errorf("%s: layout tensor %s has no transformers counterpart (internal error)", src.Name(), t.Name)
		}
		refs[t.Name] = ref
		shape := t.Shape
		switch ref.Part {
		case HFGateHalf, HFUpHalf:
			shape = []int64{E, 2 * I, D}
		case HFExpert:
			shape = []int64{E, D, I}
		default:
			if t.DType == format.I8 || t.DType == format.F8E4M3 {
				shape = []int64{t.Shape[0], t.Shape[1]}
				if t.DType == format.I8 {
					shape[1] *= 2
				}
			}
		}
		wants[ref.Name] = want{shape: shape, ints: t.DType == format.I64}
	}
	if _, ok := src.Lookup("lm_head.weight"); !ok && tied.Tie {
		refs["head.weight"] = HFRef{Name: "model.embed_tokens.weight", Expert: -1}
		delete(wants, "lm_head.weight")
	}
	var problems []string
	for _, name := range slices.Sorted(maps.Keys(wants)) {
		w := wants[name]
		ti, ok := src.Lookup(name)
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("missing tensor %s (want %v)", name, w.shape))
		case !equalShape64(ti.Shape, w.shape):
			problems = append(problems, fmt.Sprintf("tensor %s has shape %v, want %v", name, ti.Shape, w.shape))
		case w.ints && ti.DType != format.I64 && ti.DType != format.I32:
			problems = append(problems, fmt.Sprintf("tensor %s has dtype %s, want I64 or I32", name, ti.DType))
		case !w.ints && !hfFloatDType(ti.DType):
			problems = append(problems, fmt.Sprintf("tensor %s has dtype %s, want F32, BF16 or F16", name, ti.DType))
		}
	}
	for _, ti := range src.Tensors() {
		if _, ok := wants[ti.Name]; !ok {
			problems = append(problems, fmt.Sprintf("tensor %s %s%v has no place in the shipped layout (unmapped)", ti.Name, ti.DType, ti.Shape))
		}
	}
	if len(problems) > 0 {
		more := ""
		if len(problems) > maxHFErrors {
			more = fmt.Sprintf("\n  ... and %d more", len(problems)-maxHFErrors)
			problems = problems[:maxHFErrors]
		}
		return nil, fmt.Errorf("%s: not a DeepseekV4ForCausalLM checkpoint for its config.json:\n  %s%s", src.Name(), strings.Join(problems, "\n  "), more)
	}

	conv := &HFConversion{Config: cfg, Aux: map[string][]byte{"config.json": cfg.HubJSON()}}
	for _, n := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if b, err := src.File(n); err == nil {
			conv.Aux[n] = b
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	for _, t := range layout {
		out := OutTensor{Name: t.Name, DType: t.DType, Shape: t.Shape}
		wname := t.Name
		isScale := t.ScaleOf != ""
		if isScale {
			wname = t.ScaleOf
		}
		ref := refs[wname]
		wt := byName[wname]
		out.Data = func() ([]byte, error) {
			return hfProduce(src, cfg, wt, ref, isScale)
		}
		conv.Tensors = append(conv.Tensors, out)
	}
	return conv, nil
}

// hfProduce reads, checks and encodes one layout tensor (wt; its scale if
// isScale) from the transformers tensor ref.
func hfProduce(src Source, cfg *config.Config, wt config.Tensor, ref HFRef, isScale bool) ([]byte, error) {
	ti, _ := src.Lookup(ref.Name)
	raw, err := src.TensorData(ref.Name)
	if err != nil {
		return nil, err
	}
	if wt.DType == format.I64 { // tid2eid
		return hfTid2eid(ref.Name, ti.DType, raw, cfg.NRoutedExperts)
	}
	esz := int64(ti.DType.Size())
	var off, n int64 // element range within the source tensor
	rows, cols := int(wt.Shape[0]), 1
	if len(wt.Shape) == 2 {
		cols = int(wt.Shape[1])
	}
	if wt.DType == format.I8 {
		cols *= 2
	}
	n = int64(rows) * int64(cols)
	if len(wt.Shape) == 0 {
		n = 1
	}
	if len(wt.Shape) == 1 {
		n = wt.Shape[0]
	}
	switch ref.Part {
	case HFGateHalf:
		off = int64(ref.Expert) * 2 * n
	case HFUpHalf:
		off = int64(ref.Expert)*2*n + n
	case HFExpert:
		off = int64(ref.Expert) * n
	}
	if (off+n)*esz > int64(len(raw)) {
		return nil, fmt.Errorf("tensor %s: %d bytes, too short for element range [%d, %d)", ref.Name, len(raw), off, off+n)
	}
	v := make([]float32, n)
	b := raw[off*esz : (off+n)*esz]
	switch ti.DType {
	case format.F32:
		format.DecodeF32(v, b)
	case format.BF16:
		format.DecodeBF16(v, b)
	case format.F16:
		format.DecodeF16(v, b)
	default:
		return nil, fmt.Errorf("tensor %s: dtype %s is not a float type", ref.Name, ti.DType)
	}
	for i, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			where := ref.Name
			if ref.Expert >= 0 {
				where = fmt.Sprintf("%s[expert %d]", ref.Name, ref.Expert)
			}
			return nil, fmt.Errorf("tensor %s: non-finite value %v at element %d (for %s)", where, x, i, wt.Name)
		}
	}
	switch {
	case wt.DType == format.F8E4M3 && isScale:
		return format.ScalesFP8Block(v, rows, cols, cfg.BlockSize), nil
	case wt.DType == format.F8E4M3:
		q, _ := format.QuantizeFP8Block(v, rows, cols, cfg.BlockSize)
		return q, nil
	case wt.DType == format.I8 && isScale:
		return format.ScalesMXFP4(v, rows, cols), nil
	case wt.DType == format.I8:
		q, _ := format.QuantizeMXFP4(v, rows, cols)
		return q, nil
	case wt.DType == format.BF16:
		out := make([]byte, 2*n)
		for i, x := range v {
			binary.LittleEndian.PutUint16(out[2*i:], format.Float32ToBF16(x))
		}
		return out, nil
	case wt.DType == format.F32:
		out := make([]byte, 4*n)
		for i, x := range v {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
		}
		return out, nil
	}
	return nil, fmt.Errorf("tensor %s: layout dtype %s is not handled (internal error)", wt.Name, wt.DType)
}

// hfTid2eid converts a hash-routing table to I64, checking every id.
func hfTid2eid(name string, dt format.DType, raw []byte, experts int) ([]byte, error) {
	var n int
	switch dt {
	case format.I64:
		n = len(raw) / 8
	case format.I32:
		n = len(raw) / 4
	default:
		return nil, fmt.Errorf("tensor %s: dtype %s, want I64 or I32", name, dt)
	}
	out := make([]byte, 8*n)
	for i := range n {
		var id int64
		if dt == format.I64 {
			id = int64(binary.LittleEndian.Uint64(raw[8*i:]))
		} else {
			id = int64(int32(binary.LittleEndian.Uint32(raw[4*i:])))
		}
		if id < 0 || id >= int64(experts) {
			return nil, fmt.Errorf("tensor %s: element %d is expert id %d, want 0..%d", name, i, id, experts-1)
		}
		binary.LittleEndian.PutUint64(out[8*i:], uint64(id))
	}
	return out, nil
}

func equalShape64(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// ---------------------------------------------------------------------------
// shipped layout -> HF (the inverse, for tests and for training from a moxie model)
// ---------------------------------------------------------------------------

// HFConfigJSON renders c as a transformers DeepseekV4Config config.json in the
// full form (layer_types, mlp_layer_types, compress_rates, rope_parameters with
// "main" and "compress" sets), the keyword set reference/oracle.py builds
// DeepseekV4Config from. The MTP block is left out (num_nextn_predict_layers 0).
// It fails if c has more than one HCA ratio (transformers has one per model).
func HFConfigJSON(c *config.Config) ([]byte, error) {
	kinds := make([]string, c.NLayers)
	mlp := make([]string, c.NLayers)
	hca := 0
	for i := range c.NLayers {
		switch c.Kind(i) {
		case config.Window:
			kinds[i] = "sliding_attention"
		case config.CSA:
			kinds[i] = "compressed_sparse_attention"
		default:
			kinds[i] = "heavily_compressed_attention"
			if hca != 0 && hca != c.Ratio(i) {
				return nil, fmt.Errorf("layers use HCA ratios %d and %d; transformers supports one per model", hca, c.Ratio(i))
			}
			hca = c.Ratio(i)
		}
		mlp[i] = "moe"
		if c.HashRouted(i) {
			mlp[i] = "hash_moe"
		}
	}
	if hca == 0 {
		hca = 128
	}
	prf := float64(c.RopeHeadDim) / float64(c.HeadDim)
	main := map[string]any{"rope_type": "default", "rope_theta": c.RopeTheta, "partial_rotary_factor": prf}
	comp := map[string]any{"rope_type": "default", "rope_theta": c.CompressRopeTheta, "partial_rotary_factor": prf}
	if c.RopeFactor > 1 {
		comp = map[string]any{"rope_type": "yarn", "rope_theta": c.CompressRopeTheta, "partial_rotary_factor": prf,
			"factor": c.RopeFactor, "original_max_position_embeddings": c.OriginalSeqLen,
			"beta_fast": c.BetaFast, "beta_slow": c.BetaSlow, "attention_factor": 1.0}
	}
	m := map[string]any{
		"architectures": []string{"DeepseekV4ForCausalLM"}, "model_type": "deepseek_v4",
		"vocab_size": c.VocabSize, "hidden_size": c.Dim, "num_hidden_layers": c.NLayers,
		"num_attention_heads": c.NHeads, "num_key_value_heads": 1, "head_dim": c.HeadDim,
		"q_lora_rank": c.QLoraRank, "o_groups": c.OGroups, "o_lora_rank": c.OLoraRank,
		"sliding_window": c.Window, "rope_theta": c.RopeTheta, "compress_rope_theta": c.CompressRopeTheta,
		"max_position_embeddings": c.MaxPositions, "index_n_heads": c.IndexNHeads,
		"index_head_dim": c.IndexHeadDim, "index_topk": c.IndexTopK, "n_routed_experts": c.NRoutedExperts,
		"num_experts_per_tok": c.NActivatedExperts, "n_shared_experts": c.NSharedExperts,
		"moe_intermediate_size": c.MoEInterDim, "scoring_func": c.ScoreFunc, "norm_topk_prob": c.NormTopKProb,
		"routed_scaling_factor": c.RouteScale, "swiglu_limit": c.SwigluLimit, "hc_mult": c.HCMult,
		"hc_sinkhorn_iters": c.HCSinkhornIters, "hc_eps": c.HCEps, "rms_norm_eps": c.NormEps,
		"hidden_act": "silu", "attention_bias": false, "tie_word_embeddings": false,
		"bos_token_id": c.BOS, "eos_token_id": c.EOS, "num_nextn_predict_layers": 0,
		"layer_types": kinds, "mlp_layer_types": mlp,
		"compress_rates":        map[string]int{"compressed_sparse_attention": config.CSARatio, "heavily_compressed_attention": hca},
		"partial_rotary_factor": prf,
		"rope_parameters":       map[string]any{"main": main, "compress": comp},
	}
	out, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// ExportHFOptions controls ExportHF.
type ExportHFOptions struct {
	// PlainBF16 stores tensors that the checkpoint holds in BF16 as BF16 (exact)
	// instead of F32.
	PlainBF16 bool
}

// ExportHF writes the main model of src (no MTP block) as a transformers
// DeepseekV4ForCausalLM checkpoint directory dir: config.json from
// HFConfigJSON, the tokenizer files src has, and the state dict with every
// weight dequantized exactly to F32 (tid2eid I64; see PlainBF16), routed experts
// stacked as gate_up_proj [E, 2I, D] (w1 rows, then w3 rows) and down_proj
// [E, D, I]. dir must not exist; it is written through WriteDir.
func ExportHF(src Source, dir string, opts ExportHFOptions) error {
	raw, err := src.File("config.json")
	if err != nil {
		return err
	}
	cfg, err := config.Parse(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", src.Name(), err)
	}
	if cfg.ExpertDType != "fp4" || cfg.DenseFormat != "fp8" {
		return fmt.Errorf("%s: expert_dtype %q / dense format %q: ExportHF reads the shipped fp4 experts and fp8 blocks only", src.Name(), cfg.ExpertDType, cfg.DenseFormat)
	}
	hfCfg, err := HFConfigJSON(cfg)
	if err != nil {
		return fmt.Errorf("%s: %w", src.Name(), err)
	}
	aux := map[string][]byte{"config.json": hfCfg}
	for _, n := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if b, err := src.File(n); err == nil {
			aux[n] = b
		}
	}
	// dequant returns the float32 values of a layout weight.
	dequant := func(t config.Tensor) ([]float32, error) {
		b, err := src.TensorData(t.Name)
		if err != nil {
			return nil, err
		}
		switch t.DType {
		case format.F8E4M3, format.I8:
			sname := strings.TrimSuffix(t.Name, ".weight") + ".scale"
			s, err := src.TensorData(sname)
			if err != nil {
				return nil, err
			}
			if t.DType == format.I8 {
				return format.DequantMXFP4(b, s, int(t.Shape[0]), int(t.Shape[1])*2)
			}
			return format.DequantFP8Block(b, s, int(t.Shape[0]), int(t.Shape[1]), cfg.BlockSize)
		case format.BF16:
			v := make([]float32, len(b)/2)
			format.DecodeBF16(v, b)
			return v, nil
		case format.F32:
			v := make([]float32, len(b)/4)
			format.DecodeF32(v, b)
			return v, nil
		}
		return nil, fmt.Errorf("tensor %s: dtype %s not expected", t.Name, t.DType)
	}
	encode := func(v []float32, dt format.DType) []byte {
		if dt == format.BF16 {
			out := make([]byte, 2*len(v))
			for i, x := range v {
				binary.LittleEndian.PutUint16(out[2*i:], format.Float32ToBF16(x))
			}
			return out
		}
		out := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
		}
		return out
	}
	var tensors []OutTensor
	experts := map[string][]config.Tensor{} // stacked HF name -> member tensors
	var stackedOrder []string
	for _, t := range config.Layout(cfg) {
		if t.ScaleOf != "" || t.Layer >= cfg.NLayers {
			continue
		}
		ref, ok := HFTensorFor(t.Name)
		if !ok {
			return fmt.Errorf("tensor %s has no transformers counterpart", t.Name)
		}
		if ref.Expert >= 0 {
			if _, seen := experts[ref.Name]; !seen {
				stackedOrder = append(stackedOrder, ref.Name)
			}
			experts[ref.Name] = append(experts[ref.Name], t)
			continue
		}
		switch {
		case t.DType == format.I64:
			tensors = append(tensors, OutTensor{Name: ref.Name, DType: format.I64, Shape: t.Shape,
				Data: func() ([]byte, error) { return src.TensorData(t.Name) }})
		default:
			dt := format.F32
			if opts.PlainBF16 && t.DType == format.BF16 {
				dt = format.BF16
			}
			shape := t.Shape
			if t.DType == format.I8 {
				shape = []int64{t.Shape[0], 2 * t.Shape[1]}
			}
			tensors = append(tensors, OutTensor{Name: ref.Name, DType: dt, Shape: shape,
				Data: func() ([]byte, error) {
					v, err := dequant(t)
					if err != nil {
						return nil, err
					}
					return encode(v, dt), nil
				}})
		}
	}
	E, I, D := int64(cfg.NRoutedExperts), int64(cfg.MoEInterDim), int64(cfg.Dim)
	for _, name := range stackedOrder {
		members := experts[name]
		gateUp := strings.HasSuffix(name, "gate_up_proj")
		shape := []int64{E, D, I}
		if gateUp {
			shape = []int64{E, 2 * I, D}
		}
		tensors = append(tensors, OutTensor{Name: name, DType: format.F32, Shape: shape,
			Data: func() ([]byte, error) {
				per := shape[1] * shape[2]
				all := make([]float32, E*per)
				for _, t := range members {
					ref, _ := HFTensorFor(t.Name)
					v, err := dequant(t)
					if err != nil {
						return nil, err
					}
					off := int64(ref.Expert) * per
					if ref.Part == HFUpHalf {
						off += per / 2
					}
					copy(all[off:], v)
				}
				return encode(all, format.F32), nil
			}})
	}
	return WriteDir(dir, aux, tensors, WriteOptions{Metadata: map[string]string{"format": "pt"}})
}
