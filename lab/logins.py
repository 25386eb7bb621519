"""The lab's logins besides root: the users of a --login sudo or --login user lab (this machine's users, named after
the lab directory so that labs side by side have their own), their sudoers file, and their removal.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import subprocess
from pathlib import Path

from lab.labstate import LabPaths, write_atomically

# A lab started with --login sudo is reached as an unprivileged user who may sudo without a password, as the docs
# offer real clusters; a second user, without sudo rights, is there to be refused. A lab started with --login user
# is reached as a plain user with neither root nor sudo, as on an HPC cluster: it owns each host's /opt/venv and
# its home (its own per host), and can only read the root-owned ROCm stand-in. All are this machine's users (the
# hosts share its /etc), named after the lab directory so that labs side by side have their own.
LOGINS = ("root", "sudo", "user")
SUDOERS_DIR = Path("/etc/sudoers.d")


def login_users(paths: LabPaths, login: str = "sudo") -> dict[str, str]:
    """The users of a --login sudo lab: ``sudo`` may run anything as root without a password, ``unprivileged``
    may not; of a --login user lab: ``user``, who has neither root nor sudo and owns each host's environment."""
    stem = f"cdna2-{hashlib.sha256(str(paths.root).encode()).hexdigest()[:8]}"
    if login == "user":
        return {"user": f"{stem}-user"}
    return {"sudo": stem, "unprivileged": f"{stem}-nosudo"}


def _sudoers_file(user: str) -> Path:
    return SUDOERS_DIR / user  # sudo skips names holding a dot; these have none


def ensure_login_users(paths: LabPaths, login: str = "sudo") -> dict[str, str]:
    """Create the lab's login users (idempotent): a home with the lab's key, and sudo rights for the ``sudo`` one."""
    if login == "sudo" and shutil.which("sudo") is None:
        raise RuntimeError("--login sudo needs Debian's sudo on this machine: run bin/setup (it installs it)")
    users = login_users(paths, login)
    public_key = paths.client_key.with_suffix(".pub").read_text()
    for role, user in users.items():
        try:
            pwd.getpwnam(user)
        except KeyError:
            subprocess.run(["useradd", "--create-home", "--home-dir", f"/home/{user}", "--shell", "/bin/sh",
                            "--comment", f"cdna2 lab login ({role}) of {paths.root}", user], check=True)
        # Without PAM, sshd refuses a locked account ("!" in shadow, useradd's default) even for a key: "*" is no
        # password at all, and not locked.
        subprocess.run(["usermod", "--password", "*", user], check=True)
        entry = pwd.getpwnam(user)
        ssh_dir = Path(entry.pw_dir, ".ssh")
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        write_atomically(ssh_dir / "authorized_keys", public_key, 0o600)
        for path in (ssh_dir, ssh_dir / "authorized_keys"):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    if login != "sudo":
        return users
    sudoers = _sudoers_file(users["sudo"])
    staged = sudoers.with_name(f".{sudoers.name}.staged")
    staged.write_text(f"# cdna2 lab login of {paths.root} (lab/labctl.py)\n"
                      f"{users['sudo']} ALL=(ALL:ALL) NOPASSWD: ALL\n")
    staged.chmod(0o440)
    subprocess.run(["visudo", "-q", "-c", "-f", str(staged)], check=True, capture_output=True)
    staged.replace(sudoers)
    return users


def remove_login_users(users: dict[str, str]) -> None:
    if "sudo" in users:
        _sudoers_file(users["sudo"]).unlink(missing_ok=True)
    for user in users.values():
        try:
            pwd.getpwnam(user)
        except KeyError:
            continue
        subprocess.run(["userdel", "--remove", user], check=True, capture_output=True)
