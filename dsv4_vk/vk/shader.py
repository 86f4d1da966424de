"""GLSL -> SPIR-V: prebuilt in the wheel, else `glslangValidator` in a subprocess, cached on disk.

Variants. Each shader declares in its header the `-D` define combinations it may be compiled with:

    //! variants: OP_ADD | OP_MUL | OP_DIV                    one axis, three alternatives
    //! variants: SG16 | ROWS4 ; - | COEFS                     two axes: their cross product (4)
    //! variants: MODE_GEMV ; TB=1,2,4 ; - | VEC4              NAME=a,b,... expands to one alternative each

An axis lists alternatives separated by `|`; an alternative is `-` (no define) or defines separated
by spaces (NAME means NAME=1). Each `//! variants:` line is the cross product of its axes (`;`), and
the shader's variants are the union of its lines (none: only the variant without defines). Only
declared variants compile: that list is what the wheel ships prebuilt, so a kernel the package
dispatches can never be missing from it. Shape-dependent values are specialization constants.

Named specialization constants. A define whose name is a specialization constant of the shader
(`layout(constant_id = N) const uint NAME = ...;` in the shader or a file it includes) is not a
compile-time define: `specialize` passes it as constant N, so one SPIR-V variant serves every value
(`LANES=32` and `LANES=8` run the same module). Hosts keep naming such knobs among a launch's
defines, so lowering, profiles and `info` show them, and the pipeline cache keys on their values.
Variant lines never list them. Defines stay for types and for features that gate an extension.

Where SPIR-V comes from, in order:
1. the prebuilt set (`dsv4_vk/spirv/`, made by `prebuild` when the wheel is built) — used when its
   recorded source hash equals the hash of the shader source found now (so an edited shader in a
   development tree is compiled again, and no glslangValidator is needed for an installed wheel);
2. the disk cache, keyed by source (with every `#include`), defines and compiler version: one file
   per entry, `<shader>-<key>.entry`, a JSON header line (the key, shader, defines, sha256 and length
   of key and SPIR-V) and the SPIR-V. An entry is used only when its header names the key it is filed
   under and its SPIR-V matches the checksum and is well formed (`spirv_problem`); any other entry
   (truncated, corrupted, another entry's file) is removed with a warning naming it and compiled
   again, and an error of that compile names it too;
3. `glslangValidator`, whose output must be well-formed SPIR-V before it is used or cached. A
   compile that runs longer than COMPILE_TIMEOUT_S is killed, with its whole process group.
Compiler: `DSV4_VK_GLSLANG` (a path, or a command name looked up on PATH; empty or blank means unset),
else `glslangValidator` on PATH. It is checked, and run with `--version` (the version is part of the
cache key, so a disk-cache hit needs it too), the first time a shader is not served from the prebuilt
set: a `DSV4_VK_GLSLANG` that does not exist, is not an executable file, cannot run, or does not answer
`--version` is an error that names it, and so is a compile that fails without printing anything.
Cache directory: `DSV4_VK_CACHE_DIR`, else `$XDG_CACHE_HOME/dsv4_vk`, else `~/.cache/dsv4_vk`. A cache
directory that cannot be written (read-only) still serves its entries and new results are kept in
memory, and so are they where the default location cannot be created (with a warning); a
`DSV4_VK_CACHE_DIR` that is not a usable directory (a file, a path through a file, a path too long,
one that cannot be created) is an error that names it.
"""
from __future__ import annotations

import concurrent.futures
import errno
import functools
import hashlib
import itertools
import json
import numbers
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

from .errors import ShaderCompileError, path_problem

