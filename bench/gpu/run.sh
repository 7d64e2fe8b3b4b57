#!/usr/bin/env bash
# The one-shot measurement on a lent GPU machine: prerequisites, the `gpu` test tier, `tlt bench costs` at two
# real shapes (eager and compiled), and the pinned GPU workload, each phase under its own time budget, the
# whole within 8 minutes. docs/gpu.md ("Running the prepared script") says how to call it and what comes back.
#
#   bash bench/gpu/run.sh            on the device machine, from the repository root, with $OUT an empty folder
#   bash bench/gpu/run.sh --dry-run  on any machine: the plan, the carry and its size, every command parsed
#
# The device machine is bare and offline: its python3 holds torch with CUDA but not Ray, pydantic or
# math-verify. The project runs from the source tree (PYTHONPATH), the missing packages come as carried wheels
# (installed with pip --no-index into a folder on PYTHONPATH), the warm starts as a carried cache
# ($TLT_CACHE_DIR): all under bench/gpu/carry (`make gpu-carry` builds it). Ray's wheel does not fit beside
# the source tree in a call's 64 MiB, so the workload runs as `tlt bench worker` (one rollout worker alone,
# vanilla vs tlt, no Ray) unless Ray is importable there, when it runs as `tlt bench run`.
#
# Results: $OUT/summary.json (each phase: rc, seconds, budget, status), $OUT/machine.json, $OUT/run.log and
# $OUT/results.tar.gz (every phase's log and JSON, the tier's junit), rewritten after every phase, so a phase
# that overruns loses only its own results (each is killed 10 s after its budget: 530 s at the most in all).
# Environment: TLT_GPU_PYTHON (default python3), TLT_GPU_CARRY (default bench/gpu/carry), TLT_GPU_MIN_FREE_GIB
# (default 20). Exit status: 0 every phase ok, 1 a prerequisite failed (nothing else ran), 2 bad usage or no
# $OUT, 3 some phase failed or ran out of time (summary.json says which).
set -euo pipefail

MODE=run
case "${1:-}" in
  "") ;;
  --dry-run) MODE=dry ;;
  *) echo "usage: bash bench/gpu/run.sh [--dry-run]" >&2; exit 2 ;;
esac

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
PY=${TLT_GPU_PYTHON:-python3}
CARRY=$(realpath -m "${TLT_GPU_CARRY:-bench/gpu/carry}")
MIN_FREE_GIB=${TLT_GPU_MIN_FREE_GIB:-20}
WORKLOAD=bench/workload-gpu-v1.yaml
TOTAL_BUDGET_S=480
SITE=${TMPDIR:-/tmp}/tlt-gpu-site
W=${TMPDIR:-/tmp}/tlt-gpu-work
export PYTHONPATH="$SITE:$ROOT:$ROOT/operator:$ROOT/components${PYTHONPATH:+:$PYTHONPATH}"
export TLT_CACHE_DIR="$CARRY/cache" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 \
  TOKENIZERS_PARALLELISM=false
TLT=("$PY" -m tlt.cli)
# Modules the phases import: the device must hold them (checked by the dry run against its package list).
MODULES=(tlt.cli tlt.commands.bench tlt.bench.cost_terms tlt.bench.worker_alone tlt.bench.policy_group_rank tlt.workers.rollout
  tlt.runtime.local_executor)

# The phases after the prerequisites, in order: name, budget (s), signal that ends it at its budget (pytest
# writes its junit on INT), and its command.
# Budgets from the H100 run (docs/gpu.md): the tier took 117 s with -n 8 (cold Triton compiles), the 7B's two
# compiled target graphs 41.5 + 56.7 s cold, an eager cost step 20-30 ms. The workload's GPU time is not known:
# on this CPU one shard of it (both variants) takes ~6 s. Its JSON is rewritten after every repeat: as many of
# the 3 repeats as fit are kept (`repeats_done`), the phase then reported as a timeout.
# The policy's update at Qwen2.5-0.5B's shape on one GPU (one rank: a group needs a GPU a rank): ~35 s on this
# CPU's two cores, seconds of a GPU's after a ~10 s start; its budget is taken from the workload's.
PHASES=(gpu-tests costs-0.5b costs-7b update-0.5b workload costs-7b-compiled)
declare -A BUDGET=([prereq]=40 [gpu-tests]=120 [costs-0.5b]=35 [costs-7b]=45 [update-0.5b]=30 [workload]=90
  [costs-7b-compiled]=120)
