#!/bin/sh
# One bad recipe through `trainer show`: passes iff it exits non-zero and prints exactly one
# line on stderr containing the text after `-- expect: ` on the recipe's first line. An
# optional second line `-- args: FLAGS` gives show flags (a bad layout: `-- args: --tp 4`).
# Usage: bad_recipe.sh TRAINER FILE. Runs from FILE's folder with the plain file name, so
# messages name the file as a user in that folder would see it.
set -u
if [ $# -ne 2 ]; then
    echo "usage: $0 TRAINER FILE" >&2
    exit 2
fi
trainer=$1
case $trainer in
/*) ;;
*/*) trainer=$(pwd)/$trainer ;; # a relative path would break after the cd below
esac
dir=$(dirname "$2")
name=$(basename "$2")
cd "$dir" || exit 1

expect=$(sed -n '1s/^-- expect: //p' "$name")
if [ -z "$expect" ]; then
    echo "FAIL $name: its first line must be '-- expect: <message>'"
    exit 1
fi

args=$(sed -n '2s/^-- args: //p' "$name")

errfile=$(mktemp) || exit 1
trap 'rm -f "$errfile"' EXIT
# shellcheck disable=SC2086 # the flags are words
"$trainer" show "$name" $args >/dev/null 2>"$errfile"
status=$?
got=$(cat "$errfile")
lines=$(awk 'END { print NR }' "$errfile") # counts a last line without a newline too

fail() {
    echo "FAIL $name: $1"
    echo "  expected (exit != 0, one line on stderr containing): $expect"
    [ -z "$args" ] || echo "  (show flags: $args)"
    echo "  got exit $status, $lines line(s) on stderr:"
    sed 's/^/  | /' "$errfile"
    exit 1
}
[ "$status" -ne 0 ] || fail "exit status 0"
[ "$lines" -eq 1 ] || fail "stderr is not exactly one line"
printf '%s\n' "$got" | grep -qF -- "$expect" || fail "message differs"
echo "ok $name"