PACKAGE_DIR = Path(__file__).resolve().parents[1]
PREBUILT_DIR = PACKAGE_DIR / "spirv"
MANIFEST = "manifest.json"
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
_VARIANTS = re.compile(r"^\s*//!\s*variants:(.*)$", re.M)
_SPEC_CONSTANT = re.compile(r"layout\s*\(\s*constant_id\s*=\s*(\d+)\s*\)\s*const\s+\w+\s+([A-Za-z_]\w*)")
SPIRV_MAGIC = 0x07230203
COMPILE_TIMEOUT_S = 300.0           # one glslangValidator run (the largest variant takes a few seconds)
ENTRY_SUFFIX = ".entry"
_lock = threading.Lock()
_memory: dict[str, bytes] = {}        # compiled in this process where the disk cache cannot be written


def shader_dir() -> Path:
    """Where the `.comp` sources are: inside the installed package (wheel), else the source tree."""
    packaged = PACKAGE_DIR / "shaders"
    return packaged if packaged.is_dir() else PACKAGE_DIR.parent / "shaders"


SHADER_DIR = shader_dir()


# --- variants ------------------------------------------------------------------------------------

def variant_key(defines: dict | None) -> tuple[tuple[str, str], ...]:
    """Canonical form of a define set: sorted (name, value) strings; NAME alone means NAME=1."""
    out = []
    for k, v in (defines or {}).items():
        v = "1" if v is None or v is True else str(v)
        out.append((str(k), v))
    return tuple(sorted(out))


def _alternatives(text: str, where: str) -> list[dict[str, str]]:
    alt = text.strip()
    if not alt:
        raise ShaderCompileError(f"{where}: empty alternative in a `//! variants:` line")
    if alt == "-":
        return [{}]
    choices = []
    for token in alt.split():
        name, _, values = token.partition("=")
        if not re.fullmatch(r"[A-Za-z_]\w*", name):
            raise ShaderCompileError(f"{where}: bad define {token!r} in a `//! variants:` line")
        choices.append([(name, v) for v in (values.split(",") if values else ["1"])])
    return [dict(combo) for combo in itertools.product(*choices)]


def parse_variants(text: str, where: str = "shader") -> list[tuple[tuple[str, str], ...]]:
    """Every declared variant of a shader source, as variant keys (see the module docstring)."""
    lines = _VARIANTS.findall(text)
    if not lines:
        return [()]
    out: dict[tuple, None] = {}
    for line in lines:
        axes = [[d for alt in axis.split("|") for d in _alternatives(alt, where)] for axis in line.split(";")]
        for combo in itertools.product(*axes):
            merged: dict[str, str] = {}
            for d in combo:
                merged.update(d)
            out[variant_key(merged)] = None
    return list(out)


def _source_path(name: str) -> Path:
    path = (shader_dir() / f"{name}.comp").resolve()
    if not path.exists():
        raise ShaderCompileError(f"shader source {path} does not exist")
    return path


def shader_source(name: str) -> str:
    """The text of shaders/<name>.comp (without its includes)."""
    return _source_path(name).read_text()


def declared_variants(name: str) -> list[tuple[tuple[str, str], ...]]:
    return parse_variants(shader_source(name), f"{name}.comp")


def spec_constants(name: str) -> dict[str, int]:
    """{NAME: constant_id} of every specialization constant declared in the shader or its includes
    (whichever `#if` branch declares it: a name has one id in all of them)."""
    out: dict[str, int] = {}
    for p, text in sorted(_sources(_source_path(name)).items()):
        for cid, const in _SPEC_CONSTANT.findall(text):
            if out.setdefault(const, int(cid)) != int(cid):
                raise ShaderCompileError(f"{name}.comp: specialization constant {const} is declared with "
                                         f"constant_id {out[const]} and {cid} (in {p.name})")
    return out


def specialize(name: str, defines: dict | None) -> tuple[dict, dict[int, int]]:
    """(compile-time defines, {constant_id: value}): a launch's defines split into those that pick the
    SPIR-V variant and those that are the shader's named specialization constants."""
    named = spec_constants(name)
    compiled, spec = {}, {}
    for k, v in (defines or {}).items():
        if k not in named:
            compiled[k] = v
        elif isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 0 <= int(v) < 1 << 32:
            raise ShaderCompileError(f"{name}.comp: {k}={v!r} is a specialization constant and needs an "
                                     "integer in [0, 2**32)")
        else:
            spec[named[k]] = int(v)
    return compiled, spec


