"""A test file's worker run in a child process at another lavapipe subgroup size: LP_NATIVE_VECTOR_WIDTH
(128 / 256 / 512 → subgroups 4 / 8 / 16) takes effect only before Vulkan starts, so a child process."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker_output(test_file: str, width: int, timeout: int = 600) -> str:
    """stdout + stderr of `python test_file worker` with LP_NATIVE_VECTOR_WIDTH=width, from the
    repository root; fails the test where the worker fails."""
    env = dict(os.environ, LP_NATIVE_VECTOR_WIDTH=str(width))
    r = subprocess.run([sys.executable, os.path.abspath(test_file), "worker"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-5000:]
    return out
