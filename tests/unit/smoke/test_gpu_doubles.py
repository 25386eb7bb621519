"""The smoke test's GPU half end to end, through the real smoke command and its real child processes.

Only what cannot exist here is a test double: AITER (``doubles/aiter``, installed as the fixture host's aiter
package; it computes the documented semantics on CPU torch and prints AITER's load lines) and the MI210
(``doubles/device/sitecustomize.py``: CPU torch presented as one gfx90a device). Everything else is real: the
smoke command and its GPU children, their process groups, the pass rule, the load-line proof, the JIT locks.
torch is the real CPU build from the machine's pip configuration, cached as a wheelhouse tree.

What stays unproven without an MI210: that AITER's real kernels and loaders behave as the double does (load lines
as printed by AITER's C++ on the device, AITER's batched output landing in the caching allocator's freed
NaN-filled blocks, the error figures of the real kernels against this pass rule), and the timings.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from cdna2.families import host_families
from cdna2.host import digests, smoke, smoke_gpu, state, window_proof
from cdna2.smoke_proof import TRITON_OPS_SET, WRITE_RECORD, window_record_action
from lab import wheelhouse
from tests.unit.operations.test_smoke_operation import recorded, run_smoke_op
from tests.unit.smoke.conftest import (GFX90A, Host, code_object, make_agent, make_target_python,
                                       provisioned_host, run_smoke_command, statuses)

DOUBLES = Path(__file__).resolve().parent / "doubles"
KERNELS = {relpath: code_object(GFX90A, relpath) for relpath in (
    *(f"fmha_v3_fwd/MI300/{name}.co"
      for name in ("fwd_hd128_bf16_rtna", "fwd_hd128_bf16_causal_rtna", "fwd_hd128_bf16_causal_rtna_group")),
    "mla/mla_dec_stage1_bf16_a16w16_subQ16_mqa16.co", "topksoftmax/topksoftmax_4x128x8.co", "fmoe_f16.co",
    "bf16gemm/bf16gemm_outf32_tn_32x64_pf3.co", "layer_norm.co")}
FAMILIES = json.dumps(host_families())
GPU_NAMES = [check.name for check in smoke.GPU_CHECKS]
pytestmark = pytest.mark.slow  # each smoke run starts about ten interpreters that import torch


class Lab:
    """One provisioned host whose aiter is the AITER double, a target venv that reaches it, torch and the device
    double, and the agent; shared by the tests of this module (none leaves the host changed)."""

    def __init__(self, root: Path) -> None:
        self.host: Host = provisioned_host(root, (DOUBLES / "aiter" / "__init__.py").read_bytes(), KERNELS)
        self.python = make_target_python(root / "venv", [
            self.host.site, wheelhouse.installed_tree(wheelhouse.TORCH_CPU, with_deps=True),
            wheelhouse.installed_tree(wheelhouse.TRITON_PINNED), DOUBLES / "device"])
        # the config aiter-triton-gfx90a installs: the Triton GEMM checks apply only where it is
        config = self.host.site / "aiter" / "ops" / "triton" / "configs" / "gemm" / "MI200-GEMM-A16W16.json"
        config.parent.mkdir(parents=True)
        config.write_text('{"any": {}}\n')
        # the module vLLM imports the Triton rope from (AITER 0.1.10 on): the rope check applies only where it is
        self.rope_module = self.host.site / "aiter" / "ops" / "triton" / "rope" / "rope.py"
        self.rope_module.parent.mkdir()
        self.rope_module.write_text("# AITER's module; the double's aiter package answers the import\n")
        self.agent = make_agent(root / "agent")
        self.home = root / "home"
        self.home.mkdir()

    def smoke(self, *options: str, device: str = "gfx90a", aiter: dict | None = None,
              host_arch: str = "gfx90a") -> tuple[int, dict]:
        """The smoke command from a home directory, with the device double in ``device`` mode."""
        env = {"CDNA2_DEVICE_DOUBLE": device, "CDNA2_AITER_DOUBLE": json.dumps(aiter or {})}
        code, report, _ = run_smoke_command(self.python, self.agent, self.host, "--host-arch", host_arch,
                                            "--families", FAMILIES, *options, env=env, cwd=self.home)
        return code, report


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Lab:
    return Lab(tmp_path_factory.mktemp("gpu-doubles"))


def gpu(report: dict) -> dict[str, dict]:
    return {check["name"]: check for check in report["checks"] if check["kind"] == "gpu"}


@pytest.fixture(scope="module")
def correct_run(lab: Lab) -> tuple[int, dict]:
    """Correct output from the ASM kernels, with an aiter/ that would shadow the installed one in the smoke
    command's working directory (a home directory) and in the state directory (the GPU children's)."""
    shadows = [lab.home / "aiter", lab.host.state_dir / "aiter"]
    for shadow in shadows:
        shadow.mkdir()
        (shadow / "__init__.py").write_text("raise SystemExit('the shadowing aiter was imported')\n")
    try:
        return lab.smoke()
    finally:
        for shadow in shadows:
            (shadow / "__init__.py").unlink()
            shadow.rmdir()


FAULTS = {"flash_attn_func:causal:512": "zero_rows",  # rows 256-511 of one head set to zero
          "flash_attn_func:causal:1000": "drop_last_keys",  # the last 64 keys ignored
          "flash_attn_func:full:512": "five_percent",  # every output 5% off, not causal
          "flash_attn_varlen_func:causal:383": "five_percent",  # and causal
          "pa_fwd_asm:full:1": "fallback",  # correct, computed without loading a code object
          "gemm_a16w16:full:32": "fallback",  # correct, computed without a Triton launch
          "gemm_a16w16:full:4096": "five_percent",
          "rope:full:300": "fallback",  # correct, computed without a Triton launch
          "unified_attention:causal:1000": "five_percent",  # the sliding-window prefill
          "unified_attention:causal:1": "drop_last_keys",  # the decode
          "flash_attn_varlen_func:causal:1000": "hang"}  # the sliding-window case holds a JIT lock and hangs
HANG_LIMIT = 45  # seconds: a case that does not hang finishes well within it, even on a loaded machine


def faulty_smoke(lab: Lab) -> tuple[int, dict, float]:
    """One run in which every case but one misbehaves in its own way (FAULTS), and its time."""
    started = time.monotonic()
    code, report = lab.smoke("--case-timeout", str(HANG_LIMIT), aiter={"faults": FAULTS})
    return code, report, time.monotonic() - started


def smoke_without_triton_configs(lab: Lab) -> tuple[int, dict]:
    """A run without the config aiter-triton-gfx90a installs and without AITER's rope/rope.py (AITER before
    0.1.10); both are put back afterwards."""
    config = lab.host.site / "aiter" / "ops" / "triton" / "configs" / "gemm" / "MI200-GEMM-A16W16.json"
    saved = config.read_bytes(), lab.rope_module.read_bytes()
    config.unlink()
    lab.rope_module.unlink()
    try:
        return lab.smoke()
    finally:
        config.write_bytes(saved[0])
        lab.rope_module.write_bytes(saved[1])


SIDE_RUNS = {"faulty_run": faulty_smoke, "run_without_triton_configs": smoke_without_triton_configs}


class SideRuns:
    """The runs of SIDE_RUNS, on a second host of their own, one after the other in a thread, while the tests run the
    others on ``lab``: a smoke run keeps about one core busy (its GPU children run one at a time) and the faulty run
    spends HANG_LIMIT seconds waiting on its hung case, so two hosts side by side use the two cores the suite has."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpu-doubles-side")
        self.host: Future[Lab] | None = None
        self.runs: dict[str, Future] = {}

    def start(self, name: str) -> Future:
        """The run ``name`` of SIDE_RUNS, queued on the side host unless it already is."""
        if self.host is None:
            self.host = self.pool.submit(Lab, self.root)
        if name not in self.runs:
            self.runs[name] = self.pool.submit(lambda: SIDE_RUNS[name](self.host.result()))
        return self.runs[name]


