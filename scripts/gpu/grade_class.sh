#!/usr/bin/env bash
# The instructor's grading of the synthetic class, run on this host and recorded as JSON.
#
# tests/fixtures/course is copied to a temporary folder; `nbgrader generate_assignment labfx`
# releases its lab, scripts/make_synthetic_class.py writes one submission per case (correct,
# partly wrong, empty, every cheat, every resource abuse, corrupt), as tests/test_grading.py
# does; then the parallel `python3 -m autograde grade labfx` grades the class (and nbgrader's
# sequential `nbgrader autograde labfx` grades a second copy beside it, for as long as the
# time budget allows), `nbgrader generate_feedback labfx` and `nbgrader export` follow. Every
# student's score, status and reasons are compared with what this grading environment should
# give (scripts/gpu/grade_class_expected.py: tests/test_grading.py's EXPECTED, with the
# GPU-only cells graded when the environment is the GPU).
#
# Usage, from the repository root:
#   OUT=DIR bash scripts/gpu/grade_class.sh
# writes DIR/grading_gpu.json (grading_<GRADING_ENV>.json), DIR/grade_class.log (this
# script's log) and DIR/grading_logs.tgz (the steps' logs, the status ledgers, the autograded
# notebooks, one feedback page, grades.csv). Exit status: 0 every student as expected and
# every check passed (feedback, export, sequential = parallel, nothing reached the grader's
# loopback), 1 otherwise, 2 the run could not be set up.
#
# Settings (environment variables):
#   GRADING_ENV  gpu (default), cpu or auto: c.AutogradeSettings.environment for the run; the
#                expected table is the one of the environment the log reports
#   SANDBOX      auto (default), bwrap or none: c.AutogradeSettings.sandbox
#   SEQUENTIAL   beside (default: nbgrader's sequential run on a second copy while the
#                parallel command runs; its kernels use other uids), after, or 0 (none)
#   WORKERS      workers of the parallel command (default: on the CPU its own choice, cores
#                and memory; otherwise half the cores, 2 to 8, which leaves room for the
#                sequential run and for Triton's compilations inside the lab's 5 s cells)
#   BUDGET_S     seconds for the whole run (default 200): the sequential run is stopped in
#                time for the report, and what it finished is compared
#   PYTHON       the interpreter (default python3)
#   WHEELS       the folder of wheels installed where nbgrader is missing (default .whl)
#   KEEP_WORK=1  keep the temporary course folders (/tmp/grade_class.*)
#
# A host without nbgrader (the GPU machines: torch and Triton, no Jupyter) gets the wheels in
# .whl/ installed into /tmp/site and the repository put on PYTHONPATH; the grading kernels
# are given the same folders (c.AutogradeSettings.extra_python_paths). Without bwrap,
# Debian's bubblewrap from .whl/deb/ is unpacked into /tmp/bw. SANDBOX=auto falls back to a
# plain kernel where bubblewrap cannot run; the JSON records the sandbox actually used.
set -u -o pipefail

: "${OUT:?set OUT to the folder for the results}"
GRADING_ENV=${GRADING_ENV:-gpu}
SANDBOX=${SANDBOX:-auto}
SEQUENTIAL=${SEQUENTIAL:-beside}
BUDGET_S=${BUDGET_S:-200}
WORKERS=${WORKERS:-}
if [ -z "$WORKERS" ] && [ "$GRADING_ENV" != cpu ]; then
  WORKERS=$(( $(nproc) / 2 )); [ "$WORKERS" -gt 8 ] && WORKERS=8; [ "$WORKERS" -lt 2 ] && WORKERS=2
fi
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
A=labfx
REPO=$PWD
START_NS=$(date +%s%N)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

elapsed() { echo $(( ($(date +%s%N) - START_NS) / 1000000000 )); }
left() { echo $(( BUDGET_S - $(elapsed) )); }
# up_to N: N seconds, or what the budget leaves after 15 s for the report
up_to() { local l=$(( $(left) - 15 )); echo $(( l < $1 ? l : $1 )); }

# step NAME SECONDS DIR COMMAND...: run COMMAND in DIR under `timeout`, its output in
# logs/NAME.log; steps.tsv gets NAME, exit status, milliseconds and the command.
step() {
  local name=$1 limit=$2 dir=$3; shift 3
  local t0 rc ms
  [ "$limit" -lt 10 ] && limit=10
  t0=$(date +%s%N)
  echo "== $(date +%T) (+$(elapsed) s) $name (limit ${limit} s): $*"
  (cd "$dir" && timeout -k 10 "$limit" "$@") > "$LOGS/$name.log" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$ms" "$*" >> "$WORK/steps.tsv"
  echo "$rc" > "$WORK/$name.rc"
  tail -n 4 "$LOGS/$name.log" | sed "s/^/   [$name] /"
  echo "   [$name] exit $rc after $(( ms / 1000 )) s"
  return "$rc"
}

