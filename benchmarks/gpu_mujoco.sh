#!/usr/bin/env bash
# MuJoCo Warp's tasks on a GPU in one call of about 6 minutes (ending by 8 min 50 s), once warp-lang and mujoco-warp are installed
# there (requirements-mujoco-warp.txt; docs/cuda.md has the lease's plan):
#   bash benchmarks/gpu_mujoco.sh OUT_DIR
# 1. the CUDA test of tests/test_mujoco_envs.py: the engine's step recorded in one CUDA graph with torch's work,
#    replaying as the eager step does (its Warp kernels compile first: about a minute cold on a CPU);
# 2. the tasks alone, random actions: eager (a Warp graph launch a step, torch's reads eager) and compiled + CUDA
#    graph, HalfCheetah-v5 and Humanoid-v5 at N = 1,024 ... 65,536, Hopper-v5, Walker2d-v5 and Ant-v5 at 4,096.
set -u
end=$((SECONDS + 530))
out=${1:-benchmarks/results/gpu_mujoco}
mkdir -p "$out"
nvidia-smi -L
timeout 240 python3 -m pytest tests/test_mujoco_envs.py -m cuda -q -n 0 -p no:cacheprovider 2>&1 | tail -3
bench() {
  [ $SECONDS -lt $end ] || { echo "left out, the call's time is up: $*"; return; }
  timeout $((end - SECONDS)) python3 -m benchmarks.tensor_envs --device cuda --no-gymnasium --seconds 1 --rounds 2 "$@" 2>&1 \
    | grep -v "^TENSOR_ENVS"
}
bench --env-ids HalfCheetah-v5 Humanoid-v5 --sizes 1024 4096 16384 65536 --out "$out/mujoco_cuda.json"
bench --env-ids Hopper-v5 Walker2d-v5 Ant-v5 --sizes 4096 --out "$out/mujoco_cuda_4096.json"
