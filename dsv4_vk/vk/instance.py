"""The Vulkan instance and the physical devices: creating the instance (with the validation layer
and its messenger where asked), probing each physical device's capabilities without a logical
device (`probe_device`, `list_devices`), and choosing one by index, name or type (`choose`: discrete GPU,
then integrated, virtual, CPU). vk.device makes the logical device on the chosen one."""
from __future__ import annotations

from .binding import check, ffi, lib, vk
from .errors import VulkanUnavailable

_TYPE_NAMES = {0: "other", 1: "integrated-gpu", 2: "discrete-gpu", 3: "virtual-gpu", 4: "cpu"}
_TYPE_RANK = {2: 0, 1: 1, 3: 2, 4: 3, 0: 4}
_SUBGROUP_OPS = [(1, "basic"), (2, "vote"), (4, "arithmetic"), (8, "ballot"), (16, "shuffle"),
                 (32, "shuffle_relative"), (64, "clustered"), (128, "quad")]
_STAGE_COMPUTE = 0x20


def _version(v):
    return f"{v >> 22}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"


def keep_alive(store, obj):
    store.append(obj)
    return obj


def create_instance(validation):
    keep = []
    app = keep_alive(keep, ffi.new("VkApplicationInfo*"))
    app.sType = vk.VK_STRUCTURE_TYPE_APPLICATION_INFO
    app.pApplicationName = keep_alive(keep, ffi.new("char[]", b"dsv4_vk"))
    app.pEngineName = app.pApplicationName
    app.apiVersion = vk.VK_MAKE_VERSION(1, 3, 0)
    info = keep_alive(keep, ffi.new("VkInstanceCreateInfo*"))
    info.sType = vk.VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO
    info.pApplicationInfo = app
    if validation:
        layers = [keep_alive(keep, ffi.new("char[]", b"VK_LAYER_KHRONOS_validation"))]
        info.enabledLayerCount = 1
        info.ppEnabledLayerNames = keep_alive(keep, ffi.new("char*[]", layers))
        exts = [keep_alive(keep, ffi.new("char[]", b"VK_EXT_debug_utils"))]
        info.enabledExtensionCount = 1
        info.ppEnabledExtensionNames = keep_alive(keep, ffi.new("char*[]", exts))
        feats = keep_alive(keep, ffi.new("VkValidationFeatureEnableEXT[]", [
            vk.VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT]))
        vf = keep_alive(keep, ffi.new("VkValidationFeaturesEXT*"))
        vf.sType = vk.VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT
        vf.enabledValidationFeatureCount = 1
        vf.pEnabledValidationFeatures = feats
        info.pNext = vf
    out = ffi.new("VkInstance*")
    res = lib.vkCreateInstance(info, ffi.NULL, out)
    if res == vk.VK_ERROR_LAYER_NOT_PRESENT:
        raise VulkanUnavailable("DSV4_VK_VALIDATION=1 but VK_LAYER_KHRONOS_validation is not installed: "
                                "`apt-get install vulkan-validationlayers`, or unset DSV4_VK_VALIDATION.")
    if res == vk.VK_ERROR_INCOMPATIBLE_DRIVER:
        raise VulkanUnavailable(
            "no Vulkan driver (ICD) was found: install `mesa-vulkan-drivers` for the lavapipe CPU device "
            "or a GPU driver; check VK_DRIVER_FILES / VK_ICD_FILENAMES if set.")
    check(res, "vkCreateInstance")
    return out[0]


_SEVERITY = {0x1: "verbose", 0x10: "info", 0x100: "warning", 0x1000: "error"}


