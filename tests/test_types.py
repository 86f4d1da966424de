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