# add_config COURSE LINE...: lines appended to the copy's nbgrader_config.py
add_config() {
  local course=$1; shift
  printf '\n# --- set by scripts/gpu/grade_class.sh\n' >> "$course/nbgrader_config.py"
  printf '%s\n' "$@" >> "$course/nbgrader_config.py"
}

main() {
  if [ ! -d tests/fixtures/course ] || [ ! -f scripts/make_synthetic_class.py ]; then
    echo "run this from the repository root"; return 2
  fi
  WORK=$(mktemp -d /tmp/grade_class.XXXXXX)
  LOGS=$WORK/logs
  mkdir -p "$LOGS"
  export PYTHONUNBUFFERED=1
  echo "== grade_class: environment $GRADING_ENV, sandbox $SANDBOX, sequential $SEQUENTIAL," \
       "budget $BUDGET_S s, work folder $WORK"

  # 1. nbgrader and the course's packages, for this process and for the grading kernels
  local installed=none kernel_paths=()
  if (cd / && "$PY" -c "import nbgrader, ipykernel") 2>/dev/null \
     && ! (cd / && env -u PYTHONPATH "$PY" -c "import nbgrader, ipykernel") 2>/dev/null \
     && [ -d /tmp/site/nbgrader ]; then
    # already installed from the wheels by the caller (scripts/gpu/check.py): the kernels
    # need the same folder, since the sandbox gives them a PYTHONPATH of their own
    installed="$WHEELS -> /tmp/site (by the caller)"
    kernel_paths+=(/tmp/site)
  elif ! (cd / && "$PY" -c "import nbgrader") 2>/dev/null; then
    if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
      echo "nbgrader is not installed and $WHEELS/ holds no wheels"; return 2
    fi
    step wheels 180 "$REPO" "$PY" -m pip install -q --no-index --no-deps --no-compile \
      --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl || return 2
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
    # nbconvert's templates (the feedback pages) are data files: /tmp/site/share/jupyter
    export JUPYTER_PATH=/tmp/site/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}
    installed="$WHEELS -> /tmp/site"
    kernel_paths+=(/tmp/site)
  fi
  # Installed packages (pip install -e .) reach the kernels through the interpreter's own
  # site-packages; packages found only through PYTHONPATH (a GPU host without an install)
  # do not, since the sandbox's kernels get a PYTHONPATH of their own: link them.
  if ! (cd / && env -u PYTHONPATH "$PY" -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('autograde')
and u.find_spec('source_kernels')))") 2>/dev/null; then
    export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$REPO
    # the kernels see the two packages only, not the whole repository
    mkdir -p "$WORK/pkgs"
    ln -s "$REPO/autograde" "$WORK/pkgs/autograde"
    ln -s "$REPO/source_kernels" "$WORK/pkgs/source_kernels"
    kernel_paths+=("$WORK/pkgs")
  fi
  command -v alembic >/dev/null || echo "   warning: no alembic executable on PATH (nbgrader" \
    "runs it to create the gradebook)"

  # 2. bubblewrap
  local bwrap
  bwrap=$(command -v bwrap || true)
  if [ -z "$bwrap" ] && ls .whl/deb/bubblewrap_*.deb >/dev/null 2>&1; then
    mkdir -p /tmp/bw
    dpkg -x .whl/deb/bubblewrap_*.deb /tmp/bw
    local libs=""
    for pair in libcap.so.2:libcap2 libselinux.so.1:libselinux1; do
      if ! ldconfig -p | grep -q "${pair%%:*}" && ls .whl/deb/"${pair##*:}"_*.deb >/dev/null 2>&1
      then
        dpkg -x .whl/deb/"${pair##*:}"_*.deb /tmp/bw
        libs=/tmp/bw/lib/x86_64-linux-gnu:/tmp/bw/usr/lib/x86_64-linux-gnu
      fi
    done
    mkdir -p /tmp/bw/bin
    if [ -n "$libs" ]; then      # bwrap clears the environment of what it starts
      printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec /tmp/bw/usr/bin/bwrap "$@"\n' "$libs" \
        > /tmp/bw/bin/bwrap
    else
      ln -sf /tmp/bw/usr/bin/bwrap /tmp/bw/bin/bwrap
    fi
    chmod 755 /tmp/bw/bin/bwrap
    export PATH=/tmp/bw/bin:$PATH
    bwrap="/tmp/bw/bin/bwrap (Debian's bubblewrap from .whl/deb${libs:+, with its libraries})"
    echo "   bubblewrap unpacked: $bwrap"
  fi
  "$PY" -m autograde.isolation.sandbox check 2>&1 | sed 's/^/   /'

  local command="OUT=$OUT GRADING_ENV=$GRADING_ENV SANDBOX=$SANDBOX SEQUENTIAL=$SEQUENTIAL"
  command+=" BUDGET_S=$BUDGET_S${WORKERS:+ WORKERS=$WORKERS} bash scripts/gpu/grade_class.sh"
  GC_COMMAND=$command GC_WHEELS=$installed GC_BWRAP=${bwrap:-none} "$PY" - "$WORK/settings.json" <<EOF
