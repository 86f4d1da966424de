"""The one import of the `vulkan` binding, with its failure turned into an actionable error.

Everything else in dsv4_vk reaches Vulkan through this subpackage. `lib` is the raw cffi library
(calls cost ~10x less than the binding's wrappers); `ffi` builds structs.
"""
from typing import Any

from .errors import VulkanUnavailable

try:
    import vulkan as vk
    from vulkan._vulkan import ffi, lib
except OSError as e:  # the binding dlopens libvulkan.so.1 at import
    raise VulkanUnavailable(
        f"the Vulkan loader (libvulkan.so.1) could not be loaded ({e}). Install it with "
        "`apt-get install libvulkan1 mesa-vulkan-drivers` (or run `make setup`), or point "
        "LD_LIBRARY_PATH at a directory holding libvulkan.so.1.") from None
except ImportError as e:
    raise VulkanUnavailable(
        f"the Python package `vulkan` is missing ({e}): run `pip install vulkan==1.3.275.1` "
        "or `make setup`.") from None

# VkResult code -> name, for error messages (the binding raises bare classes with no text).
# The binding gives some extension error codes the wrong sign (VK_ERROR_OUT_OF_POOL_MEMORY is
# +1000069000 there, -1000069000 in the spec): every VK_ERROR_* is negative, so take -|value|.
RESULT_NAMES = {(-abs(getattr(vk, n)) if n.startswith("VK_ERROR_") else getattr(vk, n)): n for n in dir(vk)
                if (n.startswith("VK_ERROR_") or n in ("VK_TIMEOUT", "VK_NOT_READY", "VK_INCOMPLETE"))
                and isinstance(getattr(vk, n), int)}
# a Vulkan handle or struct as the cffi binding gives it (VkFence, VkCommandBuffer[1], VkSubmitInfo*, ...):
# the binding has no type information
Handle = Any
ERROR_OUT_OF_POOL_MEMORY = -1000069000
ERROR_FRAGMENTED_POOL = -12


def check(result, what):
    """Raise VulkanError for a non-success VkResult from a raw `lib` call."""
    if result != 0:
        from .errors import VulkanError
        raise VulkanError(f"{what} failed with {RESULT_NAMES.get(result, result)}")
    return result
