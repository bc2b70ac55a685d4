"""A real tiny training run, recorded by flightlog (``flightlog demo``)."""
