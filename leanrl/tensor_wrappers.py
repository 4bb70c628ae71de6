"""The scripts' normalization on a whole batch of tensor envs (tensor_envs.py, mujoco_envs.py), as
gymnasium's vector wrappers keep it: one set of statistics for the batch, updated in place without
a host sync, saved in a checkpoint."""

import gymnasium as gym
import numpy as np
import torch


class NormalizeObservation(gym.vector.VectorWrapper):
    """The observation cut to the entries `keep` (all if empty), normalized by a running mean and
    variance and clipped to [-10, 10]: gymnasium's NormalizeObservation, as the recurrent PPO
    scripts wrap each env, on the whole batch. One set of statistics for the batch, updated with
    every observation a step returns (as gymnasium's vector NormalizeObservation), normalizes the
    true final observations too. Given `obs_rms` (a trained agent's mean, var and count), frozen."""

    whole_state = True
    clip, epsilon = 10.0, 1e-8

    def __init__(self, envs, keep=(), obs_rms=None):
        super().__init__(envs)
        entries = envs.single_observation_space.shape[0]
        self.keep = torch.tensor(list(keep or range(entries)), device=envs.device)
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (len(self.keep),))
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, envs.num_envs
        )
        like = dict(device=envs.device, dtype=torch.float64)
        self.mean, self.var = (
            torch.zeros(len(self.keep), **like),
            torch.ones(len(self.keep), **like),
        )
        self.count = torch.tensor(1e-4, **like)  # gymnasium's RunningMeanStd starts so
        self.update = obs_rms is None
        if obs_rms is not None:
            for name in ("mean", "var", "count"):
                getattr(self, name).copy_(torch.as_tensor(obs_rms[name]))

    @property
    def obs_rms(self):
        """The statistics, as the scripts save them with a model."""
        return {name: getattr(self, name).cpu() for name in ("mean", "var", "count")}

    def observations(self, obs, update):
        obs = obs[:, self.keep].double()
        if update:
            update_moments(self, obs)
        normalized = (obs - self.mean) / torch.sqrt(self.var + self.epsilon)
        return normalized.float().clamp(-self.clip, self.clip)

    def reset(self, *, seed=None, options=None):
        obs, infos = self.env.reset(seed=seed, options=options)
        return self.observations(obs, self.update), infos

    def step(self, actions):
        obs, reward, terminated, truncated, infos = self.env.step(actions)
        obs = self.observations(obs, self.update)
        infos["final_obs"] = self.observations(infos["final_obs"], update=False)
        return obs, reward, terminated, truncated, infos

    def state_dict(self):
        stats = {name: getattr(self, name).clone() for name in ("mean", "var", "count")}
        return {"envs": self.env.state_dict()} | stats

    def load_state_dict(self, state):
        self.env.load_state_dict(state["envs"])
        for name in ("mean", "var", "count"):
            getattr(self, name).copy_(state[name])


class NormalizeReward(gym.vector.VectorWrapper):
    """PPO continuous's wrappers of each env's actions and rewards, on the whole batch: actions
    clipped to the action space (gymnasium's ClipAction), rewards divided by the running standard
    deviation of a discounted sum of rewards and clipped to [-10, 10] (gymnasium's NormalizeReward,
    whose sum a truncation does not cut). One set of statistics for the batch, as gymnasium's
    vector NormalizeReward keeps them."""

    whole_state = True
    clip, epsilon = 10.0, 1e-8
    names = ("discounted", "mean", "var", "count")

    def __init__(self, envs, gamma):
        super().__init__(envs)
        self.device, self.gamma = envs.device, gamma
        space = envs.single_action_space
        self.low, self.high = (
            torch.as_tensor(x, device=self.device) for x in (space.low, space.high)
        )
        like = dict(device=self.device, dtype=torch.float64)
        self.discounted = torch.zeros(envs.num_envs, **like)
        self.mean, self.var = torch.zeros((), **like), torch.ones((), **like)
        self.count = torch.tensor(1e-4, **like)  # gymnasium's RunningMeanStd starts so

    def step(self, actions):
        actions = torch.as_tensor(actions, device=self.device).clamp(self.low, self.high)
        obs, reward, terminated, truncated, infos = self.env.step(actions)
        discounted = torch.where(terminated, 0.0, self.discounted * self.gamma) + reward
        self.discounted.copy_(discounted)
        update_moments(self, self.discounted)
        scaled = (reward / torch.sqrt(self.var + self.epsilon)).clamp(-self.clip, self.clip)
        return obs, scaled.to(reward.dtype), terminated, truncated, infos

    def state_dict(self):
        return {"envs": self.env.state_dict()} | {k: getattr(self, k).clone() for k in self.names}

    def load_state_dict(self, state):
        self.env.load_state_dict(state["envs"])
        for name in self.names:
            getattr(self, name).copy_(state[name])


def update_moments(rms, x):
    """Chan et al.'s parallel update of `rms`'s mean, var and count by the batch `x`, in place."""
    batch_mean, batch_var, n = x.mean(0), x.var(0, correction=0), x.shape[0]
    delta, total = batch_mean - rms.mean, rms.count + n
    m2 = rms.var * rms.count + batch_var * n + delta.square() * rms.count * n / total
    rms.mean.add_(delta * n / total)
    rms.var.copy_(m2 / total)
    rms.count.copy_(total)
