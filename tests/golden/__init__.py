"""Golden `dispatch.events` logs: fixed inputs of `tests/unit/test_golden_events.py`.

The `*.events.jsonl` / `*.expected.json` files are data, not generated at test time; see
`make_golden.py` for how they were made and when (rarely, deliberately) to remake them.
"""
