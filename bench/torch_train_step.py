#!/usr/bin/python3
"""The PyTorch side of bench/compare_pytorch: one training step of a torchvision network (or BERT).

Builds the same network as bench/train_step_bench.cc (torchvision definitions; BERT written out
below with the module layout of the public checkpoints, as models/bert.cc), a fixed batch of
random data of the same shapes, SGD with momentum 0.9 (AdamW for the user CNN), then serves the same protocol on stdin:
"run N" answers "ms t1 ... tN" (milliseconds per step), "quit" ends. By hand:
  /usr/bin/python3 bench/torch_train_step.py --case resnet18_32 --threads 2
  python3 bench/torch_train_step.py --case bert_base_128 --device cuda --precision bf16
On CUDA: cuDNN autotuning on (cudnn.benchmark), TF32 off as in Tessel, bf16 through
torch.autocast around forward and loss; every step ends with loss.item(), which waits for the GPU.
"""

import argparse
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

LEARNING_RATE = 0.01
MOMENTUM = 0.9
ADAMW_LEARNING_RATE = 1e-3  # the user CNN's AdamW (weight decay 0.01, as in Tessel)


class BertConfig:
    """models::BertConfig's defaults (bert-base sizes), or other sizes: mini() and base() below."""

    def __init__(self, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072):
        self.vocab_size = 30522
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.max_position_embeddings = 512
        self.type_vocab_size = 2
        self.dropout = 0.1
        self.layer_norm_eps = 1e-12

    @staticmethod
    def mini():
        """models::BertConfig::mini(): 4 layers, hidden 256, 4 heads, ffn 1024."""
        return BertConfig(256, 4, 4, 1024)

    @staticmethod
    def base():
        """models::BertConfig::base(): 12 layers, hidden 768, 12 heads, ffn 3072."""
        return BertConfig(768, 12, 12, 3072)


class BertLayer(nn.Module):
    """Post-LN encoder layer, erf GELU; q is scaled before the scores, as in models/bert.cc."""

    def __init__(self, config):
        super().__init__()
        hidden = config.hidden_size
        self.heads = config.num_attention_heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.attention_dense = nn.Linear(hidden, hidden)
        self.attention_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.intermediate_dense = nn.Linear(hidden, config.intermediate_size)
        self.output_dense = nn.Linear(config.intermediate_size, hidden)
        self.output_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.p = config.dropout

    def forward(self, hidden, attention_bias):
        batch, seq_len, width = hidden.shape
        head_size = width // self.heads

        def split_heads(x):
            return x.view(batch, seq_len, self.heads, head_size).permute(0, 2, 1, 3)

        q = split_heads(self.query(hidden)) * (1.0 / math.sqrt(head_size))
        k = split_heads(self.key(hidden))
        v = split_heads(self.value(hidden))
        scores = torch.matmul(q, k.transpose(-1, -2)) + attention_bias
        probs = F.dropout(torch.softmax(scores, -1), self.p, self.training)
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).reshape(batch, seq_len, width)
        attended = self.attention_dense(context)
        attention_output = self.attention_norm(F.dropout(attended, self.p, self.training) + hidden)
        output = self.output_dense(F.gelu(self.intermediate_dense(attention_output)))
        return self.output_norm(F.dropout(output, self.p, self.training) + attention_output)


class BertForPreTraining(nn.Module):
    """Embeddings, encoder, pooler, and the MLM (tied decoder) and NSP heads."""

    def __init__(self, config):
        super().__init__()
        hidden = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, hidden)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, hidden)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, hidden)
        self.embedding_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.pooler_dense = nn.Linear(hidden, hidden)
        self.transform_dense = nn.Linear(hidden, hidden)
        self.transform_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.decoder_bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.seq_relationship = nn.Linear(hidden, 2)
        self.p = config.dropout
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.data.normal_(0.0, 0.02)
            if isinstance(module, nn.Linear):
                module.bias.data.zero_()

    def forward(self, input_ids, token_type_ids, attention_mask):
        batch, seq_len = input_ids.shape
        embeddings = (self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
                      + self.position_embeddings.weight[:seq_len])
        hidden = F.dropout(self.embedding_norm(embeddings), self.p, self.training)
        mask = attention_mask.to(hidden.dtype)
        attention_bias = (mask * -10000.0 + 10000.0).view(batch, 1, 1, seq_len)
        for layer in self.layers:
            hidden = layer(hidden, attention_bias)
        pooled = torch.tanh(self.pooler_dense(hidden[:, 0]))
        transformed = self.transform_norm(F.gelu(self.transform_dense(hidden)))
        mlm_logits = F.linear(transformed, self.word_embeddings.weight, self.decoder_bias)
        return mlm_logits, self.seq_relationship(pooled)


