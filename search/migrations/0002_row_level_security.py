from django.db import migrations

from kbportal.tenancy import enable_rls_sql

TABLES = ["search_answerrecord", "search_answerfeedback"]


class Migration(migrations.Migration):
    dependencies = [("search", "0001_initial")]

    operations = [migrations.RunSQL(*enable_rls_sql(table)) for table in TABLES]
