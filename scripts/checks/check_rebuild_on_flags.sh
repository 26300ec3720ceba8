#!/usr/bin/env bash
# check_rebuild_on_flags.sh (a test, tests/manifest.txt): a change of compile flags must rebuild what
# they compile. It builds one object in a scratch build folder, then asks make (-q: only "is it up to
# date?") with the same flags, which must say yes, and with another ARCH, which must say no.
set -u
cd "$(dirname "$0")/../.."
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
object="$build/common/base/check.o"
make --no-print-directory -s BUILD="$build" "$object" >/dev/null 2>&1 || { echo "could not build $object"; exit 1; }
if ! make --no-print-directory -s -q BUILD="$build" "$object" >/dev/null 2>&1; then
  echo "FAILED: make would rebuild $object although no flag changed"; exit 1
fi
if make --no-print-directory -s -q BUILD="$build" ARCH=-march=x86-64-v2 "$object" >/dev/null 2>&1; then
  echo "FAILED: ARCH=-march=x86-64-v2 after a native build would rebuild nothing"; exit 1
fi
echo "a new ARCH rebuilds; the same flags rebuild nothing"
