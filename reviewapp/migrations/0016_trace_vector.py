"""TraceEmbedding.embedding: the vector in a pgvector column with an HNSW index (cosine).

Added only where PostgreSQL offers the `vector` extension (pg_available_extensions) and this
role may create it; elsewhere (SQLite, a PostgreSQL without pgvector) nothing changes in the
database and similarity search compares vectors with numpy. TraceVector is the unmanaged model
that reads and writes the column (see reviewapp/monitors/similarity.py). Vectors already stored
are copied into the column before the index is built, so a fresh index covers them all.
"""

import numpy as np
import pgvector.django
from django.db import DatabaseError, migrations, models, transaction

BATCH = 1000
TABLE = "reviewapp_traceembedding"


def _can_create_vector_extension(connection) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")
        if cursor.fetchone() is None:
            return False
        try:
            # A savepoint: a role that may not create extensions leaves the migration intact.
            with transaction.atomic(using=connection.alias):
                cursor.execute("CREATE EXTENSION IF NOT EXISTS vector")
        except DatabaseError:
            return False
    return True


def add_vector_column(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql" or not _can_create_vector_extension(connection):
        return
    schema_editor.execute(f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS embedding vector(384)")
    TraceEmbedding = apps.get_model("reviewapp", "TraceEmbedding")
    TraceVector = apps.get_model("reviewapp", "TraceVector")
    batch = []
    for row in TraceEmbedding.objects.only("id", "vector").iterator(chunk_size=BATCH):
        vector = np.frombuffer(bytes(row.vector), dtype=np.float32)
        batch.append(TraceVector(pk=row.pk, embedding=vector))
        if len(batch) == BATCH:
            TraceVector.objects.bulk_update(batch, ["embedding"])
            batch = []
    TraceVector.objects.bulk_update(batch, ["embedding"])
    # serves: more like this and suggested tags, nearest vectors by cosine distance
    schema_editor.execute(
        f"CREATE INDEX IF NOT EXISTS embedding_hnsw ON {TABLE} "
        "USING hnsw (embedding vector_cosine_ops)"
    )


def drop_vector_column(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX IF EXISTS embedding_hnsw")
        schema_editor.execute(f"ALTER TABLE {TABLE} DROP COLUMN IF EXISTS embedding")


class Migration(migrations.Migration):
    dependencies = [
        ("reviewapp", "0015_backfill_trace_facts"),
    ]

    operations = [
        migrations.CreateModel(
            name="TraceVector",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("trace_id", models.BigIntegerField()),
                ("project_id", models.BigIntegerField()),
                ("model_name", models.CharField(max_length=200)),
                ("embedding", pgvector.django.VectorField(dimensions=384, null=True)),
            ],
            options={
                "db_table": "reviewapp_traceembedding",
                "managed": False,
            },
        ),
        migrations.RunPython(add_vector_column, drop_vector_column),
    ]
