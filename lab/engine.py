"""A container engine of the lab's own: a ``dockerd`` that changes nothing on the machine it runs on.

Started with its own data, exec and socket paths under the cdna2 cache, without a bridge, firewall rules, IP
forwarding or masquerading (the default settings create a bridge on a private range and change the
host's forwarding and firewall). Containers then get loopback networking only. Each checkout (``CDNA2_LAB_NET``)
has its own daemon directory, so checkouts side by side never share or stop each other's daemon. Stopped by the pid
it wrote.

    python -m lab.engine start    # prints the DOCKER_HOST to export; a running daemon is reused
    python -m lab.engine stop
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from cdna2.cache import cache_lock, cache_root
from lab.kinds import LAB_NET

DOCKERD = "/usr/sbin/dockerd"
ISOLATION_FLAGS = ("--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false", "--bridge=none")


class EngineUnavailable(RuntimeError):
    """No container engine or image builder here (dockerd, docker or mmdebstrap missing); tests skip with this."""


@dataclass(frozen=True)
class Engine:
    root: Path  # D: data/, exec/, docker.sock, docker.pid, dockerd.log, locks/

    @classmethod
    def default(cls) -> Engine:
        return cls(cache_root() / "docker" / f"net-{LAB_NET}")

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    @property
    def pid_file(self) -> Path:
        return self.root / "docker.pid"

    @property
    def log(self) -> Path:
        return self.root / "dockerd.log"

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket}"

    def environment(self) -> dict[str, str]:
        """This process's environment with DOCKER_HOST pointing at this daemon."""
        return {**os.environ, "DOCKER_HOST": self.docker_host}

    def pid(self) -> int | None:
        """The recorded pid, when that process is still this daemon (a recycled pid is never ours)."""
        try:
            pid = int(self.pid_file.read_text().strip())
            command_line = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        return pid if command_line[0].endswith(b"dockerd") and str(self.socket).encode() in b" ".join(command_line) \
            else None

    def responds(self) -> bool:
        result = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True,
                                text=True, env=self.environment(), timeout=30)
        return result.returncode == 0

    def start(self, timeout: float = 60.0) -> bool:
        """Start the daemon unless it runs already; True when this call started it."""
        missing = [tool for tool in (DOCKERD, "docker") if shutil.which(tool) is None]
        if missing:
            raise EngineUnavailable(f"no container engine: {', '.join(missing)} not found (bin/setup installs "
                                    f"Debian's docker.io)")
        # A second process starting it at the same time would remove the first daemon's socket and start one that
        # cannot take the data directory; it waits here and finds the first one running.
        with cache_lock("dockerd-start", self.root):
            return self._start(timeout)

    def _start(self, timeout: float) -> bool:
        if self.pid() is not None and self.responds():
            return False
        self.root.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        with open(self.log, "ab") as log:
            # Its own session: the daemon outlives the shell or test session that started it until stopped by pid.
            subprocess.Popen([DOCKERD, "--data-root", str(self.root / "data"), "--exec-root", str(self.root / "exec"),
                              "-H", self.docker_host, "--pidfile", str(self.pid_file), *ISOLATION_FLAGS],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.socket.exists() and self.responds():
                return True
            time.sleep(0.2)
        raise RuntimeError(f"dockerd did not answer on {self.socket} within {timeout:.0f} s; its log: {self.log}")

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the daemon by its recorded pid; True when one was running."""
        pid = self.pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            try:  # our own child when this process started it: reap it
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    break
            except ChildProcessError:
                pass
            time.sleep(0.1)
        if Path(f"/proc/{pid}").exists():
            raise RuntimeError(f"dockerd pid {pid} did not stop within {timeout:.0f} s")
        return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.engine", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("start", "stop"))
    args = parser.parse_args(argv)
    engine = Engine.default()
    if args.action == "start":
        started = engine.start()
        print(f"export DOCKER_HOST={engine.docker_host}")
        print(f"dockerd {'started' if started else 'already running'}: pid {engine.pid()}", file=sys.stderr)
    else:
        print("dockerd stopped" if engine.stop() else "dockerd was not running", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
