package config

import (
	"strings"
	"testing"
)

// The shipped index's metadata.total_size (dsv4-flash.md §5.1/§5.4).
const flashTotalBytes = 159_609_485_896

func TestFlashLayoutTotalMatchesShippedIndex(t *testing.T) {
	var total, experts int64
	n := 0
	for _, tn := range Layout(Flash()) {
		total += tn.Bytes()
		if tn.Role == RoleRoutedExpert {
			experts += tn.Bytes()
		}
		n++
	}
	if total != flashTotalBytes {
		t.Fatalf("layout total = %d bytes, want %d (shipped index total_size)", total, flashTotalBytes)
	}
	t.Logf("%d tensors, %d bytes, routed experts %d bytes", n, total, experts)
}

func TestFlashSchedule(t *testing.T) {
	c := Flash()
	want := map[int]LayerKind{0: Window, 1: Window, 2: CSA, 3: HCA, 41: HCA, 42: CSA, 43: Window}
	for i, k := range want {
		if got := c.Kind(i); got != k {
			t.Errorf("layer %d kind = %v, want %v", i, got, k)
		}
	}
	for i, h := range map[int]bool{0: true, 2: true, 3: false, 43: false} {
		if got := c.HashRouted(i); got != h {
			t.Errorf("layer %d hash routed = %v, want %v", i, got, h)
		}
	}
}

func TestHubJSONRoundTrip(t *testing.T) {
	for name, c := range map[string]*Config{"flash": Flash(), "tiny": Tiny()} {
		t.Run(name, func(t *testing.T) {
			got, err := Parse(c.HubJSON())
			if err != nil {
				t.Fatal(err)
			}
			if a, b := string(got.HubJSON()), string(c.HubJSON()); a != b {
				t.Fatalf("round trip differs:\n%s\nvs\n%s", a, b)
			}
		})
	}
}

func TestParseInferenceKeys(t *testing.T) {
	js := `{"vocab_size":129280,"dim":4096,"moe_inter_dim":2048,"n_layers":43,"n_hash_layers":3,
	"n_heads":64,"n_routed_experts":256,"n_shared_experts":1,"n_activated_experts":6,
	"score_func":"sqrtsoftplus","route_scale":1.5,"swiglu_limit":10.0,"q_lora_rank":1024,
	"head_dim":512,"rope_head_dim":64,"o_groups":8,"o_lora_rank":1024,"window_size":128,
	"original_seq_len":65536,"rope_theta":10000,"rope_factor":16,"beta_fast":32,"beta_slow":1,
	"index_n_heads":64,"index_head_dim":128,"index_topk":512,"hc_mult":4,"hc_sinkhorn_iters":20,
	"dtype":"fp8","scale_fmt":"ue8m0","expert_dtype":"fp4","compress_rope_theta":160000,
	"compress_ratios":[0,0,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,0]}`
	c, err := Parse([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	f := Flash()
	if string(c.HubJSON()) != string(f.HubJSON()) {
		t.Fatalf("inference-form config differs from Flash():\n%s", c.HubJSON())
	}
}

func TestParseRejects(t *testing.T) {
	base := string(Tiny().HubJSON())
	cases := []struct{ name, from, to, want string }{
		{"model type", `"model_type": "deepseek_v4"`, `"model_type": "llama"`, "model_type"},
		{"kv heads", `"num_key_value_heads": 1`, `"num_key_value_heads": 8`, "num_key_value_heads"},
		{"ratios length", `"compress_ratios": [`, `"compress_ratios": [4,`, "compress_ratios"},
		{"missing dim", `"hidden_size": 160,`, ``, "hidden_size is missing"},
		{"fractional", `"hidden_size": 160`, `"hidden_size": 160.5`, "hidden_size"},
		{"wrong type", `"head_dim": 48`, `"head_dim": "48"`, "head_dim"},
		{"heads groups", `"o_groups": 2`, `"o_groups": 3`, "o_groups"},
		{"topk", `"num_experts_per_tok": 2`, `"num_experts_per_tok": 9`, "num_experts_per_tok"},
		{"not json", `{`, `[`, "config.json"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			js := strings.Replace(base, tc.from, tc.to, 1)
			if js == base {
				t.Fatalf("replacement %q not found", tc.from)
			}
			_, err := Parse([]byte(js))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want mention of %q", err, tc.want)
			}
		})
	}
}

func TestBytesPerTokenFlash(t *testing.T) {
	// Independent arithmetic from the shapes of dsv4-flash.md §5.3 (not from Layout):
	// per layer the attention core, norms, sinks, both HC mixers, 6 of 256 MXFP4
	// experts and the FP8 shared expert; CSA and HCA extras; full router gates and
	// biases on score-routed layers, only the 6 selected gate rows and one tid2eid
	// row on the 3 hash layers; one embedding row, the LM head, the final norm and
	// hc_head. §8 estimates ≈ 11.22 GB with full gates on every layer.
	const (
		attn     = (1024*4096 + 8*32) + (32768*1024 + 256*8) + (512*4096 + 4*32) + (8192*4096 + 64*32) + (4096*8192 + 32*64) + 4096*2 + 1024*2 + 512*2 + 64*4
		ffnNorm  = 4096 * 2
		hc       = 2 * (24*16384*4 + 24*4 + 3*4)
		expert   = 2*(2048*2048+2048*128) + 4096*1024 + 4096*64
		shared   = 2*(2048*4096+16*32) + 4096*2048 + 32*16
		csa      = 2*1024*4096*2 + 4*1024*4 + 512*2 + 8192*1024 + 64*8 + 64*4096*2 + 2*256*4096*2 + 4*256*4 + 128*2
		hca      = 2*512*4096*2 + 128*512*4 + 512*2
		perLayer = attn + ffnNorm + hc + 6*expert + shared
		global   = 4096*2 + 129280*4096*2 + 4096*2 + 4*16384*4 + 4*4 + 4
		want     = 43*perLayer + 21*csa + 20*hca + 40*(256*4096*2+256*4) + 3*(6*4096*2+6*8) + global
	)
	if got := BytesPerToken(Flash()); got != want {
		t.Fatalf("BytesPerToken = %d, want %d", got, int64(want))
	}
}
