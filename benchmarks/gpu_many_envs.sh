#!/usr/bin/env bash
# SAC, TD3 and PPO continuous with their loops on the device, on MuJoCo Warp's tasks, in two calls of at
# most 9 minutes each, once requirements-mujoco-warp.txt is installed (docs/tensor-envs.md, docs/cuda.md):
#   bash benchmarks/gpu_many_envs.sh 1 OUT_DIR  # sps of the graphed loops at N = 1, 64, 1,024, 4,096
#   bash benchmarks/gpu_many_envs.sh 2 OUT_DIR  # the wall time to CleanRL's returns at 1M steps
# Call 1: the SAC and TD3 twins on HalfCheetah-v5, `--tensor-envs --compile --cudagraphs`, N = 1 and 64 with
#   CleanRL's flags, 1,024 and 4,096 with FastTD3's: every size compiled at once first (inductor's cache),
#   then each timed alone, stopped by SIGTERM after its burn-in and about 20 s; beside them the same twins on
#   gymnasium's HalfCheetah-v5 (MuJoCo's C engine on the host, 1 env), and, if time is left, the env alone.
# Call 2: SAC, TD3 and PPO on HalfCheetah-v5 and Hopper-v5 with the many-env settings, two to four runs at a
#   time on the GPU, each until its share of the call ends. The table gives, per run, the env step and the
#   second (compile included) at which the mean of the last 20 returns first reached CleanRL's at 1M steps.
set -u
call=${1:?usage: bash benchmarks/gpu_many_envs.sh 1|2 [OUT_DIR]}
out=$(realpath -m "${2:-benchmarks/results/gpu_many_envs}")
mkdir -p "$out/runs"
root=$(pwd)
end=$((SECONDS + 530)) # the call's end: 8 min 50 s from now
nvidia-smi -L
left() { echo $((end - SECONDS)); }
twin() { case $1 in sac | td3) echo "${1}_continuous_action_torchcompile" ;;
  ppo) echo ppo_continuous_action_torchcompile ;; esac; }
flags() { # algo N: CleanRL's flags below 1,024 envs, else the many-env settings (docs/tensor-envs.md)
  if [ "$1" = ppo ]; then # CleanRL's Isaac Gym PPO
    echo --num-envs "$2" --num-steps 16 --num-minibatches 2 --update-epochs 4 --learning-rate 0.0026 \
      --no-anneal-lr --no-clip-vloss --vf-coef 2 --max-grad-norm 1
  elif [ "$2" -ge 1024 ]; then # FastTD3's
    echo --num-envs "$2" --batch-size 32768 --num-updates 2 --buffer-size $((10240 * $2)) \
      --learning-starts $((10 * $2)) --tau 0.1
  else echo --num-envs "$2"; fi
}
train() { # seconds run-name algo flags...: a run of the twin, stopped by SIGTERM after `seconds`
  local cap=$1 name=$2 script
  script=$(twin "$3")
  shift 3
  (cd "$out" && timeout -s TERM -k 60 "$cap" python3 "$root/leanrl/$script.py" --compile --cudagraphs \
    --run-name "$name" --no-tensorboard --checkpoint-minutes 0 "$@" > "runs/$name.log" 2>&1)
}

if [ "$call" = 1 ]; then
  for algo in sac td3; do # compile: each run ends 30 iterations after its random phase
    for n in 1 64 1024 4096; do
      starts=$([ "$n" -ge 1024 ] && echo 10 || echo $((5000 / n)))
      train 170 "warm-$algo-$n" $algo --env-id HalfCheetah-v5 --tensor-envs $(flags $algo "$n") \
        --total-timesteps $(((starts + 30) * n)) &
    done
    train 170 "gymnasium-$algo" $algo --env-id HalfCheetah-v5 --total-timesteps 1000000 &
  done
  wait
  for algo in sac td3; do
    for n in 1 64 1024 4096; do
      [ "$(left)" -ge 45 ] && train 45 "$algo-$n" $algo --env-id HalfCheetah-v5 --tensor-envs \
        $(flags $algo "$n") --total-timesteps 1000000000 --measure-burnin 20
    done
  done
  [ "$(left)" -ge 60 ] && timeout $(($(left) - 5)) python3 -m benchmarks.tensor_envs --device cuda \
    --env-ids HalfCheetah-v5 --no-gymnasium --sizes 1 64 1024 4096 --seconds 1 --rounds 1 \
    --out "$out/env_only.json" 2>&1 | grep -v "^TENSOR_ENVS"
else
  # CleanRL's returns at 1M steps on the v4 tasks (docs/results.md; SAC's and TD3's HalfCheetah: issue 86)
  targets="sac:HalfCheetah-v5:10000 sac:Hopper-v5:2310 td3:HalfCheetah-v5:9000 td3:Hopper-v5:3135"
  targets="$targets ppo:HalfCheetah-v5:1443 ppo:Hopper-v5:2383"
  together() { # seconds algo...: each algo on both tasks, all at once
    local cap=$1 algo env n
    shift
    for algo in "$@"; do
      n=$([ "$algo" = ppo ] && echo 4096 || echo 1024)
      for env in HalfCheetah-v5 Hopper-v5; do
        train "$cap" "$algo-$env" $algo --env-id "$env" --tensor-envs $(flags $algo $n) \
          --total-timesteps 100000000 &
      done
    done
    wait
  }
  together 240 sac
  together $(($(left) - 40)) td3 ppo
fi

python3 - "$out" "${targets:-}" <<'PY'
import json, pathlib, sys

out, targets = pathlib.Path(sys.argv[1]), dict(t.rsplit(":", 1) for t in sys.argv[2].split())
print("run", "envs", "sps", "steps", "return_mean", "1M steps at sps (s)", "target", "reached at (step, s)",
      sep="\t")
for path in sorted(out.glob("runs/*/summary.json")):
    s = json.loads(path.read_text())
    sps = s["sps"] or 0
    row = [path.parent.name, s["num_envs"], round(sps), s["total_timesteps"], s["return_mean"]]
    row.append(round(1e6 / sps) if sps else None)
    target = targets.get(f"{s['script'].split('_')[0]}:{s['env_id']}")
    if target is not None:  # the first time the mean of the last 20 returns reached it
        returns, hit = [], None
        for step, seconds, episodic_return in s["curve"]:
            returns = (returns + [episodic_return])[-20:]
            if hit is None and len(returns) == 20 and sum(returns) / 20 >= float(target):
                hit = (step, round(seconds))
        row += [target, hit]
    print(*row, sep="\t")
PY
