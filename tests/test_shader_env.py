"""DSV4_VK_GLSLANG and DSV4_VK_CACHE_DIR junk: a ShaderCompileError that names the variable, its value
and what is expected, never a raw OS error. Each case runs in a fresh interpreter (the compiler is
looked up once per process) with a fresh cache directory, so the shader really has to be compiled."""
import json
import os
import stat
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = """
import json
from dsv4_vk.vk import compile_shader
try:
    spv = compile_shader("binary", {"OP_ADD": 1})
    print(json.dumps({"type": None, "spirv": spv[:4].hex()}))
except Exception as e:
    print(json.dumps({"type": type(e).__name__, "message": str(e)}))
"""


def _compile(tmp_path, **env):
    """Compile one shader in a child process; {"type": exception name or None, "message" | "spirv"}."""
    e = {**os.environ, "DSV4_VK_CACHE_DIR": str(tmp_path / "fresh-cache"), **env}
    e["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    # cwd is the test's own directory: a relative DSV4_VK_CACHE_DIR must not land in the source tree
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=e, cwd=tmp_path,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip(), f"child crashed:\n{r.stderr[-3000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def _script(path, body):
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("value, what", [("{tmp}/no-such-glslang", "does not exist"),
                                         ("nan", "no command of that name on PATH")])
def test_missing_glslang_is_named(tmp_path, value, what):
    value = value.format(tmp=tmp_path)
    got = _compile(tmp_path, DSV4_VK_GLSLANG=value)
    assert got["type"] == "ShaderCompileError", got
    assert f"DSV4_VK_GLSLANG={value!r}" in got["message"] and what in got["message"]


@pytest.mark.parametrize("kind", ["plain file", "directory"])
def test_non_executable_glslang_is_named(tmp_path, kind):
    target = tmp_path / "glslang"
    if kind == "directory":
        target.mkdir()
    else:
        target.write_text("not a program")
        target.chmod(stat.S_IRUSR | stat.S_IWUSR)
    got = _compile(tmp_path, DSV4_VK_GLSLANG=str(target))
    assert got["type"] == "ShaderCompileError", got
    assert f"DSV4_VK_GLSLANG={str(target)!r}" in got["message"] and "not an executable file" in got["message"]


@pytest.mark.parametrize("program, what", [("/bin/false", "exited with status 1"), ("/bin/true", "printed nothing"),
                                           ("silent", "printed nothing")])
def test_glslang_that_does_not_work_is_named(tmp_path, program, what):
    if program == "silent":
        # answers --version like glslangValidator, then fails every compile without a word
        program = _script(tmp_path / "silent", '[ "$1" = --version ] && echo "Glslang Version: fake" && exit 0\n'
                                                "exit 1\n")
    got = _compile(tmp_path, DSV4_VK_GLSLANG=program)
    assert got["type"] == "ShaderCompileError", got
    assert f"DSV4_VK_GLSLANG={program!r}" in got["message"] and what in got["message"]


@pytest.mark.parametrize("value", ["", "  "])
def test_blank_glslang_means_unset(tmp_path, value):
    got = _compile(tmp_path, DSV4_VK_GLSLANG=value)
    assert got == {"type": None, "spirv": "03022307"}
    # ... and so, with nothing on PATH, the error is the one for no glslangValidator at all
    got = _compile(tmp_path, DSV4_VK_GLSLANG=value, PATH=str(tmp_path / "empty-path"))
    assert got["type"] == "ShaderCompileError" and "glslangValidator was not found on PATH" in got["message"]


@pytest.mark.parametrize("length", [300, 100_000])
def test_overlong_cache_dir_is_named(tmp_path, length):
    value = str(tmp_path / ("c" * length)) if length < 1000 else "x" * length     # absolute / relative
    got = _compile(tmp_path, DSV4_VK_CACHE_DIR=value)
    assert got["type"] == "ShaderCompileError", got
    msg = got["message"]
    assert "DSV4_VK_CACHE_DIR=" in msg and "too long" in msg and "directory" in msg
    assert len(msg) < 600 and f"{len(value)} characters" in msg                    # the value, truncated


def test_cache_dir_under_a_file_names_the_file(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    for value in (str(blocker / "sub" / "cache"), str(blocker)):
        got = _compile(tmp_path, DSV4_VK_CACHE_DIR=value)
        assert got["type"] == "ShaderCompileError", got
        assert f"DSV4_VK_CACHE_DIR={value!r}" in got["message"]
        assert f"{blocker} is a file, not a directory" in got["message"]


def test_compiler_output_that_is_not_spirv_is_refused(tmp_path):
    """Fresh compiler output is checked as the cache's entries are: never used, never cached."""
    program = _script(tmp_path / "junk", '[ "$1" = --version ] && echo "Glslang Version: fake" && exit 0\n'
                                          'while [ $# -gt 0 ]; do [ "$1" = -o ] && echo junk > "$2"; shift; done\n')
    got = _compile(tmp_path, DSV4_VK_GLSLANG=program)
    assert got["type"] == "ShaderCompileError", got
    assert f"DSV4_VK_GLSLANG={program!r}" in got["message"] and "not a SPIR-V compute shader" in got["message"]
    assert not list((tmp_path / "fresh-cache").glob("binary-*"))


HUNG_CHILD = """
import json, time
from dsv4_vk.vk import shader
shader.COMPILE_TIMEOUT_S = 1.0
t0 = time.monotonic()
try:
    shader.compile_shader("binary", {"OP_ADD": 1})
    print(json.dumps({"type": None}))
except Exception as e:
    print(json.dumps({"type": type(e).__name__, "message": str(e), "s": time.monotonic() - t0}))
"""


def test_a_hung_compile_is_killed_with_its_process_group(tmp_path):
    """A compiler that never finishes (here a script whose child holds the output pipes open) is killed
    after COMPILE_TIMEOUT_S, its children too: an error naming it, not a hang."""
    pid_file = tmp_path / "grandchild.pid"
    program = _script(tmp_path / "hang", '[ "$1" = --version ] && echo "Glslang Version: fake" && exit 0\n'
                                          f'sleep 600 & echo $! > {pid_file}\nwait\n')
    e = {**os.environ, "DSV4_VK_CACHE_DIR": str(tmp_path / "cache"), "DSV4_VK_GLSLANG": program}
    e["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    r = subprocess.run([sys.executable, "-c", HUNG_CHILD], capture_output=True, text=True, env=e, cwd=tmp_path,
                       timeout=120)
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["type"] == "ShaderCompileError" and got["s"] < 30, got
    assert f"DSV4_VK_GLSLANG={program!r}" in got["message"]
    assert "did not finish" in got["message"] and "within 1 s and was killed with its process group" in got["message"]
    pid = int(pid_file.read_text())
    try:                                       # gone, or a zombie waiting for init to reap it
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        state = "gone"
    assert state in ("gone", "Z"), state


@pytest.mark.parametrize("kind, what", [("loop", "cannot be opened: a symbolic link loop"),
                                        ("dangling", "cannot be opened: a symbolic link to '/nonexistent/glslang'")])
def test_glslang_link_loop_or_dangling_link_says_so(tmp_path, kind, what):
    link = tmp_path / "glslang"
    link.symlink_to(link if kind == "loop" else "/nonexistent/glslang")
    got = _compile(tmp_path, DSV4_VK_GLSLANG=str(link))
    assert got["type"] == "ShaderCompileError", got
    assert f"DSV4_VK_GLSLANG={str(link)!r} {what}" in got["message"], got["message"]
