#!/usr/bin/env python3
"""Trains moxie's miniature DeepSeek-V4 on the Brown corpus (issue 8).

Two modes:

  train  DATA_DIR OUT_DIR   trains a byte-level BPE tokenizer and an 8-layer,
                            32-expert DeepseekV4ForCausalLM (every V4 block type)
                            on DATA_DIR/train.txt, measures held-out perplexity on
                            DATA_DIR/heldout.txt, and writes OUT_DIR/hf/ (config.json,
                            model.safetensors, tokenizer files) for `moxie import-hf`,
                            plus OUT_DIR/{train.log, loss.csv, loss.png, metrics.json}.
  eval   DATA_DIR CKPT_DIR  measures held-out perplexity of a checkpoint in the
                            shipped layout (e.g. the `moxie import-hf` output), with
                            its weights dequantized exactly by reference/oracle.py's
                            decoders, in transformers (same windows as `train`).

DATA_DIR comes from training/brown.sh. Needs torch, transformers >= 5.17 (with
models/deepseek_v4), tokenizers, numpy; matplotlib is optional (else only
loss.csv). The model and config are built with reference/oracle.py's own,
verified functions (make_hf_config, check_model_structure,
disable_shared_clamp), so the trained model is the `exact` target moxie runs:
the shared expert is a plain SwiGLU, routed experts keep the clamp.

Run from the repository root; see training/README.md for the exact commands.
"""

import argparse
import csv
import json
import math
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import oracle  # noqa: E402  (reference/oracle.py: config building, decoders, checks)

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
# ids 0, 1, 2, then the chat tokens moxie's encoder needs (checkpoint/tinytok.go
# has the same tokens; here they come right after PAD, before the byte alphabet)
SPECIAL = [BOS, EOS, PAD, "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"]


# ---------------------------------------------------------------------------
# configuration (hub form, as dsv4/config.Config.HubJSON writes it)
# ---------------------------------------------------------------------------

def mini_hub(vocab):
    """The miniature in the hub config.json form that oracle.make_hf_config reads.

    8 layers: window-only (0, 1), CSA ratio 4 with a 12-head indexer (2, 4, 6),
    HCA ratio 16 (3, 5, 7); hash routing on layers 0-2; 4 HC streams; 32 routed
    experts (top 4) with the SwiGLU clamp at 10; one shared expert; YaRN on the
    compressed layers. About 88.8M parameters at vocab 8192 (87.3M at 6144).
    """
    return {
        "model_type": "deepseek_v4", "vocab_size": vocab, "hidden_size": 384, "num_hidden_layers": 8,
        "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 64, "qk_rope_head_dim": 16,
        "q_lora_rank": 192, "o_groups": 4, "o_lora_rank": 96, "sliding_window": 64,
        "compress_ratios": [0, 0, 4, 16, 4, 16, 4, 16],
        "rope_theta": 10000.0, "compress_rope_theta": 160000.0, "max_position_embeddings": 4096,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                         "beta_fast": 32.0, "beta_slow": 1.0},
        "index_n_heads": 12, "index_head_dim": 32, "index_topk": 16,
        "n_routed_experts": 32, "num_experts_per_tok": 4, "n_shared_experts": 1, "moe_intermediate_size": 256,
        "num_hash_layers": 3, "scoring_func": "sqrtsoftplus", "norm_topk_prob": True,
        "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "hc_mult": 4, "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6, "rms_norm_eps": 1e-6, "num_nextn_predict_layers": 0, "hidden_act": "silu",
        "bos_token_id": 0, "eos_token_id": 1,
    }


# ---------------------------------------------------------------------------
# data and tokenizer
# ---------------------------------------------------------------------------

