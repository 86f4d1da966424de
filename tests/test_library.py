"""The library path (issue 9): device tensors, resident HC sites, compiled programs of whole steps,
closed devices, threads, the memory budget, maxStorageBufferRange and strict environment switches.

Device-path results are compared bit for bit with the numpy API (the same kernels), which the HC
tests check against the float64 references; the head collapse is checked against its reference."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dsv4_vk as dv
from dsv4_vk.hc import kernels
from dsv4_vk.vk import Buffer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code, **env_vars):
    e = {**os.environ, **env_vars}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e,
                          cwd=ROOT, timeout=600)


def site_arrays(rng, T, D):
    return dict(X=rng.uniform(-1, 1, (T, 4, D)).astype(np.float32),
                fn=(rng.uniform(-1, 1, (24, 4 * D)) * 2 / np.sqrt(4 * D)).astype(np.float32),
                scale=rng.uniform(-0.5, 0.5, 3).astype(np.float32),
                base=rng.uniform(-0.25, 0.25, 24).astype(np.float32))


# --- device tensors --------------------------------------------------------------------------------

def test_tensor_round_trip_write_and_errors(device, rng):
    a = rng.standard_normal((3, 5))                        # float64 is stored as float32
    t = device.tensor(a)
    assert isinstance(t, dv.Tensor) and t.shape == (3, 5) and t.dtype == np.float32
    np.testing.assert_array_equal(t.numpy(), a.astype(np.float32))
    b = rng.standard_normal((3, 5)).astype(np.float32)
    t.write(b)
    np.testing.assert_array_equal(t.numpy(), b)
    i = device.empty((7,), np.int32)
    i.write(np.arange(7))
    assert i.dtype == np.int32 and i.numpy().tolist() == list(range(7))
    with pytest.raises(ValueError, match=r"write of shape \(5, 3\) into a tensor of shape \(3, 5\)"):
        t.write(b.T)
    h = device.tensor(np.arange(5, dtype=np.float16))                     # 16-bit elements pack two per word
    assert h.dtype == np.float16 and h.numpy().tolist() == list(range(5)) and h.read_at(3, 2).tolist() == [3, 4]
    with pytest.raises(ValueError, match="dtype complex64 is not supported: expected one of float32, int32"):
        device.empty((2,), np.complex64)
    with pytest.raises(ValueError, match="negative dimension"):
        device.empty((2, -1))
    assert device.empty((np.int64(3), 2)).shape == (3, 2)
    for shape in ((2.5, 4), (True, 4), ("3",)):
        with pytest.raises(ValueError, match="shape must be a tuple of integers"):
            device.empty(shape)
    with pytest.raises(ValueError, match="larger than .* largest memory heap"):
        device.empty((2 ** 62,))
    with pytest.raises(ValueError, match="outside int32's range"):
        i.write(np.array([2 ** 40, 0, 0, 0, 0, 0, 0]))
    assert i.numpy().tolist() == list(range(7))                           # (nothing written)
    for bad in (lambda: t.rows(0.5, 2), lambda: t.read_at(1.5), lambda: t.write(b[0], start=1.5),
                lambda: t.read_at(0, True)):
        with pytest.raises(ValueError, match="must be an integer, got"):
            bad()


def test_ops_take_tensors_and_return_tensors(device, rng):
    T, D = 5, 36
    s = site_arrays(rng, T, D)
    mixes = rng.uniform(-2, 2, (T, 24)).astype(np.float32)
    w, post, comb = (rng.uniform(0, 1, (T, 4)).astype(np.float32), rng.uniform(0, 2, (T, 4)).astype(np.float32),
                     rng.uniform(0, 1, (T, 4, 4)).astype(np.float32))
    f = rng.uniform(-1, 1, (T, D)).astype(np.float32)
    calls = [(dv.hc_comb, (mixes, s["scale"], s["base"])), (dv.hc_pre, (s["X"], w)),
             (dv.hc_post, (f, s["X"], post, comb)), (dv.hc_site_pre, (s["X"], s["fn"], s["scale"], s["base"]))]
    for fn, args in calls:
        want = fn(*args)
        assert isinstance(want, (np.ndarray, tuple))                    # numpy in → numpy out, as before
        got = fn(*[device.tensor(a) for a in args])
        for g, w_ in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert isinstance(g, dv.Tensor), fn.__name__
            np.testing.assert_array_equal(g.numpy(), w_)
        mixed = fn(device.tensor(args[0]), *args[1:])                 # one Tensor makes the call a device call
        first = mixed[0] if isinstance(mixed, tuple) else mixed
        assert isinstance(first, dv.Tensor)
    out = device.empty((T, 4, 4))
    assert dv.hc_comb(device.tensor(mixes), s["scale"], s["base"], out=out) is out
    np.testing.assert_array_equal(out.numpy(), dv.hc_comb(mixes, s["scale"], s["base"]))
    with pytest.raises(ValueError, match=r"out\['out0'\] is a f32 Tensor of shape \(5, 4\), expected f32 \(5, 4, 4\)"):
        dv.hc_comb(mixes, s["scale"], s["base"], out=device.empty((T, 4)))
    other = dv.Device()
    two_devices = r"a Tensor argument lives on <Device #(\d+) .*, the call runs on <Device #(?!\1)"
    with pytest.raises(ValueError, match=two_devices):
        dv.hc_pre(device.tensor(s["X"]), other.tensor(w))          # (the two devices told apart by number)
    other.close()
    Xt, wt = device.tensor(s["X"]), device.tensor(w)                 # rows of Tensors as arguments
    u = dv.hc_pre(Xt.rows(1, T), wt.rows(1, T))
    np.testing.assert_array_equal(u.numpy(), dv.hc_pre(s["X"][1:], w[1:]))
    with pytest.raises(ValueError, match="x must be a float32 Tensor, got i32"):
        dv.hc_pre(device.tensor(s["X"].astype(np.int32)).rows(0, 2), wt.rows(0, 2))


def test_hc_site_and_head_match_the_functions_and_never_touch_the_host(device, rng, monkeypatch):
    T, D = 3, 40
    s = site_arrays(rng, T, D)
    site = dv.HcSite(s["fn"], s["scale"], s["base"], hc_eps=1e-5, norm_eps=1e-6, n_iter=12, device=device)
    want = dv.hc_site_pre(s["X"], s["fn"], s["scale"], s["base"], hc_eps=1e-5, n_iter=12)
    X = device.tensor(s["X"])
    got = site.pre(X)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w)
    for g, w in zip(site.pre(s["X"]), want):                             # numpy in → numpy out
        assert isinstance(g, np.ndarray)
        np.testing.assert_array_equal(g, w)
    f = rng.uniform(-1, 1, (T, D)).astype(np.float32)
    np.testing.assert_array_equal(site.post(device.tensor(f), X, got[1], got[2]).numpy(),
                                  dv.hc_post(f, s["X"], want[1], want[2]))
    # after the first call, a call moves nothing between host and device (weights resident, results stay)
    moved = []
    monkeypatch.setattr(Buffer, "write", lambda self, *a, **k: moved.append("write"))
    monkeypatch.setattr(Buffer, "read", lambda self, *a, **k: moved.append("read"))
    for _ in range(3):
        u, p, c = site.pre(X)
        site.post(u, X, p, c)
    assert moved == []
    monkeypatch.undo()
    fn_h = (rng.uniform(-1, 1, (4, 4 * D)) / np.sqrt(4 * D)).astype(np.float32)
    scale_h, base_h = rng.uniform(-0.5, 0.5, 1).astype(np.float32), rng.uniform(-0.25, 0.25, 4).astype(np.float32)
    head = dv.HcSite.head(fn_h, scale_h, base_h, device=device)
    ref = kernels.reference_head_pre(s["X"], fn_h, scale_h, base_h)
    u = head.collapse(X)
    assert isinstance(u, dv.Tensor) and u.shape == (T, D)
    np.testing.assert_allclose(u.numpy(), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(head.collapse(s["X"]), u.numpy())
    with pytest.raises(ValueError, match=r"X must have shape \[\*, 4, 40\], got \(3, 4, 41\)"):
        site.pre(np.zeros((3, 4, 41), np.float32))
    # a site that goes away takes its cached programs (which bind its weights) with it
    owner = site._owner
    assert any(k[0] == owner for k in device.programs._idle)
    import gc
    import weakref
    ref = weakref.ref(site)
    del site
    gc.collect()
    assert ref() is None
    head.collapse(X)                                                     # the next call drops them
    assert not any(k[0] == owner for k in device.programs._idle)


def test_site_calls_refuse_bad_carries_and_outs(device, rng):
    """HcSite.pre / HcHead.collapse refuse by name: a carry that is not a MixCarry, a carry given with
    another X than the X_new it came with (same shape: its partials would be silently wrong), and an
    out= that is not 3 Tensors (1 for the collapse)."""
    T, D = 2, 16
    s1, s2 = site_arrays(rng, T, D), site_arrays(rng, T, D)
    a, b = (dv.HcSite(s["fn"], s["scale"], s["base"], device=device) for s in (s1, s2))
    head = dv.HcSite.head(np.ones((4, 4 * D), np.float32), np.ones(1), np.zeros(4), device=device)
    X = device.tensor(s1["X"])
    u, p, c = a.pre(X)
    X_new, carry = a.post(u, X, p, c, next=b)
    assert carry.partials is not None and carry.source is X_new      # (the site path carries at decode here)
    for bad in ("abc", 123):
        with pytest.raises(ValueError, match="carry must be the MixCarry a post"):
            b.pre(X_new, carry=bad)
    with pytest.raises(ValueError, match="carry belongs to the X_new its post"):
        b.pre(device.tensor(X_new.numpy()), carry=carry)
    u_carry = b.pre(X_new, carry=carry)[0].numpy()             # the X it came with: the same u as without it
    assert np.abs(u_carry - b.pre(X_new)[0].numpy()).max() <= 1e-4 * np.abs(u_carry).max()
    for out in ((device.empty((T, D)), device.empty((T, 4))), device.empty((T, D)), "abc",
                (np.zeros((T, D), np.float32),) * 3):
        with pytest.raises(ValueError, match="out must be a tuple of 3 Tensors"):
            b.pre(X_new, out=out)
    with pytest.raises(ValueError, match="out must be a Tensor"):
        head.collapse(X_new, out="abc")


@pytest.mark.parametrize("T, D", [(1, 257), (3, 40), (9, 40)])
def test_a_hand_made_carry_of_the_wrong_layout_is_refused(device, rng, T, D):
    """A MixCarry made by hand must hold partials [T, G, m + 1] with the G (D splits) a post would have
    computed: more or fewer splits would be summed into the mixes without a word."""
    from dsv4_vk.hc.composite import carry_splits
    s1, s2 = site_arrays(rng, T, D), site_arrays(rng, T, D)
    a, b = (dv.HcSite(s["fn"], s["scale"], s["base"], device=device) for s in (s1, s2))
    head = dv.HcSite.head(np.ones((4, 4 * D), np.float32), np.ones(1), np.zeros(4), device=device)
    X = device.tensor(s1["X"])
    u, p, c = a.pre(X)
    X_new, carry = a.post(u, X, p, c, next=b)
    G = carry_splits(T, D)
    assert carry.partials.shape == (T, G, 25)
    made = dv.MixCarry(b, carry.partials)                        # the right layout: taken
    assert np.array_equal(b.pre(X_new, carry=made)[0].numpy(), b.pre(X_new, carry=carry)[0].numpy())
    whole = carry.partials.numpy()
    for bad in (whole[:, :G - 1] if G > 1 else whole[:, [0, 0]], np.concatenate([whole, whole[:, :1] * 0], 1),
                whole[:, :, :24]):
        for partials in (bad, device.tensor(np.ascontiguousarray(bad))):
            with pytest.raises(ValueError, match=r"carry.partials has shape .*expected \(%d, %d, 25\)" % (T, G)):
                b.pre(X_new, carry=dv.MixCarry(b, partials))
    X_h, carry_h = a.post(u, X, p, c, next=head)
    with pytest.raises(ValueError, match=r"expected \(%d, %d, 5\)" % (T, G)):
        head.collapse(X_h, carry=dv.MixCarry(head, np.zeros((T, G + 1, 5), np.float32)))


@pytest.mark.parametrize("T, D, as_tensors", [(1, 40, True), (3, 33, False), (8, 64, True), (9, 40, True),
                                               (20, 132, False)])
def test_chained_hc_sites_carry_the_next_mixes_in_the_post(device, rng, T, D, as_tensors):
    """site1.post(..., next=site2) → (X_new, carry); site2.pre(X_new, carry=) and head.collapse(carry=)
    give what the uncarried calls give (float64 within f32 rounding, each other at NMSE ≤ 1e-7), with
    one dispatch per carried call at T ≤ CARRY_MAX_T; beyond it the post carries where the prefill
    carry runs (hc.carries) and the next pre starts from a reduction of the partials."""
    from dsv4_vk.hc.metrics import nmse
    s1, s2 = site_arrays(rng, T, D), site_arrays(rng, T, D)
    # site 2's pre scale bounded away from 0, so that its u depends visibly on its mixes (the doubled
    # partials below); a uniform(-0.5, 0.5) draw near 0 left the change at NMSE 6e-7 once
    s2["scale"] = (rng.choice([-1, 1], 3) * rng.uniform(0.3, 0.5, 3)).astype(np.float32)
    sites = [dv.HcSite(s["fn"], s["scale"], s["base"], device=device) for s in (s1, s2)]
    fn_h = (rng.uniform(-1, 1, (4, 4 * D)) / np.sqrt(4 * D)).astype(np.float32)
    head = dv.HcSite.head(fn_h, rng.uniform(-0.5, 0.5, 1), rng.uniform(-0.25, 0.25, 4), device=device)
    put = device.tensor if as_tensors else (lambda a: a)
    host = (lambda t: t.numpy()) if as_tensors else (lambda a: a)
    carried = dv.hc.carries(device, None, T, D)
    decode = T <= dv.hc.CARRY_MAX_T
    assert carried or not decode                 # (the site path carries at decode on every device here)

    def run(carry_on):
        X, carry, outs = put(s1["X"]), None, []
        for k, site in enumerate(sites):
            u, post, comb = site.pre(X, carry=carry)
            if carry_on and carry is not None and carried and decode:     # HC_SITE alone (CONT: strided
                assert [lab for lab in dv.last_run().labels if lab != "CONT"] == ["HC_SITE"], dv.last_run().labels
            f = put(0.5 * host(u) + 0.1)
            nxt = sites[k + 1] if k + 1 < len(sites) else head
            if carry_on:
                X, carry = site.post(f, X, post, comb, next=nxt)
                assert isinstance(carry, dv.MixCarry) and (carry.partials is not None) == carried
                if carried:
                    assert dv.last_run().dispatches == 1 and dv.last_run().labels == ["HC_POST"], dv.last_run().labels
            else:
                X = site.post(f, X, post, comb)
            outs += [host(u), host(X)]
        outs.append(host(head.collapse(X, carry=carry)))
        return outs
    plain, chained = run(False), run(True)
    for a, b in zip(plain, chained):
        assert np.isfinite(b).all() and np.abs(a).max() > 0.01
        assert nmse(b, a) <= 1e-7
    np.testing.assert_allclose(chained[-1], kernels.reference_head_pre(plain[-2], fn_h, head.scale.numpy(),
                                                                       head.base.numpy()), rtol=1e-4, atol=1e-5)
    X = put(s1["X"])
    X_new, carry = sites[0].post(put(s1["X"][:, 0]), X, put(np.ones((T, 4), np.float32)),
                                 put(np.eye(4, dtype=np.float32)[None].repeat(T, 0)), next=sites[1])
    if carried:                     # the pre reads the carried partials, not X, for its mixes: scaled
        doubled = dv.MixCarry(sites[1], put(2 * host(carry.partials)))     # partials change its u
        u_carry, u_doubled = host(sites[1].pre(X_new, carry=carry)[0]), host(sites[1].pre(X_new, carry=doubled)[0])
        assert nmse(u_doubled, u_carry) > 1e-5
    if carried:
        with pytest.raises(ValueError, match="carry was computed for another site"):
            head.collapse(X, carry=carry)
        with pytest.raises(ValueError, match="carry holds"):
            sites[1].pre(put(s1["X"][:1].repeat(T + 1, 0)), carry=carry)
    with pytest.raises(ValueError, match="next must be an HcSite or HcHead"):
        sites[0].post(X, X, X, X, next="site2")


def test_program_of_several_sites_is_one_submit_with_shared_resident_state(device, rng):
    T, D, n_sites = 2, 32, 3
    s = site_arrays(rng, T, D)
    sites = [dv.HcSite(s["fn"] * (k + 1), s["scale"], s["base"], device=device) for k in range(n_sites)]
    w = device.tensor((rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32))   # the user's own layer
    g = dv.Graph()
    x = g.input("X", (T, 4, D))
    wt = g.bind(w)
    for site in sites:
        u, post, comb = site.pre_graph(g, x)
        x = site.post_graph(g, g.op("MUL_MAT", u, wt), x, post, comb)
    g.output("X_new", x)
    prog = g.compile(device)
    assert prog.recording.n_dispatches >= 4 * n_sites
    X, out = device.tensor(s["X"]), device.empty((T, 4, D))
    n = prog.recording.n_submits
    handle = prog.submit({"X": X}, out={"X_new": out})                  # asynchronous: returns at once
    handle.wait()
    assert handle.done() and prog.recording.n_submits == n + 1          # N sites, one submit
    xr = s["X"]
    for k in range(n_sites):                                             # the same step through the API
        u, post, comb = dv.hc_site_pre(xr, s["fn"] * (k + 1), s["scale"], s["base"])
        f = dv.Graph()
        ff = f.op("MUL_MAT", f.input("u", u.shape), f.const(w.numpy()))
        f.output("f", ff)
        xr = dv.hc_post(dv.Executor(device).run(f, u=u)["f"], xr, post, comb)
    np.testing.assert_allclose(out.numpy(), xr, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(prog.run(X=s["X"])["X_new"], xr, rtol=1e-5, atol=1e-5)   # numpy in, read back

    # state shared between programs: one writes a bound tensor in place, another reads it
    state = device.tensor(np.ones((4,), np.float32))
    g1, g2 = dv.Graph(), dv.Graph()
    st = g1.bind(state)
    g1.op("SCALE", st, a=2.0, b=1.0, out=st)
    g2.output("y", g2.op("SCALE", g2.bind(state), a=1.0, b=0.0))
    p1, p2 = g1.compile(device), g2.compile(device)
    for _ in range(3):
        p1.replay()
    np.testing.assert_array_equal(p2.run()["y"], np.full(4, 15.0, np.float32))
    np.testing.assert_array_equal(state.numpy(), np.full(4, 15.0, np.float32))
    with pytest.raises(ValueError, match=r"is bound in 2 compiled program\(s\)"):
        state.release()                                                  # the programs still use its memory
    p1.release()
    del p2
    state.release()


def test_small_outputs_are_handed_out_again_only_once_nobody_holds_them(device, rng):
    # a program keeps the output tensors it handed out last and hands them out again once their
    # reference count says the caller dropped them: never one still held, weakly referenced or released
    import weakref
    mixes = [device.tensor(rng.uniform(-2, 2, (2, 24)).astype(np.float32)) for _ in range(3)]
    scale, base = (device.tensor(rng.uniform(-0.5, 0.5, n).astype(np.float32)) for n in (3, 24))
    want = [dv.hc_comb(m.numpy(), scale.numpy(), base.numpy()) for m in mixes]
    dv.hc_comb(mixes[0], scale, base)
    take = device.pool.take
    taken = []
    device.pool.take = lambda buckets: (taken.append(len(buckets)), take(buckets))[1]
    try:
        for _ in range(3):                                               # dropped at once: no pool round trip
            dv.hc_comb(mixes[1], scale, base)
        assert taken == []
        kept = dv.hc_comb(mixes[0], scale, base)                          # held by the caller ...
        other = dv.hc_comb(mixes[1], scale, base)
        assert other is not kept and taken == [1]                         # ... so a new one was taken
        np.testing.assert_array_equal(kept.numpy(), want[0])
        np.testing.assert_array_equal(other.numpy(), want[1])
        ref = weakref.ref(other)
        del other
        third = dv.hc_comb(mixes[2], scale, base)                         # weakly referenced: left alone
        assert ref() is None and third is not kept                        # (let go by the program, not reused)
        np.testing.assert_array_equal(third.numpy(), want[2])
        np.testing.assert_array_equal(kept.numpy(), want[0])
        third.release()                                                   # released, then dropped
        del third
        np.testing.assert_array_equal(dv.hc_comb(mixes[2], scale, base).numpy(), want[2])
    finally:
        device.pool.take = take
    # the program holds them in its size in the cache's budget
    dv.hc_comb(mixes[0], scale, base)
    cg = dv.last_run.__globals__["_local"].last()            # (a weak reference to the program)
    assert cg._outputs.hold > 0 and cg.nbytes >= cg._outputs.hold


def test_a_program_rechecks_an_argument_set_that_changed_since_its_last_run(device, rng):
    # the last run's device-tensor arguments are remembered by state (buffer, offset, shape, dtype):
    # any change is checked again, never run on the remembered copies
    g = dv.Graph()
    g.output("y", g.op("SCALE", g.input("x", (2, 3)), a=2.0, b=1.0))
    prog = g.compile(device)
    a = rng.standard_normal((4, 3)).astype(np.float32)
    x, y = device.tensor(a[:2]), device.empty((2, 3))
    for _ in range(2):
        prog.replay(x=x, out={"y": y})
        np.testing.assert_array_equal(y.numpy(), 2 * a[:2] + 1)
    rows, y2 = device.tensor(a), device.empty((2, 3))
    prog.replay(x=rows.rows(2, 4), out={"y": y2})                        # other buffer, other offset
    np.testing.assert_array_equal(y2.numpy(), 2 * a[2:] + 1)
    prog.replay(x=rows.rows(0, 2), out={"y": y2})                        # same buffer, other offset
    np.testing.assert_array_equal(y2.numpy(), 2 * a[:2] + 1)
    with pytest.raises(ValueError, match=r"out\['y'\] is a i32 Tensor of shape \(2, 3\)"):
        prog.replay(x=x, out={"y": device.empty((2, 3), np.int32)})
    prog.replay(x=x, out={"y": y})
    with pytest.raises(ValueError, match=r"input 'x' is a f32 Tensor of shape \(3, 2\)"):
        prog.replay(x=device.tensor(a[:3, :2]), out={"y": y})
    prog.replay(x=x, out={"y": y})
    x.release()
    with pytest.raises(ValueError, match="released"):
        prog.replay(x=x, out={"y": y})
    x = device.tensor(a[2:])
    prog.replay(x=x, out={"y": y})
    prog.replay({"x": a[:2]}, out={"y": y})                              # a host array among them
    np.testing.assert_array_equal(y.numpy(), 2 * a[:2] + 1)
    prog.replay(x=x, out={"y": y})
    np.testing.assert_array_equal(y.numpy(), 2 * a[2:] + 1)


# --- closed devices ---------------------------------------------------------------------------------

def test_use_after_close_raises_device_closed_never_crashes():
    code = """
    import numpy as np, dsv4_vk as dv
    dev = dv.Device()
    with dev:
        t = dev.tensor(np.ones((2, 24), np.float32))
        site = dv.HcSite(np.zeros((24, 16), np.float32), np.zeros(3, np.float32), np.zeros(24, np.float32), device=dev)
        g = dv.Graph(); g.output("y", g.op("SCALE", g.input("x", (2, 24)), a=2.0)); prog = g.compile(dev)
        prog.run(x=np.ones((2, 24), np.float32))
    dev.close(); dev.close()                     # idempotent
    uses = {"numpy": lambda: t.numpy(), "write": lambda: t.write(np.zeros((2, 24))),
            "tensor": lambda: dev.tensor([1.0]),
            "empty": lambda: dev.empty((3,)), "op on a tensor": lambda: dv.hc_comb(t, np.zeros(3), np.zeros(24)),
            "op with device=": lambda: dv.hc_comb(np.ones((2, 24)), np.zeros(3), np.zeros(24), device=dev),
            "site": lambda: site.pre(np.zeros((1, 4, 4), np.float32)), "program": lambda: prog.run(x=np.ones((2, 24))),
            "op without tokens": lambda: dv.hc_comb(np.ones((0, 24)), np.zeros(3), np.zeros(24), device=dev),
            "site without tokens": lambda: site.pre(np.zeros((0, 4, 4), np.float32)),
            "executor": lambda: dv.Executor(dev), "compile": lambda: g.compile(dev), "trim": dev.trim,
            "enter": lambda: dev.__enter__()}
    for name, use in uses.items():
        try:
            use()
        except dv.DeviceClosed as e:
            assert "was closed" in str(e), e
        else:
            raise AssertionError(f"{name} after close did not raise DeviceClosed")
    d1 = dv.default_device(); d1.close()
    d2 = dv.default_device()                     # the default device is opened again
    assert d2 is not d1 and not d2.closed
    assert dv.hc_comb(np.ones((1, 24)), np.zeros(3), np.zeros(24)).shape == (1, 4, 4)
    print("ok")
    """
    r = _run(code)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout, r.stderr[-3000:])


# --- threads --------------------------------------------------------------------------------------------

THREADS = """
import threading, numpy as np, dsv4_vk as dv
rng = np.random.default_rng(1)
dev = dv.default_device()
assert dev.is_host_visible == (not {staging})
D = 256
fn = (rng.uniform(-1, 1, (24, 4 * D)) / 10).astype(np.float32)
scale, base = rng.uniform(-0.5, 0.5, 3).astype(np.float32), rng.uniform(-0.25, 0.25, 24).astype(np.float32)
site = dv.HcSite(fn, scale, base, device=dev)
jobs = []                                   # (kind, T) per thread: same shapes, different shapes, device tensors
ex = dv.Executor(dev)                       # one executor and graph shared by threads
g = dv.Graph(); g.output("y", g.op("SCALE", g.input("x", (5, 4, D)), a=3.0, b=1.0))
for k in range(4):
    jobs += [("comb", 64), ("comb", 64 + k), ("site", 1 + k), ("pre", 2 + 3 * k), ("exec", 5)]
