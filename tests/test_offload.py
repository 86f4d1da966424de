"""Routed experts in host memory (model.placement, Model(expert_offload=, max_device_memory=)): which
layers move, the same tokens wherever the stacks live, the refusals, Model.memory()'s host bytes, and
the host-memory params of the executor (vk.Buffer(host_memory=)) made and released. On lavapipe the
device's memory is the host's: the discrete layout (a host heap apart from the device-local one) runs
in a child with DSV4_VK_FORCE_STAGING=1 and lavapipe's heap standing in for system memory."""
import dataclasses
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from dsv4_vk.model import Model, random_weights
from dsv4_vk.model.params import expert_stack_bytes, routed_expert_layer
from dsv4_vk.model.checkpoint import BF16, load_hf
from dsv4_vk.model.placement import check_memory
from dsv4_vk.vk.caps import MemoryHeap, MemoryType
from test_model import FIX, TINY
from test_quant import SMALL

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_tokens(m, ids, steps=4):
    """Prefill logits of every prompt token, then `steps` greedy decode steps' logits and tokens."""
    rows = [m.prefill(ids, all_logits=True)]
    toks = [m.next_token]
    for _ in range(steps):
        rows.append(m.step(output="logits")[None])
        toks.append(m.next_token)
    return np.concatenate(rows), toks


def host_params(m):
    return {n for n, p in m.ex.params.items() if p.host_memory}


def check_same(base, off, layers):
    """off keeps the routed experts of `layers` in host memory and computes base's logits bit for bit."""
    assert off.offloaded == layers and base.offloaded == ()
    moved = host_params(off)
    assert moved and {routed_expert_layer(n) for n in moved} == set(layers)
    assert moved == {n for n in off.ex.params if routed_expert_layer(n) in layers}     # their scales and parts too
    assert not any(".shared." in n for n in moved)
    mem, ref = off.memory(), base.memory()
    assert mem["total"] == ref["total"] and ref["host"] == {} and ref["device"] == ref["total"]
    assert sum(mem["host"].values()) == sum(off.ex.params[n].nbytes for n in moved) > 0
    assert mem["device"] == mem["total"] - sum(mem["host"].values())
    ids = np.random.default_rng(5).integers(0, base.cfg.vocab_size, 7)
    (a, ta), (b, tb) = run_tokens(base, ids), run_tokens(off, ids)
    assert np.isfinite(a).all() and np.array_equal(a, b) and ta == tb


@pytest.mark.parametrize("dtype", [BF16, "fp8"])
def test_routed_experts_in_host_memory_give_the_same_logits(dtype):
    """BF16 weights (the shared expert joins the routed stack) and the published layout (FP4 routed
    experts, the FP8 shared expert apart, which stays): a layer's stacks and scales move whole."""
    w = random_weights(SMALL, 4, dtype)
    base = Model(SMALL, w, fused=True, prefill_chunk=4, expert_offload=False)
    for n, layers in ((1, (0,)), (2, (0, 1))):
        check_same(base, Model(SMALL, w, fused=True, prefill_chunk=4, expert_offload=n), layers)
        base.reset()
    if dtype == "fp8":
        assert "layers.0.ffn.shared.w13" in base.params


def test_a_lazily_loaded_checkpoint_streams_its_experts_into_host_memory(monkeypatch):
    """Model.load(dir) with every tensor lazy (streamed from the files as it is uploaded): the routed
    experts of the offloaded layer stream into host memory, and the logits stay the same."""
    from dsv4_vk.core.executor import Executor
    from dsv4_vk.model import checkpoint, tensor_files
    monkeypatch.setattr(checkpoint, "EAGER_BYTES", 64)
    streamed: dict = {}
    stream_param = Executor.stream_param

    def recorded(self, name, *args, host_memory=False):
        streamed[name] = host_memory
        return stream_param(self, name, *args, host_memory=host_memory)

    monkeypatch.setattr(Executor, "stream_param", recorded)
    d = os.path.join(FIX, "dsv4_fp8")
    _, w = load_hf(d, max_ctx=64)
    assert isinstance(w["layers.1.ffn.experts.w13"].codes, tensor_files.Lazy)
    base = Model.load(d, fused=True, prefill_chunk=4, max_ctx=64, expert_offload=False)
    streamed.clear()
    off = Model.load(d, fused=True, prefill_chunk=4, max_ctx=64, expert_offload=1)
    assert streamed["layers.0.ffn.w13"] and streamed["layers.0.ffn.w2.scale"], streamed
    assert streamed["layers.1.ffn.w13"] is False and not any(v for n, v in streamed.items() if ".ffn." not in n)
    check_same(base, off, (0,))


