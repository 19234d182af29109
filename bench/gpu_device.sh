#!/usr/bin/env bash
# The device checks of the data path and the GPU bench, prepared for a session with one CUDA
# device (run from the repository root, with torch and the project importable). Each stage
# fits one ten-minute call; a session of 15 device minutes runs stage 1, then stage 2.
#   stage 1 (~3-4 min): the GPU tests (placement on CUDA: the same losses as the host's), then
#            the profile (300 steps of the campaign's loop and of both bare loops)
#   stage 2 (~8 min): throughput, campaign vs the fastest bare loop, >= 180 s of training each
#   stage 3 (~8 min, another session): campaign vs the same-loader bare loop, the same way
#   stage loop (~4-5 min, one short call): the loop's cost per step on 2 and 8 ms steps
#            (campaign vs the fastest bare loop, 2 x 20 s each), the stall of each save, a
#            resume's restore and its time to the first step (bench/gpu_loop.py)
# Results: bench/results/gpu-<device>.{json,md} (each stage adds its figures), traces in $OUT.
set -euo pipefail
stage=${1:-1}
out=${OUT:-/tmp}
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
case "$stage" in
  1)
    python -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_data_path.py tests/engine/test_devices.py
    python bench/gpu.py --parts profile --profile-steps 300 --trace-dir "$out/traces"
    ;;
  2) python bench/gpu.py --parts throughput --min-train-s 180 --repeats 1 --bare fastest ;;
  3) python bench/gpu.py --parts throughput --min-train-s 180 --repeats 1 --bare same-loader ;;
  loop) python bench/gpu.py --parts loop --repeats 2 --loop-ms 2,8 --loop-s 20 ;;
  *) echo "stage 1, 2, 3 or loop" >&2; exit 2 ;;
esac
cp bench/results/gpu-*.json bench/results/gpu-*.md "$out"/ 2>/dev/null || true