@pytest.fixture(scope="module", autouse=True)
def side(request, tmp_path_factory) -> Iterator[SideRuns]:
    """Starts, as the module starts, the side runs that the selected tests of this module use."""
    runs = SideRuns(tmp_path_factory.mktemp("gpu-doubles-side"))
    for item in request.session.items:
        if getattr(item, "module", None) is request.module:
            for name in SIDE_RUNS.keys() & set(item.fixturenames):
                runs.start(name)
    yield runs
    runs.pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def faulty_run(side: SideRuns) -> tuple[int, dict, float]:
    return side.start("faulty_run").result()


@pytest.fixture(scope="module")
def run_without_triton_configs(side: SideRuns) -> tuple[int, dict]:
    return side.start("run_without_triton_configs").result()


def test_correct_output_from_the_asm_kernels_passes_every_gpu_check(correct_run) -> None:
    code, report = correct_run
    assert code == 0, json.dumps(report, indent=1)
    checks = gpu(report)
    assert {name: check["status"] for name, check in checks.items()} == dict.fromkeys(GPU_NAMES, "passed")
    assert statuses(report)["import_aiter"] == "passed"
    assert report["device"]["arch"].startswith("gfx90a") and report["host_arch"] == "gfx90a"
    assert "hsa/gfx90a/fmha_v3_fwd/MI300/fwd_hd128_bf16_causal_rtna_group.co" in \
        checks["fmha_v3_fwd_varlen_group"]["detail"]
    assert "Triton launched _gemm_a16_w16_kernel" in checks["triton_gemm_a16w16_large"]["detail"]
    assert "Triton launched kernel_unified_attention_3d" in checks["triton_unified_attention_decode"]["detail"]
    assert "Triton launched kernel_unified_attention_2d" in checks["triton_unified_attention_sliding_window"]["detail"]
    for name, check in checks.items():
        worst = float(check["detail"].split("worst row ")[1].split(",")[0])
        assert worst < smoke_gpu.ROW_REL_RMS_LIMIT / 2, f"{name}: correct output needs margin: {check['detail']}"
        assert " 0 of " in check["detail"], f"{name}: every element within its bound: {check['detail']}"