class Options:
    """Where and how a case runs: the device and whether forward and loss autocast to bf16."""

    def __init__(self, device, bf16, evaluate=False):
        self.device = torch.device(device)
        self.bf16 = bf16
        self.eval = evaluate

    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)


def disable_tf32():
    """f32 matmuls and convolutions in full f32, as Tessel runs them unless TF32 is allowed.
    PyTorch 2.9 and later have fp32_precision flags (and warn about the allow_tf32 ones)."""
    conv = getattr(torch.backends.cudnn, "conv", None)
    if hasattr(torch.backends.cuda.matmul, "fp32_precision") and hasattr(conv, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        conv.fp32_precision = "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def user_cnn():
    """train_step_bench's user_cnn: three 3x3 conv-bn-relu blocks (32, 64 stride 2, 64 channels),
    global average pooling, a linear classifier."""
    def block(inputs, outputs, stride):
        return [nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False), nn.BatchNorm2d(outputs),
                nn.ReLU()]
    return nn.Sequential(*block(1, 32, 1), *block(32, 64, 2), *block(64, 64, 1),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def count_parameters(model):
    return sum(p.numel() for p in model.parameters())


def classifier_case(model, batch, size, classes, options, channels=3, adamw=False):
    # Random data made on the CPU (the same draws on every device), then moved.
    images = torch.randn(batch, channels, size, size).to(options.device)
    targets = torch.randint(0, classes, (batch,)).to(options.device)
    model.to(options.device)
    if options.eval:
        model.eval()

        def evaluate():
            """What evaluation does: no autograd, forward, summed loss, the predictions read."""
            with torch.no_grad(), options.autocast():
                logits = model(images)
                loss = F.cross_entropy(logits, targets, reduction="sum")
                logits.argmax(1).tolist()
            return loss.item()

        return batch, count_parameters(model), evaluate
    model.train()
    if adamw:
        optimizer = torch.optim.AdamW(model.parameters(), lr=ADAMW_LEARNING_RATE)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)

    def step():
        with options.autocast():
            loss = F.cross_entropy(model(images), targets)
        optimizer.zero_grad(set_to_none=True)  # Tessel's zero_grad leaves no gradient either
        loss.backward()
        optimizer.step()
        return loss.item()

    return batch, count_parameters(model), step


def bert_case(config, batch, seq_len, options):
    model = BertForPreTraining(config)
    input_ids = torch.randint(0, config.vocab_size, (batch, seq_len))
    token_types = torch.randint(0, 2, (batch, seq_len))
    mask = torch.ones(batch, seq_len, dtype=torch.int64)
    targets = torch.randint(0, config.vocab_size, (batch, seq_len))
    masked = torch.rand(batch, seq_len) < 0.15
    mlm_labels = torch.where(masked, targets, torch.full_like(targets, -100))
    nsp_labels = torch.randint(0, 2, (batch,))
    input_ids, token_types, mask, mlm_labels, nsp_labels = (
        t.to(options.device) for t in (input_ids, token_types, mask, mlm_labels, nsp_labels))
    model.to(options.device)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)

    def step():
        with options.autocast():
            mlm_logits, nsp_logits = model(input_ids, token_types, mask)
            loss = (F.cross_entropy(mlm_logits.reshape(-1, config.vocab_size),
                                    mlm_labels.reshape(-1), ignore_index=-100)
                    + F.cross_entropy(nsp_logits, nsp_labels))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    return batch, count_parameters(model), step


