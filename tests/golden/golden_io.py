"""A small, independent safetensors writer and reader for the golden scripts.

Layout (the safetensors reference): 8-byte little-endian header length N, N bytes of JSON
({"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__":
{"key": "value"}}) padded with spaces, then raw row-major little-endian bytes. It uses only
json, struct and torch (torch.frombuffer), not the safetensors package, so it also checks
Tessel's own writer from the outside.

    from golden_io import write_safetensors, read_safetensors
    write_safetensors("x.safetensors", {"fc.weight": w}, {"model": "resnet18"})
    tensors = read_safetensors("x.safetensors")            # dict name -> torch.Tensor
    tensors, metadata = read_safetensors("x.safetensors", with_metadata=True)
"""
import json
import struct

import torch

DTYPE_CODES = {
    torch.float32: "F32",
    torch.float64: "F64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
DTYPES_BY_CODE = {code: dtype for dtype, code in DTYPE_CODES.items()}


def _items(tensors):
    return list(tensors.items()) if hasattr(tensors, "items") else list(tensors)


def _raw_bytes(tensor):
    tensor = tensor.detach().to("cpu").contiguous()
    if tensor.dtype not in DTYPE_CODES:
        raise ValueError(f"write_safetensors: unsupported dtype {tensor.dtype}")
    # Reinterpret as bytes through uint8 so every dtype (bfloat16 too) works without numpy.
    return tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""


def write_safetensors(path, tensors, metadata=None):
    """Writes `tensors` (a dict or a list of (name, tensor) pairs) in the order given.

    metadata: an optional dict; values are converted to strings, as the format requires.
    """
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    chunks = []
    offset = 0
    for name, tensor in _items(tensors):
        if name in header:
            raise ValueError(f"write_safetensors: duplicate tensor name {name!r}")
        raw = _raw_bytes(tensor)
        header[name] = {
            "dtype": DTYPE_CODES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)))
        out.write(text)
        for raw in chunks:
            out.write(raw)


def read_safetensors(path, with_metadata=False):
    """Reads every tensor of a safetensors file into a dict name -> torch.Tensor (CPU).

    With with_metadata=True returns (tensors, metadata_dict).
    """
    with open(path, "rb") as source:
        blob = source.read()
    if len(blob) < 8:
        raise ValueError(f"read_safetensors: {path} is shorter than the 8-byte header length")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if 8 + header_len > len(blob):
        raise ValueError(f"read_safetensors: {path}: header length {header_len} runs past the end")
    header = json.loads(blob[8 : 8 + header_len].decode("utf-8"))
    metadata = header.pop("__metadata__", {}) or {}
    data = memoryview(blob)[8 + header_len :]
    tensors = {}
    for name, entry in header.items():
        dtype = DTYPES_BY_CODE.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"read_safetensors: {path}: {name} has unknown dtype {entry['dtype']}")
        begin, end = entry["data_offsets"]
        shape = list(entry["shape"])
        if not 0 <= begin <= end <= len(data):
            raise ValueError(f"read_safetensors: {path}: {name} offsets {begin}..{end} out of range")
        count = 1
        for extent in shape:
            count *= extent
        item_size = torch.empty((), dtype=dtype).element_size()
        if end - begin != count * item_size:
            raise ValueError(
                f"read_safetensors: {path}: {name} holds {end - begin} bytes but shape {shape} "
                f"of {entry['dtype']} needs {count * item_size}"
            )
        if count == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        # A bytearray copy gives each tensor its own writable memory.
        raw = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.uint8)
        tensors[name] = raw.view(dtype).reshape(shape)
    if with_metadata:
        return tensors, metadata
    return tensors