def test_a_shadowing_aiter_in_the_working_directories_is_not_imported(correct_run) -> None:
    code, report = correct_run
    assert code == 0, "the shadowing aiter/ raises SystemExit on import: every GPU child would have failed"
    assert all(check["status"] == "passed" for check in gpu(report).values())


def test_the_four_wrong_outputs_are_wrong(faulty_run) -> None:
    code, report, _ = faulty_run
    assert code == 1
    checks = gpu(report)
    for name in ("fmha_v3_fwd_bf16_hd128", "fmha_v3_fwd_bf16_hd128_causal", "fmha_v3_fwd_bf16_hd128_partial_tile",
                 "fmha_v3_fwd_varlen_group"):
        assert checks[name]["status"] == "wrong" and checks[name]["detail"].startswith("WRONG:"), checks[name]
    assert "elements outside the bound" in checks["fmha_v3_fwd_bf16_hd128_causal"]["detail"]


def test_a_correct_result_without_a_load_line_is_a_fallback_and_fails(faulty_run) -> None:
    check = gpu(faulty_run[1])["pa_fwd_asm_bf16_block16_gqa8"]
    assert check["status"] == "failed", check
    assert "a fallback computed it (no load line at all)" in check["detail"], check


def test_a_triton_gemm_without_a_triton_launch_is_a_fallback_and_fails(faulty_run) -> None:
    checks = gpu(faulty_run[1])
    fallback, wrong = checks["triton_gemm_a16w16_small"], checks["triton_gemm_a16w16_large"]
    assert fallback["status"] == "failed", fallback
    assert "Triton launched no _gemm_a16_w16_kernel (launched: nothing), so a fallback computed it" in \
        fallback["detail"], fallback
    assert wrong["status"] == "wrong" and wrong["detail"].startswith("WRONG:"), wrong


def test_a_triton_op_without_its_launch_or_off_the_reference_is_named(faulty_run) -> None:
    checks = gpu(faulty_run[1])
    assert checks["triton_rope"]["status"] == "failed", checks["triton_rope"]
    assert "Triton launched no _rope_kernel_cached_thd_2c_gqa_onehead_fwd (launched: nothing)" in \
        checks["triton_rope"]["detail"]
    for name in ("triton_unified_attention_sliding_window", "triton_unified_attention_decode"):
        assert checks[name]["status"] == "wrong" and checks[name]["detail"].startswith("WRONG:"), checks[name]


