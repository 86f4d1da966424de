"""The library tests again on the staging path (DSV4_VK_FORCE_STAGING=1): what a discrete GPU runs,
where device memory is not mapped (uploads, read-backs and the shared staging buffer), on lavapipe."""
import os
import subprocess
import sys
from pathlib import Path


def test_library_on_the_staging_path():
    env = {**os.environ, "DSV4_VK_FORCE_STAGING": "1"}
    here = Path(__file__).parent
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(here / "test_library.py")],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert " passed" in r.stdout and " failed" not in r.stdout