def read_docs(path):
    """Documents of a brown.sh file: separated by an empty line."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return [d.strip("\n") + "\n" for d in text.split("\n\n") if d.strip()]


def train_tokenizer(docs, vocab_size, log):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer)
    for i, s in enumerate(SPECIAL):
        if tok.token_to_id(s) != i:
            raise SystemExit(f"tokenizer: special token {s!r} has id {tok.token_to_id(s)}, want {i}")
    log(f"tokenizer: byte-level BPE, {tok.get_vocab_size()} tokens (asked {vocab_size}), specials {SPECIAL}")
    return tok


def tokenizer_config():
    return {"add_bos_token": False, "add_eos_token": False, "bos_token": BOS, "eos_token": EOS,
            "pad_token": PAD, "legacy": True, "model_max_length": 4096,
            "tokenizer_class": "PreTrainedTokenizerFast"}


def encode_stream(tok, docs):
    """[BOS] doc [EOS] for every document, concatenated."""
    out = []
    for enc in tok.encode_batch(docs):
        out.append(0)
        out.extend(enc.ids)
        out.append(1)
    return out


def heldout_ids(tok, data_dir):
    """The held-out text as one sequence: BOS, then the whole file's tokens."""
    with open(os.path.join(data_dir, "heldout.txt"), encoding="utf-8") as f:
        text = f.read()
    return [0] + tok.encode(text).ids


# ---------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------

def build_model(hub, experts_impl, seed, log):
    """DeepseekV4ForCausalLM from the hub config via oracle.make_hf_config, float32,
    eager attention, with hash tables filled and the shared-expert clamp off."""
    import torch
    from transformers import DeepseekV4ForCausalLM
    cfg, cfg_kwargs, variant = oracle.make_hf_config(hub, log)
    torch.manual_seed(seed)
    model = None
    if experts_impl:
        try:
            model = DeepseekV4ForCausalLM._from_config(cfg, experts_implementation=experts_impl)
        except Exception as e:  # noqa: BLE001
            log(f"_from_config(experts_implementation={experts_impl!r}) failed: {type(e).__name__}: {e}")
    if model is None:
        torch.manual_seed(seed)
        model = DeepseekV4ForCausalLM(cfg)
        if experts_impl and hasattr(model, "set_experts_implementation"):
            try:
                model.set_experts_implementation(experts_impl)
            except Exception as e:  # noqa: BLE001
                log(f"set_experts_implementation({experts_impl!r}) failed: {e}")
    model = model.float()
    model.config._attn_implementation = "eager"
    log(f"experts implementation: {getattr(model.config, '_experts_implementation', None)}")
    # Hash routing tables: transformers initialises tid2eid to zeros (every token to
    # expert 0 k times). Give each token k distinct experts, from a seeded generator.
    g = torch.Generator().manual_seed(seed + 1)
    k, E, V = hub["num_experts_per_tok"], hub["n_routed_experts"], hub["vocab_size"]
    for i, layer in enumerate(model.model.layers):
        gate = layer.mlp.gate
        if hasattr(gate, "tid2eid"):
            table = torch.rand(V, E, generator=g).argsort(dim=1)[:, :k].to(gate.tid2eid.dtype)
            with torch.no_grad():
                gate.tid2eid.copy_(table)
    oracle.check_model_structure(model, hub, log)
    clamp = oracle.disable_shared_clamp(model, log)
    n_params = sum(p.numel() for p in model.parameters())
    zero = [n for n, p in model.named_parameters() if p.detach().abs().max() == 0]
    log(f"model: {n_params / 1e6:.2f}M parameters; all-zero at init: {zero[:12]}{' ...' if len(zero) > 12 else ''}")
    return model, cfg_kwargs, variant, clamp, n_params


