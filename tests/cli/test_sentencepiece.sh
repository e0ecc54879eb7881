#!/usr/bin/env bash
# The [sentencepiece] Catch2 tests; exit 77 (ctest: Skipped) where SentencePiece cannot
# be loaded, saying why. usage: test_sentencepiece.sh path/to/tinylm_tests
set -u
tests=$1
out=$("$tests" "[sentencepiece]" 2>&1); status=$?
if [ "$status" -ne 0 ] && grep -q "SentencePiece is not available\|SentencePiece module" <<<"$out"; then
  grep -m1 "SentencePiece" <<<"$out"
  echo "SKIP: SentencePiece cannot be loaded in this build"
  exit 77
fi
echo "$out" | tail -5
exit "$status"
