"""Checked by mypy, not run by pytest (`make typecheck`, CI): what a user's type checker infers from
the public API. assert_type fails the check where an overload or annotation gives another type."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

import dsv4_vk as dv
from dsv4_vk.model import Chat, ChatTurn, Model, SitePath, TextStream, Tokenizer, chat_prompt, chat_reply

if TYPE_CHECKING:
    from typing_extensions import assert_type


F32 = NDArray[np.float32]


def numpy_in_numpy_out(m: F32, x: F32, w: F32, fn: F32) -> None:
    s, b = np.zeros(3, np.float32), [0.0] * 24
    assert_type(dv.hc_comb(m, s, b), np.ndarray)
    assert_type(dv.hc_pre(x, w), np.ndarray)
    assert_type(dv.hc_post(x[:, 0], x, w, m), np.ndarray)
    assert_type(dv.hc_site_pre(x, fn, s, b), tuple[np.ndarray, np.ndarray, np.ndarray])


def tensors_in_tensors_out(dev: dv.Device, m: F32, x: F32, w: F32) -> None:
    mt, xt = dev.tensor(m), dev.tensor(x)
    assert_type(mt, dv.Tensor)
    assert_type(dv.hc_comb(mt, [0.0] * 3, w), dv.Tensor)
    assert_type(dv.hc_pre(xt, w, out=dev.empty((1, 4))), dv.Tensor)
    assert_type(dv.hc_post(dev.tensor(x[:, 0]), xt, w, m), dv.Tensor)
    assert_type(dv.hc_site_pre(xt.rows(0, 1), m, w, w), tuple[dv.Tensor, dv.Tensor, dv.Tensor])
    assert_type(dv.hc_pre(x, xt), np.ndarray | dv.Tensor)       # a later Tensor argument: either
    assert_type(np.asarray(xt), np.ndarray)
    assert_type(xt.numpy(), np.ndarray)


def sites(dev: dv.Device, X: F32, f: F32, fn: F32, s: F32, b: F32) -> None:
    site, nxt = dv.HcSite(fn, s, b, device=dev), dv.HcSite(fn, s, b, device=dev)
    head = dv.HcSite.head(fn, s, b, device=dev)
    assert_type(head, dv.HcHead)
    u, post, comb = site.pre(X)
    assert_type(u, np.ndarray)
    assert_type(site.post(f, X, post, comb), np.ndarray)
    assert_type(site.post(f, X, post, comb, next=nxt), tuple[np.ndarray, dv.MixCarry])
    assert_type(head.collapse(X), np.ndarray)
    Xt = dev.tensor(X)
    ut, post_t, comb_t = site.pre(Xt)
    assert_type(ut, dv.Tensor)
    assert_type(site.post(ut, Xt, post_t, comb_t), dv.Tensor)
    Xn, carry = site.post(ut, Xt, post_t, comb_t, next=head)
    assert_type(Xn, dv.Tensor)
    assert_type(head.collapse(Xn, carry=carry), dv.Tensor)
    g = dv.Graph()
    x = g.input("X", (1, 4, 8))
    gu, gp, gc = site.pre_graph(g, x)
    assert_type(site.post_graph(g, gu, x, gp, gc), dv.GraphTensor)
    assert_type(site.post_graph(g, gu, x, gp, gc, next=nxt), tuple[dv.GraphTensor, dv.GraphTensor | None])


def graphs_and_models(dev: dv.Device, model: Model) -> None:
    g = dv.Graph()
    x = g.input("x", (4, 8))
    assert_type(x.reshape(2, 16).permute(1, 0).transpose(), dv.GraphTensor)
    assert_type(g.compile(dev), dv.CompiledGraph)
    assert_type(g.compile(dev).run(x=np.zeros((4, 8))), dict)
    assert_type(model.paths(), list[SitePath])
    assert_type(model.offloaded, tuple[int, ...])
    assert_type(Model.load("dir", expert_offload="auto", max_device_memory=1 << 30), Model)
    assert_type(Model.load("dir", expert_offload=False), Model)
    assert_type(Model.load("dir", expert_offload=2), Model)


def text_in_text_out(model: Model) -> None:
    tok = Tokenizer.from_dir("dir")
    assert_type(tok.encode("hi", bos=False), list[int])
    assert_type(tok.decode([1, 2]), str)
    assert_type(tok.eos_ids, frozenset[int])
    assert_type(tok.bos_id, int | None)
    stream = tok.stream()
    assert_type(stream, TextStream)
    assert_type(stream.push(1) + stream.flush(), str)
    assert_type(chat_prompt("dir", [{"role": "user", "content": "hi"}], thinking=True, trust_checkpoint_code=True), str)
    for t in model.generate(tok.encode("hi"), 8, stop=tok.eos_ids):
        assert_type(t, int)
    chat = Chat(model, tok, "dir", system="Be brief.", trust_checkpoint_code=True)
    reply = chat.send("hi", 16)
    for piece in reply:
        assert_type(piece, str)
    reply.close()
    assert_type(chat.last_turn, ChatTurn | None)
    assert_type(chat.messages, list[dict[str, Any]])
    assert_type(chat_reply("dir", "a", trust_checkpoint_code=True), dict[str, Any])
    assert_type(model.epoch, int)
