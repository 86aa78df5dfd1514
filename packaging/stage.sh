#!/usr/bin/env bash
# Stage gpugate's install tree, shared by the RPM (packaging/rpm/build.sh) and the .deb
# (packaging/deb/build.sh): `packaging/stage.sh OUT` writes
#   OUT/tree/lib/             gpugate and its pure-Python dependencies (pip install --target)
#   OUT/tree/bin/gpugate      the launcher (#!/usr/bin/python3 -Es)
#   OUT/tree/libexec/         the five Slurm hook wrappers
#   OUT/tree/etc/             gpugate.yaml (all comments) and hook.env, the site's files
#   OUT/tree/doc/             README.md, slurm.conf.example, optional documents, examples/
#   OUT/tree/share/           job_submit.lua (install as /usr/share/gpugate/job_submit.lua),
#                             grafana/gpugate.json (as /usr/share/gpugate/grafana/gpugate.json)
#   OUT/version               this build's version (packaging/version.sh: the project's version
#                             plus +git<count>.<date>.<hash>), written into the wheel too
#   OUT/bundled               "name=version ..." of the bundled dependencies
#
# Nodes run their distribution's system python3 (RHEL 9: 3.9; Debian 12/13, Ubuntu 22.04/24.04:
# 3.10-3.13), so a virtualenv made here would point at this host's interpreter. Instead gpugate
# and its pure-Python dependencies go into a plain directory with `pip install --target`, and
# the launcher puts that directory first on sys.path. The network (PyPI) is needed here, at
# build time, never on the nodes.
#
# Settings (environment):
#   PYTHON          a Python with pip that runs the build (default: python3)
#   TARGET_PYTHON   the oldest Python the nodes run (default: 3.9, RHEL 9); dependencies are
#                   resolved for it, so none is picked that needs a newer one
# pip's own variables apply as usual: PIP_CONSTRAINT=pins.txt fixes the bundled versions,
# PIP_INDEX_URL / PIP_FIND_LINKS point at a mirror.
set -euo pipefail
umask 022 # the payload's modes come from here: files 0644, directories and scripts 0755

packaging=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$packaging/.." && pwd)
PYTHON=${PYTHON:-python3}
TARGET_PYTHON=${TARGET_PYTHON:-3.9}

die() {
    echo "stage.sh: $*" >&2
    exit 1
}

