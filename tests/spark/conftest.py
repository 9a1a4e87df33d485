"""One SparkSession for the whole test run (the first query in a JVM costs 15-30 s here)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from spark_connector.session import local_session
    session = local_session("local[2,2]", app_name="upr-tests", shuffle_partitions=2)
    yield session
    session.stop()
