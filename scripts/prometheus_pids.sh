# Sourced by scripts/test.sh: find Prometheus processes by pid, so that the test command stops only the ones its
# own package install started, never a user's (no pkill by name).

# The pids of running processes named $1 (default prometheus), space-separated; read from /proc, as procps may be
# missing on a fresh machine.
prometheus_pids() {
  local name=${1:-prometheus} dir
  for dir in /proc/[0-9]*; do
    if [ "$(cat "$dir/comm" 2>/dev/null)" = "$name" ]; then printf '%s ' "${dir#/proc/}"; fi
  done
  return 0
}

# Stop the processes named $2 (default prometheus) that are not among the pids in $1 (those running before).
stop_new_prometheus() {
  local before=" $1 " pid
  for pid in $(prometheus_pids "${2:-prometheus}"); do
    case "$before" in
      *" $pid "*) ;;
      *) ${SUDO:-} kill "$pid" 2>/dev/null || true ;;
    esac
  done
  return 0
}
