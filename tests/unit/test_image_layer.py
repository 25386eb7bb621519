"""The layer's bookkeeping beside an image (cdna2/images/layer.py): what it keeps of a run, how it checks a layer
it finds, and that a layer that does not fit leaves nothing behind."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from cdna2.host.digests import file_sha256
from cdna2.images.layer import (ImageTargetError, LayerFiles, intact_layer, place, prune_scratch,
                                strip_overlay_bookkeeping)


def test_only_the_deploys_result_is_kept_of_the_upper_directory(tmp_path):
    upper = tmp_path / "upper"
    keep = ["opt/venv/lib/python3.11/site-packages/aiter/ops/mha.py", "var/lib/cdna2/state.json"]
    scratch = ["tmp/pyinfra-x", "var/tmp/y", "root/.cache/pip/z", "var/lib/cdna2/lease.json",
               "opt/venv/lib/python3.11/site-packages/aiter/__pycache__/mha.cpython-311.pyc",
               "usr/lib/python3.11/__pycache__/os.cpython-311.pyc"]
    for name in keep + scratch:
        (upper / name).parent.mkdir(parents=True, exist_ok=True)
        (upper / name).write_text(name)
    assert prune_scratch(upper) == sorted(keep)
    assert not (upper / "usr").exists() and not (upper / "tmp").exists()  # emptied directories go too


@pytest.fixture
def written(tmp_path) -> LayerFiles:
    files = LayerFiles(tmp_path / "vllm.sif")
    files.image.write_bytes(b"image")
    files.layer.write_bytes(b"layer")
    files.record.write_text(json.dumps({"image_sha256": file_sha256(files.image),
                                        "layer_sha256": file_sha256(files.layer)}))
    return files


def test_an_intact_layer_is_recognised_and_one_for_other_image_bytes_is_stale(written):
    assert intact_layer(written, file_sha256(written.image))["layer_sha256"] == file_sha256(written.layer)
    assert intact_layer(written, "0" * 64) is None


def test_a_layer_edited_by_hand_or_without_its_record_is_refused_by_name(written):
    written.layer.write_bytes(b"edited")
    with pytest.raises(ImageTargetError, match=f"^{written.layer}: edited since it was written"):
        intact_layer(written, file_sha256(written.image))
    written.record.unlink()
    with pytest.raises(ImageTargetError, match=f"^{written.layer}: a layer with no record"):
        intact_layer(written, file_sha256(written.image))


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs: needs root")
def test_a_layer_with_no_room_beside_the_image_is_refused_and_nothing_is_written(tmp_path):
    directory = tmp_path / "small"
    directory.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(directory)], check=True)
    try:
        files = LayerFiles(directory / "vllm.sif")
        files.image.write_bytes(b"image")
        packed = tmp_path / "layer.sqsh"
        packed.write_bytes(os.urandom(2 << 20))
        with pytest.raises(ImageTargetError, match=f"^{files.layer}: no space for the layer"):
            place(files, packed, {"layer_sha256": "x"}, "#!/bin/sh\n")
        assert [path.name for path in directory.iterdir()] == ["vllm.sif"]
    finally:
        subprocess.run(["umount", str(directory)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="sets trusted.* xattrs: needs root")
def test_overlay_bookkeeping_goes_and_opaque_directories_stay(tmp_path):
    upper = tmp_path / "upper"
    (upper / "triton").mkdir(parents=True)
    (upper / "triton" / "knobs.py").write_text("x")
    try:
        os.setxattr(upper, "trusted.overlay.uuid", os.urandom(16))
    except OSError as error:
        pytest.skip(f"{tmp_path}'s filesystem takes no trusted xattrs: {error}")
    os.setxattr(upper / "triton", "trusted.overlay.opaque", b"y")
    os.setxattr(upper / "triton", "trusted.overlay.origin", b"\0\xfb")
    os.setxattr(upper / "triton" / "knobs.py", "trusted.overlay.origin", b"\0\xfb")
    strip_overlay_bookkeeping(upper)
    assert os.listxattr(upper) == [] and os.listxattr(upper / "triton" / "knobs.py") == []
    assert os.listxattr(upper / "triton") == ["trusted.overlay.opaque"]
