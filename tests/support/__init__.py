"""Helpers the test folders share: processes (workers), waiting, and stores that die on cue."""
