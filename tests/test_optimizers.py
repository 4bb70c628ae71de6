"""optimizers.py, the Adam that the `_cpu` and `_seeds` scripts import (its RAdam: test_pqn.py):
torch.optim.Adam's steps, with its learning rate a number, a tensor, or one per member of
parameters stacked over members."""

import pytest
import torch
from conftest import load_script

optimizers = load_script("optimizers")


@pytest.mark.parametrize("lr_form", ["number", "tensor", "per member"])
def test_adam_takes_torch_adams_steps_over_a_long_run(lr_form):
    """beta1**t and beta2**t are running products, not powers of a step count: over 3,000 steps,
    past where the bias corrections fade, the parameters stay on torch.optim.Adam's. Per member:
    three members stacked, each with its own learning rate and its own step count, each against
    its own torch.optim.Adam; the third member stops after 1,000 steps (as --target-kl stops one,
    by restoring its state) and keeps its parameters."""
    torch.manual_seed(0)
    members, eps = 3, 1e-5
    rates = [1e-3, 3e-4, 3e-3] if lr_form == "per member" else [1e-3]
    start = {"weight": torch.randn(len(rates), 8, 5), "bias": torch.randn(len(rates), 5)}
    params = {name: p.clone() for name, p in start.items()}
    if lr_form == "per member":
        adam = optimizers.Adam(params, torch.tensor(rates), eps=eps, members=(members,))
    else:
        lr = torch.tensor(rates[0]) if lr_form == "tensor" else rates[0]
        adam = optimizers.Adam(params, lr, eps=eps)
    references = [
        {name: p[k].clone().requires_grad_() for name, p in start.items()}
        for k in range(len(rates))
    ]
    torch_adams = [
        torch.optim.Adam(reference.values(), lr=lr, eps=eps)
        for reference, lr in zip(references, rates)
    ]
    for step in range(3000):
        grads = {name: torch.randn_like(p) * (1 + step % 7) for name, p in start.items()}
        state = [x.clone() for x in (*params.values(), *adam.state_dict().values())]
        adam.step(grads)
        if len(rates) > 1 and step >= 1000:  # the third member stopped: its state restored
            for x, saved in zip((*params.values(), *adam.state_dict().values()), state):
                if x.dim():
                    x[2] = saved[2]
        for k, (reference, torch_adam) in enumerate(zip(references, torch_adams)):
            if k == 2 and step >= 1000:
                continue
            for name, p in reference.items():
                p.grad = grads[name][k]
            torch_adam.step()
        if step in (0, 9, 99, 999, 2999):
            for k, reference in enumerate(references):
                for name, p in params.items():
                    torch.testing.assert_close(
                        p[k], reference[name].detach(), rtol=0, atol=1e-5, msg=f"{name}, {step}"
                    )
    # it moved: the comparison is not of two starts
    assert (params["weight"] - start["weight"]).abs().max() > 0.01
