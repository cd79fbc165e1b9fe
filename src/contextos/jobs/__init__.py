"""Built-in jobs, written on the public API only: the knowledge-base scan (`contextos.jobs.kb`)."""
