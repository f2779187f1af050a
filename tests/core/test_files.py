"""Files written whole or not at all: atomic replacement keeps the old file's mode, a
failed append is cut back off, a line a kill cut short is dropped, readers skip torn rows."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from autotune.core import files
from autotune.core.files import (
    Journal,
    append_line,
    atomic_path,
    csv_rows,
    save_figure,
    together,
    write_atomic,
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_write_atomic_keeps_the_replaced_files_mode_and_gives_a_new_one_the_umasks(
    tmp_path: Path,
) -> None:
    old = tmp_path / "t.py"
    old.write_text("old")
    os.chmod(old, 0o640)
    write_atomic(old, "new")
    assert old.read_text() == "new" and _mode(old) == 0o640
    mask = os.umask(0o022)
    try:
        write_atomic(tmp_path / "fresh.py", "x")
    finally:
        os.umask(mask)
    assert _mode(tmp_path / "fresh.py") == 0o666 & ~0o022


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "report.md"
    path.write_text("old report")
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("disk full")
    assert path.read_text() == "old report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]


def test_a_figure_is_saved_whole_under_the_name_given(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    bare = save_figure(fig, tmp_path / "front")  # no suffix: PNG, the name kept
    assert bare == tmp_path / "front" and bare.read_bytes()[:4] == b"\x89PNG"
    assert save_figure(fig, tmp_path / "f.svg").read_text().lstrip().startswith("<?xml")
    plt.close(fig)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.svg", "front"]


class _FullDisk:
    """A file object whose write fails after ``room`` bytes, as a full disk does."""

    def __init__(self, fh, room: int) -> None:
        self._fh, self._room = fh, room

    def write(self, data: bytes) -> int:
        self._fh.write(data[: self._room])
        self._fh.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name: str):
        return getattr(self._fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._fh.close()


def _fill_disk_at(path: Path, room: int, monkeypatch) -> None:
    """Appends to ``path`` fail after ``room`` bytes, as on a full disk."""
    real_open = Path.open

    def full_open(self, mode="r", *args, **kwargs):
        fh = real_open(self, mode, *args, **kwargs)
        return _FullDisk(fh, room=room) if self == path and "a" in mode else fh

    monkeypatch.setattr(Path, "open", full_open)


def test_an_append_that_fails_midway_is_cut_back_off(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "bench.csv"
    append_line(path, "a,b\n", "1,2\n")
    _fill_disk_at(path, 2, monkeypatch)
    with pytest.raises(OSError, match="No space"):
        append_line(path, "a,b\n", "3,4\n")
    monkeypatch.undo()
    assert path.read_text() == "a,b\n1,2\n"  # no half row
    append_line(path, "a,b\n", "5,6\n")
    assert path.read_text() == "a,b\n1,2\n5,6\n"


def test_a_first_append_a_full_disk_refuses_leaves_no_empty_file(tmp_path, monkeypatch) -> None:
    """bench --csv on a full disk left a 0-byte CSV behind."""
    path = tmp_path / "new.csv"
    _fill_disk_at(path, 0, monkeypatch)
    with pytest.raises(OSError, match="No space"):
        append_line(path, "a,b\n", "1,2\n")
    assert not path.exists()


def test_a_line_a_kill_cut_short_is_dropped_before_the_next(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_text('{"a": 1}\n{"b": ')  # killed mid-write
    append_line(path, "", '{"c": 3}\n')
    assert path.read_text() == '{"a": 1}\n{"c": 3}\n'
    torn_header = tmp_path / "new.csv"
    torn_header.write_text("case,ver")  # killed while the header was written
    append_line(torn_header, "case,verdict\n", "1,PASS\n")
    assert torn_header.read_text() == "case,verdict\n1,PASS\n"


def test_whole_lines_size_reads_back_across_blocks(tmp_path: Path) -> None:
    path = tmp_path / "long.txt"
    path.write_bytes(b"x" * 70000 + b"\n" + b"y" * 70000)  # the newline two blocks back
    with path.open("rb") as fh:
        assert files._whole_lines_size(fh) == 70001


def test_csv_rows_leaves_out_torn_rows(tmp_path: Path) -> None:
    path = tmp_path / "b.csv"
    path.write_text("case,verdict,ms\n1,PASS,0.5\n2,PA\n3,PASS,0.2,extra\n4,FAIL,1.0\n")
    rows, torn = csv_rows(path)
    assert [r["case"] for r in rows] == ["1", "4"] and torn == 2


def test_processes_appending_to_one_file_keep_every_line(tmp_path: Path) -> None:
    """Four processes append 300 rows each to one CSV: every row is kept, whole."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    path = tmp_path / "rows.csv"
    code = (
        "import sys; from autotune.core.files import append_line\n"
        "for i in range(300): append_line(sys.argv[1], 'w,i\\n', f'{sys.argv[2]},{i}\\n')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(path), str(w)], env=env) for w in range(4)
    ]
    assert all(p.wait(120) == 0 for p in procs)
    rows, torn = csv_rows(path)
    assert torn == 0 and len(rows) == 1200
    want = {(str(w), str(i)) for w in range(4) for i in range(300)}
    assert {(r["w"], r["i"]) for r in rows} == want


def test_a_symlinks_target_is_replaced_and_the_link_kept(tmp_path: Path) -> None:
    target = tmp_path / "target.py"
    target.write_text("v1")
    link = tmp_path / "link.py"
    link.symlink_to(target)
    write_atomic(link, "v2")
    assert link.is_symlink() and target.read_text() == "v2"