def conv_case(batch, channels, size, options):
    """A 3x3 conv forward (autocast with bf16) and backward; off the CPU the step waits for the
    device by reading one weight-gradient value, as train_step_bench does."""
    output_dtype = torch.bfloat16 if options.bf16 else torch.float32
    x = torch.randn(batch, channels, size, size).to(options.device).requires_grad_()
    w = torch.randn(channels, channels, 3, 3).to(options.device).requires_grad_()
    grad = torch.randn(batch, channels, size, size).to(output_dtype).to(options.device)

    def step():
        x.grad = None
        w.grad = None
        with options.autocast():
            y = F.conv2d(x, w, None, 1, 1)
        y.backward(grad)
        return w.grad.view(-1)[0].item() if options.device.type != "cpu" else 0.0

    return batch, w.numel(), step


def make_case(name, batch, options):
    """`batch` (if not None) replaces the case's own batch size."""
    def batch_or(own):
        return batch if batch is not None else own

    if name == "resnet18_32":
        model = torchvision.models.resnet18(num_classes=10)
        # The small-image stem (models::ResNetOptions::small_image_stem).
        model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
        return classifier_case(model, batch_or(32), 32, 10, options)
    if name == "resnet18_fashion":
        # The Fashion-MNIST recipe's: torchvision's stem on one grey channel, 10 classes.
        model = torchvision.models.resnet18(num_classes=10)
        model.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
        return classifier_case(model, batch_or(128), 28, 10, options, channels=1)
    if name == "user_cnn_fashion":
        return classifier_case(user_cnn(), batch_or(128), 28, 10, options, channels=1,
                               adamw=True)
    if options.eval and not name.startswith(("resnet", "shufflenet")):
        raise SystemExit(f"torch_train_step: --mode eval takes a classifier case, not '{name}'")
    if name == "resnet50_224":
        return classifier_case(torchvision.models.resnet50(), batch_or(8), 224, 1000, options)
    if name == "shufflenet_224":
        return classifier_case(torchvision.models.shufflenet_v2_x1_0(), batch_or(16), 224, 1000,
                               options)
    if name == "bert_mini_128":
        return bert_case(BertConfig.mini(), batch_or(8), 128, options)
    if name == "bert_base_128":
        return bert_case(BertConfig.base(), batch_or(32), 128, options)
    if name.startswith("conv3x3_"):
        _, channels, size = name.split("_")
        return conv_case(batch_or(32), int(channels), int(size), options)
    raise SystemExit(f"torch_train_step: unknown case '{name}'")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--precision", choices=("f32", "bf16"), default="f32")
    parser.add_argument("--batch", type=int, help="replaces the case's batch size")
    parser.add_argument("--mode", choices=("train", "eval"), default="train",
                        help="eval: what evaluation does (classifier cases)")
    args = parser.parse_args()
    if args.batch is not None and args.batch <= 0:
        raise SystemExit(f"torch_train_step: --batch must be positive, got {args.batch}")
    torch.set_num_threads(args.threads)
    options = Options(args.device, args.precision == "bf16", args.mode == "eval")
    if options.device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("torch_train_step: --device cuda, but torch.cuda.is_available() is "
                             f"False (PyTorch {torch.__version__})")
        if options.device.index is not None:
            torch.cuda.set_device(options.device)
        torch.backends.cudnn.benchmark = True
        disable_tf32()
    torch.manual_seed(0)
    batch, parameters, step = make_case(args.case, args.batch, options)
    print(f"ready batch {batch} threads {torch.get_num_threads()} device {options.device} "
          f"precision {args.precision} mode {args.mode} params {parameters}", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if words[0] != "run" or len(words) != 2 or int(words[1]) <= 0:
            print(f"error: expected 'run N' or 'quit', got '{line.strip()}'", flush=True)
            continue
        times = []
        for _ in range(int(words[1])):
            start = time.perf_counter()
            step()
            times.append((time.perf_counter() - start) * 1e3)
        print("ms " + " ".join(f"{t:.3f}" for t in times), flush=True)


if __name__ == "__main__":
    main()
