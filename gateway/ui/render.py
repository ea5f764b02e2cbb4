"""Jinja2 for the dashboard's pages: templates from the package, every value escaped
(HTML autoescape), a missing variable an error rather than an empty cell, and the
filters the pages write figures with."""

from __future__ import annotations

from decimal import Decimal
from importlib import resources
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined

from gateway.ui.figures import count, dollars

STYLE_SHEET = "ui.css"


def _dollars(value: Decimal | str | int) -> str:
    return dollars(value if isinstance(value, Decimal) else Decimal(str(value)))


class Pages:
    """Built once per app; the environment compiles each template on first use."""

    def __init__(self) -> None:
        self.env = Environment(loader=PackageLoader("gateway.ui", "templates"), autoescape=True, undefined=StrictUndefined,
                               trim_blocks=True, lstrip_blocks=True)
        self.env.filters["dollars"] = _dollars
        self.env.filters["count"] = count
        self.style_sheet = resources.files("gateway.ui").joinpath("static", STYLE_SHEET).read_bytes()

    def render(self, template: str, **context: Any) -> str:
        return self.env.get_template(template).render(**context)
