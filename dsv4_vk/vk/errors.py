"""Errors of the Vulkan layer. Each message names the cause and the fix."""


class VulkanError(RuntimeError):
    """A Vulkan call failed."""


class VulkanUnavailable(VulkanError):
    """No loader, no driver or no usable device."""


class ShaderCompileError(VulkanError):
    """glslangValidator missing or a shader failed to compile."""


class DeviceClosed(VulkanError):
    """The device (or a tensor or program on it) was used after Device.close()."""


class ValidationError(VulkanError):
    """DSV4_VK_VALIDATION=1 and the Khronos validation layer reported a message for the last call."""
