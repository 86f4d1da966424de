"""V4_GATE's cases (tests/v4_gate_cases.py) at lavapipe subgroup size 8 in this process and at 4 and
16 in subprocesses (LP_NATIVE_VECTOR_WIDTH is read when a process creates its Vulkan instance): the
workgroup reductions and the ranking's subgroups differ at each size."""
import os
import subprocess
import sys

import pytest

from v4_gate_cases import *  # noqa: F401,F403  (the cases run here too)

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("width,subgroup", [(128, 4), (512, 16)])
def test_v4_gate_at_another_subgroup_size(width, subgroup):
    code = "from dsv4_vk.vk import default_device; print('subgroup', default_device().subgroup_size)"
    env = dict(os.environ, LP_NATIVE_VECTOR_WIDTH=str(width))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert f"subgroup {subgroup}" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.join(HERE, "v4_gate_cases.py")],
                       cwd=os.path.dirname(HERE), env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and " passed" in r.stdout and "failed" not in r.stdout, (r.stdout + r.stderr)[-4000:]
