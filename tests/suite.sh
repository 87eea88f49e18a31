#!/usr/bin/env bash
# The whole suite, as `make test` runs it: `tests/suite.sh PYTHON`.
#
# Every test is marked pure, system or real (tests/conftest.py). The foreground runs
# the system tests (processes, servers, sockets: mostly waiting on them), two files at a
# time, then the real ones (the default pair on llama.cpp and transformers) alone, with
# the cores they need. Both leave much of the machine idle: process starts, waits on
# sockets, the single-threaded Python between model calls. The pure part (toy and tiny
# models, no clock) fills that time: it runs beside them in the idle scheduling class
# (`chrt --idle`), which gets a core only when no other thread wants one, so the
# foreground runs as it would alone; once the foreground is done it has both cores.
# Where the idle class is not available, the pure part runs first, then the rest.
#
# Beside the pure part, the foreground runs with SPECSAMPLE_SHARE_CORES=0:
# backends/cpushare.py would count the idle-class work as a neighbour's and give the
# real models one thread where they have two, although that work gives way to them.
# Alone (no idle class), the rest keeps cpushare on, as users run it.
#
# Each part prints its 20 slowest tests (docs/testing.md: where the time goes), and the
# end its total wall time, whether the parts passed or not.
set -u
py=${1:?usage: tests/suite.sh PYTHON}
pure=(env OMP_NUM_THREADS=1 "$py" -m pytest -q -m pure -n auto --dist worksteal --durations=20)
run_rest() {  # the system tests, then the real ones, under the command prefix given (env ...); the status of both
    local system=("$@" "$py" -m pytest -q -m system -n 2 --dist loadfile --durations=20)
    local real=("$@" "$py" -m pytest -q -m real --durations=20)
    echo "${system[*]}"
    "${system[@]}"; local status=$?
    echo "${real[*]}"
    "${real[@]}" || status=1
    return $status
}
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
# Ctrl-C (or a TERM) ends the whole suite once the run in the foreground has stopped:
# pytest catches the interrupt and exits 2, which would otherwise just move on to the
# next run.
trap 'exit 130' INT TERM

if chrt --idle 0 true 2>/dev/null; then
    log=$(mktemp)
    echo "chrt --idle 0 ${pure[*]} (beside the rest; its output follows the rest's)"
    chrt --idle 0 "${pure[@]}" > "$log" 2>&1 &
    pure_pid=$!
    # A background job ignores Ctrl-C: on exit, stop it and its xdist workers, which
    # outlive a pytest stopped alone. (Not a session of its own, setsid: with the
    # kernel's autogroups each session gets an equal share of the cores, idle class
    # or not, and the pure part would take half of them from the rest.)
    trap 'pkill -TERM -P "$pure_pid" 2>/dev/null; kill -TERM "$pure_pid" 2>/dev/null; rm -f "$log"' EXIT
    run_rest env SPECSAMPLE_SHARE_CORES=0; rest_status=$?; rest_time=$(elapsed)
    wait "$pure_pid"; pure_status=$?; pure_time=$(elapsed)
    cat "$log"
    how="the rest ended at $rest_time s, the pure part beside it at $pure_time s"
else
    echo "${pure[*]}"
    "${pure[@]}"; pure_status=$?; pure_time=$(elapsed)
    run_rest env; rest_status=$?; rest_time=$(( $(elapsed) - pure_time ))
    how="the pure part $pure_time s, then the rest $rest_time s"
fi
total=$(elapsed)
echo "make test: $((total / 60)) min $((total % 60)) s in all ($how)"
[ "$pure_status" -eq 0 ] && [ "$rest_status" -eq 0 ]
