"""One line for a failed Spark query: the cause, without py4j's and the JVM's wrapping.

A failure inside a streaming query reaches the driver as a ``StreamingQueryException`` whose text
holds an error class, a JVM stack, the Python traceback of the source or ``foreachBatch`` and a
dump of the query plan.  A command-line user needs the innermost cause (``ROLLBACK_REQUIRED
partition 2 to seqno 40 ...``, ``option 'server': ... refused``); ``--debug`` shows the rest.
The line never holds the credentials of a URI it quotes (``redact``).
"""
from __future__ import annotations

import re

from .redact import redact

__all__ = ["one_line"]

#: Causes that name themselves: the source's rollback refusal and option errors.
_OWN = re.compile(r"(ROLLBACK_REQUIRED partition \d+ .*|option '[^']+': .*)")
#: A Python exception line at the end of a traceback: "pkg.Error: message".
_PY_EXC = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Required|Refused|Exit)\w*): (.+)$")
#: Wrappers that say where, not what.
_WRAPPERS = ("StreamingQueryException", "PythonException", "Py4JJavaError", "SparkException",
             "PySparkRuntimeError", "AnalysisException")
_ERROR_CLASS = re.compile(r"^\[[A-Z_.]+\]\s*")


def one_line(exc: BaseException | str, limit: int = 400) -> str:
    """The innermost cause of ``exc`` as one line of at most ``limit`` characters."""
    text = redact(exc if isinstance(exc, str) else _text_of(exc))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    own = [m.group(1) for ln in lines for m in [_OWN.search(ln)] if m]
    if own:
        return _clip(own[-1], limit)
    causes = []
    for ln in lines:
        m = _PY_EXC.match(ln)
        if m and m.group(1) not in _WRAPPERS and not ln.startswith(("at ", "File ")):
            causes.append(f"{m.group(1)}: {m.group(2)}")
    if causes:
        return _clip(causes[-1], limit)
    first = _ERROR_CLASS.sub("", lines[0]) if lines else type(exc).__name__
    return _clip(first, limit)


def _text_of(exc: BaseException) -> str:
    parts = [f"{type(exc).__name__}: {exc}"]
    desc = getattr(exc, "desc", None)          # pyspark's CapturedException keeps the JVM message here
    if isinstance(desc, str):
        parts.append(desc)
    cause = exc.__cause__ or exc.__context__
    if cause is not None and cause is not exc:
        parts.append(_text_of(cause))
    return "\n".join(parts)


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
