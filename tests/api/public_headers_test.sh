#!/usr/bin/env bash
# Each umbrella header compiles alone (as a consumer's only include) and
# reaches no gRPC or generated protobuf header. Prints, per umbrella, the
# headers reached and the preprocessed lines (the figure issue #36 tracks).
set -uo pipefail
root="${TEST_SRCDIR:?}"
work="${TEST_TMPDIR:-$(mktemp -d)}"
fail=0
for h in ferry c10d ddp store testing; do
  src="$work/$h.cc"
  printf '#include "ferry/%s.h"\nint main() { return 0; }\n' "$h" >"$src"
  if ! g++ -std=c++20 -fsyntax-only -H -I"$root" "$src" 2>"$work/$h.H"; then
    echo "FAIL ferry/$h.h does not compile on its own:"
    grep -v '^\.' "$work/$h.H" | head -20
    fail=1
    continue
  fi
  reached=$(grep -E '^\.+ ' "$work/$h.H" | awk '{print $2}' | sort -u)
  bad=$(echo "$reached" | grep -E 'grpc|google/protobuf|\.pb\.h' || true)
  if [[ -n $bad ]]; then
    echo "FAIL ferry/$h.h reaches gRPC/protobuf headers:"
    echo "$bad" | head -10
    # The chain to the first one.
    first=$(echo "$bad" | head -1)
    grep -E '^\.+ ' "$work/$h.H" | grep -B8 -m1 -F "$first"
    fail=1
  fi
  lines=$(g++ -std=c++20 -E -I"$root" "$src" | wc -l)
  echo "ferry/$h.h: $(echo "$reached" | wc -l) headers," \
    "$(echo "$reached" | grep -c "^$root") of them Ferry's, $lines lines"
done
# The floor under those figures: the Abseil header every API returns.
printf '#include "absl/status/statusor.h"\n' >"$work/floor.cc"
echo "absl/status/statusor.h alone: $(g++ -std=c++20 -E "$work/floor.cc" | wc -l) lines"
exit $fail
