"""Profiling hooks used by the executor (extended by the profiling module's owner).

`active()` tells the executor to record timestamps; `notify(stats)` receives every run's RunStats.
"""
import os

_stack = []


def active():
    return bool(_stack) or os.environ.get("DSV4_VK_PROFILE", "").lower() in ("1", "true", "yes", "on")


def notify(stats):
    for prof in _stack:
        prof.add(stats)
