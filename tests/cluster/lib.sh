# Sourced by the tests of tests/cluster/: a cluster in a box of their own, torn down at the
# exit whatever happens.
#
#   cluster_begin PREFIX up-flags...
#       skips (exit 77) where this is not root or network namespaces cannot be made; brings
#       up a cluster named PREFIX and this shell's pid (unique among the tests running at
#       once): its name in cname, the tool in CL, its folder in cdir. At the exit it is torn
#       down and $tmp (when set) removed.
#   rank_hosts LOG          "rank host" for every rank of a run's per-rank table
CL=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/cluster.sh

cluster_end() {
    [ -n "${cname:-}" ] && "$CL" down "$cname" >/dev/null
    [ -n "${tmp:-}" ] && rm -rf "$tmp"
}

cluster_begin() {
    local prefix=$1
    shift
    [ "$(id -u)" = 0 ] || { echo "SKIP not root: a cluster in a box needs network namespaces"; exit 77; }
    ip netns list >/dev/null 2>&1 && unshare --net true 2>/dev/null ||
        { echo "SKIP no network namespaces here ('ip netns' or unshare --net fails)"; exit 77; }
    cname=$prefix$$
    trap cluster_end EXIT
    trap 'exit 1' INT TERM HUP
    "$CL" up "$cname" "$@" >"${TMPDIR:-/tmp}/$cname.up.log" 2>&1 ||
        { echo "FAIL cluster.sh up $cname $*: $(tail -3 "${TMPDIR:-/tmp}/$cname.up.log")"; rm -f "${TMPDIR:-/tmp}/$cname.up.log"; exit 1; }
    echo "ok   $(head -1 "${TMPDIR:-/tmp}/$cname.up.log")"
    rm -f "${TMPDIR:-/tmp}/$cname.up.log"
    cdir=$("$CL" dir "$cname")
}

rank_hosts() { awk '$1 == "rank" && $2 ~ /^[0-9]+$/ && $4 ~ /^[0-9.]+$/ {print $2, $3}' "$1"; }