# every thread its own data: threads that share a program's buffers would mix them up
inputs = [rng.uniform(-2, 2, (T, 24)).astype(np.float32) if kind == "comb"
          else rng.uniform(-1, 1, (T, 4, D)).astype(np.float32) for kind, T in jobs]
def run(kind, x):
    if kind == "comb":
        return dv.hc_comb(x, scale, base)
    if kind == "pre":
        return dv.hc_pre(x, x[:, :, 0])
    if kind == "exec":
        return ex.run(g, x=x)["y"]
    u, post, comb = site.pre(dev.tensor(x))
    return np.concatenate([u.numpy().ravel(), post.numpy().ravel(), comb.numpy().ravel()])
want = [run(j[0], x) for j, x in zip(jobs, inputs)]
bad, errors = [], []
def worker(i):
    try:
        for _ in range(25):
            if not np.array_equal(run(jobs[i][0], inputs[i]), want[i]):
                bad.append(jobs[i])
    except Exception as e:
        errors.append(repr(e))
threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(jobs))]
for t in threads: t.start()
for t in threads: t.join()
assert not errors, errors
print("wrong", len(bad), sorted(set(bad)))
"""


@pytest.mark.parametrize("staging", [False, True], ids=["direct", "staging"])
def test_threads_share_a_device(staging):
    r = _run(THREADS.format(staging=staging), DSV4_VK_FORCE_STAGING="1" if staging else "0")
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    assert r.stdout.strip() == "wrong 0 []", r.stdout


def test_staging_path_runs_each_call_in_one_submit():
    # discrete GPUs: host arrays travel through mapped buffers in the run's own submit
    code = """
    import numpy as np, dsv4_vk as dv
    from dsv4_vk.hc import kernels as K
    dev = dv.default_device()
    assert not dev.is_host_visible
    submits = []
    real = dev.submit
    dev.submit = lambda *a: (submits.append(1), real(*a))[1]
    rng = np.random.default_rng(2)
    T, D = 5, 48
    X, fn = rng.uniform(-1, 1, (T, 4, D)), rng.uniform(-1, 1, (24, 4 * D)) / 20
    scale, base = rng.uniform(-0.5, 0.5, 3), rng.uniform(-0.25, 0.25, 24)
    site = dv.HcSite(fn, scale, base)
    for call in range(3):
        submits.clear()
        got = dv.hc_site_pre(X, fn, scale, base)
        n_api = len(submits)
        submits.clear()
        u, post, comb = site.pre(dev.tensor(X))
        n_site = len(submits)                       # the upload of X is a submit of its own (dev.tensor)
        for g, w in zip(got, K.reference_site_pre(X, fn, scale, base)):
            assert np.allclose(g, w, rtol=1e-4, atol=1e-5), np.abs(g - w).max()
        assert all(np.array_equal(a.numpy(), b) for a, b in zip((u, post, comb), got))
    print("submits", n_api, n_site)
    """
    r = _run(code, DSV4_VK_FORCE_STAGING="1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "submits 1 2", r.stdout


# --- memory, storage range ------------------------------------------------------------------------------

def test_memory_stays_flat_over_many_shapes():
    code = """
    import numpy as np, dsv4_vk as dv
    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * 4096
    dev = dv.default_device()
    assert dev.cache_bytes == 24 << 20
    rng = np.random.default_rng(0)
    D, peak, most = 512, 0, 0
    ex = dv.Executor(dev)
    for i, T in enumerate(range(1024, 1088)):       # 64 shapes, x = 8 MiB each
        x = rng.uniform(-1, 1, (T, 4, D)).astype(np.float32)
        w = rng.uniform(0, 1, (T, 4)).astype(np.float32)
        u = dv.hc_pre(x, w)
        assert np.allclose(u, np.einsum("ts,tsd->td", w, x), atol=1e-4)
        g = dv.Graph()                              # the executor's graphs are bounded the same way
        g.output("y", g.op("SCALE", g.input("x", x.shape), a=2.0))
        assert np.array_equal(ex.run(g, x=x)["y"], 2 * x)
        m = dev.memory_stats()
        assert m["cached_program_bytes"] + m["pool_free_bytes"] <= m["budget_bytes"], m
        most = max(most, m["allocated_bytes"])
        if i == 8:
            base = rss()
        if i > 8:
            peak = max(peak, rss() - base)
    print("growth MiB", peak >> 20, "allocated MiB at most", most >> 20)
    assert peak < 48 << 20 and most <= 256 << 20, (peak, most)
    del ex, g
    dev.trim()
    m = dev.memory_stats()
    assert m["cached_programs"] == 0 and m["pool_free_bytes"] == 0 and m["allocations"] == 0, m
    print("ok")
    """
    r = _run(code, DSV4_VK_CACHE_BYTES="24M")
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.stdout, r.stderr[-3000:])


def test_freed_ranges_of_a_memory_block_are_reused():
    # device allocations stay flat when buffers come and go in any order: holes are reused and merge
    dev = dv.Device()
    a, b, c = (Buffer(dev, 1 << 20) for _ in range(3))
    assert len(dev.arena.blocks) == 1 and a.block is b.block is c.block
    b_off = b.offset
    b.destroy()
    d = Buffer(dev, 1 << 20)
    assert d.offset == b_off and len(dev.arena.blocks) == 1
    a.destroy()
    d.destroy()                                   # [a][d] merge into one hole before c
    e = Buffer(dev, 2 << 20)
    assert e.offset == 0 and len(dev.arena.blocks) == 1
    for _ in range(200):                          # churn of mixed sizes: never a second block
        bufs = [Buffer(dev, n << 16) for n in (1, 7, 3, 12, 5)]
        for buf in bufs[::2] + bufs[1::2]:
            buf.destroy()
    assert len(dev.arena.blocks) == 1
    e.destroy()
    c.destroy()
    assert not dev.arena.blocks
    dev.close()


def test_program_cache_evicts_least_recently_used_within_the_budget():
    class Entry:
        def __init__(self, name, nbytes):
            self.name, self.nbytes, self.released = name, nbytes, False

        def release(self):
            self.released = True
    dev = dv.Device()
    dev.trim()
    dev.cache_bytes = 250
    cache = dev.programs
    a, b, c = Entry("a", 100), Entry("b", 100), Entry("c", 100)
    for key, e in (("a", a), ("b", b)):
        assert cache.acquire(key) is None                                 # a miss: the caller builds
        cache.put(key, e)
    assert cache.acquire("a") is a                                        # a hit: a is checked out ...
    assert cache.count == 1 and cache.nbytes == 100
    assert cache.acquire("a") is None                                     # ... so another caller builds its own
    cache.put("a", a)                                                     # ... and now the most recent
    assert cache.acquire("c") is None
    cache.put("c", c)                                                     # 300 > 250: b goes, not a
    assert b.released and not a.released and not c.released and cache.nbytes == 200
    assert cache.acquire("b") is None                                     # gone from the cache: built again
    dev.trim()
    assert a.released and c.released and cache.count == 0
    dev.close()


def test_cached_programs_follow_fused_flags_and_environment(device, rng, monkeypatch):
    from dsv4_vk.hc import policy
    mixes = rng.uniform(-2, 2, (3, 24)).astype(np.float32)
    scale, base = np.zeros(3, np.float32), np.zeros(24, np.float32)
    paths = {}
    for fused in (True, False, None):
        dv.hc_comb(mixes, scale, base, fused=fused, device=device)
        paths[fused] = dv.last_run().paths[0][1]
    assert paths[True].startswith("fused") and paths[False] == "unfused" and paths[None] == paths[True]
    monkeypatch.setenv("DSV4_VK_DISABLE_HC_COMB", "1")
    policy.clear()                                                        # new choices: new programs
    dv.hc_comb(mixes, scale, base, device=device)
    assert dv.last_run().paths[0][1] == "unfused"
    monkeypatch.delenv("DSV4_VK_DISABLE_HC_COMB")
    policy.clear()


def test_nothing_is_bound_past_max_storage_buffer_range(rng):
    import dataclasses
    dev = dv.Device()
    limit = dev.caps.limits.max_storage_buffer_range
    g = dv.Graph()
    g.output("y", g.op("SCALE", g.input("x", (limit // 4 + 1,)), a=2.0))
    before = dev.memory_stats()["allocations"]
    with pytest.raises(ValueError, match=f"exceeds this device's maxStorageBufferRange of {limit} bytes"):
        g.compile(dev)
    assert dev.memory_stats()["allocations"] == before                  # refused before allocating
    # a device that allows 64 KiB per binding: calls run in chunks of tokens, on numpy arrays and tensors
    small = 64 << 10
    limits = dataclasses.replace(dev.caps.limits, max_storage_buffer_range=small)
    dev.caps = dataclasses.replace(dev.caps, limits=limits)
    T = 2000                                                              # mixes: 192000 bytes
    mixes = rng.uniform(-2, 2, (T, 24)).astype(np.float32)
    scale, base = rng.uniform(-0.5, 0.5, 3).astype(np.float32), rng.uniform(-0.25, 0.25, 24).astype(np.float32)
    got = dv.hc_comb(mixes, scale, base, device=dev)
    np.testing.assert_array_equal(got, dv.hc_comb(mixes, scale, base))   # unsplit, on the default device
    t_got = dv.hc_comb(dev.tensor(mixes), scale, base)                    # tensors: chunks copied on the device
    np.testing.assert_array_equal(t_got.numpy(), got)
    X = rng.uniform(-1, 1, (300, 4, 32)).astype(np.float32)              # 512 B per token: 128 tokens per chunk
    w = rng.uniform(0, 1, (300, 4)).astype(np.float32)
    u = dev.empty((300, 32))
    assert dv.hc_pre(dev.tensor(X), w, out=u) is u
    np.testing.assert_array_equal(u.numpy(), dv.hc_pre(X, w))
    pipe = dev.pipelines.get("unary", 2, {"OP_SCALE": 1}, (64,))
    big = dev.pool.alloc(small * 2)
    with pytest.raises(ValueError, match=f"binding 0 would span {2 * small} bytes, past this device's "
                                         f"maxStorageBufferRange of {small}"):
        dev.pipelines.descriptor_set(pipe, [big, big])
    dev.close()


@pytest.mark.parametrize("spin_us", ["1", "1000000", "-"])
def test_fence_polling_then_sleeping_gives_the_same_results(spin_us, rng, monkeypatch):
    """Device.wait polls the fence for DSV4_VK_SPIN_US (1 µs: the run outlasts it, so the wait ends
    asleep in vkWaitForFences; 1 s: it ends while polling), then sleeps; unset: the device's default."""
    from dsv4_vk.vk.device import DEFAULT_SPIN_US
    if spin_us == "-":
        monkeypatch.delenv("DSV4_VK_SPIN_US", raising=False)
    else:
        monkeypatch.setenv("DSV4_VK_SPIN_US", spin_us)
    x = rng.uniform(-1, 1, (37, 4, 300)).astype(np.float32)
    w = rng.uniform(0, 1, (37, 4)).astype(np.float32)
    with dv.Device() as dev:
        default = 0 if dev.caps.type == "cpu" else DEFAULT_SPIN_US
        assert dev.spin_ns == 1000 * (default if spin_us == "-" else int(spin_us))
        for _ in range(3):
            u = dv.hc_pre(dev.tensor(x), dev.tensor(w)).numpy()
            ref = kernels.reference_pre(x, w)
            assert np.abs(u - ref).max() <= 1e-5 and np.abs(ref).max() > 0.1


