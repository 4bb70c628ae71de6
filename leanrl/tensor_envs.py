"""gymnasium's classic control as batched tensors: every env of a batch stepped in one call, on the
CPU or a GPU, with gymnasium's dynamics, rewards, terminations and time limits.

    envs = make_tensor_envs("CartPole-v1", num_envs=4096, device="cuda", seed=1)
    obs, _ = envs.reset()
    obs, reward, terminated, truncated, infos = envs.step(actions)  # tensors on the device

An env speaks gymnasium's vector-env API with same-step autoreset: an episode that ends is reset
in the same step, its true last observation in `infos["final_obs"]` (where `infos["_final_obs"]`),
its return and length in `infos["final_info"]["episode"]` (where `["_episode"]`), as gymnasium's
vector env with `RecordEpisodeStatistics` reports them. A step makes no host sync and no Python
branch on a tensor, and updates its state in place: it compiles with `fullgraph=True` and a CUDA
graph can record it.

Reset states come from a counter-based hash of (seed, env, draw): a pure function of tensors, so a
compiled step or a CUDA graph draws them (a `torch.Generator` can be neither traced by torch.compile
nor replayed by a graph it was not registered with), the CPU and a GPU draw the same ones, and
`state_dict()` holds the whole env. In float64 on a CPU the dynamics are gymnasium's operation for
operation, float32 roundings included where gymnasium makes them (tests/test_tensor_envs.py).
"""

import math

import gymnasium as gym
import numpy as np
import torch
from tensor_wrappers import NormalizeObservation, NormalizeReward

MASK32 = 0xFFFFFFFF


def mul32(x, c):
    """(x * c) mod 2**32 for int64 `x` < 2**32 and a constant `c` < 2**32, without overflowing:
    `c` is taken as c - 2**32 where it is 2**31 or more, and the product as two's complement.
    `x` is read once: a step's compiled graph holds each read of it whole, nested in each hash."""
    return (x * (c - 2**32 if c >= 2**31 else c)) & MASK32


def hash32(x):
    """A 32-bit integer hash (Wellons' lowbias32): every output bit depends on every input bit."""
    x = x ^ (x >> 16)
    x = mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def uniform(keys, counter, low, high):
    """[num_envs, len(low)] draws, uniform in [low, high) (tensors of the draws' dtype), for the
    `counter`-th draw of each env's key (its seed, hashed): 53 random bits in float64, 24 in
    float32."""
    slots = counter * len(low) + torch.arange(len(low), device=keys.device)
    bits = hash32(keys[:, None] ^ hash32(slots & MASK32)[None, :])
    if low.dtype == torch.float64:
        more = hash32(bits ^ 0x5BD1E995)
        unit = ((bits >> 5).double() * 2.0**26 + (more >> 6).double()) * 2.0**-53
    else:
        unit = (bits >> 8).to(low.dtype) * 2.0**-24
    return low + (high - low) * unit


def as_float32(x):
    """`x` rounded to float32 and back: where gymnasium computes in float32."""
    return x.float().to(x.dtype)


