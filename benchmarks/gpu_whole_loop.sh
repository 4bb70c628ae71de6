#!/usr/bin/env bash
# The tensor envs, PQN's whole loop and dqn_seeds on a GPU, in one call that ends by 8 min 50 s:
#   bash benchmarks/gpu_whole_loop.sh OUT_DIR
# 1. the tensor CartPole alone, eager and compiled + CUDA graph, at N = 4 ... 65,536;
# 2. pqn_torchcompile.py --tensor-envs --compile --cudagraphs at N = 1,024, 16,384 and 65,536
#    (--num-steps 32, 20 iterations after compiling), beside the same script on gymnasium's 4 envs;
# 3. the same on the tensor envs at CleanRL's defaults (4 envs, 500k steps): does it learn;
# 4. dqn_seeds.py --tensor-envs --compile --cudagraphs at 64, 256 and 1,024 members (20k steps each),
#    its envs, buffer and acting on the GPU.
# A part that would start past the call's end is left out, and says so.
set -u
end=$((SECONDS + 530))
left() { [ $SECONDS -lt $end ] || { echo "left out, the call's time is up: $*"; return 1; }; }
out=${1:-benchmarks/results/gpu_whole_loop}
mkdir -p "$out"
nvidia-smi -L
python3 -m benchmarks.tensor_envs --env-ids CartPole-v1 --device cuda --sizes 4 1024 16384 65536 \
  --no-gymnasium --seconds 1 --out "$out/tensor_envs_cuda.json" 2>&1 | grep -v "^TENSOR_ENVS"
pqn() {
  left "pqn $1" || return
  timeout $((end - SECONDS)) python3 leanrl/pqn_torchcompile.py --compile --cudagraphs --run-name "$1" "${@:2}" 2>&1 \
    | grep SUMMARY | cut -c1-420
}
for n in 1024 16384 65536; do
  pqn "tensor-$n" --tensor-envs --num-envs $n --num-steps 32 --total-timesteps $((n * 32 * 24))
done
pqn gym-4 --total-timesteps 100000
pqn tensor-defaults --tensor-envs
for m in 64 256 1024; do
  left "dqn_seeds $m" || continue
  timeout $((end - SECONDS)) python3 leanrl/dqn_seeds.py --tensor-envs --compile --cudagraphs --num-seeds $m \
    --total-timesteps 20000 --learning-starts 2000 --run-name "dqn-seeds-$m" 2>&1 \
    | grep SUMMARY | cut -c1-420
done
for d in runs/*; do python3 -c "import json,sys; s=json.load(open('$d/summary.json')); \
  print('$d', s['sps'], s['return_mean'], s['episodes'])"; done
