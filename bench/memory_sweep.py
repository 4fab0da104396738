#!/usr/bin/python3
"""PyTorch side of bench/memory_bench: the models of bench/memory_sweep.cc trained as they are
and with torch.utils.checkpoint over their stages (PyTorch's manual way to save memory).

One configuration per call, one JSON line on stdout. Two measurements, each in a process of its
own so neither disturbs the other:
  time    warm-up steps, then timed steps (seconds per step: the median)
  memory  the first steps of a fresh process under MALLOC_MMAP_THRESHOLD_=131072 (every large
          tensor is its own mapping, returned to the system when freed, so the resident set
          follows live tensors); the peak is the resident set's high-water mark (VmHWM, reset
          through /proc/self/clear_refs just before the steps) minus the resident set before
          them, plus the parameters and the batch, which were resident already: the same
          "whole peak" (parameters, gradients, momentum, activations, batch) Tessel reports.
    /usr/bin/python3 bench/memory_sweep.py --model resnet50 --batch 8 --checkpoint --threads 2
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(args):
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    if args.model == "bert_mini":
        sys.path.insert(0, os.path.join(ROOT, "tests", "golden"))
        import make_golden_bert as bert_ref  # the BERT that Tessel's BERT is checked against

        config = bert_ref.Config("mini", args.vocab, 0.1)
        model = bert_ref.BertForPreTraining(config)
        if args.checkpoint:
            for layer in model.bert.encoder.layer:
                layer.forward = checkpointed(layer.forward, checkpoint)
        ids = torch.randint(0, config.vocab_size, (args.batch, args.seq))
        types = torch.randint(0, 2, (args.batch, args.seq))
        targets = torch.randint(0, config.vocab_size, (args.batch, args.seq))
        masked = torch.rand(args.batch, args.seq) < 0.15
        mlm_labels = torch.where(masked, targets, torch.full_like(targets, -100))
        nsp_labels = torch.randint(0, 2, (args.batch,))
        batch = [ids, types, mlm_labels, nsp_labels]

        def loss():
            _, _, mlm_logits, nsp_logits = model(ids, types)
            return bert_ref.pretraining_loss(mlm_logits, nsp_logits, mlm_labels, nsp_labels)[0]

    else:
        import torchvision

        if args.model == "resnet50":
            model = torchvision.models.resnet50()
            stages = ["layer1", "layer2", "layer3", "layer4"]
        elif args.model == "shufflenet":
            model = torchvision.models.shufflenet_v2_x1_0()
            stages = ["stage2", "stage3", "stage4", "conv5"]
        else:
            raise SystemExit(f"memory_sweep.py: unknown --model {args.model}")
        if args.checkpoint:
            for name in stages:
                stage = getattr(model, name)
                stage.forward = checkpointed(stage.forward, checkpoint)
        images = torch.randn(args.batch, 3, args.image, args.image)
        labels = torch.randint(0, 1000, (args.batch,))
        batch = [images, labels]

        def loss():
            return F.cross_entropy(model(images), labels)

    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        value = loss()
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        optimizer.step()
        return value.item()

    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    batch_bytes = sum(t.numel() * t.element_size() for t in batch)
    return step, parameter_bytes, batch_bytes


def checkpointed(forward, checkpoint):
    def run(*inputs):
        return checkpoint(forward, *inputs)

    return run


def rss_bytes(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(args):
    import torch

    torch.set_num_threads(args.threads)
    step, parameter_bytes, batch_bytes = build(args)
    result = {"model": args.model, "batch": args.batch, "checkpoint": args.checkpoint,
              "threads": args.threads}
    if args.what == "time":
        for _ in range(args.warmup):
            step()
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        result["step_times_s"] = times
        result["step_s"] = statistics.median(times)
    else:
        before = rss_bytes("VmRSS")
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # VmHWM := VmRSS
        for _ in range(max(2, args.warmup + 1)):
            step()
        delta = rss_bytes("VmHWM") - before
        result["rss_delta_bytes"] = delta
        result["parameter_bytes"] = parameter_bytes
        result["batch_bytes"] = batch_bytes
        result["peak_bytes"] = delta + parameter_bytes + batch_bytes
        result["fixed_bytes"] = 3 * parameter_bytes
    print(json.dumps(result), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet50", help="resnet50, shufflenet, bert_mini")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=8000, help="BERT's vocabulary")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--checkpoint", action="store_true",
                        help="torch.utils.checkpoint over every stage")
    parser.add_argument("--what", choices=["both", "time", "memory"], default="both")
    args = parser.parse_args()
    if args.what != "both":
        measure(args)
        return
    # Each measurement in a fresh process; one merged line.
    merged = {}
    for what in ("time", "memory"):
        env = dict(os.environ)
        if what == "memory":
            env["MALLOC_MMAP_THRESHOLD_"] = "131072"
        command = [sys.executable, os.path.abspath(__file__), "--what", what] + [
            a for a in sys.argv[1:]]
        output = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
        merged.update(json.loads(output.stdout.strip().splitlines()[-1]))
    print(json.dumps(merged), flush=True)


if __name__ == "__main__":
    main()
