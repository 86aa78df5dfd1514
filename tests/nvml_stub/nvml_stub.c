/*
 * A stand-in libnvidia-ml.so.1 for gpugate's tests (tests/nvml_stub/README.md).
 *
 * Compiled against NVIDIA's own nvml.h (PyPI package nvidia-nvml-dev), so every function here
 * has the exact C signature the real driver library exports, and nvidia-ml-py (pynvml) calls it
 * through ctypes exactly as on a node. The values come from a scenario file named by the
 * environment variable NVML_STUB_SCENARIO: lines `key = value`, `#` starts a comment.
 *
 *   init = 9                     nvmlInit's return code (9: NVML_ERROR_DRIVER_NOT_LOADED)
 *   driver = 580.105.08          nvmlSystemGetDriverVersion
 *   cuda = 13000                 nvmlSystemGetCudaDriverVersion(_v2)
 *   count = 8                    nvmlDeviceGetCount_v2
 *   gpu.*.KEY = VALUE            KEY for every GPU; gpu.N.KEY for GPU N only (wins over *)
 *
 * A per-GPU key that is not given answers NVML_ERROR_NOT_SUPPORTED, as a real GPU does for a
 * feature it lacks. Faults: gpu.N.handle_error = CODE (nvmlDeviceGetHandleByIndex fails),
 * gpu.N.error = CODE (the handle is given, then every call answers CODE: 15 is GPU_IS_LOST),
 * gpu.N.fail.FUNCTION = CODE (one function answers CODE). NVML_STUB_INIT=CODE overrides `init`.
 * NVML_STUB_CALLS=FILE: at nvmlShutdown, `total N` and one `FUNCTION N` line per function called.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvml_stub.h"

#define MAX_ENTRIES 1024
#define MAX_GPUS 64


static struct {
    char key[128];
    char value[256];
} entries[MAX_ENTRIES];
static int n_entries;
static int loaded;
static struct nvmlDevice_st devices[MAX_GPUS];
static unsigned long calls;
static struct {
    const char *fn;
    unsigned long n;
} per_function[128];

/* Count one call of `fn` (NVML_STUB_CALLS: what a snapshot costs on a real driver). */
static void count(const char *fn)
{
    calls++;
    for (unsigned int i = 0; i < sizeof per_function / sizeof per_function[0]; i++) {
        if (!per_function[i].fn)
            per_function[i].fn = fn;
        if (per_function[i].fn == fn || strcmp(per_function[i].fn, fn) == 0) {
            per_function[i].n++;
            return;
        }
    }
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    char *end = s + strlen(s);
    while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n' || end[-1] == '\r'))
        *--end = '\0';
    return s;
}

static void load(void)
{
    if (loaded)
        return;
    loaded = 1;
    const char *path = getenv("NVML_STUB_SCENARIO");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f)
        return;
    char line[512];
    while (n_entries < MAX_ENTRIES && fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *eq = strchr(line, '=');
        if (!eq)
            continue;
        *eq = '\0';
        snprintf(entries[n_entries].key, sizeof entries[0].key, "%s", trim(line));
        snprintf(entries[n_entries].value, sizeof entries[0].value, "%s", trim(eq + 1));
        n_entries++;
    }
    fclose(f);
}

/* The value of `key`; the last line that gives it wins. */
static const char *lookup(const char *key)
{
    for (int i = n_entries - 1; i >= 0; i--)
        if (strcmp(entries[i].key, key) == 0)
            return entries[i].value;
    return NULL;
}

/* gpu.N.KEY, else gpu.*.KEY, else NULL. */
const char *gpu_value(unsigned int index, const char *key)
{
    char name[160];
    snprintf(name, sizeof name, "gpu.%u.%s", index, key);
    const char *v = lookup(name);
    if (v)
        return v;
    snprintf(name, sizeof name, "gpu.*.%s", key);
    return lookup(name);
}

int gpu_ull(unsigned int index, const char *key, unsigned long long *out)
{
    const char *v = gpu_value(index, key);
    if (!v)
        return 0;
    *out = strtoull(v, NULL, 0);
    return 1;
}

static unsigned int gpu_count(void)
{
    const char *v = lookup("count");
    unsigned int n = v ? (unsigned int)strtoul(v, NULL, 0) : 0;
    return n > MAX_GPUS ? MAX_GPUS : n;
}

