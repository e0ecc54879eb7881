# Sourced by the scripts that build and test. phase NAME COMMAND...: runs COMMAND and, where
# $TINYLM_TIMINGS names a file, appends "NAME MILLISECONDS STATUS" to it (scripts/ci.sh
# turns these into its table). Returns COMMAND's status.
phase() {
  local name=$1 start status=0
  shift
  start=$(date +%s%N)
  "$@" || status=$?
  if [ -n "${TINYLM_TIMINGS:-}" ]; then
    echo "$name $(( ($(date +%s%N) - start) / 1000000 )) $status" >> "$TINYLM_TIMINGS"
  fi
  return "$status"
}
