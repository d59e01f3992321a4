#!/usr/bin/env bash
# scripts/flag-mb/run.sh OUT_DIR
#
# What a dependency costs on the GPU (session 17): builds flag.cu with nvcc
# on the GPU machine (run from the repository root) and times a chain of
# dependent steps as launches in a graph (plain and with programmatic
# dependent launch), as phases of one persistent kernel separated by a
# counter barrier or by point-to-point flags, and a two-block ping-pong.
# flag.cu's header says what each case measures. Writes OUT_DIR/build.log
# and OUT_DIR/flag.txt.
set -u -o pipefail
out=${1:?usage: run.sh OUT_DIR}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
work=$(mktemp -d)
if ! nvcc -O3 -std=c++17 -arch=sm_90 -o "$work/flag" scripts/flag-mb/flag.cu >"$out/build.log" 2>&1; then
  tail -30 "$out/build.log"
  exit 1
fi
timeout 60 "$work/flag" 2>&1 | tee "$out/flag.txt"
