"""The envs of a run: gymnasium's vector env with same-step autoreset and each env's episode
statistics (`make_envs`, which also makes the tensor envs of tensor_envs.py), the episodes that end
on a step (`finished_episodes`; `EpisodeLog`: the tensor envs', kept on their device), the true
last observation of an episode (`true_next_obs`), and the evaluation of a policy (`evaluate`;
`evaluate_recurrent` for a policy with a state)."""

import itertools
import pickle

import gymnasium as gym
import numpy as np
import torch
from flags import fail


class SyncVectorEnv(gym.vector.SyncVectorEnv):
    """gymnasium's SyncVectorEnv, same-step autoreset, its step written out for what the scripts
    step, Box observations and an array of actions: the same arrays and infos at about half the
    cost of the general one, which counts where the env step is much of a step (DQN, PQN)."""

    def step(self, actions):
        if isinstance(actions, torch.Tensor):  # a policy's actions on its device, to the host
            actions = actions.cpu().numpy()
        box = isinstance(self.single_observation_space, gym.spaces.Box)
        if not box or not isinstance(actions, np.ndarray):
            return super().step(actions)
        infos = {}
        for i, env in enumerate(self.envs):
            obs, reward, terminated, truncated, info = env.step(actions[i])
            self._rewards[i], self._terminations[i] = reward, terminated
            self._truncations[i] = truncated
            if terminated or truncated:  # the episode's last obs and info, then the next's first
                infos = self._add_info(infos, {"final_obs": obs, "final_info": info}, i)
                obs, info = env.reset()
            self._env_obs[i] = self._observations[i] = obs
            if info:
                infos = self._add_info(infos, info, i)
        arrays = self._observations, self._rewards, self._terminations, self._truncations
        return *(array.copy() for array in arrays), infos

    whole_state = True  # state_dict() holds every episode as it is, where it can be pickled

    def state_dict(self):
        """The attributes of this vector env, of each env's wrappers and of each env, but their
        links and functions (which the same flags make again), pickled; None where they cannot be
        (a video recorder's renderer)."""
        links = ("env", "envs", "env_fns", "_saved_kwargs")
        try:
            return pickle.dumps(
                [
                    {k: v for k, v in vars(layer).items() if k not in links and not callable(v)}
                    for layer in self.layers()
                ]
            )
        except Exception:
            return None

    def load_state_dict(self, state):
        for layer, attributes in zip(self.layers(), pickle.loads(state)):
            vars(layer).update(attributes)

    def layers(self):
        """This vector env, then each env's wrappers and the env itself, outermost first."""
        layers = [self]
        for env in self.envs:
            layers.append(env)
            while hasattr(env, "env"):
                env = env.env
                layers.append(env)
        return layers


def make_envs(
    env_id,
    num_envs,
    seed,
    videos=None,
    video_episodes=None,
    wrap=None,
    tensor=False,
    device="cpu",
    compile=False,
):
    """gymnasium's vector env with same-step autoreset (the true last observation of an episode is
    in `infos`), each env counting its episodes' returns, then `wrap(env)`, the script's own
    wrappers; its first env records videos to the folder `videos`: gymnasium's schedule in
    training, the first `video_episodes` in an evaluation. With `tensor`, the same as batched
    tensors on `device` (tensor_envs.py, mujoco_envs.py), which take and return tensors, their step
    compiled whole with `compile` (a few envs step faster so than gymnasium's on a CPU), and
    `wrap(envs)` takes the whole batch."""
    if tensor:
        envs = make_batched_envs(env_id, num_envs, seed, device, videos)
        if compile:
            envs.step = torch.compile(envs.step, fullgraph=True)
        return wrap(envs) if wrap else envs

    def make_env(seed, video_dir):
        def thunk():
            # no render_mode without video: some envs (POPGym's) take none
            render = {} if video_dir is None else dict(render_mode="rgb_array")
            env = gym.make(env_id, **render)
            if video_dir is not None:
                record = None if video_episodes is None else lambda e: e < video_episodes
                prefix = "train" if video_episodes is None else "eval"
                env = gym.wrappers.RecordVideo(
                    env, video_dir, record, name_prefix=prefix, disable_logger=True
                )
            env = gym.wrappers.RecordEpisodeStatistics(env)
            env = wrap(env) if wrap else env
            env.action_space.seed(seed)
            return env

        return thunk

    try:
        dirs = [videos] + [None] * (num_envs - 1)
        thunks = [make_env(seed + i, dirs[i]) for i in range(num_envs)]
        envs = SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    except (gym.error.Error, ModuleNotFoundError) as e:  # ModuleNotFoundError: `module:EnvId`
        fail(f"--env-id {env_id!r} cannot be made: {e}")
    envs.action_space.seed(seed)  # random actions, where an algorithm takes them
    return envs


