"""V4_GATE's cases (tests/v4_gate_cases.py) at lavapipe subgroup size 8 in this process and at 4 and
16 in subprocesses (LP_NATIVE_VECTOR_WIDTH is read when a process creates its Vulkan instance): the
workgroup reductions and the ranking's subgroups differ at each size."""
import os

import pytest

from lavapipe_child import cases_at_subgroup_size
from v4_gate_cases import *  # noqa: F401,F403  (the cases run here too)

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("width,subgroup", [(128, 4), (512, 16)])
def test_v4_gate_at_another_subgroup_size(width, subgroup):
    cases_at_subgroup_size(os.path.join(HERE, "v4_gate_cases.py"), width, subgroup)
