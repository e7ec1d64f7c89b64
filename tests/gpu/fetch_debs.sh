#!/usr/bin/env bash
# Downloads (never installs) the Debian packages that tests/gpu/check.sh unpacks on a GPU machine
# whose image lacks Lua, OpenBLAS, libyaml, pkg-config or Open MPI and cannot reach a package
# registry. Run it here before a GPU session; the .deb files land in .deps/ (git-ignored), which
# the session must carry along (device tool: carry [".deps"]).
#
# Open MPI (in .deps/mpi/, unpacked apart: its own prefix, relocated with OPAL_PREFIX): its
# runtime (mpirun, libmpi and the libraries of its plugins) and its headers. The
# libraries were listed from `ldd` over every ELF file of openmpi-bin, libopenmpi3 and libpmix2
# (apt-cache depends --recurse pulls in compilers and -dev packages we do not link), less what
# every CUDA image already holds and must not be shadowed by an older copy on
# LD_LIBRARY_PATH: libc6, libgcc-s1, libstdc++6, libatomic1 (gcc's), zlib1g, libuuid1, libudev1.
set -euo pipefail
cd "$(dirname "$0")/../.."
pkgs="liblua5.4-0 liblua5.4-dev libopenblas0-openmp libopenblas-openmp-dev libgfortran5
      libquadmath0 libyaml-0-2 libyaml-dev libsodium23 libsodium-dev pkgconf pkgconf-bin
      libpkgconf3 pkg-config"
mpi="openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libpmix2 libhwloc15
     libevent-core-2.1-7 libevent-pthreads-2.1-7 libucx0 libfabric1 libibverbs1
     ibverbs-providers librdmacm1 libpsm2-2 libpsm-infinipath1 libnuma1 libnl-3-200
     libnl-route-3-200 libmunge2"
mkdir -p .deps/mpi
cd .deps
rm -f ./*.deb mpi/*.deb
# shellcheck disable=SC2086 # the lists are split into names on purpose
if ! apt-get download $pkgs || ! (cd mpi && apt-get download $mpi); then
    echo "fetch_debs: apt-get download failed; try 'apt-get update' first" >&2
    exit 1
fi
find . -name '*.deb' | sort | sed 's|^\./|fetch_debs: |'
du -sh . | sed 's/^/fetch_debs: total /'
kb=$(du -sk . | cut -f1)
[ "$kb" -lt 61440 ] || echo "fetch_debs: warning: ${kb} kB, more than the 60 MB meant to travel" >&2
