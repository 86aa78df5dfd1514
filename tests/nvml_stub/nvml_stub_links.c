/* The stand-in libnvidia-ml.so.1, second half: NVLink, memory, processes, persistence, fabric
 * and nvmlDeviceGetFieldValues (tests/nvml_stub/README.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvml_stub.h"

/* ---- NVLink ---- */

/* Is `link` in the comma list `list` ("3,7")? */
static int in_list(const char *list, unsigned int link)
{
    for (const char *p = list; p && *p;) {
        char *end;
        unsigned long v = strtoul(p, &end, 0);
        if (end == p)
            return 0;
        if (v == link)
            return 1;
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
}

static int link_exists(nvmlDevice_t device, unsigned int link)
{
    unsigned long long links;
    return gpu_ull(device->index, "nvlinks", &links) && link < links;
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive)
{
    ENTER(device);
    if (!link_exists(device, link))
        return NVML_ERROR_INVALID_ARGUMENT; /* past the device's last link, as the driver answers */
    *isActive = in_list(gpu_value(device->index, "nvlink_down"), link) ? NVML_FEATURE_DISABLED
                                                                      : NVML_FEATURE_ENABLED;
    return NVML_SUCCESS;
}

/* nvlink_<counter> = N (every link) or a list LINK:N,LINK:N (the links not named read 0). */
static int link_counter(nvmlDevice_t device, const char *counter, unsigned int link, unsigned long long *out)
{
    char key[64];
    snprintf(key, sizeof key, "nvlink_%s", counter);
    const char *v = gpu_value(device->index, key);
    if (!v || !link_exists(device, link))
        return 0;
    *out = 0;
    for (const char *p = v; *p;) {
        char *end;
        unsigned long long first = strtoull(p, &end, 0);
        if (end == p)
            break;
        if (*end == ':') {
            unsigned long long n = strtoull(end + 1, &end, 0);
            if (first == link)
                *out = n;
        } else {
            *out = first;
        }
        p = *end == ',' ? end + 1 : end;
    }
    return 1;
}

static const char *const dl_counters[] = {"replay", "recovery", "crc_flit", "crc_data"}; /* NVML_NVLINK_ERROR_DL_* */

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                                     nvmlNvLinkErrorCounter_t counter, unsigned long long *counterValue)
{
    ENTER(device);
    if ((unsigned int)counter >= 4)
        return NVML_ERROR_NOT_SUPPORTED;
    if (!link_exists(device, link))
        return NVML_ERROR_INVALID_ARGUMENT;
    return link_counter(device, dl_counters[counter], link, counterValue) ? NVML_SUCCESS
                                                                          : NVML_ERROR_NOT_SUPPORTED;
}

/* ---- memory, processes, persistence, fabric ---- */

static int memory(nvmlDevice_t device, unsigned long long *total, unsigned long long *used,
                  unsigned long long *reserved)
{
    const unsigned long long mib = 1024ULL * 1024ULL;
    if (!gpu_ull(device->index, "memory_total_mib", total))
        return 0;
    if (!gpu_ull(device->index, "memory_used_mib", used))
        *used = 0;
    if (!gpu_ull(device->index, "memory_reserved_mib", reserved))
        *reserved = 0;
    *total *= mib;
    *used *= mib;
    *reserved *= mib;
    return 1;
}

nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *info)
{
    ENTER(device);
    unsigned long long total, used, reserved;
    if (!memory(device, &total, &used, &reserved))
        return NVML_ERROR_NOT_SUPPORTED;
    info->total = total;
    info->used = used + reserved; /* v1 counts the driver's reservation as used */
    info->free = total - info->used;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *info)
{
    ENTER(device);
    if (info->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long total, used, reserved;
    if (!memory(device, &total, &used, &reserved))
        return NVML_ERROR_NOT_SUPPORTED;
    info->total = total;
    info->used = used;
    info->reserved = reserved;
    info->free = total - used - reserved;
    return NVML_SUCCESS;
}

/* processes = PID:USED_MIB,PID:USED_MIB (an empty value: no process) */
nvmlReturn_t DECLDIR nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_t *infos)
{
    ENTER(device);
    const char *v = gpu_value(device->index, "processes");
    if (!v)
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned int n = 0;
    for (const char *p = v; *p;) {
        char *end;
        unsigned long long pid = strtoull(p, &end, 0), mib = 0;
        if (end == p)
            break;
        if (*end == ':')
            mib = strtoull(end + 1, &end, 0);
        if (infos && n < *infoCount) {
            memset(&infos[n], 0, sizeof infos[n]);
            infos[n].pid = (unsigned int)pid;
            infos[n].usedGpuMemory = mib * 1024ULL * 1024ULL;
            infos[n].gpuInstanceId = infos[n].computeInstanceId = 0xFFFFFFFF;
        }
        n++;
        p = *end == ',' ? end + 1 : end;
    }
    nvmlReturn_t ret = (!infos && n) || n > *infoCount ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    *infoCount = n;
    return ret;
}

