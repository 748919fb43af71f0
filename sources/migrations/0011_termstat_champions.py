import django.contrib.postgres.fields
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("sources", "0010_encrypt_connector_secrets")]

    operations = [
        migrations.AddField(
            model_name="termstat",
            name="champions",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.BigIntegerField(),
                blank=True,
                help_text=(
                    "For a common lexeme: ids of the source's rows where it weighs most (BM25 tf part), best first."
                ),
                null=True,
                size=None,
            ),
        ),
    ]
