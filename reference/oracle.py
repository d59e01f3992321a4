#!/usr/bin/env python3
"""Numerical oracle for moxie's `exact` target (dsv4-flash.md §0b, design.md §6).

Loads a DeepSeek-V4 checkpoint directory in the shipped layout (as written by
`moxie synth tiny --out DIR`), dequantizes every weight exactly to float32 with
this file's own decoders, loads the result into transformers'
DeepseekV4ForCausalLM (float32, eager attention, shared-expert clamp switched
off), runs a fixed set of token sequences and writes their logits as golden
files:

    OUT/cases.json            [{"name", "tokens", "prefill", "logits", ...}, ...]
    OUT/<name>.npy            float32 [T, vocab], C order; row i predicts token i+1
    OUT/<name>_uncached.npy   the same sequence as one uncached prefill (cached cases)
    OUT/indexer.json          lightning-indexer selections per CSA layer and position
    OUT/oracle_meta.json      versions, date, the HF config, the name mapping, checks

Usage: python3 reference/oracle.py CHECKPOINT_DIR OUT_DIR [--dump-hf-src FILE.tgz]
Needs torch, numpy and a transformers release with models/deepseek_v4 (checked
with the version printed at start). No code of transformers is copied here; it
is imported and driven.
"""

import argparse
import copy
import datetime
import hashlib
import json
import math
import os
import re
import struct
import sys
import types

# ---------------------------------------------------------------------------
# safetensors, parsed by hand (8-byte LE header length, JSON header, data)
# ---------------------------------------------------------------------------

DTYPE_SIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "I32": 4, "I64": 8, "F16": 2, "BF16": 2,
    "F32": 4, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
}


class CheckpointError(Exception):
    pass


