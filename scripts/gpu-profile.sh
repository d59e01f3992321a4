#!/usr/bin/env bash
# gpu-profile.sh BIN_DIR OUT_DIR
#
# Where a CUDA decode step's time goes, in one device call, from moxie
# binaries built elsewhere (the GPU machine has no Go):
#   CGO_ENABLED=0 go build -o BIN_DIR/moxie ./cmd/moxie
#   CGO_ENABLED=0 go build -tags moxie_knockout -o BIN_DIR/moxie_ko ./cmd/moxie   (optional)
#   BIN_DIR/moxie_old: an older build of the same command                        (optional)
#
# In order, each part skipped when its binary is missing, and the call
# stopped cleanly (the JSON still written) once BUDGET seconds have passed:
#   1. timing: `moxie bench MODEL --timing` once: the decode step's GPU time
#      (CUDA events) against its wall time, and the host's share.
#   2. A/B: PAIRS alternating runs of moxie_old and moxie (old first); or,
#      without moxie_old and with AB_ENV or AB_ENV_NEW set (VAR=VALUE ...,
#      e.g. AB_ENV=MOXIE_CUDA_HCEPI=off, AB_ENV_NEW=MOXIE_CUDA_HCCOL=on), of
#      moxie under AB_ENV (the old side) and under AB_ENV_NEW (the new).
#   3. knock-outs: for each group of KO, a run of moxie_ko with MOXIE_KO set
#      to the group's kernel-name prefixes, each after a baseline run of
#      moxie_ko with nothing knocked out; the group's in-step cost is its
#      baseline's step minus its own. Knocked-out steps compute wrong
#      results: timing only.
#   4. ncu (NCU=1, and ncu on the PATH): every kernel of a short run of
#      NCU_MODEL (graph nodes profiled one by one, real clocks, caches
#      flushed) as ncu.csv.
# Every run is `BIN bench MODEL --backend cuda --prompt PROMPT --ctx CTX
# --decode DECODE --runs RUNS --json F` plus BENCH_ARGS.
#
# Environment (defaults): MODEL ('synth:flash?layers=8&experts=16&mtp=0'),
# PROMPT (4096), CTX (8192), DECODE (96), RUNS (2), BENCH_ARGS (), PAIRS (3), AB_ENV (), AB_ENV_NEW (),
# KO (space-separated NAME=PREFIX[,PREFIX...]; default below), BUDGET (540),
# NCU (0), NCU_MODEL ('synth:flash?layers=4&experts=16&mtp=0'), NCU_DECODE (2).
#
# Writes OUT_DIR/profile.json (every run: binary, knock-out, decode step ms,
# tok/s, prefill tok/s, the --timing medians; per group the cost in ms and
# us a layer when the model spec names its layers) and OUT_DIR/profile.log
# (every command's output), prints a summary, and exits 0 unless a run
# failed.
set -u -o pipefail
bin=${1:?usage: gpu-profile.sh BIN_DIR OUT_DIR}
out=${2:?usage: gpu-profile.sh BIN_DIR OUT_DIR}
mkdir -p "$out"
bin=$(cd "$bin" && pwd)
out=$(cd "$out" && pwd)
work=$(mktemp -d)
export MOXIE_CUDA_CACHE=${MOXIE_CUDA_CACHE:-$work/moxie-cuda}
model=${MODEL:-synth:flash?layers=8&experts=16&mtp=0}
budget=${BUDGET:-540}
ko=${KO:-fin=fuse_hc_finish dots=fuse_hc_dots rows=fuse_rows combine=attndec_combine attn=attndec_ scores=idx_scores topk=idx_topk comp=fwd_comp_step}
log=$out/profile.log
runs=$work/runs.tsv # label, binary, knock-out, json path, exit status
: >"$runs"
: >"$log"
start=$(date +%s)
status=0
n=0
benv= # environment assignments for the next bench run (AB_ENV's old side)

left() { echo $((budget - ($(date +%s) - start))); }

# bench LABEL BINARY KO [FLAGS...]: one bench run, its output in the log.
bench() {
  local label=$1 b=$2 k=$3
  shift 3
  n=$((n + 1))
  local j=$work/run-$n.json
  echo "=== $label ($(basename "$b"), MOXIE_KO='$k'${benv:+, $benv}, $(left)s left)" | tee -a "$log"
  # shellcheck disable=SC2086
  env $benv MOXIE_KO="$k" timeout -k 5 "$(($(left) > 30 ? $(left) : 30))" "$b" bench "$model" --backend cuda \
    --prompt "${PROMPT:-4096}" --ctx "${CTX:-8192}" --decode "${DECODE:-96}" --runs "${RUNS:-2}" \
    --json "$j" ${BENCH_ARGS:-} "$@" >"$work/run.log" 2>&1
  local rc=$?
  cat "$work/run.log" >>"$log"
  [ $rc -eq 0 ] || { status=1; tail -n 5 "$work/run.log"; }
  printf '%s\t%s\t%s\t%s\t%s\n' "$label" "$(basename "$b")" "$k" "$j" "$rc" >>"$runs"
  grep -E '^decode' "$work/run.log"
}

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1; } >>"$log"

