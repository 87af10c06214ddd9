"""tidemq.pipeline: the commit log on Spark (the `tidemq[pipeline]` extra: pyspark, pyarrow).

- `tidemq-commitlog`, a PySpark data source (batch and streaming) over one or more brokers'
  commit logs, decoded in Spark tasks with the store's own record codec (`source`, `stream`),
  read from plain paths or file://, hdfs://, s3:// URIs (`files`);
- jobs: `rebuild` (ConsumeQueue files, byte-identical to the store's dispatcher), `export`
  (Parquet by topic and day) and `stats` (`rebuild`, `export`);
- `spark_session`, which checks for Java, chooses the executors' Python, ships tidemq to a
  cluster's executors and registers the source (`session`).

It reads store files through `tidemq.store`'s codecs and format constants only, never a broker.
Importing this package imports no Spark: the modules that need it do.
"""

from .errors import CorruptLogError, JobFailedError
from .session import JavaNotFoundError, spark_session

SOURCE_NAME = "tidemq-commitlog"

__all__ = ["JavaNotFoundError", "JobFailedError", "spark_session", "SOURCE_NAME", "CorruptLogError"]
