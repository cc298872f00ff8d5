"""The worker SDK and the `dispatch worker` process."""
