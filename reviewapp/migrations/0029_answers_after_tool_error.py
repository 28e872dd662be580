"""The answers an agent wrote straight after a failed tool result (reviewapp/traces/facts.py),
counted for the traces stored before this fact was, and their rollups built again."""

import zlib

import orjson
from django.db import migrations, models

BATCH = 500


def backfill(apps, schema_editor):
    from reviewapp.traces.facts import facts_of
    from reviewapp.traces.rollups import rebuild_rollups

    Trace = apps.get_model("reviewapp", "Trace")
    TraceSegment = apps.get_model("reviewapp", "TraceSegment")
    # Only a trace with a failed tool result can have an answer after one.
    failing = Trace.objects.filter(tool_error_count__gt=0).order_by("pk")
    projects: set[int] = set()
    last_id = 0
    while batch := list(failing.filter(pk__gt=last_id).only("pk", "project_id", "body")[:BATCH]):
        last_id = batch[-1].pk
        segments: dict[int, list] = {}
        for trace_id, blob in (
            TraceSegment.objects.filter(trace__in=batch)
            .order_by("id")
            .values_list("trace_id", "messages")
        ):
            segments.setdefault(trace_id, []).extend(_unpack(blob))
        for trace in batch:
            body = _unpack(trace.body) if trace.body else {}
            messages = [*(body.get("messages") or []), *segments.get(trace.pk, [])]
            trace.answers_after_tool_error = facts_of(messages).answers_after_tool_error
        Trace.objects.bulk_update(batch, ["answers_after_tool_error"])
        projects |= {trace.project_id for trace in batch if trace.answers_after_tool_error}
    if projects:
        rebuild_rollups(project_ids=sorted(projects), apps=apps)


def _unpack(blob):
    return orjson.loads(zlib.decompress(bytes(blob)))


class Migration(migrations.Migration):
    dependencies = [
        ("reviewapp", "0028_saved_view"),
    ]

    operations = [
        migrations.AddField(
            model_name="rolleduptrace",
            name="answers_after_tool_error",
            field=models.IntegerField(default=0),
        ),
        migrations.AddField(
            model_name="trace",
            name="answers_after_tool_error",
            field=models.IntegerField(default=0),
        ),
        migrations.AddField(
            model_name="tracerollup",
            name="answers_after_tool_error",
            field=models.BigIntegerField(default=0),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
