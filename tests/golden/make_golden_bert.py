#!/usr/bin/python3
"""Reference values for models/bert: a small BERT in plain PyTorch with HuggingFace's math.

Post-LN encoder, erf GELU, (1 - mask) * -10000 attention bias, position ids 0..T-1, the MLM
decoder tied to the word embeddings, module and parameter names of BertForPreTraining
(bert.embeddings.word_embeddings.weight, ..., cls.predictions.bias, cls.seq_relationship.weight).
Dropout is off: --mode eval runs model.eval() with p = 0.1, --mode train runs model.train() with
p = 0 (the same numbers, as both Tessel modes are checked against them). The weights are drawn in
f32; every value and gradient is computed from them in f64 and stored rounded to f32.

Golden mode (default) writes to --out:
  param.<name>, grad.<name>     every parameter (named_parameters order in the metadata
                                "parameter_names", comma-separated) and its gradient of `loss`
  input_ids, token_type_ids, attention_mask (N, T) i64; some rows padded (mask 0, id 0)
  mlm_labels (N, T) i64 (-100 where not masked), nsp_labels (N) i64
  sequence_output, pooled_output, mlm_logits, nsp_logits, mlm_loss, nsp_loss, loss
  tied.grad_from_embedding, tied.grad_from_decoder   the word table's gradient split by use
  (the same model run with the decoder untied); their sum is grad of the tied table.

Check mode (--check-tessel-weights WEIGHTS --inputs INPUTS) loads a state dict and inputs that
Tessel wrote (read by golden_io's own reader), and writes mlm_logits and nsp_logits to --out.

    /usr/bin/python3 tests/golden/make_golden_bert.py --config tiny --vocab 1000 --batch 3 \\
        --seq 16 --out /tmp/bert_tiny.safetensors
"""
import argparse
import copy
import math
import os
import sys

import torch
from torch import nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_io import read_safetensors, write_safetensors  # noqa: E402

# layers, hidden, heads, intermediate (models/bert.cc has the same presets).
CONFIGS = {
    "tiny": (2, 128, 2, 512),
    "mini": (4, 256, 4, 1024),
    "small": (4, 512, 8, 2048),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}
MASK_BIAS = -10000.0
IGNORE_INDEX = -100


class Config:
    def __init__(self, name, vocab_size, dropout):
        layers, hidden, heads, intermediate = CONFIGS[name]
        self.vocab_size = vocab_size
        self.hidden_size = hidden
        self.num_hidden_layers = layers
        self.num_attention_heads = heads
        self.intermediate_size = intermediate
        self.hidden_dropout_prob = dropout
        self.attention_probs_dropout_prob = dropout
        self.max_position_embeddings = 512
        self.type_vocab_size = 2
        self.layer_norm_eps = 1e-12
        self.initializer_range = 0.02


class BertEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, input_ids, token_type_ids):
        seq_len = input_ids.shape[1]
        position_ids = torch.arange(seq_len, dtype=torch.long).unsqueeze(0)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        embeddings = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        embeddings = embeddings + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(embeddings))


class BertSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads = c.num_attention_heads
        self.head_size = c.hidden_size // c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)
        self.dropout = nn.Dropout(c.attention_probs_dropout_prob)

    def split_heads(self, x):  # (N, T, hidden) -> (N, heads, T, d)
        n, t, _ = x.shape
        return x.view(n, t, self.heads, self.head_size).permute(0, 2, 1, 3)

    def forward(self, hidden, attention_bias):
        q = self.split_heads(self.query(hidden))
        k = self.split_heads(self.key(hidden))
        v = self.split_heads(self.value(hidden))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size)
        if attention_bias is not None:
            scores = scores + attention_bias
        probs = self.dropout(F.softmax(scores, dim=-1))
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return context.view(hidden.shape)


class BertSelfOutput(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, hidden, residual):
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class BertAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self = BertSelfAttention(c)
        self.output = BertSelfOutput(c)

    def forward(self, hidden, attention_bias):
        return self.output(self.self(hidden, attention_bias), hidden)


class BertIntermediate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)

    def forward(self, hidden):
        return F.gelu(self.dense(hidden))


