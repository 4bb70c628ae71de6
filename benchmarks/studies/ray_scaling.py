"""Scaling efficiency of env runners on Ray, measured as Tianshou's RayVecEnv was (tianshou issue
#1172): environments whose step takes d seconds, stepped by R remote workers, in three designs.

    python -m benchmarks.studies.ray_scaling  # d in 0.1,0.01,0.001 x sleep,busy x R in 1,2,4,8
    python -m benchmarks.studies.ray_scaling --quick  # a tiny budget (the tests run it)
    python -m benchmarks.studies.ray_scaling --ray-address 10.0.0.1:6379 --runners 16,32,64

Designs: per-step (one env per worker, one remote call per env step, the driver acting for all);
batched (K envs per runner, a T x K fragment per call as leanrl/ppo_continuous_action_ray.py
collects, weights sent once per iteration with `ray.put`); double-buffered (batched, the next
fragment asked for before the learner's work, a --update-s sleep, on the last). T = max(1,
round(fragment_s / (K d))). Envs have HalfCheetah's sizes and sleep (`sleep`) or spin (`busy`) d
seconds a step; the policy is PPO continuous's actor. Ideal sps: R/d sleeping, min(R, cores)/d
busy; efficiency = sps / ideal. Writes benchmarks/results/ray-scaling-<time>.{json,md,png} (or to
--out). Without --ray-address it starts a local Ray on 127.0.0.1 only; bad arguments or an
unreachable address exit with status 2 and one line.
"""

import os
import statistics
import sys
import time
from datetime import datetime

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn

from benchmarks import cli
from benchmarks.cli import conclude, positive_float, positive_int, values_of
from benchmarks.machine import machine_info
from benchmarks.processes import note
from benchmarks.report import machine_line, table, write_result
from benchmarks.scripts import load_script

N_OBS, N_ACT, EPISODE_STEPS = 17, 6, 1000
DESIGNS = ("per-step", "batched", "double-buffered")
KINDS = ("sleep", "busy")
FULL = dict(durations=[0.1, 0.01, 0.001], runners=[1, 2, 4, 8], seconds=1.5, fragment_s=0.5)
FULL["update_s"] = 0.05
QUICK = dict(durations=[0.01, 0.001], runners=[1, 2], seconds=0.1, fragment_s=0.04, update_s=0.004)


class DelayEnv(gym.Env):
    """An environment whose step takes `duration` seconds."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (N_OBS,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (N_ACT,), np.float32)

    def __init__(self, duration, busy):
        self.duration, self.busy = duration, busy
        self.obs, self.t = np.zeros(N_OBS, np.float32), 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.obs, self.t = self.np_random.standard_normal(N_OBS).astype(np.float32), 0
        return self.obs, {}

    def step(self, action):
        # spins until this thread has had `duration` s of CPU: a descheduled thread does not advance
        if self.busy:
            end = time.thread_time() + self.duration
            while time.thread_time() < end:
                pass
        else:
            time.sleep(self.duration)
        self.t += 1
        self.obs = 0.99 * self.obs + 0.01 * float(action.sum())
        return self.obs, float(-np.abs(action).sum()), False, self.t >= EPISODE_STEPS, {}


def actor_network():
    """PPO continuous's actor mean: 17-64-64-6 with tanh."""
    layers = nn.Linear(N_OBS, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, N_ACT)
    return nn.Sequential(*layers)


def act(actor, obs):
    """Gaussian actions (unit std) for a batch of observations, and their log-probabilities."""
    with torch.no_grad():
        mean = actor(torch.from_numpy(obs))
        action = mean + torch.randn_like(mean)
        logprob = (-0.5 * (action - mean) ** 2 - 0.5 * np.log(2 * np.pi)).sum(1)
    return action.numpy(), logprob.numpy()


