"""tidemq.pipeline: the commit log on Spark.

- `tidemq-commitlog`, a PySpark data source (batch and streaming) over one or more brokers'
  commit logs, decoded in Spark tasks with the store's own record codec (`source`, `stream`);
- jobs: `rebuild` (ConsumeQueue files, byte-identical to the store's dispatcher), `export`
  (Parquet by topic and day) and `stats` (`rebuild`, `export`);
- `spark_session`, which checks for Java, points workers at this interpreter and registers the
  source (`session`).

It reads store files through `tidemq.store`'s codecs and format constants only, never a broker.
"""

from .session import JavaNotFoundError, spark_session
from .source import SOURCE_NAME, CorruptLogError

__all__ = ["JavaNotFoundError", "spark_session", "SOURCE_NAME", "CorruptLogError"]
