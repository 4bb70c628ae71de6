#!/usr/bin/env bash
# The full sweep (LeanRL's): every script at its default budget, seeds 21 31 41, the eager twin, every variant
# of the optimized twin and, where the algorithm has them, the CPU script and the async-sampling script (Atari). The
# CUDA-graph variants run only where CUDA exists. Each run ends with its SUMMARY line; `grep '^SUMMARY' runs/sweep.log`
# collects them.
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p runs
if python -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
  variants=("" "--compile" "--cudagraphs" "--compile --cudagraphs")
  echo "CUDA found: running the --cudagraphs variants too"
else
  variants=("" "--compile")
  echo "no CUDA device: skipping the --cudagraphs variants"
fi
for algo in sac_continuous_action td3_continuous_action ppo_continuous_action ppo_lstm ppo_mingru dqn pqn ppo_atari_envpool \
  pqn_atari_envpool; do
  for seed in 21 31 41; do
    python "leanrl/${algo}.py" --seed "$seed" | tee -a runs/sweep.log
    for flags in "${variants[@]}"; do
      # shellcheck disable=SC2086  # flags are words on purpose
      python "leanrl/${algo}_torchcompile.py" --seed "$seed" $flags | tee -a runs/sweep.log
    done
    if [ -f "leanrl/${algo}_cpu.py" ]; then
      python "leanrl/${algo}_cpu.py" --seed "$seed" | tee -a runs/sweep.log
    fi
    if [ -f "leanrl/${algo}_async.py" ]; then
      for flags in "${variants[@]}"; do
        # shellcheck disable=SC2086
        python "leanrl/${algo}_async.py" --seed "$seed" $flags | tee -a runs/sweep.log
      done
    fi
  done
done
