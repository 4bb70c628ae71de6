"""Adam and RAdam on a dict of tensors, stepped in place inside a compiled update.

The `_cpu` and `_seeds` scripts take their gradients with `torch.func` and compile each update, from
the forward pass to the optimizer's step, as one graph. `torch.optim.Adam.step` would break that
graph (it calls `torch._dynamo.graph_break()`). torch's functional Adam (`torch.optim.adam.adam`)
does compile into it, but on a CPU Inductor then computes `beta**step` again in every vector of
every parameter's kernel, which makes the step slower (measured in docs/performance.md); its
functional RAdam computes its corrections from the step count the same way. So the two steps are
written out here, once: the bias corrections come from tensors that each step updates once.

Parameters may be stacked over members ([members, ...], the `_seeds` scripts). Every op is
elementwise, so each member takes its own step; a learning rate of shape [members] gives each
member its own.
"""

import torch


def broadcastable(value, like):
    """`value` (a number, a 0-d tensor, or a tensor of one value per member [members]) shaped to
    broadcast over `like` ([members, ...])."""
    if not torch.is_tensor(value) or value.dim() == 0:
        return value
    return value.view(-1, *[1] * (like.dim() - 1))


class Adam:
    """torch.optim.Adam's step (no weight decay, no amsgrad) on a dict of tensors, in place.

    The learning rate is in `param_groups`, as torch's: a number, or a tensor that the run anneals
    in place (nothing recompiles). `members`: the shape of the step count, () when all members step
    together, (members,) when each keeps its own (a member stopped early keeps its state)."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8, members=()):
        self.params, self.betas, self.eps = params, betas, eps
        self.param_groups = [{"lr": lr}]
        self.exp_avg = {name: torch.zeros_like(p) for name, p in params.items()}
        self.exp_avg_sq = {name: torch.zeros_like(p) for name, p in params.items()}
        # beta1**t and beta2**t as running products of tensors: nothing recompiles, and Inductor
        # would compute a power of a step count in every vector of every parameter, slowly
        first = next(iter(params.values()))
        self.beta1_power, self.beta2_power = first.new_ones(members), first.new_ones(members)

    def step(self, grads):
        beta1, beta2 = self.betas
        self.beta1_power.mul_(beta1)
        self.beta2_power.mul_(beta2)
        bias_correction1, bias_correction2 = 1 - self.beta1_power, 1 - self.beta2_power
        for name, param in self.params.items():
            exp_avg, exp_avg_sq, grad = self.exp_avg[name], self.exp_avg_sq[name], grads[name]
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (exp_avg_sq / broadcastable(bias_correction2, param)).sqrt() + self.eps
            lr = broadcastable(self.param_groups[0]["lr"], param)
            param.sub_(lr * (exp_avg / broadcastable(bias_correction1, param)) / denom)

    def state_dict(self):  # the moments, beta1**t, beta2**t and a tensor lr, for checkpoints
        state = {f"exp_avg.{name}": value for name, value in self.exp_avg.items()}
        state |= {f"exp_avg_sq.{name}": value for name, value in self.exp_avg_sq.items()}
        state |= dict(beta1_power=self.beta1_power, beta2_power=self.beta2_power)
        lr = self.param_groups[0]["lr"]
        return state | (dict(lr=lr) if torch.is_tensor(lr) else {})

    def load_state_dict(self, state):  # in place: a compiled update holds these tensors
        for key, value in self.state_dict().items():
            value.copy_(state[key])


class RAdam:
    """torch.optim.RAdam's step (no weight decay) on a dict of tensors, in place, as its
    `capturable` form writes it: no branch on the step. The learning rate is in `param_groups`."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8):
        self.params, self.betas, self.eps = params, betas, eps
        self.param_groups = [{"lr": lr}]
        self.exp_avg = {name: torch.zeros_like(p) for name, p in params.items()}
        self.exp_avg_sq = {name: torch.zeros_like(p) for name, p in params.items()}
        # a tensor: nothing recompiles. In float64, as torch.optim.RAdam computes from its step
        # count: the rectification's test rho_t > 5 is decided within 0.01 at step 5
        first = next(iter(params.values()))
        self.step_count = first.new_zeros((), dtype=torch.float64)

    def step(self, grads):
        beta1, beta2 = self.betas
        step = self.step_count.add_(1)
        bias_correction1, bias_correction2 = 1 - beta1**step, 1 - beta2**step
        # the length of the approximated simple moving average, and its limit
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * step * beta2**step / bias_correction2
        # the rectification of the adaptive rate's variance (NaN for some rho_t < 4, unused there)
        rect = (rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)
        rect = rect.sqrt()
        for name, param in self.params.items():
            exp_avg, exp_avg_sq, grad = self.exp_avg[name], self.exp_avg_sq[name], grads[name]
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            adaptive_lr = bias_correction2**0.5 / (exp_avg_sq.sqrt() + self.eps)
            # the variance rectified once the average is long enough, plain momentum SGD before
            scale = torch.where(rho_t > 5, rect * adaptive_lr, 1.0)
            param.sub_(exp_avg / bias_correction1 * self.param_groups[0]["lr"] * scale)

    def state_dict(self):  # the moments, the step and the learning rate, for checkpoints
        state = {f"exp_avg.{name}": value for name, value in self.exp_avg.items()}
        state |= {f"exp_avg_sq.{name}": value for name, value in self.exp_avg_sq.items()}
        return state | dict(step=self.step_count, lr=self.param_groups[0]["lr"])

    def load_state_dict(self, state):  # in place: a compiled update holds these tensors
        for key, value in self.state_dict().items():
            value.copy_(state[key])
