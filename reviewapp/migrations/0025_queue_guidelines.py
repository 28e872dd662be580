"""Queue.guidelines: what reviewers of a queue should look for, shown on every item opened
from it. Existing queues have none."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("reviewapp", "0024_lessons_ledger"),
    ]

    operations = [
        migrations.AddField(
            model_name="queue",
            name="guidelines",
            field=models.TextField(blank=True),
        ),
    ]