def make_batched_envs(env_id, num_envs, seed, device, videos):
    """The tensor version of `env_id`: classic control (tensor_envs.py) or a MuJoCo task on MuJoCo
    Warp (mujoco_envs.py)."""
    try:
        from mujoco_envs import MUJOCO_ENVS, installed, make_mujoco_envs
        from tensor_envs import TENSOR_ENVS, make_tensor_envs
    except ModuleNotFoundError:  # an exported copy, without leanrl/'s env modules beside it
        fail("--tensor-envs needs leanrl/'s tensor_envs.py, tensor_wrappers.py, mujoco_envs.py")
    if env_id not in TENSOR_ENVS | MUJOCO_ENVS:
        there = ", ".join(TENSOR_ENVS | MUJOCO_ENVS)
        fail(f"--tensor-envs: no tensor version of {env_id!r}; there are {there}")
    if videos is not None:
        fail("--tensor-envs cannot record videos")
    if env_id in MUJOCO_ENVS and not installed():
        need = "pip install -r requirements/requirements-mujoco-warp.txt"
        fail(f"--tensor-envs --env-id {env_id} runs on MuJoCo Warp, not installed here: {need}")
    make = make_mujoco_envs if env_id in MUJOCO_ENVS else make_tensor_envs
    envs = make(env_id, num_envs, device, seed)
    envs.action_space.seed(seed)
    return envs


class Episodes(list):
    """The returns of the episodes that ended on a step, and their lengths, `lengths` (a plain
    list, where no episode ended or the lengths are not known)."""

    def __init__(self, returns=(), lengths=()):
        super().__init__(returns)
        self.lengths = list(lengths)


def finished_episodes(infos):
    """The returns of every episode that ended on this step (several envs can end on one step)."""
    final_info = infos.get("final_info", {})
    if "episode" not in final_info:
        return []
    ended, episode = final_info["_episode"], final_info["episode"]
    return Episodes(episode["r"][ended].tolist(), episode["l"][ended].tolist())


class EpisodeLog:
    """The episodes that end in `rows` vector steps of the tensor envs, kept on their device:
    `record` writes a step's at its row (a tensor) with no host sync, so a CUDA graph can hold it;
    `log` hands the rows not yet logged to the run in one host sync. A checkpoint keeps them."""

    def __init__(self, rows, num_envs, device):
        self.ended = torch.zeros(rows, num_envs, dtype=torch.bool, device=device)
        self.returns = torch.zeros(rows, num_envs, device=device)
        self.lengths = torch.zeros(rows, num_envs, dtype=torch.long, device=device)
        self.first = 0  # the first row not yet logged

    def record(self, row, infos):
        episode = infos["final_info"]["episode"]
        for log, x in zip(self.columns(), (infos["_final_obs"], episode["r"], episode["l"])):
            log.index_copy_(0, row, x.unsqueeze(0).to(log.dtype))

    def columns(self):
        return self.ended, self.returns, self.lengths

    def log(self, run, step, num_envs, end):
        """Rows `first` to `end - 1` to the run, row t's episodes at env step `step + t *
        num_envs`; the next log starts at row `end` (0 past the last)."""
        rows = slice(self.first, end)
        episodes = self.ended[rows], self.returns[rows], self.lengths[rows]
        log_ended(run, *episodes, step + self.first * num_envs, num_envs)
        self.first = end % len(self.ended)

    def state_dict(self):
        return dict(columns=[x.clone() for x in self.columns()], first=self.first)

    def load_state_dict(self, state):
        for log, saved in zip(self.columns(), state["columns"]):
            log.copy_(saved)
        self.first = state["first"]


def log_ended(run, ended, returns, lengths, first_step, num_envs):
    """The episodes that `ended` marks (a row a vector step, a column an env), with their
    `returns` and `lengths`, to the run in one host sync: row t's at env step `first_step + t *
    num_envs`."""
    ended_at, env = ended.nonzero(as_tuple=True)
    returns, lengths = returns[ended_at, env].tolist(), lengths[ended_at, env].tolist()
    episodes = zip(ended_at.tolist(), returns, lengths)
    for t, group in itertools.groupby(episodes, key=lambda x: x[0]):
        _, step_returns, step_lengths = zip(*group)
        run.log_episodes(first_step + t * num_envs, Episodes(step_returns, step_lengths))


