#!/usr/bin/python3
"""Reference values for Tessel's ResNet and ShuffleNet v2, made with torchvision at test time
(and for the CIFAR-10 ResNets, cifar_resnet20..1202, defined here: torchvision has none).

Three uses (run with Debian's /usr/bin/python3; the C++ tests in tests/zoo call it):

1. One training or evaluation step:
     make_golden_vision.py --model resnet18 --mode train --batch 2 --size 32 --out x.safetensors
   builds the torchvision model (torch.manual_seed(--seed)), gives every batch norm random
   weights, biases and running statistics (so eval mode and every formula term matter), draws a
   random input and labels, runs forward, cross-entropy and backward, and writes:
     state.<name>   the state dict before the step (parameters and buffers, f32 / i64)
     input, labels  (N, C, H, W) f32 and (N) i64
     logits, loss   the outputs
     grad.<name>    the gradient of every parameter
     after.<name>   (train mode) every buffer after the step: running statistics, counters
   The step is computed in --compute-dtype (float64 by default: a reference with no rounding
   noise of its own); weights and input are f32 values either way.

2. --check-tessel-weights PATH: reads a file Tessel wrote (golden_io.read_safetensors: JSON
   header + torch.frombuffer) holding a state dict and `input`, loads the state dict strictly
   into the torchvision model, runs the input in eval mode and writes `logits` to --out (and
   prints a summary).

3. --list-parameters: writes one line per state-dict entry of each model in --model (a comma
   list): `<model> <parameter|buffer> <name> <d0,d1,...>` (`-` for a scalar).

Model options for every use: --num-classes, --in-channels, --small-image-stem (ResNet: conv1 3x3
stride 1 and no max pool; ShuffleNet: conv1 stride 1 and no max pool). Names never change.
"""
import argparse
import copy
import os
import sys
import types

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_io import read_safetensors, write_safetensors  # noqa: E402

