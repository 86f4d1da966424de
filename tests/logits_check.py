"""What the model tests share: a model's logits against transformers' expected.npz (written by
tools/make_dsv4_fixtures.py), after a prefill and after every forced decode step."""
import numpy as np

from dsv4_vk.hc.metrics import max_abs, nmse


def logits_errors(m, e) -> list[float]:
    """Prefill e's prompt (every position's logits), then feed each forced decode token one step at
    a time; each row checked within 1e-3 of the expected row's largest magnitude. Returns the NMSE
    of every position, prompt first."""
    got = m.prefill(e["prompt"], all_logits=True)
    errs = [nmse(got[i], e["prefill"][i]) for i in range(len(got))]
    assert max_abs(got, e["prefill"]) <= 1e-3 * np.abs(e["prefill"]).max()
    for s, tok in enumerate(e["decode"]):
        row = m.step(int(tok), output="logits")
        errs.append(nmse(row, e["steps"][s]))
        assert max_abs(row, e["steps"][s]) <= 1e-3 * np.abs(e["steps"][s]).max(), f"step {s}"
    return errs