def test_without_the_triton_configs_the_triton_gemm_checks_are_skipped_by_name(run_without_triton_configs) -> None:
    """And without AITER's rope/rope.py (AITER before 0.1.10) the rope check; unified attention needs no file."""
    code, report = run_without_triton_configs
    assert code == 0, json.dumps(report, indent=1)
    checks = gpu(report)
    for name in ("triton_gemm_a16w16_small", "triton_gemm_a16w16_large"):
        assert checks[name]["status"] == "skipped", checks[name]
        assert "the optional aiter-triton-gfx90a set" in checks[name]["detail"], checks[name]
    assert checks["triton_rope"]["status"] == "skipped", checks["triton_rope"]
    assert "which AITER has from 0.1.10 on (aiter/ops/triton/rope/rope.py)" in checks["triton_rope"]["detail"]
    assert checks["fmha_v3_fwd_bf16_hd128"]["status"] == "passed"
    assert checks["triton_unified_attention_decode"]["status"] == "passed"


def test_a_hung_case_is_killed_with_its_grandchildren_and_leaves_no_lock(side: SideRuns, faulty_run) -> None:
    _, report, elapsed = faulty_run
    assert elapsed < 900
    hung = gpu(report)["sliding_window_attention"]
    host = side.host.result().host  # the side host ran faulty_run
    lock = host.site / "aiter" / "jit" / "build" / "lock_module_fmha_v3_fwd"
    assert hung["status"] == "failed" and f"timed out after {HANG_LIMIT} s" in hung["detail"], hung
    assert "killed its process group (2 processes" in hung["detail"], hung
    assert f"removed the JIT locks it held: {lock}" in hung["detail"], hung
    assert not lock.exists(), "the lock the killed build held is gone"
    leftovers = [pid for pid in os.listdir("/proc") if pid.isdigit() and _runs_hang(pid, host.state_dir)]
    assert not leftovers, f"processes of the hung case are still running: {leftovers}"


def _runs_hang(pid: str, state_dir: Path) -> bool:
    """Whether ``pid`` is the hung case's compiler of this host: the GPU children (and what they start) run in its
    state directory; another test session's on this machine run in theirs."""
    try:
        return b"time.sleep(3600)" in Path(f"/proc/{pid}/cmdline").read_bytes() and \
            Path(f"/proc/{pid}/cwd").resolve() == state_dir.resolve()
    except OSError:
        return False


@pytest.fixture(scope="module")
def crashed_run(lab: Lab) -> tuple[int, dict]:
    """The device probe dies with SIGSEGV on a host the probe saw as gfx90a."""
    return lab.smoke(device="crash")


@pytest.mark.parametrize("device, reason", [
    ("crash", "ended with SIGSEGV (exit 139) and no report"),
    ("none", "no device (torch"),
])
def test_an_unusable_device_on_a_gfx90a_host_fails_every_gpu_check(lab: Lab, crashed_run, device: str,
                                                                   reason: str) -> None:
    code, report = crashed_run if device == "crash" else lab.smoke(device=device)
    assert code == 1
    for check in gpu(report).values():
        assert check["status"] == "failed", check
        assert check["detail"].startswith("the host probe saw gfx90a but its GPU cannot be used: "), check
        assert reason in check["detail"], check


def test_a_hung_device_probe_on_a_gfx90a_host_is_killed_and_fails_every_gpu_check(lab: Lab) -> None:
    code, report = lab.smoke("--device-timeout", "20", device="hang")
    assert code == 1
    for check in gpu(report).values():
        assert check["status"] == "failed", check
        assert "its GPU cannot be used: timed out after 20 s; killed its process group" in check["detail"], check


def test_a_crashing_device_probe_gets_no_recorded_pass(crashed_run) -> None:
    # The deploy's smoke operation, on a pyinfra @fake host that answers with what the smoke command printed.
    state, host, report = run_smoke_op(json.dumps(crashed_run[1]), host_arch="gfx90a")
    assert host in state.failed_hosts
    assert recorded(host) == [], "no pass may be recorded"
    assert report.host("@fake/a").steps["smoke"].status == "failed"


def test_gpu_checks_are_skipped_only_without_a_gpu_or_when_turned_off(lab: Lab) -> None:
    code, report = lab.smoke(host_arch="none", device="none")
    assert code == 0 and {check["status"] for check in gpu(report).values()} == {"skipped"}
    assert all(check["detail"] == "skipped: the host probe found no GPU" for check in gpu(report).values())
    code, report = lab.smoke("--no-gpu-checks", device="none")
    assert code == 0 and report["gpu_checks"] is False
    assert all("GPU checks are off for this host" in check["detail"] for check in gpu(report).values())