def test_split_expert_stacks_move_with_their_layer(monkeypatch, device):
    """Stacks past maxStorageBufferRange are parts (params.split_experts): a layer's parts all move."""
    cfg = dataclasses.replace(SMALL, n_routed_experts=16, moe_intermediate_size=256)
    limits = dataclasses.replace(device.caps.limits, max_storage_buffer_range=160 << 10)
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, limits=limits))
    w = random_weights(cfg, 2, "fp8")
    base = Model(cfg, w, device=device, fused=True, prefill_chunk=4, expert_offload=False)
    off = Model(cfg, w, device=device, fused=True, prefill_chunk=4, expert_offload=1)
    assert "layers.0.ffn.w13.2" in off.params and "layers.0.ffn.w13" not in off.params
    assert {"layers.0.ffn.w13.0", "layers.0.ffn.w13.2.scale", "layers.0.ffn.w2.0"} <= host_params(off)
    check_same(base, off, (0,))


def test_routed_expert_params_are_named_by_their_layer():
    for name, layer in (("layers.3.ffn.w13", 3), ("layers.3.ffn.w2.scale", 3), ("layers.12.ffn.w13.1", 12),
                        ("layers.12.ffn.w2.0.scale", 12), ("layers.3.ffn.shared.w13", None),
                        ("layers.3.ffn.gate.weight", None), ("layers.3.attn.wx", None), ("head.weight", None)):
        assert routed_expert_layer(name) == layer, name


def stub(device, local, host=None, shares=False):
    """A stand-in device: a device-local heap of `local` bytes and, with `host`, a host-visible heap."""
    heaps = (MemoryHeap(local, True),) + ((MemoryHeap(host, False),) if host is not None else ())
    types = (MemoryType(0, 1),) + ((MemoryType(1, 6),) if host is not None else ())
    caps = dataclasses.replace(device.caps, memory_heaps=heaps, memory_types=types)
    return SimpleNamespace(name="stub", caps=caps, is_host_visible=shares)


def test_auto_moves_the_fewest_layers_largest_first(device):
    """expert_offload="auto": none where everything fits, else the fewest layers (largest stacks first)
    that make the rest fit the device-local heap (or max_device_memory); a number forces that many."""
    cfg = TINY.replace(max_ctx=64)
    experts, weights = [1000, 3000, 2000], 10000
    cache = check_memory(cfg, 0, 16, stub(device, 1 << 30, 1 << 30))["cache"]
    need = cache + weights
    for short, layers in ((0, ()), (1, (1,)), (3000, (1,)), (3001, (1, 2)), (5000, (1, 2))):
        got = check_memory(cfg, weights, 16, stub(device, need - short, 1 << 30), experts)
        host = sum(experts[i] for i in layers)
        assert got["offloaded"] == layers and got["host"] == host and got["device"] == need - host, short
        budget = check_memory(cfg, weights, 16, stub(device, 1 << 30, 1 << 30), experts,
                              max_device_memory=need - short)
        assert budget["offloaded"] == layers and budget["available"] == need - short
    forced = check_memory(cfg, weights, 16, stub(device, 1 << 30, 1 << 30), experts, 2)
    assert forced["offloaded"] == (1, 2) and forced["host"] == 5000 and forced["total"] == need
    assert check_memory(cfg, weights, 16, stub(device, need, 1 << 30), experts, 0)["offloaded"] == ()


