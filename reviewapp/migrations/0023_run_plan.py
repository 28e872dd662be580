"""TrainingRun.plan: what a run's evaluation, gate and deploy use, frozen when it is created
(reviewapp/learning/plan.py). Existing runs keep an empty plan and go on reading the project's
settings where they use them, as they did."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("reviewapp", "0022_settings_within_reach"),
    ]

    operations = [
        migrations.AddField(
            model_name="trainingrun",
            name="plan",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
