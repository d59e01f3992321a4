#!/usr/bin/env bash
# gpu-check.sh BIN_DIR OUT_DIR
#
# Runs moxie's GPU checks on a machine with an NVIDIA GPU and no Go toolchain,
# from binaries built elsewhere, in one go:
#   CGO_ENABLED=0 go test -c -o BIN_DIR/cuda.test ./compute/cuda
#   CGO_ENABLED=0 go test -c -o BIN_DIR/dsv4.test ./dsv4 && echo dsv4 >BIN_DIR/dsv4.dir
#   CGO_ENABLED=0 GOEXPERIMENT=simd go build -o BIN_DIR/moxie ./cmd/moxie
# For every BIN_DIR/NAME.test it runs the tests verbosely (GPU compliance suite,
# device goldens) in the package directory named by BIN_DIR/NAME.dir (default
# compute/cuda for cuda.test, else the repository root); for cuda.test it then
# runs the benchmarks (-test.benchtime=1x: each times itself with CUDA
# events). If BIN_DIR/moxie exists it runs `moxie bench --backend cuda` on each
# model of MOXIE_BENCH_MODELS (space-separated specs) and saves each report as
# bench-moxie-N.json. If nvcc is present it also records the register/spill
# report of the embedded kernels (ptxas -v) for sm_90.
# Environment: TEST_RUN (a -test.run pattern), TEST_BENCH (a -test.bench
# pattern for the *.test binaries other than cuda.test; none by default),
# TEST_TIMEOUT (per test binary, default 8m), NO_BENCH=1 (skip cuda.test
# benchmarks), NO_PTXAS=1 (skip the nvcc report), MOXIE_BENCH_QUICK=1 (a short benchmark
# set), SASS_KERNELS, MOXIE_BENCH_MODELS, MOXIE_BENCH_ARGS (extra flags for
# moxie bench, default "--prompt 64 --decode 32 --runs 3").
#
# Writes to OUT_DIR: summary.json, tests.log, bench.log, bench.json,
# ptxas.txt, sass.txt (opcode histograms and SASS of a few kernels), nvidia-smi.txt;
# with TAR=1 everything but summary.json goes into OUT_DIR/gpu-check.tgz
# instead (the device tool brings back at most 8 files). Exit status: 0 if
# every test binary passed.
# For the tests alone under a time budget (per-binary timeouts, -test.short,
# per-test results and timings in summary.json) use scripts/gpu-tests.sh.
set -u -o pipefail
bin=${1:?usage: gpu-check.sh BIN_DIR OUT_DIR}
out=${2:?usage: gpu-check.sh BIN_DIR OUT_DIR}
mkdir -p "$out"
bin=$(cd "$bin" && pwd)
out=$(cd "$out" && pwd)
here=$(cd "$(dirname "$0")/.." && pwd)
export MOXIE_CUDA_CACHE=${MOXIE_CUDA_CACHE:-$(mktemp -d)/moxie-cuda}

{ nvidia-smi 2>&1; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,clocks.max.sm --format=csv 2>&1; } >"$out/nvidia-smi.txt"