def _sources(path: Path, seen: dict | None = None) -> dict[Path, str]:
    """The shader file and everything it includes, recursively, as {path: text}."""
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


def source_hash(name: str) -> str:
    """sha256 of a shader's source and every file it includes (names and text)."""
    h = hashlib.sha256()
    for p, text in sorted(_sources(_source_path(name)).items()):
        h.update(p.name.encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()


def _variant_id(name: str, key: tuple) -> str:
    return name + "|" + ",".join(f"{k}={v}" for k, v in key)


# --- glslang ---------------------------------------------------------------------------------------

def _shown(value: str, limit: int = 120) -> str:
    """repr of an environment value for a message; a huge one is cut, with its length."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


def _named_compiler(raw: str) -> str:
    """DSV4_VK_GLSLANG's value as an absolute executable path, or an error saying what is wrong with it."""
    # a bare name is looked up on PATH, as the shell (and exec) would
    found = shutil.which(raw)
    if found:
        return os.path.abspath(found)
    where = f"DSV4_VK_GLSLANG={_shown(raw)}"
    if os.sep not in raw:
        what = "is not a path and there is no command of that name on PATH"
    elif not os.path.exists(raw):
        try:
            os.stat(raw)
            what = "does not exist"
        except OSError as e:        # a link loop or a dangling link is not "does not exist"
            what = "does not exist" if e.errno == errno.ENOENT and not os.path.islink(raw) else \
                f"cannot be opened: {path_problem(raw, e)}"
    else:
        what = "is a directory, not an executable file" if os.path.isdir(raw) else "is not an executable file"
    raise ShaderCompileError(f"{where} {what}: set it to the path of glslangValidator (Debian package "
                             "`glslang-tools`), or unset it to use the one on PATH")


_named: dict[str, str] = {}              # executable -> "the compiler named by DSV4_VK_GLSLANG=..."


def _compiler_source() -> tuple[str, str, bool]:
    """(executable, how messages name it, whether DSV4_VK_GLSLANG chose it): that variable when set, else
    glslangValidator on PATH."""
    raw = os.environ.get("DSV4_VK_GLSLANG", "")
    if raw.strip():                              # empty or blank means unset, like the other switches
        return _named_compiler(raw), f"the compiler named by DSV4_VK_GLSLANG={_shown(raw)}", True
    exe = shutil.which("glslangValidator")
    if not exe:
        raise ShaderCompileError("glslangValidator was not found on PATH: install Debian package "
                                 "`glslang-tools` (or run `make setup`), or set DSV4_VK_GLSLANG to its path.")
    return exe, f"glslangValidator ({exe})", False


def _run_compiler(args: list[str], who: str, timeout: float) -> subprocess.CompletedProcess:
    # stdin closed: a wrong program named as the compiler must not wait for input; errors="replace": nor
    # may its output, not being text, turn into a UnicodeDecodeError. Its own session: on a timeout the
    # whole process group is killed (a wrapper script's children would otherwise hold the pipes open).
    try:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                text=True, errors="replace", start_new_session=True)
    except OSError as e:
        raise ShaderCompileError(f"{who} could not run ({e.strerror or e}): expected glslangValidator") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException as e:          # the timeout, or an interrupt: leave nothing running
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.communicate()
        if isinstance(e, subprocess.TimeoutExpired):
            raise ShaderCompileError(f"{who} did not finish `{' '.join(args[1:])}` within {timeout:.0f} s and "
                                     "was killed with its process group: expected glslangValidator") from None
        raise
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


