#!/usr/bin/env bash
# Print a TCP port for a rendezvous on this machine: below the kernel's
# ephemeral range (outgoing connections take ports from there) and with
# nobody listening on it.
low=10000
high=$(awk '{ print $1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
for _ in $(seq 100); do
	port=$((low + RANDOM % (high - low)))
	if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
		echo "$port"
		exit 0
	fi
done
echo "free-port.sh: no free port found" >&2
exit 1
