"""The refund desk: a tiny order-support world with a SIMULATED policy (a second environment
for skills benchmarks; see ``world.py``)."""
