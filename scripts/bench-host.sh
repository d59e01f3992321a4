#!/usr/bin/env bash
# Runs moxie's CPU benchmarks from prebuilt binaries, for a machine without Go
# (the GPU test machine's host). Usage: scripts/bench-host.sh BINDIR OUTDIR
# BINDIR holds moxie-simd and PKG.test / PKG-simd.test files built with
#   CGO_ENABLED=0 [GOEXPERIMENT=simd] go test -c -o BINDIR/PKG[-simd].test ./PATH
# Each stage is time-limited; logs go to OUTDIR/NAME.log and a summary to
# OUTDIR/summary.txt. Set FLASH_LAYERS=0 to skip the V4-Flash decode runs, and
# ONLY=REGEX to run only the stages whose names match.
set -uo pipefail
bin=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
{ date -u; uname -a; nproc; free -g; lscpu | grep -E 'Model name|Flags' | cut -c1-200; } > "$out/machine.txt" 2>&1

stage() { # stage NAME TIMEOUT DIR CMD... (skipped unless NAME matches $ONLY, an ERE, when set)
	local name=$1 t=$2 dir=$3; shift 3
	if [ -n "${ONLY:-}" ] && ! [[ $name =~ $ONLY ]]; then return; fi
	echo "== $name ($(date -u +%T))" | tee -a "$out/summary.txt"
	(cd "$root/$dir" && timeout "$t" "$@") > "$out/$name.log" 2>&1
	echo "   exit $?" >> "$out/summary.txt"
	grep -E '^Benchmark|tok/s|GB/s|efficiency|decode|prefill' "$out/$name.log" | head -60 >> "$out/summary.txt"
}

B='-test.run=^$ -test.benchmem=false'
stage kern-simd 150 compute/cpu/kern "$bin/kern-simd.test" $B -test.bench 'MemRead|MatVec|MatMul' -test.count 3 -test.benchtime 1s
if [ "${FLASH_LAYERS:-2}" != 0 ]; then
	f=/tmp/moxie-flash
	rm -rf "$f"
	stage synth-flash 240 . "$bin/moxie-simd" synth "flash?layers=${FLASH_LAYERS:-2}" --out "$f"
	stage bench-flash-resident 150 . "$bin/moxie-simd" bench "$f" --prompt 32 --decode 16 --runs 2 --mem 100GiB --json "$out/bench-flash-resident.json"
	export MOXIE_BENCH_FLASH=1 MOXIE_BENCH_FLASH_DIR=$f
	stage experts-flash-store 150 experts "$bin/experts-simd.test" $B -test.bench 'FlashDecodeStore' -test.benchtime 8x
fi
stage format-simd 60 format "$bin/format-simd.test" $B -test.bench 'Decode' -test.cpu 1 -test.count 3
stage format 60 format "$bin/format.test" $B -test.bench 'Decode' -test.cpu 1 -test.count 3
stage tokenizer 60 tokenizer "$bin/tokenizer.test" $B -test.bench 'EncodeEnglish' -test.cpu 1 -test.count 5
stage checkpoint 60 checkpoint "$bin/checkpoint.test" $B -test.bench 'OpenDir46' -test.count 5 -test.benchtime 10x
stage safetensors 60 safetensors "$bin/safetensors.test" $B -test.bench 'Open46' -test.count 5 -test.benchtime 10x
stage experts-miss 90 experts "$bin/experts-simd.test" $B -test.bench 'ExpertMiss' -test.count 3
stage kern 100 compute/cpu/kern "$bin/kern.test" $B -test.bench 'MemRead|MatVec' -test.count 2 -test.benchtime 1s
echo "done $(date -u +%T)" >> "$out/summary.txt"
