#!/usr/bin/env bash
# Downloads (never installs) the Debian packages that tests/gpu/check.sh unpacks on a GPU machine
# whose image lacks Lua, OpenBLAS, libyaml or pkg-config and cannot reach a package registry.
# Run it here before a GPU session; the .deb files land in .deps/ (git-ignored), which the
# session must carry along (device tool: carry [".deps"]).
set -euo pipefail
cd "$(dirname "$0")/../.."
pkgs="liblua5.4-0 liblua5.4-dev libopenblas0-openmp libopenblas-openmp-dev libgfortran5
      libquadmath0 libyaml-0-2 libyaml-dev pkgconf pkgconf-bin libpkgconf3 pkg-config"
mkdir -p .deps
cd .deps
rm -f ./*.deb
if ! apt-get download $pkgs; then
    echo "fetch_debs: apt-get download failed; try 'apt-get update' first" >&2
    exit 1
fi
ls -1 ./*.deb | sed 's|^\./|fetch_debs: |'
du -sh . | sed 's/^/fetch_debs: total /'
