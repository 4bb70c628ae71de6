"""The Atari scripts: envpool's games, which cannot be saved (a resumed run's games start fresh,
seeded by its step), scored over whole games, and recorded from envpool's `render()`."""

import numpy as np
import torch
from runs import Run


class AtariRun(Run):
    def __init__(self, args, script, free_flags=(), policy_flags=("env_id",)):
        super().__init__(args, script, free_flags, policy_flags)
        # envpool's seeds are below 2**31
        resumed = self.last_checkpoint.step if self.last_checkpoint else 0
        self.env_seed = (args.seed + resumed) % 2**31

    def check_video(self):
        __import__("gymnasium.utils.save_video")  # the writer, moviepy's
        envs = __import__("envpool").make_gymnasium(
            self.args.env_id, num_envs=1, render_mode="rgb_array"
        )
        envs.reset()
        assert isinstance(envs.render(env_ids=[0]), np.ndarray), "no frame"
        envs.close()


def finished_games(game_returns, infos, truncations):
    """The scores of the games that ended on this step, over all their lives. envpool's info
    has no episode statistics, so `game_returns` (one per env) adds up `info["reward"]` in place."""
    game_returns += infos["reward"]
    game_over = infos["terminated"].astype(bool) | truncations
    scores = game_returns[game_over].tolist()
    game_returns[game_over] = 0.0
    return scores


def evaluate_games(act, envs, games, device):
    """The scores of `games` whole games played on `envs` (one env, closed after) with `act(obs) ->
    actions`."""
    obs, _ = envs.reset()
    game_returns, scores = np.zeros(1), []
    while len(scores) < games:
        with torch.no_grad():
            actions = act(torch.as_tensor(obs, device=device))
        obs, _, _, truncations, infos = envs.step(actions.cpu().numpy())
        scores += finished_games(game_returns, infos, truncations)
    envs.close()
    return scores[:games]


class VideoRecorder:
    """envpool's `envs`, recording the games of env 0 from `render()` to
    `<folder>/<prefix>-episode-<game>.mp4`: every game for "eval", gymnasium's schedule (games 0, 1,
    8, 27, ...) for "train". A game is a whole game, all its lives; `close()` saves one unfinished.
    The envs must be made with `render_mode="rgb_array"`."""

    def __init__(self, envs, folder, prefix):
        from gymnasium.utils.save_video import capped_cubic_video_schedule, save_video

        self.envs, self.folder, self.prefix, self.save_video = envs, folder, prefix, save_video
        self.schedule = capped_cubic_video_schedule if prefix == "train" else lambda game: True
        self.fps = 60 / envs.spec.config.frame_skip  # the console draws 60 frames a second
        self.game, self.frames = 0, []

    def __getattr__(self, name):  # the rest is envpool's
        return getattr(self.envs, name)

    def reset(self):
        obs, infos = self.envs.reset()
        self.record(infos, np.zeros(len(obs), dtype=bool))  # no game ends at a reset
        return obs, infos

    def step(self, actions):
        outcome = self.envs.step(actions)
        self.record(outcome[4], outcome[3])
        return outcome

    def recv(self):
        outcome = self.envs.recv()
        self.record(outcome[4], outcome[3])
        return outcome

    def record(self, infos, truncations):
        """env 0's frame, if it is in this batch; its video when its game ends."""
        for i in np.flatnonzero(infos["env_id"] == 0):  # async: env 0 is in some batches only
            if self.schedule(self.game):
                self.frames.append(self.envs.render(env_ids=[0])[0])
            if infos["terminated"][i] or truncations[i]:
                self.save()
                self.game += 1

    def save(self):
        if self.frames:
            self.save_video(
                self.frames,
                self.folder,
                episode_trigger=lambda game: True,  # self.frames holds only scheduled games
                name_prefix=self.prefix,
                episode_index=self.game,
                fps=self.fps,
            )
        self.frames = []

    def close(self):
        self.save()
        self.envs.close()