class Worker:
    """A remote worker (a Ray actor): `num_envs` DelayEnvs and a CPU copy of the policy."""

    def __init__(self, seed):
        torch.set_num_threads(1)
        torch.manual_seed(seed)
        self.seed, self.actor = seed, actor_network()

    def configure(self, num_envs, duration, busy):
        """Fresh environments: `num_envs` of them, each step taking `duration` s."""
        thunks = [lambda: DelayEnv(duration, busy)] * num_envs
        same_step = gym.vector.AutoresetMode.SAME_STEP
        self.envs = gym.vector.SyncVectorEnv(thunks, autoreset_mode=same_step)
        self.next_obs, _ = self.envs.reset(seed=self.seed)
        return self.next_obs[0]

    def step(self, action):
        """One step of the first environment with `action` (the per-step design)."""
        obs, reward, terminated, truncated, _ = self.envs.step(action[None])
        return obs[0], reward[0], terminated[0], truncated[0]

    def sample(self, weights, num_steps):
        """A fragment of `num_steps` vector steps acting with `weights`."""
        self.actor.load_state_dict(weights)
        n = self.envs.num_envs
        shapes = dict(obs=(N_OBS,), final_obs=(N_OBS,), actions=(N_ACT,), logprobs=(), rewards=())
        fragment = {k: np.zeros((num_steps, n, *shape), np.float32) for k, shape in shapes.items()}
        fragment |= {k: np.zeros((num_steps, n), bool) for k in ("terminations", "truncations")}
        for t in range(num_steps):
            fragment["obs"][t] = self.next_obs
            fragment["actions"][t], fragment["logprobs"][t] = act(self.actor, self.next_obs)
            self.next_obs, rewards, terminations, truncations, infos = self.envs.step(
                fragment["actions"][t]
            )
            fragment["rewards"][t], fragment["terminations"][t] = rewards, terminations
            fragment["truncations"][t], fragment["final_obs"][t] = truncations, self.next_obs
            if "_final_obs" in infos:
                ended = infos["_final_obs"]
                fragment["final_obs"][t][ended] = np.stack(infos["final_obs"][ended])
        return fragment

    def resident_memory_mib(self):
        """This process' resident memory (VmRSS) in MiB."""
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


def steps_per_call(duration, num_envs, fragment_s):
    """T: vector steps per fragment, so that a fragment is ~`fragment_s` s of env time."""
    return max(1, round(fragment_s / (num_envs * duration)))


def ideal_sps(runners, duration, busy, cores):
    """Steps per second of `runners` workers stepping one environment at a time if nothing else cost
    anything; spinning workers share `cores`."""
    return (min(runners, cores) if busy else runners) / duration


def per_step_iteration(ray, workers, obs, actor, num_steps, timeout):
    """`num_steps` rounds of one remote step per worker, the driver acting for all."""
    for _ in range(num_steps):
        actions, _ = act(actor, obs)
        results = ray.get([w.step.remote(a) for w, a in zip(workers, actions)], timeout=timeout)
        obs = np.stack([result[0] for result in results])
    return obs


def measure(ray, workers, design, cell, settings):
    """sps of one cell: `design` with these `workers`, each stepping the cell's envs."""
    actor, timeout = actor_network(), settings["timeout"]
    envs = (cell["num_envs"], cell["duration"], cell["busy"])
    obs = np.stack(ray.get([w.configure.remote(*envs) for w in workers], timeout=timeout))
    # per iteration, the same in every design
    steps_per_worker = cell["num_steps"] * cell["envs_per_runner"]
    steps_per_iteration = steps_per_worker * len(workers)
    weights = ray.put(actor.state_dict())
    calls = None
    if design != "per-step":
        calls = [w.sample.remote(weights, cell["num_steps"]) for w in workers]
    iterations, start = -1, None  # iteration 0 is untimed
    while iterations < 2 or time.perf_counter() - start < settings["seconds"]:
        if iterations == 0:
            start = time.perf_counter()
        if design == "per-step":
            obs = per_step_iteration(ray, workers, obs, actor, steps_per_worker, timeout)
        else:
            ray.get(calls, timeout=timeout)
            if design == "double-buffered":
                calls = [w.sample.remote(weights, cell["num_steps"]) for w in workers]
        time.sleep(settings["update_s"])  # the learner
        weights = ray.put(actor.state_dict())
        if design == "batched":
            calls = [w.sample.remote(weights, cell["num_steps"]) for w in workers]
        iterations += 1
    elapsed = time.perf_counter() - start
    if calls and design == "double-buffered":
        # the fragment in flight: the next cell starts from idle workers
        ray.get(calls, timeout=timeout)
    return iterations * steps_per_iteration / elapsed


