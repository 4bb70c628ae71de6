#!/usr/bin/env bash
# Time to solve CartPole-v1 on a GPU (docs/time-to-solve.md), in one call of about 5 minutes, at
# most 9 if every run reaches its timeout:
#   bash benchmarks/gpu_time_to_solve.sh OUT_DIR
# Seconds from launch until the mean return of the last 20 episodes first reaches 475, compile
# included; a run stops once solved or at its timeout.
# 1. PQN's twin on the tensor envs, the many-env table's rows at 256 and 1,024 envs, recorded as
#    CUDA graphs, with and without --compile, 3 seeds, warm cache (each variant's first run fills
#    it, not counted) (target: 5 s or less; about 2.5 minutes, at most 6);
# 2. PQN at 16,384 envs, the table's row, warm cache, 1 seed (target: solved, a return of 475 or
#    more; about 1 minute, at most 1.5);
# 3. 1,024 DQN seeds at once on the tensor envs, 8 envs each, cold cache (its compile counted): the
#    seconds until every member has solved (target: 60 s or less; about 1 minute, at most 1.5).
set -u
out=${1:-benchmarks/results/time_to_solve}
mkdir -p "$out"
nvidia-smi -L
many="--exploration-fraction 0.1 --q-lambda 0.95 --reward-scale 0.1"
pqn="pqn_torchcompile --tensor-envs --cudagraphs $many --num-steps 8"
tts() { python3 -m benchmarks.time_to_solve --device cuda --out-dir "$out" "$@"; }
tts --seeds 3 --timeout 30 --variants \
  "$pqn --num-envs 256 --num-minibatches 16" \
  "$pqn --compile --num-envs 256 --num-minibatches 16" \
  "$pqn --num-envs 1024 --num-minibatches 16 --total-timesteps 2000000"
tts --seeds 1 --timeout 40 --variants \
  "$pqn --num-envs 16384 --num-minibatches 32 --total-timesteps 40000000"
dqn="--num-envs 8 --train-frequency 2 --learning-starts 1000 --target-network-frequency 100"
tts --seeds 1 --timeout 85 --cache cold --variants "dqn_seeds --tensor-envs --compile \
  --cudagraphs --num-seeds 1024 $dqn --exploration-fraction 0.1 --total-timesteps 300000"
