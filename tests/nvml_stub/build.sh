#!/bin/sh
# Build the stand-in libnvidia-ml.so.1: tests/nvml_stub/build.sh OUTPUT [CFLAGS...]
# e.g. build.sh /tmp/stub/libnvidia-ml.so.1, or with -DNVML_STUB_NO_LEGACY_TEMPERATURE for a
# driver without the deprecated nvmlDeviceGetTemperature (CUDA 14).
# nvml.h: $NVML_INCLUDE, else the one PyPI's nvidia-nvml-dev installs next to $PYTHON's packages.
set -eu
out=$1
shift
here=$(dirname "$0")
if [ -z "${NVML_INCLUDE:-}" ]; then
    NVML_INCLUDE=$("${PYTHON:-python3}" -c '
import glob, os, sys
found = [h for p in sys.path for h in glob.glob(os.path.join(p, "nvidia", "*", "include", "nvml.h"))]
print(os.path.dirname(sorted(found)[-1]) if found else "")')
fi
if [ ! -f "$NVML_INCLUDE/nvml.h" ]; then
    echo "nvml.h not found: pip install nvidia-nvml-dev, or set NVML_INCLUDE" >&2
    exit 2
fi
exec "${CC:-cc}" -shared -fPIC -O1 -Wall -Wextra -Werror -Wno-deprecated-declarations \
    -I"$NVML_INCLUDE" "$@" -o "$out" "$here/nvml_stub.c" "$here/nvml_stub_links.c"
