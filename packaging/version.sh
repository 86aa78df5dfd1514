#!/usr/bin/env bash
# The version a build of gpugate carries (.deb, .rpm, the wheel's metadata, `gpugate --version`),
# printed on stdout. Every commit builds a version of its own, and later commits sort higher
# for dpkg and rpm:
#
#   <pyproject version>+git<commit count>.<commit date, UTC, YYYYMMDD>.<short hash>[.dirty]
#   0.1.0+git607.20261204.053de11
#
# The commit count comes first because it is what orders the builds of one branch: commit
# dates can go backwards (a rebased or cherry-picked commit, a committer's clock), counts along
# a history cannot. The date and hash say which commit it is; .dirty marks a build from a tree
# with uncommitted changes to tracked files.
#
# Without git (a tarball, a copy of the files: .ci/second-slurm's root), GPUGATE_VERSION names
# the version when set (a distribution's build, or the copy's own checkout's version); else it
# is the plain pyproject version, said on stderr: such a build sorts below every git build.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
base=$(sed -n 's/^version = "\([^"]*\)"$/\1/p' "$repo/pyproject.toml" | head -n 1)
[ -n "$base" ] || {
    echo "version.sh: no version in $repo/pyproject.toml" >&2
    exit 1
}
if [ -n "${GPUGATE_VERSION:-}" ]; then
    echo "$GPUGATE_VERSION"
    exit 0
fi
git() { timeout 30 git -C "$repo" "$@"; }
# Only this checkout's own history: a tarball unpacked inside another repository is no commit.
if [ "$(git rev-parse --show-toplevel 2>/dev/null)" != "$repo" ]; then
    echo "version.sh: no git checkout at $repo: version $base (set GPUGATE_VERSION)" >&2
    echo "$base"
    exit 0
fi
count=$(git rev-list --count HEAD)
date=$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d HEAD)
hash=$(git rev-parse --short=7 HEAD)
dirty=
[ -z "$(git status --porcelain --untracked-files=no)" ] || dirty=.dirty
echo "$base+git$count.$date.$hash$dirty"
