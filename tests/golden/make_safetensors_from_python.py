#!/usr/bin/python3
"""Writes tests/golden/safetensors_from_python.safetensors with PyTorch tensors and a writer
that follows the safetensors reference layout by hand (8-byte little-endian header length,
JSON header padded with spaces, raw little-endian row-major bytes). safetensors_test.cc reads
it back and checks the values listed here.

Run: /usr/bin/python3 tests/golden/make_safetensors_from_python.py
"""
import json
import os
import struct

import torch


def tensor_bytes(tensor):
    tensor = tensor.contiguous()
    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: write the raw bits
        return tensor.view(torch.int16).numpy().tobytes()
    return tensor.numpy().tobytes()


DTYPE_CODES = {
    torch.float32: "F32", torch.float64: "F64", torch.float16: "F16",
    torch.bfloat16: "BF16", torch.int32: "I32", torch.int64: "I64",
    torch.uint8: "U8", torch.bool: "BOOL",
}


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    data = b""
    for name, tensor in tensors:
        raw = tensor_bytes(tensor)
        header[name] = {"dtype": DTYPE_CODES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)))
        out.write(text)
        out.write(data)


def main():
    tensors = [
        # A transposed (non-contiguous) source: the file holds its row-major values.
        ("weight", (torch.arange(6, dtype=torch.float32) * 0.5 - 1.0).reshape(3, 2).t()),
        ("double", torch.tensor([1.0 / 3.0, -2.5, 1e100], dtype=torch.float64)),
        ("half", torch.tensor([[0.5, -1.0], [2.0, 65504.0]], dtype=torch.float16)),
        ("bfloat", torch.tensor([1.0, -0.15625, 256.0], dtype=torch.bfloat16)),
        ("index", torch.tensor([0, -1, 2**40, 7], dtype=torch.int64)),
        ("int", torch.tensor([-5, 123456], dtype=torch.int32)),
        ("bytes", torch.tensor([0, 128, 255], dtype=torch.uint8)),
        ("mask", torch.tensor([[True, False], [False, True]])),
        ("scalar", torch.tensor(3.25, dtype=torch.float32)),
        ("empty", torch.zeros(0, 4, dtype=torch.float32)),
    ]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "safetensors_from_python.safetensors")
    write_safetensors(path, tensors, {"format": "pt", "source": "torch",
                                      "generator": "tests/golden/make_safetensors_from_python.py"})
    print("wrote", path)


if __name__ == "__main__":
    main()
