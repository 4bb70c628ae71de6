"""gymnasium's MuJoCo locomotion tasks as batched envs on MuJoCo Warp, DeepMind's GPU engine:
HalfCheetah-v5, Hopper-v5, Walker2d-v5, Ant-v5 and Humanoid-v5, every env of a batch stepped in one
call on a GPU (or, slowly, on a CPU), behind the API of tensor_envs.py's classic control.

    envs = make_mujoco_envs("HalfCheetah-v5", num_envs=4096, device="cuda", seed=1)
    obs, _ = envs.reset()
    obs, reward, terminated, truncated, infos = envs.step(actions)  # tensors on the device

Each task is gymnasium's v5: its model file, observation, reward terms, healthy-state termination,
reset noise, frame skip and time limit. The engine computes in float32 where MuJoCo's C engine
computes in float64: the two agree within a tolerance, not bit for bit (tests/test_mujoco_envs.py).
Humanoid's model file asks for the PGS solver, which MuJoCo Warp lacks; it runs with Newton's,
which solves the same problem.

Torch reads and writes the engine's arrays in place (`warp.to_torch`). A frame, the physics steps
of one env step, is recorded once as a Warp graph and replayed: on a CPU the replay skips Python's
kernel launches (5x faster here), on a GPU it is one launch. Torch sees the engine through two
custom ops, `mujoco_advance` and `mujoco_restart`, each a function of its inputs whose outputs are
new tensors, so a step compiles with `fullgraph=True`; inside a CUDA graph that torch records, the
engine's kernels are recorded too, on torch's stream.
"""

import importlib.util
import itertools
import weakref

import gymnasium as gym
import mujoco
import numpy as np
import torch
from gymnasium.envs.mujoco.mujoco_env import expand_model_path
from tensor_envs import TensorEnv, register

wp = mjw = None  # Warp and MuJoCo Warp (requirements-mujoco-warp.txt), with the first env: 3-4 s


def start_warp():
    global wp, mjw
    if mjw is None:
        import warp

        warp.config.log_level = warp.LOG_WARNING  # before Warp starts: no banner, no line a kernel
        import mujoco_warp

        wp, mjw = warp, mujoco_warp


def installed():
    """Whether MuJoCo Warp is installed (without importing it)."""
    return importlib.util.find_spec("mujoco_warp") is not None


# each env by its handle (a string, which torch.compile takes as a constant): what the ops step
ENGINES = weakref.WeakValueDictionary()
HANDLES = itertools.count()


