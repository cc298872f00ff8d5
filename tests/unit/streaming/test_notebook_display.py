"""Outside IPython (a script, a test) nothing is registered: DataFrames keep pyspark's own
representations. Inside a notebook, tests/integration/notebooks/test_notebooks.py checks that
the HTML and the text tables of a displayed DataFrame show the same rows."""

from __future__ import annotations

from dispatch.streaming.notebook_display import show_each_table_once


def test_outside_ipython_nothing_is_registered() -> None:
    assert show_each_table_once() is False
