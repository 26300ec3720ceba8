#!/usr/bin/env bash
# check_formats.sh: 13_mixed_precision/formats from outside, as a reader would use it (make test runs
# it): fp32 bit patterns on stdin, one labelled line of codes per input, values worked out by hand from
# the formats' fields; a malformed line is named and makes the exit status 1.
set -euo pipefail
cd "$(dirname "$0")/../.."
program=13_mixed_precision/formats
[ -x "$program" ] || { echo "$program not built: run 'make tests'"; exit 1; }
# 1.0; 464 (E4M3's tie between 448 and overflow: 448); 65504 (fp16's max; over E5M2's 57344: inf);
# 2^-8 (E4M3's subnormal 2 x 2^-9); +inf; a NaN; 2^-25 (half fp16's smallest subnormal: ties to 0).
got=$(printf '0x3f800000\n0x43e80000\n0x477fe000\n0x3b800000\n0x7f800000\n0x7fc00000\n0x33000000\n' | "$program")
want='bf16=0x3f80 fp16=0x3c00 e4m3=0x38 e5m2=0x3c
bf16=0x43e8 fp16=0x5f40 e4m3=0x7e e5m2=0x5f
bf16=0x4780 fp16=0x7bff e4m3=0x7f e5m2=0x7c
bf16=0x3b80 fp16=0x1c00 e4m3=0x02 e5m2=0x1c
bf16=0x7f80 fp16=0x7c00 e4m3=0x7f e5m2=0x7c
bf16=0x7fc0 fp16=0x7e00 e4m3=0x7f e5m2=0x7f
bf16=0x3300 fp16=0x0000 e4m3=0x00 e5m2=0x00'
if [ "$got" != "$want" ]; then
  echo "formats: unexpected codes"; diff <(echo "$want") <(echo "$got"); exit 1
fi
saturated=$(printf '0x7f800000\n' | "$program" --saturate)
[ "$saturated" = "bf16=0x7f7f fp16=0x7bff e4m3=0x7e e5m2=0x7b" ] || { echo "formats --saturate: $saturated"; exit 1; }
if printf '0x3f800000\n12\n' | "$program" >/dev/null 2>"${TMPDIR:-/tmp}/formats_err.$$"; then
  echo "formats accepted a line without 0x"; exit 1
fi
grep -q "line 2" "${TMPDIR:-/tmp}/formats_err.$$" || { echo "formats did not name the bad line"; exit 1; }
rm -f "${TMPDIR:-/tmp}/formats_err.$$"
help=$("$program" --help) || { echo "formats --help: a non-zero exit"; exit 1; }
[[ "$help" == usage:* ]] || { echo "formats --help: no usage"; exit 1; }
echo "formats: 8 patterns as expected, a bad line refused, --help"