def read_shard(path):
    """Returns {name: (dtype, shape, bytes)} of one safetensors file, validated."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read()
    if size < 8:
        raise CheckpointError(f"{path}: {size} bytes, too short for a safetensors header length")
    (hlen,) = struct.unpack("<Q", raw[:8])
    if hlen > size - 8 or hlen > 100 << 20:
        raise CheckpointError(f"{path}: header length {hlen} exceeds the file ({size} bytes)")
    try:
        header = json.loads(raw[8:8 + hlen].decode("utf-8"))
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"{path}: header is not JSON: {e}")
    data = memoryview(raw)[8 + hlen:]
    out = {}
    spans = []
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        dt, shape, offs = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
        if dt not in DTYPE_SIZE:
            raise CheckpointError(f"{path}: tensor {name}: unknown dtype {dt!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise CheckpointError(f"{path}: tensor {name}: bad shape {shape!r}")
        if not (isinstance(offs, list) and len(offs) == 2 and 0 <= offs[0] <= offs[1] <= len(data)):
            raise CheckpointError(f"{path}: tensor {name}: data_offsets {offs!r} outside data ({len(data)} bytes)")
        n = DTYPE_SIZE[dt]
        for d in shape:
            n *= d
        if offs[1] - offs[0] != n:
            raise CheckpointError(f"{path}: tensor {name}: {offs[1]-offs[0]} bytes, want {n} for {dt}{shape}")
        spans.append((offs[0], offs[1], name))
        out[name] = (dt, tuple(shape), data[offs[0]:offs[1]])
    spans.sort()
    for a, b in zip(spans, spans[1:]):
        if b[0] < a[1]:
            raise CheckpointError(f"{path}: tensors {a[2]} and {b[2]} overlap")
    return out


def read_checkpoint(ckpt):
    """Returns (hub config dict, {name: (dtype, shape, bytes)})."""
    with open(os.path.join(ckpt, "config.json")) as f:
        hub = json.load(f)
    index_path = os.path.join(ckpt, "model.safetensors.index.json")
    tensors = {}
    if os.path.exists(index_path):
        with open(index_path) as f:
            wmap = json.load(f)["weight_map"]
        for shard in sorted(set(wmap.values())):
            if "/" in shard or shard.startswith("."):
                raise CheckpointError(f"{index_path}: bad shard name {shard!r}")
            for name, t in read_shard(os.path.join(ckpt, shard)).items():
                if wmap.get(name) != shard:
                    raise CheckpointError(f"{shard}: tensor {name} not listed for this shard in the index")
                if name in tensors:
                    raise CheckpointError(f"tensor {name} stored twice")
                tensors[name] = t
        missing = sorted(set(wmap) - set(tensors))
        if missing:
            raise CheckpointError(f"index lists tensors that no shard holds: {missing[:5]}")
    else:
        tensors = read_shard(os.path.join(ckpt, "model.safetensors"))
    return hub, tensors


# ---------------------------------------------------------------------------
# exact decoders (numpy, float64 internally; every value is exact in float32)
# ---------------------------------------------------------------------------

def e4m3fn_table():
    import numpy as np
    t = np.zeros(256, dtype=np.float64)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e = (b >> 3) & 0xF
        m = b & 7
        if e == 0xF and m == 7:
            t[b] = math.nan
        elif e == 0:
            t[b] = s * (m / 8.0) * 2.0 ** -6
        else:
            t[b] = s * (1 + m / 8.0) * 2.0 ** (e - 7)
    return t


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def e8m0(name, b):
    import numpy as np
    u = np.frombuffer(b, dtype=np.uint8)
    if (u == 255).any():
        raise CheckpointError(f"{name}: E8M0 scale byte 255 (NaN)")
    return np.ldexp(1.0, u.astype(np.int32) - 127)


def decode_plain(name, dt, shape, b):
    import numpy as np
    if dt == "BF16":
        v = (np.frombuffer(b, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    elif dt == "F32":
        v = np.frombuffer(b, dtype="<f4").astype(np.float32)
    elif dt == "F16":
        v = np.frombuffer(b, dtype="<f2").astype(np.float32)
    elif dt == "I64":
        v = np.frombuffer(b, dtype="<i8").astype(np.int64)
    else:
        raise CheckpointError(f"{name}: unexpected dtype {dt} for an unquantized tensor")
    return v.reshape(shape)


def decode_fp8_block(name, w, s):
    """FP8 E4M3fn weight [out, in] with E8M0 scales [ceil(out/B), ceil(in/B)], B = BLOCK."""
    import numpy as np
    try:
        import torch
        torch.float8_e4m3fn
    except (ImportError, AttributeError):
        torch = None  # local checks without torch (reference/README.md)
    (wdt, wshape, wb), (sdt, sshape, sb) = w, s
    if wdt != "F8_E4M3" or sdt != "F8_E8M0" or len(wshape) != 2 or len(sshape) != 2:
        raise CheckpointError(f"{name}: want F8_E4M3 [out,in] + F8_E8M0 scale, got {wdt}{wshape} + {sdt}{sshape}")
    rows, cols = wshape
    bo = bi = BLOCK
    if tuple(sshape) != (-(-rows // bo), -(-cols // bi)):
        raise CheckpointError(f"{name}: scale shape {sshape}, want [{-(-rows // bo)}, {-(-cols // bi)}] "
                              f"for weight {wshape} in {BLOCK}x{BLOCK} blocks")
    q = np.frombuffer(wb, dtype=np.uint8).reshape(rows, cols)
    vals = E4M3_TABLE[q]
    if torch is not None:  # cross-check against torch's own float8_e4m3fn decoding
        tv = torch.frombuffer(bytearray(wb), dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
        if not np.array_equal(vals.astype(np.float32).reshape(-1), tv.reshape(-1), equal_nan=True):
            raise CheckpointError(f"{name}: own E4M3 decoder disagrees with torch.float8_e4m3fn")
    if np.isnan(vals).any():
        raise CheckpointError(f"{name}: E4M3 NaN code in weight")
    sc = e8m0(name, sb).reshape(sshape)
    sc = np.repeat(np.repeat(sc, bo, axis=0), bi, axis=1)[:rows, :cols]
    return (vals * sc).astype(np.float32), bo


def decode_mxfp4(name, w, s):
    """MXFP4 weight stored I8/U8 [out, in/2] (low nibble = even element), E8M0 scale [out, in/32]."""
    import numpy as np
    (wdt, wshape, wb), (sdt, sshape, sb) = w, s
    if wdt not in ("I8", "U8") or sdt != "F8_E8M0" or len(wshape) != 2:
        raise CheckpointError(f"{name}: want I8 [out,in/2] + F8_E8M0 scale, got {wdt}{wshape} + {sdt}{sshape}")
    rows, half = wshape
    cols = 2 * half
    if tuple(sshape) != (rows, cols // 32) or cols % 32:
        raise CheckpointError(f"{name}: scale shape {sshape}, want [{rows}, {cols // 32}]")
    p = np.frombuffer(wb, dtype=np.uint8).reshape(rows, half)
    codes = np.empty((rows, cols), dtype=np.uint8)
    codes[:, 0::2] = p & 15
    codes[:, 1::2] = p >> 4
    vals = np.asarray(E2M1, dtype=np.float64)[codes]
    sc = np.repeat(e8m0(name, sb).reshape(sshape), 32, axis=1)
    return (vals * sc).astype(np.float32)


E4M3_TABLE = None
BLOCK = 128  # FP8 weight block edge; set from config.json quantization_config.weight_block_size


# ---------------------------------------------------------------------------
# checkpoint name -> transformers parameter name
# ---------------------------------------------------------------------------

# Per-layer suffix rules: checkpoint suffix (after "layers.{i}.") -> HF suffix
# (after "model.layers.{i}."). Quantized weights appear here by their ".weight"
# name; their ".scale" is consumed with them.
LAYER_RULES = [
    ("attn_norm.weight", "input_layernorm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("hc_attn_fn", "attn_hc.fn"),
    ("hc_attn_base", "attn_hc.base"),
    ("hc_attn_scale", "attn_hc.scale"),
    ("hc_ffn_fn", "ffn_hc.fn"),
    ("hc_ffn_base", "ffn_hc.base"),
    ("hc_ffn_scale", "ffn_hc.scale"),
    ("attn.attn_sink", "self_attn.sinks"),
    ("attn.wq_a.weight", "self_attn.q_a_proj.weight"),
    ("attn.q_norm.weight", "self_attn.q_a_norm.weight"),
    ("attn.wq_b.weight", "self_attn.q_b_proj.weight"),
    ("attn.wkv.weight", "self_attn.kv_proj.weight"),
    ("attn.kv_norm.weight", "self_attn.kv_norm.weight"),
    ("attn.wo_a.weight", "self_attn.o_a_proj.weight"),
    ("attn.wo_b.weight", "self_attn.o_b_proj.weight"),
    ("attn.compressor.wkv.weight", "self_attn.compressor.kv_proj.weight"),
    ("attn.compressor.wgate.weight", "self_attn.compressor.gate_proj.weight"),
    ("attn.compressor.ape", "self_attn.compressor.position_bias"),
    ("attn.compressor.norm.weight", "self_attn.compressor.kv_norm.weight"),
    ("attn.indexer.wq_b.weight", "self_attn.compressor.indexer.q_b_proj.weight"),
    ("attn.indexer.weights_proj.weight", "self_attn.compressor.indexer.scorer.weights_proj.weight"),
    ("attn.indexer.compressor.wkv.weight", "self_attn.compressor.indexer.kv_proj.weight"),
    ("attn.indexer.compressor.wgate.weight", "self_attn.compressor.indexer.gate_proj.weight"),
    ("attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias"),
    ("attn.indexer.compressor.norm.weight", "self_attn.compressor.indexer.kv_norm.weight"),
    ("ffn.gate.weight", "mlp.gate.weight"),
    ("ffn.gate.bias", "mlp.gate.e_score_correction_bias"),
    ("ffn.gate.tid2eid", "mlp.gate.tid2eid"),
    ("ffn.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"),
    ("ffn.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"),
    ("ffn.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"),
    # routed experts: stacked, see EXPERT_RE
]
GLOBAL_RULES = [
    ("embed.weight", "model.embed_tokens.weight"),
    ("head.weight", "lm_head.weight"),
    ("norm.weight", "model.norm.weight"),
    ("hc_head_fn", "model.hc_head.hc_fn"),
    ("hc_head_base", "model.hc_head.hc_base"),
    ("hc_head_scale", "model.hc_head.hc_scale"),
]
EXPERT_RE = re.compile(r"^layers\.(\d+)\.ffn\.experts\.(\d+)\.(w1|w2|w3)\.weight$")
LAYER_RE = re.compile(r"^layers\.(\d+)\.(.+)$")
# gate_up_proj[e] = cat(w1, w3) along the output dim: the HF experts module splits
# its gate_up output with chunk(2) into (gate, up) = (w1 x, w3 x). Verified
# numerically by check_expert_order() below, not assumed.


def build_state_dict(tensors, n_layers, n_experts, mapping_log):
    """Dequantizes every tensor and maps it to HF names. Every non-MTP tensor must be
    consumed exactly once."""
    import numpy as np
    import torch
    used = set()
    sd = {}
    block_sizes = set()

    def weight(name):
        if name not in tensors:
            raise CheckpointError(f"missing tensor {name}")
        used.add(name)
        dt, shape, b = tensors[name]
        sname = name[: -len(".weight")] + ".scale" if name.endswith(".weight") else None
        if sname and sname in tensors:
            used.add(sname)
            if dt == "F8_E4M3":
                v, bs = decode_fp8_block(name, tensors[name], tensors[sname])
                block_sizes.add(bs)
                return v, "fp8-block"
            return decode_mxfp4(name, tensors[name], tensors[sname]), "mxfp4"
        if dt in ("F8_E4M3", "I8", "U8"):
            raise CheckpointError(f"{name}: quantized dtype {dt} but no {sname}")
        return decode_plain(name, dt, shape, b), dt

    for ck, hf in GLOBAL_RULES:
        v, how = weight(ck)
        sd[hf] = torch.from_numpy(np.ascontiguousarray(v))
        mapping_log.append([ck, hf, how])
    experts = {}
    for name in sorted(tensors):
        if name in used or name.startswith("mtp."):
            continue
        m = EXPERT_RE.match(name)
        if m:
            li, e, w = int(m.group(1)), int(m.group(2)), m.group(3)
            v, how = weight(name)
            experts.setdefault(li, {})[(e, w)] = v
            if li == 1 and e == 0:
                mapping_log.append([name, f"model.layers.{li}.mlp.experts." +
                                    {"w1": "gate_up_proj[e, :I, :]", "w3": "gate_up_proj[e, I:, :]",
                                     "w2": "down_proj[e]"}[w], how])
            continue
        m = LAYER_RE.match(name)
        if not m or name.endswith(".scale") and name[: -len(".scale")] + ".weight" in tensors:
            continue  # scales are consumed with their weight; anything else is reported below
        li, suffix = int(m.group(1)), m.group(2)
        for ck, hf in LAYER_RULES:
            if suffix == ck:
                v, how = weight(name)
                key = f"model.layers.{li}.{hf}"
                t = torch.from_numpy(np.ascontiguousarray(v))
                sd[key] = t
                if li <= 3:
                    mapping_log.append([name, key, how])
                break
    for li, d in sorted(experts.items()):
        w1 = [d.get((e, "w1")) for e in range(n_experts)]
        w3 = [d.get((e, "w3")) for e in range(n_experts)]
        w2 = [d.get((e, "w2")) for e in range(n_experts)]
        if any(x is None for x in w1 + w2 + w3) or len(d) != 3 * n_experts:
            raise CheckpointError(f"layer {li}: routed experts incomplete ({len(d)} of {3 * n_experts} tensors)")
        sd[f"model.layers.{li}.mlp.experts.gate_up_proj"] = torch.from_numpy(
            np.stack([np.concatenate([a, b], axis=0) for a, b in zip(w1, w3)]))
        sd[f"model.layers.{li}.mlp.experts.down_proj"] = torch.from_numpy(np.stack(w2))
    unused = sorted(n for n in tensors if n not in used and not n.startswith("mtp."))
    if unused:
        raise CheckpointError(f"{len(unused)} checkpoint tensors have no HF mapping: {unused[:20]}")
    skipped = sorted(n for n in tensors if n.startswith("mtp."))
    return sd, skipped, block_sizes


# ---------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------

def layer_kinds(hub):
    n = hub["num_hidden_layers"]
    ratios = hub["compress_ratios"][:n]
    kinds = []
    for r in ratios:
        kinds.append("sliding_attention" if r == 0 else
                     "compressed_sparse_attention" if r == 4 else "heavily_compressed_attention")
    csa = sorted({r for r in ratios if r == 4})
    hca = sorted({r for r in ratios if r not in (0, 4)})
    if len(hca) > 1:
        raise CheckpointError(f"HF supports one HCA ratio per model, config has {hca}")
    return kinds, (csa[0] if csa else 4), (hca[0] if hca else 128)


def make_hf_config(hub, log):
    from transformers import DeepseekV4Config
    n = hub["num_hidden_layers"]
    kinds, csa_rate, hca_rate = layer_kinds(hub)
    n_hash = hub.get("num_hash_layers", 0)
    mlp_types = ["hash_moe" if i < n_hash else "moe" for i in range(n)]
    prf = hub["qk_rope_head_dim"] / hub["head_dim"]
    rs = hub.get("rope_scaling")
    main = {"rope_type": "default", "rope_theta": float(hub["rope_theta"]), "partial_rotary_factor": prf}
    if rs:
        comp = {"rope_type": "yarn", "rope_theta": float(hub["compress_rope_theta"]), "partial_rotary_factor": prf,
                "factor": float(rs["factor"]), "original_max_position_embeddings": int(rs["original_max_position_embeddings"]),
                "beta_fast": float(rs["beta_fast"]), "beta_slow": float(rs["beta_slow"]), "attention_factor": 1.0}
        # Some transformers releases derive the YaRN factor as max_position_embeddings /
        # original_max_position_embeddings; make that ratio equal the factor (true for
        # V4-Flash: 1048576/65536 = 16). Positions used here are far below either bound.
        max_pos = int(rs["factor"] * rs["original_max_position_embeddings"])
    else:
        comp = {"rope_type": "default", "rope_theta": float(hub["compress_rope_theta"]), "partial_rotary_factor": prf}
        max_pos = hub["max_position_embeddings"]
    common = dict(
        vocab_size=hub["vocab_size"], hidden_size=hub["hidden_size"], num_hidden_layers=n,
        num_attention_heads=hub["num_attention_heads"], num_key_value_heads=hub.get("num_key_value_heads", 1),
        head_dim=hub["head_dim"], q_lora_rank=hub["q_lora_rank"], o_groups=hub["o_groups"],
        o_lora_rank=hub["o_lora_rank"], sliding_window=hub["sliding_window"],
        rope_theta=float(hub["rope_theta"]), compress_rope_theta=float(hub["compress_rope_theta"]),
        max_position_embeddings=max_pos,
        index_n_heads=hub["index_n_heads"], index_head_dim=hub["index_head_dim"], index_topk=hub["index_topk"],
        n_routed_experts=hub["n_routed_experts"], num_experts_per_tok=hub["num_experts_per_tok"],
        n_shared_experts=hub["n_shared_experts"], moe_intermediate_size=hub["moe_intermediate_size"],
        scoring_func=hub["scoring_func"], norm_topk_prob=hub["norm_topk_prob"],
        routed_scaling_factor=float(hub["routed_scaling_factor"]), swiglu_limit=float(hub["swiglu_limit"]),
        hc_mult=hub["hc_mult"], hc_sinkhorn_iters=hub["hc_sinkhorn_iters"], hc_eps=float(hub["hc_eps"]),
        rms_norm_eps=float(hub["rms_norm_eps"]), hidden_act=hub.get("hidden_act", "silu"),
        attention_bias=False, tie_word_embeddings=False,
        bos_token_id=hub.get("bos_token_id", 0), eos_token_id=hub.get("eos_token_id", 1),
        num_nextn_predict_layers=hub.get("num_nextn_predict_layers", 0),
    )
    variants = [
        ("modern", dict(layer_types=kinds, mlp_layer_types=mlp_types,
                        compress_rates={"compressed_sparse_attention": csa_rate,
                                        "heavily_compressed_attention": hca_rate},
                        partial_rotary_factor=prf, rope_parameters={"main": main, "compress": comp})),
        ("legacy", dict(layer_types=kinds, num_hash_layers=n_hash, compress_rate_csa=csa_rate,
                        compress_rate_hca=hca_rate, qk_rope_head_dim=hub["qk_rope_head_dim"],
                        rope_scaling={k: v for k, v in comp.items() if k not in ("rope_theta", "partial_rotary_factor")})),
    ]
    errors = []
    for vname, extra in variants:
        try:
            cfg = DeepseekV4Config(**copy.deepcopy(common), **copy.deepcopy(extra))
        except Exception as e:  # noqa: BLE001
            errors.append(f"{vname}: {type(e).__name__}: {e}")
            continue
        cfg._attn_implementation = "eager"
        log(f"config built with the {vname} keyword set")
        return cfg, dict(common, **extra), vname
    raise CheckpointError("could not build DeepseekV4Config: " + " | ".join(errors))


def expected_inv_freq(dim, base, yarn):
    """RoPE frequencies per dsv4-flash.md §4.6, written independently of transformers."""
    import torch
    theta = [base ** (-2.0 * i / dim) for i in range(dim // 2)]
    if not yarn:
        return torch.tensor(theta, dtype=torch.float64)
    factor, orig, bf, bs = yarn

    def d(r):
        return dim * math.log(orig / (2 * math.pi * r)) / (2 * math.log(base))
    lo = max(math.floor(d(bf)), 0)
    hi = min(math.ceil(d(bs)), dim - 1)
    if lo == hi:
        hi += 0.001
    out = []
    for i, t in enumerate(theta):
        ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)
        out.append(t / factor * ramp + t * (1 - ramp))
    return torch.tensor(out, dtype=torch.float64)


def check_model_structure(model, hub, log):
    """Fails unless every layer has the attention/compressor/router type and rates the
    checkpoint asks for, and every RoPE table matches §4.6."""
    import torch
    n = hub["num_hidden_layers"]
    ratios = hub["compress_ratios"][:n]
    n_hash = hub.get("num_hash_layers", 0)
    problems = []
    for i, layer in enumerate(model.model.layers):
        comp = layer.self_attn.compressor
        r = ratios[i]
        if r == 0:
            if comp is not None:
                problems.append(f"layer {i}: want no compressor, got {type(comp).__name__}")
        else:
            want = "DeepseekV4CSACompressor" if r == 4 else "DeepseekV4HCACompressor"
            if comp is None or type(comp).__name__ != want or comp.compress_rate != r:
                problems.append(f"layer {i}: want {want} rate {r}, got {type(comp).__name__ if comp else None} "
                                f"rate {getattr(comp, 'compress_rate', None)}")
            if r == 4 and comp.indexer.compress_rate != 4:
                problems.append(f"layer {i}: indexer rate {comp.indexer.compress_rate}")
        gate = layer.mlp.gate
        want = "DeepseekV4HashRouter" if i < n_hash else "DeepseekV4TopKRouter"
        if type(gate).__name__ != want:
            problems.append(f"layer {i}: want {want}, got {type(gate).__name__}")
        if layer.self_attn.sliding_window != hub["sliding_window"]:
            problems.append(f"layer {i}: sliding_window {layer.self_attn.sliding_window}")
    rd = hub["qk_rope_head_dim"]
    rs = hub.get("rope_scaling")
    want = {
        "main": expected_inv_freq(rd, float(hub["rope_theta"]), None),
        "compress": expected_inv_freq(rd, float(hub["compress_rope_theta"]),
                                      (rs["factor"], rs["original_max_position_embeddings"], rs["beta_fast"],
                                       rs["beta_slow"]) if rs else None),
    }
    n_rot = 0
    for mname, mod in model.named_modules():
        if type(mod).__name__ != "DeepseekV4RotaryEmbedding":
            continue
        for lt in ("main", "compress"):
            got = getattr(mod, f"{lt}_inv_freq").double().cpu()
            if got.shape != want[lt].shape or not torch.allclose(got, want[lt], rtol=2e-7, atol=0):
                problems.append(f"{mname}: {lt} inv_freq {got.tolist()} != spec {want[lt].tolist()}")
            sc = getattr(mod, f"{lt}_attention_scaling")
            if float(sc) != 1.0:
                problems.append(f"{mname}: {lt} attention_scaling {sc} != 1")
        n_rot += 1
    if problems:
        raise CheckpointError("model structure differs from the checkpoint config:\n  " + "\n  ".join(problems))
    log(f"structure ok: {n} layers, ratios {ratios}, {n_hash} hash layers, {n_rot} rotary tables match §4.6")


def disable_shared_clamp(model, log):
    """dsv4-flash.md §0a: DeepSeek's V4 code runs the shared expert as a plain SwiGLU.
    transformers' DeepseekV4MLP clamps gate (max) and up (both sides) at
    config.swiglu_limit; set that module's own limit to +inf (a no-op clamp). Routed
    experts keep their clamp. Verified numerically below."""
    import torch
    import torch.nn.functional as F
    how = None
    for i, layer in enumerate(model.model.layers):
        mlp = layer.mlp.shared_experts
        if hasattr(mlp, "limit"):
            mlp.limit = math.inf
            how = "set DeepseekV4MLP.limit = inf on every mlp.shared_experts"
        else:
            def plain(self, x):
                return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
            mlp.forward = types.MethodType(plain, mlp)
            how = "patched mlp.shared_experts.forward with a plain SwiGLU"
        # verify on inputs large enough that a clamp at swiglu_limit would bite
        g = torch.Generator().manual_seed(i)
        x = torch.randn(64, mlp.gate_proj.weight.shape[1], generator=g) * 40
        with torch.no_grad():
            got = mlp(x)
            gate, up = F.linear(x, mlp.gate_proj.weight), F.linear(x, mlp.up_proj.weight)
            want = F.linear(F.silu(gate) * up, mlp.down_proj.weight)
            lim = model.config.swiglu_limit
            clamped = F.linear(F.silu(gate.clamp(max=lim)) * up.clamp(-lim, lim), mlp.down_proj.weight)
        if not torch.allclose(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max())):
            raise CheckpointError(f"layer {i}: shared expert still differs from a plain SwiGLU after '{how}'")
        if torch.allclose(want, clamped):
            raise CheckpointError(f"layer {i}: clamp check is vacuous (inputs never exceed the limit)")
        if getattr(layer.mlp.experts, "limit", None) != model.config.swiglu_limit:
            raise CheckpointError(f"layer {i}: routed experts' clamp is {getattr(layer.mlp.experts, 'limit', None)}")
    log(f"shared-expert clamp off: {how}; verified against plain SwiGLU on |x|~40 inputs")
    return how


def check_expert_order(model, tensors, log):
    """Runs one routed expert of layer 0 through HF's experts module and through a
    direct formula on the checkpoint's own w1/w3/w2 (clamp per §4.7); they must agree,
    which pins the w1/w3 order inside gate_up_proj."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    exp = model.model.layers[0].mlp.experts
    lim = model.config.swiglu_limit

    def deq(n):
        v, _ = (decode_fp8_block(n, tensors[n], tensors[n[:-7] + ".scale"]) if tensors[n][0] == "F8_E4M3"
                else (decode_mxfp4(n, tensors[n], tensors[n[:-7] + ".scale"]), None))
        return torch.from_numpy(np.ascontiguousarray(v))
    for e in (0, exp.gate_up_proj.shape[0] - 1):
        w1, w3, w2 = (deq(f"layers.0.ffn.experts.{e}.{w}.weight") for w in ("w1", "w3", "w2"))
        x = torch.randn(16, w1.shape[1], generator=torch.Generator().manual_seed(e)) * 3
        idx = torch.full((16, 1), e, dtype=torch.long)
        wts = torch.ones(16, 1)
        with torch.no_grad():
            got = exp(x, idx, wts)
            want = F.linear(F.silu(F.linear(x, w1).clamp(max=lim)) * F.linear(x, w3).clamp(-lim, lim), w2)
            swapped = F.linear(F.silu(F.linear(x, w3).clamp(max=lim)) * F.linear(x, w1).clamp(-lim, lim), w2)
        if not torch.allclose(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max())):
            raise CheckpointError(f"expert {e}: HF experts != silu(clamp(w1 x)) * clamp(w3 x) through w2; "
                                  f"matches swapped order: {torch.allclose(got, swapped, rtol=1e-5, atol=1e-5)}")
    log("routed expert order ok: gate_up_proj[e] = [w1; w3], clamp on routed experts active")