def create_messenger(instance, sink):
    """A VK_EXT_debug_utils messenger calling sink(severity, message) for warnings and errors."""
    @ffi.callback("PFN_vkDebugUtilsMessengerCallbackEXT")
    def callback(severity, types, data, user):
        msg = ffi.string(data.pMessage).decode(errors="replace") if data.pMessage else ""
        sink(_SEVERITY.get(severity, str(severity)), msg)
        return 0
    info = ffi.new("VkDebugUtilsMessengerCreateInfoEXT*")
    info.sType = vk.VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT
    info.messageSeverity = 0x100 | 0x1000
    info.messageType = 0x1 | 0x2 | 0x4
    info.pfnUserCallback = callback
    fn = ffi.cast("PFN_vkCreateDebugUtilsMessengerEXT",
                  lib.vkGetInstanceProcAddr(instance, b"vkCreateDebugUtilsMessengerEXT"))
    out = ffi.new("VkDebugUtilsMessengerEXT*")
    check(fn(instance, info, ffi.NULL, out), "vkCreateDebugUtilsMessengerEXT")
    return out[0], callback


def physical_devices(instance):
    count = ffi.new("uint32_t*")
    res = lib.vkEnumeratePhysicalDevices(instance, count, ffi.NULL)
    if res == vk.VK_ERROR_INITIALIZATION_FAILED:
        raise VulkanUnavailable("the Vulkan driver found no usable hardware (VK_ERROR_INITIALIZATION_FAILED): "
                                "install `mesa-vulkan-drivers` for lavapipe or check the GPU driver.")
    check(res, "vkEnumeratePhysicalDevices")
    arr = ffi.new("VkPhysicalDevice[]", count[0])
    check(lib.vkEnumeratePhysicalDevices(instance, count, arr), "vkEnumeratePhysicalDevices")
    return [arr[i] for i in range(count[0])]


COOPMAT_NV, COOPMAT_KHR = b"VK_NV_cooperative_matrix", b"VK_KHR_cooperative_matrix"
# VkComponentTypeNV / KHR and VkScopeNV / KHR values (the binding leaves them None); KHR adds bf16 and
# (VK_NV_cooperative_matrix2's) e4m3 and e5m2
_COMPONENT_NAMES = {0: "f16", 1: "f32", 2: "f64", 3: "s8", 4: "s16", 5: "s32", 6: "s64", 7: "u8", 8: "u16",
                    9: "u32", 10: "u64", 1000141000: "bf16", 1000491002: "e4m3", 1000491003: "e5m2"}
_SCOPE_SUBGROUP_NV = 3


def link_chain(structs):
    """Chain Vulkan structs through pNext in order; the first (None for none)."""
    for a, b in zip(structs, structs[1:]):
        a.pNext = b
    return structs[0] if structs else None


def _extensions(pd):
    count = ffi.new("uint32_t*")
    check(lib.vkEnumerateDeviceExtensionProperties(pd, ffi.NULL, count, ffi.NULL), "vkEnumerateDeviceExtensionProperties")
    props = ffi.new("VkExtensionProperties[]", count[0])
    check(lib.vkEnumerateDeviceExtensionProperties(pd, ffi.NULL, count, props), "vkEnumerateDeviceExtensionProperties")
    return {ffi.string(props[i].extensionName) for i in range(count[0])}


def _coopmat_shapes(instance, pd, ext="NV"):
    """The subgroup-scope matrix shapes of VK_NV_cooperative_matrix (ext "NV") or VK_KHR_cooperative_matrix
    ("KHR"), as (M, N, K, A, B, C, D types); a component type past the names here as its number."""
    fname = f"vkGetPhysicalDeviceCooperativeMatrixProperties{ext}"
    fn = lib.vkGetInstanceProcAddr(instance, fname.encode())
    if fn == ffi.NULL:
        return []
    fn = ffi.cast(f"PFN_{fname}", fn)
    count = ffi.new("uint32_t*")
    check(fn(pd, count, ffi.NULL), fname)
    props = ffi.new(f"VkCooperativeMatrixProperties{ext}[]", count[0])
    for i in range(count[0]):
        props[i].sType = getattr(vk, f"VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_{ext}")
    check(fn(pd, count, props), fname)

    def name(t):
        return _COMPONENT_NAMES.get(t, str(t))
    return [{"m": q.MSize, "n": q.NSize, "k": q.KSize, "a": name(q.AType), "b": name(q.BType), "c": name(q.CType),
             "d": name(q.DType if ext == "NV" else q.ResultType)}
            for q in props[0:count[0]] if q.scope == _SCOPE_SUBGROUP_NV]