status=0
results=()
: >"$out/tests.log"
for t in "$bin"/*.test; do
  [ -x "$t" ] || continue
  name=$(basename "$t" .test)
  dir=$here
  [ "$name" = cuda ] && dir=$here/compute/cuda
  [ -f "$bin/$name.dir" ] && dir=$here/$(cat "$bin/$name.dir")
  echo "=== $name: tests in ${dir#$here/}" | tee -a "$out/tests.log"
  start=$(date +%s)
  (cd "$dir" && "$t" -test.v -test.count=1 -test.timeout=${TEST_TIMEOUT:-8m} -test.run "${TEST_RUN:-.}") >>"$out/tests.log" 2>&1
  rc=$?
  if [ -n "${TEST_BENCH:-}" ] && [ "$name" != cuda ]; then
    (cd "$dir" && "$t" -test.run '^$' -test.bench "$TEST_BENCH" -test.benchtime 1x -test.v -test.timeout=8m) >>"$out/tests.log" 2>&1 || status=1
  fi
  secs=$(( $(date +%s) - start ))
  [ $rc -eq 0 ] || status=1
  results+=("$name $rc $secs")
  echo "=== $name: exit $rc in ${secs}s" | tee -a "$out/tests.log"
done

bench_rc=-1
if [ -x "$bin/cuda.test" ] && [ -z "${NO_BENCH:-}" ]; then
  echo "=== cuda: benchmarks" | tee "$out/bench.log"
  MOXIE_BENCH_JSON="$out/bench.json" "$bin/cuda.test" -test.run '^$' -test.bench . -test.benchtime 1x -test.v -test.timeout=8m >>"$out/bench.log" 2>&1
  bench_rc=$?
  echo "=== cuda: benchmarks exit $bench_rc" | tee -a "$out/bench.log"
fi

if [ -x "$bin/moxie" ] && [ -n "${MOXIE_BENCH_MODELS:-}" ]; then
  n=0
  for m in $MOXIE_BENCH_MODELS; do
    n=$((n+1))
    echo "=== moxie bench --backend cuda $m" | tee -a "$out/bench.log"
    (cd "$here" && "$bin/moxie" bench "$m" --backend cuda ${MOXIE_BENCH_ARGS:---prompt 64 --decode 32 --runs 3} --json "$out/bench-moxie-$n.json") >>"$out/bench.log" 2>&1 || status=1
  done
fi

if [ -z "${NO_PTXAS:-}" ] && command -v nvcc >/dev/null && [ -f "$here/compute/cuda/kernels/linear.cu" ]; then
  kdir=$(mktemp -d)
  k="$here/compute/cuda/kernels"
  cp "$k/linear.cu" "$kdir/all.cu"
  (cd "$kdir" && timeout 100 nvcc -arch=sm_90 -cubin -Xptxas -v -o k.cubin all.cu) >"$out/ptxas.txt" 2>&1 || true
  if command -v cuobjdump >/dev/null && [ -f "$kdir/k.cubin" ]; then
    : >"$out/sass.txt"
    for fn in ${SASS_KERNELS:-linear_fp8_b1_r2_u4_d0 linear_fp8_b1_r2_u4_d1 linear_mxfp4_b1_r2_u4_d0 linear_mxfp4_b1_r2_u4_d1 linear_bf16_b1_r2_u4_d0}; do
      echo "===== $fn: opcode histogram" >>"$out/sass.txt"
      cuobjdump -sass -fun "$fn" "$kdir/k.cubin" 2>&1 | grep -oE '^\s+/\*[0-9a-f]+\*/\s+(@!?U?P[0-9T]+\s+)?[A-Z0-9_.]+' | awk '{print $NF}' | sed 's/\..*//' | sort | uniq -c | sort -rn >>"$out/sass.txt"
      echo "===== $fn: SASS" >>"$out/sass.txt"
      cuobjdump -sass -fun "$fn" "$kdir/k.cubin" >>"$out/sass.txt" 2>&1
    done
  fi
fi

python3 - "$out" "$bench_rc" "${results[@]}" <<'PY'
import json, os, re, sys
out, bench_rc, rows = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
log = open(os.path.join(out, "tests.log"), errors="replace").read()
def count(word):
    return len(re.findall(r"^\s*--- %s: " % word, log, re.M))
s = {
    "tests": [dict(zip(("binary", "exit", "seconds"), (r.split()[0], int(r.split()[1]), int(r.split()[2])))) for r in rows],
    "passed": count("PASS"), "failed": count("FAIL"), "skipped": count("SKIP"),
    "failures": re.findall(r"^\s*--- FAIL: (\S+)", log, re.M),
    "max_relative_errors": re.findall(r"max relative error .*", log),
    "bench_exit": bench_rc,
}
p = os.path.join(out, "bench.json")
if os.path.exists(p):
    s["bench"] = json.load(open(p))
s["moxie_bench"] = [json.load(open(os.path.join(out, f))) for f in sorted(os.listdir(out)) if f.startswith("bench-moxie-")]
json.dump(s, open(os.path.join(out, "summary.json"), "w"), indent=2)
print("summary: %d passed, %d failed, %d skipped; bench exit %d" % (s["passed"], s["failed"], s["skipped"], bench_rc))
PY
grep -E "bench_test.go" "$out/bench.log" 2>/dev/null | sed "s/^[[:space:]]*bench_test.go:[0-9]*: //" | tail -n 70
if [ -n "${TAR:-}" ]; then
  (cd "$out" && find . -maxdepth 1 -type f ! -name summary.json ! -name gpu-check.tgz -printf '%P\n' | tar -czf gpu-check.tgz -T - --remove-files)
fi
exit $status
