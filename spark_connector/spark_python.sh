#!/bin/sh
# The Python that local_session() gives Spark (PYSPARK_PYTHON): $UPR_SPARK_PYTHON, minus the
# zipped copy of a pip-installed pyspark on PYTHONPATH.
#
# WHY: Spark puts $SPARK_HOME/python/lib/pyspark.zip and py4j-*-src.zip first on every Python
# process's PYTHONPATH.  With pip-installed pyspark, SPARK_HOME is the installed package itself,
# so the zips are copies of modules already importable from site-packages, and zipimport
# compiles every module from source in each new process (the zip has no .pyc): measured 0.5 s of
# CPU per process on the 2-core VM.  Spark starts the driver's streaming-source process afresh for
# every query, so each `upr index run` paid it.  A zip is dropped only if it sits inside an
# installed pyspark package (its __init__.py is there); a Spark distribution's zips are kept.
set -f
new=""
IFS=:
for entry in $PYTHONPATH; do
  case "$entry" in
    */pyspark/python/lib/pyspark.zip | */pyspark/python/lib/py4j-*-src.zip)
      if [ -f "${entry%/python/lib/*}/__init__.py" ]; then continue; fi ;;
  esac
  new="${new:+$new:}$entry"
done
unset IFS
PYTHONPATH=$new
export PYTHONPATH
exec "${UPR_SPARK_PYTHON:-python3}" "$@"