FAMILY_VERDICTS = {"all_reduce": "withheld", "bf16gemm": "proven", "fmha_v3_fwd": "proven", "fmoe_g1u0": "proven",
                   "layer_norm": "proven", "mla": "proven", "pa": "proven", "topksoftmax": "proven"}
MLA_DEFECT = {"mla_decode_fwd:full:1": "five_percent"}  # MLA decode 5% off: one family's kernels compute wrong


def verdicts(report: dict) -> dict[str, str]:
    return {name: entry["verdict"] for name, entry in report["families"].items()}


def issued(host, module: str) -> list[str]:
    return [command for command in host.connector.executed_commands if f"cdna2.host.{module}" in command]


def reasons_of(command: str) -> dict[str, str]:
    return json.loads(shlex.split(command[command.index("--reasons"):])[1])


def test_correct_output_proves_every_family_with_a_check_and_withholds_the_one_without(correct_run) -> None:
    _, report = correct_run
    assert verdicts(report) == FAMILY_VERDICTS
    assert report["families"]["mla"]["reason"] == "mla_decode_bf16_gqa16 passed on this GPU"
    assert list(report["withhold"]) == ["all_reduce"]


def test_a_defect_in_one_family_withholds_it_alone_and_a_rerun_with_the_same_verdicts_changes_nothing(
        lab: Lab, tmp_path: Path) -> None:
    code, report = lab.smoke(aiter={"faults": MLA_DEFECT})
    assert gpu(report)["mla_decode_bf16_gqa16"]["status"] == "wrong", gpu(report)["mla_decode_bf16_gqa16"]
    assert verdicts(report) == {**FAMILY_VERDICTS, "mla": "withheld"}
    assert report["families"]["mla"]["reason"].startswith("mla_decode_bf16_gqa16 wrong: WRONG: MLA decode")
    assert sorted(report["withhold"]) == ["all_reduce", "mla"]
    # The deploy's smoke operation: the wrong check is answered by withholding its family, so the host passes and
    # the withholding is issued for exactly those two families.
    state_, host, run_report = run_smoke_op(json.dumps(report), host_arch="gfx90a",
                                            hsa_root=str(lab.host.tree.parent))
    assert host not in state_.failed_hosts and recorded(host)
    (withhold,) = issued(host, "families")
    assert sorted(reasons_of(withhold)) == ["all_reduce", "mla"]
    assert run_report.host("@fake/a").details["families"]["mla"]["verdict"] == "withheld"
    assert "2 withheld (all_reduce, mla)" in run_report.host("@fake/a").steps["smoke"].detail
    # The withholding on the host (the lab host is put back afterwards: the other tests share it).
    saved = tmp_path / "saved"
    shutil.copytree(lab.host.tree, saved / "gfx90a")
    shutil.copyfile(lab.host.state_dir / "state.json", saved / "state.json")
    before = {relpath: digests.file_sha256(path) for relpath, path in digests.regular_files(lab.host.tree)}
    try:
        subprocess.run([sys.executable, "-m", "cdna2.host.families", "withhold", "--site-packages",
                        str(lab.host.site), "--hsa-root", str(lab.host.tree.parent), "--state-dir",
                        str(lab.host.state_dir), "--families", FAMILIES, "--reasons",
                        json.dumps(reasons_of(withhold))], check=True, capture_output=True)
        after = {relpath: digests.file_sha256(path) for relpath, path in digests.regular_files(lab.host.tree)}
        gone = {"mla/mla_dec_stage1_bf16_a16w16_subQ16_mqa16.co", "all_reduce.co"}
        assert after == {relpath: digest for relpath, digest in before.items() if relpath not in gone}
        # Again, with the same defect: the withheld family's check is not run, nothing more is withheld, the host
        # passes, and the tree stays as it is.
        code, again = lab.smoke(aiter={"faults": MLA_DEFECT})
        assert gpu(again)["mla_decode_bf16_gqa16"]["status"] == "skipped"
        assert "its family mla is withheld on this host" in gpu(again)["mla_decode_bf16_gqa16"]["detail"]
        assert verdicts(again) == {**FAMILY_VERDICTS, "mla": "withheld"} and again["withhold"] == {}
        state_, host, _ = run_smoke_op(json.dumps(again), host_arch="gfx90a", hsa_root=str(lab.host.tree.parent))
        assert host not in state_.failed_hosts and recorded(host) and not issued(host, "families")
        assert {relpath: digests.file_sha256(path) for relpath, path in digests.regular_files(lab.host.tree)} == after
        assert sorted(state.read_state(lab.host.state_dir)["kernels"]["withheld"]) == ["all_reduce", "mla"]
    finally:
        shutil.rmtree(lab.host.tree)
        shutil.copytree(saved / "gfx90a", lab.host.tree)
        shutil.copyfile(saved / "state.json", lab.host.state_dir / "state.json")


