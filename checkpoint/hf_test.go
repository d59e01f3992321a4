package checkpoint_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"moxie/checkpoint"
	"moxie/dsv4"
	"moxie/dsv4/config"
	"moxie/format"
)

// oracleMeta is the record reference/oracle.py wrote when it loaded synth:tiny
// into transformers 5.17.0 (strict load, every value checked): the keyword set
// DeepseekV4Config accepted, and the checkpoint -> transformers name pairs.
type oracleMeta struct {
	HFConfig map[string]any `json:"hf_config_kwargs"`
	Mapping  [][3]string    `json:"mapping_layers_0_to_3_and_globals"`
}

func readOracleMeta(t *testing.T) oracleMeta {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "dsv4", "testdata", "golden", "tiny", "oracle_meta.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m oracleMeta
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Mapping) < 50 || m.HFConfig == nil {
		t.Fatalf("oracle_meta.json: %d mapping entries, config %v: not the expected record", len(m.Mapping), m.HFConfig != nil)
	}
	return m
}

// TestHFNamesMatchOracle checks every name pair against the mapping that
// transformers itself accepted in the oracle run (an independent record).
func TestHFNamesMatchOracle(t *testing.T) {
	meta := readOracleMeta(t)
	for _, e := range meta.Mapping {
		ck, hf := e[0], e[1]
		t.Run(ck, func(t *testing.T) {
			ref, ok := checkpoint.HFTensorFor(ck)
			if !ok {
				t.Fatalf("no transformers name for %s, oracle used %s", ck, hf)
			}
			got := ref.Name
			switch ref.Part {
			case checkpoint.HFGateHalf:
				got += "[e, :I, :]"
			case checkpoint.HFUpHalf:
				got += "[e, I:, :]"
			case checkpoint.HFExpert:
				got += "[e]"
			}
			if got != hf {
				t.Errorf("%s -> %s, oracle used %s", ck, got, hf)
			}
		})
	}
	for _, name := range []string{"layers.0.attn.wq_a.scale", "mtp.0.attn_norm.weight", "bogus", "layers.x.attn_norm.weight"} {
		if ref, ok := checkpoint.HFTensorFor(name); ok {
			t.Errorf("HFTensorFor(%q) = %+v, want none", name, ref)
		}
	}
}

// oracleHFConfig is the config.json transformers was built from in the oracle
// run, in the full form (model_type added, as to_json_file writes it).
func oracleHFConfig(t *testing.T) []byte {
	meta := readOracleMeta(t)
	cfg := map[string]any{"model_type": "deepseek_v4"}
	for k, v := range meta.HFConfig {
		cfg[k] = v
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// tinyNoMTP is synth:tiny's configuration without its MTP block, the form an
// import from transformers has.
func tinyNoMTP() *config.Config {
	c := config.Tiny()
	c.CompressRatios = c.CompressRatios[:c.NLayers]
	c.NMTPLayers = 0
	return c
}

func TestConfigFromHF(t *testing.T) {
	legacy := `{"model_type":"deepseek_v4","vocab_size":288,"hidden_size":160,"num_hidden_layers":4,
	"num_attention_heads":4,"num_key_value_heads":1,"head_dim":48,"qk_rope_head_dim":16,"q_lora_rank":96,
	"o_groups":2,"o_lora_rank":48,"sliding_window":8,"compress_ratios":[0,4,8,4,0],"num_hash_layers":2,
	"rope_theta":10000.0,"compress_rope_theta":160000.0,"max_position_embeddings":4096,
	"rope_scaling":{"type":"yarn","factor":16,"original_max_position_embeddings":64,"beta_fast":32,"beta_slow":1},
	"index_n_heads":16,"index_head_dim":32,"index_topk":4,"n_routed_experts":8,"num_experts_per_tok":2,
	"n_shared_experts":1,"moe_intermediate_size":64,"scoring_func":"sqrtsoftplus","norm_topk_prob":true,
	"routed_scaling_factor":1.5,"swiglu_limit":10.0,"hc_mult":4,"hc_sinkhorn_iters":20,"hc_eps":1e-6,
	"rms_norm_eps":1e-6,"bos_token_id":0,"eos_token_id":[1,5]}`
	own, err := checkpoint.HFConfigJSON(config.Tiny())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		data   []byte
		maxPos int // the oracle config derives it from the YaRN factor
	}{
		{"oracle keyword set", oracleHFConfig(t), 1024},
		{"legacy keys", []byte(legacy), 4096},
		{"HFConfigJSON", own, 4096},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := checkpoint.ConfigFromHF(tc.data)
			if err != nil {
				t.Fatal(err)
			}
			want := tinyNoMTP()
			want.MaxPositions = tc.maxPos
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
			back, err := config.Parse(got.HubJSON())
			if err != nil || !reflect.DeepEqual(back, got) {
				t.Errorf("hub config does not round-trip: %v\n%+v\n%+v", err, back, got)
			}
		})
	}
}

