"""Starts N processes of one run on this machine (``jax.distributed``, gloo collectives on CPU).

    asyncfl-launch-local -n 2 -- asyncfl run --shard-replicas --seeds 0,1 --out runs/two
    python -m asyncfl_jax.launch_local -n 2 --devices 2 -- python my_script.py   # the same, without the entry point

(installed with the package; ``python scripts/launch_local.py`` in a clone runs the same.)

Each process gets ``ASYNCFL_COORDINATOR`` (``localhost:<free port>``), ``ASYNCFL_NUM_PROCESSES`` and
``ASYNCFL_PROCESS_ID``, which ``asyncfl run`` reads (a script calls
``asyncfl_jax.distributed.initialize_from_options()`` first thing), and ``JAX_PLATFORMS=cpu`` with ``--devices`` CPU
devices per process (``--xla_force_host_platform_device_count``). Process 0's output is printed as it is, the others'
lines prefixed with ``[process i]``. The exit status is the first non-zero one of the processes (0 when all
succeed; ``128 + N`` for a process ended by signal N); when one process fails or is killed the launcher says which
and stops the others, since they would wait for it forever: SIGTERM first (each saves its checkpoint and ends), then
SIGKILL after ``--grace`` seconds. SIGINT (Ctrl-C) and SIGTERM sent to the launcher are forwarded to every process
once (they run in sessions of their own, so a terminal's Ctrl-C reaches them only through the launcher); the
launcher then waits for them (SIGKILL after ``--grace`` seconds) and exits with ``128 +`` the signal: no process is
left behind.
"""

from __future__ import annotations

import argparse
import os
import signal
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
    parser.add_argument("--grace", type=float, default=30.0,
                        help="seconds the processes get to end after SIGTERM before SIGKILL (default 30)")
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
        p = subprocess.Popen(command, env=env, stdout=pipe, stderr=subprocess.STDOUT if pipe else None, text=True,
                             start_new_session=True)
        procs.append(p)
        if pipe:
            t = threading.Thread(target=_relay, args=(p.stdout, f"[process {i}] ", sys.stdout), daemon=True)
            t.start()
            relays.append(t)
    received: list[int] = []

    def forward(signum, frame):  # noqa: ARG001
        if not received:
            received.append(signum)
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGINT, signal.SIGTERM)}
    status = 0
    try:
        while not received and any([p.poll() is None for p in procs]):  # a list: every process is polled
            failed = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed:
                i, code = failed[0]
                status = exit_status(code)
                how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"ended with exit code {code}"
                print(f"launch_local: process {i} {how}; stopping the other processes (coordinator {coordinator})",
                      file=sys.stderr, flush=True)
                for p in procs:
                    if p.poll() is None:
                        p.terminate()
                break
            time.sleep(0.2)
        stop_all(procs, args.grace)
    finally:
        stop_all(procs, args.grace)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    for t in relays:
        t.join(timeout=5)
    if received:
        return 128 + received[0]
    return status or next((exit_status(p.returncode) for p in procs if p.returncode), 0)


def exit_status(returncode: int) -> int:
    """A process's return code as an exit status: ``128 + N`` for one ended by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def stop_all(procs: list[subprocess.Popen], grace: float) -> None:
    """Waits up to ``grace`` seconds for every process to end, then kills those left (and waits for them)."""
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


if __name__ == "__main__":
    sys.exit(main())
