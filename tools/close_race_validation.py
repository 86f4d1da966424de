"""Run tests/test_device_lifecycle.py's close race under the validation layer and print every validation
message in full (the test's assertion shows them cut)."""
import os, subprocess, sys, textwrap
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import test_device_lifecycle as t
for run in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(t.CLOSE_RACE), "20"], capture_output=True, text=True,
                       env={**os.environ, "DSV4_VK_VALIDATION": "1"}, cwd=t.ROOT, timeout=150)
    print("run", run, "rc", r.returncode, r.stdout[-300:])
    lines = r.stderr.splitlines()
    keep = [l for l in lines if "destroy" in l.lower() or "VUID" in l or "Error" in l or "error" in l]
    print("\n".join(keep[-40:]) if keep else r.stderr[-3000:])