class TensorEnv(gym.vector.VectorEnv):
    """A batch of `num_envs` envs as tensors on `device`: what every such env shares, the time
    limit, each episode's return and length, same-step autoreset and the reset draws. A subclass
    holds the state: `advance` steps it, `restart` starts fresh episodes where `done`."""

    max_episode_steps: int
    whole_state = True  # state_dict() holds every episode as it is: a checkpoint resumes them
    state_names: tuple  # the subclass's state, beside the counters

    def __init__(self, num_envs, device="cpu", dtype=torch.float32, seed=0):
        self.num_envs, self.device, self.dtype = num_envs, torch.device(device), dtype
        batch = gym.vector.utils.batch_space
        self.observation_space = batch(self.single_observation_space, num_envs)
        self.action_space = batch(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
        self.render_mode, self.closed = None, False
        kwargs = dict(device=self.device)
        self.elapsed = torch.zeros(num_envs, dtype=torch.long, **kwargs)
        self.episode_return = torch.zeros(num_envs, dtype=dtype, **kwargs)
        self.episode_length = torch.zeros(num_envs, dtype=torch.long, **kwargs)
        self.keys = torch.zeros(num_envs, dtype=torch.long, **kwargs)  # each env's seed, hashed
        self.draws = torch.zeros((), dtype=torch.long, **kwargs)  # the reset draws so far
        self.seed(seed)

    def seed(self, seed):
        """Env i draws from `seed + i`, or from `seed[i]` if `seed` is a list, as gymnasium's."""
        listed = isinstance(seed, (list, tuple))
        seeds = seed if listed else [seed + i for i in range(self.num_envs)]
        if len(seeds) != self.num_envs:
            raise ValueError(f"{len(seeds)} seeds for {self.num_envs} envs")
        self.keys.copy_(hash32(torch.tensor(seeds, dtype=torch.long) & MASK32))
        self.draws.zero_()

    def draw(self, low, high):
        """A fresh draw for every env, uniform in [low, high) (tensors of the draws' dtype)."""
        draws = uniform(self.keys, self.draws, low, high)
        self.draws.add_(1)
        return draws

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.seed(seed)
        done = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        return self.start_episodes(done, None), {}

    def step(self, actions):
        actions = torch.as_tensor(actions, device=self.device)
        final_obs, reward, terminated = self.advance(actions)
        self.elapsed.add_(1)
        self.episode_return.add_(reward)
        self.episode_length.add_(1)
        truncated = self.elapsed >= self.max_episode_steps  # gymnasium's TimeLimit
        done = terminated | truncated
        episode = dict(r=self.episode_return.clone(), l=self.episode_length.clone())
        final_info = {"episode": episode, "_episode": done}
        infos = {"final_obs": final_obs, "_final_obs": done}
        infos |= {"final_info": final_info, "_final_info": done}
        obs = self.start_episodes(done, final_obs)
        return obs, reward, terminated, truncated, infos

    def start_episodes(self, done, obs):
        """Fresh episodes where `done`, in place; the observations (`obs` where not done)."""
        for counter in (self.elapsed, self.episode_return, self.episode_length):
            counter.masked_fill_(done, 0)
        return self.restart(done, obs)

    def normalized(self, keep=(), obs_rms=None, gamma=None):
        """These envs with their observations cut, normalized and clipped (NormalizeObservation);
        given `gamma`, also actions clipped, rewards normalized and clipped (NormalizeReward)."""
        envs = self if gamma is None else NormalizeReward(self, gamma)
        return NormalizeObservation(envs, keep, obs_rms)

    def state_dict(self):
        names = ("elapsed", "episode_return", "episode_length", "keys", "draws", *self.state_names)
        return {name: getattr(self, name).clone() for name in names}

    def load_state_dict(self, saved):
        for name, value in saved.items():
            getattr(self, name).copy_(value)

    def close(self, **kwargs):
        self.closed = True


class ClassicEnv(TensorEnv):
    """A classic-control task: its state one tensor [num_envs, size], stepped by `dynamics`."""

    reset_bounds: tuple  # (low, high) of the state a reset draws
    state_names = ("state",)

    def __init__(self, num_envs, device="cpu", dtype=torch.float32, seed=0):
        super().__init__(num_envs, device, dtype, seed)
        kwargs = dict(device=self.device, dtype=dtype)
        self.low, self.high = (torch.tensor(x, **kwargs) for x in self.reset_bounds)
        self.state = torch.zeros(num_envs, len(self.reset_bounds[0]), **kwargs)
        self.reset_states(torch.ones(num_envs, dtype=torch.bool, device=self.device))

    def advance(self, actions):
        state, reward, terminated = self.dynamics(self.state, actions)
        self.state.copy_(state)
        return self.observe(state), reward, terminated

    def restart(self, done, obs):
        self.reset_states(done)
        return self.observe(self.state)

    def reset_states(self, done):
        """Fresh states where `done`, in place: a draw for every env, kept where done."""
        fresh = self.initial_state(self.draw(self.low, self.high))
        self.state.copy_(torch.where(done[:, None], fresh, self.state))

    def initial_state(self, draws):
        """The state a reset starts from, given uniform draws in the reset bounds."""
        return draws

    def observe(self, state):
        return state.clone()


def box(high, dtype=np.float32):
    high = np.array(high, dtype=dtype)
    return gym.spaces.Box(-high, high, dtype=dtype)


class CartPole(ClassicEnv):
    """CartPole-v1: gymnasium's Euler integration of the cart and pole."""

    max_episode_steps = 500
    reset_bounds = (-0.05,) * 4, (0.05,) * 4
    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    total_mass, polemass_length = masspole + masscart, masspole * length
    theta_threshold, x_threshold = 12 * 2 * math.pi / 360, 2.4
    f32max = np.finfo(np.float32).max
    high = [x_threshold * 2, f32max, theta_threshold * 2, f32max]
    single_observation_space = box(high)
    single_action_space = gym.spaces.Discrete(2)

    def dynamics(self, state, action):
        x, x_dot, theta, theta_dot = state.unbind(1)
        force = torch.where(action == 1, self.force_mag, -self.force_mag).to(self.dtype)
        costheta, sintheta = torch.cos(theta), torch.sin(theta)
        temp = (force + self.polemass_length * theta_dot.square() * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * costheta.square() / self.total_mass)
        )
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        x = x + self.tau * x_dot
        x_dot = x_dot + self.tau * xacc
        theta = theta + self.tau * theta_dot
        theta_dot = theta_dot + self.tau * thetaacc
        terminated = (x.abs() > self.x_threshold) | (theta.abs() > self.theta_threshold)
        reward = torch.ones_like(x)  # the step that ends the episode is rewarded too
        return torch.stack([x, x_dot, theta, theta_dot], dim=1), reward, terminated


