"""The cycle: its steps in order (collect, join, derive, publish, after-cycle) and the
poller that runs them every `--collect-interval`."""