class LoadBalancer:
    """Auxiliary-loss-free balancing (DeepSeek-V3/V4): after each step, raise the
    score-correction bias of under-loaded experts and lower that of over-loaded
    ones by `rate`. Counts come from forward hooks on the top-k routers; if the
    router's output has no index tensor it stays off (logged)."""

    def __init__(self, model, k, rate, log):
        self.rate, self.k, self.counts, self.handles, self.gates = rate, k, {}, [], []
        if rate <= 0:
            return
        for i, layer in enumerate(model.model.layers):
            gate = layer.mlp.gate
            if hasattr(gate, "e_score_correction_bias") and not hasattr(gate, "tid2eid"):
                self.gates.append((i, gate))
                self.handles.append(gate.register_forward_hook(self._hook(i)))
        log(f"load balancing: bias update rate {rate} on {len(self.gates)} score-routed layers")

    def _hook(self, li):
        def hook(mod, args, out):
            import torch
            outs = out if isinstance(out, (tuple, list)) else (out,)
            for o in outs:
                if torch.is_tensor(o) and not o.is_floating_point() and o.shape[-1] == self.k:
                    c = torch.bincount(o.reshape(-1), minlength=mod.e_score_correction_bias.numel())
                    self.counts[li] = self.counts.get(li, 0) + c
                    return
        return hook

    def step(self):
        import torch
        with torch.no_grad():
            for li, gate in self.gates:
                c = self.counts.get(li)
                if c is None:
                    continue
                c = c.float()
                b = gate.e_score_correction_bias
                b.add_((self.rate * torch.sign(c.mean() - c)).to(b.dtype))
        self.counts = {}

    def active(self):
        return bool(self.counts)


# ---------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------

def batches(stream, seq, batch, gen):
    import torch
    data = torch.tensor(stream, dtype=torch.long)
    n = (len(data) - 1) // seq
    while True:
        idx = torch.randint(0, n, (batch,), generator=gen) * seq
        x = torch.stack([data[i:i + seq] for i in idx.tolist()])
        y = torch.stack([data[i + 1:i + seq + 1] for i in idx.tolist()])
        yield x, y


def nll(model, ids, window, device, autocast):
    """Summed next-token negative log-likelihood (nats) and count over ids (BOS,
    then the text's tokens), with exactly the protocol of `moxie perplexity
    --window W`: the text tokens are cut into runs of window-1, each run is
    evaluated from scratch behind its own BOS, and every text token is
    predicted once."""
    import torch
    import torch.nn.functional as F
    bos, text = ids[0], ids[1:]
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for s in range(0, len(text), window - 1):
            chunk = [bos] + text[s:s + window - 1]
            x = torch.tensor([chunk], dtype=torch.long, device=device)
            with autocast():
                logits = model(input_ids=x, use_cache=False).logits
            lp = F.cross_entropy(logits[0, :-1].float(), x[0, 1:], reduction="sum")
            total += float(lp)
            count += len(chunk) - 1
    return total, count


def make_autocast(mode):
    import contextlib
    import torch
    if mode == "bf16":
        return lambda: torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext


