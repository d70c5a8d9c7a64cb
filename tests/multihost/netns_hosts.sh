#!/usr/bin/env bash
# Builds N "hosts" on this machine for a test and holds them until stdin
# closes, then removes them (also on SIGTERM/SIGINT/HUP or any error).
#
#   netns_hosts.sh [--delay_us=D] [--loss_pct=P] [--seed=S]
#                  [--shape=auto|netem|emulator] [--emulator=PATH] N
#
# With a delay or loss, every host's egress (eth0 towards the bridge) is
# shaped: D microseconds one way, P percent of frames lost, so a round trip
# between two hosts pays 2*D. --shape=auto (default) uses tc's netem qdisc
# where the kernel has sch_netem, else link_emulator (a userspace forwarder
# between two TAP devices: eth0 in the host, vh<i> on the bridge; --emulator
# names the binary, default: beside this script; seed S+i on host i).
# --shape=netem|emulator forces one, even with no delay or loss. Either way
# the line "shape ..." says which.
#
# Host i is network namespace fmh<pid>h<i> with interface eth0 at
# 10.213.0.<i+1>/24 (and lo). Each eth0 is one end of a veth pair whose other
# end, vh<i>, is a port of bridge br0 in the switch namespace fmh<pid>sw.
# Nothing is added to the machine's own namespace: traffic stays between the
# test's namespaces. Prints, one a line:
#   host <i> <namespace> <address>   (after "emulator <i> <pid>" when the
#                                     link emulator carries host i's link)
#   switch <namespace>
#   shape none | shape netem ... | shape emulator ... (why)
#   ready
# or "skip: <reason>" (exit 0) when namespaces cannot be created (no root),
# or "error: <reason>" (exit 1).
set -u
# ip and tc live in sbin, which a test's PATH may lack.
PATH="/usr/sbin:/sbin:$PATH"
delay_us=0
loss_pct=0
seed=1
shape=auto
emulator="$(dirname "$0")/link_emulator"
n=""
for arg in "$@"; do
  case "$arg" in
    --delay_us=*) delay_us=${arg#*=} ;;
    --loss_pct=*) loss_pct=${arg#*=} ;;
    --seed=*) seed=${arg#*=} ;;
    --shape=*) shape=${arg#*=} ;;
    --emulator=*) emulator=${arg#*=} ;;
    *) n=$arg ;;
  esac
done
if [[ -z "$n" || ! "$delay_us" =~ ^[0-9]+$ || ! "$loss_pct" =~ ^[0-9.]+$ ||
      ! "$shape" =~ ^(auto|netem|emulator)$ ]]; then
  echo "error: usage: netns_hosts.sh [--delay_us=D] [--loss_pct=P]" \
    "[--seed=S] [--shape=auto|netem|emulator] [--emulator=PATH] N"
  exit 1
fi
# Shaped when a delay or loss is asked for, or a shape named (then even a
# zero delay goes through it, so its own cost can be measured).
shaped=0
if [[ "$delay_us" != 0 || ! "$loss_pct" =~ ^0*\.?0*$ || "$shape" != auto ]]; then
  shaped=1
fi
prefix="fmh$$"
made=()
emulators=()
tmp=""

cleanup() {
  # Emulators first: their TAP devices go with them, then the namespaces.
  if ((${#emulators[@]})); then
    kill -TERM "${emulators[@]}" 2>/dev/null
    (sleep 5; kill -KILL "${emulators[@]}" 2>/dev/null) &
    local watchdog=$!
    wait "${emulators[@]}" 2>/dev/null
    kill "$watchdog" 2>/dev/null
    emulators=()
  fi
  for ns in "${made[@]}"; do ip netns del "$ns" 2>/dev/null; done
  made=()
  if [[ -n "$tmp" ]]; then rm -rf "$tmp"; fi
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

# netem's parameters, as tc takes them (limit: the emulator's queue bound).
netem_args=(delay "${delay_us}us" limit 10000)
if [[ ! "$loss_pct" =~ ^0*\.?0*$ ]]; then netem_args+=(loss "${loss_pct}%"); fi
why=""
if ((shaped)) && [[ "$shape" == auto ]]; then
  # Probe on a throwaway veth pair in the switch namespace.
  if ! command -v tc >/dev/null; then
    shape=emulator
    why="iproute2's tc is not installed"
  else
    run ip -n "$sw" link add probe0 type veth peer name probe1
    if why=$(tc -n "$sw" qdisc add dev probe0 root netem "${netem_args[@]}" 2>&1); then
      shape=netem
    else
      shape=emulator
      why="no usable sch_netem: $(echo "$why" | head -1)"
    fi
    run ip -n "$sw" link del probe0
  fi
fi
if ((shaped)) && [[ "$shape" == emulator ]]; then
  if [[ ! -x "$emulator" ]]; then
    echo "error: link emulator $emulator is not an executable"
    exit 1
  fi
  if [[ ! -c /dev/net/tun ]]; then
    echo "error: /dev/net/tun is missing: cannot emulate links"
    exit 1
  fi
  tmp=$(mktemp -d)
fi

# Host i's link: eth0 in its namespace, vh<i> on the bridge.
link_host() {
  local i=$1 ns=$2
  if ((shaped)) && [[ "$shape" == emulator ]]; then
    local fifo="$tmp/emu$i" line=""
    mkfifo "$fifo"
    "$emulator" --a_netns="$ns" --a_dev=eth0 --b_netns="$sw" --b_dev="vh$i" \
      --delay_us="$delay_us" --loss_pct="$loss_pct" --seed=$((seed + i)) \
      --limit=10000 --parent_pid=$$ >"$fifo" &
    emulators+=($!)
    echo "emulator $i $!"
    local fd
    exec {fd}<"$fifo"
    read -r -t 10 -u "$fd" line
    exec {fd}<&-
    if [[ "$line" != ready ]]; then
      echo "error: link_emulator for host $i did not start (see stderr)"
      exit 1
    fi
  else
    run ip -n "$ns" link add eth0 type veth peer name "vh$i" netns "$sw"
    if ((shaped)); then
      run tc -n "$ns" qdisc add dev eth0 root netem "${netem_args[@]}"
    fi
  fi
}

for ((i = 0; i < n; i++)); do
  ns="${prefix}h$i"
  run ip netns add "$ns"
  made+=("$ns")
  run ip -n "$ns" link set lo up
  link_host "$i" "$ns"
  run ip -n "$ns" addr add "10.213.0.$((i + 1))/24" dev eth0
  run ip -n "$ns" link set eth0 up
  run ip -n "$sw" link set "vh$i" master br0
  run ip -n "$sw" link set "vh$i" up
  echo "host $i $ns 10.213.0.$((i + 1))"
done
echo "switch $sw"
if ((!shaped)); then
  echo "shape none"
elif [[ "$shape" == netem ]]; then
  echo "shape netem delay_us=$delay_us loss_pct=$loss_pct (tc qdisc netem on each host's eth0)"
else
  echo "shape emulator delay_us=$delay_us loss_pct=$loss_pct seed=$seed (link_emulator between TAP devices; ${why:-forced by --shape=emulator})"
fi
echo "ready"
# Held until the test closes our stdin (or dies, which closes it too).
cat >/dev/null