import json, os, sys
json.dump({"command": os.environ["GC_COMMAND"], "grading_env": "$GRADING_ENV",
           "sandbox": "$SANDBOX", "sequential": "$SEQUENTIAL", "workers": "$WORKERS" or None,
           "budget_s": $BUDGET_S, "wheels_installed": os.environ["GC_WHEELS"],
           "bwrap": os.environ["GC_BWRAP"]}, open(sys.argv[1], "w"), indent=1)
EOF

  # 3. the course: the fixture, the grading environment, the kernels' import path
  local par=$WORK/par seq=$WORK/seq paths="" p
  for p in "${kernel_paths[@]}"; do paths+="\"$p\", "; done
  cp -r tests/fixtures/course "$par"
  find "$par" -name __pycache__ -prune -exec rm -rf {} +
  add_config "$par" \
    "c.AutogradeSettings.environment = \"$GRADING_ENV\"" \
    "c.AutogradeSettings.sandbox = \"$SANDBOX\"" \
    "c.AutogradeSettings.extra_python_paths = list(c.AutogradeSettings.extra_python_paths) + [$paths]" \
    "c.AutogradeSettings.similarity_threshold = 0  # as tests/test_grading.py: scores and statuses"
  step generate_assignment 120 "$par" "$PY" -m nbgrader generate_assignment "$A" || return 2
  # one grading kernel of this configuration: its uid, network, limits, GPU
  step probe 90 "$par" "$PY" -m autograde probe

  # a listener on the grader's loopback: read_secrets tries it; no kernel may reach it
  "$PY" -c '
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(8)
open(sys.argv[1] + ".tmp", "w").write(str(s.getsockname()[1]))
import os; os.replace(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    conn, addr = s.accept()
    open(sys.argv[2], "a").write("%s:%s\n" % addr); conn.close()
' "$WORK/canary.port" "$WORK/canary.txt" &
  CANARY_PID=$!
  trap 'kill "$CANARY_PID" 2>/dev/null' EXIT
  for _ in $(seq 50); do [ -s "$WORK/canary.port" ] && break; sleep 0.2; done
  : > "$WORK/canary.txt"
  step synthetic_class 120 "$par" "$PY" "$REPO/scripts/make_synthetic_class.py" . \
    --canary-port "$(cat "$WORK/canary.port")" || return 2

  # 4. grading: the sequential run on a copy (beside: its kernels under other uids)
  local seq_pid=""
  if [ "$SEQUENTIAL" != 0 ]; then
    cp -a "$par" "$seq"
    [ "$SEQUENTIAL" = beside ] && add_config "$seq" "c.AutogradeSettings.kernel_uid = 64623"
  fi
  if [ "$SEQUENTIAL" = beside ]; then
    step sequential "$(( $(left) - 35 ))" "$seq" "$PY" -m nbgrader autograde "$A" &
    seq_pid=$!
  fi
  step parallel "$(( $(left) - 25 ))" "$par" "$PY" -m autograde grade "$A" \
    --json "$WORK/par_summary.json" ${WORKERS:+--workers "$WORKERS"}
  step generate_feedback "$(up_to 60)" "$par" "$PY" -m nbgrader generate_feedback "$A"
  step export "$(up_to 60)" "$par" "$PY" -m nbgrader export --to "$WORK/grades.csv"
  if [ -n "$seq_pid" ]; then
    wait "$seq_pid"
  elif [ "$SEQUENTIAL" = after ]; then
    step sequential "$(( $(left) - 15 ))" "$seq" "$PY" -m nbgrader autograde "$A"
  fi
  kill "$CANARY_PID" 2>/dev/null; wait "$CANARY_PID" 2>/dev/null

  # 5. the record
  local json=$OUT/grading_$GRADING_ENV.json rc
  GRADE_CLASS_ELAPSED_S=$(elapsed) step report 60 "$REPO" "$PY" \
    scripts/gpu/grade_class_report.py "$WORK" "$json"
  rc=$?
  sed -n '1,40p' "$LOGS/report.log"
  (cd "$WORK" && tar -czf "$OUT/grading_logs.tgz" --ignore-failed-read logs steps.tsv \
    settings.json $(ls -d par_summary.json grades.csv canary.txt par/autograde_status \
    par/autograded par/feedback/partly_wrong seq/autograde_status 2>/dev/null))
  echo "== done in $(elapsed) s: $json"
  [ -z "${KEEP_WORK:-}" ] && rm -rf "$WORK"
  [ "$rc" -ne 0 ] && return 2
  "$PY" -c "import json, sys; r = json.load(open('$json'))
sys.exit(0 if r['all_as_expected'] and r['all_checks_passed'] else 1)"
}

main 2>&1 | tee "$OUT/grade_class.log"
exit "${PIPESTATUS[0]}"
