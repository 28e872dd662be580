import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("reviewapp", "0007_run_data_split_and_attempts"),
    ]

    operations = [
        migrations.AddField(
            model_name="modelroute",
            name="revision",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AlterField(
            model_name="distillationtarget",
            name="feedback",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="targets",
                to="reviewapp.feedback",
            ),
        ),
    ]