@functools.lru_cache(maxsize=None)
def compiler() -> tuple[str, str]:
    """(path, version string) of glslangValidator, or a ShaderCompileError saying how to install it (or,
    for a DSV4_VK_GLSLANG that is not a working compiler, what is wrong with it)."""
    exe, who, named = _compiler_source()
    if named:
        _named[exe] = who
    out = _run_compiler([exe, "--version"], who, timeout=60)
    version = out.stdout.strip()
    # the version is part of every cache key, so a program that does not give one cannot be used
    if out.returncode != 0 or not version:
        said = (out.stdout + out.stderr).strip()
        said = f"printed {_shown(said.splitlines()[0], 200)}" if said else "printed nothing"
        raise ShaderCompileError(f"{who} is not a working glslangValidator: `{exe} --version` exited with "
                                 f"status {out.returncode} and {said}")
    return exe, version


def _glslang(name: str, path: Path, key: tuple) -> bytes:
    exe, _ = compiler()
    who = _named.get(exe, f"glslangValidator ({exe})")
    args = [f"-D{k}={v}" for k, v in key]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.spv"
        cmd = [exe, "-V", "--target-env", "vulkan1.2", "-S", "comp", *args, "-o", str(out), str(path)]
        res = _run_compiler(cmd, who, COMPILE_TIMEOUT_S)
        if res.returncode != 0 or not out.exists():
            msg = (res.stdout + res.stderr).strip()
            if not msg:                          # nothing to show: the compiler itself is the likely fault
                msg = f"{who} exited with status {res.returncode} and printed nothing"
            elif exe in _named:                  # a compile error may be the wrong program's, not the shader's
                msg += f"\n(compiler: {who})"
            raise ShaderCompileError(f"shader {name}.comp failed to compile with defines {dict(key)}:\n{msg}")
        data = out.read_bytes()
    problem = spirv_problem(data)
    if problem:
        raise ShaderCompileError(f"{who} compiled {name}.comp with defines {dict(key)} into {len(data)} bytes that "
                                 f"are not a SPIR-V compute shader ({problem}): expected glslangValidator")
    return data


def spirv_problem(data: bytes) -> str | None:
    """What is wrong with `data` as a SPIR-V compute module (None: nothing): the header, every
    instruction's length adding up to the module's, and a GLCompute entry point."""
    if len(data) % 4 or len(data) < 20:
        return f"{len(data)} bytes: not a whole header of 4-byte words"
    words = memoryview(data).cast("I")
    if words[0] != SPIRV_MAGIC:
        return f"no SPIR-V magic number (starts {bytes(data[:4]).hex()})"
    if words[3] == 0:
        return "its id bound is 0"
    i, entry = 5, False
    while i < len(words):
        count, opcode = words[i] >> 16, words[i] & 0xFFFF
        if count == 0 or i + count > len(words):
            return f"instruction at word {i} runs past the end ({count} words)"
        entry |= opcode == 15 and count > 1 and words[i + 1] == 5          # OpEntryPoint GLCompute
        i += count
    return None if entry else "no GLCompute entry point"


def _is_spirv(data: bytes) -> bool:
    return spirv_problem(data) is None


# --- prebuilt set ----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _manifest() -> dict:
    try:
        return json.loads((PREBUILT_DIR / MANIFEST).read_text())["variants"]
    except (OSError, ValueError, KeyError):
        return {}


def _prebuilt(name: str, key: tuple, src_hash: str) -> bytes | None:
    entry = _manifest().get(_variant_id(name, key))
    if entry is None or entry.get("source") != src_hash:
        return None
    try:
        data = (PREBUILT_DIR / entry["file"]).read_bytes()
    except OSError:
        return None
    return data if hashlib.sha256(data).hexdigest() == entry.get("sha256") and _is_spirv(data) else None


