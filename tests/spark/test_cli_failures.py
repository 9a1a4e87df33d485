"""``upr index`` failures in one line (no JVM): the cause dug out of Spark's wrapping."""
from __future__ import annotations

import pytest

from spark_connector.cli import batch_line
from spark_connector.failures import one_line
from spark_connector.index.job import BatchProgress

ROLLBACK = """[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data source perform latestOffset: Traceback (most recent call last):
  File "/x/pyspark/sql/streaming/python_streaming_source_runner.py", line 120, in latest_offset_func
    offset = reader.latestOffset(start, limit)
  File "/x/spark_connector/progress.py", line 59, in check
    raise RollbackRequired(
spark_connector.progress.RollbackRequired: ROLLBACK_REQUIRED partition 2 to seqno 40 (uuid not in failover log); restart with a new checkpoint
 SQLSTATE: 38000
=== Streaming Query ===
Identifier: upr-index-idx [id = 1, runId = 2]
Current Committed Offsets: {}
Current Available Offsets: {}
Current State: ACTIVE
Thread State: RUNNABLE
Logical Plan:
WriteToMicroBatchDataSourceV1 ForeachBatchSink
+- StreamingDataSourceV2ScanRelation[partition#0] upr"""

FOREACH = """An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
  File "/x/py4j/clientserver.py", line 644, in _call_proxy
    return_value = getattr(self.pool[obj_id], method)(*params)
  File "/x/spark_connector/index/job.py", line 220, in _apply_
    raise IndexError_("idx was built with {'path': 'a'}, not {'path': 'b'}")
spark_connector.index.manifest.IndexError_: idx was built with {'path': 'a'}, not {'path': 'b'}
=== Streaming Query ===
Identifier: q"""

OPTION = "[PYTHON_DATA_SOURCE_ERROR] ... spark_connector.options.OptionError: option 'server': GET /partitions: cannot reach http://127.0.0.1:9: Connection refused\n at org.apache.spark..."


@pytest.mark.parametrize("text, expected", [
    (ROLLBACK, "ROLLBACK_REQUIRED partition 2 to seqno 40 (uuid not in failover log); restart with a new checkpoint"),
    (FOREACH, "IndexError_: idx was built with {'path': 'a'}, not {'path': 'b'}"),
    (OPTION, "option 'server': GET /partitions: cannot reach http://127.0.0.1:9: Connection refused"),
    ("[SOME_CLASS] plain message\nmore", "plain message"),
    ("", "str"),
])
def test_one_line_finds_the_cause(text, expected):
    line = one_line(text)
    assert line == expected and "\n" not in line


def test_one_line_follows_exception_chains_and_clips():
    try:
        try:
            raise ValueError("inner cause " + "x" * 1000)
        except ValueError as inner:
            raise RuntimeError("wrapper") from inner
    except RuntimeError as exc:
        line = one_line(exc, limit=80)
    assert line.startswith("ValueError: inner cause") and len(line) == 80 and line.endswith("...")


def test_batch_line_reports_changes_lag_and_time():
    progress = BatchProgress(3, 120, {0: 10, 1: 20}, 1.234, 7, (1,))
    assert batch_line(progress, {0: 15, 1: 20, 2: 4}) == \
        "batch 3: 120 change(s), lag 9 seqnos, 1.2s (generation 7), reset partitions [1]"
    assert batch_line(BatchProgress(0, 0, {}, 0.0, 1), None) == "batch 0: 0 change(s), lag ?, 0.0s (generation 1)"