def cells(args):
    """Every cell of the table, in the order they run."""
    for kind in args.kinds:
        for duration in args.durations:
            for runners in args.runners:
                for design in DESIGNS:
                    k = args.envs_per_runner
                    num_envs = 1 if design == "per-step" else k
                    cell = dict(kind=kind, busy=kind == "busy", duration=duration, runners=runners)
                    cell |= dict(design=design, num_envs=num_envs, envs_per_runner=k)
                    yield cell | {"num_steps": steps_per_call(duration, k, args.fragment_s)}


def run(ray, args):
    """Start max(runners) workers, measure every cell; the rows, one worker's resident memory."""
    worker_class = ray.remote(num_cpus=0)(Worker)
    workers = [worker_class.remote(seed) for seed in range(max(args.runners))]
    memory = ray.get(workers[0].resident_memory_mib.remote(), timeout=args.timeout)
    cores, rows = os.cpu_count(), []
    for cell in cells(args):
        sps = measure(ray, workers[: cell["runners"]], cell["design"], cell, vars(args))
        ideal = ideal_sps(cell["runners"], cell["duration"], cell["busy"], cores)
        row = {key: cell[key] for key in ("kind", "design", "runners", "duration", "num_steps")}
        envs = cell["runners"] * cell["num_envs"]
        row |= dict(envs=envs, sps=sps, ideal_sps=ideal, efficiency=sps / ideal)
        note(
            f"{row['kind']:5} d={row['duration']:<6g} R={row['runners']:<3} {row['design']:15} "
            f"{sps:9.0f} sps  {row['efficiency']:6.1%}"
        )
        rows.append(row)
    memory = max(memory, ray.get(workers[0].resident_memory_mib.remote(), timeout=args.timeout))
    return rows, memory


def markdown(result):
    """The table, headed by the machine and the settings."""
    s = result["settings"]
    lines = [
        machine_line(result["machine"]),
        "",
        f"K = {s['envs_per_runner']} envs per runner (batched designs), fragments of "
        f"~{s['fragment_s']:g} s of env time, learner stand-in {s['update_s']:g} s per iteration, "
        f">= {s['seconds']:g} s per cell; one worker's resident memory "
        f"{result['worker_memory_mib']:.0f} MiB; started {result['started']}",
        "",
    ]
    rows = [
        f"{r['kind']} | {r['design']} | {r['runners']} | {r['envs']} | {r['duration']:g} | "
        f"{r['num_steps']} | {r['sps']:.0f} | {r['ideal_sps']:.0f} | {r['efficiency']:.0%}"
        for r in result["rows"]
    ]
    header = "env | design | runners | envs | step duration (s) | T | sps | ideal sps | efficiency"
    lines += table(header, rows, "ll" + "r" * 7)
    return "\n".join(lines) + "\n"