class Acrobot(ClassicEnv):
    """Acrobot-v1: gymnasium's "book" dynamics, RK4 steps of 0.2 s, angles kept in [-pi, pi]."""

    max_episode_steps = 500
    reset_bounds = (-0.1,) * 4, (0.1,) * 4
    max_vel_1, max_vel_2, dt = 4 * math.pi, 9 * math.pi, 0.2
    single_observation_space = box([1.0, 1.0, 1.0, 1.0, max_vel_1, max_vel_2])
    single_action_space = gym.spaces.Discrete(3)

    def initial_state(self, draws):
        return as_float32(draws)  # gymnasium draws the start in float32

    @staticmethod
    def dsdt(s, torque):
        """d(theta1, theta2, dtheta1, dtheta2)/dt, gymnasium's expressions in its order (`x**2`
        where gymnasium's is numpy's power, `square()` where it squares)."""
        m1 = m2 = l1 = 1.0
        lc1 = lc2 = 0.5
        I1 = I2 = 1.0
        g = 9.8
        theta1, theta2, dtheta1, dtheta2 = s.unbind(1)
        d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * torch.cos(theta2)) + I1 + I2
        d2 = m2 * (lc2**2 + l1 * lc2 * torch.cos(theta2)) + I2
        phi2 = m2 * lc2 * g * torch.cos(theta1 + theta2 - math.pi / 2.0)
        phi1 = (
            -m2 * l1 * lc2 * dtheta2**2 * torch.sin(theta2)
            - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * torch.sin(theta2)
            + (m1 * lc1 + m2 * l1) * g * torch.cos(theta1 - math.pi / 2)
            + phi2
        )
        ddtheta2 = (
            torque + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1**2 * torch.sin(theta2) - phi2
        ) / (m2 * lc2**2 + I2 - d2**2 / d1)
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return torch.stack([dtheta1, dtheta2, ddtheta1, ddtheta2], dim=1)

    @staticmethod
    def wrap(x):
        """gymnasium's `wrap` to [-pi, pi] by whole turns, unrolled: a step turns less than 4. A
        turn is subtracted times 0 or 1, not chosen by `where`: each of those reads `x` thrice, and
        torch.compile inlines the 3**8 reads of the step before it (minutes to compile)."""
        for _ in range(4):
            x = x - (x > math.pi).to(x.dtype) * (2 * math.pi)
        for _ in range(4):
            x = x + (x < -math.pi).to(x.dtype) * (2 * math.pi)
        return x

    def dynamics(self, state, action):
        torque = (action - 1).to(self.dtype)
        dt, dt2 = self.dt, self.dt / 2.0
        k1 = self.dsdt(state, torque)
        k2 = self.dsdt(state + dt2 * k1, torque)
        k3 = self.dsdt(state + dt2 * k2, torque)
        k4 = self.dsdt(state + dt * k3, torque)
        s = state + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        theta1, theta2, dtheta1, dtheta2 = s.unbind(1)
        theta1, theta2 = self.wrap(theta1), self.wrap(theta2)
        dtheta1 = dtheta1.clamp(-self.max_vel_1, self.max_vel_1)
        dtheta2 = dtheta2.clamp(-self.max_vel_2, self.max_vel_2)
        terminated = -torch.cos(theta1) - torch.cos(theta2 + theta1) > 1.0
        reward = torch.where(terminated, 0.0, -1.0).to(self.dtype)
        return torch.stack([theta1, theta2, dtheta1, dtheta2], dim=1), reward, terminated

    def observe(self, state):
        theta1, theta2, dtheta1, dtheta2 = state.unbind(1)
        angles = [torch.cos(theta1), torch.sin(theta1), torch.cos(theta2), torch.sin(theta2)]
        return torch.stack([*angles, dtheta1, dtheta2], dim=1)


