"""Reading the reviewed manifest without being tricked (DESIGN §6.1): every refusal happens on
the local file system, before anything could be sent."""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

import pytest

import ito.client.secure_file as secure_file
from ito.client.secure_file import read_manifest_securely
from ito.core.errors import ItoError

CONTENT = b'{"schema": "ito.training.manifest.v1"}\n'


def _write(path: Path, data: bytes = CONTENT, mode: int = 0o600) -> Path:
    path.write_bytes(data)
    path.chmod(mode)
    return path


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    return _write(tmp_path / "manifest.json")


def _code(path: str | Path, **kwargs: int) -> str:
    with pytest.raises(ItoError) as info:
        read_manifest_securely(str(path), **kwargs)
    return info.value.code


# --- the accepted case ----------------------------------------------------------------------


def test_a_safe_manifest_is_read_as_its_exact_bytes_with_their_digest(manifest: Path) -> None:
    result = read_manifest_securely(str(manifest))
    assert result.raw == CONTENT
    assert result.digest == "sha256:" + hashlib.sha256(CONTENT).hexdigest()
    assert result.path == str(manifest)


def test_a_read_only_manifest_in_a_group_readable_directory_is_accepted(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o755)
    path = _write(folder / "m.json", mode=0o444)
    assert read_manifest_securely(str(path)).raw == CONTENT


def test_a_manifest_of_exactly_max_bytes_is_accepted(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.json", b"x" * 10)
    assert read_manifest_securely(str(path), max_bytes=10).raw == b"x" * 10


# --- path shape -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["manifest.json", "./manifest.json", "../m.json", ""])
def test_a_relative_path_is_refused(path: str) -> None:
    assert _code(path) == "manifest_path_not_absolute"


def test_a_symlink_as_the_final_component_is_refused(tmp_path: Path, manifest: Path) -> None:
    link = tmp_path / "link.json"
    link.symlink_to(manifest)
    assert _code(link) == "manifest_symlink"


def test_a_dangling_symlink_is_refused_as_a_symlink(tmp_path: Path) -> None:
    link = tmp_path / "dangling.json"
    link.symlink_to(tmp_path / "nowhere.json")
    assert _code(link) == "manifest_symlink"


def test_a_symlinked_parent_directory_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    _write(real / "m.json")
    (tmp_path / "alias").symlink_to(real)
    assert _code(tmp_path / "alias" / "m.json") == "manifest_symlink"


def test_a_symlink_higher_up_the_path_is_refused(tmp_path: Path) -> None:
    deep = tmp_path / "real" / "a" / "b"
    deep.mkdir(parents=True, mode=0o700)
    _write(deep / "m.json")
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    assert _code(tmp_path / "alias" / "a" / "b" / "m.json") == "manifest_symlink"


def test_a_symlink_swapped_in_after_the_path_check_fails_the_open(
    tmp_path: Path, manifest: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = secure_file._refuse_symlink_components
    decoy = _write(tmp_path / "decoy.json")

    def check_then_swap(path: str) -> None:
        original(path)
        manifest.unlink()
        manifest.symlink_to(decoy)

    monkeypatch.setattr(secure_file, "_refuse_symlink_components", check_then_swap)
    assert _code(manifest) == "manifest_symlink"


def test_a_missing_manifest_is_not_found(tmp_path: Path) -> None:
    assert _code(tmp_path / "missing.json") == "manifest_not_found"


def test_a_manifest_under_a_missing_directory_is_not_found(tmp_path: Path) -> None:
    assert _code(tmp_path / "nodir" / "m.json") == "manifest_not_found"


# --- what the path names --------------------------------------------------------------------


def test_a_directory_is_not_a_regular_file(tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir(mode=0o700)
    assert _code(folder) == "manifest_not_regular_file"


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo, 0o600)
    assert _code(fifo) == "manifest_not_regular_file"


def test_a_unix_socket_is_not_a_regular_file(tmp_path: Path) -> None:
    path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        path.chmod(0o600)
        assert _code(path) == "manifest_not_regular_file"


def test_a_character_device_is_not_a_regular_file() -> None:
    assert _code("/dev/null") == "manifest_not_regular_file"


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o622, 0o666])
def test_a_manifest_writable_by_group_or_others_is_unsafe(tmp_path: Path, mode: int) -> None:
    path = _write(tmp_path / "m.json", mode=mode)
    assert _code(path) == "manifest_unsafe_permissions"


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o703])
def test_a_manifest_in_a_directory_others_can_write_is_unsafe(tmp_path: Path, mode: int) -> None:
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(mode)
    path = _write(folder / "m.json")
    assert _code(path) == "manifest_unsafe_permissions"


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_a_manifest_owned_by_another_user_is_refused(manifest: Path) -> None:
    os.chown(manifest, 12345, -1)
    assert _code(manifest) == "manifest_wrong_owner"


