"""``manage.py ingest <source> [--tenant SLUG]``: run one ingestion synchronously, with progress."""

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from sources.selectors import SourceNotFound, source_resolve_for_operator
from sources.services import source_ingest


class Command(BaseCommand):
    help = "Ingest a data source now (the same service the Celery task runs), with a progress bar."

    def add_arguments(self, parser):
        parser.add_argument("source", help="data source slug, <tenant>/<slug>, or id")
        parser.add_argument("--tenant", help="tenant slug, when the source slug is in several tenants")
        parser.add_argument("--quiet", action="store_true", help="no progress bar")

    def handle(self, *args, source, tenant=None, quiet=False, **options):
        try:
            ds = source_resolve_for_operator(source, tenant_slug=tenant)
        except SourceNotFound as exc:
            raise CommandError(str(exc)) from exc
        bar = None if quiet else tqdm(desc=f"ingest {ds.slug}", unit="row", file=self.stderr._out)

        def progress(done: int, total: int | None) -> None:
            if bar is not None:
                if total and bar.total != total:
                    bar.total = total
                bar.update(done - bar.n)

        run = source_ingest(tenant_id=ds.tenant_id, source_id=ds.pk, progress=progress)
        if bar is not None:
            bar.close()
        seconds = run.duration_seconds or 0.0
        self.stdout.write(
            f"{ds.slug}: {run.status} in {seconds:.1f}s; rows seen {run.seen}, created {run.created}, "
            f"updated {run.updated}, unchanged {run.unchanged}, deleted {run.deleted}, "
            f"embedded {run.embedded}, skipped {run.skipped}"
        )
        for item in run.skipped_items[:20]:
            self.stdout.write(f"  skipped {item['item']}: {item['reason']}")
        if run.status == "failed":
            raise CommandError(f"ingestion of {ds.slug} failed: {run.error}")
