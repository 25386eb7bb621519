"""Image targets without an engine: what becomes of a committed image, the arch from data, GPU checks skipped with
the reason, the commit line pyinfra logs, and moving a directory overlayfs cannot rename (a real overlay mount).

The engine itself is exercised in tests/containers/.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cdna2.images.containers import KEEP, REMOVE, SOURCE, TAG, Engine, EngineError, ImageOutcome, decide, settle_image
from cdna2.host import gpu_run, smoke
from cdna2.plan import arch_skip_reason, data_arch_refusal, hidden_gpu_refusal, with_data_arch
from lab import engine as engine_module
from operations.images import CommittedImages

ROOT = Path(__file__).resolve().parents[2]
TAG_NAME = "local/vllm-mi210:base-cdna2"


@pytest.mark.parametrize("mode, executed, failed, changed, tag, action, result_tag", [
    ("deploy", True, False, True, TAG_NAME, TAG, TAG_NAME),
    ("deploy", True, False, True, None, KEEP, None),
    ("deploy", True, False, False, TAG_NAME, SOURCE, TAG_NAME),  # a re-deploy of the tagged image
    ("deploy", False, False, True, TAG_NAME, REMOVE, None),  # --dry
    ("deploy", True, True, True, TAG_NAME, REMOVE, None),  # failed
    ("verify", True, False, False, None, REMOVE, None),
    ("rollback", True, False, True, "local/vllm-mi210:stock", TAG, "local/vllm-mi210:stock"),
    ("rollback", True, True, True, "local/vllm-mi210:stock", REMOVE, None),
])
def test_what_becomes_of_the_committed_image(mode, executed, failed, changed, tag, action, result_tag):
    decision = decide(mode, executed=executed, failed=failed, changed=changed, tag=tag)
    assert (decision.action, decision.tag) == (action, result_tag)


def test_a_removed_image_summary_names_the_reason_and_the_source():
    outcome = ImageOutcome(source="local/base:1", source_id="sha256:" + "ab" * 32, committed_id="sha256:" + "cd" * 32,
                           result_id=None, tag=None, action=REMOVE, why="dry run: nothing was executed")
    assert outcome.summary() == "dry run: nothing was executed; from local/base:1 (abababababab)"


def probe_with(agents: list[dict]) -> dict:
    arches = sorted({agent["arch"] for agent in agents})
    return {"gpu": {"agents": agents, "arches": arches, "arch": arches[0] if len(arches) == 1 else None,
                    "source": "rocminfo" if agents else None}}


def test_without_a_gpu_a_container_target_takes_the_arch_from_data_with_the_reason():
    probe, reason = with_data_arch(probe_with([]), "gfx90a", container=True)
    assert probe["gpu"]["arch"] == "gfx90a" and probe["gpu"]["source"] == "host data gpu_arch"
    assert reason.startswith("no GPU at build time") and arch_skip_reason(probe) is None
    assert data_arch_refusal(probe_with([]), "gfx90a", container=True) is None


@pytest.mark.parametrize("container", [True, False])
def test_a_gpu_the_probe_finds_wins_over_data(container: bool):
    found = probe_with([{"arch": "gfx942", "marketing_name": "AMD Instinct MI300X"}])
    probe, reason = with_data_arch(found, "gfx90a", container)
    assert probe is found and reason is None and "gfx942" in arch_skip_reason(probe)
    assert data_arch_refusal(found, "gfx90a", container) is None


@pytest.mark.parametrize("container", [True, False])
def test_without_a_gpu_and_without_data_the_host_is_left_alone(container: bool):
    probe, reason = with_data_arch(probe_with([]), None, container)
    assert reason is None and "no GPU agent found" in arch_skip_reason(probe)
    assert data_arch_refusal(probe_with([]), None, container) is None


def test_a_host_that_is_no_container_never_takes_the_arch_from_data_and_is_refused():
    # Over SSH, no GPU in the probe means a GPU that does not show (driver, /dev/kfd): provisioning it as gfx90a
    # from data would report its GPU checks as skipped.
    probe, reason = with_data_arch(probe_with([]), "gfx90a", container=False)
    assert reason is None and probe["gpu"]["arch"] is None and "no GPU agent found" in arch_skip_reason(probe)
    refusal = data_arch_refusal(probe_with([]), "gfx90a", container=False)
    assert refusal.startswith("the probe found no GPU (rocminfo, KFD topology), yet the host data sets gpu_arch gfx90a")
    assert refusal.endswith("Fix the GPU, or remove gpu_arch from this host's data")


def test_gpu_checks_are_skipped_with_the_reason_no_gpu_can_exist():
    # The arch is gfx90a (from data) and the checks are on, yet no GPU can exist: skipped, never failed or passed.
    run = gpu_run.GpuRun(Path("/nonexistent"), Path("/nonexistent"), None, gpu_run.GpuLimits())
    reason = "no GPU at build time (arch gfx90a from the host data key gpu_arch)"
    checks, device, _ = smoke.gpu_checks("gfx90a", run, reason)
    assert device is None and len(checks) == len(smoke.GPU_CHECKS)
    assert {check["status"] for check in checks} == {"skipped"}
    assert all(check["detail"] == f"skipped: {reason}" for check in checks)


class Named:
    def __init__(self, name: str, prefix: str):
        self.name, self.print_prefix = name, prefix


def test_the_committed_image_id_is_read_from_pyinfra_s_line_for_that_host():
    handler = CommittedImages()
    bold = "\x1b[1m{}\x1b[0m"
    for name, image in (("@docker/a:1", "0123456789ab"), ("@docker/a:10", "ba9876543210")):
        prefix = f"[{bold.format(name)}] "
        handler.emit(logging.LogRecord("pyinfra", logging.INFO, __file__, 1,
                                       f"{prefix}docker build complete, image ID: {bold.format(image)}", None, None))
    assert handler.committed_by(Named("@docker/a:1", f"[{bold.format('@docker/a:1')}] ")) == "0123456789ab"
    assert handler.committed_by(Named("@docker/a:10", f"[{bold.format('@docker/a:10')}] ")) == "ba9876543210"
    assert handler.committed_by(Named("@docker/b", "[@docker/b] ")) is None


# In a private mount namespace: an overlay whose lower layer holds hsa/gfx90a, as in a committed image.
OVERLAY_SCRIPT = """
set -e
mount -t overlay overlay -o "lowerdir=$1/lower,upperdir=$1/upper,workdir=$1/work" "$1/merged"
cd "$1/merged/hsa"
if python3 -c 'import os; os.rename("gfx90a", "moved")' 2>/dev/null; then echo renamed; else echo EXDEV; fi
"$2" -c "
import sys; sys.path.insert(0, '$3')
from pathlib import Path
from cdna2.host.kernels import rename_directory
rename_directory(Path('gfx90a'), Path('.gfx90a.previous'))
print(sorted(p.name for p in Path('.').iterdir()), Path('.gfx90a.previous/fmha/a.co').read_text())
"
"""


def test_a_directory_from_a_lower_overlay_layer_is_moved_by_copy(tmp_path):
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("no private mount namespace here (unshare -m needs root)")
    for name in ("upper", "work", "merged"):
        (tmp_path / name).mkdir()
    (tmp_path / "lower" / "hsa" / "gfx90a" / "fmha").mkdir(parents=True)
    (tmp_path / "lower" / "hsa" / "gfx90a" / "fmha" / "a.co").write_text("kernel")
    result = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", OVERLAY_SCRIPT, "sh",
                             str(tmp_path), sys.executable, str(ROOT)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()
    assert first == "EXDEV"  # what a plain rename does there
    assert second == "['.gfx90a.previous'] kernel"


def test_without_dockerd_the_engine_is_unavailable_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_module, "DOCKERD", str(tmp_path / "no-dockerd"))
    with pytest.raises(engine_module.EngineUnavailable, match="no container engine: .*no-dockerd not found"):
        engine_module.Engine(tmp_path).start()


def test_a_recorded_pid_that_is_not_this_daemon_is_never_signalled(tmp_path):
    daemon = engine_module.Engine(tmp_path)
    daemon.pid_file.write_text(f"{os.getpid()}\n")  # alive, but pytest, not a dockerd on this socket
    assert daemon.pid() is None and daemon.stop() is False


def test_no_commit_line_is_an_error_not_a_silent_untagged_result():
    decision = decide("deploy", executed=True, failed=False, changed=True, tag=TAG_NAME)
    with pytest.raises(EngineError, match="pyinfra logged no committed image"):
        settle_image(Engine("false"), "local/base:1", None, decision)