def prebuild(out_dir: str | os.PathLike, jobs: int | None = None) -> dict:
    """Compile every declared variant of every shader into `out_dir` with a manifest (the wheel's
    prebuilt set). Returns the manifest."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _, version = compiler()
    work = []
    for comp in sorted(shader_dir().glob("*.comp")):
        name = comp.stem
        src = source_hash(name)
        work += [(name, comp, key, src) for key in declared_variants(name)]

    def one(item):
        name, comp, key, src = item
        data = _glslang(name, comp, key)
        file = f"{name}-{hashlib.sha256(_variant_id(name, key).encode()).hexdigest()[:16]}.spv"
        (out / file).write_bytes(data)
        return _variant_id(name, key), {"file": file, "source": src, "sha256": hashlib.sha256(data).hexdigest()}

    with concurrent.futures.ThreadPoolExecutor(jobs or os.cpu_count() or 2) as pool:
        variants = dict(pool.map(one, work))
    manifest = {"glslang": version, "variants": variants}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


# --- disk cache --------------------------------------------------------------------------------------

_warned: set[str] = set()


def _warn_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _is_dir(d: Path) -> bool:
    # Path.is_dir raises, rather than answering False, for a name too long or a parent it may not search
    try:
        return d.is_dir()
    except OSError:
        return False


def _unusable(d: Path, e: OSError) -> str:
    """Why directory `d` could not be created (`e`), in words that say what to change."""
    if e.errno == errno.ENAMETOOLONG:
        return ("its path is too long: most file systems allow 255 bytes for a name in a path and 4096 for "
                "the whole path")
    if e.errno in (errno.EEXIST, errno.ENOTDIR):
        # name the file that is in the way: it may be d itself or any directory above it
        for p in (*reversed(d.parents), d):
            try:
                mode = os.stat(p).st_mode
                if not stat.S_ISDIR(mode):
                    return f"{p} is a file, not a directory" if stat.S_ISREG(mode) else f"{p} is not a directory"
            except OSError:
                break
    return e.strerror or str(e)


def cache_dir() -> tuple[Path | None, bool]:
    """(directory, writable). (None, False) when the default location cannot be used at all."""
    explicit = os.environ.get("DSV4_VK_CACHE_DIR")
    if explicit is not None and not explicit.strip():
        raise ShaderCompileError("DSV4_VK_CACHE_DIR is set but empty: set it to a directory, or unset it")
    if explicit:
        d = Path(explicit)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = Path(base) / "dsv4_vk"
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        if explicit and not _is_dir(d):
            raise ShaderCompileError(f"DSV4_VK_CACHE_DIR={_shown(explicit)} is not a usable directory "
                                     f"({_unusable(d, e)}): point it at a writable directory, or unset it") from None
        # only the default location falls back to memory: a directory the user named must work
        _warn_once(f"shader cache {_shown(str(d))} cannot be created ({_unusable(d, e)}): compiling in memory")
        return (d if _is_dir(d) else None), False
    if not _is_dir(d):
        where = f"DSV4_VK_CACHE_DIR={_shown(explicit)}" if explicit else f"shader cache {_shown(str(d))}"
        raise ShaderCompileError(f"{where} is not a directory: point DSV4_VK_CACHE_DIR at a writable directory")
    writable = os.access(d, os.W_OK | os.X_OK)
    if not writable:
        _warn_once(f"shader cache {d} is read-only: new SPIR-V is kept in memory only")
    return d, writable


def _entry_sum(cache_key: str, data: bytes) -> str:
    """The entry's checksum: over its key and its SPIR-V, so another entry's SPIR-V does not match it
    even with a checksum of its bytes written in."""
    return hashlib.sha256(cache_key.encode() + b"\0" + data).hexdigest()


def _entry_header(cache_key: str, name: str, key: tuple, data: bytes) -> bytes:
    return json.dumps({"key": cache_key, "shader": name, "defines": dict(key), "bytes": len(data),
                       "sha256": _entry_sum(cache_key, data)}, sort_keys=True).encode() + b"\n"


def _cached(path: Path, cache_key: str, name: str, key: tuple) -> tuple[bytes | None, str | None]:
    """(SPIR-V, None) of a sound entry filed as `cache_key`; (None, None) where there is none; (None,
    what is wrong) for an entry that must not be used."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"cannot be read ({e.strerror or e})"
    head, sep, data = raw.partition(b"\n")
    try:
        meta = json.loads(head) if sep else None
    except ValueError:
        meta = None
    if not isinstance(meta, dict):
        return None, "no header line"
    if meta.get("key") != cache_key or meta.get("shader") != name:
        return None, (f"it holds the entry of {meta.get('shader')!r} {meta.get('defines')} (key {meta.get('key')!r}), "
                      f"not of {name} {dict(key)} (key {cache_key})")
    if meta.get("bytes") != len(data) or meta.get("sha256") != _entry_sum(cache_key, data):
        return None, f"its {len(data)} bytes of SPIR-V do not match its key and the checksum in its header"
    problem = spirv_problem(data)
    return (None, f"not SPIR-V: {problem}") if problem else (data, None)


