#!/usr/bin/python3
"""Writes the PyTorch reference fixtures for models/nn and train/optim.

tests/golden/nn.safetensors:    per layer case `<case>.`: parameters (state_dict names), input,
                                output, grad_output, grad_input, grad.<parameter>; batch norm
                                also after.<buffer> (running statistics after the forward).
tests/golden/optim.safetensors: per optimizer case `<case>.`: p<k>.initial, p<k>.grad<s> (absent
                                when that parameter has no gradient at step s), p<k>.after<s>.

Run from the repository root with Debian's PyTorch:  /usr/bin/python3 tests/golden/make_golden_nn.py
The hyperparameters here are repeated in tests/models/layers_test.cc and tests/train/optim_test.cc.
"""
import os

import torch

from golden_io import write_safetensors

HERE = os.path.dirname(os.path.abspath(__file__))


def randomize(module):
    """Non-default parameters and buffers so every term of the formulas matters."""
    with torch.no_grad():
        for name, tensor in module.named_parameters():
            tensor.copy_(torch.randn_like(tensor) * 0.5)
        for name, tensor in module.named_buffers():
            if name.endswith("running_mean"):
                tensor.copy_(torch.randn_like(tensor) * 0.2)
            elif name.endswith("running_var"):
                tensor.copy_(torch.rand_like(tensor) + 0.5)


def record_layer(out, case, module, inputs, input_requires_grad=True):
    for name, tensor in module.state_dict().items():
        out[f"{case}.{name}"] = tensor.clone()
    x = inputs.clone().requires_grad_(input_requires_grad)
    y = module(x)
    grad_output = torch.randn_like(y)
    y.backward(grad_output)
    out[f"{case}.input"] = inputs
    out[f"{case}.output"] = y
    out[f"{case}.grad_output"] = grad_output
    if input_requires_grad:
        out[f"{case}.grad_input"] = x.grad
    for name, tensor in module.named_parameters():
        out[f"{case}.grad.{name}"] = tensor.grad
    for name, tensor in module.named_buffers():
        out[f"{case}.after.{name}"] = tensor.clone()


def make_nn():
    torch.manual_seed(0)
    out = {}
    nn = torch.nn

    record_layer(out, "linear", nn.Linear(5, 4), torch.randn(3, 5))

    conv = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)
    record_layer(out, "conv_groups", conv, torch.randn(2, 4, 7, 7))

    conv = nn.Conv2d(3, 4, (3, 2), stride=(1, 2), padding=(2, 1), dilation=(2, 1), bias=False)
    record_layer(out, "conv_dilated", conv, torch.randn(2, 3, 6, 7))

    bn = nn.BatchNorm2d(3)
    randomize(bn)
    bn.train()
    record_layer(out, "bn_train", bn, torch.randn(4, 3, 5, 5) * 2 + 1)

    bn = nn.BatchNorm2d(3)
    randomize(bn)
    bn.num_batches_tracked.fill_(7)
    bn.eval()
    record_layer(out, "bn_eval", bn, torch.randn(4, 3, 5, 5))

    ln = nn.LayerNorm([4, 5])
    randomize(ln)
    record_layer(out, "layernorm", ln, torch.randn(2, 3, 4, 5))

    emb = nn.Embedding(10, 4, padding_idx=2)
    indices = torch.tensor([[1, 2, 3, 2], [9, 0, 1, 2], [5, 5, 7, 8]])
    record_layer(out, "embedding", emb, indices, input_requires_grad=False)

    mlp = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    record_layer(out, "mlp", mlp, torch.randn(5, 6))
    return out


# name -> (constructor, steps where parameter 1 gets no gradient)
OPTIMIZER_CASES = {
    "sgd_plain": (lambda p: torch.optim.SGD(p, lr=0.1), ()),
    "sgd_nesterov": (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True,
                                                weight_decay=0.01), ()),
    "sgd_dampening": (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, dampening=0.3,
                                                 weight_decay=0.02), ()),
    "adam": (lambda p: torch.optim.Adam(p, lr=0.01, foreach=False), ()),
    "adam_decay_amsgrad": (lambda p: torch.optim.Adam(p, lr=0.02, betas=(0.8, 0.99), eps=1e-6,
                                                      weight_decay=0.1, amsgrad=True,
                                                      foreach=False), ()),
    "adam_skip": (lambda p: torch.optim.Adam(p, lr=0.01, foreach=False), (1,)),
    "adamw": (lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, foreach=False), ()),
}


def make_optim():
    torch.manual_seed(1)
    out = {}
    for case, (make, skipped) in OPTIMIZER_CASES.items():
        params = [torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True)]
        for k, p in enumerate(params):
            out[f"{case}.p{k}.initial"] = p.detach().clone()
        optimizer = make(params)
        for step in range(3):
            for k, p in enumerate(params):
                if k == 1 and step in skipped:
                    p.grad = None
                    continue
                p.grad = torch.randn_like(p)
                out[f"{case}.p{k}.grad{step}"] = p.grad.clone()
            optimizer.step()
            for k, p in enumerate(params):
                out[f"{case}.p{k}.after{step}"] = p.detach().clone()
    return out


if __name__ == "__main__":
    for name, tensors in (("nn", make_nn()), ("optim", make_optim())):
        metadata = {"generator": "tests/golden/make_golden_nn.py",
                    "torch": torch.__version__.split("+")[0]}
        write_safetensors(os.path.join(HERE, f"{name}.safetensors"), sorted(tensors.items()),
                          metadata)
    print("wrote", os.path.join(HERE, "nn.safetensors"), "and optim.safetensors")
