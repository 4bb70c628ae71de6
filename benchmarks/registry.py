"""What the harness benchmarks: one `Algo` line per algorithm, and the variants every algorithm runs in.

Adding an algorithm is one line in `ALGOS`. Its scripts are `leanrl/<eager>.py` and
`leanrl/<eager>_torchcompile.py`; an entry whose scripts are not on disk is skipped with a note.
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Variant:
    """One way of running an algorithm: which twin, with which flags, and whether it needs CUDA."""

    name: str
    twin: bool
    flags: tuple[str, ...] = ()
    needs_cuda: bool = False


@dataclass(frozen=True)
class Algo:
    """An algorithm: its eager script's stem and the flags of every run under each budget.

    `variant_flags` maps a variant's name to flags added to that variant only (e.g. best CPU settings).
    """

    name: str
    eager: str
    quick: tuple[str, ...]
    full: tuple[str, ...]
    variant_flags: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def twin(self):
        """The optimized twin's stem."""
        return f"{self.eager}_torchcompile"


VARIANTS = (
    Variant("eager", twin=False),
    Variant("torchcompile", twin=True),
    Variant("compile", twin=True, flags=("--compile",)),
    Variant("cudagraphs", twin=True, flags=("--cudagraphs",), needs_cuda=True),
    Variant("compile+cudagraphs", twin=True, flags=("--compile", "--cudagraphs"), needs_cuda=True),
)

ALGOS = (
    Algo(
        "sac",
        "sac_continuous_action",
        quick=("--env-id", "HalfCheetah-v4", "--total-timesteps", "1500", "--learning-starts", "1000",
               "--measure-burnin", "50"),
        full=("--total-timesteps", "30000"),
    ),
    Algo("dqn", "dqn", quick=("--total-timesteps", "20000"), full=("--total-timesteps", "100000")),
    Algo(
        "td3",
        "td3_continuous_action",
        quick=("--env-id", "HalfCheetah-v4", "--total-timesteps", "1500", "--learning-starts", "1000",
               "--measure-burnin", "50"),
        full=("--total-timesteps", "30000", "--learning-starts", "5000"),
    ),
    Algo(
        "ppo_continuous_action",
        "ppo_continuous_action",
        quick=("--env-id", "HalfCheetah-v4", "--total-timesteps", "10240", "--measure-burnin", "2"),  # 5 iterations
        full=("--total-timesteps", "204800"),
    ),
    Algo(
        "ppo_lstm",
        "ppo_lstm",
        quick=("--total-timesteps", "10240", "--measure-burnin", "2"),  # 10 iterations, velocity-hidden CartPole-v1
        full=("--total-timesteps", "200000"),
    ),
    Algo(
        "ppo_mingru",
        "ppo_mingru",
        quick=("--total-timesteps", "10240", "--measure-burnin", "2"),  # 10 iterations, velocity-hidden CartPole-v1
        full=("--total-timesteps", "200000"),
    ),
    Algo(
        "ppo_atari_envpool",
        "ppo_atari_envpool",
        quick=("--env-id", "Breakout-v5", "--total-timesteps", "6144", "--measure-burnin", "2"),  # 6 iterations
        full=("--total-timesteps", "204800"),
    ),
)