def cmd_train(args):
    import numpy as np
    import torch
    import transformers
    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, "train.log"), "w")
    t_start = time.time()

    def log(msg):
        line = f"[{time.time() - t_start:7.1f}s] {msg}"
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    log(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"argv {sys.argv[1:]}")
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    oracle.E4M3_TABLE = oracle.e4m3fn_table()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        log(f"device {torch.cuda.get_device_name(0)}")

    train_docs = read_docs(os.path.join(args.data, "train.txt"))
    held_docs = read_docs(os.path.join(args.data, "heldout.txt"))
    # validation for model selection: every 20th training document (never the held-out part)
    val_docs = train_docs[::20]
    fit_docs = [d for i, d in enumerate(train_docs) if i % 20]
    log(f"corpus: {len(train_docs)} train documents ({len(fit_docs)} fit, {len(val_docs)} validation), "
        f"{len(held_docs)} held-out documents")
    tok = train_tokenizer(train_docs, args.vocab, log)
    vocab = tok.get_vocab_size()
    fit = encode_stream(tok, fit_docs)
    val = encode_stream(tok, val_docs)
    held = heldout_ids(tok, args.data)
    log(f"tokens: fit {len(fit)}, validation {len(val)}, held-out {len(held)}")

    hub = mini_hub(vocab)
    model, cfg_kwargs, variant, clamp, n_params = build_model(hub, args.experts, args.seed, log)
    model.to(device)

    # Pick the first numeric mode whose forward and backward run.
    gen = torch.Generator().manual_seed(args.seed + 2)
    it = batches(fit, args.seq, args.batch, gen)
    modes = [(p, args.experts) for p in [args.precision] + [m for m in ("bf16", "fp32") if m != args.precision]]
    if args.experts != "eager":
        modes += [("bf16", "eager"), ("fp32", "eager")]
    autocast = None
    for mode, impl in modes:
        try:
            if impl != getattr(model.config, "_experts_implementation", impl):
                if hasattr(model, "set_experts_implementation"):
                    model.set_experts_implementation(impl)
                else:
                    model.config._experts_implementation = impl
                log(f"experts implementation now {getattr(model.config, '_experts_implementation', None)}")
            x, _ = next(it)
            with make_autocast(mode)():
                out = model(input_ids=x.to(device), use_cache=False)
            out.logits.float().mean().backward()
            model.zero_grad(set_to_none=True)
            autocast = make_autocast(mode)
            log(f"precision: {mode}, experts {impl} (probe forward+backward ok)")
            args.precision = mode
            break
        except Exception as e:  # noqa: BLE001
            log(f"precision {mode} with experts {impl} failed: {type(e).__name__}: {e}")
            model.zero_grad(set_to_none=True)
    if autocast is None:
        raise SystemExit("no precision mode ran")

    import torch.nn.functional as F
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=(device == "cuda"))
    balancer = LoadBalancer(model, hub["num_experts_per_tok"], args.balance_rate, log)

    def train_step(x, y, lr):
        for g in opt.param_groups:
            g["lr"] = lr
        model.train()
        with autocast():
            logits = model(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        balancer.step()
        return float(loss.detach())

    def lr_at(step, total):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        p = min(1.0, (step - args.warmup) / max(1, total - args.warmup))
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    rows = []
    total = args.steps
    step = 0
    if total <= 0:
        # Time a few steps at the peak learning rate schedule's start, then fix the
        # step count so that training fits --train-seconds (logged: rerun with
        # --steps N to repeat the exact schedule).
        warm, probe = 3, 10
        t0 = None
        for i in range(warm + probe):
            if i == warm:
                if device == "cuda":
                    torch.cuda.synchronize()
                t0 = time.time()
            x, y = next(it)
            loss = train_step(x.to(device), y.to(device), lr_at(step, 10 ** 9))
            rows.append((step, time.time() - t_start, loss, None))
            step += 1
        if device == "cuda":
            torch.cuda.synchronize()
        per = (time.time() - t0) / probe
        total = max(step + 1, int(args.train_seconds / per))
        log(f"timing: {per:.3f} s/step, {args.batch * args.seq / per:.0f} tokens/s -> {total} steps "
            f"(rerun with --steps {total} to repeat this schedule)")
    best = (float("inf"), None, -1)
    t_train = time.time()
    while step < total:
        x, y = next(it)
        loss = train_step(x.to(device), y.to(device), lr_at(step, total))
        vloss = None
        if (step + 1) % args.eval_every == 0 or step + 1 == total:
            s, c = nll(model, val[: args.val_tokens], args.seq, device, autocast)
            vloss = s / c
            if vloss < best[0]:
                best = (vloss, {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}, step + 1)
            log(f"step {step + 1}/{total} loss {loss:.4f} val {vloss:.4f} (ppl {math.exp(vloss):.2f}) "
                f"lr {lr_at(step, total):.2e} {(step + 1) * args.batch * args.seq / (time.time() - t_train + 1e-9):.0f} tok/s"
                f"{' balance on' if balancer.gates else ''}")
        rows.append((step, time.time() - t_start, loss, vloss))
        step += 1
    train_time = time.time() - t_train
    log(f"trained {total} steps, {total * args.batch * args.seq} tokens in {train_time:.0f}s; "
        f"best validation loss {best[0]:.4f} at step {best[2]}")
    model.load_state_dict(best[1])

    with open(os.path.join(args.out, "loss.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "seconds", "train_loss", "val_loss"])
        for r in rows:
            w.writerow([r[0], f"{r[1]:.2f}", f"{r[2]:.5f}", "" if r[3] is None else f"{r[3]:.5f}"])
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
        ax.plot([r[0] for r in rows], [r[2] for r in rows], lw=0.8, label="train")
        ax.plot([r[0] for r in rows if r[3] is not None], [r[3] for r in rows if r[3] is not None], "o-", ms=3,
                label="validation")
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats/token)")
        ax.set_title(f"moxie miniature V4 on Brown, seed {args.seed}")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "loss.png"))
        log("wrote loss.png")
    except Exception as e:  # noqa: BLE001
        log(f"no loss.png ({type(e).__name__}: {e}); loss.csv has the curve")

    # Held-out perplexity in transformers, float32 (no TF32), before export.
    model.float()
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    s, c = nll(model, held, args.eval_window, device, lambda: __import__("contextlib").nullcontext())
    ppl = math.exp(s / c)
    log(f"held-out: {c} predicted tokens, windows of {args.eval_window}, mean NLL {s / c:.5f}, perplexity {ppl:.3f} "
        f"(float32, before export)")
    sample = greedy(model, tok, "The", 60, device)
    log(f"greedy sample: {sample!r}")

    # Export: the state dict under transformers names, float32, one file.
    from safetensors.torch import save_file
    hf_dir = os.path.join(args.out, "hf")
    os.makedirs(hf_dir, exist_ok=True)
    sd = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    save_file(sd, os.path.join(hf_dir, "model.safetensors"), metadata={"format": "pt"})
    # config.json: the exact keyword set the model was built from (the form
    # checkpoint.ConfigFromHF is tested on); transformers' own serialization beside it.
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump(dict({"model_type": "deepseek_v4", "architectures": ["DeepseekV4ForCausalLM"]}, **cfg_kwargs), f,
                  indent=1)
    try:
        model.config.to_json_file(os.path.join(args.out, "hf_config_transformers.json"), use_diff=False)
    except Exception as e:  # noqa: BLE001
        log(f"could not write transformers' config serialization: {e}")
    tok.save(os.path.join(hf_dir, "tokenizer.json"))
    with open(os.path.join(hf_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(), f, indent=2, ensure_ascii=False)
    with open(os.path.join(args.out, "heldout_ids.json"), "w") as f:
        json.dump(held, f)
    metrics = {
        "seed": args.seed, "steps": total, "batch": args.batch, "seq": args.seq, "lr": args.lr,
        "precision": args.precision, "experts_implementation": getattr(model.config, "_experts_implementation", None),
        "train_seconds": round(train_time, 1), "tokens_trained": total * args.batch * args.seq,
        "parameters": n_params, "vocab": vocab, "hub_config": hub, "hf_config_kwargs": cfg_kwargs,
        "hf_config_variant": variant, "shared_expert_clamp": clamp, "best_val_loss": best[0], "best_step": best[2],
        "heldout": {"tokens_predicted": c, "window": args.eval_window, "nll_sum": s, "mean_nll": s / c,
                    "perplexity": ppl, "method": "BOS + tokens of the whole heldout.txt, independent "
                    "non-overlapping windows of `window` tokens, first token of each window not predicted, float32"},
        "sample": sample, "torch": torch.__version__, "transformers": transformers.__version__,
        "wall_seconds": round(time.time() - t_start, 1),
    }
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1, ensure_ascii=False)
    log(f"wrote {hf_dir} ({sum(v.numel() * v.element_size() for v in sd.values()) / 1e6:.1f} MB) and metrics.json")


