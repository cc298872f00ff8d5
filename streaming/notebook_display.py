"""How the notebooks' own Spark session shows a DataFrame in Jupyter: one query for both forms.

With Spark's eager evaluation on (`spark.sql.repl.eagerEval.*`, as the notebooks set it on a
session they made), a DataFrame ending a cell renders as a table. Jupyter asks an object for
its text form (`__repr__`) and for its HTML form (`_repr_html_`) separately, and pyspark runs
the DataFrame's query for each: every table shown cost two queries. `eager_tables` makes both
forms from one run, with the same code pyspark's two methods call (the JVM Dataset's
`showString` and `htmlString`, over the first rows collected once), so what a user sees does
not change. A session the notebook did not make (Databricks', a cluster's) is left as it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def eager_tables(frame: DataFrame) -> dict[str, str] | None:
    """The text and HTML tables pyspark's eager evaluation shows for `frame` (its first
    `maxNumRows` rows), made from one run of its query; None when eager evaluation is off
    (IPython then falls back on the DataFrame's own representations)."""
    conf = frame.sparkSession.conf
    if conf.get("spark.sql.repl.eagerEval.enabled") != "true":
        return None
    rows = int(conf.get("spark.sql.repl.eagerEval.maxNumRows") or 20)
    truncate = int(conf.get("spark.sql.repl.eagerEval.truncate") or 20)
    # pyspark's `__repr__` and `_repr_html_` call these JVM methods on the whole query; here
    # they read a local copy of the first rows (one more than shown, so that the tables say
    # when there are more), collected once inside the JVM.
    taken = frame._jdf.limit(rows + 1).collectAsList()
    local = frame.sparkSession._jsparkSession.createDataFrame(taken, frame._jdf.schema())
    return {
        # As IPython shows a repr: its lines, without the last newline.
        "text/plain": "\n".join(str(local.showString(rows, truncate, False)).splitlines()),
        "text/html": str(local.htmlString(rows, truncate)),
    }


def show_each_table_once() -> bool:
    """Register `eager_tables` as the running IPython's display of every DataFrame; False
    (nothing registered) outside IPython."""
    from IPython import get_ipython
    from pyspark.sql import DataFrame

    shell = get_ipython()
    if shell is None:
        return False
    shell.display_formatter.mimebundle_formatter.for_type(DataFrame, eager_tables)
    return True
