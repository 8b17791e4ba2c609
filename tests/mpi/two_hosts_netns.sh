#!/bin/sh
# Two "hosts" on one machine: a 2-rank job whose ranks live in two network
# namespaces joined by a veth pair, so they talk over Open MPI's TCP
# transport (BTL tcp) across a real interface, never shared memory.
#   two_hosts_netns.sh MPIEXEC PROGRAM [ARGS...]
# mpirun runs in namespace A with hosts 10.77.0.1 (itself: rank 0 starts
# locally) and 10.77.0.2; its launch agent (plm_rsh_agent, in place of ssh)
# starts the remote daemon (orted) in namespace B with `ip netns exec`. The
# daemon connects back to mpirun over the veth (oob_tcp_if_include), and the
# ranks exchange data over it (btl tcp,self; btl_tcp_if_include).
# Exit 77 (CTest: skipped) with the reason when this machine cannot make
# network namespaces (needs root or CAP_SYS_ADMIN + CAP_NET_ADMIN; iproute2).
set -u
MPIEXEC=$1
PROGRAM=$2
shift 2
skip() {
  echo "SKIPPED: $*"
  exit 77
}
command -v ip >/dev/null 2>&1 || skip "iproute2's 'ip' is not installed (scripts/setup.sh installs it)"
a=riftcoA$$
b=riftcoB$$
work=$(mktemp -d)
cleanup() {
  ip netns del "$a" 2>/dev/null
  ip netns del "$b" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$a" 2>"$work/err" || skip "cannot create a network namespace: $(cat "$work/err") (needs root or CAP_SYS_ADMIN)"
ip netns add "$b" 2>"$work/err" || skip "cannot create a second network namespace: $(cat "$work/err")"
ip link add vethA netns "$a" type veth peer name vethB netns "$b" 2>"$work/err" ||
  skip "cannot create a veth pair: $(cat "$work/err") (needs CAP_NET_ADMIN and the veth driver)"
ip -n "$a" addr add 10.77.0.1/24 dev vethA && ip -n "$b" addr add 10.77.0.2/24 dev vethB &&
  ip -n "$a" link set lo up && ip -n "$b" link set lo up &&
  ip -n "$a" link set vethA up && ip -n "$b" link set vethB up || skip "cannot configure the veth pair"
ip netns exec "$a" true 2>"$work/err" || skip "cannot enter a network namespace: $(cat "$work/err")"

# The launch agent: called as `agent HOST COMMAND...` the way ssh would be.
cat >"$work/agent.sh" <<AGENT
#!/bin/sh
host=\$1
shift
case "\$host" in
  10.77.0.1) ns=$a ;;
  10.77.0.2) ns=$b ;;
  *) echo "two_hosts_netns agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" /bin/sh -c "\$*"
AGENT
chmod +x "$work/agent.sh"

run() {
  timeout 90 ip netns exec "$a" "$MPIEXEC" --host 10.77.0.1:1,10.77.0.2:1 -np 2 \
    --mca plm_rsh_agent "$work/agent.sh" --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 \
    --mca oob_tcp_if_include 10.77.0.0/24 "$@"
}

# The ranks must be in two different network namespaces.
namespaces=$(run /bin/sh -c 'readlink /proc/self/ns/net' | sort -u | wc -l)
if [ "$namespaces" != 2 ]; then
  echo "FAILED: the two ranks are not in two network namespaces ($namespaces distinct)"
  exit 1
fi
echo "two ranks in two network namespaces (10.77.0.1, 10.77.0.2), BTL tcp"
run "$PROGRAM" "$@"