def test_what_does_not_fit_is_refused_naming_the_bytes(device):
    cfg = TINY.replace(max_ctx=64)
    experts, weights = [1000, 3000, 2000], 10000
    need = check_memory(cfg, weights, 16, stub(device, 1 << 30, 1 << 30))["total"]
    small = stub(device, need - 2500, 1 << 30)
    for offload in (False, 0):      # never: refused, pointing at the option
        with pytest.raises(ValueError, match=rf"max_ctx = 64 needs {need} bytes of device memory .*stub has {need - 2500} "
                                             r"bytes available \(its largest device-local heap\).*; or "
                                             r"expert_offload='auto' \(or 1\) keeps the routed experts of 1 layer "
                                             r"\(3000 bytes\) in host memory"):
            check_memory(cfg, weights, 16, small, experts, offload)
    with pytest.raises(ValueError, match=rf"needs {need - 3000} bytes of device memory \(\d+ for the decode cache and "
                                         r"RoPE tables, 7000 for the weights besides 3000 bytes of routed experts in "
                                         rf"host memory\); stub has {need - 3500} bytes available \(max_device_memory\)"
                                         r".*expert_offload='auto' \(or 2\)"):
        check_memory(cfg, weights, 16, stub(device, 1 << 30, 1 << 30), experts, 1, max_device_memory=need - 3500)
    with pytest.raises(ValueError, match=r"with the routed experts of all 3 layers \(6000 bytes\) in host memory "
                                         r"\(expert_offload\) the rest still does not fit"):
        check_memory(cfg, weights, 16, stub(device, need - 6001, 1 << 30), experts)
    with pytest.raises(ValueError, match=r"the routed experts of 1 layer need 3000 bytes of host memory the device "
                                         r"reads; stub's host heap has 2999 bytes"):
        check_memory(cfg, weights, 16, stub(device, need - 2500, 2999), experts)
    with pytest.raises(ValueError, match=r"the routed experts of 1 layer \(3000 bytes\) would go to host memory, but "
                                         r"stub has no host-visible heap outside its device-local memory"):
        check_memory(cfg, weights, 16, stub(device, need - 2500), experts)
    with pytest.raises(ValueError, match=r"; routed experts in host memory \(expert_offload\) would free none of it: "
                                         r"this device's memory is the host's$"):
        check_memory(cfg, weights, 16, stub(device, need - 2500, shares=True), experts)
    with pytest.raises(ValueError, match=r"expert_offload = 4: the model has 3 layers with routed experts"):
        check_memory(cfg, weights, 16, small, experts, 4)


@pytest.mark.parametrize("kw,match", [
    ({"expert_offload": "yes"}, r"expert_offload must be 'auto' .*, False \(never\) or a number of layers ≥ 0, got 'yes'"),
    ({"expert_offload": True}, r"expert_offload must be .* got True"),
    ({"expert_offload": -1}, r"expert_offload must be .* got -1"),
    ({"expert_offload": 1.5}, r"expert_offload must be .* got 1\.5"),
    ({"expert_offload": None}, r"expert_offload must be .* got None"),
    ({"expert_offload": 4}, r"expert_offload = 4: the model has 3 layers with routed experts"),
    ({"max_device_memory": 0}, r"max_device_memory must be a number of bytes ≥ 1 or None .* got 0"),
    ({"max_device_memory": "1GB"}, r"max_device_memory must be .* got '1GB'"),
    ({"max_device_memory": True}, r"max_device_memory must be .* got True"),
])
def test_bad_placement_arguments_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        Model.load(TINY, **kw)
    with pytest.raises(ValueError, match=match):
        Model(TINY, random_weights(TINY, 0), **kw)


def test_the_model_checks_the_experts_it_would_move(device):
    """Model.load(V4Config) and Model(cfg, weights) give check_memory each layer's stack bytes: a budget
    below the model refuses on a device whose memory is the host's (nothing to gain), naming it."""
    w = random_weights(TINY, 0)
    stacks = expert_stack_bytes(TINY, w)
    m = Model(TINY, w)
    assert len(stacks) == 3 and stacks == [sum(m.params[n].nbytes for n in m.params if routed_expert_layer(n) == i)
                                           for i in range(3)]
    budget = m.memory()["total"] - stacks[0]
    for make in (lambda: Model.load(TINY, max_device_memory=budget), lambda: Model(TINY, w, max_device_memory=budget)):
        if device.caps.host_heap() is None:            # lavapipe: the device's memory is the host's
            with pytest.raises(ValueError, match=r"would free none of it: this device's memory is the host's"):
                make()
        else:                                          # a discrete GPU: the largest stack moves to the host heap
            with pytest.warns(RuntimeWarning, match=r"the routed experts of 1 of 3 layers"):
                assert len(make().offloaded) == 1
    with pytest.raises(ValueError, match=r"fits( \(or lower prefill_chunk\))?$"):   # the cache alone: no word about the experts
        Model.load(TINY, max_ctx=10 ** 9)


