#!/usr/bin/env bash
# gpu-tests.sh BIN_DIR OUT_DIR
#
# Runs moxie's GPU test binaries under a time budget on a machine with an
# NVIDIA GPU and no Go toolchain, and leaves exactly two files in OUT_DIR
# (the device tool brings back at most 8):
#   OUT_DIR/summary.json    per binary: exit status, seconds, timed out or
#                           not, the test running when it was stopped; per
#                           test and subtest: pass/fail/skip and seconds;
#                           every "max relative error" line with its test
#   OUT_DIR/gpu-tests.tgz   every binary's full -test.v log, nvidia-smi
# and prints the summary (failures, time-outs, the slowest tests) on stdout.
#
# Build the binaries elsewhere (from a clean checkout of the commit to test):
#   CGO_ENABLED=0 go test -c -o BIN_DIR/cuda.test ./compute/cuda
#   CGO_ENABLED=0 go test -c -o BIN_DIR/dsv4.test ./dsv4 && echo dsv4 >BIN_DIR/dsv4.dir
# Each BIN_DIR/NAME.test runs in the package directory named by
# BIN_DIR/NAME.dir (default compute/cuda for cuda.test, else the repository
# root), as `NAME.test -test.v -test.count=1 -test.short -test.run RUN`.
#
# Time budget: each binary gets TIMEOUT seconds (default 150; TIMEOUT_NAME
# overrides it for NAME.test, e.g. TIMEOUT_dsv4=240): -test.timeout is set
# 10 s below it, so a stuck test panics with its name and stack in the log,
# and `timeout` kills the binary 10 s later if even that does not return.
# Environment: TEST_RUN (-test.run pattern, default .), TEST_SKIP
# (-test.skip pattern), SHORT=0 (drop -test.short: the heavy cases too),
# TEST_ARGS (more flags for every binary), TEST_BENCH (a -test.bench pattern
# run after the tests with -test.benchtime 1x under the same kind of
# budget, BENCH_TIMEOUT seconds, default 240; its log is in the tarball and
# its result in summary.json). MOXIE_CUDA_CACHE defaults to a fresh
# directory (kernels compile once per run).
# The NVRTC compile-only tests (Test*Compile, Test*Compiles) compile each
# module a second time on the GPU machine (the loads compile it anyway);
# TEST_SKIP='Compiles?$' leaves them to the build machine's NVRTC.
# Example (device tool, binaries carried in .carry/gpu):
#   TEST_SKIP='Compiles?$' scripts/gpu-tests.sh .carry/gpu "$OUT"
# Exit status: 0 if every binary passed within its budget.
set -u -o pipefail
bin=${1:?usage: gpu-tests.sh BIN_DIR OUT_DIR}
out=${2:?usage: gpu-tests.sh BIN_DIR OUT_DIR}
mkdir -p "$out"
bin=$(cd "$bin" && pwd)
out=$(cd "$out" && pwd)
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
export MOXIE_CUDA_CACHE=${MOXIE_CUDA_CACHE:-$work/moxie-cuda}
mkdir -p "$work/logs"
{ nvidia-smi 2>&1; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,clocks.max.sm --format=csv 2>&1; } >"$work/logs/nvidia-smi.txt"

short=-test.short
[ "${SHORT:-1}" = 0 ] && short=
status=0
rows=()

# runbin NAME LABEL BUDGET ARGS...: runs BIN_DIR/NAME.test with ARGS in its
# directory, log in logs/LABEL.log; appends "LABEL exit seconds budget" to rows.
runbin() {
  local name=$1 label=$2 budget=$3
  shift 3
  local dir=$here t=$bin/$name.test
  [ "$name" = cuda ] && dir=$here/compute/cuda
  [ -f "$bin/$name.dir" ] && dir=$here/$(cat "$bin/$name.dir")
  echo "=== $label: $(basename "$t") in ${dir#$here/}, budget ${budget}s"
  local start rc secs
  start=$(date +%s)
  (cd "$dir" && timeout -k 5 "$budget" "$t" -test.count=1 -test.timeout="$((budget > 20 ? budget - 10 : budget))s" "$@") >"$work/logs/$label.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  [ $rc -eq 0 ] || status=1
  rows+=("$label $rc $secs $budget")
  echo "=== $label: exit $rc in ${secs}s"
}

