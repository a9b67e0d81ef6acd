#!/usr/bin/env bash
# deploy/slurm/eval_array.sbatch on a real one-node Slurm cluster:
#
#  1. stands up Slurm on this machine from Debian's packages (slurm-wlm and
#     munge, installed with apt-get when missing and we are root): a
#     private munged, slurmctld and slurmd on loopback, with a slurm.conf
#     written into a scratch folder for this node's real CPUs and memory
#     (SLURM_CONF points the client commands at it; /etc is not touched);
#  2. checks that submit mode refuses, before submitting anything, a missing
#     binary, a missing data file and more CPUs than the node has;
#  3. submits the array (3 shards) and the merge on stories260K (ppl on
#     TinyStories, COPA; full, window, h2o at 100% and 50%) and compares the
#     merged results with an unsharded `kvslim eval` of the same
#     configuration: results.md byte-identical, results.jsonl the same rows
#     in the same order apart from timings and unix_time, floats to a
#     relative 1e-12 (what `kvslim eval merge` guarantees, see
#     crates/eval/tests/shards.rs), the same charts in plots/ (but those of
#     step times); logs in OUT/logs, none in the submit directory;
#  4. submits the same run again into the same OUT (shards skip their
#     finished cells, the merge replaces OUT/merged): same results;
#  5. makes shard 1 of a fresh run fail: the merge job runs anyway
#     (afterany), names shard 1 and fails; after the cause is removed, a
#     second submission into that OUT completes with the same results.
# Stops the daemons it started (by pid) and removes its scratch folder.
#
# Reads the model and data from ../shared (KVSLIM_SHARED=DIR when the
# clone has none beside it, e.g. a clone in /tmp). Builds kvslim with cargo
# when target/release/kvslim is missing, or takes KVSLIM=path.
#   bash scripts/slurm_check.sh
#   KVSLIM_SHARED=/work/shared KVSLIM=/path/to/kvslim bash scripts/slurm_check.sh
# TIMEOUT (seconds, default 600) bounds the wait for each submission.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
TIMEOUT=${TIMEOUT:-600}

fail() {
    echo "FAILED: $*" >&2
    exit 1
}

S=${KVSLIM_SHARED:-../shared}
[ -f "$S/models/stories260K/stories260K.bin" ] ||
    fail "$S/models/stories260K/stories260K.bin not found: clone beside shared/ (so ../shared resolves) or set KVSLIM_SHARED=/path/to/shared"
S=$(realpath "$S")

if [ -z "${KVSLIM:-}" ]; then
    KVSLIM=${CARGO_TARGET_DIR:-target}/release/kvslim
    if [ ! -x "$KVSLIM" ]; then
        echo "building kvslim (cargo build --release -p kvslim)" >&2
        cargo build --release -p kvslim >&2
    fi
fi
[ -x "$KVSLIM" ] || fail "KVSLIM=$KVSLIM is not an executable file"
KVSLIM=$(realpath "$KVSLIM")

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null ||
    ! command -v munged >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing slurm-wlm and munge (apt-get)" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null
    else
        fail "slurmctld, slurmd, sbatch or munged not found; install them (Debian: apt-get install slurm-wlm munge)"
    fi
fi
[ "$(id -u)" = 0 ] || fail "run as root: slurmd starts jobs as their user, which only root can do"

