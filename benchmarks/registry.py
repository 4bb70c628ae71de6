"""What the harness benchmarks: one `Algo` line per algorithm, and the variants every algorithm runs
in.

Adding an algorithm is one line in `ALGOS`. Its scripts are `leanrl/<eager>.py`,
`leanrl/<eager>_torchcompile.py` and, for the algorithms with a CPU script (`cpu=True`),
`leanrl/<eager>_cpu.py`; an entry whose scripts are not on disk is skipped with a note.
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Variant:
    """One way of running an algorithm: which of its scripts (the eager one's name + `suffix`), with
    which flags, and whether it needs CUDA."""

    name: str
    suffix: str
    flags: tuple[str, ...] = ()
    needs_cuda: bool = False


@dataclass(frozen=True)
class Algo:
    """An algorithm: its eager script's stem and the flags of every run under each budget."""

    name: str
    eager: str
    quick: tuple[str, ...]
    full: tuple[str, ...]
    variant_flags: dict[str, tuple[str, ...]] = field(default_factory=dict)
    cpu: bool = False

    @property
    def twin(self):
        """The optimized twin's stem."""
        return f"{self.eager}_torchcompile"

    def script(self, variant):
        """The stem of the script `variant` runs."""
        return f"{self.eager}{variant.suffix}"

    def runs(self, variant):
        """Whether `variant` is this algorithm's (`cpu` only where there is a CPU script)."""
        return self.cpu or variant.suffix != CPU_SUFFIX


CPU_SUFFIX = "_cpu"
VARIANTS = (
    Variant("eager", suffix=""),
    Variant("torchcompile", suffix="_torchcompile"),
    Variant("compile", suffix="_torchcompile", flags=("--compile",)),
    Variant("cudagraphs", suffix="_torchcompile", flags=("--cudagraphs",), needs_cuda=True),
    Variant(
        "compile+cudagraphs",
        suffix="_torchcompile",
        flags=("--compile", "--cudagraphs"),
        needs_cuda=True,
    ),
    Variant("cpu", suffix=CPU_SUFFIX),
)

# SAC's and TD3's quick budget: 1,000 random steps, then 500 updates, sps over the last 450
HALF_CHEETAH_QUICK = (
    "--env-id",
    "HalfCheetah-v4",
    "--total-timesteps",
    "1500",
    "--learning-starts",
    "1000",
)
HALF_CHEETAH_QUICK += ("--measure-burnin", "50")

ALGOS = (
    Algo(
        "sac",
        "sac_continuous_action",
        quick=HALF_CHEETAH_QUICK,
        full=("--total-timesteps", "30000"),
        cpu=True,
    ),
    Algo(
        "dqn",
        "dqn",
        quick=("--total-timesteps", "20000"),
        full=("--total-timesteps", "100000"),
        cpu=True,
    ),
    Algo(
        "td3",
        "td3_continuous_action",
        quick=HALF_CHEETAH_QUICK,
        full=("--total-timesteps", "30000", "--learning-starts", "5000"),
        cpu=True,
    ),
    Algo(
        "ppo_continuous_action",
        "ppo_continuous_action",
        # 5 iterations
        quick=("--env-id", "HalfCheetah-v4", "--total-timesteps", "10240", "--measure-burnin", "2"),
        full=("--total-timesteps", "204800"),
        cpu=True,
    ),
    Algo(
        "ppo_lstm",
        "ppo_lstm",
        # 10 iterations, velocity-hidden CartPole-v1
        quick=("--total-timesteps", "10240", "--measure-burnin", "2"),
        full=("--total-timesteps", "200000"),
    ),
    Algo(
        "ppo_mingru",
        "ppo_mingru",
        # 10 iterations, velocity-hidden CartPole-v1
        quick=("--total-timesteps", "10240", "--measure-burnin", "2"),
        full=("--total-timesteps", "200000"),
    ),
    Algo(
        "ppo_atari_envpool",
        "ppo_atari_envpool",
        # 6 iterations
        quick=("--env-id", "Breakout-v5", "--total-timesteps", "6144", "--measure-burnin", "2"),
        full=("--total-timesteps", "204800"),
    ),
    Algo(
        "pqn",
        "pqn",
        # 40 iterations of 4 envs x 128 steps, CartPole-v1
        quick=("--total-timesteps", "20480", "--measure-burnin", "4"),
        full=("--total-timesteps", "102400"),
        cpu=True,
    ),
    Algo(
        "pqn_atari_envpool",
        "pqn_atari_envpool",
        # 6 iterations
        quick=("--env-id", "Breakout-v5", "--total-timesteps", "6144", "--measure-burnin", "2"),
        full=("--total-timesteps", "204800"),
    ),
)