# ---------------------------------------------------------------------------
# running cases
# ---------------------------------------------------------------------------

def tokens_for(seed, n, lo=3, hi=259):
    """Deterministic token ids in [lo, hi): splitmix64 of (seed, i)."""
    out = []
    x = seed & (2 ** 64 - 1)
    for _ in range(n):
        x = (x + 0x9E3779B97F4A7C15) & (2 ** 64 - 1)
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2 ** 64 - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2 ** 64 - 1)
        z ^= z >> 31
        out.append(lo + z % (hi - lo))
    return out


class IndexerRecorder:
    """Records, per CSA layer and query position, the entries HF's lightning indexer
    selected and the score margin between the weakest selected and the strongest
    eligible unselected entry (a small margin means a near-tie, design.md §6)."""

    def __init__(self, model):
        self.records = None
        self.errors = []
        self.handles = []
        self.pending = {}
        for i, layer in enumerate(model.model.layers):
            comp = layer.self_attn.compressor
            if comp is None or not hasattr(comp, "indexer"):
                continue
            ind = comp.indexer
            self.handles.append(ind.scorer.register_forward_hook(self._score_hook(i)))
            self.handles.append(ind.register_forward_hook(self._sel_hook(i, ind.compress_rate), with_kwargs=True))

    def start(self):
        self.records = {}

    def stop(self):
        r, self.records = self.records, None
        return r

    def _score_hook(self, li):
        def hook(mod, args, out):
            self.pending[li] = out.detach().double().cpu()
        return hook

    def _sel_hook(self, li, rate):
        def hook(mod, args, kwargs, out):
            if self.records is None:
                return
            try:
                self._record(li, rate, args, kwargs, out)
            except Exception as e:  # noqa: BLE001  (recording must never change the run)
                self.errors.append(f"layer {li}: {type(e).__name__}: {e}")
        return hook

    def _record(self, li, rate, args, kwargs, out):
        pos = args[2] if len(args) > 2 else kwargs["position_ids"]
        scores = self.pending.pop(li)[0]
        sel = out.detach().cpu()[0]
        for q, t in enumerate(pos[0].tolist()):
            eligible = (t + 1) // rate
            chosen = sorted(int(s) for s in sel[q].tolist() if s >= 0)
            margin = None
            rest = [s for s in range(min(eligible, scores.shape[-1])) if s not in chosen]
            if chosen and rest:
                margin = float(min(scores[q, s] for s in chosen) - max(scores[q, s] for s in rest))
            self.records.setdefault(str(li), {})[t] = {"selected": chosen, "eligible": eligible,
                                                         "margin": margin}