D=$(mktemp -d /tmp/kvslim-slurm.XXXXXX)
PIDS=()
cleanup() {
    # jobs first (their processes belong to slurmd's steps), then the daemons, newest first
    if [ -f "$D/slurm.conf" ] && [ ${#PIDS[@]} -gt 1 ]; then
        SLURM_CONF=$D/slurm.conf scancel --quiet --full --user=root 2>/dev/null || true
        sleep 1
    fi
    for ((k = ${#PIDS[@]} - 1; k >= 0; k--)); do kill "${PIDS[k]}" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    done
    if [ "${KEEP:-0}" = 1 ]; then echo "kept $D" >&2; else rm -rf "$D"; fi
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

echo "== one-node Slurm in $D"
# munge with its own key and socket, so a munged already running is left alone
dd if=/dev/urandom of="$D/munge.key" bs=1024 count=1 status=none
chmod 600 "$D/munge.key"
munged -F --force --socket="$D/munge.sock" --key-file="$D/munge.key" --log-file="$D/munged.log" \
    --pid-file="$D/munged.pid" --seed-file="$D/munged.seed" 2>"$D/munged.err" &
PIDS+=($!)
for _ in $(seq 100); do [ -S "$D/munge.sock" ] && break; sleep 0.1; done
[ -S "$D/munge.sock" ] || { cat "$D"/munged.* >&2; fail "munged did not start"; }

# the node as slurmd sees it (name, CPUs, sockets, cores, memory), so jobs fit it exactly
NODE_LINE=$(slurmd -C | grep '^NodeName=')
NODE=$(sed 's/^NodeName=\([^ ]*\).*/\1/' <<<"$NODE_LINE")
NODE_HW=$(sed 's/^NodeName=[^ ]* //; s/ *UpTime=.*//' <<<"$NODE_LINE")
mkdir -p "$D/state" "$D/spool"
cat >"$D/slurm.conf" <<EOF
ClusterName=kvslimcheck
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$(port)
SlurmdPort=$(port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge.sock
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/slurmctld.log
SlurmdLogFile=$D/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
# ended jobs stay visible to scontrol for the checks below
MinJobAge=3600
NodeName=$NODE NodeAddr=127.0.0.1 $NODE_HW State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$D/slurm.conf
slurmctld -D -c -f "$SLURM_CONF" >"$D/slurmctld.out" 2>&1 &
PIDS+=($!)
slurmd -D -f "$SLURM_CONF" >"$D/slurmd.out" 2>&1 &
PIDS+=($!)
for _ in $(seq 120); do
    [ "$(sinfo -h -o %T 2>/dev/null)" = idle ] && break
    sleep 0.5
done
[ "$(sinfo -h -o %T 2>/dev/null)" = idle ] || {
    tail -n 20 "$D"/slurmctld.log "$D"/slurmd.log "$D"/*.out >&2 || true
    fail "the node did not come up idle: $(sinfo 2>&1)"
}
sinfo -N -o '%N %c %m %T'

# the run: tiny (10 cells), so each submission ends within seconds
SUBMIT="$REPO/deploy/slurm/eval_array.sbatch"
export KVSLIM MODEL=$S/models/stories260K/stories260K.bin N=3 CPUS=1
export TASKS="ppl:$S/data/tinystories/tinystories_val.txt,seq_len=64,limit=2;mc:$S/data/copa/copa.jsonl,limit=4"
export POLICIES="full;window;h2o" BUDGETS="100%,50%"
unset MEM PARTITION ACCOUNT QOS SBATCH_ARGS KVSLIM_MODELS

echo "== the unsharded run"
"$KVSLIM" eval --model "$MODEL" --threads 1 --policies "$POLICIES" --budgets "$BUDGETS" --tasks "$TASKS" \
    --out "$D/whole" 2>"$D/whole.log" || { cat "$D/whole.log" >&2; fail "the unsharded run failed"; }

echo "== submit mode refuses what cannot run, before submitting"
refused() { # what, expected message, then VAR=value ...
    local what=$1 msg=$2 out
    shift 2
    if out=$(env "$@" OUT="$D/refused" bash "$SUBMIT" submit 2>&1); then
        fail "$what: submitted anyway: $out"
    fi
    grep -qF -- "$msg" <<<"$out" || fail "$what: expected \"$msg\" in: $out"
    echo "  $what: $(tail -n 1 <<<"$out")"
}
refused "missing binary" "KVSLIM=$D/nothing" KVSLIM="$D/nothing"
refused "missing data file" "$D/nothing.jsonl does not exist" TASKS="mc:$D/nothing.jsonl"
refused "more CPUs than the node" "CPUS=999, but the largest node" CPUS=999
refused "more memory than the node" "MEM=99999G, but the largest node" MEM=99999G
[ -z "$(squeue -h)" ] || fail "a refused submission left jobs: $(squeue)"

# Submits the run into OUT from a scratch directory (where Slurm's default
# log files would land) and waits until its array and merge job have left
# the queue; fails on a job left pending (e.g. DependencyNeverSatisfied).
submit() { # OUT
    local out=$1 cwd=$D/submit-cwd
    mkdir -p "$cwd"
    (cd "$cwd" && OUT=$out bash "$SUBMIT" submit) || fail "submit into $out failed"
    read -r ARRAY MERGE <"$out/logs/last-submit"
    local t0=$SECONDS
    # -j alone would list ended jobs too
    while [ -n "$(squeue -h -j "$ARRAY,$MERGE" -t PENDING,CONFIGURING,RUNNING,COMPLETING,SUSPENDED 2>/dev/null)" ]; do
        if [ $((SECONDS - t0)) -gt "$TIMEOUT" ]; then
            squeue -j "$ARRAY,$MERGE" -o '%i %T %r' >&2
            fail "jobs still queued after ${TIMEOUT}s"
        fi
        if squeue -h -j "$ARRAY,$MERGE" -o '%r' | grep -qE 'DependencyNeverSatisfied|PartitionConfig'; then
            squeue -j "$ARRAY,$MERGE" -o '%i %T %r' >&2
            fail "a job can never start"
        fi
        sleep 1
    done
    [ -z "$(ls "$cwd")" ] || fail "files in the submit directory: $(ls "$cwd")"
}
state() { scontrol show job "$1" -o | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
shard_states() { scontrol show job "$ARRAY" -o | grep -o 'JobState=[A-Z_]*' | cut -d= -f2 | sort | uniq -c | xargs; }

same_results() { # MERGED_DIR
    cmp -s "$1/results.md" "$D/whole/results.md" || {
        diff "$1/results.md" "$D/whole/results.md" | head -20 >&2
        fail "$1/results.md differs from the unsharded run's"
    }
    # the charts are redrawn from the merged rows: the same, but for those of step times
    [ "$(ls "$1/plots")" = "$(ls "$D/whole/plots")" ] || fail "$1/plots holds other charts than the unsharded run's"
    diff -rq --exclude='*step_ms*' "$1/plots" "$D/whole/plots" >&2 || fail "$1/plots differs from the unsharded run's"
    python3 - "$1/results.jsonl" "$D/whole/results.jsonl" <<'EOF' || fail "$1/results.jsonl differs from the unsharded run's"
import json, math, sys
def rows(p):
    out = [json.loads(l) for l in open(p) if l.strip()]
    for r in out:
        r.pop("timings", None)  # wall-clock times of this run
        r.pop("unix_time", None)
    return out
def same(a, b):
    if isinstance(a, float) or isinstance(b, float):
        # the last bit or two of a float differ from run to run (crates/eval/tests/shards.rs)
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and (
            a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-12 * max(abs(a), abs(b)))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b
x, y = rows(sys.argv[1]), rows(sys.argv[2])
if len(x) != len(y):
    sys.exit(f"{len(x)} rows, the unsharded run has {len(y)}")
for i, (u, v) in enumerate(zip(x, y)):
    if not same(u, v):
        sys.exit(f"row {i} differs:\n{u}\n{v}")
EOF
}

echo "== the array and the merge"
submit "$D/run"
[ "$(state "$MERGE")" = COMPLETED ] || { cat "$D"/run/logs/*merge* >&2; fail "merge job $MERGE: $(state "$MERGE")"; }
same_results "$D/run/merged"
logs=$(ls "$D/run/logs" | grep -c '\.log$')
[ "$logs" = 4 ] || fail "expected 3 shard logs and 1 merge log in OUT/logs, found: $(ls "$D/run/logs")"
echo "  shards: $(shard_states), merge: COMPLETED; merged results match the unsharded run; 4 logs in OUT/logs"

echo "== the same run again into the same OUT"
submit "$D/run"
[ "$(state "$MERGE")" = COMPLETED ] || { cat "$D"/run/logs/*merge-"$MERGE"* >&2; fail "re-run merge job $MERGE: $(state "$MERGE")"; }
grep -q "done, skipped" "$D/run/logs/kvslim-eval-${ARRAY}_0.log" || fail "the re-run shard 0 did not skip its finished cells"
same_results "$D/run/merged"
echo "  shards: $(shard_states) (finished cells skipped), merge: COMPLETED, merged results replaced and still match"

echo "== a failing shard"
mkdir -p "$D/fail"
echo "a file where shard 1's folder goes: shard 1 cannot write" >"$D/fail/shard-1"
submit "$D/fail"
[ "$(state "$MERGE")" = FAILED ] || fail "merge job $MERGE after a failed shard: $(state "$MERGE"), expected FAILED"
mlog="$D/fail/logs/kvslim-eval-merge-$MERGE.log"
grep -q "shard 1/3 failed" "$mlog" || { cat "$mlog" >&2; fail "the merge log does not name shard 1"; }
! grep -qE "shard [02]/3 failed" "$mlog" || { cat "$mlog" >&2; fail "the merge log names a shard that succeeded"; }
[ ! -e "$D/fail/merged/results.jsonl" ] || fail "merged despite a failed shard"
echo "  shards: $(shard_states), merge: FAILED, saying:"
sed 's/^/    /' "$mlog"
rm "$D/fail/shard-1"
submit "$D/fail"
[ "$(state "$MERGE")" = COMPLETED ] || { cat "$D"/fail/logs/*merge-"$MERGE"* >&2; fail "merge job $MERGE after the fix: $(state "$MERGE")"; }
same_results "$D/fail/merged"
echo "  after the fix, submitted again: shards: $(shard_states), merge: COMPLETED; results match"

echo "PASSED: submit checks, array + afterany merge = the unsharded run, re-run into the same OUT, failed shard reported"
