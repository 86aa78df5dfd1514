#!/usr/bin/env bash
# Build the gpugate .deb: dist/gpugate_<version>_all.deb (`make deb`), with Debian's own
# dpkg-deb, for the system python3 of Debian 12/13 and Ubuntu 22.04/24.04.
#
# The layout is the RPM's (packaging/rpm/gpugate.spec says why); packaging/stage.sh stages
# the tree for both. Here it is laid out as the package's root, with DEBIAN/ (control,
# conffiles, the maintainer scripts in this directory) and built by
# `dpkg-deb --build --root-owner-group`: every file root's, modes as staged and set below.
# The network (PyPI) is needed here, at build time, never on the nodes.
#
# Settings (environment):
#   PYTHON          a Python with pip that runs the build (default: python3)
#   BUILD_DIR       scratch space (default: build/deb); only its stage/ and root/ are replaced
#   DIST_DIR        where the .deb goes (default: dist)
#   TARGET_PYTHON   the oldest Python the nodes run (default: 3.9): see stage.sh
set -euo pipefail
umask 022
HOOKS="gpugate-prolog gpugate-epilog gpugate-task-prolog gpugate-epilog-slurmctld gpugate-health"
if ! command -v dpkg-deb >/dev/null; then
    echo "build.sh: dpkg-deb not found (it is in Debian's dpkg package)" >&2
    exit 1
fi

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
PYTHON=${PYTHON:-python3} BUILD_DIR=${BUILD_DIR:-$repo/build/deb} DIST_DIR=${DIST_DIR:-$repo/dist}

mkdir -p "$BUILD_DIR" "$DIST_DIR"
BUILD_DIR=$(cd "$BUILD_DIR" && pwd) DIST_DIR=$(cd "$DIST_DIR" && pwd)
root=$BUILD_DIR/root
rm -rf "$root"
# stage.sh replaces what it writes under stage/: tree/, version, bundled.
PYTHON=$PYTHON "$repo/packaging/stage.sh" "$BUILD_DIR/stage"
tree=$BUILD_DIR/stage/tree
version=$(cat "$BUILD_DIR/stage/version") bundled=$(cat "$BUILD_DIR/stage/bundled")
# PEP 440 pre-releases sort before the release in Debian only with a tilde: 1.0rc1 -> 1.0~rc1.
deb_version=$(echo "$version" | sed -E 's/^([0-9.]+)(a|b|rc|\.dev)/\1~\2/')

# The package's root: the same paths as the RPM's %install.
mkdir -p "$root" && chmod 0755 "$root" # becomes ./ in the archive
install -d "$root/opt/gpugate/bin" "$root/usr/bin" "$root/usr/libexec/gpugate" \
    "$root/etc/gpugate" "$root/usr/share/doc/gpugate" "$root/DEBIAN"
cp -pr "$tree/lib" "$root/opt/gpugate/lib"
install -m 0755 "$tree/bin/gpugate" "$root/opt/gpugate/bin/gpugate"
# Relative, so the link also resolves in a tree unpacked somewhere else (dpkg-deb -x, images).
ln -s ../../opt/gpugate/bin/gpugate "$root/usr/bin/gpugate"
for hook in $HOOKS; do
    install -m 0755 "$tree/libexec/$hook" "$root/usr/libexec/gpugate/$hook"
done
install -m 0644 "$tree/etc/gpugate.yaml" "$tree/etc/hook.env" "$root/etc/gpugate/"
# State: others may only pass through, to their own job's task/<job id>.json (the TaskProlog);
# evidence bundles hold job logs (secrets), but SlurmUser passes through evidence/ to the
# decision records in evidence/controller-view/ (0750 root:slurm, made by postinst); controller/ is where EpilogSlurmctld
# writes, given to the slurm user by postinst; the parsed-YAML cache is root's alone.
install -d -m 0751 "$root/var/lib/gpugate"
install -d -m 0751 "$root/var/lib/gpugate/evidence"
install -d -m 0751 "$root/var/lib/gpugate/controller"
# The jobs' NCCL directories (task_prolog.nccl_debug_dir): root's, 0755, so no user can create
# it first (issue 25: a squatted /var/tmp/gpugate-nccl received other users' NCCL logs).
install -d -m 0755 "$root/var/lib/gpugate/nccl"
install -d -m 0700 "$root/var/cache/gpugate"
cp -pr "$tree/doc/." "$root/usr/share/doc/gpugate/"
rmdir --ignore-fail-on-non-empty "$root/usr/share/doc/gpugate/examples"
install -m 0644 "$here/copyright" "$root/usr/share/doc/gpugate/copyright"
# Slurm's job_submit.lua with the packaged thresholds (the site copies it beside slurm.conf).
install -D -m 0644 "$tree/share/job_submit.lua" "$root/usr/share/gpugate/job_submit.lua"
# The Grafana dashboard, for an admin to import (docs/guide/monitoring.md).
install -D -m 0644 "$tree/share/grafana/gpugate.json" "$root/usr/share/gpugate/grafana/gpugate.json"

# DEBIAN/: conffiles (dpkg keeps an edited one on upgrade and asks, or writes .dpkg-dist),
# the maintainer scripts, and control, written last: Installed-Size is the payload's, in KiB.
printf '%s\n' /etc/gpugate/gpugate.yaml /etc/gpugate/hook.env >"$root/DEBIAN/conffiles"
for script in postinst prerm postrm; do
    install -m 0755 "$here/$script" "$root/DEBIAN/$script"
done
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s/@VERSION@/$deb_version/" -e "s/@INSTALLED_SIZE@/$size/" \
    -e "s/@BUNDLED@/${bundled:-none}/" "$here/control.in" >"$root/DEBIAN/control"

deb=$DIST_DIR/gpugate_${deb_version}_all.deb
rm -f "$deb"
echo "build.sh: dpkg-deb" >&2
# -Zxz: the data.tar that unown_dirs.py rewrites (Ubuntu's dpkg-deb would otherwise use zstd).
dpkg-deb --build --root-owner-group -Zxz "$root" "$deb" >&2
# /opt is no directory of gpugate's, only /opt/gpugate and below: no package owns /opt
# (base-files' postinst makes it), so with ./opt/ listed, dpkg tried to remove /opt whenever
# gpugate was removed and warned that it was not empty (unown_dirs.py says more).
"$PYTHON" -s -E "$here/unown_dirs.py" "$deb" ./opt/
echo "$deb"
