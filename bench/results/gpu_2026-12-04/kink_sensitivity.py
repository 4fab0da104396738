# How much ResNet-18's first-step gradients move when the input moves by 1e-7 or 1e-6 of itself, in
# f64 (torchvision, small-image stem, batch 352 of 16x16, fresh weights): the largest change of
# any parameter's gradient relative to its largest entry, and the median over parameters.
# Run: OMP_NUM_THREADS=2 /usr/bin/python3 kink_sensitivity.py
import torch, torchvision, torch.nn as nn
torch.manual_seed(0)
m = torchvision.models.resnet18(num_classes=10)
m.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False); m.maxpool = nn.Identity()
m = m.double().train()
x = torch.randn(352, 3, 16, 16, dtype=torch.float64); y = torch.randint(0, 10, (352,))
def grads(inp):
    m.zero_grad(); nn.functional.cross_entropy(m(inp), y).backward()
    return {n: p.grad.clone() for n, p in m.named_parameters()}
g0 = grads(x)
for eps in (1e-7, 1e-6):
    g1 = grads(x * (1 + eps * torch.randn_like(x)))
    r = sorted(((g1[n]-g0[n]).abs().max().item()/g0[n].abs().max().item(), n) for n in g0)
    print(eps, "worst %.2e %s" % r[-1], "median %.2e" % r[len(r)//2][0])
