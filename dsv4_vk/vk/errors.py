"""Errors of the Vulkan layer. Each message names the cause and the fix. `path_problem` words an
OSError on a path the user gave, for every layer that opens one."""
import errno
import os


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


def path_problem(path, e: OSError) -> str:
    """Why `path` could not be opened (`e`), in words: a symbolic link loop, a link to nothing, no
    permission, a directory, rather than the C library's text alone (ELOOP and a dangling link
    otherwise read as "No such file or directory" in some readers)."""
    if e.errno == errno.ELOOP:
        return "a symbolic link loop: too many levels of symbolic links"
    try:
        if e.errno == errno.ENOENT and os.path.islink(path):
            return f"a symbolic link to {os.readlink(path)!r}, which does not exist"
    except OSError:
        pass
    if e.errno in (errno.EACCES, errno.EPERM):
        return "permission denied: this user may not read it"
    if e.errno == errno.EISDIR:
        return "a directory, not a file"
    return e.strerror or str(e)