/* The fault codes that apply to `fn` on this GPU: gpu.N.error, then gpu.N.fail.FN. */
nvmlReturn_t enter(nvmlDevice_t device, const char *fn)
{
    count(fn);
    if (!device || device->index >= gpu_count())
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long code;
    if (gpu_ull(device->index, "error", &code))
        return (nvmlReturn_t)code;
    char key[160];
    snprintf(key, sizeof key, "fail.%s", fn);
    if (gpu_ull(device->index, key, &code))
        return (nvmlReturn_t)code;
    return NVML_SUCCESS;
}


/* Copy gpu.N.KEY into a caller's buffer, as NVML does (INSUFFICIENT_SIZE when it is short). */
static nvmlReturn_t text(nvmlDevice_t device, const char *key, char *buf, unsigned int length)
{
    const char *v = gpu_value(device->index, key);
    if (!v)
        return NVML_ERROR_NOT_SUPPORTED;
    if (!buf || strlen(v) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, v, strlen(v) + 1);
    return NVML_SUCCESS;
}

#define UINT_GETTER(fn, key)                                            \
    nvmlReturn_t DECLDIR fn(nvmlDevice_t device, unsigned int *value)   \
    {                                                                   \
        ENTER(device);                                                  \
        unsigned long long v;                                           \
        if (!gpu_ull(device->index, key, &v))                           \
            return NVML_ERROR_NOT_SUPPORTED;                            \
        *value = (unsigned int)v;                                       \
        return NVML_SUCCESS;                                            \
    }

/* ---- library and system ---- */

nvmlReturn_t DECLDIR nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    count(__func__);
    load();
    const char *v = getenv("NVML_STUB_INIT");
    if (!v)
        v = lookup("init");
    for (unsigned int i = 0; i < MAX_GPUS; i++)
        devices[i].index = i;
    return v ? (nvmlReturn_t)strtol(v, NULL, 0) : NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0); /* counted as nvmlInitWithFlags */
}

nvmlReturn_t DECLDIR nvmlShutdown(void)
{
    count(__func__);
    const char *path = getenv("NVML_STUB_CALLS");
    FILE *f = path ? fopen(path, "w") : NULL;
    if (f) {
        fprintf(f, "total %lu\n", calls);
        for (unsigned int i = 0; i < sizeof per_function / sizeof per_function[0] && per_function[i].fn; i++)
            fprintf(f, "%s %lu\n", per_function[i].fn, per_function[i].n);
        fclose(f);
    }
    return NVML_SUCCESS;
}

const DECLDIR char *nvmlErrorString(nvmlReturn_t result)
{
    static char buf[64];
    snprintf(buf, sizeof buf, "NVML stub error %d", (int)result);
    return buf;
}

nvmlReturn_t DECLDIR nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    count(__func__);
    const char *v = lookup("driver");
    if (!v)
        return NVML_ERROR_NOT_SUPPORTED;
    if (strlen(v) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(version, v, strlen(v) + 1);
    return NVML_SUCCESS;
}

static nvmlReturn_t cuda_version(int *cudaDriverVersion)
{
    const char *v = lookup("cuda");
    if (!v)
        return NVML_ERROR_NOT_SUPPORTED;
    *cudaDriverVersion = (int)strtol(v, NULL, 0);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    count(__func__);
    return cuda_version(cudaDriverVersion);
}

nvmlReturn_t DECLDIR nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    count(__func__);
    return cuda_version(cudaDriverVersion);
}

nvmlReturn_t DECLDIR nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    count(__func__);
    const char *v = lookup("count_error");
    if (v)
        return (nvmlReturn_t)strtol(v, NULL, 0);
    *deviceCount = gpu_count();
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    count(__func__);
    if (index >= gpu_count())
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long code;
    if (gpu_ull(index, "handle_error", &code))
        return (nvmlReturn_t)code;
    *device = &devices[index];
    return NVML_SUCCESS;
}

/* ---- identity ---- */

nvmlReturn_t DECLDIR nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    ENTER(device);
    return text(device, "name", name, length);
}

nvmlReturn_t DECLDIR nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    ENTER(device);
    return text(device, "uuid", uuid, length);
}

nvmlReturn_t DECLDIR nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    ENTER(device);
    return text(device, "serial", serial, length);
}

