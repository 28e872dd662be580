"""Fill the trace facts (migration 0014) of the traces stored before them, a batch at a time."""

import zlib

import orjson
from django.db import migrations
from django.db.models import Count

BATCH = 500
FACT_FIELDS = [
    "tool_results",
    "tool_errors",
    "tool_result_count",
    "tool_error_count",
    "answer_count",
    "answer_words",
    "truncated_replies",
]


def backfill(apps, schema_editor):
    from reviewapp.traces.facts import facts_of

    Trace = apps.get_model("reviewapp", "Trace")
    ModelCall = apps.get_model("reviewapp", "ModelCall")
    last_id = 0
    while True:
        batch = list(
            Trace.objects.filter(pk__gt=last_id)
            .order_by("pk")
            .only("pk", "body", "termination")[:BATCH]
        )
        if not batch:
            return
        last_id = batch[-1].pk
        # The gateway's calls say which replies were cut; a pushed trace only its termination.
        cut_calls = dict(
            ModelCall.objects.filter(trace__in=batch, finish_reason="length")
            .values("trace")
            .annotate(cut=Count("id"))
            .values_list("trace", "cut")
        )
        for trace in batch:
            messages = orjson.loads(zlib.decompress(bytes(trace.body))).get("messages") or []
            facts = facts_of(messages, truncated=trace.termination == "truncated")
            for name, value in facts.columns().items():
                setattr(trace, name, value)
            trace.truncated_replies = max(facts.truncated_replies, cut_calls.get(trace.pk, 0))
        Trace.objects.bulk_update(batch, FACT_FIELDS)


class Migration(migrations.Migration):
    # Batches commit one by one, so a big table is not rewritten in one transaction.
    atomic = False

    dependencies = [
        ("reviewapp", "0014_trace_facts"),
    ]

    operations = [migrations.RunPython(backfill, migrations.RunPython.noop)]