@torch.library.custom_op("leanrl::mujoco_advance", mutates_args=())
def mujoco_advance(
    handle: str, actions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every env of `handle` one env step on: its observations, rewards and terminations."""
    return ENGINES[handle].physics(actions)


@mujoco_advance.register_fake
def _(handle, actions):
    n, size = actions.shape[0], ENGINES[handle].single_observation_space.shape[0]
    return actions.new_empty(n, size), actions.new_empty(n), actions.new_empty(n, dtype=torch.bool)


@torch.library.custom_op("leanrl::mujoco_restart", mutates_args=())
def mujoco_restart(
    handle: str, done: torch.Tensor, draws: torch.Tensor, obs: torch.Tensor
) -> torch.Tensor:
    """Fresh episodes of `handle` where `done`, from uniform `draws`; the observations, `obs` where
    not done."""
    return ENGINES[handle].respawn(done, draws, obs)


@mujoco_restart.register_fake
def _(handle, done, draws, obs):
    return draws.new_empty(done.shape[0], ENGINES[handle].single_observation_space.shape[0])


class MujocoEnv(TensorEnv):
    """A batch of one task's envs in MuJoCo Warp's worlds; subclasses give the observation, the
    reward terms and the healthy state."""

    xml_file: str
    frame_skip: int
    reset_noise_scale: float
    max_episode_steps = 1000
    normal_qvel = False  # the reset's qvel noise scale * N(0, 1) (HalfCheetah, Ant), else uniform
    bodies = False  # reads bodies' positions and forces (Ant, Humanoid): computed at a reset too
    state_names = ("qpos", "qvel", "qacc_warmstart", "time", "xpos", "xipos")

    def __init__(self, num_envs, device="cpu", dtype=torch.float32, seed=0, max_episode_steps=None):
        if dtype != torch.float32:
            raise ValueError("MuJoCo Warp computes in float32")
        start_warp()
        model = self.load_model()
        self.nq, self.nv, self.dt = model.nq, model.nv, model.opt.timestep * self.frame_skip
        low, high = model.actuator_ctrlrange.astype(np.float32).T
        self.single_action_space = gym.spaces.Box(low, high, dtype=np.float32)
        size = self.observation_size(model)
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)
        super().__init__(num_envs, device, dtype, seed)
        self.max_episode_steps = max_episode_steps or self.max_episode_steps
        like = dict(device=self.device, dtype=dtype)
        self.init_qpos = torch.tensor(model.qpos0, **like)
        self.body_mass = torch.tensor(model.body_mass, **like)
        draws = self.nq + self.nv * (1 + self.normal_qvel)  # a reset's uniform draws in [0, 1)
        self.unit = torch.zeros(draws, **like), torch.ones(draws, **like)
        self.start_engine(model, num_envs)
        self.handle = str(next(HANDLES))
        ENGINES[self.handle] = self
        self.reset()

    def load_model(self):
        """gymnasium's model file, as its MuJoCo envs load it; PGS, which MuJoCo Warp lacks,
        replaced by Newton's solver."""
        model = mujoco.MjModel.from_xml_path(expand_model_path(self.xml_file))
        if model.opt.solver == mujoco.mjtSolver.mjSOL_PGS:
            model.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
        return model

    def start_engine(self, model, num_envs):
        """The engine's model and worlds on this device, torch's views of what it reads and writes,
        and its frame and a reset's kinematics recorded as graphs."""
        if self.device == torch.device("cuda"):  # the current one, by its index
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.warp_device = "cpu" if self.device.type == "cpu" else f"cuda:{self.device.index}"
        # a contact takes 4 rows of constraints (pyramidal cone), a limited joint one
        njmax = max(64, int(model.jnt_limited.sum()) + 4 * (model.ngeom - 1))
        with wp.ScopedDevice(self.warp_device):
            self.model = mjw.put_model(model)
            self.data = mjw.make_data(model, num_envs, njmax=njmax)
            names = ("qpos", "qvel", "qacc_warmstart", "time", "ctrl", "xpos", "xipos", "cinert")
            names += ("cvel", "qfrc_actuator", "cfrc_ext", "overflow")
            for name in names:
                setattr(self, name, wp.to_torch(getattr(self.data, name)))
            # the frame starts by keeping what the reward measures progress from
            before = ("qpos", "xpos", "xipos")
            self.before = {name: wp.clone(getattr(self.data, name)) for name in before}
            self.frame, self.kinematics = record(self.record_frame), record(self.record_kinematics)
            wp.synchronize_device()  # torch's stream reads what Warp's wrote
        self.qpos_before, self.xpos_before, self.xipos_before = map(
            wp.to_torch, self.before.values()
        )
        self.streams = {}  # Warp's handle of each torch stream the engine ran on

    def record_frame(self):
        for name, array in self.before.items():
            wp.copy(array, getattr(self.data, name))
        for _ in range(self.frame_skip):
            mjw.step(self.model, self.data)
        if self.bodies:  # the bodies' contact forces, as gymnasium computes them after a frame
            mjw.rne_postconstraint(self.model, self.data)

    def record_kinematics(self):
        mjw.kinematics(self.model, self.data)
        mjw.com_pos(self.model, self.data)
        mjw.com_vel(self.model, self.data)

    def launch(self, graph, record):
        """Replay `graph` on torch's current stream; while torch records a CUDA graph there, launch
        its kernels again (`record()`) into torch's graph instead."""
        if self.device.type == "cpu":
            return wp.capture_launch(graph)
        cuda_stream = torch.cuda.current_stream(self.device)
        stream = self.streams.get(cuda_stream.cuda_stream)
        if stream is None:
            stream = self.streams[cuda_stream.cuda_stream] = wp.stream_from_torch(cuda_stream)
        if not torch.cuda.is_current_stream_capturing():
            return wp.capture_launch(graph, stream=stream)
        with wp.ScopedStream(stream), wp.ScopedCapture(stream=stream, external=True):
            record()

    def advance(self, actions):
        return mujoco_advance(self.handle, actions.to(self.dtype))

    def restart(self, done, obs):
        fresh = self.draw(*self.unit)
        return mujoco_restart(self.handle, done, fresh, fresh.new_empty(0) if obs is None else obs)

    def physics(self, actions):
        """The custom op's step: the actions as controls, a frame, what gymnasium reads after it."""
        self.ctrl.copy_(actions)
        self.launch(self.frame, self.record_frame)
        reward, healthy = self.rewards(actions)
        return self.observe(), reward, ~healthy

    def respawn(self, done, draws, obs):
        """The custom op's reset: gymnasium's reset noise around the model's initial state, a
        world's other state cleared as mj_resetData does, where `done`."""
        scale, nq = self.reset_noise_scale, self.nq
        qpos = self.init_qpos + scale * (2 * draws[:, :nq] - 1)
        if self.normal_qvel:  # Box-Muller
            u1, u2 = draws[:, nq:].chunk(2, dim=1)
            qvel = scale * torch.sqrt(-2 * torch.log1p(-u1)) * torch.cos(2 * torch.pi * u2)
        else:
            qvel = scale * (2 * draws[:, nq:] - 1)
        mask = done[:, None]
        self.qpos.copy_(torch.where(mask, qpos, self.qpos))
        self.qvel.copy_(torch.where(mask, qvel, self.qvel))
        self.qacc_warmstart.masked_fill_(mask, 0.0)
        self.time.masked_fill_(done, 0.0)
        if self.bodies:
            # mj_forward's kinematics of the fresh worlds; the others keep the positions of the
            # frame's last physics step, which the next reward measures from (as in gymnasium)
            kept = self.xpos.clone(), self.xipos.clone()
            self.launch(self.kinematics, self.record_kinematics)
            self.xpos.copy_(torch.where(mask[..., None], self.xpos, kept[0]))
            self.xipos.copy_(torch.where(mask[..., None], self.xipos, kept[1]))
        fresh = self.observe(started=True)
        return fresh if obs.numel() == 0 else torch.where(mask, fresh, obs)

    def forward_velocity(self, before, after):
        return (after - before) / self.dt

    def control_cost(self, actions):
        return self.ctrl_cost_weight * actions.square().sum(1)

    def overflowed(self):
        """Whether a world ran out of room for contacts or constraints (a host sync): more than
        `njmax` rows of constraints, which the engine drops."""
        return bool(self.overflow.any())

    def close(self, **kwargs):
        ENGINES.pop(self.handle, None)
        super().close(**kwargs)


def record(fn):
    """`fn`'s kernel launches as a Warp graph on the current device, after a first run that loads
    them."""
    fn()
    with wp.ScopedCapture() as capture:
        fn()
    return capture.graph


class Planar(MujocoEnv):
    """HalfCheetah, Hopper and Walker2d: a body moving forward along x in a plane, observed as its
    joints' positions (but x) and velocities."""

    forward_reward_weight = 1.0
    healthy_reward = 1.0
    clip_qvel = True  # Hopper's and Walker2d's observed velocities are clipped to [-10, 10]

    def observation_size(self, model):
        return model.nq - 1 + model.nv

    def observe(self, started=False):
        qvel = self.qvel.clamp(-10.0, 10.0) if self.clip_qvel else self.qvel
        return torch.cat([self.qpos[:, 1:], qvel], dim=1)

    def rewards(self, actions):
        x_velocity = self.forward_velocity(self.qpos_before[:, 0], self.qpos[:, 0])
        healthy = self.healthy()
        reward = self.forward_reward_weight * x_velocity + self.healthy_reward * healthy
        return reward - self.control_cost(actions), healthy

    def healthy(self):
        z, angle = self.qpos[:, 1], self.qpos[:, 2]
        (min_z, max_z), (min_angle, max_angle) = self.healthy_z_range, self.healthy_angle_range
        return (min_z < z) & (z < max_z) & (min_angle < angle) & (angle < max_angle)


class HalfCheetah(Planar):
    """HalfCheetah-v5: reward the forward speed, less 0.1 |a|^2; it never terminates."""

    xml_file, frame_skip, reset_noise_scale = "half_cheetah.xml", 5, 0.1
    ctrl_cost_weight, healthy_reward, normal_qvel, clip_qvel = 0.1, 0.0, True, False

    def healthy(self):
        return torch.ones_like(self.qpos[:, 0], dtype=torch.bool)


class Hopper(Planar):
    """Hopper-v5: forward speed, 1 a step while healthy (upright, high enough, every joint state
    in (-100, 100)), less 1e-3 |a|^2."""

    xml_file, frame_skip, reset_noise_scale, ctrl_cost_weight = "hopper.xml", 4, 5e-3, 1e-3
    healthy_z_range, healthy_angle_range = (0.7, float("inf")), (-0.2, 0.2)

    def healthy(self):
        state = torch.cat([self.qpos[:, 2:], self.qvel], dim=1)
        return super().healthy() & ((-100.0 < state) & (state < 100.0)).all(dim=1)


class Walker2d(Planar):
    """Walker2d-v5: forward speed, 1 a step while healthy (torso height and angle), less 1e-3
    |a|^2."""

    xml_file, frame_skip, reset_noise_scale, ctrl_cost_weight = "walker2d_v5.xml", 4, 5e-3, 1e-3
    healthy_z_range, healthy_angle_range = (0.8, 2.0), (-1.0, 1.0)


class Ant(MujocoEnv):
    """Ant-v5: the torso's forward speed, 1 a step while healthy (finite, torso height in [0.2,
    1]), less 0.5 |a|^2 and 5e-4 |contact forces|^2; observed with the contact forces."""

    xml_file, frame_skip, reset_noise_scale, normal_qvel, bodies = "ant.xml", 5, 0.1, True, True
    ctrl_cost_weight, contact_cost_weight = 0.5, 5e-4

    def observation_size(self, model):
        return model.nq - 2 + model.nv + 6 * (model.nbody - 1)

    def contact_forces(self):
        return self.cfrc_ext.clamp(-1.0, 1.0)

    def observe(self, started=False):
        # a reset's mj_forward computes no contact forces: gymnasium observes 0
        forces = self.contact_forces()[:, 1:].flatten(1)
        forces = torch.zeros_like(forces) if started else forces
        return torch.cat([self.qpos[:, 2:], self.qvel, forces], dim=1)

    def rewards(self, actions):
        x_velocity = self.forward_velocity(self.xpos_before[:, 1, 0], self.xpos[:, 1, 0])
        z, state = self.qpos[:, 2], torch.cat([self.qpos, self.qvel], dim=1)
        healthy = torch.isfinite(state).all(dim=1) & (0.2 <= z) & (z <= 1.0)
        contact_cost = self.contact_cost_weight * self.contact_forces().square().sum((1, 2))
        reward = x_velocity + healthy - self.control_cost(actions) - contact_cost
        return reward, healthy


class Humanoid(MujocoEnv):
    """Humanoid-v5: 1.25 x the centre of mass's forward speed, 5 a step while healthy (centre of
    the torso between 1 and 2 high), less 0.1 |a|^2 and 5e-7 |contact forces|^2 (at most 10);
    observed with the bodies' inertia, velocities, actuator and contact forces."""

    xml_file, frame_skip, reset_noise_scale, bodies = "humanoid.xml", 5, 1e-2, True
    ctrl_cost_weight, contact_cost_weight = 0.1, 5e-7

    def observation_size(self, model):
        return model.nq - 2 + model.nv + (10 + 6 + 6) * (model.nbody - 1) + model.nv - 6

    def observe(self, started=False):
        bodies = [self.cinert[:, 1:].flatten(1), self.cvel[:, 1:].flatten(1)]
        forces = [self.qfrc_actuator[:, 6:], self.cfrc_ext[:, 1:].flatten(1)]
        # a reset's mj_forward, at zero controls, computes neither force: gymnasium observes 0
        forces = [torch.zeros_like(f) for f in forces] if started else forces
        return torch.cat([self.qpos[:, 2:], self.qvel, *bodies, *forces], dim=1)

    def mass_center(self, xipos):
        return (self.body_mass[:, None] * xipos).sum(1)[:, :2] / self.body_mass.sum()

    def rewards(self, actions):
        x_before, x_after = self.mass_center(self.xipos_before), self.mass_center(self.xipos)
        x_velocity = self.forward_velocity(x_before[:, 0], x_after[:, 0])
        z = self.qpos[:, 2]
        healthy = (1.0 < z) & (z < 2.0)
        contact_cost = self.contact_cost_weight * self.cfrc_ext.square().sum((1, 2))
        reward = 1.25 * x_velocity + 5.0 * healthy - self.control_cost(actions)
        return reward - contact_cost.clamp(max=10.0), healthy


MUJOCO_ENVS = {
    "HalfCheetah-v5": HalfCheetah,
    "Hopper-v5": Hopper,
    "Walker2d-v5": Walker2d,
    "Ant-v5": Ant,
    "Humanoid-v5": Humanoid,
}


register(MUJOCO_ENVS)  # gym.make_vec("tensor/HalfCheetah-v5", num_envs=4096, device="cuda")


def make_mujoco_envs(env_id, num_envs, device="cpu", seed=0, max_episode_steps=None):
    """The MuJoCo Warp version of `env_id` (a key of MUJOCO_ENVS), `num_envs` of them on
    `device`."""
    return MUJOCO_ENVS[env_id](num_envs, device, seed=seed, max_episode_steps=max_episode_steps)
