"""Scheduling and health of data sources (``sources.scheduling``): the source's scheduling and
health fields, and the ``skipped`` run status (a run refused because another run of the same
source held its lock; a choices change, nothing in the database)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("sources", "0008_symbol_words_index")]

    operations = [
        migrations.AddField(
            model_name="datasource",
            name="enabled",
            field=models.BooleanField(default=True, help_text="Scheduled syncs run only for enabled sources."),
        ),
        migrations.AddField(
            model_name="datasource",
            name="consecutive_failures",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="datasource",
            name="last_attempt_at",
            field=models.DateTimeField(blank=True, help_text="Start of the last run (any outcome).", null=True),
        ),
        migrations.AddField(
            model_name="datasource",
            name="last_success_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="datasource",
            name="last_error",
            field=models.TextField(blank=True, help_text="Error of the last failed run (cleared on success)."),
        ),
        migrations.AddField(
            model_name="datasource",
            name="backoff_until",
            field=models.DateTimeField(blank=True, help_text="No scheduled run before this time.", null=True),
        ),
        migrations.AlterField(
            model_name="ingestionrun",
            name="status",
            field=models.CharField(
                choices=[
                    ("queued", "Queued"),
                    ("running", "Running"),
                    ("succeeded", "Succeeded"),
                    ("partial", "Succeeded with skipped items"),
                    ("failed", "Failed"),
                    ("skipped", "Skipped (another run of the source was in progress)"),
                ],
                default="queued",
                max_length=16,
            ),
        ),
    ]