# --- size -----------------------------------------------------------------------------------


def test_a_manifest_over_max_bytes_is_too_large(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.json", b"x" * 11)
    assert _code(path, max_bytes=10) == "manifest_too_large"


def test_a_manifest_over_the_default_bound_is_too_large(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.json", b" " * (secure_file.DEFAULT_MAX_BYTES + 1))
    assert _code(path) == "manifest_too_large"


# --- changes during the read ----------------------------------------------------------------


def test_a_manifest_appended_to_during_the_read_is_refused(
    manifest: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = secure_file._read_all

    def read_then_append(fd: int, limit: int) -> bytes:
        data = original(fd, limit)
        with manifest.open("ab") as handle:
            handle.write(b"  ")
        return data

    monkeypatch.setattr(secure_file, "_read_all", read_then_append)
    assert _code(manifest) == "manifest_changed"


def test_a_manifest_replaced_during_the_read_is_refused(
    tmp_path: Path, manifest: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = secure_file._read_all
    replacement = _write(tmp_path / "other.json")

    def read_then_replace(fd: int, limit: int) -> bytes:
        data = original(fd, limit)
        os.replace(replacement, manifest)
        return data

    monkeypatch.setattr(secure_file, "_read_all", read_then_replace)
    assert _code(manifest) == "manifest_changed"


def test_a_manifest_removed_during_the_read_is_refused(
    manifest: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = secure_file._read_all

    def read_then_remove(fd: int, limit: int) -> bytes:
        data = original(fd, limit)
        manifest.unlink()
        return data

    monkeypatch.setattr(secure_file, "_read_all", read_then_remove)
    assert _code(manifest) == "manifest_changed"


def test_a_manifest_swapped_for_a_symlink_during_the_read_is_refused(
    tmp_path: Path, manifest: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = secure_file._read_all
    decoy = _write(tmp_path / "decoy.json")

    def read_then_swap(fd: int, limit: int) -> bytes:
        data = original(fd, limit)
        manifest.unlink()
        manifest.symlink_to(decoy)
        return data

    monkeypatch.setattr(secure_file, "_read_all", read_then_swap)
    assert _code(manifest) == "manifest_changed"


# --- every directory from / down to the file ------------------------------------------------

OTHER_UID = 65534  # nobody: the tests run as root, so "us or root" must be told from it


def _nested(tmp_path: Path, outer_mode: int, inner_mode: int = 0o700) -> Path:
    outer = tmp_path / "outer"
    outer.mkdir()
    outer.chmod(outer_mode)
    inner = outer / "inner"
    inner.mkdir()
    inner.chmod(inner_mode)
    return _write(inner / "m.json")


@pytest.mark.parametrize("mode", [0o770, 0o720, 0o1770])
def test_a_manifest_in_a_group_writable_directory_is_unsafe(tmp_path: Path, mode: int) -> None:
    folder = tmp_path / "group"
    folder.mkdir()
    folder.chmod(mode)
    assert _code(_write(folder / "m.json")) == "manifest_unsafe_permissions"


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757, 0o770])
def test_a_private_directory_inside_one_others_can_write_is_unsafe(
    tmp_path: Path, mode: int
) -> None:
    assert _code(_nested(tmp_path, mode)) == "manifest_unsafe_permissions"


def test_a_private_directory_deep_below_an_open_one_is_unsafe(tmp_path: Path) -> None:
    top = tmp_path / "open"
    deep = top / "a" / "b" / "c"
    deep.mkdir(parents=True, mode=0o700)
    top.chmod(0o777)
    assert _code(_write(deep / "m.json")) == "manifest_unsafe_permissions"


def test_a_root_owned_sticky_world_writable_ancestor_like_tmp_is_accepted(tmp_path: Path) -> None:
    path = _nested(tmp_path, 0o1777)
    assert os.stat(tmp_path / "outer").st_uid in (0, os.getuid())
    assert read_manifest_securely(str(path)).raw == CONTENT


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a directory's owner needs root")
def test_a_sticky_world_writable_ancestor_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    path = _nested(tmp_path, 0o1777)
    os.chown(tmp_path / "outer", OTHER_UID, -1)
    assert _code(path) == "manifest_wrong_owner"


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a directory's owner needs root")
def test_a_parent_directory_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o755)
    path = _write(folder / "m.json")
    os.chown(folder, OTHER_UID, -1)
    assert _code(path) == "manifest_wrong_owner"


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a directory's owner needs root")
def test_an_ancestor_directory_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    path = _nested(tmp_path, 0o755)
    os.chown(tmp_path / "outer", OTHER_UID, -1)
    assert _code(path) == "manifest_wrong_owner"
