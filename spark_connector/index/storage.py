"""Where an index lives: a local path or a filesystem URI, through ``pyarrow.fs``.

An index is a manifest, its history and Parquet runs.  Readers (``upr index query``, ``info``)
and the manifest commit go through a ``Location``: a ``pyarrow.fs.FileSystem`` plus the index's
base path in it, so the same code serves a local directory, ``file://``, HDFS, S3 or GCS (what
pyarrow supports natively) and, when ``fsspec`` is installed, any fsspec scheme.

The commit point stays one atomic step everywhere: the manifest is written to a temporary name
and moved over ``manifest.json`` (``os.replace`` with fsyncs locally, a rename on HDFS); on object
stores, where a move is a copy, it is written in place, since one object PUT is atomic there.
A scheme whose client library is missing is refused with one line naming what to install.
"""
from __future__ import annotations

import os

from ..redact import redact
from .errors import IndexError_

TYPE_CHECKING = False   # typing only for the checkers: `upr index query` imports this module (docs/benchmarks.md)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["Location", "StorageError", "open_location", "scheme_of"]

#: Schemes whose "move" is a copy (object stores): the manifest is written in place there.
OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az"})


class StorageError(IndexError_):
    """An index location that cannot be opened (unknown scheme, missing client library).
    Its message never holds the credentials of the location's URI (``redact``)."""

    def __init__(self, message: str) -> None:
        super().__init__(redact(message))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def scheme_of(location: str) -> str:
    if ":" not in location:
        return ""               # a plain path: no need to load the URL parser
    from urllib.parse import urlparse
    parsed = urlparse(location)
    # "C:\\x" and plain paths have no scheme of two letters or more
    return parsed.scheme.lower() if len(parsed.scheme) > 1 else ""


class Location:
    """An index directory: ``fs`` (a ``pyarrow.fs.FileSystem``), ``base`` (the path in it) and
    ``uri`` (what Spark's readers and writers are given).

    A local directory makes its ``LocalFileSystem`` only when asked: reading a local index
    (``upr index query``) goes through ``os`` and plain paths, so a one-shot lookup does not pay
    for importing ``pyarrow.fs``.  Picklable: executors write remote runs through it.  Immutable;
    a plain class rather than a dataclass for the same one-shot lookup (``runs.py`` says why)."""

    __slots__ = ("filesystem", "base", "uri", "scheme")
    filesystem: Any
    base: str
    uri: str
    scheme: str

    def __init__(self, filesystem: Any, base: str, uri: str, scheme: str = "") -> None:
        for name, value in zip(self.__slots__, (filesystem, base, uri, scheme)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r} of an immutable Location")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Location):
            return NotImplemented
        return (self.filesystem, self.base, self.uri, self.scheme) == \
            (other.filesystem, other.base, other.uri, other.scheme)

    def __hash__(self) -> int:
        return hash((self.base, self.uri, self.scheme))

    def __repr__(self) -> str:
        return f"Location({self.display()!r}, scheme={self.scheme!r})"

    def __reduce__(self) -> tuple[type[Location], tuple[Any, str, str, str]]:
        return (Location, (self.filesystem, self.base, self.uri, self.scheme))

    @property
    def fs(self) -> Any:
        if self.filesystem is None:
            from pyarrow import fs as pafs
            object.__setattr__(self, "filesystem", pafs.LocalFileSystem())
        return self.filesystem

    @property
    def is_local(self) -> bool:
        return self.scheme in ("", "file")

    def path(self, rel: str) -> str:
        return f"{self.base.rstrip('/')}/{rel}" if rel else self.base

    def spark_path(self, rel: str = "") -> str:
        return self.path(rel) if self.is_local else f"{self.uri.rstrip('/')}/{rel}" if rel else self.uri

    def display(self, rel: str = "") -> str:
        """``spark_path(rel)`` for messages and logs: without the credentials a URI may carry."""
        return redact(self.spark_path(rel))

    def exists(self, rel: str) -> bool:
        if self.is_local:
            return os.path.exists(self.path(rel))
        from pyarrow import fs as pafs
        return self.fs.get_file_info(self.path(rel)).type != pafs.FileType.NotFound

    def read_text(self, rel: str) -> str | None:
        """The file's text, or None when it does not exist."""
        if self.is_local:
            try:
                with open(self.path(rel), encoding="utf-8") as fh:
                    return fh.read()
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                return None
        from pyarrow import fs as pafs
        if self.fs.get_file_info(self.path(rel)).type != pafs.FileType.File:
            return None
        with self.fs.open_input_stream(self.path(rel)) as fh:
            return fh.read().decode()

    def list_dir(self, rel: str) -> list[str]:
        """Names in a directory (empty when it does not exist)."""
        if self.is_local:
            try:
                return sorted(os.listdir(self.path(rel)))
            except (FileNotFoundError, NotADirectoryError):
                return []
        from pyarrow import fs as pafs
        if self.fs.get_file_info(self.path(rel)).type != pafs.FileType.Directory:
            return []
        infos = self.fs.get_file_info(pafs.FileSelector(self.path(rel)))
        return sorted(os.path.basename(i.path) for i in infos)

    def parquet_files(self, rel: str) -> list[str]:
        return [self.path(f"{rel}/{n}") for n in self.list_dir(rel) if n.endswith(".parquet")]

    def open_parquet(self, path: str) -> Any:
        """A ``pyarrow.parquet.ParquetFile`` of ``path`` (from ``parquet_files``); close it after use."""
        import pyarrow.parquet as pq
        if self.is_local:
            return pq.ParquetFile(path)
        return pq.ParquetFile(self.fs.open_input_file(path))

    def make_dir(self, rel: str) -> None:
        if self.is_local:
            os.makedirs(self.path(rel), exist_ok=True)
        else:
            self.fs.create_dir(self.path(rel), recursive=True)

    def remove_dir(self, rel: str) -> None:
        """Remove a directory and everything in it; nothing to do when it is not there."""
        if self.is_local:
            import shutil
            shutil.rmtree(self.path(rel), ignore_errors=True)
            return
        try:
            self.fs.delete_dir(self.path(rel))
        except FileNotFoundError:
            pass

    def remove_file(self, path: str) -> None:
        """Remove one file named by its full path (as ``parquet_files`` gives it)."""
        if self.is_local:
            os.unlink(path)
        else:
            self.fs.delete_file(path)

    def write_parquet(self, rel: str, table: Any) -> None:
        """Write ``table`` as the Parquet file ``rel`` (creating its directory)."""
        import pyarrow.parquet as pq
        parent = os.path.dirname(rel)
        self.make_dir(parent)
        if self.is_local:
            pq.write_table(table, self.path(rel))
            return
        with self.fs.open_output_stream(self.path(rel)) as out:
            pq.write_table(table, out)

    def write_atomic(self, rel: str, text: str) -> None:
        """Replace ``rel`` with ``text`` so a reader sees the old or the new file, never a mix."""
        if self.is_local:
            _write_atomic_local(self.path(rel), text)
            return
        parent = os.path.dirname(self.path(rel))
        self.fs.create_dir(parent, recursive=True)
        if self.scheme in OBJECT_STORES:
            with self.fs.open_output_stream(self.path(rel)) as out:
                out.write(text.encode())
            return
        tmp = f"{self.path(rel)}.tmp-{os.getpid()}"
        with self.fs.open_output_stream(tmp) as out:
            out.write(text.encode())
        self.fs.move(tmp, self.path(rel))