def probe_device(instance, pd):
    """Everything we want to know about a physical device, as plain Python values."""
    sg = ffi.new("VkPhysicalDeviceSubgroupProperties*")
    sg.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES
    sgc = ffi.new("VkPhysicalDeviceSubgroupSizeControlProperties*")
    sgc.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES
    sg.pNext = sgc
    drv = ffi.new("VkPhysicalDeviceDriverProperties*")
    drv.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES
    sgc.pNext = drv
    fc = ffi.new("VkPhysicalDeviceFloatControlsProperties*")
    fc.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FLOAT_CONTROLS_PROPERTIES
    drv.pNext = fc
    p2 = ffi.new("VkPhysicalDeviceProperties2*")
    p2.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2
    p2.pNext = sg
    lib.vkGetPhysicalDeviceProperties2(pd, p2)
    p = p2.properties
    lim = p.limits
    f13 = ffi.new("VkPhysicalDeviceVulkan13Features*")
    f13.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES
    f2 = ffi.new("VkPhysicalDeviceFeatures2*")
    f2.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2
    api13 = p.apiVersion >= vk.VK_MAKE_VERSION(1, 3, 0)
    f12 = ffi.new("VkPhysicalDeviceVulkan12Features*")
    f12.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES
    cmf = ffi.new("VkPhysicalDeviceCooperativeMatrixFeaturesNV*")
    cmf.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV
    extensions = _extensions(pd)
    has_coopmat = COOPMAT_NV in extensions
    if api13:
        link_chain([f2, f13, f12] + ([cmf] if has_coopmat else []))
    lib.vkGetPhysicalDeviceFeatures2(pd, f2)
    # cooperative matrices as the tensor-core kernels use them: the extension and its feature,
    # fp16 arithmetic and the Vulkan memory model (which the GLSL extension's SPIR-V declares)
    coopmat = (_coopmat_shapes(instance, pd) if api13 and has_coopmat and cmf.cooperativeMatrix
               and f12.shaderFloat16 and f12.vulkanMemoryModel else [])
    mem = ffi.new("VkPhysicalDeviceMemoryProperties*")
    lib.vkGetPhysicalDeviceMemoryProperties(pd, mem)
    qcount = ffi.new("uint32_t*")
    lib.vkGetPhysicalDeviceQueueFamilyProperties(pd, qcount, ffi.NULL)
    qprops = ffi.new("VkQueueFamilyProperties[]", qcount[0])
    lib.vkGetPhysicalDeviceQueueFamilyProperties(pd, qcount, qprops)
    queues = [{"flags": qprops[i].queueFlags, "count": qprops[i].queueCount,
               "timestamp_valid_bits": qprops[i].timestampValidBits} for i in range(qcount[0])]
    return {
        "name": ffi.string(p.deviceName).decode(),
        "type": _TYPE_NAMES.get(p.deviceType, "other"),
        "type_code": p.deviceType,
        "vendor_id": p.vendorID, "device_id": p.deviceID,
        "api_version": _version(p.apiVersion),
        "driver_version": p.driverVersion,
        "driver_name": ffi.string(drv.driverName).decode(),
        "driver_info": ffi.string(drv.driverInfo).decode(),
        "subgroup": {
            "size": sg.subgroupSize,
            "compute_stage": bool(sg.supportedStages & _STAGE_COMPUTE),
            "operations": [n for bit, n in _SUBGROUP_OPS if sg.supportedOperations & bit],
            "size_control": bool(api13 and f13.subgroupSizeControl),
            "full_subgroups": bool(api13 and f13.computeFullSubgroups),
            "min_size": sgc.minSubgroupSize if api13 else sg.subgroupSize,
            "max_size": sgc.maxSubgroupSize if api13 else sg.subgroupSize,
            "required_size_compute": bool(sgc.requiredSubgroupSizeStages & _STAGE_COMPUTE) if api13 else False,
        },
        "timestamps": {
            "compute_and_graphics": bool(lim.timestampComputeAndGraphics),
            "period_ns": float(lim.timestampPeriod),
            "valid_bits": max((q["timestamp_valid_bits"] for q in queues), default=0),
        },
        "limits": {
            "max_workgroup_count": list(lim.maxComputeWorkGroupCount),
            "max_workgroup_size": list(lim.maxComputeWorkGroupSize),
            "max_workgroup_invocations": lim.maxComputeWorkGroupInvocations,
            "max_shared_memory": lim.maxComputeSharedMemorySize,
            "max_push_constants": lim.maxPushConstantsSize,
            "max_storage_buffer_range": lim.maxStorageBufferRange,
            "min_storage_buffer_offset_alignment": lim.minStorageBufferOffsetAlignment,
        },
        "memory_heaps": [{"size": mem.memoryHeaps[i].size, "device_local": bool(mem.memoryHeaps[i].flags & 1)}
                         for i in range(mem.memoryHeapCount)],
        "memory_types": [{"heap": mem.memoryTypes[i].heapIndex, "flags": mem.memoryTypes[i].propertyFlags}
                         for i in range(mem.memoryTypeCount)],
        "queues": queues,
        "api13": api13,
        "coopmat": coopmat,
        # what VK_KHR_cooperative_matrix offers (the kernels use the NV extension: reported, not enabled)
        "coopmat_khr": _coopmat_shapes(instance, pd, "KHR") if api13 and COOPMAT_KHR in extensions else [],
        "float_controls": _float_controls(fc) if p.apiVersion >= vk.VK_MAKE_VERSION(1, 2, 0) else {},
    }