def plot(result, path):
    """Efficiency against step duration per design and runner count, a panel per env kind."""
    from benchmarks.plots import panels, save

    kinds = list(dict.fromkeys(r["kind"] for r in result["rows"]))
    fig, axes = panels(len(kinds), 6, 4)
    for ax, kind in zip(axes, kinds):
        rows = [r for r in result["rows"] if r["kind"] == kind]
        for design, style, color in zip(
            DESIGNS, (":", "--", "-"), ("tab:red", "tab:blue", "tab:green")
        ):
            for runners, marker in zip(dict.fromkeys(r["runners"] for r in rows), "os^Dv<>p*h"):
                line = sorted(
                    (r["duration"], r["efficiency"])
                    for r in rows
                    if (r["design"], r["runners"]) == (design, runners)
                )
                ax.plot(
                    *zip(*line), style, color=color, marker=marker, label=f"{design}, R={runners}"
                )
        ax.set_xscale("log")
        ax.set(title=f"{kind} envs", xlabel="step duration (s)", ylim=(0, 1.1))
        ax.set_ylabel("efficiency (sps / ideal)")
        ax.legend(fontsize=6, ncol=2)
    fig.suptitle(f"env runners on Ray, {result['machine']['cpu']}", fontsize=9)
    save(fig, path)


def parse_args(argv):
    """The command line; bad input exits 2 with one line, before Ray starts."""
    parser, add = cli.parser("benchmarks.studies.ray_scaling", __doc__, "--out", one_line=True)
    add(
        "--quick",
        action="store_true",
        help="a tiny budget: d in 0.01,0.001, R in 1,2, 0.1 s a cell",
    )
    add(
        "--durations", type=values_of(positive_float), help="step durations d in s (0.1,0.01,0.001)"
    )
    add("--runners", type=values_of(positive_int), help="runner counts R (default 1,2,4,8)")
    add("--kinds", type=values_of(str), default=list(KINDS), help="sleep, busy or sleep,busy")
    add("--envs-per-runner", type=positive_int, default=4, help="K, of the batched designs")
    add("--fragment-s", type=positive_float, help="env time of one fragment, s (default 0.5)")
    add("--update-s", type=float, help="the learner's time per iteration, s (default 0.05)")
    add("--seconds", type=positive_float, help="timed seconds per cell (default 1.5)")
    add("--timeout", type=positive_float, default=120.0, help="s, any remote call")
    add("--ray-address", help="host:port of a Ray cluster's head (default: a local instance)")
    args = cli.parse(parser, argv, QUICK, FULL)
    if unknown := [kind for kind in args.kinds if kind not in KINDS]:
        parser.error(f"--kinds: {', '.join(unknown)} is not one of {', '.join(KINDS)}")
    if args.update_s < 0:
        parser.error(f"--update-s must be >= 0, got {args.update_s}")
    return args


def main(argv=None):
    """Measure every cell, print the table, write the results."""
    args = parse_args(argv)
    started = datetime.now().isoformat(timespec="seconds")
    script = load_script("ppo_continuous_action_ray")
    if args.ray_address:
        script.check_address(args.ray_address)
    ray = script.connect_ray(args.ray_address)
    try:
        rows, memory = run(ray, args)
    except ray.exceptions.GetTimeoutError:
        print(
            f"ray_scaling: a remote call took longer than --timeout {args.timeout:g} s",
            file=sys.stderr,
        )
        return 1
    finally:
        ray.shutdown()
    keys = "durations runners kinds envs_per_runner fragment_s update_s seconds quick".split()
    result = {"settings": {key: getattr(args, key) for key in keys}, "machine": machine_info()}
    result |= {"started": started, "worker_memory_mib": memory, "rows": rows, "best": best(rows)}
    stem = f"ray-scaling-{datetime.now():%Y%m%d-%H%M%S}"
    return conclude(markdown(result), write_result(result, args.out, stem, markdown, plot))


def best(rows):
    """Per kind, design and step duration, the best efficiency over the runner counts."""
    groups = {}
    for r in rows:
        groups.setdefault((r["kind"], r["design"], r["duration"]), []).append(r["efficiency"])
    return [
        {
            "kind": k,
            "design": d,
            "duration": s,
            "efficiency_max": max(v),
            "efficiency_median": statistics.median(v),
        }
        for (k, d, s), v in groups.items()
    ]


if __name__ == "__main__":
    sys.exit(main())
