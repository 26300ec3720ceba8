#!/usr/bin/env bash
# diffs.sh: `make diffs`. Writes docs/diffs/NN_name.diff, the unified diff of each chapter's
# train.cpp against its base chapter's: exactly what the lesson adds. The base is the previous
# chapter, unless the chapter's file names another on a line "// Base chapter: NN_name" (07 builds
# on 03, not on ZeRO-3). Generated, never edited by hand. With --check, writes nothing and fails if any file is missing or stale (make test runs it).
set -euo pipefail
cd "$(dirname "$0")/../.."
check=${1:-}
mkdir -p docs/diffs
previous=""
stale=0
for chapter in $(ls -d [0-9][0-9]_*/ | tr -d / | sort); do
  [ -f "$chapter/train.cpp" ] || continue
  base=$(sed -n 's|^// Base chapter: \([0-9][0-9]_[A-Za-z0-9_]*\).*|\1|p' "$chapter/train.cpp" | head -n 1)
  base=${base:-$previous}
  if [ -n "$base" ]; then
    out="docs/diffs/$chapter.diff"
    fresh=$(diff -u --label "$base/train.cpp" --label "$chapter/train.cpp" \
      "$base/train.cpp" "$chapter/train.cpp" || true)
    if [ "$check" = "--check" ]; then
      if [ ! -f "$out" ] || [ "$(cat "$out")" != "$fresh" ]; then
        echo "stale or missing: $out (run 'make diffs' and commit it)"
        stale=1
      fi
    else
      printf '%s\n' "$fresh" > "$out"
      echo "wrote $out ($(grep -c '^[+-][^+-]' "$out") changed lines)"
    fi
  fi
  previous=$chapter
done
exit $stale
