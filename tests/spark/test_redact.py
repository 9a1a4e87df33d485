"""Credentials of URIs never reach a message, a log line or a report (pure, no Spark)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from spark_connector.failures import one_line
from spark_connector.index.storage import StorageError, open_location
from spark_connector.redact import redact

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("text, expected", [
    ("s3://AKIAX:s3cr3t@bucket/idx", "s3://AKIAX:***@bucket/idx"),
    # an S3 secret key often holds '/' and '+'; the password runs to the '@'
    ("s3://AKIAX:ab/cd+ef@bucket/idx", "s3://AKIAX:***@bucket/idx"),
    ("s3://AKIAX:a%2Fb@bucket/idx", "s3://AKIAX:***@bucket/idx"),
    ("s3a://K:S@b/p and gs://u:p@b/q", "s3a://K:***@b/p and gs://u:***@b/q"),
    ("s3://K:@bucket/idx", "s3://K:***@bucket/idx"),
    ("cannot open s3://K:S@bucket/idx: Access Denied", "cannot open s3://K:***@bucket/idx: Access Denied"),
    ("'s3://K:S@bucket/idx'", "'s3://K:***@bucket/idx'"),
    ("http://user:pw@127.0.0.1:8080/x", "http://user:***@127.0.0.1:8080/x"),
    ("s3://bucket/idx?region=eu-west-1&secret_key=S&x=1", "s3://bucket/idx?region=eu-west-1&secret_key=***&x=1"),
    ("s3://b/i?session_token=T", "s3://b/i?session_token=***"),
    ("https://acct.blob.core.windows.net/c?sv=1&sig=abc", "https://acct.blob.core.windows.net/c?sv=1&sig=***"),
    # nothing to hide: unchanged
    ("s3://bucket/idx", "s3://bucket/idx"),
    ("http://127.0.0.1:8080/partitions", "http://127.0.0.1:8080/partitions"),
    ("hdfs://namenode:8020/idx", "hdfs://namenode:8020/idx"),
    ("hdfs://alice@namenode:8020/idx", "hdfs://alice@namenode:8020/idx"),
    ("/data/idx", "/data/idx"),
    ("s3://bucket/a@b/idx", "s3://bucket/a@b/idx"),
    ("user:pw@host", "user:pw@host"),      # not a URI
    ("", ""),
])
def test_redact(text, expected):
    assert redact(text) == expected


def test_an_unopenable_s3_uri_is_refused_without_its_secret():
    with pytest.raises(StorageError) as refused:
        open_location("s3://AKIAX:TopSecret%2F1@no-such-bucket-upr-test/idx?no_such_parameter=1")
    assert "TopSecret" not in str(refused.value)


def test_a_location_shows_its_uri_without_the_secret():
    from pyarrow import fs as pafs
    from spark_connector.index.storage import Location
    where = Location(pafs.LocalFileSystem(), "/x", "s3://K:TopSecret@bucket/idx", "s3")
    assert where.display("manifest.json") == "s3://K:***@bucket/idx/manifest.json"
    assert "TopSecret" not in one_line(RuntimeError(f"failed writing {where.spark_path('runs')}"))


def test_the_cli_prints_no_secret_for_a_missing_index():
    # a store that refuses the connection: the manifest read fails, naming the index
    uri = "s3://AKIAX:TopSecret@no-such-bucket-upr-test/idx?endpoint_override=127.0.0.1:9&scheme=http" \
          "&region=us-east-1"
    out = subprocess.run([sys.executable, "-m", "app.cli", "index", "query", "--index", uri, "--value", "x",
                          "--debug"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "AWS_EC2_METADATA_DISABLED": "true"})
    assert out.returncode != 0 and "Traceback" in out.stderr, out
    assert "TopSecret" not in out.stderr + out.stdout
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("upr index: s3://AKIAX:***@no-such-bucket-upr-test/idx") and "cannot read" in last
