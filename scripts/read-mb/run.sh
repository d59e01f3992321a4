#!/usr/bin/env bash
# scripts/read-mb/run.sh OUT_DIR
#
# The read floor of a decode step's weight kernels (session 19): builds
# read.cu with nvcc on the GPU machine (run from the repository root) and
# times chains of read kernels of the V4-Flash weight sizes, with and
# without their loads before the programmatic-launch wait and with a small
# latency-bound kernel between them. read.cu's header says what each case
# measures; then queue.cu (the MoE's two stages' bytes as two kernels, as one
# persistent work queue, and as one plain read); then splitk.cu (the MoE as
# one kernel with stage 2 split along the intermediate dimension, then a
# reduce). Writes OUT_DIR/build.log and OUT_DIR/PROG.txt for each program
# in PROGS (default: read queue splitk).
set -u -o pipefail
out=${1:?usage: run.sh OUT_DIR}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
work=$(mktemp -d)
# PROGS: which of the programs to build and run, in order.
for prog in ${PROGS:-read queue splitk}; do
  if ! nvcc -O3 -std=c++17 -arch=sm_90 -o "$work/$prog" "scripts/read-mb/$prog.cu" >>"$out/build.log" 2>&1; then
    tail -30 "$out/build.log"
    exit 1
  fi
  timeout 120 "$work/$prog" 2>&1 | tee "$out/$prog.txt"
done
