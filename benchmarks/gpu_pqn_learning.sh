#!/usr/bin/env bash
# PQN's twin learning on the tensor envs beside gymnasium's, on a GPU, at CleanRL's budget (500k
# steps, 4 envs): CartPole-v1 both ways and Acrobot-v1 on the tensor envs, seeds 1-5, all runs at
# once (one process each), in one call of about 5 minutes:
#   bash benchmarks/gpu_pqn_learning.sh
# Prints one line per run: env, envs, seed, return_mean (the last 20 episodes), sps.
set -u
run() {  # env_id kind seed
  local flags=()
  [ "$2" = tensor ] && flags=(--tensor-envs)
  python3 leanrl/pqn_torchcompile.py --compile --cudagraphs --env-id "$1" --seed "$3" \
    --run-name "$1-$2-$3" "${flags[@]}" > /dev/null 2>&1
}
for seed in 1 2 3 4 5; do
  run CartPole-v1 tensor $seed & run CartPole-v1 gymnasium $seed & run Acrobot-v1 tensor $seed &
done
wait
python3 - <<'PY'
import glob, json
for path in sorted(glob.glob("runs/*/summary.json")):
    s = json.load(open(path))
    print(path.split("/")[1], s["return_mean"], round(s["sps"] or 0), s["episodes"])
PY