declare -A SIGNAL=([gpu-tests]=INT)
COSTS=(bench costs --device cuda --dtype bfloat16 --context 1024 --repeats 5 --draft-vocab 0,32768)
GRID=(--batches 1,4,16,64 --depths 1,2,3,4)
phase_argv() {  # the command of phase $1 (workload: $2 is "ray" when Ray is importable)
  case "$1" in
    gpu-tests) echo "$PY -m pytest -m gpu tests/gpu -q -p no:cacheprovider ${XDIST:-} --junitxml $W/gpu-tests.xml" ;;
    costs-0.5b) echo "${TLT[*]} ${COSTS[*]} --shape qwen2.5-0.5b ${GRID[*]} --json $W/costs-qwen2.5-0.5b.json" ;;
    costs-7b) echo "${TLT[*]} ${COSTS[*]} --shape qwen2.5-7b ${GRID[*]} --json $W/costs-qwen2.5-7b.json" ;;
    update-0.5b)
      echo "${TLT[*]} bench policy-group --device cuda --shape qwen2.5-0.5b --rounds 2 --json $W/update-qwen2.5-0.5b.json" ;;
    costs-7b-compiled)
      echo "${TLT[*]} ${COSTS[*]} --shape qwen2.5-7b --compile --batches 1 --depths 3 --json $W/costs-qwen2.5-7b-compiled.json" ;;
    workload)
      if [[ "${2:-}" == ray ]]; then
        # no --work-dir: each run's folder holds checkpoints, too big to come back (16 MiB a file)
        echo "${TLT[*]} bench run --workload $WORKLOAD --repeats 1 --num-cpus 8 --json $W/workload-run.json"
      else
        echo "${TLT[*]} bench worker --workload $WORKLOAD --shards 4 --repeats 3 --json $W/workload-worker.json"
      fi ;;
  esac
}

source_commit() {  # the checkout's commit; on the device (a copy without .git) the one the last dry run stamped
  git -C "$ROOT" rev-parse --short HEAD 2>/dev/null && return
  cat "$CARRY/dry-run-commit" 2>/dev/null || echo unknown
}

json_str() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\n'/ }; printf '"%s"' "${s//$'\t'/ }"; }
ROWS=()
record() {  # name rc seconds status reason: one row of summary.json, rewritten with the tarball after each phase
  ROWS+=("{\"name\": $(json_str "$1"), \"budget_s\": ${BUDGET[$1]}, \"rc\": $2, \"seconds\": $3, \"status\": $(json_str "$4"),
 \"reason\": $(json_str "$5")}")
  local IFS=,
  printf '{"script": "bench/gpu/run.sh", "commit": %s, "total_budget_s": %s, "phases": [%s]}\n' \
    "$(json_str "$(source_commit)")" "$TOTAL_BUDGET_S" \
    "${ROWS[*]}" > "$OUT/summary.json"
  tar -czf "$OUT/results.tar.gz" -C "$W" . 2>/dev/null || true
}

fail_prereq() {  # reason
  echo "prerequisite failed: $1"
  record prereq 1 $(( $(date +%s) - STARTED )) failed "$1"
  for p in "${PHASES[@]}"; do record "$p" -1 0 skipped "prerequisites failed"; done
  exit 1
}

in_prereq_budget() {  # command...: run it within what is left of the prerequisites' budget
  local left=$(( STARTED + BUDGET[prereq] - $(date +%s) ))
  (( left > 0 )) || fail_prereq "the prerequisites ran past their ${BUDGET[prereq]} s"
  local rc=0
  timeout "$left" "$@" || rc=$?
  (( rc != 124 )) || echo "ran past the prerequisites' ${BUDGET[prereq]} s: $*"
  return "$rc"
}