class MountainCar(ClassicEnv):
    """MountainCar-v0: a car pushed left, not at all or right, reaching the flag on the hill."""

    max_episode_steps = 200
    reset_bounds = (-0.6, 0.0), (-0.4, 0.0)
    min_position, max_position, max_speed = -1.2, 0.6, 0.07
    goal_position, force, gravity = 0.5, 0.001, 0.0025
    single_observation_space = gym.spaces.Box(
        np.array([min_position, -max_speed], np.float32),
        np.array([max_position, max_speed], np.float32),
    )
    single_action_space = gym.spaces.Discrete(3)

    def dynamics(self, state, action):
        position, velocity = state.unbind(1)
        push = (action - 1).to(self.dtype) * self.force
        velocity = velocity + (push + torch.cos(3 * position) * -self.gravity)
        velocity = velocity.clamp(-self.max_speed, self.max_speed)
        position = (position + velocity).clamp(self.min_position, self.max_position)
        velocity = torch.where((position == self.min_position) & (velocity < 0), 0.0, velocity)
        terminated = (position >= self.goal_position) & (velocity >= 0)
        reward = torch.full_like(position, -1.0)
        return torch.stack([position, velocity], dim=1), reward, terminated


class MountainCarContinuous(ClassicEnv):
    """MountainCarContinuous-v0: the car pushed with a force in [-1, 1], 100 at the flag less
    0.1 a^2 a step. gymnasium keeps this env's state in float32, and so do its roundings here."""

    max_episode_steps = 999
    reset_bounds = (-0.6, 0.0), (-0.4, 0.0)
    min_position, max_position, max_speed = -1.2, 0.6, 0.07
    goal_position, power = 0.45, 0.0015
    power32, max_speed32, goal32 = (float(np.float32(x)) for x in (power, max_speed, goal_position))
    min32, max32 = (float(np.float32(x)) for x in (min_position, max_position))
    single_observation_space = gym.spaces.Box(
        np.array([min_position, -max_speed], np.float32),
        np.array([max_position, max_speed], np.float32),
    )
    single_action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def dynamics(self, state, action):
        # after its first step gymnasium's state is float32, and so is its arithmetic, Python's
        # numbers rounded to float32 (the *32 constants); the first step after a reset is float64's
        position, velocity = state.unbind(1)
        first = self.elapsed == 0
        f32 = as_float32
        action = f32(action[:, 0].to(self.dtype))
        three_p = torch.where(first, 3 * position, f32(3 * position))
        push = f32(action.clamp(-1.0, 1.0) * self.power32)
        push = f32(push - f32(0.0025 * torch.cos(three_p)))
        velocity = f32(velocity + push).clamp(-self.max_speed32, self.max_speed32)
        moved = position + velocity
        position = torch.where(first, moved, f32(moved)).clamp(self.min32, self.max32)
        velocity = torch.where((position == self.min32) & (velocity < 0), 0.0, velocity)
        terminated = (position >= self.goal32) & (velocity >= 0)
        reward = torch.where(terminated, 100.0, 0.0).to(self.dtype) - action.square() * 0.1
        return f32(torch.stack([position, velocity], dim=1)), reward, terminated