def make_cache(model, log, first=[True]):
    from transformers.cache_utils import DynamicCache
    cache = DynamicCache(config=model.config)
    mod = sys.modules[type(model).__module__]
    want = {"compressed_sparse_attention": "DeepseekV4CSACache", "heavily_compressed_attention": "DeepseekV4HCACache"}
    layers = getattr(cache, "layers", None)
    ok = layers is not None and len(layers) == model.config.num_hidden_layers and all(
        type(l).__name__ == want[t] for l, t in zip(layers, model.config.layer_types) if t in want)
    if not ok:
        from transformers.cache_utils import DynamicSlidingWindowLayer
        built = []
        for t in model.config.layer_types:
            if t in want:
                built.append(getattr(mod, want[t])(model.config))
            else:
                built.append(DynamicSlidingWindowLayer(sliding_window=model.config.sliding_window))
        cache.layers = built
    if first[0]:
        log(f"cache layers ({'DynamicCache(config) as is' if ok else 'built by hand'}): "
            f"{[type(l).__name__ for l in cache.layers]}")
        first[0] = False
    return cache


def run_uncached(model, toks):
    import torch
    with torch.no_grad():
        out = model(input_ids=torch.tensor([toks], dtype=torch.long), use_cache=False)
    return out.logits[0].float().cpu().numpy()


