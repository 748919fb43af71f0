"""Typed forms for a data source's configuration, generated from its connector's config model.

:func:`config_form_class` turns a pydantic config model (``Connector.config_model``) into a Django
form: one field per model field, with a label from its name, help text from the model's docstring
(the sentence that names the field in double backquotes), its default as the initial value,
numeric bounds from ``ge``/``gt``/``le``/``lt``, a choice list for a ``Literal``, one line per item
for a list, a JSON object for a dict, and a write-only password input for a ``SecretStr`` (shown
as set or unset, blank keeps the stored secret). :meth:`ConfigForm.config` returns the config
dict to store; the model's own validation errors are put on the fields they name.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import types
from typing import Any, Literal, Union, get_args, get_origin

from django import forms
from pydantic import BaseModel, SecretStr, ValidationError

from kbportal.secrets import MASK

# Fields an organization's admins never set from a form (operators decide them in /admin/).
OPERATOR_ONLY_FIELDS = frozenset({"allow_private_network"})


_USERINFO = re.compile(r"^([a-z][a-z0-9+.-]*://)[^/@\s]+@", re.I)


def mask_url_credentials(value: str) -> str:
    """``value`` with the user and password of a URL replaced by ``***`` (``https://***@host/...``),
    so a stored URL's credentials are never shown on a page."""
    return _USERINFO.sub(r"\1***@", value)


def _base(annotation: Any) -> tuple[Any, bool]:
    """``(annotation without None, optional)`` for ``X | None`` / ``Optional[X]``."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def _help(model: type[BaseModel], name: str) -> str:
    """The sentence of the model's docstring that names ``name`` in double backquotes, if any."""
    doc = " ".join((model.__doc__ or "").split())
    for sentence in re.split(r"(?<=[.;])(?<!e\.g\.)(?<!i\.e\.)\s+(?=``|[A-Z])", doc):
        if f"``{name}``" in sentence:
            return sentence.replace("``", "")[:400]
    return ""


def _bounds(info: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in info.metadata:
        for attr, key, delta in (
            ("ge", "min_value", 0),
            ("gt", "min_value", 1),
            ("le", "max_value", 0),
            ("lt", "max_value", -1),
        ):
            value = getattr(item, attr, None)
            if value is not None:
                out[key] = value + delta if isinstance(value, int) else value
    return out


class ConfigForm(forms.Form):
    """A generated config form (see the module docstring); ``kind`` and ``model`` are set on the class."""

    kind: str = ""
    model: type[BaseModel]
    secret_names: frozenset[str] = frozenset()
    list_names: frozenset[str] = frozenset()
    dict_names: frozenset[str] = frozenset()

    def __init__(self, *args: Any, stored: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """``stored``: the source's current config (edit form): initial values, and which secrets are set."""
        self.stored = dict(stored or {})
        self.provided: set[str] = set()  # fields the caller fills after validation (a path from an upload)
        if self.stored and "initial" not in kwargs:
            kwargs["initial"] = {k: self._shown(k, v) for k, v in self.stored.items() if k in self.base_fields}
        super().__init__(*args, **kwargs)
        for name in self.secret_names:
            is_set = bool(self.stored.get(name))
            field = self.fields[name]
            field.help_text = ("Set; leave blank to keep it. " if is_set else "Not set. ") + field.help_text

    def _shown(self, name: str, value: Any) -> Any:
        if name in self.secret_names:
            return ""
        if isinstance(value, str):
            return mask_url_credentials(value)
        if name in self.list_names and isinstance(value, list):
            return "\n".join(str(v) for v in value)
        if name in self.dict_names and isinstance(value, dict):
            return json.dumps(value, indent=2)
        return value

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        config: dict[str, Any] = {}
        for name in self.base_fields:
            value = data.get(name)
            if name in self.secret_names:
                if value:
                    config[name] = value
                elif self.stored.get(name):
                    config[name] = MASK  # keeps the stored ciphertext (sources.services.config_merge_secrets)
                continue
            if name in self.list_names:
                items = [line.strip() for line in (value or "").splitlines() if line.strip()]
                if items:
                    config[name] = items
                continue
            if name in self.dict_names:
                if value and value.strip():
                    if len(value) > 100_000:
                        self.add_error(name, "longer than 100,000 characters")
                        continue
                    try:
                        config[name] = json.loads(value)
                    except json.JSONDecodeError as exc:
                        self.add_error(name, f"not a JSON object: {exc.msg} (line {exc.lineno})")
                    except (ValueError, RecursionError):  # a number of 4,300+ digits, deep nesting
                        self.add_error(name, "not a JSON object this form accepts (too deep or too large)")
                continue
            if value is None or value == "":
                continue
            stored = self.stored.get(name)
            if isinstance(stored, str) and value == mask_url_credentials(stored) != stored:
                value = stored  # a URL shown with its credentials masked, sent back unchanged
            config[name] = value.isoformat() if isinstance(value, dt.datetime) else value
        checked = {k: ("x" if v == MASK else v) for k, v in config.items()}  # a kept secret is valid
        checked |= {name: "." for name in self.provided if name not in checked}
        try:
            self.model.model_validate(checked)
        except ValidationError as exc:
            for err in exc.errors():
                field = str(err["loc"][0]) if err["loc"] else None
                self.add_error(field if field in self.fields else None, err["msg"])
        self.config = config
        return data


def config_form_class(kind: str, model: type[BaseModel]) -> type[ConfigForm]:
    """The :class:`ConfigForm` subclass for the connector ``kind`` whose config model is ``model``."""
    fields: dict[str, forms.Field] = {}
    secrets, lists, dicts = set(), set(), set()
    from sources.services.managed import OPERATOR_FIELDS

    for name, info in model.model_fields.items():
        if name in OPERATOR_ONLY_FIELDS or name in OPERATOR_FIELDS.get(kind, ()):
            continue
        annotation, optional = _base(info.annotation)
        required = info.is_required() and not optional
        default = None if info.is_required() else info.get_default(call_default_factory=True)
        common: dict[str, Any] = {
            "label": name.replace("_", " ").capitalize(),
            "help_text": info.description or _help(model, name),
            "required": required,
        }
        origin = get_origin(annotation)
        field: forms.Field
        if annotation is SecretStr:
            secrets.add(name)
            field = forms.CharField(widget=forms.PasswordInput(render_value=False), **{**common, "required": False})
        elif annotation is bool:
            field = forms.BooleanField(initial=bool(default), **{**common, "required": False})
        elif annotation is int:
            field = forms.IntegerField(initial=default, **common, **_bounds(info))
        elif annotation is float:
            field = forms.FloatField(initial=default, **common, **_bounds(info))
        elif origin is Literal:
            choices = [(str(c), str(c)) for c in get_args(annotation)]
            field = forms.ChoiceField(choices=choices, initial=default, **common)
        elif origin is list:
            lists.add(name)
            initial = "\n".join(str(v) for v in default) if isinstance(default, list) else ""
            common["help_text"] = (common["help_text"] + " One per line.").strip()
            field = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), initial=initial, **common)
        elif origin is dict:
            dicts.add(name)
            common["help_text"] = (common["help_text"] + " A JSON object.").strip()
            field = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), initial="", **common)
        elif annotation is dt.datetime:
            field = forms.DateTimeField(initial=default, **common)
        else:
            field = forms.CharField(initial=default or "", max_length=2000, **common)
        fields[name] = field
    # Required fields first (a folder's path before its limits), otherwise in the model's order.
    fields = dict(sorted(fields.items(), key=lambda item: not item[1].required))
    attrs = {
        **fields,
        "kind": kind,
        "model": model,
        "secret_names": frozenset(secrets),
        "list_names": frozenset(lists),
        "dict_names": frozenset(dicts),
    }
    return type(f"{model.__name__}Form", (ConfigForm,), attrs)


class SourceForm(forms.Form):
    """A source's own settings beside its config: name, projects, schedule, enabled, an upload."""

    name = forms.CharField(max_length=200)
    projects = forms.MultipleChoiceField(
        widget=forms.CheckboxSelectMultiple,
        help_text="Projects whose questions search this source.",
        error_messages={"required": "Choose at least one project: a source in no project answers no question."},
    )
    sync_interval_minutes = forms.IntegerField(
        min_value=5, max_value=7 * 24 * 60, initial=60, label="Sync every (minutes)"
    )
    enabled = forms.BooleanField(required=False, initial=True, help_text="Scheduled syncs run only when enabled.")
    upload = forms.FileField(
        required=False,
        help_text="A ZIP (a docs folder, a Slack or Confluence export) or one file; it replaces the path.",
    )

    def __init__(
        self, *args: Any, projects: list[tuple[str, str]] | None = None, file_based: bool = False, **kwargs: Any
    ):
        super().__init__(*args, **kwargs)
        self.fields["projects"].choices = list(projects or [])  # type: ignore[attr-defined]
        if not file_based:
            del self.fields["upload"]
