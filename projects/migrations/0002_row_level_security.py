from django.db import migrations

from kbportal.tenancy import enable_rls_sql

membership_fwd, membership_rev = enable_rls_sql("projects_membership", user_column="user_id")
project_fwd, project_rev = enable_rls_sql("projects_project")


class Migration(migrations.Migration):
    dependencies = [("projects", "0001_initial")]

    operations = [
        migrations.RunSQL(membership_fwd, membership_rev),
        migrations.RunSQL(project_fwd, project_rev),
    ]