nvmlReturn_t DECLDIR nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    ENTER(device);
    return enable_state(device, "persistence", mode);
}

/* fabric_state = NVML_GPU_FABRIC_STATE_* (3: completed), fabric_status = nvmlReturn_t */
static int fabric(nvmlDevice_t device, nvmlGpuFabricState_t *state, nvmlReturn_t *status, unsigned int *clique)
{
    unsigned long long v;
    if (!gpu_ull(device->index, "fabric_state", &v))
        return 0;
    *state = (nvmlGpuFabricState_t)v;
    *status = gpu_ull(device->index, "fabric_status", &v) ? (nvmlReturn_t)v : NVML_SUCCESS;
    *clique = gpu_ull(device->index, "fabric_clique", &v) ? (unsigned int)v : 0;
    return 1;
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *info)
{
    ENTER(device);
    memset(info, 0, sizeof *info);
    return fabric(device, &info->state, &info->status, &info->cliqueId) ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *info)
{
    ENTER(device);
    /* The caller's struct is as large as its version says (a v2 caller has no healthSummary). */
    unsigned int version = info->version;
    if (version != nvmlGpuFabricInfo_v2 && version != nvmlGpuFabricInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlGpuFabricInfo_v3_t out;
    memset(&out, 0, sizeof out);
    out.version = version;
    if (!fabric(device, &out.state, &out.status, &out.cliqueId))
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned long long v;
    out.healthMask = gpu_ull(device->index, "fabric_health_mask", &v) ? (unsigned int)v : 0;
    memcpy(info, &out, version == nvmlGpuFabricInfo_v2 ? sizeof(nvmlGpuFabricInfo_v2_t) : sizeof out);
    return NVML_SUCCESS;
}

/* ---- field values: the batched reads (nvmlDeviceGetFieldValues) ---- */

/* The per-link counter fields L0-L5 and L6-L11 (nvml.h), as (first id, counter name). */
static int per_link_field(unsigned int id, const char **counter, unsigned int *link)
{
    static const struct {
        unsigned int l0, l6;
        const char *counter;
    } fields[] = {
        {NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L6, "crc_flit"},
        {NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6, "crc_data"},
        {NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L6, "replay"},
        {NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L6, "recovery"},
    };
    for (unsigned int i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        if (id >= fields[i].l0 && id < fields[i].l0 + 6) {
            *counter = fields[i].counter;
            *link = id - fields[i].l0;
            return 1;
        }
        if (id >= fields[i].l6 && id < fields[i].l6 + 6) {
            *counter = fields[i].counter;
            *link = id - fields[i].l6 + 6;
            return 1;
        }
    }
    return 0;
}

static unsigned long long link_total(nvmlDevice_t device, const char *counter, int *known)
{
    unsigned long long links = 0, total = 0, v;
    gpu_ull(device->index, "nvlinks", &links);
    *known = 0;
    for (unsigned int link = 0; link < links; link++)
        if (link_counter(device, counter, link, &v)) {
            total += v;
            *known = 1;
        }
    return total;
}

/* One of the four numbers of remapped_rows (0: corrected ... 3: failure). */
static int remapped(nvmlDevice_t device, unsigned int which, unsigned long long *out)
{
    unsigned int rows[4];
    const char *v = gpu_value(device->index, "remapped_rows");
    if (!v || sscanf(v, "%u %u %u %u", &rows[0], &rows[1], &rows[2], &rows[3]) != 4 || which > 3)
        return 0;
    *out = rows[which];
    return 1;
}

/* One field: 1 and its value, or 0 (NotSupported). scopeId is the link for NVLink fields. */
static int field(nvmlDevice_t device, unsigned int id, unsigned int scope, unsigned long long *out)
{
    const char *counter;
    unsigned int link;
    int known;
    switch (id) {
    case NVML_FI_DEV_ECC_CURRENT:
    case NVML_FI_DEV_ECC_PENDING: return gpu_ull(device->index, "ecc_mode", out);
    case NVML_FI_DEV_REMAPPED_COR:
    case NVML_FI_DEV_REMAPPED_UNC:
    case NVML_FI_DEV_REMAPPED_PENDING:
    case NVML_FI_DEV_REMAPPED_FAILURE: return remapped(device, id - NVML_FI_DEV_REMAPPED_COR, out);
    case NVML_FI_DEV_ECC_SBE_VOL_TOTAL: return gpu_ull(device->index, "ecc_corrected_volatile", out);
    case NVML_FI_DEV_ECC_DBE_VOL_TOTAL: return gpu_ull(device->index, "ecc_uncorrected_volatile", out);
    case NVML_FI_DEV_ECC_SBE_AGG_TOTAL: return gpu_ull(device->index, "ecc_corrected_aggregate", out);
    case NVML_FI_DEV_ECC_DBE_AGG_TOTAL: return gpu_ull(device->index, "ecc_uncorrected_aggregate", out);
    case NVML_FI_DEV_RETIRED_PENDING: return gpu_ull(device->index, "retired_pending", out);
    case NVML_FI_DEV_PCIE_REPLAY_COUNTER: return gpu_ull(device->index, "pcie_replay", out);
    case NVML_FI_DEV_NVLINK_LINK_COUNT: return gpu_ull(device->index, "nvlinks", out);
    case NVML_FI_DEV_POWER_INSTANT:
    case NVML_FI_DEV_POWER_AVERAGE: return gpu_ull(device->index, "power_mw", out);
    case NVML_FI_DEV_POWER_CURRENT_LIMIT: return gpu_ull(device->index, "limit_mw", out);
    case NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: return gpu_ull(device->index, "recovery_action", out);
    case NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: *out = link_total(device, "crc_flit", &known); return known;
    case NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: *out = link_total(device, "crc_data", &known); return known;
    case NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: *out = link_total(device, "replay", &known); return known;
    case NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: *out = link_total(device, "recovery", &known); return known;
    case NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: return link_counter(device, "replay", scope, out);
    case NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: return link_counter(device, "recovery", scope, out);
    case NVML_FI_DEV_NVLINK_ERROR_DL_CRC: return link_counter(device, "crc_flit", scope, out);
    case NVML_FI_DEV_NVLINK_GET_STATE: /* NVML_NVLINK_STATE_ACTIVE 1 / INACTIVE 0 */
        if (!link_exists(device, scope))
            return 0;
        *out = in_list(gpu_value(device->index, "nvlink_down"), scope) ? 0 : 1;
        return 1;
    default:
        if (per_link_field(id, &counter, &link))
            return link_counter(device, counter, link, out);
        return 0;
    }
}

nvmlReturn_t DECLDIR nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values)
{
    ENTER(device);
    if (valuesCount < 0 || (valuesCount && !values))
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        unsigned long long value;
        v->timestamp = 0;
        v->latencyUsec = 0;
#ifdef NVML_FI_DEV_GPU_TEMP /* not in every nvml.h 13.x (13.0.39 lacks it) */
        if (v->fieldId == NVML_FI_DEV_GPU_TEMP && gpu_ull(device->index, "temp", &value)) {
            v->nvmlReturn = NVML_SUCCESS; /* a double: sub-degree precision */
            v->valueType = NVML_VALUE_TYPE_DOUBLE;
            v->value.dVal = (double)value;
            continue;
        }
#endif
        if (field(device, v->fieldId, v->scopeId, &value)) {
            v->nvmlReturn = NVML_SUCCESS;
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
            v->value.ullVal = value;
        } else {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return NVML_SUCCESS;
}
