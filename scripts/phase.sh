# Sourced by the scripts that build and test. phase NAME COMMAND...: runs COMMAND and, where
# $TINYLM_TIMINGS names a file, appends "NAME MILLISECONDS STATUS" to it (scripts/ci.sh
# turns these into its table). Returns COMMAND's status.
phase() {
  local phase_name=$1 phase_start phase_status=0
  shift
  phase_start=$(date +%s%N)
  "$@" || phase_status=$?
  if [ -n "${TINYLM_TIMINGS:-}" ]; then
    echo "$phase_name $(( ($(date +%s%N) - phase_start) / 1000000 )) $phase_status" >> "$TINYLM_TIMINGS"
  fi
  return "$phase_status"
}
