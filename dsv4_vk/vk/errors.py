"""Errors of the Vulkan layer. Each message names the cause and the fix."""


class VulkanError(RuntimeError):
    """A Vulkan call failed."""


class VulkanUnavailable(VulkanError):
    """No loader, no driver or no usable device."""


class ShaderCompileError(VulkanError):
    """glslangValidator missing or a shader failed to compile."""