def _evict(path: Path, why: str) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as e:
        why += f"; it could not be removed ({e.strerror or e})"
    warnings.warn(f"shader cache entry {path} was not used and is compiled again: {why}", RuntimeWarning,
                  stacklevel=3)


def _store(spv_path: Path, data: bytes, header: bytes = b"") -> bool:
    """Write one cache entry (atomically); False, with one warning, where the directory refuses it."""
    tmp = spv_path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
    try:
        tmp.write_bytes(header + data)
        os.replace(tmp, spv_path)
        return True
    except OSError as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        _warn_once(f"shader cache {spv_path.parent} could not be written ({e.strerror}): compiling in memory")
        return False


def compile_shader(name: str, defines: dict | None = None) -> bytes:
    """SPIR-V bytes for `shaders/<name>.comp` with `defines` ({NAME: value}), a declared variant."""
    key = variant_key(defines)
    path = _source_path(name)
    named = sorted(set(dict(key)) & set(spec_constants(name)))
    if named:
        raise ShaderCompileError(f"{name}.comp: {', '.join(named)} name specialization constants, not compile-time "
                                 "defines: their values are given when the pipeline is made (shader.specialize)")
    declared = declared_variants(name)
    if key not in declared:
        shown = ", ".join("{" + ", ".join(f"{k}={v}" for k, v in d) + "}" for d in declared[:6])
        more = f" and {len(declared) - 6} more" if len(declared) > 6 else ""
        raise ShaderCompileError(f"{name}.comp declares no variant with defines {dict(key)}: its `//! variants:` "
                                 f"header lines allow {shown}{more}")
    src = source_hash(name)
    data = _prebuilt(name, key, src)
    if data is not None:
        return data
    try:
        _, version = compiler()
    except ShaderCompileError as e:
        if _manifest():
            raise ShaderCompileError(f"{name}.comp differs from the prebuilt SPIR-V shipped with dsv4_vk (or "
                                     f"the variant is not prebuilt), so it must be compiled, but: {e}") from None
        raise
    h = hashlib.sha256(src.encode() + b"\0" + repr(key).encode() + b"\0" + version.encode())
    cache_key = h.hexdigest()[:32]
    with _lock:
        hit = _memory.get(cache_key)
    if hit is not None:
        return hit
    directory, writable = cache_dir()
    entry = directory / f"{name}-{cache_key}{ENTRY_SUFFIX}" if directory is not None else None
    bad = None
    if entry is not None:
        data, bad = _cached(entry, cache_key, name, key)
        if data is not None:
            return data
        if bad:
            _evict(entry, bad)
    try:
        data = _glslang(name, path, key)
    except ShaderCompileError as e:
        if bad:
            raise ShaderCompileError(f"{e}\n(compiling it again because the shader cache entry {entry} was "
                                     f"not usable: {bad})") from None
        raise
    if not (entry is not None and writable and _store(entry, data, _entry_header(cache_key, name, key, data))):
        with _lock:
            _memory[cache_key] = data
    return data