for t in "$bin"/*.test; do
  [ -x "$t" ] || continue
  name=$(basename "$t" .test)
  var=TIMEOUT_$name
  budget=${!var:-${TIMEOUT:-150}}
  args=(-test.v -test.run "${TEST_RUN:-.}")
  [ -n "$short" ] && args+=("$short")
  [ -n "${TEST_SKIP:-}" ] && args+=(-test.skip "$TEST_SKIP")
  # shellcheck disable=SC2206
  [ -n "${TEST_ARGS:-}" ] && args+=($TEST_ARGS)
  runbin "$name" "$name" "$budget" "${args[@]}"
  if [ -n "${TEST_BENCH:-}" ]; then
    runbin "$name" "$name-bench" "${BENCH_TIMEOUT:-240}" -test.v -test.run '^$' -test.bench "$TEST_BENCH" -test.benchtime 1x
  fi
done

python3 - "$work/logs" "$out/summary.json" "${rows[@]}" <<'PY'
import json, os, re, sys
logs, dest, rows = sys.argv[1], sys.argv[2], sys.argv[3:]
res = re.compile(r"^\s*--- (PASS|FAIL|SKIP): (\S+) \(([\d.]+)s\)")
ctx = re.compile(r"^=== (RUN|CONT|NAME|PAUSE)\s+(\S+)")
bench = re.compile(r"^(Benchmark\S+)\s+\d+\s+(.*)$")
s = {"binaries": [], "passed": 0, "failed": 0, "skipped": 0, "failures": [], "timed_out": []}
for r in rows:
    label, rc, secs, budget = r.split()
    rc, secs, budget = int(rc), int(secs), int(budget)
    path = os.path.join(logs, label + ".log")
    log = open(path, errors="replace").read().splitlines() if os.path.exists(path) else []
    tests, errs, benches, cur, started = {}, [], [], "", []
    for line in log:
        m = ctx.match(line)
        if m:
            cur = m.group(2)
            if m.group(1) == "RUN":
                started.append(cur)
            continue
        m = res.match(line)
        if m:
            st, name, t = m.group(1).lower(), m.group(2), float(m.group(3))
            tests[name] = {"status": st, "seconds": t}
            continue
        m = bench.match(line)
        if m:
            benches.append({"name": m.group(1), "result": m.group(2).strip()})
        if "max relative error" in line:
            errs.append({"test": cur, "line": line.strip()})
    unfinished = [n for n in started if n not in tests]
    timed = rc in (124, 137) or any("test timed out" in l for l in log)
    b = {"binary": label, "exit": rc, "seconds": secs, "budget_seconds": budget,
         "timed_out": timed, "unfinished": unfinished, "tests": tests,
         "max_relative_errors": errs}
    if benches:
        b["benchmarks"] = benches
    panics = [l for l in log if l.startswith("panic:")]
    if panics:
        b["panic"] = panics[:3]
    s["binaries"].append(b)
    for n, v in tests.items():
        s[{"pass": "passed", "fail": "failed", "skip": "skipped"}[v["status"]]] += 1
        if v["status"] == "fail":
            s["failures"].append(label + ": " + n)
    if timed:
        s["timed_out"].append(label + ": " + (unfinished[-1] if unfinished else "?"))
json.dump(s, open(dest, "w"), indent=1)
print("summary: %d passed, %d failed, %d skipped" % (s["passed"], s["failed"], s["skipped"]))
for b in s["binaries"]:
    print("  %-12s exit %3d  %4ds of %ds%s" % (b["binary"], b["exit"], b["seconds"], b["budget_seconds"],
          "  TIMED OUT in " + (b["unfinished"][-1] if b["unfinished"] else "?") if b["timed_out"] else ""))
    if b.get("panic"):
        print("    " + b["panic"][0])
    top = sorted(((v["seconds"], n) for n, v in b["tests"].items() if "/" not in n), reverse=True)[:8]
    if top:
        print("    slowest: " + ", ".join("%s %.1fs" % (n, t) for t, n in top))
    for bb in b.get("benchmarks", [])[:60]:
        print("    %s %s" % (bb["name"], bb["result"]))
for f in s["failures"][:40]:
    print("  FAIL " + f)
PY
tar -czf "$out/gpu-tests.tgz" -C "$work" logs
echo "wrote $out/summary.json and $out/gpu-tests.tgz"
exit $status
