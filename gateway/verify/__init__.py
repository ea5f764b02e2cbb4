"""Checks an answer can fail without anyone trusting the model: what routes escalate on."""

from gateway.verify.signals import JSON_SIGNALS, REQUEST_LEVEL, SIGNALS, Check, Failure, SchemaCache, Verifier

__all__ = ["JSON_SIGNALS", "REQUEST_LEVEL", "SIGNALS", "Check", "Failure", "SchemaCache", "Verifier"]
