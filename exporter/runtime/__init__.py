"""The process around the product: logging, daemon threads that shutdown can abandon,
bounded non-blocking host reads, back-off schedules, giving freed heap back, and cheap
copies of the frozen records a cycle hands on (`evolve`)."""
