"""What users expect of the public types: numpy conversion of device tensors, reprs that say what an
object is (and never raise, even on a closed device), per-site labels of a model's HC paths,
HcSite.post(next=) past the binding limit, and a clean `mypy dsv4_vk`."""
import numpy as np
import pytest

import dsv4_vk as dv


def site_weights(rng, D, m=24):
    return ((rng.uniform(-1, 1, (m, 4 * D)) * 2 / np.sqrt(4 * D)).astype(np.float32),
            rng.uniform(-0.5, 0.5, 3 if m == 24 else 1).astype(np.float32),
            rng.uniform(-0.25, 0.25, m).astype(np.float32))


# --- numpy conversion ------------------------------------------------------------------------------

def test_np_asarray_of_a_tensor_is_its_data(device, rng):
    a = rng.standard_normal((3, 5)).astype(np.float32)
    t = device.tensor(a)
    for got in (np.asarray(t), np.array(t), np.array(t, copy=True)):
        assert isinstance(got, np.ndarray) and got.dtype == np.float32
        np.testing.assert_array_equal(got, a)
    wide = np.asarray(t, dtype=np.float64)                       # dtype= converts the host copy
    assert wide.dtype == np.float64 and np.array_equal(wide, a.astype(np.float64))
    np.testing.assert_array_equal(np.add(t, 1), a + 1)          # ufuncs see the data, not an object
    assert np.asarray(device.tensor(np.arange(4, dtype=np.int32))).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="always copies"):     # numpy 2's copy=False: never copy
        np.array(t, copy=False)
    t.release()
    with pytest.raises(ValueError, match="released"):
        np.asarray(t)


# --- reprs -------------------------------------------------------------------------------------------

def test_tensor_and_site_reprs_say_what_they_are_even_after_close(rng):
    dev = dv.Device()
    t = dev.tensor(np.zeros((2, 3), np.float32))
    h = dev.tensor(np.zeros(4, np.float16))
    site = dv.HcSite(*site_weights(rng, 8), n_iter=7, device=dev, fused=True)
    head = dv.HcSite.head(*site_weights(rng, 8, m=4), device=dev)
    where = f"on Device #{dev.serial} {dev.name!r}"
    assert repr(t) == f"<dsv4_vk.Tensor (2, 3) float32 {where}>"
    assert repr(h) == f"<dsv4_vk.Tensor (4,) float16 {where}>"
    assert repr(site) == f"<dsv4_vk.HcSite D=8 hc_eps=1e-06 norm_eps=1e-06 n_iter=7 fused=True {where}>"
    assert repr(head) == f"<dsv4_vk.HcHead D=8 hc_eps=1e-06 norm_eps=1e-06 fused=None {where}>"
    h.release()
    assert repr(h).endswith(", released>")
    dev.close()
    assert repr(t).endswith(f"{where}, device closed>")
    assert repr(site).endswith(f"{where}, device closed>") and repr(head).endswith(", device closed>")
    for half_made in (dv.Tensor.__new__(dv.Tensor), dv.HcSite.__new__(dv.HcSite)):   # a constructor that raised
        assert repr(half_made).startswith("<dsv4_vk.")


# --- a model's paths, per site -----------------------------------------------------------------------

@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_model_paths_name_the_site_of_every_hc_op(fused):
    from test_model import TINY
    from dsv4_vk.model import Model, SitePath
    m = Model.load(TINY, fused=fused)
    paths = m.paths()
    assert paths and all(isinstance(p, SitePath) for p in paths)
    sites = [f"layers.{i}.{name}" for i in range(TINY.num_hidden_layers) for name in ("attn", "ffn")] + ["head"]
    assert list(dict.fromkeys(p.site for p in paths)) == sites        # every site, in order, each op labelled
    graph_paths = m.compiled("decode").graph.paths
    assert [(p.op, p.path, p.reason) for p in paths] == graph_paths
    for site in sites:              # the fused site is one HC_SITE; unfused, its chain's ops follow it
        ops = [p.op for p in paths if p.site == site]
        want = ["HC_SITE"] if fused else ["HC_SITE", "HC_PRE"] if site == "head" else \
            ["HC_SITE", "HC_COMB", "HC_PRE", "HC_POST"]
        assert ops == want, (site, ops)
    assert all((p.path == "unfused") == (fused is False) for p in paths)


