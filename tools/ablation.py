"""Ablations for the kernel benches of tools/: a kernel timed again with parts of its shader removed
(its results wrong on purpose: only the time is read), to see where its time goes.

An ablation is a list of edits (file in shaders/, text, replacement), each text found exactly once in
the current source. A bench keeps a table {name: edits}, takes the names with a flag (`add_flags`),
checks them before any device work (`chosen`), and after its own rows runs itself once per name in a
child process (`run_children`) whose every shader compiles from a patched copy of shaders/
(`chosen` patches it in the child, before anything compiles).
"""
from __future__ import annotations

import argparse
import atexit
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

SHADERS = Path(__file__).resolve().parents[1] / "shaders"
CHILD_FLAG = "--ablation-child"
Edit = tuple[str, str, str]             # (file in shaders/, text found exactly once, replacement)

# The staged kernels' dot product of a uvec4 of codes with its x vec4s (weights.glsl q_wide_dot_fast,
# called only by the -D X_SHARED kernels of mul_mat.comp and mul_mat_id.comp; not by their FP8
# shared expert beside FP4 ones). nodecode: the uvec4's four code words taken as floats as they are,
# in place of each word's 4 (FP8) or 8 (FP4) decoded weights (rotated from word to word), the
# products unchanged; nofma: no decode, x reads or products, the four words xor-ed into the sum
# (scaled as before).
_ROTATED = "uintBitsToFloat(uvec4(v[c], v[(c + 1u) & 3u], v[(c + 2u) & 3u], v[(c + 3u) & 3u]))"
# nocvt: the bit decode kept but each half pair read as two floats by moving bits (two integer operations)
# instead of converting it (unpackHalf2x16: two half-to-float conversions): beside nodecode, it says whether
# the conversions or the bit operations cost the time (q_fp8_word / q_fp4_word: the staged kernels only,
# the FP8 shared expert beside FP4 ones included)
_WORDS = ["    vec2 a = unpackHalf2x16(((v << 7) & 0x3F803F80u) | ((v << 8) & 0x80008000u));",
          "    vec2 b = unpackHalf2x16(((v >> 1) & 0x3F803F80u) | (v & 0x80008000u));",
          "    vec2 a = unpackHalf2x16((e << 8) & 0x8E008E00u);",
          "    vec2 b = unpackHalf2x16((o << 8) & 0x8E008E00u);",
          "    vec2 c = unpackHalf2x16(e & 0x8E008E00u);",
          "    vec2 d = unpackHalf2x16(o & 0x8E008E00u);"]
_NOCVT = ("vec2 nocvt_pair(uint u) { return vec2(uintBitsToFloat(u << 16), uintBitsToFloat(u & 0xFFFF0000u)); }\n"
          "vec4 q_fp8_word(uint v) {")
STAGED_DOT: dict[str, list[Edit]] = {
    "nocvt": [("weights.glsl", "vec4 q_fp8_word(uint v) {", _NOCVT)] +
             [("weights.glsl", line, line.replace("unpackHalf2x16(", "nocvt_pair(")) for line in _WORDS],
    "nodecode": [("weights.glsl", "        vec4 w = q_fp8_word(v[c]), x = xv[c];\n",
                  f"        vec4 w = {_ROTATED}, x = xv[c];\n"),
                 ("weights.glsl", "        vec4 lo, hi;\n        q_fp4_word(v[c], lo, hi);\n",
                  f"        vec4 lo = {_ROTATED}, hi = lo.wzyx;\n")],
    "nofma": [("weights.glsl", "float q_wide_dot_fast(uvec4 v, vec4 xv[Q_XV]) {\n",
               "float q_wide_dot_fast(uvec4 v, vec4 xv[Q_XV]) { return uintBitsToFloat(v.x ^ v.y ^ v.z ^ v.w); }\n"
               "float q_wide_dot_fast_ablated(uvec4 v, vec4 xv[Q_XV]) {\n")],
}


def add_flags(ap: argparse.ArgumentParser, flag: str, table: dict[str, list[Edit]], what: str,
              other_modes: str = "") -> None:
    """The bench's flag taking comma-separated ablation names, and the hidden one of its children
    (`other_modes`: the help's words on the names valid in the bench's other modes, if any)."""
    ap.add_argument(flag, default="", help=f"after the table, {what} again with parts removed, each in a "
                    f"child process (its results wrong on purpose: only the time is read): {','.join(table)}"
                    f"{other_modes}")
    ap.add_argument(CHILD_FLAG, default="", help=argparse.SUPPRESS)


def chosen(flag: str, names: str, child: str, table: dict[str, list[Edit]]) -> list[str]:
    """The names given with `flag` (SystemExit naming the unknown ones and the valid ones); in a child
    (`child`, its ablation's name) every shader compiled from here on comes from the patched copy."""
    out = [n for n in names.split(",") if n]
    unknown = sorted(set(out + ([child] if child else [])) - set(table))
    if unknown:
        raise SystemExit(f"{flag}: unknown ablation(s) {unknown}; expected names from {list(table)}")
    if child:
        from dsv4_vk.vk import shader
        tmp = patched_shaders(child, table[child])
        atexit.register(shutil.rmtree, tmp.parent, True)
        shader.shader_dir = lambda: tmp
        shader.SHADER_DIR = tmp
    return out


def patched_shaders(name: str, edits: Sequence[Edit], dest: Path | None = None) -> Path:
    """A copy of shaders/ (in `dest`, else a new temporary directory) with the edits applied, each text
    found exactly once (else SystemExit naming the file and the text); the copy's directory."""
    tmp = (dest if dest is not None else Path(tempfile.mkdtemp())) / "shaders"
    shutil.copytree(SHADERS, tmp)
    for file, text, replacement in edits:
        path = tmp / file
        source = path.read_text()
        if source.count(text) != 1:
            raise SystemExit(f"ablation {name}: {file} holds {text!r} {source.count(text)} times, not once; "
                             "update the ablation to the current source")
        path.write_text(source.replace(text, replacement))
    return tmp


def run_children(script: str, names: Sequence[str], argv: Sequence[str], drop: Sequence[str],
                 extra: Sequence[str], is_row: Callable[[str], bool], timeout: float = 900) -> dict:
    """Each ablation in a child process `script` with the parent's argv less the flags in `drop` (those
    taking a value: the children set their own), then `extra`; the child's rows (lines is_row accepts)
    printed after `ablation NAME`; {name: the child's --json document, or {"error": its stderr's end}}."""
    keep: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a in drop:
            skip = True
        elif a.split("=")[0] not in drop:
            keep.append(a)
    out = {}
    for name in names:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            cmd = [sys.executable, script, *keep, *extra, CHILD_FLAG, name, "--json", f.name]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                proc = subprocess.CompletedProcess(cmd, -1, "", f"timed out after {timeout} s")
            for line in proc.stdout.splitlines():
                if is_row(line):
                    print(f"ablation {name:8s} {line}", flush=True)
            if proc.returncode:
                print(f"ablation {name} FAILED: {proc.stderr[-1500:]}", flush=True)
                out[name] = {"error": proc.stderr[-1500:]}
            else:
                out[name] = json.loads(Path(f.name).read_text())
    return out
