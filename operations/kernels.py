"""Install translated gfx90a kernel trees: translated once per distinct source tree, uploaded only where needed."""

from __future__ import annotations

import threading
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, QuoteString, State, StringCommand, operation
from pyinfra.api.exceptions import OperationError
from pyinfra.api.host import Host

from cdna2.cache import cache_root
from cdna2.kernels import LlvmNotFoundError, Policy
from cdna2.plan import develop_checkout, upload_space_problem
from cdna2.translated import KernelSourceError, TranslatedTree, ensure_source, ensure_translation
from operations.agent import agent_command, lease_command, run_tag
from operations.report import record_failure

# One translation per source digest and kernel policy per run, however many hosts share it: deploy.py runs once
# per host, in parallel greenlets, and the first host with a given tree does the work while the others wait. These
# locks are keyed as cdna2.translated's cache locks, which wait for other processes: a second greenlet must never
# ask this process's flock for a key the first one holds.
_translation_locks: dict[tuple[str, object], threading.Lock] = {}
_translations: dict[tuple[str, Policy], TranslatedTree] = {}


# Prints the directories above and including $1 that do not exist yet, outermost first, then creates them: what
# the fetch made is removed again after it, so a dry run leaves a host without a state directory without one.
MISSING_DIRECTORIES = ('d=$1; missing=; while [ ! -e "$d" ]; do missing="$d $missing"; d=$(dirname "$d"); done; '
                       'mkdir -p "$1" && echo "missing:$missing"')


class FetchError(RuntimeError):
    pass


def fetch_directory(source_host: Host, parent: str, name: str, archive: Path, state_dir: str) -> None:
    """Copy ``<parent>/<name>`` (without bytecode caches) from ``source_host`` into a local archive, through a
    temporary file in the host's ``<state_dir>/staging`` (the only place outside the environment the run writes),
    removed afterwards with any directory made for it."""
    staging = f"{state_dir}/staging"
    made, output = source_host.run_shell_command(StringCommand(
        "sh", "-c", QuoteString(MISSING_DIRECTORIES), "sh", QuoteString(staging), "&&",
        "mktemp", "-p", QuoteString(staging), f"cdna2-{name.rsplit('/', 1)[-1]}.XXXXXX"))
    if not made:
        raise FetchError(f"{source_host.name}: cannot create a temporary file in {staging}: {output.stderr}")
    lines = output.stdout.strip().splitlines()
    created, remote = lines[0].removeprefix("missing:").split(), lines[-1].strip()
    try:
        # Exit 1 is tar's "file changed as we read it": a link count or ctime moved under it (hard-linked
        # installs), not the content, which the caller checks against the digest the probe reported anyway.
        packed, output = source_host.run_shell_command(
            StringCommand("tar", "--warning=no-file-changed", "--exclude=__pycache__", "-czf", QuoteString(remote),
                          "-C", QuoteString(parent), QuoteString(name)), _success_exit_codes=[0, 1])
        if not packed:
            raise FetchError(f"{source_host.name}: tar of {parent}/{name} failed: {output.stderr}")
        if not source_host.get_file(remote, str(archive)):
            raise FetchError(f"{source_host.name}: download of {remote} failed")
    finally:
        source_host.run_shell_command(StringCommand("rm", "-f", QuoteString(remote), *(
            ("&&", "rmdir", *(QuoteString(directory) for directory in reversed(created))) if created else ())))


def translated_tree_for(source_host: Host, probe: dict, policy: Policy) -> TranslatedTree:
    """The translation of this host's gfx942 tree under its kernel ``policy``, from the controller's cache or made
    now (fetched through the host's state directory, as the probe found it)."""
    digest = probe["aiter"]["gfx942_record_digest"]
    with _translation_locks.setdefault((digest, policy), threading.Lock()):
        if (digest, policy) not in _translations:
            cache = cache_root() / "kernels"
            with _translation_locks.setdefault((digest, ""), threading.Lock()):  # one fetch per source tree
                source = ensure_source(cache, digest, lambda archive: fetch_directory(
                    source_host, probe["aiter"]["hsa_root"], "gfx942", archive, probe["state_dir"]["path"]),
                    checkout=develop_checkout(probe["distributions"]["amd-aiter"]))
            _translations[digest, policy] = ensure_translation(
                cache, digest, source, policy,
                progress=lambda line: logger.info(f"{source_host.print_prefix}{line}"))
    return _translations[digest, policy]


def translated_tree_or_refusal(source_host: Host, probe: dict,
                               policy: Policy) -> tuple[TranslatedTree | None, str | None]:
    """``translated_tree_for``, or why the tree cannot be made (no usable LLVM on the controller, a gfx942 tree that
    cannot be fetched or adapted): the host then fails in preflight, before anything on it changes."""
    try:
        return translated_tree_for(source_host, probe, policy), None
    except LlvmNotFoundError as error:
        return None, f"the controller cannot translate kernels: {error}"
    except (KernelSourceError, FetchError) as error:
        return None, f"the gfx942 kernel tree cannot be translated: {error}"


