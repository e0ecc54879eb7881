#!/usr/bin/env bash
# The README's library example is tests/cmake-consumer/main.cpp, byte for byte: the code
# block between the BEGIN and END markers must equal the file the consumer test builds.
# usage: test_readme_example.sh SOURCE_DIR
set -euo pipefail
src="$1"
block="$(mktemp)"
trap 'rm -f "$block"' EXIT
awk '/^<!-- BEGIN tests\/cmake-consumer\/main.cpp -->$/ { inside = 1; next }
     /^<!-- END tests\/cmake-consumer\/main.cpp -->$/   { inside = 0 }
     inside' "$src/README.md" | sed '1{/^```cpp$/d}' | sed '${/^```$/d}' > "$block"
if [ ! -s "$block" ]; then
  echo "FAIL: README.md has no example between the BEGIN/END tests/cmake-consumer/main.cpp markers"
  exit 1
fi
if ! diff -u "$src/tests/cmake-consumer/main.cpp" "$block"; then
  echo "FAIL: README.md's library example differs from tests/cmake-consumer/main.cpp (diff above)"
  exit 1
fi
echo "ok: README.md's library example is tests/cmake-consumer/main.cpp ($(wc -l < "$block") lines)"
