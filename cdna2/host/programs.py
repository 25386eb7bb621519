"""Running a program from the probe without subprocess (whose import costs more than the probe's reads on a host
that has not changed): fork and exec with a time limit, both outputs read, the child killed at the limit.
"""

from __future__ import annotations

import os
import select
import time

SIGKILL = 9


def run_program(argv: list[str], timeout: float) -> tuple[int, str, str]:
    """Run a program; its exit code, stdout and stderr (TimeoutError after ``timeout`` seconds, the program killed).

    Spawned by hand: importing ``subprocess`` (signal, threading, selectors...) costs a probe more CPU than all it
    reads on a provisioned host.
    """
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    try:  # the pipes are close-on-exec; only the duplicated ends reach the program
        pid = os.posix_spawn(argv[0], argv, os.environ, file_actions=[
            (os.POSIX_SPAWN_DUP2, out_write, 1), (os.POSIX_SPAWN_DUP2, err_write, 2)])
    except OSError:
        os.close(out_read)
        os.close(err_read)
        raise
    finally:
        os.close(out_write)
        os.close(err_write)
    output: dict[int, list[bytes]] = {out_read: [], err_read: []}
    deadline, pending = time.monotonic() + timeout, [out_read, err_read]
    try:
        while pending and (ready := select.select(pending, [], [], max(deadline - time.monotonic(), 0))[0]):
            for descriptor in ready:
                if data := os.read(descriptor, 1 << 16):
                    output[descriptor].append(data)
                else:
                    pending.remove(descriptor)
        while (status := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # output closed, exit not yet seen
        if status[0] == 0:
            os.kill(pid, SIGKILL)
            os.waitpid(pid, 0)
            raise TimeoutError(f"no exit after {timeout:g} s, killed")
    finally:
        for descriptor in output:
            os.close(descriptor)
    text = [b"".join(output[descriptor]).decode("utf-8", errors="replace") for descriptor in (out_read, err_read)]
    return os.waitstatus_to_exitcode(status[1]), text[0], text[1]
