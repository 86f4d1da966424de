"""GLSL -> SPIR-V through `glslangValidator` in a subprocess, cached on disk.

The cache key hashes the shader source, every `#include`d file, the defines and the compiler's
version string, so editing a header or upgrading glslang rebuilds. Each entry stores the SPIR-V
and its sha256; an entry whose bytes do not match (truncated, corrupted) is rebuilt.
Cache directory: `DSV4_VK_CACHE_DIR`, else `$XDG_CACHE_HOME/dsv4_vk`, else `~/.cache/dsv4_vk`.
"""
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .errors import ShaderCompileError

SHADER_DIR = Path(__file__).resolve().parents[2] / "shaders"
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SPIRV_MAGIC = 0x07230203


def cache_dir():
    d = os.environ.get("DSV4_VK_CACHE_DIR")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "dsv4_vk")
    Path(d).mkdir(parents=True, exist_ok=True)
    return Path(d)


@functools.lru_cache(maxsize=None)
def compiler():
    """(path, version string) of glslangValidator, or a ShaderCompileError saying how to install it."""
    exe = os.environ.get("DSV4_VK_GLSLANG") or shutil.which("glslangValidator")
    if not exe:
        raise ShaderCompileError("glslangValidator was not found on PATH: install Debian package "
                                 "`glslang-tools` (or run `make setup`), or set DSV4_VK_GLSLANG to its path.")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True)
    return exe, out.stdout.strip()


def _sources(path, seen=None):
    """The shader file and everything it includes, recursively, as (path, text)."""
    seen = seen if seen is not None else {}
    if path in seen:
        return seen
    if not path.exists():
        raise ShaderCompileError(f"shader source {path} does not exist")
    text = path.read_text()
    seen[path] = text
    for inc in _INCLUDE.findall(text):
        _sources((path.parent / inc).resolve(), seen)
    return seen


def _define_args(defines):
    args = []
    for k, v in sorted(defines.items()):
        args.append(f"-D{k}" if v is None or v is True else f"-D{k}={v}")
    return args


def compile_shader(name, defines=None):
    """SPIR-V bytes for `shaders/<name>.comp` with `defines` ({NAME: value})."""
    defines = dict(defines or {})
    path = (SHADER_DIR / f"{name}.comp").resolve()
    exe, version = compiler()
    h = hashlib.sha256()
    for p, text in sorted(_sources(path).items()):
        h.update(p.name.encode() + b"\0" + text.encode() + b"\0")
    h.update(repr(sorted((k, str(v)) for k, v in defines.items())).encode())
    h.update(version.encode())
    key = h.hexdigest()[:32]
    spv_path = cache_dir() / f"{name}-{key}.spv"
    sum_path = spv_path.with_suffix(".sha256")
    if spv_path.exists() and sum_path.exists():
        data = spv_path.read_bytes()
        if (hashlib.sha256(data).hexdigest() == sum_path.read_text().strip() and len(data) % 4 == 0
                and len(data) >= 20 and int.from_bytes(data[:4], "little") == SPIRV_MAGIC):
            return data
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.spv"
        cmd = [exe, "-V", "--target-env", "vulkan1.2", "-S", "comp", *_define_args(defines),
               "-o", str(out), str(path)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0 or not out.exists():
            msg = (res.stdout + res.stderr).strip()
            raise ShaderCompileError(f"shader {name}.comp failed to compile with defines {defines}:\n{msg}")
        data = out.read_bytes()
    tmp_spv = spv_path.with_suffix(f".tmp{os.getpid()}")
    tmp_spv.write_bytes(data)
    os.replace(tmp_spv, spv_path)
    sum_path.write_text(hashlib.sha256(data).hexdigest())
    return data