def _run_on_lab(lab: Lab, command: str) -> dict:
    """An issued cdna2.host.window_proof command, run by the lab's target python with the agent, in its state dir."""
    arguments = shlex.split(command[command.index("cdna2.host.window_proof"):])[1:]
    arguments[arguments.index("--state-dir") + 1] = str(lab.host.state_dir)
    completed = subprocess.run(["env", f"PYTHONPATH={lab.agent}", str(lab.python), "-B", "-m",
                                "cdna2.host.window_proof", *arguments], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def test_the_deploy_records_the_sliding_window_check_for_the_unified_attention_guard(
        lab: Lab, correct_run, faulty_run) -> None:
    """vllm-aiter-triton-ops' guard reads what the smoke operation records of triton_unified_attention_sliding_window:
    a pass of this node's GPU for the AITER files and triton installed, then a failed run's outcome over it, and in a
    shared environment nothing (its earlier record removed); the record is written through a transaction that
    rollback reverts (its backup directory is gone with it)."""
    record = lab.host.site / window_proof.RECORD
    module = lab.host.site / "aiter" / "ops" / "triton" / "unified_attention.py"
    module.write_text("# AITER's module; the double's aiter package answers the import\n")
    assert not (lab.host.site / "vllm" / "v1").exists()  # the lab's vLLM has no backends: made here, removed after
    record.parent.mkdir(parents=True)
    backups = lab.host.state_dir / "backups" / window_proof.PLAN
    try:
        _, report = correct_run
        state_, host, run_report = run_smoke_op(json.dumps(report), host_arch="gfx90a",
                                                hsa_root=str(lab.host.tree.parent), window_record=WRITE_RECORD,
                                                vllm_site_packages=str(lab.host.site))
        assert host not in state_.failed_hosts
        (write,) = issued(host, "window_proof")
        assert _run_on_lab(lab, write)["changed"] == [window_proof.RECORD]
        written = json.loads(record.read_text())
        assert written["status"] == "passed" and written["node"] == os.uname().nodename
        assert written["triton"] == "3.7.1"  # the pinned triton the target python finds
        assert written["aiter_files"] == {"ops/triton/unified_attention.py": digests.file_sha256(module)}
        assert any(note.startswith(f"sliding-window record: {window_proof.CHECK} passed on this host's GPU")
                   for note in run_report.host("@fake/a").notes)
        # A later run whose sliding-window case is wrong fails the host and rewrites the record with that outcome.
        _, faulty, _ = faulty_run
        state_, host, _ = run_smoke_op(json.dumps(faulty), host_arch="gfx90a", hsa_root=str(lab.host.tree.parent),
                                       window_record=WRITE_RECORD, vllm_site_packages=str(lab.host.site))
        assert host in state_.failed_hosts
        (rewrite,) = issued(host, "window_proof")
        _run_on_lab(lab, rewrite)
        assert json.loads(record.read_text())["status"] == "wrong"
        # In a shared environment (and without the set) the writer removes it: nothing is admitted there.
        state_, host, _ = run_smoke_op(json.dumps(report), host_arch="gfx90a", hsa_root=str(lab.host.tree.parent),
                                       window_record=window_record_action({"vllm": [TRITON_OPS_SET]}, True, True),
                                       vllm_site_packages=str(lab.host.site))
        (removal,) = issued(host, "window_proof")
        assert " remove " in removal
        assert _run_on_lab(lab, removal)["changed"] == [window_proof.RECORD]
        assert not record.exists() and not backups.exists()
    finally:
        shutil.rmtree(lab.host.site / "vllm" / "v1")
        shutil.rmtree(backups, ignore_errors=True)
        module.unlink()
