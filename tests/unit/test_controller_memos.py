"""What the controller keeps between probes: copies of patch targets by hash, and each host's RECORD facts."""

from __future__ import annotations

import binascii
import zlib
from pathlib import Path

import pytest

from cdna2 import probe_memo
from cdna2.host.digests import record_hash
from cdna2.host.probe import PROBE_FORMAT
from cdna2.patches import contents
from cdna2.patches.contents import TargetContentError, known_hashes, target_files


@pytest.fixture(autouse=True)
def controller_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CDNA2_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(probe_memo, "_loaded", {})
    return tmp_path / "cache"


def sent(data: bytes, record: str | None = None) -> dict:
    """A probe entry that carries the file's bytes, as cdna2.host.probe.read_patch_targets writes it."""
    return {"record": record, "current": record_hash(data),
            "content": binascii.b2a_base64(zlib.compress(data), newline=False).decode()}


def test_bytes_sent_once_are_held_and_given_back_for_later_probes() -> None:
    assert known_hashes() == []
    pristine, patched = b"GFX = 'gfx942'\n", b"GFX = 'gfx90a'\n"
    files, record = target_files("mi210-a", {"core.py": sent(pristine, record_hash(pristine)), "gone.py": None})
    assert files == {"core.py": pristine, "gone.py": None} and record == {"core.py": record_hash(pristine)}
    target_files("mi210-a", {"core.py": sent(patched, record_hash(pristine))})
    assert set(known_hashes()) == {record_hash(pristine), record_hash(patched)}
    left_out = {"core.py": dict(sent(patched, record_hash(pristine)), content=None)}
    assert target_files("mi210-b", left_out)[0] == {"core.py": patched}
    assert known_hashes()[0] == record_hash(patched), "the copy used last comes first"


def test_a_lost_or_damaged_copy_is_a_clear_error_naming_host_and_file() -> None:
    data = b"text\n"
    target_files("mi210-a", {"core.py": sent(data)})
    copy = contents.contents_dir() / record_hash(data).removeprefix("sha256=")
    copy.write_bytes(b"other\n")
    entry = {"core.py": dict(sent(data), content=None)}
    with pytest.raises(TargetContentError, match=r"host mi210-b: core.py: the controller's copy .* was removed"):
        target_files("mi210-b", entry)
    with pytest.raises(TargetContentError, match=r"host mi210-b: core.py: .* is gone: run again"):
        target_files("mi210-b", entry)
    damaged = dict(sent(data), current=record_hash(b"something else"))
    with pytest.raises(TargetContentError, match="do not match the hash it reported"):
        target_files("mi210-c", {"core.py": damaged})


def _probe_with(stat: str) -> dict:
    return {"record_facts": {"amd-aiter": {"stat": stat, "facts": {"paths": [], "targets": {}, "hsa_rel": "h",
                                                                    "gfx942": ["d", 1]}, "reused": False},
                             "vllm": {"stat": None, "facts": {"paths": [], "targets": {}}, "reused": False}}}


def test_record_facts_are_kept_per_host_and_rewritten_only_when_they_change(controller_cache: Path) -> None:
    assert probe_memo.record_memo("mi210-a") == {}
    probe_memo.remember_records("mi210-a", _probe_with("1,2,3,4"))
    memo_file = next((controller_cache / "probe-memo").iterdir())
    assert probe_memo.record_memo("mi210-a") == {"amd-aiter": {"stat": "1,2,3,4", "facts": {
        "paths": [], "targets": {}, "hsa_rel": "h", "gfx942": ["d", 1]}}}, "a RECORD without a stat is not kept"
    written = memo_file.stat().st_mtime_ns
    probe_memo.remember_records("mi210-a", _probe_with("1,2,3,4"))
    assert memo_file.stat().st_mtime_ns == written, "an unchanged memo is not written again"
    probe_memo._loaded.clear()  # a new controller run reads it from the cache
    assert probe_memo.record_memo("mi210-a")["amd-aiter"]["stat"] == "1,2,3,4"
    assert probe_memo.record_memo("mi210-b") == {}, "another host's memo is its own"
    memo_file.write_text(memo_file.read_text().replace(f'"format": {PROBE_FORMAT}', '"format": 0'))
    probe_memo._loaded.clear()
    assert probe_memo.record_memo("mi210-a") == {}, "a memo of another probe format is not used"
