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


def cases_at_subgroup_size(cases_file: str, width: int, subgroup: int, timeout: int = 600) -> str:
    """Runs pytest over a cases file (tests/*_cases.py) in a child process with
    LP_NATIVE_VECTOR_WIDTH=width, after checking that lavapipe then reports subgroups of `subgroup`
    lanes; fails the test unless every case passed. Returns the child's output."""
    env = dict(os.environ, LP_NATIVE_VECTOR_WIDTH=str(width))
    code = "from dsv4_vk.vk import default_device; print('subgroup', default_device().subgroup_size)"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert f"subgroup {subgroup}" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.abspath(cases_file)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and " passed" in r.stdout and "failed" not in r.stdout, out[-4000:]
    return out
