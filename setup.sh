#!/usr/bin/env bash
# Install what is missing (Debian packages) and build trainer into build/.
# Usage: ./setup.sh [extra cmake options], e.g. ./setup.sh -DTR_WERROR=ON
set -euo pipefail
cd "$(dirname "$0")"
# TR_EXTRA_PKGS: more packages to install (tests/all.sh adds the test-only ones)
pkgs="cmake make gcc pkg-config liblua5.4-dev libyaml-dev libsodium-dev libopenblas-openmp-dev
      openmpi-bin libopenmpi-dev ${TR_EXTRA_PKGS:-}"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "setup: installing$missing"
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$(nproc)"
echo "setup: built build/trainer"
