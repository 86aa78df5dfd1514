#!/usr/bin/env bash
# Build the gpugate RPM: dist/gpugate-<version>-<release>.noarch.rpm (`make rpm`).
#
# Sites run RHEL 9 and its system Python 3.9. packaging/stage.sh (shared with the .deb) stages
# the tree: gpugate and its pure-Python dependencies in lib/ (`pip install --target`, which the
# RPM ships as /opt/gpugate/lib), the launcher, the hook wrappers, the site's files and docs.
# The network (PyPI) is needed here, at build time, never on the nodes.
#
# Settings (environment):
#   PYTHON          a Python with pip that runs the build (default: python3)
#   BUILD_DIR       scratch space (default: build/rpm); only its stage/ and topdir/ are replaced
#   DIST_DIR        where the .rpm goes (default: dist)
#   RPM_RELEASE     the RPM Release (default: 1; the build host's %{dist} is appended)
#   TARGET_PYTHON   the oldest Python the nodes run (default: 3.9, RHEL 9): see stage.sh
# pip's own variables apply as usual (stage.sh).
set -euo pipefail
umask 022

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
PYTHON=${PYTHON:-python3}
BUILD_DIR=${BUILD_DIR:-$repo/build/rpm}
DIST_DIR=${DIST_DIR:-$repo/dist}
RPM_RELEASE=${RPM_RELEASE:-1}

die() {
    echo "build.sh: $*" >&2
    exit 1
}

command -v rpmbuild >/dev/null || die "rpmbuild not found (Debian: apt-get install rpm; RHEL: dnf install rpm-build)"

BUILD_DIR=$(mkdir -p "$BUILD_DIR" && cd "$BUILD_DIR" && pwd)
mkdir -p "$DIST_DIR"
DIST_DIR=$(cd "$DIST_DIR" && pwd)
stage=$BUILD_DIR/stage
topdir=$BUILD_DIR/topdir
rm -rf "$stage" "$topdir"

# 1-4. The tree (stage.sh): it becomes Source0, gpugate-<version>/, everything %install needs.
PYTHON=$PYTHON "$repo/packaging/stage.sh" "$stage"
version=$(cat "$stage/version")
bundled=$(cat "$stage/bundled")
mv "$stage/tree" "$stage/gpugate-$version"

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
