"""Incremental secondary indexes maintained by Spark from the change feed (see ``job``)."""