[ $# -eq 1 ] || die "usage: stage.sh OUT (a scratch directory; its contents are replaced)"
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "$PYTHON has no pip (set PYTHON=.venv/bin/python)"

# The version lives in the project, never in the package's metadata: pyproject.toml and
# gpugate/__init__.py must agree, or the package would carry a version the code does not report.
version=$(sed -n 's/^version = "\([^"]*\)"$/\1/p' "$repo/pyproject.toml" | head -n 1)
code_version=$(sed -n 's/^__version__ = "\([^"]*\)"$/\1/p' "$repo/gpugate/__init__.py")
[ -n "$version" ] || die "no version in pyproject.toml"
[ "$version" = "$code_version" ] ||
    die "pyproject.toml says $version but gpugate/__init__.py says $code_version"
# This build's own version (packaging/version.sh says how and why), written into the copy the
# wheel is built from: the package, its metadata and `gpugate --version` carry the same one,
# and no git runs when gpugate starts.
version=$("$packaging/version.sh") || die "packaging/version.sh failed"
# What dpkg, rpm and PEP 440 all take (and sed below writes as it is).
[[ $version =~ ^[0-9][0-9A-Za-z.+~]*$ ]] || die "not a package version: $version"

out=$(mkdir -p "$1" && cd "$1" && pwd)
rm -rf "$out/src" "$out/wheel" "$out/tree" "$out/version" "$out/bundled"
src=$out/src # a copy of the project to build the wheel from
tree=$out/tree
lib=$tree/lib
mkdir -p "$src" "$out/wheel" "$tree/bin" "$tree/libexec" "$tree/etc" "$tree/doc/examples"

# 1. A wheel of gpugate, built from a copy so that setuptools' build/ and egg-info never land
#    in the working tree. The copy holds gpugate/ and the folders its symlinks name.
echo "stage.sh: gpugate $version: building the wheel" >&2
(cd "$repo" && tar -c --exclude=__pycache__ --exclude='*.pyc' \
    pyproject.toml README.md gpugate slurm_hooks config) | tar -x -C "$src"
sed -i "s/^version = \"[^\"]*\"$/version = \"$version\"/" "$src/pyproject.toml"
sed -i "s/^__version__ = \"[^\"]*\"$/__version__ = \"$version\"/" "$src/gpugate/__init__.py"
grep -qx "__version__ = \"$version\"" "$src/gpugate/__init__.py" ||
    die "could not write version $version into the wheel's gpugate/__init__.py"
"$PYTHON" -m pip wheel --quiet --disable-pip-version-check --no-deps \
    --wheel-dir "$out/wheel" "$src" >&2

# 2. gpugate and its dependencies into lib/, resolved for the nodes' Python (binary wheels
#    for CPython $TARGET_PYTHON), so nothing is picked that needs a newer one. The platform
#    only says which of PyYAML's wheels pip may take; its compiled part is removed in step 3.
#    --no-compile: bytecode from this host's Python would be the wrong version; the package's
#    post-install script compiles for the node's own python3.
echo "stage.sh: bundling dependencies for Python $TARGET_PYTHON" >&2
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-compile \
    --target "$lib" --only-binary=:all: \
    --python-version "$TARGET_PYTHON" --implementation cp \
    --platform manylinux2014_x86_64 \
    "$out/wheel/gpugate-$version-py3-none-any.whl" >&2

# 3. Keep the bundle pure Python, so the package is noarch / Architecture: all (x86_64 and
#    aarch64 Grace nodes alike). PyYAML's wheel carries the libyaml C extension (yaml/_yaml*.so);
#    without it PyYAML falls back to its pure-Python loader (yaml.__with_libyaml__ is False) and
#    gpugate's yamlio uses the C loader only when present. The slower parse hardly matters:
#    parsed config and snapshots are cached (marshal, /var/cache/gpugate). lib/bin holds console
#    scripts whose #! names this build host's Python.
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
assert gpugate.__version__ == sys.argv[2], (gpugate.__version__, sys.argv[2])
' "$lib" "$version"

# Record what is bundled (the RPM's `Provides: bundled(python3dist(...))`, the .deb's
# description): security trackers find bundled copies through these.
"$PYTHON" -s -E - "$lib" >"$out/bundled" <<'EOF'
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
echo "stage.sh: bundled: $(cat "$out/bundled")" >&2

# 4. The rest of the payload (packaging/rpm holds the files both packages ship).
rpmdir=$packaging/rpm
install -m 0755 "$rpmdir/gpugate" "$tree/bin/gpugate"
install -m 0755 "$repo"/slurm_hooks/gpugate-* "$tree/libexec/"
install -m 0644 "$rpmdir/site-gpugate.yaml" "$tree/etc/gpugate.yaml"
install -m 0644 "$rpmdir/hook.env.example" "$tree/etc/hook.env"
install -m 0644 "$repo/README.md" "$rpmdir/slurm.conf.example" "$tree/doc/"
# The pages the README links to (docs/guide/install.md, ...), so that its links hold on a node
# (/usr/share/doc/gpugate/docs/...); the markdown only, not the site's build.
(cd "$repo" && find docs -name '*.md' -type f) | while read -r page; do
    install -D -m 0644 "$repo/$page" "$tree/doc/$page"
done
# Optional documents: shipped when the project has them.
for f in "$repo/config/gpugate-alerts.yml" "$repo"/examples/*.sbatch; do
    [ -f "$f" ] || continue
    case $f in
    *.sbatch) install -m 0644 "$f" "$tree/doc/examples/" ;;
    *) install -m 0644 "$f" "$tree/doc/" ;;
    esac
done
# Slurm's job_submit.lua (the checkpoint policy at submission) with the packaged thresholds,
# generated by the bundle itself; sites regenerate it from their own gpugate.yaml with
# `gpugate submit-policy --lua -o /etc/slurm/job_submit.lua` (JobSubmitPlugins=lua).
mkdir -p "$tree/share"
"$PYTHON" -s -E -B -c '
import sys
sys.path.insert(0, sys.argv[1])
from gpugate.commands.submit_policy import main
sys.exit(main(["--config", "/dev/null", "--lua", "-o", sys.argv[2]]))
' "$lib" "$tree/share/job_submit.lua"
# The Grafana dashboard (docs/guide/monitoring.md), generated and committed by
# tools/gen_grafana_dashboard.py.
install -D -m 0644 "$repo/config/grafana/gpugate.json" "$tree/share/grafana/gpugate.json"
echo "$version" >"$out/version"
