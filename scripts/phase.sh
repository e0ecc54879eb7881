# Sourced by the scripts that build and test. phase NAME COMMAND...: runs COMMAND, prints
# how long it took ("phase NAME: M:SS") and, where $TINYLM_TIMINGS names a file, appends
# "NAME MILLISECONDS STATUS" to it (scripts/ci.sh turns these into its table,
# scripts/quickstart.sh into its closing line). Returns COMMAND's status.
phase() {
  local phase_name=$1 phase_start phase_status=0 phase_ms
  shift
  phase_start=$(date +%s%N)
  "$@" || phase_status=$?
  phase_ms=$(( ($(date +%s%N) - phase_start) / 1000000 ))
  printf 'phase %s: %d:%02d%s\n' "$phase_name" $(( phase_ms / 60000 )) $(( phase_ms / 1000 % 60 )) \
    "$([ "$phase_status" = 0 ] || echo " (failed, status $phase_status)")"
  if [ -n "${TINYLM_TIMINGS:-}" ]; then
    echo "$phase_name $phase_ms $phase_status" >> "$TINYLM_TIMINGS"
  fi
  return "$phase_status"
}
