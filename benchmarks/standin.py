"""A deterministic stand-in for an envpool Atari env pool: envpool's API in both modes, games whose
every frame says which env and which step of which episode it is, and a step cost that is a sleep in
a worker thread.

    envs = StandInEnvs(num_envs=8, batch_size=4, step_seconds=1e-3)  # async: recv 4 at a time
    envs.async_reset()
    obs, rewards, terminations, truncations, info = envs.recv()
    envs.send(actions, info["env_id"])

It has what the Atari scripts read, typed as envpool's: `reset`, `step` (sync mode), `async_reset`,
`send`, `recv` (async mode: the first `batch_size` envs done, in the order they finished), the
spaces, `num_envs`, `config`, `close`; `info` holds `env_id`, `lives`, `reward` (unclipped),
`terminated` and `elapsed_step`. A game is a pure function of the actions sent: `lives` lives of
`life_length(seed, env, episode)` steps (losing one terminates, episodic life), cut off at
`max_episode_steps`; envpool's next-step reset; the unclipped reward is the action, the returned
one its sign. Frame bytes 0-3 hold (env, episode % 256, step % 256, step // 256), read back by
`decode(obs)`. Every env step sleeps `step_seconds` in a worker thread, outside the GIL.
"""

import queue
import threading
import time

import numpy as np
from gymnasium.spaces import Box, Discrete


def life_length(seed, env, episode, episode_length):
    """The steps of `env`'s `episode`-th life, in `episode_length` (low, high), seeded."""
    low, high = episode_length
    return int(np.random.default_rng([seed, env, episode]).integers(low, high + 1))


