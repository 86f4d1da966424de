"""Checkpoints in the safetensors format, read and written with numpy + json (no dependency).

File layout: an 8-byte little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the data
(offsets relative to its start). F32, F16, BF16 and F64 tensors are read (as float32); writes are
F32. The model config is stored as JSON in metadata["dsv4_vk.config"].

Every defect is a CheckpointError (a ValueError) naming the file and the tensor: truncated file,
bad header, unknown dtype, offsets outside the data or of the wrong size, missing / unexpected /
mis-shaped tensors against the config.
"""
import json
import os
import struct

import numpy as np

from .config import Config, tensor_shapes

CONFIG_KEY = "dsv4_vk.config"
MAX_HEADER = 100 << 20
DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8"), "BF16": np.dtype("<u2")}


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read, or that does not match the model config."""


def save(path, tensors, config=None, metadata=None):
    """Write {name: array} as F32 tensors (sorted by name); config goes into the metadata."""
    meta = dict(metadata or {})
    if config is not None:
        meta[CONFIG_KEY] = config.to_json()
    header, arrays, offset = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype="<f4")
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        arrays.append(a)
        offset += a.nbytes
    if meta:
        header["__metadata__"] = {str(k): str(v) for k, v in meta.items()}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)             # data starts 8-byte aligned
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for a in arrays:
            f.write(a.tobytes())
    os.replace(tmp, path)


def _fail(path, msg):
    raise CheckpointError(f"checkpoint {os.fspath(path)!r}: {msg}")


def read_header(path):
    """(header dict without metadata, metadata dict, data start offset, file size)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                _fail(path, f"file is {size} bytes, too short for the 8-byte header length (not a safetensors file?)")
            (n,) = struct.unpack("<Q", head)
            if n > min(MAX_HEADER, size - 8):
                _fail(path, f"header length {n} exceeds the file ({size} bytes): truncated or not a safetensors file")
            raw = f.read(n)
    except OSError as e:
        raise CheckpointError(f"checkpoint {os.fspath(path)!r} cannot be read: {e.strerror or e}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        _fail(path, f"header is not valid JSON ({e}): corrupt file")
    if not isinstance(header, dict):
        _fail(path, "header is not a JSON object: corrupt file")
    meta = header.pop("__metadata__", {}) or {}
    if not isinstance(meta, dict):
        _fail(path, "__metadata__ is not a JSON object")
    data_len = size - 8 - n
    for name, e in header.items():
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            _fail(path, f"tensor {name!r}: entry must have exactly dtype, shape, data_offsets")
        if e["dtype"] not in DTYPES:
            _fail(path, f"tensor {name!r}: dtype {e['dtype']!r} not supported; expected one of {sorted(DTYPES)}")
        shape, offs = e["shape"], e["data_offsets"]
        if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
            _fail(path, f"tensor {name!r}: shape {shape!r} is not a list of non-negative integers")
        if (not isinstance(offs, list) or len(offs) != 2 or not all(isinstance(o, int) for o in offs)
                or not 0 <= offs[0] <= offs[1]):
            _fail(path, f"tensor {name!r}: data_offsets {offs!r} are not [begin, end] with 0 ≤ begin ≤ end")
        want = int(np.prod(shape, dtype=np.int64)) * DTYPES[e["dtype"]].itemsize
        if offs[1] - offs[0] != want:
            _fail(path, f"tensor {name!r}: data_offsets span {offs[1] - offs[0]} bytes, but shape {shape} "
                        f"{e['dtype']} needs {want}")
        if offs[1] > data_len:
            _fail(path, f"tensor {name!r}: data ends at byte {offs[1]} but the file holds {data_len} data bytes "
                        "(truncated file)")
    return header, meta, 8 + n, size


def load(path, names=None):
    """(tensors {name: float32 array}, metadata). names: only these (all by default)."""
    header, meta, start, _ = read_header(path)
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name in (header if names is None else names):
        e = header[name]
        b, end = e["data_offsets"]
        a = mm[start + b:start + end].view(DTYPES[e["dtype"]])
        if e["dtype"] == "BF16":                  # bfloat16: the high half of a float32
            a = (a.astype(np.uint32) << 16).view(np.float32)
        a = np.array(a, dtype=np.float32).reshape(e["shape"])
        if not np.isfinite(a).all():
            _fail(path, f"tensor {name!r} holds {int((~np.isfinite(a)).sum())} non-finite values")
        out[name] = a
    del mm
    return out, meta


def config_of(path):
    """The Config stored in a checkpoint's metadata."""
    _, meta, _, _ = read_header(path)
    if CONFIG_KEY not in meta:
        _fail(path, f"metadata has no {CONFIG_KEY!r} entry: pass a Config to say what model it holds")
    try:
        return Config.from_json(meta[CONFIG_KEY])
    except (TypeError, ValueError) as e:
        _fail(path, f"metadata {CONFIG_KEY!r} is not a valid config: {e}")


def check_tensors(cfg, shapes, where="weights"):
    """Compare {name: shape} against what `cfg` needs; CheckpointError naming the first problems."""
    want = tensor_shapes(cfg)
    problems = []
    for name, shape in want.items():
        if name not in shapes:
            problems.append(f"missing tensor {name!r} (expected shape {list(shape)})")
        elif tuple(shapes[name]) != tuple(shape):
            problems.append(f"tensor {name!r} has shape {list(shapes[name])}, expected {list(shape)}")
    for name in sorted(set(shapes) - set(want)):
        problems.append(f"unexpected tensor {name!r} (shape {list(shapes[name])}): misnamed, or a config mismatch")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise CheckpointError(f"{where} do not match the config: " + "; ".join(problems[:5]) + more)


def load_checkpoint(path, cfg=None):
    """(config, {name: float32 array}) of a checkpoint, checked against the config (stored one by default)."""
    cfg = cfg or config_of(path)
    header, _, _, _ = read_header(path)
    check_tensors(cfg, {k: v["shape"] for k, v in header.items()}, f"checkpoint {os.fspath(path)!r}")
    tensors, _ = load(path)
    return cfg, tensors


def random_weights(cfg, seed=0):
    """A random, seeded set of weights for `cfg` (float32) whose activations stay O(1) through the layers."""
    rng = np.random.default_rng(seed)
    out = {}

    def normal(shape, std):
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    for name, shape in tensor_shapes(cfg).items():
        if name.endswith("_fn"):                    # mixes (x @ fnᵀ)·r with x of RMS 1: O(1) logits
            out[name] = normal(shape, 1.0 / np.sqrt(shape[1]))
        elif name.endswith("_base"):
            out[name] = rng.uniform(-0.5, 0.5, shape).astype(np.float32)
        elif name.endswith("_scale"):
            out[name] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        elif name.endswith("norm.weight"):
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif name == "embed.weight":
            out[name] = normal(shape, 1.0)
        else:                                        # linear maps [.., out, in]
            out[name] = normal(shape, 1.0 / np.sqrt(shape[-1]))
    return out