class Pendulum(ClassicEnv):
    """Pendulum-v1: swing up and hold a pendulum; the cost is the angle from upright (normalized to
    [-pi, pi)) squared, plus speed and torque penalties. It never terminates, only truncates."""

    max_episode_steps = 200
    reset_bounds = (-math.pi, -1.0), (math.pi, 1.0)
    max_speed, max_torque, dt, g, m, length = 8.0, 2.0, 0.05, 10.0, 1.0, 1.0
    single_observation_space = box([1.0, 1.0, max_speed])
    single_action_space = gym.spaces.Box(-max_torque, max_torque, (1,), np.float32)

    def dynamics(self, state, action):
        th, thdot = state.unbind(1)
        # the torque terms in float32, as gymnasium computes them with float32 actions
        u = action[:, 0].float().clamp(-self.max_torque, self.max_torque)
        angle = torch.remainder(th + math.pi, 2 * math.pi) - math.pi
        costs = angle**2 + 0.1 * thdot**2 + (0.001 * u**2).to(self.dtype)
        g, m, length, dt = self.g, self.m, self.length, self.dt
        accel = 3 * g / (2 * length) * torch.sin(th) + (3.0 / (m * length**2) * u).to(self.dtype)
        newthdot = (thdot + accel * dt).clamp(-self.max_speed, self.max_speed)
        newth = th + newthdot * dt
        terminated = torch.zeros_like(th, dtype=torch.bool)
        return torch.stack([newth, newthdot], dim=1), -costs, terminated

    def observe(self, state):
        th, thdot = state.unbind(1)
        return torch.stack([torch.cos(th), torch.sin(th), thdot], dim=1)


TENSOR_ENVS = {
    "CartPole-v1": CartPole,
    "Acrobot-v1": Acrobot,
    "MountainCar-v0": MountainCar,
    "MountainCarContinuous-v0": MountainCarContinuous,
    "Pendulum-v1": Pendulum,
}


def register(envs):
    """gymnasium's way to `envs` (id -> class): gym.make_vec("tensor/CartPole-v1", num_envs=8)."""
    for env_id, env_class in envs.items():
        if f"tensor/{env_id}" not in gym.registry:
            gym.register(f"tensor/{env_id}", vector_entry_point=env_class)


register(TENSOR_ENVS)


def make_tensor_envs(env_id, num_envs, device="cpu", seed=0, dtype=torch.float32):
    """The tensor version of `env_id` (a key of TENSOR_ENVS), `num_envs` of them on `device`."""
    return TENSOR_ENVS[env_id](num_envs, device=device, dtype=dtype, seed=seed)
