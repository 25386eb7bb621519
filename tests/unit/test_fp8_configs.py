"""Tuned MI210 block-FP8 configs: names and JSON shape checked as vLLM reads them, planned and written through the
patch transaction (added files recorded, a revert removes them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdna2.fp8_configs import CONFIG_DIR, Fp8ConfigError, load_configs, plan_configs
from cdna2.host import txn
from cdna2.patches import sha256_hex

NAME = "N=5120,K=5120,device_name=AMD_Instinct_MI210,dtype=fp8_w8a8,block_shape=[128,128].json"
CONFIG = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
                "num_stages": 2},
          "64": {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 8, "num_warps": 8,
                 "kpack": 2, "matrix_instr_nonkdim": 16}}


def config_dir(tmp_path: Path, files: dict[str, object]) -> Path:
    directory = tmp_path / "configs"
    directory.mkdir()
    for name, document in files.items():
        (directory / name).write_text(document if isinstance(document, str) else json.dumps(document))
    return directory


def test_a_valid_directory_loads_by_path_under_site_packages(tmp_path: Path) -> None:
    loaded = load_configs(str(config_dir(tmp_path, {NAME: CONFIG})))
    assert list(loaded) == [f"{CONFIG_DIR}/{NAME}"] and json.loads(loaded[f"{CONFIG_DIR}/{NAME}"]) == CONFIG


@pytest.mark.parametrize("name, document, reason", [
    ("N=5120,K=5120,device_name=AMD_Instinct_MI300X,dtype=fp8_w8a8,block_shape=[128,128].json", CONFIG,
     "device_name is AMD_Instinct_MI300X; vLLM names the MI210 AMD_Instinct_MI210"),
    ("mi210-qwen3.json", CONFIG, "not a vLLM block-FP8 config name"),
    (NAME, "{not json", "not JSON"),
    (NAME, {"1": dict(CONFIG["1"], BLOCK_SIZE_Q=4)}, "$.1: Additional properties are not allowed ('BLOCK_SIZE_Q'"),
    (NAME, {"one": CONFIG["1"]}, "does not match '^[1-9][0-9]*$'"),
    (NAME, {"1": {key: value for key, value in CONFIG["1"].items() if key != "num_warps"}},
     "$.1: 'num_warps' is a required property"),
    (NAME, {"1": dict(CONFIG["1"], BLOCK_SIZE_K=64)}, "batch 1: BLOCK_SIZE_N 128 and BLOCK_SIZE_K 64 must be multiples"),
])
def test_files_vllm_would_not_use_are_refused_by_name(tmp_path: Path, name: str, document: object,
                                                      reason: str) -> None:
    directory = config_dir(tmp_path, {name: document})
    with pytest.raises(Fp8ConfigError) as raised:
        load_configs(str(directory))
    assert str(raised.value).startswith(f"fp8_block_configs: {directory}/{name}: ") and reason in str(raised.value)


def test_an_empty_or_missing_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Fp8ConfigError, match="holds no config file"):
        load_configs(str(config_dir(tmp_path, {})))
    with pytest.raises(Fp8ConfigError, match="is not a directory on the controller"):
        load_configs(str(tmp_path / "absent"))


def test_plan_adds_absent_files_keeps_installed_ones_and_refuses_foreign_ones() -> None:
    path, data = f"{CONFIG_DIR}/{NAME}", json.dumps(CONFIG).encode()
    added = plan_configs({path: data}, {path: None}, {})
    assert added.status == "apply" and [(c.path, c.old_sha256) for c in added.changes] == [(path, None)]
    assert plan_configs({path: data}, {path: data}, {}).status == "patched"
    ours = {path: {"original_sha256": None, "patched_sha256": sha256_hex(b"older")}}
    assert plan_configs({path: data}, {path: b"older"}, ours).changes[0].old_sha256 == sha256_hex(b"older")
    foreign = plan_configs({path: data}, {path: b"someone else's"}, {})
    assert foreign.status == "refused" and not foreign.changes
    assert foreign.reasons[0].startswith(f"{path}: exists and is not a config this tool installed")


def test_transaction_adds_a_file_and_revert_removes_it(tmp_path: Path) -> None:
    root, backups = tmp_path / "site", tmp_path / "backups"
    (root / CONFIG_DIR).mkdir(parents=True)
    path, data = f"{CONFIG_DIR}/{NAME}", json.dumps(CONFIG).encode()
    plan = plan_configs({path: data}, {path: None}, {})
    staged = root / f"{path}.cdna2-staged"
    staged.write_bytes(data)
    txn.apply(plan.transaction(str(root), str(backups), {path: str(staged)}))
    target = root / path
    assert target.read_bytes() == data and oct(target.stat().st_mode & 0o777) == "0o644"
    recorded = json.loads((backups / "state.json").read_text())
    assert recorded["version"] is None and recorded["files"][path] == {"original_sha256": None,
                                                                         "patched_sha256": sha256_hex(data)}
    target.write_bytes(b"edited")
    with pytest.raises(txn.TxnError, match="edited after patching"):
        txn.revert(backups, root)
    target.write_bytes(data)
    assert txn.revert(backups, root)["changed"] == [path] and not target.exists()
    assert txn.revert(backups, root)["changed"] == [], "a second revert changes nothing"


def test_an_interrupted_revert_of_an_added_file_is_finished_by_recover(tmp_path: Path, monkeypatch) -> None:
    root, backups = tmp_path / "site", tmp_path / "backups"
    (root / CONFIG_DIR).mkdir(parents=True)
    path, data = f"{CONFIG_DIR}/{NAME}", json.dumps(CONFIG).encode()
    staged = root / f"{path}.cdna2-staged"
    staged.write_bytes(data)
    txn.apply(plan_configs({path: data}, {path: None}, {}).transaction(str(root), str(backups), {path: str(staged)}))
    monkeypatch.setattr(txn, "_finish", lambda *args: (_ for _ in ()).throw(RuntimeError("crash")))
    with pytest.raises(RuntimeError):
        txn.revert(backups, root)
    monkeypatch.undo()
    assert (backups / "journal.json").exists()
    assert txn.recover(backups)["recovered"] == "revert" and not (root / path).exists()