RESNETS = ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152"]
SHUFFLENETS = ["shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "shufflenet_v2_x1_5", "shufflenet_v2_x2_0"]
# He et al.'s CIFAR-10 ResNets (depth 6n + 2): name -> n. torchvision has none; defined below.
CIFAR_RESNETS = {"cifar_resnet20": 3, "cifar_resnet32": 5, "cifar_resnet44": 7,
                 "cifar_resnet56": 9, "cifar_resnet110": 18, "cifar_resnet1202": 200}


class CifarBasicBlock(nn.Module):
    """Two 3x3 conv + batch norm; shortcut: identity, or option A (every other pixel, the added
    channels zero, half on each side)."""

    def __init__(self, in_planes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.stride, self.added = stride, planes - in_planes

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x[:, :, ::self.stride, ::self.stride]
        if self.added:
            half = self.added // 2
            shortcut = F.pad(shortcut, (0, 0, 0, 0, half, half))
        return F.relu(out + shortcut)


class CifarResNet(nn.Module):
    def __init__(self, blocks, num_classes, in_channels):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        planes_in = 16
        for index, (planes, stride) in enumerate([(16, 1), (32, 2), (64, 2)]):
            stage = []
            for block in range(blocks):
                stage.append(CifarBasicBlock(planes_in, planes, stride if block == 0 else 1))
                planes_in = planes
            setattr(self, f"layer{index + 1}", nn.Sequential(*stage))
        self.linear = nn.Linear(64, num_classes)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        return self.linear(out.mean(dim=(2, 3)))


def build_model(name, num_classes, in_channels, small_image_stem):
    """The torchvision model, with the stem adapted the way Tessel's options adapt it."""
    if name in CIFAR_RESNETS:
        return CifarResNet(CIFAR_RESNETS[name], num_classes, in_channels)
    if name not in RESNETS + SHUFFLENETS:
        known = RESNETS + SHUFFLENETS + list(CIFAR_RESNETS)
        raise SystemExit(f"unknown model {name!r} (known: {', '.join(known)})")
    model = getattr(torchvision.models, name)(num_classes=num_classes)
    if name in RESNETS:
        if small_image_stem or in_channels != 3:
            kernel, stride, padding = (3, 1, 1) if small_image_stem else (7, 2, 3)
            # Assigning an existing attribute keeps its place in the module order.
            model.conv1 = nn.Conv2d(in_channels, 64, kernel, stride, padding, bias=False)
            nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
        if small_image_stem:
            model.maxpool = nn.Identity()
    else:
        if small_image_stem or in_channels != 3:
            out_channels = model.conv1[0].out_channels
            model.conv1[0] = nn.Conv2d(in_channels, out_channels, 3, 1 if small_image_stem else 2,
                                       1, bias=False)
        if small_image_stem:
            model.maxpool = nn.Identity()
    return model


def randomize_batch_norms(model):
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.1)
                module.running_mean.normal_(0.0, 0.1)
                module.running_var.uniform_(0.5, 1.5)
                module.num_batches_tracked.fill_(3)


def depthwise_as_shifted_sums(model):
    """Evaluates depthwise convolutions as a sum of kh * kw shifted, scaled slices.

    PyTorch's CPU depthwise convolution has no fast f64 kernel (about 0.5 s per call here); this
    is the same sum in another order, and autograd differentiates it as usual.
    """
    def forward(conv, x):
        kernel_h, kernel_w = conv.kernel_size
        (stride_h, stride_w), (pad_h, pad_w) = conv.stride, conv.padding
        x = F.pad(x, (pad_w, pad_w, pad_h, pad_h))
        out_h = (x.shape[2] - kernel_h) // stride_h + 1
        out_w = (x.shape[3] - kernel_w) // stride_w + 1
        out = 0
        for i in range(kernel_h):
            for j in range(kernel_w):
                window = x[:, :, i : i + stride_h * (out_h - 1) + 1 : stride_h,
                           j : j + stride_w * (out_w - 1) + 1 : stride_w]
                out = out + window * conv.weight[:, 0, i, j].view(1, -1, 1, 1)
        return out if conv.bias is None else out + conv.bias.view(1, -1, 1, 1)

    for module in model.modules():
        depthwise = (isinstance(module, nn.Conv2d) and module.groups > 1
                     and module.groups == module.in_channels == module.out_channels
                     and module.dilation == (1, 1))
        if depthwise:
            module.forward = types.MethodType(forward, module)
    return model


def model_from_args(args, name=None):
    return build_model(name or args.model, args.num_classes, args.in_channels,
                       args.small_image_stem)


def make_step(args):
    torch.manual_seed(args.seed)
    model = model_from_args(args)
    randomize_batch_norms(model)
    images = torch.randn(args.batch, args.in_channels, args.size, args.size)
    labels = torch.randint(0, args.num_classes, (args.batch,))

    # The step below runs on a copy, so these tensors keep their values.
    out = {f"state.{name}": tensor for name, tensor in model.state_dict().items()}
    out["input"] = images
    out["labels"] = labels

    dtype = getattr(torch, args.compute_dtype)
    model = copy.deepcopy(model).to(dtype)
    if dtype == torch.float64:
        depthwise_as_shifted_sums(model)
    model.train(args.mode == "train")
    logits = model(images.to(dtype))
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    out["logits"] = logits.detach()
    out["loss"] = loss.detach()
    for name, parameter in model.named_parameters():
        out[f"grad.{name}"] = parameter.grad
    if args.mode == "train":
        for name, buffer in model.named_buffers():
            out[f"after.{name}"] = buffer.clone()
    metadata = {"model": args.model, "mode": args.mode, "batch": args.batch, "size": args.size,
                "num_classes": args.num_classes, "in_channels": args.in_channels,
                "small_image_stem": int(args.small_image_stem), "seed": args.seed,
                "compute_dtype": args.compute_dtype}
    write_safetensors(args.out, out, metadata)
    print(f"{args.model} {args.mode}: loss {loss.item():.6f}, "
          f"max |logit| {logits.abs().max().item():.4f}, wrote {args.out}")


def check_tessel_weights(args):
    tensors = read_safetensors(args.check_tessel_weights)
    if "input" not in tensors:
        raise SystemExit(f"{args.check_tessel_weights}: no tensor named 'input'")
    images = tensors.pop("input")
    model = model_from_args(args)
    model.load_state_dict(tensors, strict=True)
    dtype = getattr(torch, args.compute_dtype)
    model = model.to(dtype).eval()
    if dtype == torch.float64:
        depthwise_as_shifted_sums(model)
    with torch.no_grad():
        logits = model(images.to(dtype))
    write_safetensors(args.out, {"logits": logits}, {"model": args.model})
    print(f"{args.model}: loaded {len(tensors)} tensors, logits {tuple(logits.shape)}, "
          f"max |logit| {logits.abs().max().item():.4f}, wrote {args.out}")


def list_parameters(args):
    # Only names and shapes are needed: skip drawing ResNet-152's 60 million initial values.
    for initializer in ("kaiming_normal_", "kaiming_uniform_", "uniform_", "normal_", "constant_"):
        setattr(nn.init, initializer, lambda tensor, *args, **kwargs: tensor)
    lines = []
    for name in args.model.split(","):
        model = model_from_args(args, name)
        parameter_names = {key for key, _ in model.named_parameters()}
        for key, tensor in model.state_dict().items():
            kind = "parameter" if key in parameter_names else "buffer"
            shape = ",".join(str(extent) for extent in tensor.shape) or "-"
            lines.append(f"{name} {kind} {key} {shape}\n")
    with open(args.out, "w") as listing:
        listing.writelines(lines)
    print(f"wrote {len(lines)} entries to {args.out}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--mode", choices=["train", "eval"], default="train")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--num-classes", type=int, default=10)
    parser.add_argument("--in-channels", type=int, default=3)
    parser.add_argument("--small-image-stem", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compute-dtype", choices=["float32", "float64"], default="float64")
    parser.add_argument("--check-tessel-weights", metavar="PATH")
    parser.add_argument("--list-parameters", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.check_tessel_weights:
        check_tessel_weights(args)
    elif args.list_parameters:
        list_parameters(args)
    else:
        make_step(args)


if __name__ == "__main__":
    main()