def test_whole_csv_text_leaves_out_torn_rows_for_pandas(tmp_path: Path) -> None:
    from autotune.core.files import whole_csv_text

    path = tmp_path / "b.csv"
    path.write_text('case,anchors,ms\n1,"{""a"": 1}",0.5\n2,"{}"\n3,"{}",0.2\n')
    text, torn = whole_csv_text(path)
    assert torn == 1 and text == 'case,anchors,ms\n1,"{""a"": 1}",0.5\n3,{},0.2\n'


def test_files_written_together_replace_the_old_set_at_the_end_or_not_at_all(
    tmp_path: Path,
) -> None:
    a, b = tmp_path / "report.md", tmp_path / "front.png"
    a.write_text("old a")
    b.write_text("old b")
    with pytest.raises(RuntimeError), together():
        write_atomic(a, "new a")
        assert a.read_text() == "old a"  # nothing replaced while the set is being written
        raise RuntimeError("disk full at the second file")
    assert (a.read_text(), b.read_text()) == ("old a", "old b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["front.png", "report.md"]
    with together():
        write_atomic(a, "first")
        with together():  # a nested block joins the outer one
            write_atomic(b, "new b")
        assert b.read_text() == "old b"
        write_atomic(a, "new a")  # written twice: the last one wins, no temporary left
    assert (a.read_text(), b.read_text()) == ("new a", "new b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["front.png", "report.md"]


def test_a_rename_that_fails_part_way_through_a_set_leaves_no_temporaries(
    tmp_path: Path, monkeypatch
) -> None:
    a, b = tmp_path / "a.md", tmp_path / "b.md"
    real = os.replace

    def refuse_b(src, dst):
        if Path(dst) == b:
            raise OSError(errno.EIO, "I/O error")
        real(src, dst)

    monkeypatch.setattr(files.os, "replace", refuse_b)
    with pytest.raises(OSError, match=r"b\.md"), together():
        write_atomic(a, "a")
        write_atomic(b, "b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.md"]


def test_a_write_after_the_set_ended_in_a_copied_context_is_renamed_at_once(
    tmp_path: Path,
) -> None:
    import contextvars

    with together():  # an asyncio task made here copies the context and may write later
        later = contextvars.copy_context()
    later.run(write_atomic, tmp_path / "late.md", "late")
    assert (tmp_path / "late.md").read_text() == "late"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["late.md"]


def _record(stamp: object, key: int) -> str:
    import json

    return json.dumps({"stamp": stamp, "key": key, "result": key}) + "\n"


def test_a_finished_journal_keeps_only_the_lines_another_run_may_resume_from(
    tmp_path: Path,
) -> None:
    """``finish`` drops its own lines, torn lines and stamps that are not mappings; it keeps
    what ``keep`` names, and removes the file once nothing is kept."""
    path = tmp_path / "out.validate.jsonl"
    own, other = {"table": "a"}, {"table": "b"}
    lines = [_record(own, 1), _record(other, 2), '{"stamp": {"table": "b"}, "ke', _record(None, 3)]
    path.write_text("".join(lines[:2]) + lines[2] + "\n" + _record("x", 4) + lines[3])
    journal = Journal(path, own)
    assert journal.get(1) == 1 and journal.stale == 3  # the other table, None, "x"
    journal.finish(keep=lambda stamp: stamp.get("table") == "b")
    assert path.read_text() == _record(other, 2)
    resumed = Journal(path, other)
    assert resumed.get(2) == 2 and resumed.stale == 0
    resumed.finish(keep=lambda stamp: stamp.get("table") == "a")
    assert not path.exists()
    Journal(path, own).finish(keep=lambda stamp: True)  # no file: nothing to do


def test_a_journal_finishing_while_another_run_appends_loses_none_of_its_lines(
    tmp_path: Path,
) -> None:
    """Another run appends 300 records while this one finishes again and again: the
    rewrite takes the appends' lock, so every one of the other run's lines is kept."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    path = tmp_path / "out.validate.jsonl"
    path.write_text(_record({"table": "b"}, -1))  # never empty of kept lines: never removed
    code = (
        "import sys; from autotune.core.files import Journal\n"
        "j = Journal(sys.argv[1], {'table': 'b'})\n"
        "for i in range(300): j.add(i, i)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen([sys.executable, "-c", code, str(path)], env=env)
    while child.poll() is None:
        Journal(path, {"table": "a"}).add(0, 0)
        Journal(path, {"table": "a"}).finish(keep=lambda stamp: stamp.get("table") == "b")
    assert child.wait(120) == 0
    kept = Journal(path, {"table": "b"})
    assert set(kept.done) == {str(i) for i in range(-1, 300)} and kept.stale == 0


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_folder_no_file_can_be_made_in_is_unwritable_even_to_root() -> None:
    """os.access tells root that /proc is writable; making a file there fails. Export,
    bench and plot checked their outputs with os.access alone, measured, then failed on a
    temporary file's name."""
    assert files.unwritable_folder("/proc/not/made") == Path("/proc")


def test_a_writable_folder_passes_and_keeps_no_probe_file(tmp_path) -> None:
    assert files.unwritable_folder(tmp_path / "a" / "b") is None
    assert list(tmp_path.iterdir()) == []


def test_a_folder_whose_probe_file_cannot_be_made_is_unwritable(tmp_path, monkeypatch) -> None:
    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(files.tempfile, "mkstemp", refuse)
    assert files.unwritable_folder(tmp_path / "x.csv") == tmp_path
