"""The Delta read side shared by the leader, the API, the fold and the notebooks: the
tables' schemas, the `jobs` rows, the fold's progress, the snapshot a leader rebuilds
from, and the lag. It imports nothing from `streaming`, `api`, `worker` or `bench`."""
