"""The process around the product: logging, daemon threads that shutdown can abandon,
bounded non-blocking host reads, back-off schedules, and giving freed heap back."""