def run_chunks(model, toks, chunks, log):
    """Runs toks through the cache in the given chunk sizes (sum = len(toks))."""
    import numpy as np
    import torch
    assert sum(chunks) == len(toks)
    cache = make_cache(model, log)
    rows = []
    at = 0
    with torch.no_grad():
        for c in chunks:
            out = model(input_ids=torch.tensor([toks[at:at + c]], dtype=torch.long), past_key_values=cache,
                        use_cache=True)
            cache = out.past_key_values
            rows.append(out.logits[0].float().cpu().numpy())
            at += c
    return np.concatenate(rows, axis=0)


def run_case(model, rec, name, toks, chunks, save, indexer, log):
    """Runs one case; returns its cases.json entry and writes its .npy files."""
    import numpy as np
    T = len(toks)
    layer_out = []
    hooks = []
    if name == "short6":  # per-layer residual streams, to localise a mismatch
        for layer in model.model.layers:
            hooks.append(layer.register_forward_hook(
                lambda m, a, o: layer_out.append((o[0] if isinstance(o, tuple) else o).detach().float().cpu().numpy())))
    try:
        rec.start()
        full = run_uncached(model, toks)
        sel_full = rec.stop()
    finally:
        for h in hooks:
            h.remove()
    entry = {"name": name, "tokens": toks}
    if layer_out:
        # [layers, T, hc_mult, hidden]: the hyper-connection streams after each decoder layer
        entry["layer_outputs"] = save(name + "_layers.npy", np.stack([x[0] for x in layer_out]))
    if chunks is None:
        rec.start()
        cached = run_chunks(model, toks, [T], log)
        rec.stop()
        entry.update(prefill=T, logits=save(name + ".npy", full))
        entry["uncached_vs_cached_max_rel_diff"] = max_rel_diff(cached, full)
        entry["note"] = "logits from one uncached prefill; the diff is against a cached prefill of the same tokens"
        indexer[name] = {"uncached": sel_full}
    else:
        rec.start()
        cached = run_chunks(model, toks, chunks, log)
        sel_cached = rec.stop()
        entry.update(prefill=chunks[0], logits=save(name + ".npy", cached))
        if any(c != 1 for c in chunks[1:]):
            entry["chunks"] = chunks
        entry["uncached_logits"] = save(name + "_uncached.npy", full)
        entry["uncached_vs_cached_max_rel_diff"] = max_rel_diff(cached, full)
        per_pos = np.abs(cached - full).max(axis=1) / max(np.abs(full).max(), 1e-30)
        entry["rows_rel_diff_over_1e-5"] = [int(i) for i in np.nonzero(per_pos > 1e-5)[0]]
        differ = []
        for li, d in sel_full.items():
            for t, r in d.items():
                c = sel_cached.get(li, {}).get(t)
                if c is None or c["selected"] != r["selected"]:
                    differ.append({"layer": int(li), "pos": t, "uncached": r["selected"],
                                   "cached": c and c["selected"], "margin": r["margin"]})
        entry["indexer_selection_differs"] = differ
        indexer[name] = {"uncached": sel_full, "cached": sel_cached}
    margins = [r["margin"] for d in sel_full.values() for r in d.values() if r["margin"] is not None]
    entry["indexer_min_margin"] = min(margins) if margins else None
    log(f"case {name}: T={T} chunks={chunks or [T]} rel diff cached/uncached "
        f"{entry['uncached_vs_cached_max_rel_diff']:.3g}; min indexer margin {entry['indexer_min_margin']}; "
        f"logit range [{float(full.min()):.3f}, {float(full.max()):.3f}]")
    return entry


