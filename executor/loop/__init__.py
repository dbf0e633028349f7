"""One rank's iteration dataflow: the loop steps, staleness, and how batches move between ranks."""