if [ -x "$bin/moxie" ]; then
  bench timing "$bin/moxie" "" --timing
fi
if [ -x "$bin/moxie" ] && { [ -x "$bin/moxie_old" ] || [ -n "${AB_ENV:-}${AB_ENV_NEW:-}" ]; }; then
  old=$bin/moxie_old
  [ -x "$old" ] || old=$bin/moxie
  for i in $(seq "${PAIRS:-3}"); do
    [ "$(left)" -gt 60 ] || break
    [ -x "$bin/moxie_old" ] || benv=${AB_ENV:-}
    bench "ab-old-$i" "$old" ""
    [ -x "$bin/moxie_old" ] || benv=${AB_ENV_NEW:-}
    bench "ab-new-$i" "$bin/moxie" ""
    benv=
  done
fi
if [ -x "$bin/moxie_ko" ]; then
  for g in $ko; do
    [ "$(left)" -gt 60 ] || break
    bench "ko-base-${g%%=*}" "$bin/moxie_ko" ""
    bench "ko-${g%%=*}" "$bin/moxie_ko" "${g#*=}"
  done
fi
if [ "${NCU:-0}" = 1 ] && command -v ncu >/dev/null && [ -x "$bin/moxie" ] && [ "$(left)" -gt 60 ]; then
  echo "=== ncu of ${NCU_MODEL:-synth:flash?layers=4&experts=16&mtp=0}" | tee -a "$log"
  timeout -k 5 "$(left)" ncu --graph-profiling node --csv --metrics gpu__time_duration.sum \
    "$bin/moxie" bench "${NCU_MODEL:-synth:flash?layers=4&experts=16&mtp=0}" --backend cuda \
    --prompt "${PROMPT:-4096}" --ctx "${CTX:-8192}" --decode "${NCU_DECODE:-2}" --runs 1 --warmup 0 \
    >"$out/ncu.csv" 2>>"$log" || status=1
fi

python3 - "$runs" "$out/profile.json" "$model" <<'PY'
import json, re, sys
runs_path, dest, model = sys.argv[1], sys.argv[2], sys.argv[3]
m = re.search(r"layers=(\d+)", model)
layers = int(m.group(1)) if m else 0
runs = []
for line in open(runs_path):
    label, binary, ko, path, rc = line.rstrip("\n").split("\t")
    r = {"label": label, "binary": binary, "knockout": ko, "exit": int(rc)}
    try:
        rep = json.load(open(path))
        r.update(step_ms=rep["decode_step_ms"], decode_tok_per_s=rep["decode_tok_per_s"],
                 prefill_tok_per_s=rep["prefill_tok_per_s"], efficiency=rep["decode_efficiency"])
        if "decode_timing_ms" in rep:
            r["timing_ms"] = rep["decode_timing_ms"]
    except (OSError, ValueError, KeyError):
        pass
    runs.append(r)
by = {r["label"]: r for r in runs}
groups = []
for r in runs:
    if not r["label"].startswith("ko-") or r["label"].startswith("ko-base-"):
        continue
    name = r["label"][3:]
    base = by.get("ko-base-" + name, {})
    if "step_ms" in r and "step_ms" in base:
        cost = base["step_ms"] - r["step_ms"]
        g = {"group": name, "prefixes": r["knockout"], "base_ms": base["step_ms"], "without_ms": r["step_ms"], "cost_ms": round(cost, 4)}
        if layers:
            g["cost_us_per_layer"] = round(1000 * cost / layers, 2)
        groups.append(g)
ab = {}
for side in ("old", "new"):
    v = [r["step_ms"] for r in runs if r["label"].startswith("ab-%s-" % side) and "step_ms" in r]
    if v:
        ab[side] = {"step_ms": v, "mean_ms": round(sum(v) / len(v), 4)}
res = {"model": model, "layers": layers, "runs": runs, "knockouts": groups, "ab": ab}
json.dump(res, open(dest, "w"), indent=1)
for r in runs:
    print("%-16s %-10s step %s ms" % (r["label"], r["binary"], r.get("step_ms", "-")), ("timing %s" % r["timing_ms"]) if "timing_ms" in r else "")
for g in groups:
    print("knock-out %-8s %.3f ms (%s us a layer)" % (g["group"], g["cost_ms"], g.get("cost_us_per_layer", "-")))
if ab:
    print("A/B", {k: v["mean_ms"] for k, v in ab.items()})
PY
exit $status
