#!/bin/sh
# Two ranks in two network namespaces joined by a veth pair, talking TCP only
# (--mca btl tcp,self), the way two hosts do: kvllm run --pp 2 must print the
# same ids as one process. Needs CAP_NET_ADMIN (ip netns); without it the test
# says so and exits 77, which CTest reports as skipped.
# Usage: test_pp_netns.sh MPIRUN KVLLM_BIN
MPIRUN=$1
KV=$(readlink -f "$2")
MODEL=$(readlink -f tests/data/golden/models/qwen3-f32.gguf)
ID=$$
NS0=kvpp0-$ID
NS1=kvpp1-$ID
TMP=$(mktemp -d)
cleanup() {
    ip netns del "$NS0" 2>/dev/null
    ip netns del "$NS1" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
if ! err=$(ip netns add "$NS0" 2>&1); then
    echo "SKIPPED: cannot create a network namespace (ip netns add: $err); this test needs CAP_NET_ADMIN"
    exit 77
fi
set -e
ip netns add "$NS1"
ip link add veth0_$ID netns "$NS0" type veth peer name veth1_$ID netns "$NS1"
ip -n "$NS0" addr add 10.231.7.1/24 dev veth0_$ID
ip -n "$NS1" addr add 10.231.7.2/24 dev veth1_$ID
for ns in "$NS0" "$NS1"; do ip -n "$ns" link set lo up; done
ip -n "$NS0" link set veth0_$ID up
ip -n "$NS1" link set veth1_$ID up
# mpirun reaches a "host" by running its daemon through this agent instead of ssh;
# each "host" keeps its session directory apart (they share /tmp and the host
# name, and two daemons creating the same directory at once failed with EEXIST)
cat > "$TMP/agent" <<AGENT
#!/bin/sh
host=\$1; shift
mkdir -p "$TMP/session-\$host"
exec ip netns exec "\$host" env OMPI_MCA_orte_tmpdir_base="$TMP/session-\$host" sh -c "\$*"
AGENT
chmod +x "$TMP/agent"
ARGS="run -m $MODEL -p Hello -n 12 -t 1 --temp 0 --json --top-logprobs 3 --ignore-eos"
"$KV" $ARGS 2>/dev/null | grep -v '"done"' > "$TMP/one.txt"
set +e
# rtc_hwloc_vmhole none: the daemon in the second namespace once died in Open MPI's
# hwloc_shmem_topology_write (SIGSEGV at a stack address, from the "biggest" VM hole it
# picked; 1 of ~20 runs, not reproduced in 12 more); no shared topology segment is made.
ip netns exec "$NS0" timeout 120 "$MPIRUN" --host "$NS0,$NS1" -np 2 \
    --mca plm_rsh_agent "$TMP/agent" --mca routed direct --mca btl tcp,self --mca rtc_hwloc_vmhole none \
    --mca btl_tcp_if_include 10.231.7.0/24 --mca oob_tcp_if_include 10.231.7.0/24 \
    -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM -x KVLLM_PP_STATS=1 \
    "$KV" $ARGS --pp 2 > "$TMP/pp.txt" 2> "$TMP/pp.err"
rc=$?
set -e
cat "$TMP/pp.err" | grep -v "^$" | head -40
grep -v '"done"' "$TMP/pp.txt" > "$TMP/pp_tokens.txt" || true
if [ $rc -ne 0 ]; then
    echo "FAIL: mpirun over two namespaces exited $rc"
    exit 1
fi
if ! grep -q '"id"' "$TMP/one.txt" || ! cmp -s "$TMP/one.txt" "$TMP/pp_tokens.txt"; then
    echo "FAIL: the output over TCP differs from one process"
    diff "$TMP/one.txt" "$TMP/pp_tokens.txt" | head
    exit 1
fi
echo "ok: two ranks in two network namespaces over TCP give one process's ids and logprobs"
