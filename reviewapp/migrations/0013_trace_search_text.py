"""Trace.search_text: assistant answers and tool errors, so the text filter finds them.

Filled for stored traces from their bodies, in batches; on PostgreSQL a trigram index on
UPPER(search_text) serves `icontains` as migration 0005's do for external_id and preview.
"""

import zlib

import orjson
from django.db import migrations, models

from reviewapp.traces.ingest import search_text

BATCH = 500


def fill_search_text(apps, schema_editor):
    Trace = apps.get_model("reviewapp", "Trace")
    batch = []
    for trace in Trace.objects.only("id", "body").iterator(chunk_size=BATCH):
        if not trace.body:
            continue
        messages = orjson.loads(zlib.decompress(bytes(trace.body)))["messages"]
        trace.search_text = search_text(messages)
        batch.append(trace)
        if len(batch) == BATCH:
            Trace.objects.bulk_update(batch, ["search_text"])
            batch = []
    Trace.objects.bulk_update(batch, ["search_text"])


def create_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    schema_editor.execute(
        "CREATE INDEX IF NOT EXISTS trace_search_text_trgm ON reviewapp_trace "
        'USING gin ((UPPER("search_text"::text)) gin_trgm_ops)'
    )


def drop_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX IF EXISTS trace_search_text_trgm")


class Migration(migrations.Migration):
    dependencies = [
        ("reviewapp", "0012_termination_truncated"),
    ]

    operations = [
        migrations.AddField(
            model_name="trace",
            name="search_text",
            field=models.TextField(blank=True, default=""),
        ),
        migrations.RunPython(fill_search_text, migrations.RunPython.noop),
        migrations.RunPython(create_index, drop_index),
    ]
