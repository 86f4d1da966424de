"""Build hook: the wheel carries the shader sources and prebuilt SPIR-V for every declared variant.

`build_py` copies `shaders/*.comp|*.glsl` into `dsv4_vk/shaders/` and compiles every variant that the
shaders' `//! variants:` lines declare into `dsv4_vk/spirv/` (with a manifest of source hashes), using
`dsv4_vk/vk/shader.py` itself, loaded without importing the package (which needs the Vulkan loader).
Building therefore needs `glslangValidator`; running the installed wheel does not.
"""
import importlib.util
import shutil
import sys
import types
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _shader_module():
    """dsv4_vk/vk/shader.py as a module of a stand-in package (its only import is `.errors`)."""
    pkg = types.ModuleType("_dsv4_vk_build")
    pkg.__path__ = [str(ROOT / "dsv4_vk" / "vk")]
    sys.modules["_dsv4_vk_build"] = pkg
    spec = importlib.util.spec_from_file_location("_dsv4_vk_build.shader", ROOT / "dsv4_vk" / "vk" / "shader.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


class BuildWithShaders(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):        # `pip install -e .`: shaders are read from the source tree
            return
        pkg = Path(self.build_lib) / "dsv4_vk"
        shaders = pkg / "shaders"
        shaders.mkdir(parents=True, exist_ok=True)
        for src in sorted((ROOT / "shaders").iterdir()):
            if src.suffix in (".comp", ".glsl"):
                shutil.copy2(src, shaders / src.name)
        shader = _shader_module()
        shader.PACKAGE_DIR = pkg                # compile from the copies that ship
        manifest = shader.prebuild(pkg / "spirv")
        print(f"dsv4_vk: prebuilt {len(manifest['variants'])} SPIR-V variants into {pkg / 'spirv'}")


setup(cmdclass={"build_py": BuildWithShaders})
