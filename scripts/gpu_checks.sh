#!/usr/bin/env bash
# The checks that need a GPU, in one call of a lent machine (see docs/performance.md, "On a GPU"):
# the CUDA tests, then bench/instrument_overhead.py on the GPU, eager and compiled, then a profile of
# the compiled watch's step (bench/profile_watch.py). Each part has a time limit, so that the others
# still run and the logs come back; logs go to $OUT (or /tmp/gpu_checks).
#
#     bash scripts/gpu_checks.sh [tests_seconds eager_seconds compile_seconds profile_seconds]
#
# The default limits (170 + 130 + 240 + 50 s) fit one 600 s call of the device tool. On an H100
# (2026-11-27) the CUDA tests took ~125 s and the eager bench ~100 s; the compiled bench at
# --rounds 4 did not reach ILQL's CUDA-graphs variant in 290 s (pass --only to the bench by hand for it).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD GRADIO_ANALYTICS_ENABLED=False
out=${OUT:-/tmp/gpu_checks}
mkdir -p "$out"
nvidia-smi -L
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
timeout "${1:-170}" python3 -m pytest -q -p no:cacheprovider tests/instrument/test_cuda.py 2>&1 | tee "$out/tests.log" | tail -40
timeout "${2:-130}" python3 bench/instrument_overhead.py --device cuda --rounds 5 2>&1 | tee "$out/eager.log"
timeout "${3:-240}" python3 bench/instrument_overhead.py --device cuda --compile --rounds 4 --only mlp dynamics ilql \
    2>&1 | tee "$out/compile.log"
timeout "${4:-50}" python3 bench/profile_watch.py --only mlp --device cuda --compile --steps 5 2>&1 | tee "$out/profile.log"