def _write_atomic_local(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_location(location: str | os.PathLike[str], filesystem: Any = None) -> Location:
    """A ``Location`` for a local path or a URI; ``filesystem`` (any ``pyarrow.fs.FileSystem``)
    serves ``location`` as a path inside it instead (tests, SubTreeFileSystem, custom clients)."""
    text = os.fspath(location)
    if filesystem is not None:
        return Location(filesystem, text, text, scheme=getattr(filesystem, "type_name", "custom"))
    scheme = scheme_of(text)
    if scheme in ("", "file"):
        if scheme == "file":
            from urllib.parse import urlparse
            path = urlparse(text).path
        else:
            path = text
        path = os.path.abspath(path)
        return Location(None, path, path, scheme="")
    from pyarrow import fs as pafs
    try:
        fs, base = pafs.FileSystem.from_uri(text)
        return Location(fs, base, text, scheme)
    except OSError as exc:
        hint = {"hdfs": "pyarrow's HDFS client needs libhdfs and the JVM (set JAVA_HOME, HADOOP_HOME "
                        "and CLASSPATH=$(hadoop classpath --glob))",
                "s3": "pyarrow's S3 client needs credentials and a reachable endpoint",
                "gs": "pyarrow's GCS client needs credentials and a reachable endpoint"}.get(scheme, "")
        raise StorageError(f"{text}: cannot open the {scheme}:// filesystem: {_first_line(exc)}"
                           + (f" ({hint})" if hint else "")) from None
    except Exception as native_error:      # ArrowInvalid: a scheme pyarrow does not know
        return _fsspec_location(text, scheme, native_error)


def _fsspec_location(text: str, scheme: str, native_error: BaseException) -> Location:
    try:
        import fsspec
    except ImportError:
        raise StorageError(f"{text}: pyarrow has no {scheme}:// filesystem ({_first_line(native_error)}) "
                           "and fsspec is not installed (pip install fsspec and the scheme's "
                           "package)") from None
    from pyarrow import fs as pafs
    try:
        fs, base = fsspec.core.url_to_fs(text)
    except (ImportError, ValueError) as exc:
        raise StorageError(f"{text}: no filesystem for {scheme}://: {_first_line(exc)}") from None
    return Location(pafs.PyFileSystem(pafs.FSSpecHandler(fs)), base, text, scheme)