class BertOutput(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.intermediate_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, hidden, residual):
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class BertLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = BertAttention(c)
        self.intermediate = BertIntermediate(c)
        self.output = BertOutput(c)

    def forward(self, hidden, attention_bias):
        attention_output = self.attention(hidden, attention_bias)
        return self.output(self.intermediate(attention_output), attention_output)


class BertEncoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(c) for _ in range(c.num_hidden_layers)])

    def forward(self, hidden, attention_bias):
        for layer in self.layer:
            hidden = layer(hidden, attention_bias)
        return hidden


class BertPooler(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, hidden):
        return torch.tanh(self.dense(hidden[:, 0]))


class BertModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embeddings = BertEmbeddings(c)
        self.encoder = BertEncoder(c)
        self.pooler = BertPooler(c)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        attention_bias = None
        if attention_mask is not None:
            mask = attention_mask[:, None, None, :].to(self.pooler.dense.weight.dtype)
            attention_bias = (1.0 - mask) * MASK_BIAS
        hidden = self.encoder(self.embeddings(input_ids, token_type_ids), attention_bias)
        return hidden, self.pooler(hidden)


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, hidden):
        return self.LayerNorm(F.gelu(self.dense(hidden)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transform = BertPredictionHeadTransform(c)
        self.decoder = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(c.vocab_size))
        self.decoder.bias = self.bias

    def forward(self, hidden):
        return self.decoder(self.transform(hidden))


class BertPreTrainingHeads(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.predictions = BertLMPredictionHead(c)
        self.seq_relationship = nn.Linear(c.hidden_size, 2)

    def forward(self, sequence_output, pooled_output):
        return self.predictions(sequence_output), self.seq_relationship(pooled_output)


class BertForPreTraining(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.bert = BertModel(c)
        self.cls = BertPreTrainingHeads(c)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        sequence_output, pooled_output = self.bert(input_ids, token_type_ids, attention_mask)
        mlm_logits, nsp_logits = self.cls(sequence_output, pooled_output)
        return sequence_output, pooled_output, mlm_logits, nsp_logits


def pretraining_loss(mlm_logits, nsp_logits, mlm_labels, nsp_labels):
    vocab = mlm_logits.shape[-1]
    mlm = F.cross_entropy(mlm_logits.reshape(-1, vocab), mlm_labels.reshape(-1),
                          ignore_index=IGNORE_INDEX)
    nsp = F.cross_entropy(nsp_logits, nsp_labels)
    return mlm + nsp, mlm, nsp


def randomize(model, c):
    """BERT's initialisation, then non-default LayerNorm and bias values so every term counts."""
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if "LayerNorm.weight" in name:
                tensor.copy_(1.0 + 0.1 * torch.randn_like(tensor))
            elif name.endswith("bias"):
                tensor.copy_(0.02 * torch.randn_like(tensor))
            else:
                tensor.normal_(0.0, c.initializer_range)


def make_inputs(c, batch, seq_len):
    """Random ids and segments; rows after the first padded to a random length."""
    input_ids = torch.randint(1, c.vocab_size, (batch, seq_len))
    token_type_ids = torch.zeros(batch, seq_len, dtype=torch.long)
    attention_mask = torch.ones(batch, seq_len, dtype=torch.long)
    mlm_labels = torch.full((batch, seq_len), IGNORE_INDEX, dtype=torch.long)
    for row in range(batch):
        length = seq_len if row == 0 else int(torch.randint(seq_len // 2, seq_len, ()))
        split = int(torch.randint(1, length, ()))
        token_type_ids[row, split:length] = 1
        attention_mask[row, length:] = 0
        input_ids[row, length:] = 0
        masked = torch.rand(length) < 0.2
        masked[int(torch.randint(1, length, ()))] = True  # at least one per row
        positions = masked.nonzero().flatten()
        mlm_labels[row, positions] = torch.randint(1, c.vocab_size, (len(positions),))
    nsp_labels = torch.randint(0, 2, (batch,))
    return input_ids, token_type_ids, attention_mask, mlm_labels, nsp_labels


def set_mode(model, mode):
    if mode == "train":
        model.train()
    else:
        model.eval()


def run_golden(args):
    torch.manual_seed(args.seed)
    dropout = 0.0 if args.mode == "train" else 0.1
    c = Config(args.config, args.vocab, dropout)
    model = BertForPreTraining(c)
    randomize(model, c)
    set_mode(model, args.mode)
    input_ids, token_type_ids, attention_mask, mlm_labels, nsp_labels = make_inputs(
        c, args.batch, args.seq)
    # The f32 weights Tessel loads; the values are computed from them in f64 and stored in f32,
    # so the reference is the exactly rounded answer, not one f32 summation order.
    f32_parameters = {name: p.detach().clone() for name, p in model.named_parameters()}
    model.double()

    sequence_output, pooled_output, mlm_logits, nsp_logits = model(
        input_ids, token_type_ids, attention_mask)
    loss, mlm_loss, nsp_loss = pretraining_loss(mlm_logits, nsp_logits, mlm_labels, nsp_labels)
    loss.backward()

    # The same model with the decoder untied: the word table's gradient from each use.
    untied = copy.deepcopy(model)
    table = untied.bert.embeddings.word_embeddings.weight
    untied.cls.predictions.decoder.weight = nn.Parameter(table.detach().clone())
    untied.zero_grad(set_to_none=True)
    outputs = untied(input_ids, token_type_ids, attention_mask)
    pretraining_loss(outputs[2], outputs[3], mlm_labels, nsp_labels)[0].backward()

    tensors = {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "attention_mask": attention_mask,
        "mlm_labels": mlm_labels,
        "nsp_labels": nsp_labels,
        "sequence_output": sequence_output,
        "pooled_output": pooled_output,
        "mlm_logits": mlm_logits,
        "nsp_logits": nsp_logits,
        "loss": loss,
        "mlm_loss": mlm_loss,
        "nsp_loss": nsp_loss,
        "tied.grad_from_embedding": table.grad,
        "tied.grad_from_decoder": untied.cls.predictions.decoder.weight.grad,
    }
    names = []
    for name, parameter in model.named_parameters():
        names.append(name)
        tensors["param." + name] = f32_parameters[name]
        tensors["grad." + name] = parameter.grad
    tensors = {k: v.float() if v.dtype == torch.float64 else v for k, v in tensors.items()}
    metadata = {
        "generator": "tests/golden/make_golden_bert.py",
        "precision": "f64, stored as f32",
        "config": args.config,
        "vocab_size": args.vocab,
        "mode": args.mode,
        "parameter_names": ",".join(names),
    }
    write_safetensors(args.out, {k: v.detach() for k, v in tensors.items()}, metadata)


def run_check(args):
    c = Config(args.config, args.vocab, 0.1)
    model = BertForPreTraining(c)
    model.eval()
    state = read_safetensors(args.check_tessel_weights)
    result = model.load_state_dict(state, strict=False)
    # The tied decoder's entries are aliases of parameters the file holds under their own names.
    tied = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    problems = [k for k in result.missing_keys if k not in tied] + list(result.unexpected_keys)
    if problems:
        sys.exit(f"make_golden_bert: {args.check_tessel_weights} does not match the model: "
                 f"missing {sorted(set(result.missing_keys) - tied)}, "
                 f"unexpected {sorted(result.unexpected_keys)}")
    inputs = read_safetensors(args.inputs)
    with torch.no_grad():
        _, _, mlm_logits, nsp_logits = model(
            inputs["input_ids"], inputs.get("token_type_ids"), inputs.get("attention_mask"))
    write_safetensors(args.out, {"mlm_logits": mlm_logits, "nsp_logits": nsp_logits})


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--batch", type=int, default=3)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--mode", choices=["train", "eval"], default="eval")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--check-tessel-weights", metavar="WEIGHTS",
                        help="a state dict Tessel saved; writes the logits it gives")
    parser.add_argument("--inputs", help="with --check-tessel-weights: input_ids, "
                        "token_type_ids, attention_mask saved by Tessel")
    args = parser.parse_args()
    if args.seq < 2 or args.seq > 512:
        parser.error("--seq must be between 2 and 512")
    if args.check_tessel_weights:
        if not args.inputs:
            parser.error("--check-tessel-weights needs --inputs")
        run_check(args)
    else:
        run_golden(args)


if __name__ == "__main__":
    main()