func TestConfigFromHFRejects(t *testing.T) {
	base := map[string]any{}
	if err := json.Unmarshal(oracleHFConfig(t), &base); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(m map[string]any)
		want string
	}{
		{"not json", nil, "HF config.json"},
		{"model type", func(m map[string]any) { m["model_type"] = "llama" }, `model_type is "llama"`},
		{"no model type", func(m map[string]any) { delete(m, "model_type") }, "model_type is missing"},
		{"missing swiglu", func(m map[string]any) { delete(m, "swiglu_limit") }, "swiglu_limit is missing"},
		{"missing hc_eps", func(m map[string]any) { delete(m, "hc_eps") }, "hc_eps is missing"},
		{"layer types length", func(m map[string]any) { m["layer_types"] = []string{"sliding_attention"} }, "layer_types has 1 entries"},
		{"layer type name", func(m map[string]any) {
			m["layer_types"] = []string{"sliding_attention", "full_attention", "sliding_attention", "sliding_attention"}
		}, `layer_types[1] is "full_attention"`},
		{"csa rate", func(m map[string]any) {
			m["compress_rates"] = map[string]int{"compressed_sparse_attention": 8, "heavily_compressed_attention": 8}
		}, "compressed_sparse_attention is 8"},
		{"hash not prefix", func(m map[string]any) { m["mlp_layer_types"] = []string{"moe", "hash_moe", "moe", "moe"} }, "hash_moe after a moe layer"},
		{"no layer schedule", func(m map[string]any) { delete(m, "layer_types") }, "neither layer_types nor compress_ratios"},
		{"kv heads", func(m map[string]any) { m["num_key_value_heads"] = 2 }, "num_key_value_heads is 2"},
		{"activation", func(m map[string]any) { m["hidden_act"] = "gelu" }, `hidden_act is "gelu"`},
		{"attention factor", func(m map[string]any) {
			rp := m["rope_parameters"].(map[string]any)
			rp["compress"].(map[string]any)["attention_factor"] = 0.5
		}, "attention_factor is 0.5"},
		{"rotary width", func(m map[string]any) { m["partial_rotary_factor"] = 0.3 }, "not a positive whole rotary width"},
		{"bad eos", func(m map[string]any) { m["eos_token_id"] = "x" }, "eos_token_id"},
		{"validate", func(m map[string]any) { m["hidden_size"] = 0 }, "hidden_size is 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := []byte("{not json")
			if tc.edit != nil {
				var m map[string]any
				b, _ := json.Marshal(base)
				_ = json.Unmarshal(b, &m) // deep copy
				tc.edit(m)
				data, _ = json.Marshal(m)
			}
			_, err := checkpoint.ConfigFromHF(data)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

// exportTiny writes synth:tiny as a transformers checkpoint directory and, if
// oracleCfg, replaces its config.json by the oracle's keyword set.
func exportTiny(t *testing.T, opts checkpoint.ExportHFOptions, oracleCfg bool) string {
	t.Helper()
	src, err := checkpoint.Open("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "hf")
	if err := checkpoint.ExportHF(src, dir, opts); err != nil {
		t.Fatal(err)
	}
	if oracleCfg {
		if err := os.WriteFile(filepath.Join(dir, "config.json"), oracleHFConfig(t), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestImportHFRoundTrip: synth:tiny -> transformers layout (dequantized) ->
// ConvertHF -> shipped layout must give synth:tiny's bytes back exactly (the
// quantizers reproduce a dequantized tensor's codes and scales), load in
// dsv4, and give synth:tiny's logits bit for bit.
func TestImportHFRoundTrip(t *testing.T) {
	ref, err := checkpoint.Open("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	refModel, err := dsv4.Load(ref, dsv4.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer refModel.Close()
	toks := []int{0, 72, 104, 111, 33, 259, 260, 200, 17, 5, 99, 100, 101, 102, 140, 141, 7, 3, 250, 42}
	want, err := dsv4.Logits(refModel, toks, 12)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		opts      checkpoint.ExportHFOptions
		oracleCfg bool
	}{
		{"f32 oracle config", checkpoint.ExportHFOptions{}, true},
		{"bf16 plain tensors", checkpoint.ExportHFOptions{PlainBF16: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hfDir := exportTiny(t, tc.opts, tc.oracleCfg)
			hf, err := checkpoint.OpenDir(hfDir)
			if err != nil {
				t.Fatal(err)
			}
			defer hf.Close()
			conv, err := checkpoint.ConvertHF(hf)
			if err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "out")
			if err := checkpoint.WriteDir(out, conv.Aux, conv.Tensors, checkpoint.WriteOptions{ShardSize: 256 << 10}); err != nil {
				t.Fatal(err)
			}
			got, err := checkpoint.OpenDir(out)
			if err != nil {
				t.Fatal(err)
			}
			defer got.Close()
			if got.Shards() < 3 {
				t.Errorf("%d shards, want several at 256 KiB", got.Shards())
			}
			layout := config.Layout(tinyNoMTP())
			if len(got.Tensors()) != len(layout) {
				t.Errorf("%d tensors, want %d (synth:tiny without MTP)", len(got.Tensors()), len(layout))
			}
			requantized := 0
			for _, lt := range layout {
				if lt.ScaleOf != "" {
					continue // compared with its weight
				}
				gv, gb, err := values(got, lt)
				if err != nil {
					t.Errorf("%s: %v", lt.Name, err)
					continue
				}
				rv, rb, err := values(ref, lt)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(gb, rb) {
					// Quantized tensors may legitimately change codes and scale: a
					// group whose largest code rounded down to half the format's
					// maximum (E2M1 3, E4M3 224) re-quantizes one exponent lower
					// with doubled codes, the same values.
					if lt.DType != format.F8E4M3 && lt.DType != format.I8 {
						t.Errorf("%s: bytes differ from synth:tiny's", lt.Name)
						continue
					}
					requantized++
				}
				for i := range rv {
					if math.Float32bits(gv[i]) != math.Float32bits(rv[i]) {
						t.Errorf("%s: element %d = %v, synth:tiny has %v", lt.Name, i, gv[i], rv[i])
						break
					}
				}
			}
			t.Logf("%d quantized tensors re-encoded with other codes/scales, same values", requantized)
			for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
				gb, err1 := got.File(f)
				rb, err2 := ref.File(f)
				if err1 != nil || err2 != nil || !bytes.Equal(gb, rb) {
					t.Errorf("%s not copied unchanged (%v, %v)", f, err1, err2)
				}
			}
			m, err := dsv4.Load(got, dsv4.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			logits, err := dsv4.Logits(m, toks, 12)
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if math.Float32bits(logits[i]) != math.Float32bits(want[i]) {
					t.Fatalf("logit %d (pos %d) = %v, synth:tiny gives %v", i, i/m.Cfg.VocabSize, logits[i], want[i])
				}
			}
		})
	}
}

// memSource is an in-memory Source for the error cases.
type memSource struct {
	files   map[string][]byte
	infos   []checkpoint.TensorInfo
	data    map[string][]byte
	lookups map[string]checkpoint.TensorInfo
}

func (m *memSource) Name() string    { return "mem" }
func (m *memSource) Synthetic() bool { return false }
func (m *memSource) File(n string) ([]byte, error) {
	b, ok := m.files[n]
	if !ok {
		return nil, fmt.Errorf("%s: %w", n, fs.ErrNotExist)
	}
	return b, nil
}
func (m *memSource) Tensors() []checkpoint.TensorInfo { return m.infos }
func (m *memSource) Lookup(n string) (checkpoint.TensorInfo, bool) {
	ti, ok := m.lookups[n]
	return ti, ok
}
func (m *memSource) TensorData(n string) ([]byte, error) {
	b, ok := m.data[n]
	if !ok {
		return nil, fmt.Errorf("no tensor %s", n)
	}
	return b, nil
}
func (m *memSource) Close() error { return nil }

func (m *memSource) set(ti checkpoint.TensorInfo, b []byte) {
	m.lookups[ti.Name] = ti
	m.data[ti.Name] = b
	m.infos = m.infos[:0]
	for _, v := range m.lookups {
		m.infos = append(m.infos, v)
	}
}

func (m *memSource) del(n string) {
	delete(m.lookups, n)
	delete(m.data, n)
	m.infos = m.infos[:0]
	for _, v := range m.lookups {
		m.infos = append(m.infos, v)
	}
}

func loadMem(t *testing.T, dir string) *memSource {
	src, err := checkpoint.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	m := &memSource{files: map[string][]byte{}, data: map[string][]byte{}, lookups: map[string]checkpoint.TensorInfo{}}
	for _, f := range []string{"config.json", "tokenizer.json"} {
		b, _ := src.File(f)
		m.files[f] = b
	}
	for _, ti := range src.Tensors() {
		b, _ := src.TensorData(ti.Name)
		m.set(ti, append([]byte(nil), b...))
	}
	return m
}

func TestConvertHFRejects(t *testing.T) {
	dir := exportTiny(t, checkpoint.ExportHFOptions{}, false)
	const qa = "model.layers.1.self_attn.q_a_proj.weight"
	for _, tc := range []struct {
		name    string
		edit    func(m *memSource)
		want    string
		atWrite bool // the error comes from a tensor's Data
	}{
		{"missing", func(m *memSource) { m.del("model.layers.2.mlp.gate.e_score_correction_bias") },
			"missing tensor model.layers.2.mlp.gate.e_score_correction_bias", false},
		{"missing head, untied", func(m *memSource) { m.del("lm_head.weight") }, "missing tensor lm_head.weight", false},
		{"unmapped", func(m *memSource) {
			m.set(checkpoint.TensorInfo{Name: "model.layers.0.mlp.extra", DType: format.F32, Shape: []int64{2}, Size: 8}, make([]byte, 8))
		}, "tensor model.layers.0.mlp.extra F32[2] has no place", false},
		{"mtp tensor", func(m *memSource) {
			m.set(checkpoint.TensorInfo{Name: "mtp.0.enorm.weight", DType: format.F32, Shape: []int64{160}, Size: 640}, make([]byte, 640))
		}, "mtp.0.enorm.weight", false},
		{"shape", func(m *memSource) {
			ti := m.lookups["model.layers.0.mlp.experts.gate_up_proj"]
			ti.Shape = []int64{8, 160, 128}
			m.set(ti, m.data[ti.Name])
		}, "model.layers.0.mlp.experts.gate_up_proj has shape [8 160 128], want [8 128 160]", false},
		{"dtype", func(m *memSource) {
			ti := m.lookups[qa]
			ti.DType = format.I32
			m.set(ti, m.data[qa])
		}, qa + " has dtype I32", false},
		{"tid2eid dtype", func(m *memSource) {
			ti := m.lookups["model.layers.0.mlp.gate.tid2eid"]
			ti.DType = format.F64
			m.set(ti, m.data[ti.Name])
		}, "tid2eid has dtype F64, want I64 or I32", false},
		{"nan", func(m *memSource) {
			b := append([]byte(nil), m.data[qa]...)
			binary.LittleEndian.PutUint32(b[4*17:], math.Float32bits(float32(math.NaN())))
			m.set(m.lookups[qa], b)
		}, qa + ": non-finite value NaN at element 17", true},
		{"inf expert", func(m *memSource) {
			n := "model.layers.3.mlp.experts.down_proj"
			b := append([]byte(nil), m.data[n]...)
			binary.LittleEndian.PutUint32(b[4*(5*160*64+3):], math.Float32bits(float32(math.Inf(1))))
			m.set(m.lookups[n], b)
		}, "down_proj[expert 5]: non-finite value +Inf at element 3", true},
		{"tid2eid range", func(m *memSource) {
			n := "model.layers.1.mlp.gate.tid2eid"
			b := append([]byte(nil), m.data[n]...)
			binary.LittleEndian.PutUint64(b[8*9:], 8)
			m.set(m.lookups[n], b)
		}, "tid2eid: element 9 is expert id 8, want 0..7", true},
		{"bad config", func(m *memSource) { m.files["config.json"] = []byte(`{"model_type":"deepseek_v4"}`) }, "vocab_size is missing", false},
		{"no config", func(m *memSource) { delete(m.files, "config.json") }, "config.json", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := loadMem(t, dir)
			tc.edit(m)
			conv, err := checkpoint.ConvertHF(m)
			if !tc.atWrite {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("err = %v, want it to mention %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatalf("ConvertHF: %v (want the error from the tensor data)", err)
			}
			var found error
			for _, ot := range conv.Tensors {
				if _, err := ot.Data(); err != nil && found == nil {
					found = err
				}
			}
			if found == nil || !strings.Contains(found.Error(), tc.want) {
				t.Fatalf("Data err = %v, want it to mention %q", found, tc.want)
			}
		})
	}
}

// TestConvertHFTiedHead: with tie_word_embeddings and no lm_head.weight, the
// head is the embedding.
func TestConvertHFTiedHead(t *testing.T) {
	m := loadMem(t, exportTiny(t, checkpoint.ExportHFOptions{}, false))
	m.del("lm_head.weight")
	var cfg map[string]any
	_ = json.Unmarshal(m.files["config.json"], &cfg)
	cfg["tie_word_embeddings"] = true
	m.files["config.json"], _ = json.Marshal(cfg)
	conv, err := checkpoint.ConvertHF(m)
	if err != nil {
		t.Fatal(err)
	}
	var head, embed []byte
	for _, ot := range conv.Tensors {
		switch ot.Name {
		case "head.weight":
			head, err = ot.Data()
		case "embed.weight":
			embed, err = ot.Data()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if head == nil || !bytes.Equal(head, embed) {
		t.Fatal("tied head is not the embedding")
	}
}

func FuzzConfigFromHF(f *testing.F) {
	own, _ := checkpoint.HFConfigJSON(config.Tiny())
	f.Add(own)
	f.Add([]byte(`{"model_type":"deepseek_v4","layer_types":["sliding_attention"],"num_hidden_layers":1}`))
	f.Add([]byte(`{"rope_parameters":{"main":{"rope_type":"yarn"}},"eos_token_id":[]}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := checkpoint.ConfigFromHF(data)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted an invalid config: %v", err)
		}
		config.Layout(c) // must not panic
	})
}

// values dequantizes a layout tensor of src with the format package's
// decoders, and returns it with the raw bytes of the weight and its scale.
func values(src checkpoint.Source, lt config.Tensor) ([]float32, []byte, error) {
	b, err := src.TensorData(lt.Name)
	if err != nil {
		return nil, nil, err
	}
	rows, cols := 1, 1
	if len(lt.Shape) > 0 {
		rows = int(lt.Shape[0])
	}
	if len(lt.Shape) > 1 {
		cols = int(lt.Shape[1])
	}
	switch lt.DType {
	case format.F8E4M3, format.I8:
		s, err := src.TensorData(strings.TrimSuffix(lt.Name, ".weight") + ".scale")
		if err != nil {
			return nil, nil, err
		}
		raw := append(append([]byte(nil), b...), s...)
		var v []float32
		if lt.DType == format.I8 {
			v, err = format.DequantMXFP4(b, s, rows, 2*cols)
		} else {
			v, err = format.DequantFP8Block(b, s, rows, cols, 128)
		}
		return v, raw, err
	case format.BF16:
		v := make([]float32, len(b)/2)
		format.DecodeBF16(v, b)
		return v, b, nil
	case format.F32:
		v := make([]float32, len(b)/4)
		format.DecodeF32(v, b)
		return v, b, nil
	}
	v := make([]float32, len(b)/8) // I64: compare the raw integers as bit patterns
	for i := range v {
		v[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint64(b[8*i:])))
	}
	return v, b, nil
}

// TestConvertHFOtherDTypes: tid2eid stored as I32 and a weight stored as F16
// convert to the same bytes as from I64 and F32 (values exact in F16 chosen).
func TestConvertHFOtherDTypes(t *testing.T) {
	dir := exportTiny(t, checkpoint.ExportHFOptions{}, false)
	produce := func(m *memSource, name string) []byte {
		t.Helper()
		conv, err := checkpoint.ConvertHF(m)
		if err != nil {
			t.Fatal(err)
		}
		for _, ot := range conv.Tensors {
			if ot.Name == name {
				b, err := ot.Data()
				if err != nil {
					t.Fatal(err)
				}
				return b
			}
		}
		t.Fatalf("no tensor %s", name)
		return nil
	}
	t.Run("tid2eid I32", func(t *testing.T) {
		m := loadMem(t, dir)
		want := produce(m, "layers.0.ffn.gate.tid2eid")
		n := "model.layers.0.mlp.gate.tid2eid"
		ti := m.lookups[n]
		b64 := m.data[n]
		b32 := make([]byte, len(b64)/2)
		for i := range len(b64) / 8 {
			binary.LittleEndian.PutUint32(b32[4*i:], uint32(binary.LittleEndian.Uint64(b64[8*i:])))
		}
		ti.DType, ti.Size = format.I32, int64(len(b32))
		m.set(ti, b32)
		if got := produce(m, "layers.0.ffn.gate.tid2eid"); !bytes.Equal(got, want) {
			t.Error("I32 tid2eid converts differently from I64")
		}
	})
	t.Run("F16 weight", func(t *testing.T) {
		m := loadMem(t, dir)
		n := "model.layers.2.self_attn.compressor.position_bias" // ape [8, 96], F32 in the layout
		ti := m.lookups[n]
		f32 := m.data[n]
		k := len(f32) / 4
		f16 := make([]byte, 2*k)
		exact := make([]byte, 4*k)
		for i := range k {
			v := math.Float32frombits(binary.LittleEndian.Uint32(f32[4*i:]))
			h := format.Float32ToF16(v)
			binary.LittleEndian.PutUint16(f16[2*i:], h)
			binary.LittleEndian.PutUint32(exact[4*i:], math.Float32bits(format.F16ToFloat32(h)))
		}
		m.set(checkpoint.TensorInfo{Name: n, DType: format.F16, Shape: ti.Shape, Size: int64(len(f16))}, f16)
		if got := produce(m, "layers.2.attn.compressor.ape"); !bytes.Equal(got, exact) {
			t.Error("F16 input does not convert to its exact float32 values")
		}
	})
}

// BenchmarkConvertHF measures producing every tensor of synth:tiny's shipped
// layout (quantization included) from its transformers form; bytes/s counts
// the shipped bytes.
func BenchmarkConvertHF(b *testing.B) {
	src, err := checkpoint.Open("synth:tiny")
	if err != nil {
		b.Fatal(err)
	}
	dir := filepath.Join(b.TempDir(), "hf")
	if err := checkpoint.ExportHF(src, dir, checkpoint.ExportHFOptions{}); err != nil {
		b.Fatal(err)
	}
	hf, err := checkpoint.OpenDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer hf.Close()
	conv, err := checkpoint.ConvertHF(hf)
	if err != nil {
		b.Fatal(err)
	}
	var total int64
	for _, ot := range conv.Tensors {
		n := int64(ot.DType.Size())
		for _, d := range ot.Shape {
			n *= d
		}
		total += n
	}
	b.SetBytes(total)
	b.ResetTimer()
	for range b.N {
		for _, ot := range conv.Tensors {
			if _, err := ot.Data(); err != nil {
				b.Fatal(err)
			}
		}
	}
}
