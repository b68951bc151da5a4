"""The ECC bridge ``ecc ito …`` (DESIGN §6.3): a fixed verb table in front of the canonical
``ito`` client, found only through an explicit absolute path, spawned without a shell in a
scrubbed environment, and gated on the client's capability contract for training verbs.

Imports nothing heavy: only the standard library and ``ito.core``.
"""

__all__: list[str] = []
