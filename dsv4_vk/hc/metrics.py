"""Error measures shared by the tests and the eval harness."""
import numpy as np


def nmse(actual, expected, scale=None):
    """Σ(a−b)² / Σb² over finite positions (0 when both are all zero).

    scale: for a sum whose terms may cancel, the sum of |terms| (same shape): the denominator becomes
    Σscale², so a result that cancels to near zero is not held to a relative error it cannot have.
    Where nothing cancels scale = |b| and the two agree."""
    a = np.asarray(actual, np.float64)
    b = np.asarray(expected, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"nmse: shapes differ {a.shape} vs {b.shape}")
    m = np.isfinite(a) & np.isfinite(b)
    s = b if scale is None else np.broadcast_to(np.asarray(scale, np.float64), b.shape)
    den = float(np.sum(s[m] ** 2))
    num = float(np.sum((a[m] - b[m]) ** 2))
    return num / den if den > 0 else num


def max_abs(actual, expected):
    a = np.asarray(actual, np.float64)
    b = np.asarray(expected, np.float64)
    m = np.isfinite(a) & np.isfinite(b)
    return float(np.max(np.abs(a[m] - b[m]))) if m.any() else 0.0


def nonfinite_mismatch(actual, expected):
    """Number of positions where NaN/inf placement differs."""
    a = np.asarray(actual, np.float64)
    b = np.asarray(expected, np.float64)
    return int(np.sum(np.isnan(a) != np.isnan(b)) + np.sum(np.isinf(a) != np.isinf(b)))