# --- environment switches ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["DSV4_VK_VALIDATION", "DSV4_VK_FORCE_STAGING", "DSV4_VK_CACHE_BYTES", "DSV4_VK_SPIN_US",
                                  "DSV4_VK_DISABLE_COOPMAT"])
def test_device_switches_reject_junk(name, monkeypatch):
    monkeypatch.setenv(name, "maybe")
    with pytest.raises(ValueError, match=f"environment variable {name}='maybe' is not understood"):
        dv.Device()


def test_other_switches_reject_junk(monkeypatch):
    from dsv4_vk.core import profile
    from dsv4_vk.hc import policy
    monkeypatch.setenv("DSV4_VK_PROFILE", "2")
    monkeypatch.setattr(profile, "_env_flag", None)      # read once per process: read it again here
    with pytest.raises(ValueError, match="DSV4_VK_PROFILE='2' is not understood"):
        profile.active()
    monkeypatch.delenv("DSV4_VK_PROFILE")
    for name in ("DSV4_VK_DISABLE_HC", "DSV4_VK_DISABLE_HC_COMB", "DSV4_VK_DISABLE_HC_PRE", "DSV4_VK_DISABLE_HC_POST"):
        monkeypatch.setenv(name, "nope")
        with pytest.raises(ValueError, match=f"{name}='nope' is not understood"):
            policy.disabled_by("HC_" + name.rsplit("_", 1)[1] if name != "DSV4_VK_DISABLE_HC" else "HC_COMB")
        monkeypatch.delenv(name)
    monkeypatch.setenv("DSV4_VK_HC_COMB_VARIANT", "sg99")
    with pytest.raises(ValueError, match="DSV4_VK_HC_COMB_VARIANT='sg99' is not understood"):
        policy.forced_variant()
    monkeypatch.setenv("DSV4_VK_DEVICE", "no-such-gpu")
    with pytest.raises(dv.VulkanUnavailable, match="DSV4_VK_DEVICE='no-such-gpu' matches no device"):
        dv.Device()


