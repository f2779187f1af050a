"""Files written so that a crash, a kill or a full disk never leaves half of one."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, BinaryIO


def _new_file_mode() -> int:
    """The mode ``open()`` gives a new file here (0o666 less the umask), read without
    changing the umask where Linux reports it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


class _Staged(dict[Path, Path]):
    """Inside ``together()``: target -> temporary, the renames that wait for its end;
    ``open`` turns False when it ends (a task that copied the context and writes later
    renames at once)."""

    open = True


_STAGED: ContextVar[_Staged | None] = ContextVar("autotune_staged", default=None)


@contextlib.contextmanager
def together() -> Iterator[None]:
    """Files written atomically inside the block (``write_atomic``, ``save_figure``,
    ``atomic_path``) replace their targets together when it ends without an error: a
    reader sees every old file or every new one, never a mix (a full disk or a kill part
    way through a report leaves the old report whole). The writes happen in the block;
    only the renames, which need no space, wait. Nested blocks join the outer one. The
    set is this thread's (and its asyncio tasks'): other threads' writes rename at once."""
    outer = _STAGED.get()
    if outer is not None and outer.open:
        yield
        return
    pending = _Staged()
    token = _STAGED.set(pending)
    try:
        yield
    except BaseException:
        pending.open = False
        for tmp in pending.values():
            tmp.unlink(missing_ok=True)
        raise
    finally:
        pending.open = False
        _STAGED.reset(token)
    done = 0
    try:
        for path, tmp in pending.items():
            os.replace(tmp, path)
            done += 1
    except BaseException as exc:
        for tmp in list(pending.values())[done:]:
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _named(exc, path) from exc
        raise


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary sibling of ``path`` for a writer that takes a file name (a figure's
    ``savefig``): renamed over ``path`` once the block ends without an error (inside
    ``together()``, once that block ends), removed otherwise. The file keeps the mode
    (and, where this process may, the owner) of the one it replaces (a new one: the
    umask's); a symbolic link's target is replaced, the link kept. An OS error names ``path``."""
    path = Path(path)
    if path.is_symlink():
        path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    # ".tmp": a temporary a kill left behind never matches a reader's glob (tables/*.py)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        try:
            old = path.stat()
        except FileNotFoundError:
            os.chmod(tmp, _new_file_mode())
        else:
            os.chmod(tmp, stat.S_IMODE(old.st_mode))
            with contextlib.suppress(OSError):  # only root may give a file away
                os.chown(tmp, old.st_uid, old.st_gid)
        staged = _STAGED.get()
        if staged is None or not staged.open:
            os.replace(tmp, path)
        else:  # renamed with the rest of the set when together()'s block ends
            earlier = staged.pop(path, None)
            if earlier is not None:
                earlier.unlink(missing_ok=True)
            staged[path] = tmp
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _named(exc, path) from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _named(exc: OSError, path: Path) -> OSError:
    """``exc`` naming ``path`` (a full disk's error names no file)."""
    if exc.filename is not None and str(path) in str(exc.filename):
        return exc
    return type(exc)(exc.errno, exc.strerror or str(exc), str(path))


def write_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to a temporary sibling, fsync it, then rename it over ``path``: a
    reader sees the old file or the new one, never a partial one."""
    path = Path(path)
    with atomic_path(path) as tmp, tmp.open("w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    return path


def file_state(path: str | Path) -> str | None:
    """What a file holds, as a digest (None: no file), to tell whether it changed while a
    long command measured (``check_unchanged``)."""
    import hashlib

    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def check_unchanged(path: str | Path, state: str | None, flag: str, who: str) -> None:
    """Refuse to write ``path`` where it changed since ``state`` was taken (another run
    wrote it, or someone edited it): nothing is replaced, nothing lost."""
    if file_state(path) != state:
        raise ValueError(
            f"{flag} {path} changed while {who} ran (another {who}, or an edit): nothing "
            f"written; run {who} again"
        )


def append_line(
    path: str | Path,
    header: str,
    line: str,
    check: Callable[[str], None] | None = None,
) -> None:
    """Append ``line`` to a text file, ``header`` first when the file is new or empty;
    fsynced, so a run cut short keeps every line it wrote (CSV rows).

    The files it appends to are written by it alone (processes appending to one file take
    turns: an exclusive lock), and every line ends with a newline: text after the file's
    last newline is a line a kill cut short, and is dropped before the new one is
    written. A write that fails (a full disk) is cut back off, so the file holds whole
    lines only (unbuffered: no bytes wait in a buffer to be written later). ``check`` is
    given the file's whole lines under the lock, and may refuse the append by raising
    (a bench CSV that another run began with another table's rows meanwhile)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    try:
        _append(path, header, line, check)
    except BaseException:
        if new and path.is_file() and path.stat().st_size == 0:
            path.unlink()  # made by this call, nothing in it (a full disk): not left behind
        raise


def _append(path: Path, header: str, line: str, check: Callable[[str], None] | None) -> None:
    with path.open("a+b", buffering=0) as fh, _exclusive(fh):
        end = fh.seek(0, os.SEEK_END)
        size = _whole_lines_size(fh)
        if check is not None:
            fh.seek(0)
            check(fh.read(size).decode(errors="replace"))
            fh.seek(0, os.SEEK_END)
        data = memoryview(((header if size == 0 else "") + line).encode())
        try:
            if size != end:
                os.ftruncate(fh.fileno(), size)
            while data:
                written = fh.write(data)
                data = data[written or 0 :]
            os.fsync(fh.fileno())
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fh.fileno(), size)
            if isinstance(exc, OSError):
                raise _named(exc, path) from exc
            raise


@contextlib.contextmanager
def _exclusive(fh: BinaryIO) -> Iterator[None]:
    """An exclusive advisory lock on an open file where the platform has one."""
    try:
        import fcntl
    except ImportError:  # not POSIX: one writer at a time is the caller's to ensure
        yield
        return
    fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _whole_lines_size(fh: BinaryIO) -> int:
    """The size of an open binary file up to and including its last newline."""
    end = fh.seek(0, os.SEEK_END)
    pos = end
    while pos > 0:
        step = min(pos, 1 << 16)
        fh.seek(pos - step)
        block = fh.read(step)
        at = block.rfind(b"\n")
        if at >= 0:
            return pos - step + at + 1
        pos -= step
    return 0


def csv_rows(path: str | Path) -> tuple[list[dict[str, str]], int]:
    """The rows of a CSV grown by ``append_line``, and how many rows were left out for
    missing or extra fields (``whole_csv_text``)."""
    import csv
    import io

    text, torn = whole_csv_text(path)
    return list(csv.DictReader(io.StringIO(text))), torn


def save_figure(fig: object, path: str | Path, dpi: int = 110) -> Path:
    """A matplotlib figure written atomically to ``path``, in the format its suffix
    names (PNG where it has none: the name is kept as given)."""
    path = Path(path)
    fmt = path.suffix[1:].lower() or "png"
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format=fmt)  # type: ignore[attr-defined]
    return path


def csv_header(path: str | Path) -> list[str]:
    """A CSV's column names (none for an empty file)."""
    import csv

    with Path(path).open(newline="") as fh:
        return next(csv.reader(fh), [])


def whole_csv_text(path: str | Path) -> tuple[str, int]:
    """A CSV's text without the rows whose field count differs from the header's (cut
    short by a kill, or hand edits), and how many were left out: for readers that parse
    the text themselves (pandas)."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    torn = 0
    with Path(path).open(newline="") as fh:
        rows = csv.reader(fh)
        header = next(rows, None)
        if header is None:
            return "", 0
        writer.writerow(header)
        for row in rows:
            if len(row) == len(header):
                writer.writerow(row)
            elif row:
                torn += 1
    return out.getvalue(), torn


def unwritable_folder(folder: str | Path) -> Path | None:
    """The nearest existing folder at or above ``folder`` where it is not writable (a
    file written there would fail, the missing folders below it unmade), else None.
    Where the permission bits allow it, a file is made there and removed: root passes
    every ``os.access`` check, also on a read-only mount or in ``/proc``."""
    above = Path(folder).absolute()
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir() or not os.access(above, os.W_OK | os.X_OK):
        return above
    try:
        fd, probe = tempfile.mkstemp(prefix=".autotune-probe-", dir=above)
    except OSError:
        return above
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return None


# Linux inode flags (lsattr): a file that takes no replacement, truncation or removal.
_IMMUTABLE, _APPEND_ONLY = 0x10, 0x20


def unchangeable_file(path: str | Path, appended: bool = False) -> str | None:
    """Why an existing output file cannot take what a command writes there, else None:
    immutable or append-only (``chattr +i``/``+a``; outputs are replaced atomically, and
    appended ones are truncated at a torn row or removed when done), or, for an output
    appended to in place (``appended``), one that does not open for writing. Nothing is
    written; a path that is not a regular file is left to the write."""
    path = Path(path)
    if not path.is_file():
        return None
    if _inode_flags(path) & (_IMMUTABLE | _APPEND_ONLY):
        return (
            "the file is immutable or append-only (chattr +i or +a: see lsattr) and cannot "
            "be replaced; give another path, or chattr -i -a it"
        )
    if appended:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
        except OSError as exc:
            return f"the file cannot be written ({exc.strerror}); give another path"
    return None


def _inode_flags(path: Path) -> int:
    """Linux's inode flags of a file (``FS_IOC_GETFLAGS``, as lsattr reads them); 0 where
    the platform or the file system has none."""
    try:
        import array
        import fcntl

        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (ImportError, AttributeError, OSError):
        return 0
    try:
        flags = array.array("i", [0])
        fcntl.ioctl(fd, 0x80086601, flags, True)
        return int(flags[0])
    except OSError:
        return 0
    finally:
        os.close(fd)


class Journal:
    """Finished verifications, one JSON line each, appended and fsynced as each ends: a
    run cut short (a device call's time limit, Ctrl-C, a killed process) resumes from it
    and verifies only what it had not finished (``autotune buckets``: rectangles;
    ``autotune validate --out``: entries and buckets). A line counts only under the same
    ``stamp`` (profile, emulation, device, software versions, code, and whatever else the
    verification depends on): evidence from other code or another device is not reused.
    ``key``: what one verification depends on besides the stamp (JSON). A torn last line
    is ignored."""

    def __init__(self, path: str | Path, stamp: Mapping[str, Any]) -> None:
        self.path = Path(path)
        self.stamp = json.loads(json.dumps(stamp, sort_keys=True, default=str))
        self.done: dict[str, Any] = {}
        self.stale = 0
        if not self.path.is_file():
            return
        for line in self.path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
                key, result = record["key"], record["result"]
            except (ValueError, KeyError, TypeError):
                continue  # a torn line, cut mid-write
            if record.get("stamp") != self.stamp:
                self.stale += 1
                continue
            self.done[self._text(key)] = result

    @staticmethod
    def _text(key: Any) -> str:
        return json.dumps(key, sort_keys=True, default=str)

    def get(self, key: Any) -> Any:
        return self.done.get(self._text(key))

    def add(self, key: Any, result: Any) -> None:
        record = {"stamp": self.stamp, "key": key, "result": result}
        append_line(self.path, "", json.dumps(record, sort_keys=True, default=str) + "\n")
        self.done[self._text(key)] = result

    def finish(self, keep: Callable[[Mapping[str, Any]], bool] | None = None) -> None:
        """The run's results are written elsewhere now: its lines go, and with them those
        of other stamps, except the ones ``keep(stamp)`` says another run may still resume
        from (another table's run into the same file); the file goes once none is left.
        Rewritten in place under the lock appends take, so a line another run appends
        meanwhile is kept or waits; one appended to the file as it is removed is lost (that
        run verifies it again if it is cut and resumed)."""
        try:
            with self.path.open("r+b", buffering=0) as fh, _exclusive(fh):
                kept: list[str] = []
                text = fh.read().decode(errors="replace") if keep is not None else ""
                for line in text.splitlines():
                    try:
                        stamp = json.loads(line)["stamp"]
                    except (ValueError, KeyError, TypeError):
                        continue  # a torn line
                    if isinstance(stamp, Mapping) and stamp != self.stamp and keep(stamp):
                        kept.append(line + "\n")
                if not kept:
                    self.path.unlink(missing_ok=True)
                    return
                data = memoryview("".join(kept).encode())  # never longer than the file
                fh.seek(0)
                while data:
                    data = data[fh.write(data) or 0 :]
                fh.truncate()
                os.fsync(fh.fileno())
        except FileNotFoundError:
            return