def max_rel_diff(a, b):
    import numpy as np
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def dump_hf_src(path, transformers):
    """Copies the installed deepseek_v4 sources (and the helpers they lean on) into a
    .tgz, so that the exact code the goldens came from can be read."""
    import tarfile
    import transformers.models.deepseek_v4 as dsm
    root = os.path.dirname(transformers.__file__)
    with tarfile.open(path, "w:gz") as tf:
        tf.add(os.path.dirname(dsm.__file__), arcname="deepseek_v4")
        for f in ("cache_utils.py", "modeling_rope_utils.py", "masking_utils.py", "configuration_utils.py",
                  "integrations/moe.py"):
            if os.path.exists(os.path.join(root, f)):
                tf.add(os.path.join(root, f), arcname=f.replace("/", "_"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=20261130, help="token seed (case k uses seed + k)")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--keep-going", action="store_true",
                    help="log failed checks and cases and go on (debugging only; output is then not a golden set)")
    ap.add_argument("--dump-hf-src", help="write the installed deepseek_v4 sources to this .tgz (for reading)")
    args = ap.parse_args()

    import numpy as np
    import torch
    import transformers
    global E4M3_TABLE
    E4M3_TABLE = e4m3fn_table()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    os.makedirs(args.out, exist_ok=True)
    lines = []

    def log(msg):
        print(msg, flush=True)
        lines.append(msg)

    log(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"numpy {np.__version__}")
    if args.dump_hf_src:
        try:
            dump_hf_src(args.dump_hf_src, transformers)
            log(f"dumped HF sources to {args.dump_hf_src}")
        except Exception as e:  # noqa: BLE001
            log(f"could not dump HF sources: {e}")

    hub, tensors = read_checkpoint(args.checkpoint)
    global BLOCK
    wbs = (hub.get("quantization_config") or {}).get("weight_block_size", [128, 128])
    if len(wbs) != 2 or wbs[0] != wbs[1]:
        raise CheckpointError(f"config.json: weight_block_size {wbs}, want a square block")
    BLOCK = int(wbs[0])
    ckpt_files = {f: hashlib.sha256(open(os.path.join(args.checkpoint, f), "rb").read()).hexdigest()
                  for f in sorted(os.listdir(args.checkpoint)) if os.path.isfile(os.path.join(args.checkpoint, f))}
    log(f"checkpoint {args.checkpoint}: {len(tensors)} tensors, "
        f"{sum(len(t[2]) for t in tensors.values())} bytes, synthetic={hub.get('moxie_synthetic')}")

    from transformers import DeepseekV4ForCausalLM
    cfg, cfg_kwargs, cfg_variant = make_hf_config(hub, log)
    model = DeepseekV4ForCausalLM(cfg).float().eval()
    model.config._attn_implementation = "eager"

    mapping = []
    sd, skipped, block_sizes = build_state_dict(tensors, hub["num_hidden_layers"], hub["n_routed_experts"], mapping)
    log(f"dequantized {len(sd)} HF tensors; skipped {len(skipped)} mtp.* tensors; FP8 block edge(s) {sorted(block_sizes)}")
    own = model.state_dict()
    log("HF state_dict:")
    for k, v in own.items():
        log(f"  {k} {list(v.shape)} {str(v.dtype).replace('torch.', '')}")
    bad_shape = [f"{k}: ckpt {list(sd[k].shape)} vs HF {list(own[k].shape)}" for k in sd if k in own and
                 sd[k].shape != own[k].shape]
    unexpected = sorted(set(sd) - set(own))
    missing = sorted(set(own) - set(sd))
    if bad_shape or unexpected or missing:
        raise CheckpointError(f"state_dict mismatch:\n  shapes {bad_shape}\n  not in HF {unexpected}\n"
                              f"  not filled {missing}")
    for k in sd:
        if own[k].dtype == torch.long:
            sd[k] = sd[k].to(torch.long)
        elif sd[k].dtype != torch.float32:
            raise CheckpointError(f"{k}: decoded as {sd[k].dtype}, want float32")
    model.load_state_dict(sd, strict=True)
    for k, v in model.state_dict().items():  # every value landed bit-exactly
        if not torch.equal(v, sd[k].to(v.dtype)):
            raise CheckpointError(f"{k}: loaded value differs from the decoded tensor")
    log("all HF parameters and persistent buffers loaded from the checkpoint (strict)")

    failures = []

    def check(fn, *a):
        try:
            return fn(*a)
        except Exception as e:  # noqa: BLE001
            if not args.keep_going:
                raise
            import traceback
            log(f"CHECK FAILED ({fn.__name__}): {type(e).__name__}: {e}\n{traceback.format_exc()}")
            failures.append(fn.__name__)
    check(check_model_structure, model, hub, log)
    clamp_how = check(disable_shared_clamp, model, log)
    check(check_expert_order, model, tensors, log)

    rec = IndexerRecorder(model)
    cases = []
    indexer = {}

    def save(name, arr):
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        np.save(os.path.join(args.out, name), arr)
        return name

    specs = [
        ("prefill40", 40, None),
        ("decode17x23", 40, [17] + [1] * 23),
        ("short6", 6, None),
        ("prefill64", 64, None),
        ("chunked13_11_16", 40, [13, 11, 16]),
    ]
    for k, (name, T, chunks) in enumerate(specs):
        toks = tokens_for(args.seed + k, T)
        try:
            entry = run_case(model, rec, name, toks, chunks, save, indexer, log)
        except Exception as e:  # noqa: BLE001
            if not args.keep_going:
                raise
            import traceback
            log(f"CASE FAILED {name}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
            failures.append(name)
            continue
        cases.append(entry)

    if rec.errors:
        log(f"indexer recording errors: {rec.errors[:5]}")
        failures.append("indexer-recording")
    with open(os.path.join(args.out, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1)
    with open(os.path.join(args.out, "indexer.json"), "w") as f:
        json.dump(indexer, f, separators=(",", ":"))
    meta = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
        "numpy": np.__version__, "checkpoint_sha256": ckpt_files, "checkpoint_config": hub, "hf_config_kwargs": cfg_kwargs,
        "hf_config_variant": cfg_variant, "dtype": "float32", "attn_implementation": "eager", "device": "cpu",
        "shared_expert_clamp": clamp_how, "mtp_tensors_skipped": len(skipped),
        "mapping_layers_0_to_3_and_globals": mapping, "token_seed": args.seed,
        "failures": failures, "log": lines,
    }
    with open(os.path.join(args.out, "oracle_meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    log(f"wrote {len(cases)} cases to {args.out}")
    if failures:
        log(f"FAILED: {failures} (not a golden set)")
        sys.exit(3)


if __name__ == "__main__":
    try:
        main()
    except CheckpointError as e:
        print(f"oracle: {e}", file=sys.stderr)
        sys.exit(2)