def upload_archive(state: State, host: Host, archive: Path, remote_archive: str) -> None:
    """Upload the kernel archive; when that fails, remove what part of it arrived and say why: "no space left on
    <dir> on <host>" with the sizes when the disk filled up during the upload, else the upload error."""
    privilege = {key: host.data.get(key) for key in ("_sudo", "_sudo_user") if host.data.get(key)}
    try:
        if host.put_file(str(archive), remote_archive, **privilege):
            return
        error = "the upload failed"
    except (OSError, IOError, EOFError) as upload_error:  # the SFTP server's failure, or the connection's
        error = f"the upload failed: {upload_error}"
    directory = remote_archive.rsplit("/", 1)[0]
    _, output = host.run_shell_command(
        StringCommand("rm", "-f", QuoteString(remote_archive), ";", "stat", "-f", "-c", QuoteString("%a %S %d"),
                      QuoteString(directory)), **privilege)
    problem = (f"{upload_space_problem(output.stdout, archive.stat().st_size, directory, host.name) or error}; "
               f"the partial archive {remote_archive} was removed and nothing else changed: free space there and "
               f"run the deploy again")
    record_failure(host.name, "kernels", problem)  # an exception's message reaches no output the report reads
    raise OperationError(f"{host.name}: {problem}")


@operation()
def translated_kernels(tree: TranslatedTree, hsa_root: str, installed_digest: str | None, site_packages: str,
                       target_python: str, state_dir: str):
    """
    Install the translated gfx90a kernel tree as ``<hsa_root>/gfx90a``.

    + tree: the translated tree (archive, its checksum, the tree digest) built on the controller
    + hsa_root: AITER's ``hsa`` directory on the host, from the probe
    + installed_digest: digest of the host's current ``hsa/gfx90a`` from the probe (None when absent)
    + site_packages: the directory holding AITER on the host (its JIT outputs are under ``aiter/jit``)
    + target_python: interpreter that runs the host agent
    + state_dir: the tool's state directory on the host (staging and state record)

    Swap:
        The archive is uploaded into ``<state_dir>/staging``, checked against its checksum, unpacked beside
        ``hsa/``, checked against the tree digest, and only then exchanged with ``hsa/gfx90a`` in one rename;
        the previous tree stays as ``hsa/.gfx90a.previous``. Nothing is uploaded when the installed tree
        already has the digest. After a swap, the JIT modules built from the tree's loaders, and every module
        that compiles in a kernel table generated from the ``hsa/<arch>`` trees (``module_attention_asm``,
        ``module_fmha_v3_*``: AITER's ``optCompilerConfig.json`` says which), are removed.

    **Example:**

    .. code:: python

        translated_kernels(
            name="kernels: hsa/gfx90a holds the translated tree",
            tree=translated_tree_for(host, probe, Policy()),
            hsa_root=probe["aiter"]["hsa_root"],
            installed_digest=probe["aiter"]["gfx90a_digest"],
            site_packages="/opt/venv/lib/python3.11/site-packages",
            target_python="/opt/venv/bin/python",
            state_dir="/var/lib/cdna2",
        )
    """
    if installed_digest == tree.digest:
        host.noop(f"{hsa_root}/gfx90a already holds translated tree {tree.digest[:12]} ({tree.kernels} kernels)")
        return
    remote_archive = f"{state_dir}/staging/gfx90a-{tree.digest[:16]}{run_tag(state_dir)}.tar.gz"
    replaced = f"tree {installed_digest[:12]}" if installed_digest else "nothing (absent)"
    logger.info(f"{host.print_prefix}kernels: upload {tree.archive.name} ({tree.archive.stat().st_size} bytes, "
                f"{tree.kernels} kernels) and replace {hsa_root}/gfx90a: {replaced} -> {tree.digest[:12]}")
    yield lease_command(target_python, state_dir)
    yield StringCommand("mkdir", "-p", QuoteString(f"{state_dir}/staging"))
    yield FunctionCommand(upload_archive, (tree.archive, remote_archive), {})
    yield agent_command(target_python, state_dir, "kernels", "install", "--archive", remote_archive,
                        "--sha256", tree.archive_sha256, "--digest", tree.digest,
                        "--hsa-root", hsa_root, "--state-dir", state_dir)
    # Modules built from the old tree's loaders or kernel tables would keep serving it ("cannot get heuristic
    # kernel!"): they go with it and rebuild on first use.
    yield agent_command(target_python, state_dir, "jit", "--root", site_packages, "--kernel-tree-modules",
                        *tree.invalidates)
