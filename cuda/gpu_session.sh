#!/usr/bin/env bash
# Every GPU measurement xrl still owes, in one command, for a session that has a GPU for a few minutes.
#
#   bash cuda/gpu_session.sh OUT_DIR [tests|bench|all]
#
# Run from the repository root with the machine's own python3 (its CUDA build of torch). It needs no
# package beyond what the GPU image holds (torch, onnx, onnxruntime, torch-geometric, numpy): the
# measurement paths import neither gymnasium, hydra, egglog, highspy nor wandb (checked on the CPU by
# blocking those imports). Writes under OUT_DIR: the harness build log, the `gpu` test log, the
# benchmark tables, and `xrl cost` / `xrl optimize --measure` JSON. Then copy the tables into
# experiments/results/ and commit them.
#
# Environment: DEVICE (default cuda; cpu for a dry run of this script without a GPU), GRAPHS
# (default all), PYTHON (default python3), STEP_TIMEOUT (seconds one step may run, default 0: no limit;
# a lease of a few minutes sets it so that one slow step cannot spend the others' time).
set -uo pipefail

out=${1:?usage: bash cuda/gpu_session.sh OUT_DIR [tests|bench|all]}
phase=${2:-all}
device=${DEVICE:-cuda}
graphs=${GRAPHS:-all}
py=${PYTHON:-python3}
# the GPU's model (h100, h200, a100, ...) names the result files
tag=$([ "$device" = cuda ] && "$py" -c "import re, torch
name = torch.cuda.get_device_name().lower().replace('nvidia', '') if torch.cuda.is_available() else ''
m = re.search(r'[a-z]+[0-9]{2,4}', name)
print(m.group(0) if m else 'gpu')" 2>/dev/null || echo "$device")
mkdir -p "$out"
status=0
step_timeout=${STEP_TIMEOUT:-0}
step() {  # step NAME COMMAND...: run it (at most STEP_TIMEOUT s), log it, remember a failure, go on
    local name=$1; shift
    echo "== $name: $*"
    local t0=$SECONDS
    if timeout --kill-after=10 "$step_timeout" "$@" >"$out/$name.log" 2>&1; then echo "   ok in $((SECONDS - t0)) s"; else echo "   FAILED (exit $?) in $((SECONDS - t0)) s"; status=1; fi
    tail -n 4 "$out/$name.log" | sed 's/^/   | /'
}

export PYTHONUNBUFFERED=1
step install "$py" -m pip install -q --no-deps --no-build-isolation -e .
if [ "$device" = cuda ]; then
    step harness make -C cuda ARCHS="${ARCHS:-90}"
fi
if [ "$phase" = tests ] || [ "$phase" = all ]; then
    step gpu_tests "$py" -m pytest -q -rs -p no:cacheprovider -p no:hydra_pytest tests/test_cuda_harness.py tests/test_measured_cost.py \
        tests/test_measured_speedup.py tests/test_kernel_cost.py
fi
if [ "$phase" = bench ] || [ "$phase" = all ]; then
    bench_graphs=$([ "$graphs" = all ] && echo "mlp,tiny_cnn,squeezenet,resnet50,bert,inception_v3" || echo "$graphs")
    step bench_measured "$py" experiments/bench_measured.py --device "$device" --graphs "$bench_graphs" \
        --out "$out/measured_$tag.md"
    step bench_speedup "$py" experiments/bench_measured_speedup.py --device "$device" --graphs "$graphs" \
        --out "$out/measured_speedup_$tag.md"
    if [ "$device" = cuda ]; then
        step cost_cuda "$py" -m xrl cost resnet50 --cost cuda --json
    fi
    # the measured kernel cost of target ort-cuda against end-to-end timing (needs onnxruntime-gpu)
    if [ "$device" = cuda ] && "$py" -c "import onnxruntime as o, sys
sys.exit('CUDAExecutionProvider' not in o.get_available_providers())"; then
        step validate_cost "$py" experiments/validate_cost.py --target ort-cuda --graphs headroom,small \
            --out "$out/validate_cost_$tag"
    elif [ "$device" = cuda ]; then
        echo "== validate_cost: skipped (this onnxruntime has no CUDAExecutionProvider; onnxruntime-gpu is needed)"
    fi
    step optimize_measured "$py" -m xrl optimize resnet50 --search greedy --cost op --device "$device" \
        --measure torch --json
fi
echo "== done: outputs in $out"
exit $status