prerequisites() {
  command -v "$PY" >/dev/null || fail_prereq "no $PY on PATH (set TLT_GPU_PYTHON to a python with torch and CUDA)"
  local out
  out=$(in_prereq_budget "$PY" -m tlt.bench.gpu_check cuda --min-free-gib "$MIN_FREE_GIB" 2>&1) || fail_prereq "$out"
  ls "$CARRY"/wheels/*.whl >/dev/null 2>&1 && [[ -d "$CARRY/cache/warmstart" ]] || \
    fail_prereq "no carry at $CARRY (wheels/*.whl, cache/warmstart): make gpu-carry, then carry bench/gpu/carry"
  out=$(in_prereq_budget "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$CARRY"/wheels/*.whl 2>&1) || fail_prereq "the carried wheels did not install: $out"
  out=$(in_prereq_budget "$PY" -c "import $(IFS=,; echo "${MODULES[*]}")" 2>&1) || \
    fail_prereq "the project does not import: ${out: -600}"
  out=$(in_prereq_budget "$PY" -m tlt.bench.gpu_check carry --workload "$WORKLOAD" 2>&1) || fail_prereq "$out"
  in_prereq_budget "$PY" -m tlt.bench.gpu_check machine --out "$OUT/machine.json" || fail_prereq "machine.json not written"
  cp "$OUT/machine.json" "$W/"
}

run_phase() {  # name [ray]
  local name=$1 cmd started rc status
  cmd=$(phase_argv "$name" "${2:-}")
  echo "== $name (budget ${BUDGET[$name]} s): $cmd"
  started=$(date +%s)
  rc=0
  # shellcheck disable=SC2086  # the command is words without quoting needs (paths without spaces)
  timeout -s "${SIGNAL[$name]:-TERM}" -k 10 "${BUDGET[$name]}" $cmd > "$W/$name.log" 2>&1 || rc=$?
  if (( rc == 0 )); then status=ok; elif (( rc == 124 || rc == 137 )); then status=timeout; else status=failed; fi
  [[ "$name" == gpu-tests && "$status" == timeout ]] && status="timeout (junit up to the interrupt)"
  echo "   $status, rc $rc, $(( $(date +%s) - started )) s; last lines:"; tail -n 4 "$W/$name.log" | sed 's/^/   | /'
  local reason=""
  [[ "$status" != ok ]] && reason=$(grep -v '^[[:space:]]*$' "$W/$name.log" | tail -n 1 | cut -c1-300)
  record "$name" "$rc" $(( $(date +%s) - started )) "$status" "$reason"
  [[ "$status" == ok ]] || FAILED+=("$name")
}

plan() {
  local total=${BUDGET[prereq]} p
  printf 'phase               budget s  command\n'
  printf '%-19s %8s  %s\n' prereq "${BUDGET[prereq]}" "python/torch/CUDA (>= $MIN_FREE_GIB GiB free), carry, \
wheels -> $SITE, project imports, warm starts, machine.json"
  for p in "${PHASES[@]}"; do
    total=$(( total + BUDGET[$p] ))
    printf '%-19s %8s  %s\n' "$p" "${BUDGET[$p]}" "$(phase_argv "$p")"
    [[ "$p" == workload ]] && printf '%-19s %8s  %s\n' "  (with Ray)" "" "$(phase_argv "$p" ray)"
  done
  echo "total budget: $total s = $(( total / 60 )) min $(( total % 60 )) s (limit $TOTAL_BUDGET_S s);" \
    "a fresh machine's start (1-2 min) counts on top"
  (( total <= TOTAL_BUDGET_S )) || { echo "error: the budgets sum to $total s, over $TOTAL_BUDGET_S s"; return 1; }
}

dry_run() {
  local problems=() out argv line
  plan || problems+=("budgets over $TOTAL_BUDGET_S s")
  echo; echo "carry ($CARRY):"
  if [[ -d "$CARRY" ]]; then (cd "$CARRY" && find . -type f -printf '  %10s  %p\n' | sort -k2); fi
  out=$("$PY" -m tlt.bench.gpu_check sizes --root "$ROOT" --carry "$CARRY") || \
    problems+=("a device call would send more than 64 MiB: $out")
  echo "sizes (bytes): $out"
  echo; echo "checks:"
  if ! out=$("$PY" -m tlt.bench.gpu_check carry --workload "$WORKLOAD" 2>&1); then
    while IFS= read -r line; do problems+=("${line#missing: } (make gpu-carry)"); done <<< "$out"
  fi
  echo "  warm starts: ${out//$'\n'/; }"
  ls "$CARRY"/wheels/*.whl >/dev/null 2>&1 || problems+=("no wheels in $CARRY/wheels (make gpu-carry)")
  # the imports the phases need, with Ray blocked, against the device's package list and the carried wheels;
  # the tier's collection too (plugins off: the device has pytest-timeout and xdist, not this machine's others)
  out=$(PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "$PY" -c "import sys; sys.modules['ray'] = None
from tlt.bench.gpu_check import main
sys.exit(main(['imports', '--device-list', 'bench/gpu/device-packages.txt', '--wheels', '$CARRY/wheels',
               '--collect', 'tests/gpu', *sys.argv[1:]]))" \
    "${MODULES[@]}" 2>&1) || while IFS= read -r line; do problems+=("imports: $line"); done \
      < <(echo "$out" | grep -e '^not on the device' -e '^imports: ' -e 'Error' | tail -n 12)
  echo "  gpu tier collects without Ray, imports: $(echo "$out" | tail -n 1)"
  # every tlt command's arguments, parsed by the real parser in one process (`---` between commands)
  argv=()
  for p in "${PHASES[@]}" workload-ray; do
    [[ "$p" == gpu-tests ]] && continue
    # shellcheck disable=SC2206  # the commands are words without quoting needs
    if [[ "$p" == workload-ray ]]; then argv+=(--- $(phase_argv workload ray)); else argv+=(--- $(phase_argv "$p")); fi
  done
  out=$("$PY" -c "import sys
from tlt.cli import build_parser
cmds = ' '.join(sys.argv[1:]).split('--- ')[1:]
for cmd in cmds:
    args = cmd.split()[3:]  # after: python -m tlt.cli
    build_parser(next(a for a in args if not a.startswith('-'))).parse_args(args)
print(f'{len(cmds)} tlt commands parse')" "${argv[@]}" 2>&1) || problems+=("a tlt command does not parse: $out")
  echo "  arguments: $out"
  echo
  if (( ${#problems[@]} )); then printf 'problem: %s\n' "${problems[@]}"; return 1; fi
  # the copy of the tree on the device has no .git: the commit (and whether files were uncommitted) travels here
  echo "$(git rev-parse --short HEAD 2>/dev/null || echo unknown) (dry run at $(date -u +%FT%TZ)," \
    "$(git status --porcelain 2>/dev/null | grep -vc '^!!') files uncommitted)" > "$CARRY/dry-run-commit"
  echo "dry run: ok (device call: command 'bash bench/gpu/run.sh', carry ['bench/gpu/carry'], timeout_s 600)"
}

if [[ "$MODE" == dry ]]; then
  dry_run
  exit $?
fi

[[ -n "${OUT:-}" && -d "$OUT" ]] || { echo "OUT must name an existing folder (the device tool sets it)" >&2; exit 2; }
rm -rf "$W" && mkdir -p "$W"
exec > >(tee "$OUT/run.log") 2>&1
TEE=$!
trap 'exec 1>&- 2>&-; wait "$TEE" 2>/dev/null || true' EXIT  # run.log complete before the call returns
STARTED=$(date +%s)
RAY=no
echo "== prereq (budget ${BUDGET[prereq]} s)"
prerequisites
"$PY" -c "import ray" 2>/dev/null && RAY=ray
"$PY" -c "import xdist" 2>/dev/null && XDIST="-n 8"
record prereq 0 $(( $(date +%s) - STARTED )) ok "ray: $RAY, xdist: ${XDIST:-no}"
FAILED=()
for p in "${PHASES[@]}"; do run_phase "$p" "$RAY"; done
echo "== done in $(( $(date +%s) - STARTED )) s; not ok: ${FAILED[*]:-none}"; cat "$OUT/summary.json"
(( ${#FAILED[@]} == 0 )) || exit 3