DISCRETE = """
import gc, warnings
import numpy as np, dsv4_vk as dv
from dsv4_vk.vk import Upload, caps
from dsv4_vk.model import Model, random_weights
from dsv4_vk.model.params import expert_stack_bytes, routed_expert_layer
from dsv4_vk.model.config import preset
from dsv4_vk.model.placement import check_memory
dev = dv.default_device()
assert not dev.is_host_visible
ex = dv.Executor(dev)
rng = np.random.default_rng(1)
a = rng.standard_normal((300, 7)).astype(np.float32)
cfg = preset("tiny")
w = random_weights(cfg, 3)
if dev.caps.host_heap() is None:                 # lavapipe: refused, then its one heap stands in for system memory
    try:
        ex.set_param("w", a, host_memory=True)
    except ValueError as e:
        assert "has no host-visible heap outside its device-local memory" in str(e), e
    else:
        raise AssertionError("host memory on a device without a host heap")
    try:
        Model(cfg, w, expert_offload=1)
    except ValueError as e:
        assert "has no host-visible heap outside its device-local memory" in str(e), e
    else:
        raise AssertionError("expert_offload on a device without a host heap")
    caps.Capabilities.host_heap = lambda self: 0

p = ex.set_param("w", a, host_memory=True)
buf = p.buffer
assert p.host_memory and buf.host_memory and buf._view is not None and buf in dev._buffers
assert np.array_equal(p.numpy(), a)
ex.set_param("w", a)                              # made anew in device memory: the host buffer is gone
assert not ex.params["w"].host_memory and not buf.alive and buf not in dev._buffers
raw = a.view(np.uint8).reshape(-1)
with Upload(dev, chunk=4096) as up:
    q = ex.stream_param("s", a.shape, a.dtype, lambda v, s: v.__setitem__(slice(None), raw[s:s + v.size]), up,
                        host_memory=True)
assert q.buffer.host_memory and np.array_equal(q.numpy(), a)
qb = q.buffer
ex.params.pop("s").release()
assert not qb.alive and qb not in dev._buffers

base = Model(cfg, w, prefill_chunk=4, expert_offload=False)
need = check_memory(cfg, sum(v.nbytes for v in w.values()), 4, dev, expert_stack_bytes(cfg, w), False)["total"]
stacks = expert_stack_bytes(cfg, w)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    m = Model(cfg, w, prefill_chunk=4, max_device_memory=need - stacks[0])
said = [str(c.message) for c in caught if issubclass(c.category, RuntimeWarning)]
assert m.offloaded == (0,) and len(said) == 1, (m.offloaded, said)
assert f"the routed experts of 1 of {cfg.num_hidden_layers} layers ({stacks[0]} bytes; layers 0) are in host memory" \\
    in said[0] and "bytes a token" in said[0], said
per = sum(m.params[n].nbytes // m.params[n].shape[0] for n in ("layers.0.ffn.w13", "layers.0.ffn.w2"))
assert f"about {per * cfg.num_experts_per_tok} bytes a token" in said[0], said
moved = [p for n, p in m.ex.params.items() if p.host_memory]
assert moved and all(routed_expert_layer(p.name) == 0 and p.buffer.host_memory and p.buffer._view is not None
                     for p in moved)
assert sum(m.memory()["host"].values()) == sum(p.nbytes for p in moved)
ids = rng.integers(0, cfg.vocab_size, 6)
want = base.prefill(ids, all_logits=True)
assert np.array_equal(m.prefill(ids, all_logits=True), want)
assert [m.step() for _ in range(3)] == [base.step() for _ in range(3)]
bufs = [p.buffer for p in moved]
del m, moved, p
gc.collect()
dev.pool.drain()
assert not any(b.alive for b in bufs), "host-memory params outlived their model"
dev.close()
print("ok")
"""


def test_host_memory_params_on_a_discrete_layout():
    """A device with a host heap apart from its device-local memory (lavapipe's heap standing in):
    set_param/stream_param(host_memory=True) place mapped buffers there (refused without such a heap),
    re-placing or releasing one destroys its buffer; "auto" under max_device_memory moves layer 0's
    experts (a RuntimeWarning saying so) with the same tokens, and they are freed with the model."""
    r = subprocess.run([sys.executable, "-c", DISCRETE], capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, "DSV4_VK_FORCE_STAGING": "1"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


def test_info_names_the_heap_routed_experts_may_go_to(device):
    """`dsv4_vk info`: the host heap (Capabilities.host_heap) is marked; lavapipe has none apart."""
    from dsv4_vk.cli.info import _human, report
    rep = report(device)
    assert rep["host_heap"] == device.caps.host_heap()              # lavapipe: None (one heap)
    assert ("host-visible (Model's expert_offload places routed experts here)" in _human(rep)) == (
        rep["host_heap"] is not None)
    caps = stub(device, 139 << 30, 125 << 30).caps
    assert caps.host_heap() == 1 and stub(device, 139 << 30).caps.host_heap() is None
    rep.update(memory_heaps=[dataclasses.asdict(h) for h in caps.memory_heaps], host_heap=caps.host_heap())
    assert "heaps         139.0 GiB device-local, 125.0 GiB host-visible (Model's expert_offload places routed " \
           "experts here)" in _human(rep)