def _float_controls(fc):
    """VkPhysicalDeviceFloatControlsProperties as {property: [widths]} (caps.FloatControls)."""
    def widths(name):
        return [w for w in ("16", "32", "64") if getattr(fc, f"{name}Float{w}")]
    return {"denorm_preserve": [f"f{w}" for w in widths("shaderDenormPreserve")],
            "denorm_flush_to_zero": [f"f{w}" for w in widths("shaderDenormFlushToZero")],
            "rounding_rte": [f"f{w}" for w in widths("shaderRoundingModeRTE")],
            "rounding_rtz": [f"f{w}" for w in widths("shaderRoundingModeRTZ")],
            "signed_zero_inf_nan_preserve": [f"f{w}" for w in widths("shaderSignedZeroInfNanPreserve")]}


def list_devices():
    """Probe every physical device without creating a logical device."""
    inst = create_instance(False)
    try:
        return [probe_device(inst, pd) for pd in physical_devices(inst)]
    finally:
        lib.vkDestroyInstance(inst, ffi.NULL)


def choose(probes, selector, what):
    if not probes:
        raise VulkanUnavailable("Vulkan found no physical device: install `mesa-vulkan-drivers` (lavapipe) "
                                "or a GPU driver.")
    if selector:
        digits = selector.strip()
        if digits.isascii() and digits.isdigit():     # (int() also reads "²" or "٣" and refuses 5000 digits)
            i = int(digits) if len(digits) <= 9 else len(probes)
            if i >= len(probes):
                shown = selector if len(selector) <= 40 else f"{selector[:40]}... ({len(selector)} characters)"
                raise VulkanUnavailable(f"{what}={shown} but only {len(probes)} device(s) exist: "
                                        + ", ".join(f"{j}: {p['name']}" for j, p in enumerate(probes)))
            return i
        hits = [i for i, p in enumerate(probes) if selector.lower() in p["name"].lower()]
        if not hits:
            raise VulkanUnavailable(f"{what}={selector!r} matches no device name; devices are: "
                                    + ", ".join(f"{j}: {p['name']}" for j, p in enumerate(probes)))
        return hits[0]
    return min(range(len(probes)), key=lambda i: (_TYPE_RANK.get(probes[i]["type_code"], 9), i))