def true_next_obs(next_obs, infos):
    """`next_obs` with the true final observation of each episode that ended on this step, where
    same-step autoreset put the reset one: a truncated episode bootstraps from where it was cut."""
    if isinstance(next_obs, torch.Tensor):  # the tensor envs: no host sync
        return torch.where(infos["_final_obs"][:, None], infos["final_obs"], next_obs)
    real_next_obs = next_obs.copy()
    for idx in np.flatnonzero(infos.get("_final_obs", [])):
        real_next_obs[idx] = infos["final_obs"][idx]
    return real_next_obs


def evaluate(act, envs, episodes, seed, device):
    """The returns of `episodes` episodes played on `envs` (one env, closed after) with
    `act(obs) -> actions`."""
    obs, _ = envs.reset(seed=seed)
    returns = []
    while len(returns) < episodes:
        with torch.no_grad():
            actions = act(torch.as_tensor(obs, device=device, dtype=torch.float))
        obs, _, _, _, infos = envs.step(actions.cpu().numpy())
        returns += finished_episodes(infos)
    envs.close()
    return returns[:episodes]


def episode_starts(terminations, truncations, memory):
    """1 where an episode ended; 1 everywhere without `memory`."""
    dones = terminations | truncations  # numpy's arrays or the tensor envs' tensors
    return dones if memory else dones | True


def evaluate_recurrent(agent, envs, episodes, seed, state, memory, device):
    """The returns of `episodes` episodes on `envs` (one env, closed after) by `agent`'s most likely
    action, its state (`state`: zeros) carried from step to step and zeroed when an episode starts
    (at every step without `memory`)."""
    obs, _ = envs.reset(seed=seed)
    done = torch.full((1, 1), 0.0 if memory else 1.0, device=device)
    returns = []
    while len(returns) < episodes:
        with torch.no_grad():
            obs = torch.as_tensor(obs, device=device, dtype=torch.float)
            hidden, state = agent.get_states(obs[None], state, done)
            actions = agent.actor(hidden[0]).argmax(-1)
        obs, _, terminations, truncations, infos = envs.step(actions.cpu().numpy())
        starts = episode_starts(terminations, truncations, memory)
        done = torch.as_tensor(starts, device=device, dtype=torch.float)[None]
        returns += finished_episodes(infos)
    envs.close()
    return returns[:episodes]


def clip10(obs):
    return np.clip(obs, -10, 10)


def observation_wrap(obs_indices, obs_rms=None):
    """The recurrent scripts' `wrap` for make_envs: the observation flattened, cut to the entries
    `obs_indices` (all if empty), normalized and clipped. A trained agent's `obs_rms` normalize
    it, frozen. On the tensor envs, the same on the whole batch, with one set of statistics."""

    def wrap(env):
        tensor = isinstance(env, gym.vector.VectorEnv)  # the tensor envs, all at once
        env = env if tensor else gym.wrappers.FlattenObservation(env)
        entries = (env.single_observation_space if tensor else env.observation_space).shape[0]
        if not all(-entries <= i < entries for i in obs_indices):
            indices = " ".join(map(str, obs_indices))
            fail(f"--obs-indices {indices}: the observation has {entries} entries")
        if tensor:
            return env.normalized(obs_indices)
        if obs_indices:
            space, keep = env.observation_space, list(obs_indices)
            visible = gym.spaces.Box(space.low[keep], space.high[keep], dtype=space.dtype)
            env = gym.wrappers.TransformObservation(env, lambda obs: obs[keep], visible)
        # the hidden task's inputs are small: unnormalized, it learned nothing
        env = gym.wrappers.NormalizeObservation(env)
        if obs_rms is not None:
            env.obs_rms.mean, env.obs_rms.var = obs_rms["mean"].numpy(), obs_rms["var"].numpy()
            env.obs_rms.count, env.update_running_mean = float(obs_rms["count"]), False
        return gym.wrappers.TransformObservation(env, clip10, env.observation_space)

    return wrap


def obs_rms_of(envs):
    """The first env's normalization statistics (the tensor envs': the batch's), saved with the
    model."""
    if hasattr(envs, "obs_rms"):  # the tensor envs
        return envs.obs_rms
    rms = envs.envs[0].get_wrapper_attr("obs_rms")
    return {
        "mean": torch.tensor(rms.mean),
        "var": torch.tensor(rms.var),
        "count": torch.tensor(float(rms.count)),
    }
