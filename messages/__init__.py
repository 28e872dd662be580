"""Chat messages as everyone here reads them: the text of a message's content, its media parts.

Shared by ingest, the gateway, rendering, checks and the trainer, so the text a reviewer reads is
the text the model saw. Plain Python: no Django, no torch, nothing of the product or the
training library (an import-linter contract keeps it so).
"""
