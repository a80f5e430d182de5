"""A call whatever its leg: the agent-facing handle, its utterances, the events and the
control protocol the API drives (``CallControl``), and the registry of calls."""