def greedy(model, tok, prompt, n, device):
    import torch
    ids = [0] + tok.encode(prompt).ids
    model.eval()
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits
            nxt = int(logits[0, -1].argmax())
            ids.append(nxt)
            if nxt == 1:
                break
    return tok.decode(ids[1:])


def cmd_eval(args):
    """Held-out perplexity of a shipped-layout checkpoint, dequantized exactly."""
    import numpy as np
    import torch
    from tokenizers import Tokenizer
    from transformers import DeepseekV4ForCausalLM
    oracle.E4M3_TABLE = oracle.e4m3fn_table()
    hub, tensors = oracle.read_checkpoint(args.ckpt)
    oracle.BLOCK = int((hub.get("quantization_config") or {}).get("weight_block_size", [128, 128])[0])

    def log(msg):
        print(msg, flush=True)
    cfg, _, _ = oracle.make_hf_config(hub, log)
    model = DeepseekV4ForCausalLM(cfg).float().eval()
    model.config._attn_implementation = "eager"
    sd, _, _ = oracle.build_state_dict(tensors, hub["num_hidden_layers"], hub["n_routed_experts"], [])
    own = model.state_dict()
    for k in sd:
        if own[k].dtype == torch.long:
            sd[k] = sd[k].to(torch.long)
    model.load_state_dict(sd, strict=True)
    oracle.check_model_structure(model, hub, log)
    oracle.disable_shared_clamp(model, log)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    model.to(device)
    tok = Tokenizer.from_file(os.path.join(args.ckpt, "tokenizer.json"))
    held = heldout_ids(tok, args.data)
    s, c = nll(model, held, args.eval_window, device, lambda: __import__("contextlib").nullcontext())
    res = {"checkpoint": args.ckpt, "tokens_predicted": c, "window": args.eval_window, "nll_sum": s,
           "mean_nll": s / c, "perplexity": math.exp(s / c), "numpy": np.__version__}
    log(json.dumps(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train the tokenizer and the model, export for moxie import-hf")
    t.add_argument("data", help="directory with train.txt and heldout.txt (training/brown.sh)")
    t.add_argument("out", help="output directory")
    t.add_argument("--seed", type=int, default=20261130)
    t.add_argument("--vocab", type=int, default=8192, help="BPE vocabulary size (4096..8192)")
    t.add_argument("--train-seconds", type=float, default=330, help="training wall-time budget (ignored with --steps)")
    t.add_argument("--steps", type=int, default=0, help="fixed number of steps (0: fit --train-seconds)")
    t.add_argument("--batch", type=int, default=64)
    t.add_argument("--seq", type=int, default=512)
    t.add_argument("--lr", type=float, default=1.5e-3)
    t.add_argument("--warmup", type=int, default=60)
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--eval-every", type=int, default=100)
    t.add_argument("--val-tokens", type=int, default=32768, help="validation tokens per evaluation")
    t.add_argument("--eval-window", type=int, default=512, help="held-out perplexity window")
    t.add_argument("--precision", choices=["bf16", "fp32"], default="bf16",
                   help="bf16 autocast over float32 weights, or float32 with TF32 matmuls")
    t.add_argument("--experts", default="grouped_mm", help="transformers experts implementation ('' = default)")
    t.add_argument("--balance-rate", type=float, default=1e-3,
                   help="aux-loss-free load-balancing bias step (0 = off)")
    e = sub.add_parser("eval", help="held-out perplexity of a shipped-layout checkpoint in transformers")
    e.add_argument("data")
    e.add_argument("ckpt")
    e.add_argument("--eval-window", type=int, default=512)
    e.add_argument("--json", help="also write the result here")
    args = ap.parse_args()
    if args.cmd == "train":
        if not 4096 <= args.vocab <= 8192:
            ap.error("--vocab must be in 4096..8192")
        cmd_train(args)
    else:
        cmd_eval(args)


if __name__ == "__main__":
    main()
