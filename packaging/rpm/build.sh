#!/usr/bin/env bash
# Build the gpugate RPM: dist/gpugate-<version>-<release>.noarch.rpm (`make rpm`).
#
# Sites run RHEL 9 and its system Python 3.9, so a virtualenv made here would point at this
# host's interpreter. Instead gpugate and its pure-Python dependencies are installed with
# `pip install --target` into a plain directory that the RPM ships as /opt/gpugate/lib, and a
# small launcher puts that directory first on sys.path. The network (PyPI) is needed here, at
# build time, never on the nodes.
#
# Settings (environment):
#   PYTHON          a Python with pip that runs the build (default: python3)
#   BUILD_DIR       scratch space (default: build/rpm); only its stage/ and topdir/ are replaced
#   DIST_DIR        where the .rpm goes (default: dist)
#   RPM_RELEASE     the RPM Release (default: 1; the build host's %{dist} is appended)
#   TARGET_PYTHON   the oldest Python the nodes run (default: 3.9, RHEL 9); dependencies are
#                   resolved for it, so none is picked that needs a newer one
# pip's own variables apply as usual: PIP_CONSTRAINT=pins.txt fixes the bundled versions,
# PIP_INDEX_URL / PIP_FIND_LINKS point at a mirror.
set -euo pipefail
umask 022 # the payload's modes come from here: files 0644, directories and scripts 0755

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
PYTHON=${PYTHON:-python3}
BUILD_DIR=${BUILD_DIR:-$repo/build/rpm}
DIST_DIR=${DIST_DIR:-$repo/dist}
RPM_RELEASE=${RPM_RELEASE:-1}
TARGET_PYTHON=${TARGET_PYTHON:-3.9}

die() {
    echo "build.sh: $*" >&2
    exit 1
}

command -v rpmbuild >/dev/null || die "rpmbuild not found (Debian: apt-get install rpm; RHEL: dnf install rpm-build)"
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "$PYTHON has no pip (set PYTHON=.venv/bin/python)"

# The version lives in the project, never in the spec: pyproject.toml and gpugate/__init__.py
# must agree, or the RPM would carry a version the code does not report.
version=$(sed -n 's/^version = "\([^"]*\)"$/\1/p' "$repo/pyproject.toml" | head -n 1)
code_version=$(sed -n 's/^__version__ = "\([^"]*\)"$/\1/p' "$repo/gpugate/__init__.py")
[ -n "$version" ] || die "no version in pyproject.toml"
[ "$version" = "$code_version" ] ||
    die "pyproject.toml says $version but gpugate/__init__.py says $code_version"

BUILD_DIR=$(mkdir -p "$BUILD_DIR" && cd "$BUILD_DIR" && pwd)
mkdir -p "$DIST_DIR"
DIST_DIR=$(cd "$DIST_DIR" && pwd)
stage=$BUILD_DIR/stage
topdir=$BUILD_DIR/topdir
rm -rf "$stage" "$topdir"
src=$stage/src                    # a copy of the project to build the wheel from
tree=$stage/gpugate-$version      # becomes Source0: everything %install needs
lib=$tree/lib
mkdir -p "$src" "$stage/wheel" "$tree/bin" "$tree/libexec" "$tree/etc" "$tree/doc/examples"

# 1. A wheel of gpugate, built from a copy so that setuptools' build/ and egg-info never land
#    in the working tree. The copy is what pyproject.toml maps into the package.
echo "build.sh: gpugate $version: building the wheel"
(cd "$repo" && tar -c --exclude=__pycache__ --exclude='*.pyc' \
    pyproject.toml README.md gpugate checks slurm_hooks config) | tar -x -C "$src"
"$PYTHON" -m pip wheel --quiet --disable-pip-version-check --no-deps \
    --wheel-dir "$stage/wheel" "$src"

# 2. gpugate and its dependencies into lib/, resolved for the nodes' Python (binary wheels
#    for CPython $TARGET_PYTHON), so nothing is picked that needs a newer one. The platform
#    only says which of PyYAML's wheels pip may take; its compiled part is removed in step 3.
#    --no-compile: bytecode from this host's Python would be the wrong version; the RPM's
#    %post compiles for the node's own python3.
echo "build.sh: bundling dependencies for Python $TARGET_PYTHON"
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-compile \
    --target "$lib" --only-binary=:all: \
    --python-version "$TARGET_PYTHON" --implementation cp \
    --platform manylinux2014_x86_64 \
    "$stage/wheel/gpugate-$version-py3-none-any.whl"

