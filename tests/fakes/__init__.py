"""Fakes for the seams the orchestration crosses (STYLE.md habit 10): a scripted
`Upstream`, and a pipeline built from real in-process parts around it."""
