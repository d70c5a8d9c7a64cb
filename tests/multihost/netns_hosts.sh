#!/usr/bin/env bash
# Builds N "hosts" on this machine for a test and holds them until stdin
# closes, then removes them (also on SIGTERM/SIGINT/HUP or any error).
#
#   netns_hosts.sh N
#
# Host i is network namespace fmh<pid>h<i> with interface eth0 at
# 10.213.0.<i+1>/24 (and lo). Each eth0 is one end of a veth pair whose other
# end, vh<i>, is a port of bridge br0 in the switch namespace fmh<pid>sw.
# Nothing is added to the machine's own namespace: traffic stays between the
# test's namespaces. Prints, one a line:
#   host <i> <namespace> <address>
#   switch <namespace>
#   ready
# or "skip: <reason>" (exit 0) when namespaces cannot be created (no root),
# or "error: <reason>" (exit 1).
set -u
n=${1:?usage: netns_hosts.sh N}
prefix="fmh$$"
made=()

cleanup() {
  for ns in "${made[@]}"; do ip netns del "$ns" 2>/dev/null; done
  made=()
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# Namespaces left by a harness that was SIGKILLed (its pid is gone).
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^fmh[0-9]+(sw|h[0-9]+)$'); do
  pid=${ns#fmh}
  pid=${pid%%[sh]*}
  if ! kill -0 "$pid" 2>/dev/null; then ip netns del "$ns" 2>/dev/null; fi
done

if ! command -v ip >/dev/null; then echo "skip: iproute2's ip is not installed"; exit 0; fi
if ! err=$(ip netns add "${prefix}sw" 2>&1); then
  echo "skip: cannot create network namespaces (needs root / CAP_SYS_ADMIN): $err"
  exit 0
fi
made+=("${prefix}sw")

run() {
  local out
  if ! out=$("$@" 2>&1); then
    echo "error: $* failed: $out"
    exit 1
  fi
}

sw="${prefix}sw"
run ip -n "$sw" link set lo up
run ip -n "$sw" link add br0 type bridge
run ip -n "$sw" link set br0 up
for ((i = 0; i < n; i++)); do
  ns="${prefix}h$i"
  run ip netns add "$ns"
  made+=("$ns")
  run ip -n "$ns" link set lo up
  run ip -n "$ns" link add eth0 type veth peer name "vh$i" netns "$sw"
  run ip -n "$ns" addr add "10.213.0.$((i + 1))/24" dev eth0
  run ip -n "$ns" link set eth0 up
  run ip -n "$sw" link set "vh$i" master br0
  run ip -n "$sw" link set "vh$i" up
  echo "host $i $ns 10.213.0.$((i + 1))"
done
echo "switch $sw"
echo "ready"
# Held until the test closes our stdin (or dies, which closes it too).
cat >/dev/null
