"""The Celery application. Tasks live in each app's ``tasks.py`` and are autodiscovered."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kbportal.settings")

app = Celery("kbportal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
