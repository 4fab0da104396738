#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets: fuzz/corpus/<target>/seed_*.

Usage: fuzz/make_corpus.py            (from anywhere; rewrites every seed_* file)

Seeds are small valid inputs of each format plus a few near misses (truncated, off by one), so
that the fuzzers and the replay tests start deep in the parsers. Files of crashes the fuzzers
found (regression_*) live next to them and are never touched here. Standard library only, and
deterministic: gzip without a timestamp, no randomness.
"""
import gzip
import json
import os
import struct

FUZZ = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(FUZZ)


def write_seeds(target, seeds):
    folder = os.path.join(FUZZ, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):
        if name.startswith("seed_"):
            os.remove(os.path.join(folder, name))
    for name, data in seeds.items():
        if isinstance(data, str):
            data = data.encode("utf-8")
        with open(os.path.join(folder, "seed_" + name), "wb") as out:
            out.write(data)


# ---- safetensors ----

DTYPE_FORMATS = {"F32": "<f", "F64": "<d", "I32": "<i", "I64": "<q", "U8": "<B", "BOOL": "<B"}
DTYPE_SIZES = {"F32": 4, "F64": 8, "BF16": 2, "F16": 2, "I32": 4, "I64": 8, "U8": 1, "BOOL": 1}


def tensor_bytes(dtype, values):
    if dtype in ("BF16", "F16"):
        # bf16: the top half of the f32; f16: struct's half-precision format.
        if dtype == "F16":
            return b"".join(struct.pack("<e", v) for v in values)
        return b"".join(struct.pack("<f", v)[2:] for v in values)
    return b"".join(struct.pack(DTYPE_FORMATS[dtype], v) for v in values)


def safetensors(tensors, metadata=None, odd_header=False):
    """tensors: [(name, dtype, shape, values)] in file order."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    data = b""
    for name, dtype, shape, values in tensors:
        raw = tensor_bytes(dtype, values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    if odd_header:
        text += b" "
    return struct.pack("<Q", len(text)) + text + data


def small_net_state():
    """SmallNet's state dict (fuzz/small_net.h): Linear(3, 4) and BatchNorm2d(4)."""
    return [
        ("fc.weight", "F32", [4, 3], [0.1 * i for i in range(12)]),
        ("fc.bias", "F32", [4], [0.5, -0.5, 1.0, 0.0]),
        ("bn.weight", "F32", [4], [1.0] * 4),
        ("bn.bias", "F32", [4], [0.0] * 4),
        ("bn.running_mean", "F32", [4], [0.0] * 4),
        ("bn.running_var", "F32", [4], [1.0] * 4),
        ("bn.num_batches_tracked", "I64", [], [3]),
    ]


def safetensors_seeds():
    every_dtype = [("t_" + dtype.lower(), dtype, [2, 2], [0, 1, 1, 0]) for dtype in DTYPE_SIZES]
    valid = safetensors(small_net_state(), {"format": "pt"})
    return {
        "small_net": valid,
        "every_dtype": safetensors(every_dtype, {"note": "one of each"}),
        "scalar_and_empty": safetensors([("s", "F64", [], [2.5]), ("e", "F32", [0, 3], [])]),
        "only_metadata": safetensors([], {"a": "1", "b": ""}),
        "truncated": valid[: len(valid) - 5],
        "short": b"\x08\x00\x00",
        "header_past_end": struct.pack("<Q", 1 << 20) + b"{}",
        "bad_bool": safetensors([("b", "U8", [2], [0, 2])]).replace(b'"U8"', b'"BOOL"'),
        "overlap": struct.pack("<Q", 96) + json.dumps(
            {"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
             "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}},
            separators=(",", ":")).encode().ljust(96) + b"abc",
    }


# ---- checkpoint training state (Adam + StepLR on SmallNet) ----

ADAM_PARAMETERS = [("fc.weight", [4, 3]), ("fc.bias", [4]), ("bn.weight", [4]), ("bn.bias", [4])]


def numel(shape):
    count = 1
    for size in shape:
        count *= size
    return count


def train_state(ranks=None, odd_header=False, scheduler=True):
    tensors = []
    for name, shape in ADAM_PARAMETERS:
        for key in ("exp_avg", "exp_avg_sq"):
            tensors.append(("optimizer.%s.%s" % (name, key), "F32", shape, [0.01] * numel(shape)))
    metadata = {"format": "tessel-checkpoint-1", "save_id": "fuzz", "step": "7",
                "rng.seed": "42", "rng.offset": "1000", "optimizer": "Adam",
                "optimizer.lr": "0.01", "extra.epoch": "2", "extra.best_accuracy": "0.75"}
    for name, _ in ADAM_PARAMETERS:
        metadata["optimizer.%s.step" % name] = "7"
    if scheduler:
        metadata.update({"scheduler": "StepLR", "scheduler.step_count": "7",
                         "scheduler.base_lr": "0.01"})
    if ranks:
        metadata.update({"rng.ranks": str(ranks), "rng.layout": "dp=2,tp=1"})
        for rank in range(ranks):
            metadata["rng.rank.%d.seed" % rank] = "42"
            metadata["rng.rank.%d.offset" % rank] = str(1000 + rank)
    return safetensors(tensors, metadata, odd_header=odd_header)


def checkpoint_seeds():
    # Inputs of odd length load as rank 1 of 2 (checkpoint_fuzzer.cc).
    return {
        "adam_steplr": train_state(),
        "two_ranks_as_rank_1": train_state(ranks=2, odd_header=True),
        "two_ranks_as_rank_0": train_state(ranks=2),
        "no_scheduler": train_state(scheduler=False),
        "wrong_save_id": train_state().replace(b'"fuzz"', b'"fuzy"'),
    }


# ---- IDX ----

def idx(magic, dims, values):
    return struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + bytes(values)


def gz(data):
    return gzip.compress(data, mtime=0)


def idx_seeds():
    images = idx(0x803, [2, 3, 3], range(18))
    labels = idx(0x801, [5], [0, 1, 2, 9, 4])
    return {
        "images": images,
        "labels": labels,
        "images.gz": gz(images),
        "labels.gz": gz(labels),
        "empty_images": idx(0x803, [0, 28, 28], []),
        "truncated_images": images[:-4],
        "trailing_labels": labels + b"\x00",
        "header_only": idx(0x801, [], []),
    }


# ---- CIFAR-10 binary ----

def cifar_record(label, seed):
    return bytes([label]) + bytes((seed * 7 + i) % 256 for i in range(3072))


def cifar_seeds():
    two = cifar_record(3, 1) + cifar_record(9, 2)
    return {
        "two_records": two,
        "one_record": cifar_record(0, 5),
        "label_10": cifar_record(10, 3),
        "truncated": two[:-100],
    }


# ---- vocab.txt and text ----

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "a", "un", "##aff", "##able", "run", "##ing", "hello", "world", "!", ",", "é",
         "##é", "中", "##s"]


def vocab_seeds():
    vocab = "\n".join(SPECIALS + ["[unused0]"] + WORDS) + "\n"
    return {
        "bert_like": vocab,
        "crlf": vocab.replace("\n", "\r\n"),
        "blank_lines": "\n".join(SPECIALS + ["", "word", "", "##piece"]),
        "duplicate": "\n".join(SPECIALS + ["x", "x"]),
        "missing_mask": "\n".join(SPECIALS[:4] + ["word"]),
        "invalid_utf8": ("\n".join(SPECIALS) + "\n").encode() + b"\xff\xfe\n\xc3\n##\xe2\x82\n",
    }


def wordpiece_seeds():
    return {
        "english": "Hello, world! The unaffable runner runs.",
        "accents": "Héllo Ünïcödé café ÀÉÎÕÜ ß ẞ Ǆ Ωμέγα Ёлка",
        "cjk": "中文字符 日本語の文 한국어 が",
        "controls": "tab\there\x00nul\x7fdel\u200bzero\u2028line\ufeffbom",
        "hashes": "## #a a## ##aff ##able [MASK] [UNK]",
        "long_word": "x" * 201 + " " + "y" * 200,
        "invalid_utf8": b"ok \xff \xc3\x28 \xe2\x82 \xf0\x9f\x98 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf end",
        "emoji": "smile 😀 ﬁne ﬂow",
    }


def corpus_seeds():
    return {
        "fortunes": "A fortune.\n\t-- Someone\n%\nAnother one,\non two lines.\n%\n%\nLast.\n",
        "paragraphs": "First paragraph\nline two.\n\nSecond paragraph.\n   \nThird.\n",
        "lines": "one document\ntwo document\r\nthree\n",
        "backspaces": "bold: b\bbo\bol\bld\b\nunder_\bline\n%\n\xc3\xa9\b gone\n".encode(
            "latin-1"),
        "crlf_fortunes": "a\r\n%\r\nb\r\n%\r\n",
        "blank": "\n\n   \n\t\n",
    }


# ---- planner JSON ----

def plan(**changes):
    value = {
        "format": "tessel-plan", "version": 1, "model": "bert_tiny", "devices": 4, "batch": 32,
        "seq": 128, "image_size": 0, "profile": "h200_cluster",
        "profile_layout": "layout not recorded", "memory_per_device": 1.5e10,
        "mesh": {"dp": 2, "tp": 2}, "memory_policy": "auto", "memory_budget": 1.2e10,
        "remat_fraction": 0.5, "predicted": {"memory_bytes": 1.1e10, "time_s": 0.25},
        "summary": "dp=2 tp=2",
        "parameters": [
            {"name": "bert.embeddings.word_embeddings.weight", "shape": [1000, 64],
             "split_dim": 0, "parts": 2},
            {"name": "cls.predictions.bias", "shape": [1000], "split_dim": -1, "parts": 1},
        ],
        "ops": [
            {"index": 0, "op": "embedding", "strategy": "vocab", "dp": 2, "tp": 2,
             "parameters": ["bert.embeddings.word_embeddings.weight"]},
            {"index": 1, "op": "linear", "strategy": "replicate", "dp": 4, "tp": 1,
             "parameters": []},
        ],
    }
    value.update(changes)
    return json.dumps(value, indent=1) + "\n"


def plan_seeds():
    return {
        "bert": plan(),
        "vision": plan(model="resnet18", seq=0, image_size=28, memory_policy="none",
                       remat_fraction=1.0, mesh={"dp": 4, "tp": 1}),
        "bad_parts": plan(parameters=[{"name": "w", "shape": [3], "split_dim": 0, "parts": 2}]),
        "big_mesh": plan(mesh={"dp": 4, "tp": 2}),
        "not_json": "[1, 2",
    }


def profile_seeds():
    seeds = {}
    for name in ("h200_cluster", "cpu_2core_example"):
        with open(os.path.join(ROOT, "parallel", "profiles", name + ".json"), "rb") as source:
            seeds[name] = source.read()
    profile = json.loads(seeds["h200_cluster"])
    profile["memory_per_device"] = "141 GiB"
    seeds["memory_as_text"] = json.dumps(profile)
    profile["op_kinds"] = {"gemm": {"per": "flops", "forward": 1e14, "backward": 5e13,
                                    "forward_call_s": 1e-5}}
    seeds["op_kinds"] = json.dumps(profile)
    return seeds


def memory_budget_seeds():
    return {
        "units": "1.5GiB\n512MiB\n2GB\n4096\n4096B\n1 kib\n3TB\n0.5 TiB\n",
        "fractions": "0.4\n1\n1.0\n0.001\n.5\n5e-1\n",
        "rejected": "0\n-1GiB\n1.5\n12 parsecs\n\nGiB\n1e400\n511\n",
        "policies": "none\ndtr\nswap\nsplit\nauto\nDTR\n",
    }


def train_flags_seeds():
    return {
        "mlp": "--recipe=mlp_fashion_mnist\n--lr=0.1\n--batch_size=32\n--epochs=2\n--steps=10",
        "budget": "--memory_budget=1.5GiB\n--memory_policy=dtr\n--threads=1\n--seed=7",
        "spaced": "--memory_budget\n0.4\n--precision\nbf16\n--device\ncpu",
        "resume": "--checkpoint_dir=/nonexistent\n--resume\n--checkpoint_every=5\n--log_every=1",
        "parallel": "--dp=2\n--tp=1\n--eval_every=3\n--work_dir=/tmp/x\n--metrics=m.jsonl",
        "bad": "--lr=-1\n--batch_size=1e3\n--device=cuda:x\n--precision=f64\n--unknown",
        "help": "--help",
    }


def main():
    write_seeds("safetensors", safetensors_seeds())
    write_seeds("checkpoint", checkpoint_seeds())
    write_seeds("idx", idx_seeds())
    write_seeds("cifar", cifar_seeds())
    write_seeds("vocab", vocab_seeds())
    write_seeds("wordpiece", wordpiece_seeds())
    write_seeds("corpus", corpus_seeds())
    write_seeds("plan", plan_seeds())
    write_seeds("profile", profile_seeds())
    write_seeds("memory_budget", memory_budget_seeds())
    write_seeds("train_flags", train_flags_seeds())


if __name__ == "__main__":
    main()
