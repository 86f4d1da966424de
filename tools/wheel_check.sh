#!/usr/bin/env bash
# The wheel as a user gets it: build it from a clean copy of the committed tree, install it into a
# fresh virtual environment outside the source tree, hide glslangValidator and any SPIR-V cache,
# then run the HC ops against the float64 reference (eval --quick) and a short model generation.
#   bash tools/wheel_check.sh [PYTHON]        (PYTHON builds the venv; default python3)
set -euo pipefail
PY=${1:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/dsv4_vk_wheel.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

git -C "$ROOT" archive --format=tar HEAD | (mkdir -p "$WORK/src" && tar -x -C "$WORK/src")
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
"$WORK/venv/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps "$WORK/src" -w "$WORK/dist"
"$WORK/venv/bin/python" -m pip install -q --disable-pip-version-check "$WORK"/dist/dsv4_vk-*.whl

mkdir -p "$WORK/run" "$WORK/cache" "$WORK/bin"
for tool in tail ls rm; do ln -s "$(command -v $tool)" "$WORK/bin/$tool"; done
cd "$WORK/run"                                   # nothing of the source tree on sys.path
export PATH="$WORK/venv/bin:$WORK/bin"           # no glslangValidator on PATH
export DSV4_VK_CACHE_DIR="$WORK/cache"           # no SPIR-V compiled earlier
unset DSV4_VK_GLSLANG || true
python - <<'PY'
import shutil, sys
import dsv4_vk
from dsv4_vk.vk import shader
assert shutil.which("glslangValidator") is None, "glslangValidator should be hidden"
assert "site-packages" in dsv4_vk.__file__, dsv4_vk.__file__
assert shader.PREBUILT_DIR.is_dir() and shader.shader_dir().is_relative_to(shader.PACKAGE_DIR)
print("dsv4_vk", dsv4_vk.__version__, "from", dsv4_vk.__file__)
PY
dsv4_vk --version
dsv4_vk eval --quick | tail -1
dsv4_vk demo --tokens 4 --prompt 4 --no-profile
test -z "$(ls -A "$WORK/cache")" || { echo "SPIR-V was compiled instead of taken from the wheel:"; ls "$WORK/cache"; exit 1; }
echo "wheel check: ok"