@pytest.mark.parametrize("raw, value", [("", 1 << 30), ("123", 123), ("64M", 64 << 20), ("2 GiB", 2 << 30),
                                        ("16kb", 16 << 10)])
def test_byte_sizes_parse(raw, value, monkeypatch):
    from dsv4_vk.vk import env
    monkeypatch.setenv("DSV4_VK_CACHE_BYTES", raw)
    assert env.byte_size("DSV4_VK_CACHE_BYTES", 1 << 30) == value


@pytest.mark.parametrize("raw", ["-1", "1.5G", "12 parsecs", "1e9"])
def test_byte_sizes_reject_junk(raw, monkeypatch):
    from dsv4_vk.vk import env
    monkeypatch.setenv("DSV4_VK_CACHE_BYTES", raw)
    with pytest.raises(ValueError, match="DSV4_VK_CACHE_BYTES"):
        env.byte_size("DSV4_VK_CACHE_BYTES", 1)


# --- the docs ---------------------------------------------------------------------------------------------

DOC_CHECK = """
# appended by the test: the same loop in float64 from the initial state, against the device's result
from dsv4_vk.hc import kernels as K
from dsv4_vk.ops import get_op
kv_write, attention = get_op("KV_WRITE").reference, get_op("ATTENTION").reference
cs, sn = rope_tables(D, C)
ref_x = X0.astype(np.float64)
caches = [(np.zeros((C, 1, 1, D)), np.zeros((C, 1, 1, D))) for _ in layers]
for t in range(STEPS):
    for (site, wq, wk, wv, wo, _, _), (kc, vc) in zip(layers, caches):
        u, post, comb = K.reference_site_pre(ref_x, site.fn.numpy(), site.scale.numpy(), site.base.numpy())
        kc[:] = kv_write(kc, (u @ wk.numpy().T.astype(np.float64)).reshape(1, 1, 1, D), [t], cs, sn, rotate=1)
        vc[:] = kv_write(vc, (u @ wv.numpy().T.astype(np.float64)).reshape(1, 1, 1, D), [t], cs, sn, rotate=0)
        a = attention((u @ wq.numpy().T).reshape(1, 1, D), kc.reshape(C, 1, D), vc.reshape(C, 1, D), [t], cs, sn,
                      scale=1 / np.sqrt(D))
        ref_x = K.reference_post(a.reshape(1, D) @ wo.numpy().T, ref_x, post, comb)
ref_h = K.reference_head_pre(ref_x, head.fn.numpy(), head.scale.numpy(), head.base.numpy())
err_x = np.abs(X.numpy() - ref_x).max() / np.abs(ref_x).max()
err_h = np.abs(h.numpy() - ref_h).max() / np.abs(ref_h).max()
assert err_x < 1e-4 and err_h < 1e-4, (err_x, err_h)
print("reference ok", err_x, err_h)
"""


def test_library_doc_example_runs_and_matches_a_float64_loop():
    text = open(os.path.join(ROOT, "docs", "library.md")).read()
    blocks = text.split("```python\n")[1:]
    assert len(blocks) == 1, "docs/library.md should hold one runnable python example"
    code = blocks[0].split("```")[0]
    # keep the device open after the loop, and remember the streams before it, for the check below
    for old, new in (("with dv.Device() as dev:", "if True:\n    dev = dv.Device()"),
                     ("    step = g.compile(dev)\n", "    step = g.compile(dev)\n    X0 = X.numpy()\n")):
        assert old in code, f"the example changed: {old!r} not found"
        code = code.replace(old, new)
    r = _run(code + DOC_CHECK)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "decode loop ok: 12 submits" in r.stdout and "reference ok" in r.stdout, r.stdout
    plain = _run(blocks[0].split("```")[0])                          # and as printed, closing its device
    assert plain.returncode == 0 and "decode loop ok" in plain.stdout, plain.stderr[-3000:]
