/* What the two halves of the stand-in libnvidia-ml.so.1 share (nvml_stub.c: the scenario, the
 * library and system calls, identity, power, ECC and PCIe; nvml_stub_links.c: NVLink, memory,
 * processes, fabric and the batched field values). */
#ifndef NVML_STUB_H
#define NVML_STUB_H

#include "nvml.h"

struct nvmlDevice_st {
    unsigned int index;
};

/* gpu.N.KEY, else gpu.*.KEY, else NULL. */
const char *gpu_value(unsigned int index, const char *key);
/* 1 and the number under KEY for this GPU, or 0 when the scenario does not give it. */
int gpu_ull(unsigned int index, const char *key, unsigned long long *out);
/* Count the call, check the handle, then the faults gpu.N.error and gpu.N.fail.FN. */
nvmlReturn_t enter(nvmlDevice_t device, const char *fn);
/* An nvmlEnableState_t from KEY (NotSupported when it is not given). */
nvmlReturn_t enable_state(nvmlDevice_t device, const char *key, nvmlEnableState_t *out);

/* The start of every device function: return the fault code, if any. */
#define ENTER(device)                                     \
    do {                                                  \
        nvmlReturn_t entered = enter(device, __func__);   \
        if (entered != NVML_SUCCESS)                      \
            return entered;                               \
    } while (0)

#endif
