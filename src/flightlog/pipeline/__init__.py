"""The writer pipeline: a bounded queue, one writer thread, processors and sinks."""
