"""Trace.tail_hash is now a chain (reviewapp.gateway.conversation.conversation_hash), so a call
extends it in the cost of the messages it adds. Gateway traces that a call may still join
(updated within GATEWAY_MERGE_WINDOW_SECONDS) get the new hash, so an episode running across
the upgrade stays one trace; older ones would match nothing either way. A trace joined by
X-Trace-Id needs no new hash: a mismatch only makes the recorder read its body once.
"""

import zlib
from datetime import timedelta

import orjson
from django.conf import settings
from django.db import migrations
from django.utils import timezone

from reviewapp.gateway.conversation import conversation_hash

BATCH = 200


def rehash_recent_gateway_traces(apps, schema_editor):
    Trace = apps.get_model("reviewapp", "Trace")
    since = timezone.now() - timedelta(seconds=settings.GATEWAY_MERGE_WINDOW_SECONDS)
    recent = Trace.objects.filter(source="gateway", updated_at__gte=since).exclude(tail_hash="")
    batch = []
    for trace in recent.only("id", "body").iterator(chunk_size=BATCH):
        if not trace.body:
            continue
        messages = orjson.loads(zlib.decompress(bytes(trace.body)))["messages"]
        trace.tail_hash = conversation_hash(messages)
        batch.append(trace)
        if len(batch) == BATCH:
            Trace.objects.bulk_update(batch, ["tail_hash"])
            batch = []
    Trace.objects.bulk_update(batch, ["tail_hash"])


class Migration(migrations.Migration):
    dependencies = [
        ("reviewapp", "0018_gateway_refusals"),
    ]

    operations = [
        migrations.RunPython(rehash_recent_gateway_traces, migrations.RunPython.noop),
    ]
