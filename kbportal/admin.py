"""Admin base for the platform operator: reads and writes through the table owner's connection.

The Django admin is the operator's console across tenants (staff users only), so it uses the
``owner`` alias, as Django's multiple-database admin recipe does. Tenant users never reach it.
"""

from django.contrib import admin

OWNER_DB = "owner"


class OwnerDatabaseAdmin(admin.ModelAdmin):
    using = OWNER_DB

    def get_queryset(self, request):
        manager = getattr(self.model, "all_tenants", self.model._default_manager)
        return manager.using(self.using).all()

    def save_model(self, request, obj, form, change):
        obj.save(using=self.using)

    def delete_model(self, request, obj):
        obj.delete(using=self.using)

    def delete_queryset(self, request, queryset):
        queryset.using(self.using).delete()

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        kwargs["queryset"] = _related_queryset(db_field, self.using)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def formfield_for_manytomany(self, db_field, request, **kwargs):
        kwargs["queryset"] = _related_queryset(db_field, self.using)
        return super().formfield_for_manytomany(db_field, request, **kwargs)


class OwnerDatabaseInline(admin.TabularInline):
    using = OWNER_DB
    extra = 0

    def get_queryset(self, request):
        manager = getattr(self.model, "all_tenants", self.model._default_manager)
        return manager.using(self.using).all()

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        kwargs["queryset"] = _related_queryset(db_field, self.using)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


def _related_queryset(db_field, using):
    model = db_field.remote_field.model
    manager = getattr(model, "all_tenants", model._default_manager)
    return manager.using(using).all()
