"""Credentials out of URIs before they are printed or logged.

An index location may carry its credentials (``s3://KEY:SECRET@bucket/idx``, pyarrow reads them
from there), and so may a server URL (``http://user:password@host``).  Every message, log line
and report that shows such a URI shows ``redact(text)`` instead: the password of each
``scheme://user:password@`` becomes ``***`` (the user part stays: an access key id or a user
name says which credentials were used, without being them), and so does the value of a query
parameter that names a secret (``?secret_key=...``, ``session_token``, ``password``...).

Pure text: it works on a bare URI and on any message that embeds one (pyarrow's own errors
repeat the URI they were given).
"""
from __future__ import annotations

import re

__all__ = ["redact", "MASK"]

MASK = "***"

# The patterns are texts that ``re`` compiles (and caches) on first use: most processes that
# import this module never redact anything, and compiling both costs a one-shot lookup's start-up.

#: ``scheme://user:password@``: the user has no ``/``, ``:`` or ``@``; the password runs to the
#: ``@`` that ends the authority (an unencoded ``/`` or ``+`` is common in S3 secret keys).
_USERINFO = r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@?#]*):(?P<secret>[^\s@]*)@"

#: ``name=value`` in a query string, where the name says it holds a secret.
_SECRET_PARAM = (
    r"(?i)(?P<head>[?&;](?:[A-Za-z0-9_.\-]*(?:secret|password|passwd|token|credential|signature|"
    r"access_key|accesskey|sas|sig)[A-Za-z0-9_.\-]*)=)(?P<secret>[^&#\s'\"]*)")


def redact(text: str) -> str:
    """``text`` with the credentials of every URI in it replaced by ``MASK``."""
    if "://" not in text and "=" not in text:
        return text
    text = re.sub(_USERINFO, lambda m: f"{m['head']}:{MASK}@", text)
    return re.sub(_SECRET_PARAM, lambda m: f"{m['head']}{MASK}" if m["secret"] else m[0], text)
