"""A port for vps-exec's rendezvous (--master HOST:PORT) that a rank picks
and hands to the others."""
import random
import socket

__all__ = ["free_port"]

# where the kernel's ephemeral range cannot be read: Linux's default start
_EPHEMERAL_LOW = 32768
_LOWEST = 10000


def free_port(host: str = "127.0.0.1", tries: int = 100) -> int:
    """A TCP port on `host` that nobody listens on now, below the kernel's
    ephemeral range. A port the kernel hands out (a bind to port 0) is
    handed out again to the next outgoing connection or listener that
    asks for any port, and on a busy machine one took it before vps-exec's
    rank 0 listened on it (vps-exec: bind ...: Address already in use:
    Megatron's process groups, made meanwhile, listen on such ports).
    OSError when `tries` random ports are all taken."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            high = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        high = _EPHEMERAL_LOW
    high = max(high, _LOWEST + 1)
    pick = random.SystemRandom()
    for _ in range(tries):
        port = pick.randrange(_LOWEST, high)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        return port
    raise OSError("no free port found on %s between %d and %d in %d tries" % (host, _LOWEST, high, tries))
