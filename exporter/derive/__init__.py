"""What a cycle derives from a joined snapshot: GPU-NIC placement, energy per container,
device events, the CPU -> NUMA map the join checks alignment against, and the series budget
applied before the sinks. Each is a step of the cycle's pipeline (exporter/cycle)."""
