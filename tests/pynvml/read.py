"""Reads the simulated node through pynvml (PyPI nvidia-ml-py), independently of Junction,
and prints what it saw as JSON. Loaded through LD_LIBRARY_PATH like a real driver."""
import json

import pynvml as n

def maybe(f):
    """f(), or None where the GPU or the library lacks the call."""
    try:
        return f()
    except n.NVMLError:
        return None


def fabric(h):
    info = n.c_nvmlGpuFabricInfo_v3_t()
    n.nvmlDeviceGetGpuFabricInfoV(h, n.byref(info))
    return {"state": info.state, "status": info.status, "clique": info.cliqueId,
            "mask": info.healthMask, "summary": info.healthSummary}


n.nvmlInit()
gpus = []
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    mem = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
    util = n.nvmlDeviceGetUtilizationRates(h)
    hbm = n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_MEMORY_TEMP])[0]
    procs = n.nvmlDeviceGetComputeRunningProcesses(h)
    gpus.append({
        "uuid": n.nvmlDeviceGetUUID(h),
        "name": n.nvmlDeviceGetName(h),
        "bus_id": n.nvmlDeviceGetPciInfo(h).busId,
        "memory_used": mem.used,
        "memory_total": mem.total,
        "gpu_util": util.gpu,
        "temp_gpu": n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
        "temp_memory": hbm.value.uiVal,
        "power_mw": n.nvmlDeviceGetPowerUsage(h),
        "power_limit_mw": n.nvmlDeviceGetEnforcedPowerLimit(h),
        "clock_sm_mhz": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
        "pcie_rx_kb": n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_RX_BYTES),
        "ecc_corrected_aggregate": n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_AGGREGATE_ECC),
        "first_pid": procs[0].pid,
        "first_pid_memory": procs[0].usedGpuMemory,
        "persistence_mode": maybe(lambda: n.nvmlDeviceGetPersistenceMode(h)),
        "ecc_mode": maybe(lambda: list(n.nvmlDeviceGetEccMode(h))),
        "compute_mode": maybe(lambda: n.nvmlDeviceGetComputeMode(h)),
        "fabric": maybe(lambda: fabric(h)),
    })
n.nvmlShutdown()
print(json.dumps({"gpus": gpus}))