nvmlReturn_t DECLDIR nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    ENTER(device);
    const char *bus_id = gpu_value(device->index, "bus_id"); /* 00000000:8F:00.0 */
    if (!bus_id)
        return NVML_ERROR_NOT_SUPPORTED;
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", bus_id + (strlen(bus_id) > 12 ? 4 : 0));
    unsigned int domain = 0, bus = 0, dev = 0;
    sscanf(bus_id, "%x:%x:%x", &domain, &bus, &dev);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    unsigned long long id;
    if (gpu_ull(device->index, "pci_device_id", &id))
        pci->pciDeviceId = (unsigned int)id;
    return NVML_SUCCESS;
}

/* ---- thermal and power ---- */

#ifndef NVML_STUB_NO_LEGACY_TEMPERATURE /* CUDA 14 drivers drop the deprecated call */
nvmlReturn_t DECLDIR nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                              unsigned int *temp)
{
    ENTER(device);
    unsigned long long v;
    if (sensorType != NVML_TEMPERATURE_GPU || !gpu_ull(device->index, "temp", &v))
        return NVML_ERROR_NOT_SUPPORTED;
    *temp = (unsigned int)v;
    return NVML_SUCCESS;
}
#endif

nvmlReturn_t DECLDIR nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature)
{
    ENTER(device);
    if (temperature->version != nvmlTemperature_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long v;
    if (temperature->sensorType != NVML_TEMPERATURE_GPU || !gpu_ull(device->index, "temp", &v))
        return NVML_ERROR_NOT_SUPPORTED;
    temperature->temperature = (int)v;
    return NVML_SUCCESS;
}

UINT_GETTER(nvmlDeviceGetMinorNumber, "minor") /* /dev/nvidia<minor> */
UINT_GETTER(nvmlDeviceGetPowerUsage, "power_mw")
UINT_GETTER(nvmlDeviceGetEnforcedPowerLimit, "limit_mw")

nvmlReturn_t DECLDIR nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    ENTER(device);
    return gpu_ull(device->index, "clocks_event", reasons) ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t DECLDIR nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    ENTER(device); /* the deprecated name of the same bits */
    return gpu_ull(device->index, "clocks_event", reasons) ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

/* ---- memory errors ---- */

nvmlReturn_t enable_state(nvmlDevice_t device, const char *key, nvmlEnableState_t *out)
{
    unsigned long long v;
    if (!gpu_ull(device->index, key, &v))
        return NVML_ERROR_NOT_SUPPORTED;
    *out = v ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current, nvmlEnableState_t *pending)
{
    ENTER(device);
    nvmlReturn_t ret = enable_state(device, "ecc_mode", current);
    if (ret == NVML_SUCCESS)
        *pending = *current;
    return ret;
}

/* ecc_<corrected|uncorrected>_<volatile|aggregate>, by NVML_MEMORY_ERROR_TYPE_* and NVML_*_ECC */
static const char *ecc_key(unsigned int error_type, unsigned int counter_type)
{
    static const char *keys[2][2] = {
        {"ecc_corrected_volatile", "ecc_corrected_aggregate"},
        {"ecc_uncorrected_volatile", "ecc_uncorrected_aggregate"},
    };
    return error_type < 2 && counter_type < 2 ? keys[error_type][counter_type] : NULL;
}

nvmlReturn_t DECLDIR nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                                 nvmlEccCounterType_t counterType, unsigned long long *eccCounts)
{
    ENTER(device);
    const char *key = ecc_key(errorType, counterType);
    if (!key)
        return NVML_ERROR_INVALID_ARGUMENT;
    return gpu_ull(device->index, key, eccCounts) ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t DECLDIR nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending)
{
    ENTER(device);
    return enable_state(device, "retired_pending", isPending);
}

/* remapped_rows = CORRECTED UNCORRECTED PENDING FAILURE */
nvmlReturn_t DECLDIR nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                               unsigned int *isPending, unsigned int *failureOccurred)
{
    ENTER(device);
    const char *v = gpu_value(device->index, "remapped_rows");
    if (!v || sscanf(v, "%u %u %u %u", corrRows, uncRows, isPending, failureOccurred) != 4)
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

/* ---- PCIe ---- */

UINT_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, "pcie_gen")
UINT_GETTER(nvmlDeviceGetMaxPcieLinkGeneration, "pcie_max_gen")
UINT_GETTER(nvmlDeviceGetCurrPcieLinkWidth, "pcie_width")
UINT_GETTER(nvmlDeviceGetMaxPcieLinkWidth, "pcie_max_width")
UINT_GETTER(nvmlDeviceGetPcieReplayCounter, "pcie_replay")

