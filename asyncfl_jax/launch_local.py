"""Starts N processes of one run on this machine (``jax.distributed``, gloo collectives on CPU).

    asyncfl-launch-local -n 2 -- asyncfl run --shard-replicas --seeds 0,1 --out runs/two
    python -m asyncfl_jax.launch_local -n 2 --devices 2 -- python my_script.py   # the same, without the entry point

(installed with the package; ``python scripts/launch_local.py`` in a clone runs the same.)

Each process gets ``ASYNCFL_COORDINATOR`` (``localhost:<free port>``), ``ASYNCFL_NUM_PROCESSES`` and
``ASYNCFL_PROCESS_ID``, which ``asyncfl run`` reads (a script calls
``asyncfl_jax.distributed.initialize_from_options()`` first thing), and ``JAX_PLATFORMS=cpu`` with ``--devices`` CPU
devices per process (``--xla_force_host_platform_device_count``). Process 0's output is printed as it is, the others'
lines prefixed with ``[process i]``. The exit status is the first non-zero one of the processes (0 when all
succeed); when one process fails the others are stopped, since they would wait for it forever.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time


def free_port() -> int:
    """A TCP port free on this machine now (for the coordinator)."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _relay(stream, prefix: str, out) -> None:
    for line in stream:
        out.write(prefix + line)
        out.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="asyncfl-launch-local", description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--num-processes", type=int, default=2, help="processes to start (default 2)")
    parser.add_argument("--devices", type=int, default=1, help="CPU devices per process (default 1)")
    parser.add_argument("--port", type=int, help="the coordinator's port (default: a free one)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command every process runs")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --, e.g. -- asyncfl run --shard-replicas ...")
    if args.num_processes < 1 or args.devices < 1:
        parser.error("--num-processes and --devices must be >= 1")
    coordinator = f"localhost:{args.port or free_port()}"
    procs, relays = [], []
    for i in range(args.num_processes):
        env = dict(os.environ, ASYNCFL_COORDINATOR=coordinator, ASYNCFL_NUM_PROCESSES=str(args.num_processes),
                   ASYNCFL_PROCESS_ID=str(i), JAX_PLATFORMS="cpu",
                   XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} "
                             f"--xla_force_host_platform_device_count={args.devices}".strip())
        pipe = None if i == 0 else subprocess.PIPE
        p = subprocess.Popen(command, env=env, stdout=pipe, stderr=subprocess.STDOUT if pipe else None, text=True)
        procs.append(p)
        if pipe:
            t = threading.Thread(target=_relay, args=(p.stdout, f"[process {i}] ", sys.stdout), daemon=True)
            t.start()
            relays.append(t)
    status = 0
    while any(p.poll() is None for p in procs):
        failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
        if failed:
            status = failed[0]
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            break
        time.sleep(0.2)
    for p in procs:
        p.wait()
    for t in relays:
        t.join(timeout=5)
    return status or next((p.returncode for p in procs if p.returncode), 0)


if __name__ == "__main__":
    sys.exit(main())
