#!/usr/bin/env bash
# scripts/moe-mb/run.sh OUT_DIR
#
# The MoE decode knock-out microbenchmark (session 14), for the GPU machine
# (nvcc there; run from the repository root). It builds harness.cu against
# kernels/moe.cu's common section and module.go's kernel preamble, then
# times stage 1 (moe1lx) and stage 2 variants at V4-Flash shapes (D 4096,
# expert width 2048, K 6 of 64 experts, FP8 shared expert of width 2048),
# each as a CUDA graph of 16 launches with programmatic dependent launch,
# consecutive launches on disjoint experts and shared-expert copies (so
# weights come from HBM), 25 replays, median per launch. Before timing it
# checks that every stage-2 variant meant to compute (KO 0, 4, 32, 64,
# 128, 384, 448, 896) gives the repository kernel's bits. The knock-out
# switches (KO) are listed in harness.cu; knocked-out kernels compute
# wrong results: timing only.
#
# Session 16 added reads without math (k1read: stage 1's routed tiles by
# lane mapping; k1bulk: stage 1's bytes by bulk copies). The harness takes
# NVCC_FLAGS (extra nvcc options, e.g. -DNAME for an experiment's #ifdef), SEQ (run only the sequences whose names contain one of its '|'-separated
# parts) and CARVE (the stage-1 kernels' preferred shared-memory carveout,
# percent), e.g. SEQ='s1 base|KO1 27)' CARVE=44 ./harness.
#
# Writes OUT_DIR/build.log, regs.txt (registers and shared memory of each
# kernel), harness.txt; with NCU=1 also ncu.txt (one moe_stage2l launch:
# speed of light, warp states, occupancy, source counters).
set -u -o pipefail
out=${1:?usage: run.sh OUT_DIR}
mkdir -p "$out"
root=$(pwd)
work=$(mktemp -d)
awk '/^const pdlPreamble = `/{f=1; sub(/^const pdlPreamble = `/,""); print; next} f&&/^`$/{exit} f{print}' \
  "$root/compute/cuda/module.go" | grep -v '^#line' >"$work/prelude.h"
awk '/^\/\/@module moe/{exit} {print}' "$root/compute/cuda/kernels/moe.cu" >"$work/common.cu"
cp "$root/scripts/moe-mb/harness.cu" "$work/"
cd "$work" || exit 1
export PATH=/usr/local/cuda/bin:$PATH
# shellcheck disable=SC2086
if ! nvcc -O3 -std=c++17 -arch=sm_90a -lineinfo -I"$root/scripts/read-mb" ${NVCC_FLAGS:-} -o harness harness.cu >"$out/build.log" 2>&1; then
  tail -50 "$out/build.log"
  exit 1
fi
cuobjdump -res-usage harness 2>&1 | grep -o "Function [^ ]*\|REG:[0-9]*\|SHARED:[0-9]*" | paste - - - | c++filt >"$out/regs.txt"
./harness 2>&1 | tee "$out/harness.txt"
if [ -n "${NCU:-}" ]; then
  timeout 200 ncu --kernel-name regex:k2repo --section SourceCounters --section WarpStateStats --section Occupancy \
    --section SpeedOfLight -c 1 --clock-control none ./harness >"$out/ncu.txt" 2>&1
  grep -v "^==PROF==" "$out/ncu.txt" | tail -80
fi
