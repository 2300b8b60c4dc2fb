#!/bin/bash
# ssh stand-in for mpirun's plm_ssh_agent (tests/cluster.py): cluster_ssh.sh [ssh options] HOST COMMAND...
# runs COMMAND (the MPI daemon's start-up line) inside HOST's network namespace,
# under HOST's own host name.
set -e
while [ "${1:0:1}" = "-" ]; do shift; done
host=$1; shift
: "${CK_CLUSTER_NS_PREFIX:?set by tests/cluster.py}"
exec ip netns exec "${CK_CLUSTER_NS_PREFIX}${host}" unshare -u bash -c "hostname $host; eval \"\$0\"" "$*"
