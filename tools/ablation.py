"""What the ablation tools (tools/ablate_*.py) share: a measurement run once per ablation, each in a
subprocess of its own whose shaders/ is a copy with source lines replaced (the results are wrong on
purpose: only the time is read) and whose Python may set layout knobs first, so that every
pipeline is built from the patched source.

An ablation is [(shader file, text, replacement), ...] or ([...], "Python run in the child first").
A replaced line that dead-code elimination removes takes its inputs with it.
"""
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def prepare(name, ablation):
    """In the child: the patched copy of shaders/ in use, then the ablation's Python."""
    patches, host = ablation if isinstance(ablation, tuple) else (ablation, "")
    tmp = Path(tempfile.mkdtemp()) / "shaders"
    shutil.copytree(ROOT / "shaders", tmp)
    for file, text, replacement in patches:
        path = tmp / file
        source = path.read_text()
        if text not in source:
            raise SystemExit(f"ablation {name}: {file} no longer contains {text!r}; update it to the current source")
        path.write_text(source.replace(text, replacement))
    from dsv4_vk.vk import shader
    shader.shader_dir = lambda: tmp
    shader.SHADER_DIR = tmp
    exec(host, {})


def main(script, table, child, report, argv=None):
    """A tool's command line: NAME ... (default: every ablation of `table`) and --flags, which reach the
    children. Each child runs `child(name, flags)` after prepare(); `report(name, completed process)`
    gets its output. (--child NAME is the children's own entry.)"""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        prepare(argv[1], table[argv[1]])
        child(argv[1], argv[2:])
        return
    flags = [a for a in argv if a.startswith("--")]
    names = [a for a in argv if not a.startswith("--")] or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        sys.exit(f"unknown ablation(s) {unknown}: expected names from {list(table)}")
    for name in names:
        report(name, subprocess.run([sys.executable, script, "--child", name, *flags], capture_output=True,
                                    text=True, timeout=300))


def run_tool(tool, args):
    """In a child: tools/<tool> run as a script with these arguments."""
    import runpy
    sys.argv = [tool, *args]
    runpy.run_path(str(ROOT / "tools" / tool), run_name="__main__")


def line_reporter(prefixes, width=0):
    """A report that prints the child's output lines starting with one of `prefixes`, each after the
    ablation's name, and the end of its error output when it failed."""
    def report(name, proc):
        for line in proc.stdout.splitlines():
            if line.startswith(tuple(prefixes)):
                print(f"{name:{width}s} {line}", flush=True)
        if proc.returncode:
            print(name, "FAILED", proc.stderr[-800:], flush=True)
    return report