# 3. Keep the bundle pure Python, so the RPM is noarch (x86_64 and aarch64 Grace nodes alike).
#    PyYAML's wheel carries the libyaml C extension (yaml/_yaml*.so); without it PyYAML falls
#    back to its pure-Python loader (yaml.__with_libyaml__ is False) and gpugate's yamlio uses
#    the C loader only when present. The slower parse hardly matters: parsed config and
#    snapshots are cached as JSON (/var/cache/gpugate). lib/bin holds console scripts whose
#    #! names this build host's Python.
find "$lib" -type f \( -name '*.so' -o -name '*.so.*' -o -name '*.pyd' -o -name '*.dylib' \) -delete
rm -rf "$lib/bin"
# nvidia-ml-py installs its example script as a top-level module; it has no business first on
# the launcher's sys.path.
rm -f "$lib/example.py"
find "$lib" -mindepth 1 -maxdepth 1 -type d -name '*.libs' -exec rm -rf {} + # auditwheel's
compiled=$(find "$lib" -type f -exec sh -c 'head -c 4 "$1" | grep -q "ELF"' _ {} \; -print)
[ -z "$compiled" ] || die "compiled files left in the bundle (not noarch): $compiled"
bytecode=$(find "$lib" \( -name __pycache__ -o -name '*.pyc' \) -print)
[ -z "$bytecode" ] || die "bytecode of the build host's Python in the bundle: $bytecode"

# A smoke test of the bundle alone (-s -E: no user site, no PYTHONPATH; -B: no bytecode of
# this host's Python left in the bundle): it imports, and PyYAML is the pure-Python variant.
"$PYTHON" -s -E -B -c '
import sys
sys.path.insert(0, sys.argv[1])
import yaml, loguru, pynvml, gpugate.cli
assert not yaml.__with_libyaml__, "PyYAML still has its C extension"
assert gpugate.__file__.startswith(sys.argv[1]), gpugate.__file__
' "$lib"

# Record what is bundled, for the spec's `Provides: bundled(python3dist(...))` (security
# trackers find bundled copies through these).
bundled=$("$PYTHON" -s -E - "$lib" <<'EOF'
import os, sys
lib = sys.argv[1]
found = []
for entry in sorted(os.listdir(lib)):
    if entry.endswith(".dist-info"):
        name, version = entry[: -len(".dist-info")].rsplit("-", 1)
        name = name.lower().replace("_", "-")
        if name != "gpugate":
            found.append(f"{name}={version}")
print(" ".join(found))
EOF
)
echo "build.sh: bundled: $bundled"

# 4. The rest of the payload.
install -m 0755 "$here/gpugate" "$tree/bin/gpugate"
install -m 0755 "$repo"/slurm_hooks/gpugate-* "$tree/libexec/"
install -m 0644 "$here/site-gpugate.yaml" "$tree/etc/gpugate.yaml"
install -m 0644 "$here/hook.env.example" "$tree/etc/hook.env"
install -m 0644 "$repo/README.md" "$here/slurm.conf.example" "$tree/doc/"
# Optional documents: shipped when the project has them.
for f in "$repo/config/gpugate-alerts.yml" "$repo"/examples/*.sbatch; do
    [ -f "$f" ] || continue
    case $f in
    *.sbatch) install -m 0644 "$f" "$tree/doc/examples/" ;;
    *) install -m 0644 "$f" "$tree/doc/" ;;
    esac
done

# 5. rpmbuild in a private _topdir (never ~/rpmbuild), with the .rpm written straight into
#    DIST_DIR. --nodeps skips only rpmbuild's check of the *build* host's installed packages:
#    on Debian rpm's database is empty (dpkg owns the packages), so even a satisfied
#    BuildRequires would fail. The package's own Requires are unaffected.
mkdir -p "$topdir/SOURCES" "$topdir/SPECS"
tar -c -z -f "$topdir/SOURCES/gpugate-$version.tar.gz" -C "$stage" "gpugate-$version"
install -m 0644 "$here/gpugate.spec" "$topdir/SPECS/gpugate.spec"
echo "build.sh: rpmbuild"
rm -f "$DIST_DIR/gpugate-$version-$RPM_RELEASE"*.noarch.rpm
rpmbuild -bb --nodeps --quiet \
    --define "_topdir $topdir" \
    --define "_rpmdir $DIST_DIR" \
    --define "_build_name_fmt %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm" \
    --define "gpugate_version $version" \
    --define "gpugate_release $RPM_RELEASE" \
    --define "gpugate_bundled $bundled" \
    "$topdir/SPECS/gpugate.spec"

rpm=$DIST_DIR/gpugate-$version-$RPM_RELEASE$(rpm --eval '%{?dist}').noarch.rpm
[ -f "$rpm" ] || die "rpmbuild did not write $rpm"
echo "$rpm"
