"""The shapes of a batch of traces sent in, and what became of each (the trace API and OTLP
ingest answer with them; they are also the OpenAPI document)."""

from typing import Any

from ninja import Field, Schema


class TraceBatchIn(Schema):
    # Items stay raw here so one bad trace is rejected alone, with its own message.
    traces: list[Any] = Field(..., description="Trace objects; see the README for their shape")


class ItemResultOut(Schema):
    external_id: str | None
    status: int
    error: str | None = None
    warnings: list[str] | None = None


class BatchResultOut(Schema):
    results: list[ItemResultOut]