# --- HcSite.post(next=) past maxStorageBufferRange ------------------------------------------------------

def test_chained_post_past_the_binding_limit_runs_in_chunks_and_carries_nothing(rng):
    """docs/library.md: an X past maxStorageBufferRange is posted in chunks (as hc_post), and the carry
    is empty, so the next pre computes its own mixes. Checked on a device that allows 64 KiB a binding
    against the same calls on a device with lavapipe's 128 MiB (where the post does carry)."""
    import dataclasses
    from dsv4_vk.hc import kernels
    T, D = 300, 32                                                      # X: 150 KiB, 512 B a token
    X = rng.uniform(-1, 1, (T, 4, D)).astype(np.float32)
    f = rng.uniform(-1, 1, (T, D)).astype(np.float32)
    w1, w2 = site_weights(rng, D), site_weights(rng, D)
    with dv.Device() as big, dv.Device() as small:
        small.caps = dataclasses.replace(small.caps, limits=dataclasses.replace(small.caps.limits,
                                                                                max_storage_buffer_range=64 << 10))
        results = {}
        for name, dev in (("big", big), ("small", small)):
            site, nxt = dv.HcSite(*w1, device=dev), dv.HcSite(*w2, device=dev)
            Xt = dev.tensor(X)
            u, post, comb = site.pre(Xt)
            X_new, carry = site.post(dev.tensor(f), Xt, post, comb, next=nxt)
            X_np, carry_np = site.post(f, X, post.numpy(), comb.numpy(), next=nxt)     # numpy in: numpy out
            assert isinstance(X_np, np.ndarray) and (carry_np.partials is None) == (name == "small")
            results[name] = (post.numpy(), comb.numpy(), X_new.numpy(), X_np, carry,
                             [r.numpy() for r in nxt.pre(X_new, carry=carry)])
        assert results["big"][4].partials is not None                  # where it fits, the post carries
        assert results["small"][4].partials is None
        post, comb, X_new, X_np, _, nxt_out = results["small"]
        for got, want in zip((post, comb), results["big"][:2]):           # (pre's kernels: chosen per chunk size)
            assert np.abs(got - want).max() <= 1e-5
        np.testing.assert_array_equal(X_new, X_np)
        np.testing.assert_array_equal(X_new, dv.hc_post(f, X, post, comb))            # unchunked, plain post
        ref = kernels.reference_post(f, X, post, comb)
        assert np.abs(X_new - ref).max() <= 1e-5 * np.abs(ref).max()
        for got, want in zip(nxt_out, results["big"][5]):                 # next pre: its own mixes vs carried
            assert np.abs(got - want).max() <= 1e-4 * max(np.abs(want).max(), 1.0)


# --- a typed public API ------------------------------------------------------------------------------

def public_callables():
    """(qualified name, function) of every public function, method and property of dsv4_vk's and
    dsv4_vk.model's public names."""
    import inspect
    import dsv4_vk.model as model
    for mod in (dv, model):
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.isfunction(obj):
                yield f"{mod.__name__}.{name}", obj
            elif inspect.isclass(obj) and not issubclass(obj, BaseException):
                for attr, member in vars(obj).items():
                    if attr.startswith("_") and attr != "__init__":
                        continue
                    if isinstance(member, (staticmethod, classmethod)):
                        member = member.__func__
                    elif isinstance(member, property):
                        member = member.fget
                    if inspect.isfunction(member):
                        yield f"{mod.__name__}.{name}.{attr}", member


def test_public_functions_and_methods_are_annotated():
    """Every parameter of a public function or method has a type, and so has its result (mypy checks
    the bodies of annotated functions only, and users' type checkers see these signatures)."""
    import inspect
    missing = []
    for qualname, fn in public_callables():
        params = list(inspect.signature(fn).parameters.values())
        if params and params[0].name in ("self", "cls"):
            params = params[1:]
        untyped = [p.name for p in params if p.annotation is inspect.Parameter.empty]
        if fn.__name__ != "__init__" and inspect.signature(fn).return_annotation is inspect.Signature.empty:
            untyped.append("return")
        if untyped:
            missing.append(f"{qualname}: {', '.join(untyped)}")
    assert not missing, "not annotated:\n" + "\n".join(missing)
