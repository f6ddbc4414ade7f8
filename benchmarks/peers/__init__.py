"""Side-by-side benchmarks of peer PostgreSQL job queues (see README.md)."""