def frame(shape, env, episode, step):
    """The uint8 frame of `env` at `step` of its `episode`."""
    obs = np.full(shape, (env * 37 + episode * 11 + step * 3 + 1) % 256, dtype=np.uint8)
    obs.flat[:4] = (env, episode % 256, step % 256, step // 256)
    return obs


def decode(obs):
    """(env, episode % 256, step within the episode) of each frame of a batch [B, ...]."""
    head = np.asarray(obs).reshape(len(obs), -1)[:, :4].astype(np.int64)
    return head[:, 0], head[:, 1], head[:, 2] + 256 * head[:, 3]


class StandInEnvs:
    """`num_envs` stand-in games with envpool's sync or async API; see the module."""

    def __init__(
        self,
        num_envs,
        batch_size=None,
        num_threads=None,
        step_seconds=0.0,
        seed=0,
        lives=2,
        episode_length=(8, 24),
        max_episode_steps=32,
        n_actions=4,
        obs_shape=(4, 84, 84),
        reward_clip=True,
    ):
        batch_size = batch_size or num_envs
        if not 0 < batch_size <= num_envs:
            raise ValueError(f"batch_size must be in 1..num_envs ({num_envs}), got {batch_size}")
        self.num_envs, self.batch_size, self.step_seconds = num_envs, batch_size, step_seconds
        self.seed, self.lives, self.episode_length, self.max_episode_steps = (
            seed,
            lives,
            episode_length,
            max_episode_steps,
        )
        self.reward_clip, self.obs_shape = reward_clip, tuple(obs_shape)
        self.num_threads = num_threads or batch_size
        self.config = dict(
            num_envs=num_envs,
            batch_size=batch_size,
            num_threads=self.num_threads,
            seed=seed,
            max_episode_steps=max_episode_steps,
            episodic_life=True,
            reward_clip=reward_clip,
        )
        self.single_observation_space = self.observation_space = Box(
            0, 255, self.obs_shape, np.uint8
        )
        self.single_action_space = self.action_space = Discrete(n_actions)
        # per env: episodes begun (-1: none yet), step in the episode, steps in the game, lives
        # left, what comes next
        self.episode = np.full(num_envs, -1)
        self.step_in_episode = np.zeros(num_envs, dtype=np.int64)
        self.elapsed = np.zeros(num_envs, dtype=np.int64)
        self.lives_left = np.zeros(num_envs, dtype=np.int64)
        self.length = np.zeros(num_envs, dtype=np.int64)
        self.needs_reset = np.ones(num_envs, dtype=bool)
        self.new_game = np.ones(num_envs, dtype=bool)
        # every env step each env took, in order: (episode, step in the episode, action; None for a
        # reset step)
        self.trace = [[] for _ in range(num_envs)]
        self.in_flight = np.zeros(num_envs, dtype=bool)
        self.tasks, self.done = queue.SimpleQueue(), queue.SimpleQueue()
        self.workers = [
            threading.Thread(target=self._work, daemon=True) for _ in range(self.num_threads)
        ]
        for worker in self.workers:
            worker.start()
        self.closed = False

    @property
    def is_async(self):
        return self.batch_size < self.num_envs

    # ---- envpool's API ----

    def reset(self, env_id=None):
        """Start a new game in every env of `env_id` (default: all); returns (obs, info)."""
        env_id = np.arange(self.num_envs) if env_id is None else np.asarray(env_id)
        self.async_reset(env_id)
        obs, _, _, _, info = self._receive(len(env_id), order=env_id)
        return obs, info

    def async_reset(self, env_id=None):
        """Start a new game in every env of `env_id` (default: all); `recv` gets their frames."""
        self._send(None, np.arange(self.num_envs) if env_id is None else np.asarray(env_id))

    def step(self, actions, env_id=None):
        """send + recv, as envpool's step: in sync mode, all envs, in `env_id` order."""
        env_id = np.arange(self.num_envs) if env_id is None else np.asarray(env_id)
        self.send(actions, env_id)
        return self._receive(len(env_id), order=env_id)

    def send(self, actions, env_id):
        """Hand `actions[i]` to env `env_id[i]`, which steps in a worker thread."""
        actions, env_id = np.asarray(actions), np.asarray(env_id)
        if actions.shape != env_id.shape:
            raise ValueError(f"{actions.shape[0]} actions for {env_id.shape[0]} envs")
        self._send(actions, env_id)

    def recv(self):
        """The first `batch_size` envs that finish stepping."""
        return self._receive(
            self.batch_size, order=None if self.is_async else np.arange(self.num_envs)
        )

    def close(self):
        for _ in self.workers:
            self.tasks.put(None)
        for worker in self.workers:
            worker.join()
        self.closed = True

    # ---- the games ----

    def _send(self, actions, env_id):
        """Queue a step of each env of `env_id` (a reset if `actions` is None) for the workers."""
        if self.in_flight[env_id].any():
            raise RuntimeError(
                f"envs {env_id[self.in_flight[env_id]].tolist()} were sent twice before a recv"
            )
        self.in_flight[env_id] = True
        if actions is None:  # no thread holds these envs: they are not in flight
            self.new_game[env_id] = True
            self.needs_reset[env_id] = True
        for i, env in enumerate(env_id.tolist()):
            self.tasks.put((env, None if actions is None else int(actions[i])))

    def _receive(self, count, order=None):
        """`count` results as envpool returns them: in finishing order, or in `order`."""
        results = [self.done.get() for _ in range(count)]
        if order is not None:
            position = {env: i for i, env in enumerate(order.tolist())}
            results.sort(key=lambda result: position[result[0]])
        env_id = np.array([r[0] for r in results], dtype=np.int32)
        self.in_flight[env_id] = False
        obs = np.stack([r[1] for r in results])
        rewards, terminations, truncations, lives, raw, game_over, elapsed = (
            np.array([r[k] for r in results], dtype=dtype)
            for k, dtype in zip(
                range(2, 9), (np.float32, bool, bool, np.int32, np.float32, np.int32, np.int32)
            )
        )
        info = dict(
            env_id=env_id, lives=lives, reward=raw, terminated=game_over, elapsed_step=elapsed
        )
        return obs, rewards, terminations, truncations, info

    def _work(self):
        while (task := self.tasks.get()) is not None:
            if self.step_seconds > 0:
                # the env's cost; a sleep lets the GIL go, as envpool's C++ threads do
                time.sleep(self.step_seconds)
            self.done.put(self._step(*task))

    def _step(self, env, action):
        """One step of `env` (it is in no other thread's hands)."""
        if self.needs_reset[env]:
            if self.new_game[env]:
                self.lives_left[env], self.elapsed[env], self.new_game[env] = self.lives, 0, False
            self.episode[env] += 1
            self.step_in_episode[env], self.needs_reset[env] = 0, False
            self.length[env] = life_length(self.seed, env, self.episode[env], self.episode_length)
            self.trace[env].append((int(self.episode[env]), 0, None))
            obs = frame(self.obs_shape, env, self.episode[env], 0)
            return env, obs, 0.0, False, False, self.lives_left[env], 0.0, 0, self.elapsed[env]
        self.step_in_episode[env] += 1
        self.elapsed[env] += 1
        step = self.step_in_episode[env]
        self.trace[env].append((int(self.episode[env]), int(step), action))
        life_lost = step >= self.length[env]
        truncated = not life_lost and self.elapsed[env] >= self.max_episode_steps
        self.lives_left[env] -= life_lost
        game_over = life_lost and self.lives_left[env] == 0
        self.needs_reset[env] = life_lost or truncated
        self.new_game[env] = game_over or truncated
        raw = float(action)
        reward = float(np.sign(raw)) if self.reward_clip else raw
        obs = frame(self.obs_shape, env, self.episode[env], step)
        return (
            env,
            obs,
            reward,
            life_lost,
            truncated,
            self.lives_left[env],
            raw,
            int(game_over),
            self.elapsed[env],
        )
