#!/usr/bin/env bash
# Every GPU measurement the project still owes, in as few calls as a 30-minute lease allows.
#
#   bash benchmarks/gpu_runbook.sh check        # CUDA tests, then train_throughput at 4 x 2048 (the README's row)
#   bash benchmarks/gpu_runbook.sh attention    # ours with causal_sdpa vs ours with HF's compiled mask (flash or not)
#   bash benchmarks/gpu_runbook.sh batch        # ours and HF eager at 8 and 16 x 2048: how far batching moves MFU
#   bash benchmarks/gpu_runbook.sh profile      # where our step's time goes (top ops; Chrome trace in $OUT)
#   bash benchmarks/gpu_runbook.sh autotune     # matmul layout autotuning on the 1b/8b Linear shapes, bf16
#   bash benchmarks/gpu_runbook.sh memory       # CUDA allocator peak vs the fake-tensor trace vs the planner (1b)
#   bash benchmarks/gpu_runbook.sh checkpoint   # the stall of a blocking save vs --async-checkpoint (1b, bf16 step)
#
# Each stage fits one 10-minute call on an H100 (the 1.1B compile takes about a minute). Logs go to
# $OUT (or runs/gpu_runbook/ when $OUT is unset) and the last lines printed are the figures.
# Nothing here needs wandb, datasets or evaluate, so no wheels have to travel. The predictions these runs
# test are in benchmarks/results/throughput_notes.md.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
stage="${1:?usage: bash benchmarks/gpu_runbook.sh check|attention|batch|profile|autotune|memory|checkpoint}"
out="${OUT:-runs/gpu_runbook}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PY:-python3}"
log() { "$@" 2>&1 | tee -a "$out/$stage.log"; }

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv | tee "$out/$stage.log"
case "$stage" in
check)
    log "$PY" -m pytest -q -p no:cacheprovider tests/test_gpu.py
    log "$PY" benchmarks/train_throughput.py --batch 4
    ;;
attention)
    log "$PY" benchmarks/train_throughput.py --which attention --batch 4 --steps 15
    ;;
batch)
    for b in 8 16; do log "$PY" benchmarks/train_throughput.py --batch "$b" --steps 15; done
    ;;
profile)
    log "$PY" benchmarks/train_throughput.py --which ours --batch 4 --steps 10 --profile 3 --trace "$out/ours_trace.json"
    ;;
autotune)
    log "$PY" benchmarks/matmul_autotune.py --presets 1b,8b --m 2048,8192
    ;;
memory)
    log "$PY" benchmarks/memory_validation.py --cuda
    ;;
checkpoint)
    log "$PY" benchmarks/checkpoint_stall.py --size 1b --seq 2048 --batch 2 --steps 4 --dir "$out/ckpt"
    ;;
*)
    echo "unknown stage $stage: use check, attention, batch, profile, autotune, memory or checkpoint" >&2
    exit 2
    ;;
esac
echo "== $stage: summary"
grep -E "passed|failed|speedup|MFU|peak memory|geomean|pays|configurations|^1b|^tiny|waits|stall" "$out/$stage.log" | tail -20
